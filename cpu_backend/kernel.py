"""CppKernel: the ``ops`` handler that turns one fused group into an OpenMP C++ function.

Shape of the generated code for a reduction group (rows x reduced elements):

    #pragma omp parallel            (only when there is enough work)
    {
      <thread-local buffers>
      #pragma omp for
      for x0 ...                     one parallel loop over the rows: outer-loop fusion
        <segment 1: for r ... vectorized along the innermost r dim, accumulators>
        <row-wise (x) nodes: scalar code>
        <segment 2: for r ... reading segment 1's results>
    }

A value written in one inner loop and read in a later one of the same row, and nowhere
else, lives in a thread-local buffer the size of one row instead of a global buffer
(the trick of ATen's softmax kernel). Outer reductions (x.sum(0)) vectorize along the
contiguous row dim instead, with lane-wise accumulators.

Inner vector loops are written once as a generic lambda instantiated for full vectors
and for the tail (TAIL=true: partial loads/stores, reductions fill missing lanes with
their identity).
"""
import re
from typing import Optional

import sympy
import torch

from tritonfuse import sym
from tritonfuse.codegen.common import CSE, IndentedBuffer, KernelArgs
from tritonfuse.codegen.loops import Segment, buffers_crossing_loops, plan_segments
from tritonfuse.dependencies import plan_and_deps, refine_dep, refine_plan
from tritonfuse.virtualized import set_ops_handler

from .cascade_rows import CppCascadeRows
from .common import (
    HALF_TYPES, SIZE_PARAMS, STORAGE_TYPES, CppVar, _cast_python, _stride, _vector_printer, cexpr, compute_dtype,
    cpp_constant, ctype,
)
from .lane_pairs import CppLanePairs
from .loop_nest import OUT_TILE_STEPS, CppLoopNest
from .outer_reduction import CppOuterReductions
from .overrides import CPP_CHECKED_DIVISION, CPP_OPS, cpp_op, cpp_result_dtype, is_integer
from .read_cache import CppReadCache
from .reductions import CppReductions
from .row_blocks import CppRowBlocks, _Decline
from .scan import CppScans
from .scatter import CppScatter


# Reductions over fewer elements than this vectorize along x when r is strided.
SHORT_REDUCTION = 8


class CppKernel(CppLoopNest, CppOuterReductions, CppCascadeRows, CppRowBlocks, CppReadCache, CppLanePairs,
                CppReductions, CppScans, CppScatter):
    def __init__(self, group, internal, graph, name, num_threads, in_place=None, row_blocks=True):
        self.init_args = (group, internal, graph, name, num_threads, in_place)
        self.no_row_blocks = not row_blocks
        self.emitted = {}         # name -> CppVar of every value _emit wrote (row_blocks.py)
        self.group = group
        self.graph = graph
        self.name = name
        self.num_threads = num_threads
        self.args = KernelArgs(in_place)
        self.cse = CSE("tmp")
        layouts = group.node_layouts()
        plans = {node.name: plan_and_deps(node.buffer, xs, rs)[0] for node, xs, rs, _ in layouts}
        finest = max((plan.x_sizes for plan in plans.values()), key=len)   # see CppScheduling._same_loop_nest
        self.plans = {name: refine_plan(plan, finest) for name, plan in plans.items()}
        self.x_sizes = [sym.sint(s) for s in finest]      # sympy: symbolic under dynamic shapes
        r_plans = [self.plans[n.name] for n, _, _, kind in layouts if kind != "x"]
        self.r_sizes = [sym.sint(s) for s in r_plans[0].r_sizes] if r_plans else []
        self.is_reduction = group.r_numel != 1
        self.size_args = []       # size symbols the kernel takes as arguments (after generate)
        self.segments = plan_segments(layouts) if self.is_reduction else [Segment(0, False, layouts)]
        crossing = buffers_crossing_loops(self.segments)
        self.local_buffers = {n: f"local_{n}" for n in sorted(crossing & set(internal))}
        self.internal = set(internal) | set(self.local_buffers)
        self.axis = self._choose_vector_axis(layouts)
        # With axis "x" the lanes are rows: a local buffer then holds one row per lane,
        # lane-interleaved (element r of lane l at r * kVecLanes + l), so each r position
        # is one contiguous vector (a softmax over a transposed input, or over dim 0)
        self.finished_reductions = {}
        self.split = False        # a full reduction split among threads (loop_nest.py)
        self.partials = None      # an outer reduction's accumulator rows (outer_reduction.py)
        self.welford_rows = []    # its Welford accumulators (cascade_rows.py)
        self.cascade_sums = []    # its float sums folded in chunks (cascade_rows.py)
        self.block_width = None
        self._vector_indirect = set()
        self.indirect_sizes = {}  # indirect index variable -> the size of the dim it indexes
        self.tiled = self.axis == "x" and self._needs_tiling(layouts)
        self.tiles = {}   # transposed reads staged through a tile buffer
        self.out_tiles = None   # in a vector-x r loop: stores written out transposed (loop_nest.py)
        self.stored = {}        # buffer -> (value, segment index, from an r loop)
        self.code = IndentedBuffer()
        self.mask_stack = []
        self.vec_mode = False
        self.in_r_loop = False
        self.segment_index = 0
        self.acc_counter = 0
        self.plan = None
        self.node_kind = None
        self.checks_division = False   # an integer division: the kernel returns zero_division
        self._init_read_cache()
        self.lane_groups = 1   # vectors of rows per step (lane_pairs.py)

    # ---- analysis ---------------------------------------------------------------------
    def _choose_vector_axis(self, layouts):
        """"r": vectorize the innermost reduced dim; "x": the innermost row dim (pointwise
        kernels and outer reductions); None: scalar code (0-d results)."""
        if not self.is_reduction:
            return "x" if self.x_sizes else None
        r_var = sympy.Symbol(f"r{len(self.r_sizes) - 1}", integer=True, nonnegative=True)
        x_var = sympy.Symbol(f"x{len(self.x_sizes) - 1}", integer=True, nonnegative=True) if self.x_sizes else None
        r_contiguous = x_contiguous = True
        x_walks = False     # some read walks memory along x (stride 1)
        for node, xs, rs, kind in layouts:
            for dep in self.node_reads(node, xs, rs):
                if dep.name in self.group.names:
                    continue
                if _stride(dep.index, r_var) not in (0, 1):
                    r_contiguous = False
                x_stride = _stride(dep.index, x_var) if x_var is not None else None
                if x_stride not in (0, 1):
                    x_contiguous = False
                x_walks = x_walks or x_stride == 1
        if not r_contiguous and x_contiguous and self.x_sizes:
            return "x"
        if not r_contiguous and x_walks and self._reduces_fewer_than(SHORT_REDUCTION):
            # a reduction of a few strided elements (GQA's sum over the heads sharing a KV
            # head, in the backward): vectors along r would hold that few lanes, gathered
            return "x"
        return "r"

    def _reduces_fewer_than(self, count: int) -> bool:
        numel = self.group.r_numel
        return sym.is_static(numel) and sym.to_int(numel) < count

    def node_reads(self, node, x_sizes, r_sizes):
        """The node's reads over the kernel's row dims."""
        _, reads, _ = plan_and_deps(node.buffer, x_sizes, r_sizes)
        return [refine_dep(dep, self.x_sizes) for dep in reads]

    @property
    def vector_var(self) -> Optional[sympy.Symbol]:
        if self.axis == "x":
            return sympy.Symbol(f"x{len(self.x_sizes) - 1}", integer=True, nonnegative=True)
        if self.axis == "r":
            return sympy.Symbol(f"r{len(self.r_sizes) - 1}", integer=True, nonnegative=True)
        return None

    # ---- driving ----------------------------------------------------------------------
    def generate(self) -> str:
        source = self._with_size_params(self._generate())
        return _returning_zero_division(source, self.name) if self.checks_division else source

    def _generate(self) -> str:
        if self._is_scatter():
            return self._generate_scatter()
        if self._is_scan():
            return self._generate_scan()
        if self._rows_outer_reduction():
            return self._generate_rows_outer_reduction()
        if self._loop_row_blocks():
            try:
                return self._generate_loop_row_blocks()
            except _Decline:    # a construct the row-block form does not move: the plain form
                plain = type(self)(*self.init_args, row_blocks=False)
                source = plain._generate()
                self.__dict__.update(plain.__dict__)
                return source
        if self._split_full_reduction():
            self.split = True
            return self._generate_split_full_reduction()
        body = IndentedBuffer()
        if self.axis == "x":
            self._emit_vector_x_chunk(body)
            if self.read_cache is None and (cached := self._reads_worth_caching()):
                again = type(self)(*self.init_args, row_blocks=False)
                again.read_cache = cached
                source = again._generate()
                self.__dict__.update(again.__dict__)
                return source
        else:
            for seg in self.segments:
                self._emit_segment(body, seg)
        return self._function(body)

    def _with_size_params(self, source: str) -> str:
        """The size symbols the generated code mentions become parameters after the
        pointers (``const int64_t s0``; ``double`` for a float scalar such as ``zuf0``)."""
        found = {symbol for symbol in self.graph.symbol_sources if re.search(rf"\b{symbol}\b", source)}
        self.size_args = sorted(found, key=lambda s: (len(s.name), s.name))
        params = "".join(f", const {'double' if s.name.startswith('z') else 'int64_t'} {s}" for s in self.size_args)
        return source.replace(SIZE_PARAMS, params)

    def _run_node(self, node, x_sizes, r_sizes, kind):
        self.plan = self.plans[node.name]
        self.node_kind = kind
        with set_ops_handler(self):
            node.buffer.run_body(self.plan.raw_x, self.plan.raw_r)

    def _run_loop_segment(self, seg, body):
        """Generate the nodes of one inner loop into ``body``; values computed inside the
        loop go out of scope after it, reduction results live on."""
        self.code = body
        self.in_r_loop = True
        snapshot = dict(self.cse.cache)
        for layout in seg.layouts:
            self._run_node(*layout)
        self.cse.cache = dict(snapshot, **self.finished_reductions)
        self.finished_reductions = {}
        self.in_r_loop = False

    def _emit_segment(self, out, seg):
        """One segment of an "r"-vectorized (or scalar) kernel, inside the row loop."""
        self.segment_index = seg.index
        if not seg.is_loop:
            self.vec_mode = False
            self.in_r_loop = False
            self.code = out
            for layout in seg.layouts:
                self._run_node(*layout)
            return
        pre, post, inner = IndentedBuffer(), IndentedBuffer(), IndentedBuffer()
        self.pre, self.post = pre, post
        self.vec_mode = True
        self._run_loop_segment(seg, inner)
        self.vec_mode = False
        out.writeline(f"// loop {seg.index + 1}: {', '.join(sorted(set(o for n, _, _, _ in seg.layouts for o in n.origins)))}")
        out.splice(pre)
        self._emit_unrolled_r_loops(out, inner)
        out.splice(post)
        self.code = out


    # ---- index helpers ----------------------------------------------------------------
    def _index(self, index) -> sympy.Expr:
        return self.plan.remap(index)

    def _access_kind(self, index) -> str:
        """"scalar" (no vector lane varies it), "contiguous" or "gather"."""
        if not self.vec_mode:
            return "scalar"
        var = self.vector_var
        vector_symbols = {s for s in index.free_symbols if s.name in self.vector_indirect}
        if vector_symbols:
            return "gather"
        if var not in index.free_symbols:
            return "scalar"
        return "contiguous" if _stride(index, var) == 1 else "gather"

    def _vector_index(self, index) -> str:
        """The index as a tf::Vec<int64_t>: one element index per lane."""
        var = self.vector_var
        lanes = sympy.Symbol(f"{var.name}_lanes", integer=True)
        replaced = index.xreplace({var: lanes})
        if lanes in replaced.free_symbols:
            self._ensure_lanes(var)
        vector = lanes in replaced.free_symbols or any(s.name in self.vector_indirect for s in index.free_symbols)
        text = _vector_printer.doprint(replaced)
        return text if vector else f"tf::Vec<int64_t>({text})"

    def _ensure_lanes(self, var):
        key = f"lanes:{var.name}"
        if key not in self.cse.cache:
            self.code.writeline(f"const auto {var.name}_lanes = tf::Vec<int64_t>::arange({var.name});")
            self.cse.cache[key] = CppVar(f"{var.name}_lanes", torch.int64, True)

    @property
    def vector_indirect(self):
        return self._vector_indirect

    def _mask(self) -> Optional[CppVar]:
        if not self.mask_stack:
            return None
        mask = self.mask_stack[0]
        for other in self.mask_stack[1:]:
            mask = self._emit(f"{mask} & {other}", torch.bool, mask.vec or other.vec)
        return mask

    # ---- emitting values --------------------------------------------------------------
    def _emit(self, expr, dtype, vec) -> CppVar:
        if expr in self.cse.cache:
            return self.cse.cache[expr]
        var = CppVar(f"tmp{self.cse.counter}", dtype, vec)
        self.cse.counter += 1
        self.code.writeline(f"const auto {var} = {expr};")
        self.cse.cache[expr] = var
        self.emitted[var.name] = var
        return var

    def _as_vec(self, value: CppVar) -> str:
        if value.vec or not self.vec_mode:
            return str(value)
        return f"tf::Vec<{ctype(value.dtype)}>({value})"

    # ---- ops: memory ------------------------------------------------------------------
    def load(self, name, index):
        if name in self.stored:
            value, segment, from_loop = self.stored[name]
            if segment == self.segment_index or not from_loop:
                return value
        dtype = self.graph.name_to_buffer[name].get_dtype()
        if name in self.local_buffers and self.axis == "x":
            # in bounds wherever a mask points: masked() applies the mask to what it returns
            return self._emit(f"tf::vload<TAIL>({self.local_buffers[name]} + {self._lane_local_offset()}, count)",
                              compute_dtype(dtype), True)
        if name in self.local_buffers:
            pointer, dtype = self.local_buffers[name], compute_dtype(dtype)
            index = self._local_index()
        else:
            pointer = self.args.input(name)
            index = self._index(index)
            cached = self._cached_load(name, pointer, index, dtype)
            if cached is not None:
                return cached
        return self._load_from(pointer, index, dtype)

    def _load_from(self, pointer, index, dtype) -> CppVar:
        kind = self._access_kind(index)
        mask = self._mask()
        half = HALF_TYPES.get(dtype)
        if kind == "scalar":
            text = f"{pointer}[{cexpr(index)}]"
            if half:
                text = f"tf::{half}_to_float({text})"
            if mask is not None and not mask.vec:
                text = f"({mask} ? {text} : {ctype(dtype)}(0))"
            elif mask is not None:
                kind = "gather"
            if kind == "scalar":
                return self._emit(text, dtype, False)
        if kind == "gather" and mask is None and self.tiled and self._is_transposed(index):
            return self._tile_load(pointer, index, dtype)
        if kind == "contiguous" and mask is None:
            offset = cexpr(index)
            loader = f"tf::vload_{half}<TAIL>" if half else "tf::vload<TAIL>"
            return self._emit(f"{loader}({pointer} + {offset}, count)", dtype, True)
        if kind == "contiguous" and not half and dtype != torch.bool:
            # masked lanes may point outside the buffer (a cat's other piece): never touched
            return self._emit(f"tf::vload_masked<TAIL>({pointer} + {cexpr(index)}, {self._as_vec(mask)}, count)",
                              dtype, True)
        mask_text = self._as_vec(mask) if mask is not None else "tf::Vec<bool>(true)"
        if self._every_other_element(index, dtype):
            return self._emit(f"tf::vload_stride2<TAIL>({pointer} + {cexpr(index)}, {mask_text}, count)", dtype, True)
        idx = self._vector_index(index)
        if half:
            return self._emit(f"tf::vgather_{half}<TAIL>({pointer}, {idx}, {mask_text}, count)", dtype, True)
        return self._emit(f"tf::vgather_masked<TAIL>({pointer}, {idx}, {mask_text}, count)", dtype, True)

    def _every_other_element(self, index, dtype) -> bool:
        """A read whose lanes step by 2 elements of a 4-byte type (vload_stride2): the
        index at the vector variable is lane 0's element, lane i's is 2 i further."""
        return dtype.itemsize == 4 and _stride(index, self.vector_var) == 2 \
            and not any(s.name in self.vector_indirect for s in index.free_symbols)

    def _is_transposed(self, index) -> bool:
        k = len(self.x_sizes) - 1
        inner = sympy.Symbol(f"x{k}", integer=True, nonnegative=True)
        outer = sympy.Symbol(f"x{k - 1}", integer=True, nonnegative=True)
        return _stride(index, inner) not in (None, 0, 1) and _stride(index, outer) == 1

    def _tile_load(self, pointer, index, dtype) -> CppVar:
        """A transposed read inside a tile: the tile's block of the input is first copied
        (reading memory contiguously) into a small row-major buffer, then read by rows."""
        key = (pointer, str(index))
        if key not in self.tiles:
            self.tiles[key] = (f"tile{len(self.tiles)}", pointer, index, dtype)
        name = self.tiles[key][0]
        k = len(self.x_sizes) - 1
        offset = f"(x{k - 1} - x{k - 1}_tile) * kTileCols + (x{k} - x{k}_tile)"
        return self._emit(f"tf::vload<TAIL>({name} + {offset}, count)", dtype, True)


    def _local_index(self) -> sympy.Expr:
        """Flat index of the current r position inside one row."""
        flat = sympy.Integer(0)
        for i, stride in enumerate(sym.contiguous_strides(self.r_sizes)):
            flat = flat + sympy.Symbol(f"r{i}", integer=True, nonnegative=True) * stride
        return flat

    def _lane_local_offset(self) -> str:
        return f"{cexpr(self._local_index())} * tf::kVecLanes"

    def store(self, name, index, value):
        self.stored[name] = (value, self.segment_index, self.in_r_loop)
        if name in self.local_buffers and self.axis == "x":
            value = self._cast_value(value, self.graph.name_to_buffer[name].get_dtype())
            self.code.writeline(f"tf::vstore<TAIL>({self.local_buffers[name]} + {self._lane_local_offset()}, "
                                f"{self._as_vec(value)}, count);")
            return
        if name in self.local_buffers:
            self._store_to(self.local_buffers[name], self._local_index(), value,
                           compute_dtype(self.graph.name_to_buffer[name].get_dtype()))
            return
        if name in self.internal:
            return
        dtype = self.graph.name_to_buffer[name].get_dtype()
        index = self._index(index)
        if self.out_tiles is not None and self.in_r_loop and self._along_r_across_lanes(index, dtype):
            self._tile_store(self.args.output(name), index, value, dtype)
            return
        self._store_to(self.args.output(name), index, value, dtype)

    def _along_r_across_lanes(self, index, dtype) -> bool:
        """A store inside a vector-x r loop, contiguous along the innermost reduced dim,
        strided across the lanes: written through a tile (loop_nest._emit_plain_r_loops)."""
        r_last = sympy.Symbol(f"r{len(self.r_sizes) - 1}", integer=True, nonnegative=True)
        loop_vars = {f"x{i}" for i in range(len(self.x_sizes))} | {f"r{i}" for i in range(len(self.r_sizes))}
        return (STORAGE_TYPES[dtype] in ("float", "uint16_t") and all(s.name in loop_vars for s in index.free_symbols)
                and _stride(index, r_last) == 1 and _stride(index, self.vector_var) not in (None, 0, 1))

    def _tile_store(self, pointer, index, value, dtype):
        if pointer not in self.out_tiles:
            self.out_tiles[pointer] = (f"out_tile{len(self.out_tiles)}", index, dtype)
        tile = self.out_tiles[pointer][0]
        r_last = f"r{len(self.r_sizes) - 1}"
        value = self._cast_value(value, dtype)
        # in a row block (row_blocks.py) each vector of rows has its own tile in a block tile
        chunk = f"(x{len(self.x_sizes) - 1} - xb) * {OUT_TILE_STEPS} + " if self.block_width else ""
        self.code.writeline(f"tf::vstore<TAIL>({tile} + {chunk}({r_last} - {r_last}_block) * tf::kVecLanes, "
                            f"{self._as_vec(value)}, count);")

    def _store_to(self, pointer, index, value, dtype, code=None):
        code = code or self.code
        half = HALF_TYPES.get(dtype)
        value = self._cast_value(value, dtype)
        kind = self._access_kind(index)
        if not self.vec_mode or (kind == "scalar" and not value.vec):
            text = f"tf::float_to_{half}({value})" if half else str(value)
            code.writeline(f"{pointer}[{cexpr(index)}] = {text};")
            return
        vector = self._as_vec(value)
        if kind == "contiguous":
            storer = f"tf::vstore_{half}<TAIL>" if half else "tf::vstore<TAIL>"
            code.writeline(f"{storer}({pointer} + {cexpr(index)}, {vector}, count);")
        else:
            scatter = f"tf::vscatter_{half}<TAIL>" if half else "tf::vscatter<TAIL>"
            code.writeline(f"{scatter}({pointer}, {self._vector_index(index)}, {vector}, count);")

    def _cast_value(self, value, dtype):
        target = compute_dtype(dtype)
        if compute_dtype(value.dtype) == target:
            return value
        return self.to_dtype(value, target)

    def store_reduction(self, name, index, value):
        self.stored[name] = (value, self.segment_index, False)
        if name in self.internal:
            return
        dtype = self.graph.name_to_buffer[name].get_dtype()
        target = self.post if self.in_r_loop else self.code
        if self.split:
            target = self.split_stores   # after the threads' partial results are combined
        saved, self.code = self.code, target
        saved_vec, self.vec_mode = self.vec_mode, value.vec
        try:
            self._store_to(self.args.output(name), self._index(index), value, dtype)
        finally:
            self.code, self.vec_mode = saved, saved_vec

    def index_expr(self, index, dtype):
        index = self._index(index)
        if not index.free_symbols:
            return self.constant(int(index), dtype)
        kind = self._access_kind(index)
        if kind == "scalar":
            return self._emit(f"{ctype(dtype)}({cexpr(index)})", dtype, False)
        return self._emit(f"tf::convert<{ctype(dtype)}>({self._vector_index(index)})", dtype, True)

    def indirect_indexing(self, value, size):
        size = cexpr(sympy.sympify(size))
        wrapped = self._emit(f"tf::where({value} < {ctype(value.dtype)}(0), {value} + {ctype(value.dtype)}({size}), "
                             f"{value})", value.dtype, value.vec)
        if wrapped.dtype != torch.int64:
            wrapped = self.to_dtype(wrapped, torch.int64)
        self.indirect_sizes[wrapped.name] = size
        if wrapped.vec:
            self._vector_indirect = self.vector_indirect | {wrapped.name}
        return sympy.Symbol(wrapped.name, integer=True)

    def masked(self, mask, body, other):
        self.mask_stack.append(mask)
        try:
            value = body()
        finally:
            self.mask_stack.pop()
        other_value = self.constant(other, value.dtype)
        vec = value.vec or mask.vec
        return self._emit(f"tf::where({self._vec_if(mask, vec)}, {self._vec_if(value, vec)}, "
                          f"{self._vec_if(other_value, vec)})", value.dtype, vec)

    # ---- ops: values ------------------------------------------------------------------
    def constant(self, value, dtype):
        return CppVar(cpp_constant(value, dtype), dtype, False, constant=value)

    def to_dtype(self, value, dtype):
        if value.dtype == dtype:
            return value
        if value.constant is not None:
            return self.constant(_cast_python(value.constant, dtype), dtype)
        if compute_dtype(value.dtype) == compute_dtype(dtype):
            return CppVar(value.name, dtype, value.vec)
        return self._emit(f"tf::convert<{ctype(dtype)}>({value})", dtype, value.vec)

    def _vec_if(self, value, vec) -> str:
        if vec and not value.vec:
            if value.dtype == torch.bool:
                return f"tf::Vec<bool>({value})"
            return f"tf::Vec<{ctype(value.dtype)}>({value})"
        return str(value)

    def __getattr__(self, name):
        if name not in CPP_OPS:
            raise AttributeError(f"the C++ backend has no op {name!r}")

        def emit(*operands):
            if name in CPP_CHECKED_DIVISION and is_integer(operands[0].dtype):
                return self._checked_division(name, operands)
            vec = any(o.vec for o in operands)
            template = cpp_op(name, operands[0].dtype, vec)
            if (name == "truediv" and vec and not operands[1].vec and operands[1].dtype.is_floating_point
                    and operands[0].dtype == operands[1].dtype):
                # a vector divided by a row-wise scalar (softmax, norms): multiply by the
                # reciprocal, computed once per row, as ATen's kernels do (within 1 ulp)
                t = ctype(operands[1].dtype)
                inverse = self._emit(f"{t}(1) / {operands[1]}", operands[1].dtype, False)
                return self._emit(f"({operands[0]} * tf::Vec<{t}>({inverse}))", operands[0].dtype, True)
            texts = [self._vec_if(o, vec) for o in operands]
            if name == "where" and not vec:
                return self._emit(f"({texts[0]} ? {texts[1]} : {texts[2]})", operands[1].dtype, False)
            dtype = cpp_result_dtype(name, operands)
            return self._emit(template.format(*texts), dtype, vec)
        return emit

    def _checked_division(self, name, operands) -> CppVar:
        """Integer / or %: a zero divisor in a lane that holds an element (not a tail lane,
        not masked off) sets the kernel's zero_division flag."""
        self.checks_division = True
        mask = self._mask()
        vec = any(o.vec for o in operands) or (mask is not None and mask.vec)
        if vec:
            active = "tf::active_lanes<TAIL>(count)"
            if mask is not None:
                active = f"({active} & {self._vec_if(mask, True)})"
        else:
            active = str(mask) if mask is not None else "true"
        texts = [self._vec_if(o, vec) for o in operands]
        return self._emit(CPP_CHECKED_DIVISION[name].format(*texts, active=active), operands[0].dtype, vec)


def _returning_zero_division(source: str, name: str) -> str:
    """``extern "C" void name(...) {body}`` -> ``extern "C" int name(...)`` that declares the
    zero_division flag its integer divisions set, and returns it."""
    head, newline, rest = source.partition("\n")
    assert head.startswith(f'extern "C" void {name}(') and rest.rstrip().endswith("}"), head
    head = head.replace(f'extern "C" void {name}(', f'extern "C" int {name}(', 1)
    body = rest.rstrip()[:-1]
    return (f"{head}\n    int zero_division = 0;   // set by an integer division by zero\n"
            f"{body}    return zero_division;\n}}\n")



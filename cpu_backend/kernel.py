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
import math
from dataclasses import dataclass
from typing import Optional

import sympy
import torch

from tritonfuse import sym
from tritonfuse.codegen.common import CSE, IndentedBuffer, IndexPrinter, KernelArgs
from tritonfuse.codegen.loops import Segment, buffers_crossing_loops, plan_segments
from tritonfuse.dependencies import plan_and_deps
from tritonfuse.virtualized import set_ops_handler

from .overrides import CPP_OPS, cpp_op, cpp_result_dtype

STORAGE_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "uint16_t", torch.bfloat16: "uint16_t",
    torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
    torch.uint8: "uint8_t", torch.bool: "bool",
}
HALF_TYPES = {torch.float16: "half", torch.bfloat16: "bf16"}
PARALLEL_THRESHOLD = 32768   # elements of work below which a kernel runs on one thread
UNROLL = 1                   # vector chunks per step of an inner reduction loop (4 measured slower)
TILE_ROWS, TILE_COLS = 32, 32  # blocks walked by pointwise kernels that read transposed data


def compute_dtype(dtype):
    return torch.float32 if dtype in HALF_TYPES else dtype


def ctype(dtype) -> str:
    return STORAGE_TYPES[compute_dtype(dtype)]


class CppPrinter(IndexPrinter):
    floordiv_op = "/"


class CppVectorIndexPrinter(CppPrinter):
    """Integers typed as int64_t so they combine with tf::Vec<int64_t> operands."""

    def _print_Integer(self, expr):
        return f"int64_t({int(expr)})"


_printer = CppPrinter()
_vector_printer = CppVectorIndexPrinter()


def cexpr(expr) -> str:
    return _printer.doprint(expr)


def cpp_constant(value, dtype) -> str:
    dtype = compute_dtype(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        t = ctype(dtype)
        if math.isnan(value):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}std::numeric_limits<{t}>::infinity()"
        text = repr(value)
        return f"{text}f" if dtype == torch.float32 else text
    return f"{ctype(dtype)}({int(value)})"


REDUCTION_IDENTITY = {"sum": 0, "prod": 1, "any": False, "all": True}


def reduction_identity(reduction_type, dtype):
    if reduction_type in REDUCTION_IDENTITY:
        return REDUCTION_IDENTITY[reduction_type]
    if reduction_type in ("max", "argmax"):
        return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min
    return float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max


@dataclass(eq=False)
class CppVar:
    """A value in generated C++: ``vec`` tells a tf::Vec from a scalar."""
    name: str
    dtype: torch.dtype
    vec: bool = False
    constant: Optional[object] = None

    def __str__(self):
        return self.name


class CppKernel:
    def __init__(self, group, internal, graph, name, num_threads):
        self.group = group
        self.graph = graph
        self.name = name
        self.num_threads = num_threads
        self.args = KernelArgs()
        self.cse = CSE("tmp")
        layouts = group.node_layouts()
        self.plans = {node.name: plan_and_deps(node.buffer, xs, rs)[0] for node, xs, rs, _ in layouts}
        first = self.plans[layouts[0][0].name]
        self.x_sizes = [sym.to_int(s) for s in first.x_sizes]
        r_plans = [self.plans[n.name] for n, _, _, kind in layouts if kind != "x"]
        self.r_sizes = [sym.to_int(s) for s in r_plans[0].r_sizes] if r_plans else []
        self.is_reduction = group.r_numel > 1
        self.segments = plan_segments(layouts) if self.is_reduction else [Segment(0, False, layouts)]
        crossing = buffers_crossing_loops(self.segments)
        self.local_buffers = {n: f"local_{n}" for n in sorted(crossing & set(internal))}
        self.internal = set(internal) | set(self.local_buffers)
        self.axis = self._choose_vector_axis(layouts)
        if self.axis == "x":   # lanes are rows there: a one-row scratch buffer can't hold them
            self.internal -= set(self.local_buffers)
            self.local_buffers = {}
        self.finished_reductions = {}
        self._vector_indirect = set()
        self.tiled = self.axis == "x" and self._needs_tiling(layouts)
        self.tiles = {}   # transposed reads staged through a tile buffer
        self.stored = {}        # buffer -> (value, segment index, from an r loop)
        self.code = IndentedBuffer()
        self.mask_stack = []
        self.vec_mode = False
        self.in_r_loop = False
        self.segment_index = 0
        self.acc_counter = 0
        self.plan = None
        self.node_kind = None

    # ---- analysis ---------------------------------------------------------------------
    def _choose_vector_axis(self, layouts):
        """"r": vectorize the innermost reduced dim; "x": the innermost row dim (pointwise
        kernels and outer reductions); None: scalar code (0-d results)."""
        if not self.is_reduction:
            return "x" if self.x_sizes else None
        r_var = sympy.Symbol(f"r{len(self.r_sizes) - 1}", integer=True, nonnegative=True)
        x_var = sympy.Symbol(f"x{len(self.x_sizes) - 1}", integer=True, nonnegative=True) if self.x_sizes else None
        r_contiguous = x_contiguous = True
        for node, xs, rs, kind in layouts:
            _, reads, _ = plan_and_deps(node.buffer, xs, rs)
            for dep in reads:
                if dep.name in self.group.names:
                    continue
                if _stride(dep.index, r_var) not in (0, 1):
                    r_contiguous = False
                if x_var is None or _stride(dep.index, x_var) not in (0, 1):
                    x_contiguous = False
        if not r_contiguous and x_contiguous and self.x_sizes:
            return "x"
        return "r"

    @property
    def vector_var(self) -> Optional[sympy.Symbol]:
        if self.axis == "x":
            return sympy.Symbol(f"x{len(self.x_sizes) - 1}", integer=True, nonnegative=True)
        if self.axis == "r":
            return sympy.Symbol(f"r{len(self.r_sizes) - 1}", integer=True, nonnegative=True)
        return None

    # ---- driving ----------------------------------------------------------------------
    def generate(self) -> str:
        if self._rows_outer_reduction():
            return self._generate_rows_outer_reduction()
        body = IndentedBuffer()
        if self.axis == "x":
            self._emit_vector_x_chunk(body)
        else:
            for seg in self.segments:
                self._emit_segment(body, seg)
        return self._function(body)

    # ---- reductions over an outer dim (x.sum(0)): rows outside, per-thread partials ----
    def _rows_outer_reduction(self) -> bool:
        """An outer reduction whose loop holds only sum/prod/max/min/any/all nodes:
        stream the input row by row (contiguous) into a per-thread accumulator row."""
        if self.axis != "x" or not self.is_reduction or not self.segments[0].is_loop:
            return False
        if len(self.segments) > 2 or any(s.is_loop for s in self.segments[1:]):
            return False
        for node, _, _, kind in self.segments[0].layouts:
            if kind != "reduction" or node.buffer.data.reduction_type in ("argmax", "argmin"):
                return False
        return True

    def _generate_rows_outer_reduction(self) -> str:
        x_total = math.prod(self.x_sizes)
        self.rows_outer = True
        self.partials = []                  # (accumulator name, C type, identity, combine)
        loop_body, epilogue = IndentedBuffer(), IndentedBuffer()
        self.pre, self.post = IndentedBuffer(), epilogue
        self.code, self.vec_mode, self.in_r_loop = loop_body, True, True
        self.segment_index = 0
        for layout in self.segments[0].layouts:
            self._run_node(*layout)
        self.in_r_loop = False
        self.finished_reductions = {}
        self.code = epilogue
        for seg in self.segments[1:]:
            self.segment_index = seg.index
            for layout in seg.layouts:
                self._run_node(*layout)
        self.vec_mode = False
        work = self.group.x_numel * self.group.r_numel
        threads = self.num_threads if (self.num_threads > 1 and work >= PARALLEL_THRESHOLD) else 1
        code = IndentedBuffer()
        code.writeline(f'extern "C" void {self.name}({self._params()}) {{')
        with code.indent():
            code.writeline(f"constexpr int64_t kRows = {x_total};   // accumulator row: one slot per output")
            code.writeline(f"const int nthreads = {threads};")
            for acc, t, identity, _ in self.partials:
                code.writeline(f"std::unique_ptr<{t}[]> {acc}_partial(new {t}[nthreads * kRows + tf::kVecLanes]);")
            code.writeline("#pragma omp parallel num_threads(nthreads)" if threads > 1 else "{")
            if threads > 1:
                code.writeline("{")
            with code.indent():
                code.writeline("const int tid = " + ("omp_get_thread_num();" if threads > 1 else "0;"))
                for acc, t, identity, _ in self.partials:
                    code.writeline(f"{t}* __restrict__ {acc}_row = {acc}_partial.get() + tid * kRows;")
                    code.writeline(f"for (int64_t i = 0; i < kRows; ++i) {acc}_row[i] = {identity};")
                if threads > 1:
                    collapse = f" collapse({len(self.r_sizes)})" if len(self.r_sizes) > 1 else ""
                    code.writeline(f"#pragma omp for{collapse} schedule(static)")
                for i, size in enumerate(self.r_sizes):
                    code.writeline(f"for (int64_t r{i} = 0; r{i} < {size}; ++r{i}) {{")
                    code._indent += 1
                self._emit_x_chunks(code, loop_body)
                for _ in self.r_sizes:
                    code._indent -= 1
                    code.writeline("}")
            code.writeline("}")
            code.writeline("// combine the threads' rows in a fixed order, then the row-wise epilogue")
            self._emit_x_chunks(code, epilogue)
        code.writeline("}")
        return code.getvalue()

    def _emit_x_chunks(self, code, inner):
        names = [f"x{i}" for i in range(len(self.x_sizes))]
        for name, size in zip(names[:-1], self.x_sizes[:-1]):
            code.writeline(f"for (int64_t {name} = 0; {name} < {size}; ++{name}) {{")
            code._indent += 1
        self._emit_vector_loops(code, [], [], inner, vector_dim=("x", len(self.x_sizes) - 1, self.x_sizes[-1]))
        for _ in names[:-1]:
            code._indent -= 1
            code.writeline("}")

    def _x_flat(self) -> str:
        strides = sym.contiguous_strides([sympy.Integer(s) for s in self.x_sizes])
        return cexpr(sum((sympy.Symbol(f"x{i}", integer=True) * st for i, st in enumerate(strides)),
                         sympy.Integer(0)))

    def _rows_outer_reduction_op(self, reduction_type, value, acc, t, identity, dtype):
        combine = _LANE_COMBINE[reduction_type]
        self.partials.append((acc, t, identity, combine))
        flat = self._x_flat()
        self.code.writeline(f"tf::vstore<TAIL>({acc}_row + {flat}, "
                            f"{combine.format(a=f'tf::vload<TAIL>({acc}_row + {flat}, count)', b=value)}, count);")
        result = CppVar(f"{acc}_result", dtype, True)
        self.post.writeline(f"auto {result} = tf::vload<TAIL>({acc}_partial.get() + {flat}, count);")
        self.post.writeline(f"for (int t = 1; t < nthreads; ++t) {result} = "
                            f"{combine.format(a=result, b=f'tf::vload<TAIL>({acc}_partial.get() + t * kRows + {flat}, count)')};")
        return result

    def _run_node(self, node, x_sizes, r_sizes, kind):
        self.plan = self.plans[node.name]
        self.node_kind = kind
        with set_ops_handler(self):
            if node.is_reduction():
                node.buffer.body(self.plan.raw_x, self.plan.raw_r)
            else:
                node.buffer.body(self.plan.raw_x + self.plan.raw_r, [])

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
        self.code = inner
        self.vec_mode = True
        self.in_r_loop = True
        snapshot = dict(self.cse.cache)
        for layout in seg.layouts:
            self._run_node(*layout)
        self.cse.cache = dict(snapshot, **self.finished_reductions)
        self.finished_reductions = {}
        self.in_r_loop = False
        self.vec_mode = False
        out.writeline(f"// loop {seg.index + 1}: {', '.join(sorted(set(o for n, _, _, _ in seg.layouts for o in n.origins)))}")
        out.splice(pre)
        self._emit_unrolled_r_loops(out, inner)
        out.splice(post)
        self.code = out

    def _emit_vector_x_chunk(self, out):
        """Pointwise kernels and outer reductions: everything inside one vector chunk of x."""
        inner = IndentedBuffer()
        self.code = inner
        self.vec_mode = True
        for seg in self.segments:
            self.segment_index = seg.index
            if seg.is_loop:
                self.pre, self.post = IndentedBuffer(), IndentedBuffer()
                loop_body = IndentedBuffer()
                self.code = loop_body
                self.in_r_loop = True
                snapshot = dict(self.cse.cache)
                for layout in seg.layouts:
                    self._run_node(*layout)
                self.cse.cache = dict(snapshot, **self.finished_reductions)
                self.finished_reductions = {}
                self.in_r_loop = False
                self.code = inner
                inner.splice(self.pre)
                for i, size in enumerate(self.r_sizes):
                    inner.writeline(f"for (int64_t r{i} = 0; r{i} < {size}; ++r{i}) {{")
                    inner._indent += 1
                inner.splice(loop_body)
                for _ in self.r_sizes:
                    inner._indent -= 1
                    inner.writeline("}")
                inner.splice(self.post)
            else:
                for layout in seg.layouts:
                    self._run_node(*layout)
        self.vec_mode = False
        if self.tiled:
            self._emit_tiles(out, inner)
        else:
            self._emit_vector_loops(out, [], [], inner, vector_dim=("x", len(self.x_sizes) - 1, self.x_sizes[-1]))

    def _needs_tiling(self, layouts) -> bool:
        """A pointwise kernel that reads some input transposed (contiguous along the
        second-innermost dim): walk TILE x TILE blocks so the gathered lines get reused."""
        if self.is_reduction or len(self.x_sizes) < 2:
            return False
        inner = sympy.Symbol(f"x{len(self.x_sizes) - 1}", integer=True, nonnegative=True)
        outer = sympy.Symbol(f"x{len(self.x_sizes) - 2}", integer=True, nonnegative=True)
        for node, xs, rs, _ in layouts:
            _, reads, _ = plan_and_deps(node.buffer, xs, rs)
            if any(_stride(dep.index, inner) not in (0, 1) and _stride(dep.index, outer) == 1 for dep in reads):
                return True
        return False

    def _emit_tiles(self, out, inner):
        k = len(self.x_sizes) - 1
        rows, cols = self.x_sizes[k - 1], self.x_sizes[k]
        out.writeline(f"for (int64_t x{k - 1}_tile = 0; x{k - 1}_tile < {rows}; x{k - 1}_tile += {TILE_ROWS}) {{")
        out.writeline(f"for (int64_t x{k}_tile = 0; x{k}_tile < {cols}; x{k}_tile += {TILE_COLS}) {{")
        with out.indent():
            out.writeline(f"const int64_t x{k - 1}_end = std::min<int64_t>(x{k - 1}_tile + {TILE_ROWS}, {rows});")
            out.writeline(f"const int64_t x{k}_end = std::min<int64_t>(x{k}_tile + {TILE_COLS}, {cols});")
            self._emit_tile_fills(out)
            out.writeline(f"for (int64_t x{k - 1} = x{k - 1}_tile; x{k - 1} < x{k - 1}_end; ++x{k - 1}) {{")
            out.writeline(f"for (int64_t x{k} = x{k}_tile; x{k} < x{k}_end; x{k} += tf::kVecLanes) {{")
            with out.indent():
                out.writeline(f"const int count = x{k}_end - x{k} < tf::kVecLanes ? int(x{k}_end - x{k}) : tf::kVecLanes;")
                out.writeline("auto body = [&](auto tail) TF_INLINE_LAMBDA {")
                with out.indent():
                    out.writeline("constexpr bool TAIL = decltype(tail)::value;")
                    out.writeline("(void)TAIL;")
                    out.splice(inner)
                out.writeline("};")
                out.writeline("if (count == tf::kVecLanes) body(std::false_type{}); else body(std::true_type{});")
            out.writeline("}")
            out.writeline("}")
        out.writeline("}")
        out.writeline("}")

    def _emit_unrolled_r_loops(self, out, inner):
        """The reduced dims; the innermost in vector chunks, UNROLL chunks per step, each
        with its own accumulator slot so loop-carried chains run in parallel."""
        names = [f"r{i}" for i in range(len(self.r_sizes))]
        out.writeline("{")
        out._indent += 1
        for name, size in zip(names[:-1], self.r_sizes[:-1]):
            out.writeline(f"for (int64_t {name} = 0; {name} < {size}; ++{name}) {{")
            out._indent += 1
        var, size = names[-1], self.r_sizes[-1]
        out.writeline(f"auto body = [&](int64_t {var}, int count, auto tail, auto slot) TF_INLINE_LAMBDA {{")
        with out.indent():
            out.writeline("constexpr bool TAIL = decltype(tail)::value;")
            out.writeline("constexpr int SLOT = decltype(slot)::value;")
            out.writeline("(void)TAIL; (void)SLOT; (void)count;")
            out.splice(inner)
        out.writeline("};")
        out.writeline(f"int64_t {var}_start = 0;")
        if UNROLL > 1 and size >= UNROLL * 4:
            step = f"{UNROLL} * tf::kVecLanes"
            out.writeline(f"for (; {var}_start + {step} <= {size}; {var}_start += {step}) {{")
            with out.indent():
                for k in range(UNROLL):
                    offset = f" + {k} * tf::kVecLanes" if k else ""
                    out.writeline(f"body({var}_start{offset}, tf::kVecLanes, std::false_type{{}}, "
                                  f"std::integral_constant<int, {k}>{{}});")
            out.writeline("}")
        # full vectors, then at most one partial vector: no per-iteration tail test
        out.writeline(f"for (; {var}_start + tf::kVecLanes <= {size}; {var}_start += tf::kVecLanes) {{")
        with out.indent():
            out.writeline(f"body({var}_start, tf::kVecLanes, std::false_type{{}}, std::integral_constant<int, 0>{{}});")
        out.writeline("}")
        if size % 16:   # kVecLanes divides 16
            out.writeline(f"if ({var}_start < {size}) body({var}_start, int({size} - {var}_start), std::true_type{{}}, "
                          f"std::integral_constant<int, 0>{{}});")
        for _ in names[:-1]:
            out._indent -= 1
            out.writeline("}")
        out._indent -= 1
        out.writeline("}")

    def _emit_vector_loops(self, out, names, sizes, inner, vector_dim=None):
        """Loops over ``names``; the last one runs in vector chunks through a lambda."""
        if vector_dim is None:
            vector_dim = ("r", len(sizes) - 1, sizes[-1])
            names, sizes = names[:-1], sizes[:-1]
        prefix, index, size = vector_dim
        var = f"{prefix}{index}"
        for name, s in zip(names, sizes):
            out.writeline(f"for (int64_t {name} = 0; {name} < {s}; ++{name}) {{")
            out._indent += 1
        out.writeline(f"for (int64_t {var} = 0; {var} < {size}; {var} += tf::kVecLanes) {{")
        with out.indent():
            if size % _lanes_guess() == 0 and size >= 64:
                out.writeline("const int count = tf::kVecLanes;")
            else:
                out.writeline(f"const int count = {size} - {var} < tf::kVecLanes ? int({size} - {var}) : tf::kVecLanes;")
            out.writeline("auto body = [&](auto tail) TF_INLINE_LAMBDA {")
            with out.indent():
                out.writeline("constexpr bool TAIL = decltype(tail)::value;")
                out.writeline("(void)TAIL;")
                out.splice(inner)
            out.writeline("};")
            out.writeline("if (count == tf::kVecLanes) body(std::false_type{}); else body(std::true_type{});")
        out.writeline("}")
        for _ in names:
            out._indent -= 1
            out.writeline("}")

    def _params(self) -> str:
        params = []
        for param, buffer in self.args.call_order():
            dtype = self.graph.name_to_buffer[buffer].get_dtype()
            const = "const " if param.startswith("in_") else ""
            params.append(f"{const}{STORAGE_TYPES[dtype]}* __restrict__ {param}")
        return ", ".join(params)

    def _function(self, body: IndentedBuffer) -> str:
        code = IndentedBuffer()
        code.writeline(f'extern "C" void {self.name}({self._params()}) {{')
        with code.indent():
            outer_names = [f"x{i}" for i in range(len(self.x_sizes))]
            outer_sizes = list(self.x_sizes)
            if self.tiled:
                outer_names, outer_sizes = outer_names[:-2], outer_sizes[:-2]
                tiles = -(-self.x_sizes[-2] // TILE_ROWS) * -(-self.x_sizes[-1] // TILE_COLS)
                outer_count = (math.prod(outer_sizes) if outer_sizes else 1) * tiles
            elif self.axis == "x":
                outer_names, outer_sizes = outer_names[:-1], outer_sizes[:-1]
                chunks = -(-self.x_sizes[-1] // 16)
                outer_count = (math.prod(outer_sizes) if outer_sizes else 1) * chunks
            else:
                outer_count = math.prod(outer_sizes) if outer_sizes else 1
            work = self.group.x_numel * self.group.r_numel
            parallel = self.num_threads > 1 and work >= PARALLEL_THRESHOLD and outer_count > 1
            loops = len(outer_names) + (2 if self.tiled else 1 if self.axis == "x" else 0)
            if parallel:
                code.writeline(f"#pragma omp parallel num_threads({self.num_threads})")
                code.writeline("{")
                code._indent += 1
            self._declare_local_buffers(code)
            if parallel and loops:
                collapse = f" collapse({loops})" if loops > 1 else ""
                code.writeline(f"#pragma omp for{collapse} schedule(static)")
            for name, size in zip(outer_names, outer_sizes):
                code.writeline(f"for (int64_t {name} = 0; {name} < {size}; ++{name}) {{")
                code._indent += 1
            code.splice(body)
            for _ in outer_names:
                code._indent -= 1
                code.writeline("}")
            if parallel:
                code._indent -= 1
                code.writeline("}")
        code.writeline("}")
        return code.getvalue()

    def _declare_local_buffers(self, code):
        row = math.prod(self.r_sizes) if self.r_sizes else 1
        for name, local in self.local_buffers.items():
            t = ctype(self.graph.name_to_buffer[name].get_dtype())
            code.writeline(f"tf::LocalBuffer<{t}> {local}_storage({row});  // one row of {name}, per thread")
            code.writeline(f"{t}* __restrict__ {local} = {local}_storage.get();")

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
        if name in self.local_buffers:
            pointer, dtype = self.local_buffers[name], compute_dtype(dtype)
            index = self._local_index()
        else:
            pointer = self.args.input(name)
            index = self._index(index)
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
        idx = self._vector_index(index)
        mask_text = self._as_vec(mask) if mask is not None else "tf::Vec<bool>(true)"
        if half:
            return self._emit(f"tf::vgather_{half}<TAIL>({pointer}, {idx}, {mask_text}, count)", dtype, True)
        return self._emit(f"tf::vgather_masked<TAIL>({pointer}, {idx}, {mask_text}, count)", dtype, True)

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
        offset = f"(x{k - 1} - x{k - 1}_tile) * {TILE_COLS} + (x{k} - x{k}_tile)"
        return self._emit(f"tf::vload<TAIL>({name} + {offset}, count)", dtype, True)

    def _emit_tile_fills(self, out):
        k = len(self.x_sizes) - 1
        outer = sympy.Symbol(f"x{k - 1}", integer=True, nonnegative=True)
        inner = sympy.Symbol(f"x{k}", integer=True, nonnegative=True)
        row, col = sympy.Symbol("tr", integer=True), sympy.Symbol("tc", integer=True)
        for name, pointer, index, dtype in self.tiles.values():
            out.writeline(f"alignas(64) {ctype(dtype)} {name}[{TILE_ROWS * TILE_COLS}];")
            corner = index.xreplace({outer: sympy.Symbol(f"x{k - 1}_tile", integer=True),
                                     inner: sympy.Symbol(f"x{k}_tile", integer=True)})
            if dtype not in HALF_TYPES:
                out.writeline(f"tf::transpose_to_tile<{TILE_COLS}>({pointer} + {cexpr(corner)}, "
                              f"{_stride(index, inner)}, {name}, x{k - 1}_end - x{k - 1}_tile, x{k}_end - x{k}_tile);")
                continue
            source = index.xreplace({outer: sympy.Symbol(f"x{k - 1}_tile", integer=True) + row,
                                     inner: sympy.Symbol(f"x{k}_tile", integer=True) + col})
            value = f"tf::{HALF_TYPES[dtype]}_to_float({pointer}[{cexpr(source)}])"
            out.writeline(f"for (int64_t tc = 0; tc < x{k}_end - x{k}_tile; ++tc)")
            out.writeline(f"    for (int64_t tr = 0; tr < x{k - 1}_end - x{k - 1}_tile; ++tr)")
            out.writeline(f"        {name}[tr * {TILE_COLS} + tc] = {value};")

    def _local_index(self) -> sympy.Expr:
        """Flat index of the current r position inside one row."""
        flat = sympy.Integer(0)
        for i, stride in enumerate(sym.contiguous_strides([sympy.Integer(s) for s in self.r_sizes])):
            flat = flat + sympy.Symbol(f"r{i}", integer=True, nonnegative=True) * stride
        return flat

    def store(self, name, index, value):
        self.stored[name] = (value, self.segment_index, self.in_r_loop)
        if name in self.local_buffers:
            self._store_to(self.local_buffers[name], self._local_index(), value,
                           compute_dtype(self.graph.name_to_buffer[name].get_dtype()))
            return
        if name in self.internal:
            return
        dtype = self.graph.name_to_buffer[name].get_dtype()
        self._store_to(self.args.output(name), self._index(index), value, dtype)

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
        size = sym.to_int(size)
        wrapped = self._emit(f"tf::where({value} < {ctype(value.dtype)}(0), {value} + {ctype(value.dtype)}({size}), "
                             f"{value})", value.dtype, value.vec)
        if wrapped.dtype != torch.int64:
            wrapped = self.to_dtype(wrapped, torch.int64)
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
            template = cpp_op(name, operands[0].dtype)
            vec = any(o.vec for o in operands)
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

    # ---- ops: reductions --------------------------------------------------------------
    def reduction(self, dtype, src_dtype, reduction_type, value):
        if reduction_type.startswith("welford"):
            return self._welford(value, compute_dtype(src_dtype))[0 if reduction_type == "welford_mean" else 1]
        key = f"reduction:{reduction_type}:{value}"
        if key in self.cse.cache:
            return self.cse.cache[key]
        acc_dtype = compute_dtype(src_dtype)
        t = ctype(acc_dtype)
        identity = cpp_constant(reduction_identity(reduction_type, acc_dtype), acc_dtype)
        acc = f"acc{self.acc_counter}"
        self.acc_counter += 1
        vec = value.vec
        lane_wise = self.axis == "x"          # lanes are different rows: no horizontal reduce
        if getattr(self, "rows_outer", False):
            result = self._rows_outer_reduction_op(reduction_type, self._vec_if(value, True), acc, t, identity, dtype)
        elif reduction_type in ("argmax", "argmin"):
            result = self._arg_reduction(reduction_type, value, acc, t, lane_wise)
        elif reduction_type in ("max", "min") and vec and acc_dtype.is_floating_point:
            result = self._float_extremum(reduction_type, value, acc, t, identity, dtype, lane_wise)
        elif vec and not lane_wise:
            acc_type = "tf::Vec<bool>" if acc_dtype == torch.bool else f"tf::Vec<{t}>"
            self._declare_slots(acc_type, acc, identity)
            v = f"tf::tail_fill<TAIL>({value}, {identity}, count)"
            slot = self._slot(acc)
            self.code.writeline(f"{slot} = {_COMBINE[reduction_type].format(acc=slot, value=v)};")
            total = self._combine_slots(acc, lambda a, b: _COMBINE[reduction_type].format(acc=a, value=b))
            result = CppVar(f"{acc}_result", dtype, False)
            self.post.writeline(f"const {ctype(dtype) if dtype != torch.bool else 'bool'} {result} = "
                                f"tf::{_HORIZONTAL[reduction_type]}({total});")
        else:
            acc_type = ("tf::Vec<bool>" if acc_dtype == torch.bool else f"tf::Vec<{t}>") if vec else t
            self.pre.writeline(f"{acc_type} {acc}({identity});")
            self.code.writeline(f"{acc} = {_COMBINE[reduction_type].format(acc=acc, value=value)};")
            result = CppVar(acc, dtype, vec)
        self.finished_reductions[key] = result
        self.cse.cache[key] = result
        return result

    def _welford(self, value, dtype):
        """(mean, m2) of ``value`` over the reduced dims, one pass, shared by the
        welford_mean and welford_m2 nodes of a var_mean."""
        key = f"reduction:welford:{value}"
        if key in self.cse.cache:
            return self.cse.cache[key]
        t = ctype(dtype)
        acc = f"acc{self.acc_counter}"
        self.acc_counter += 1
        vector = self._vec_if(value, True)
        if self.axis == "x":   # lanes are rows
            self.pre.writeline(f"tf::Welford<tf::Vec<{t}>> {acc};")
            self.code.writeline(f"{acc} = tf::welford_update({acc}, {vector});")
            result = (CppVar(f"{acc}.mean", dtype, True), CppVar(f"{acc}.m2", dtype, True))
        else:
            self.pre.writeline(f"tf::WelfordAcc<{t}> {acc};")
            self.code.writeline(f"tf::welford_add<TAIL>({acc}, {vector}, count);")
            self.post.writeline(f"const auto {acc}_result = tf::welford_finish({acc});")
            result = (CppVar(f"{acc}_result.mean", dtype, False), CppVar(f"{acc}_result.m2", dtype, False))
        self.finished_reductions[key] = result
        self.cse.cache[key] = result
        return result

    def _declare_slots(self, acc_type, acc, identity):
        self.pre.writeline(" ".join(f"{acc_type} {acc}_{k}({identity});" for k in range(UNROLL)))

    @staticmethod
    def _slot(acc) -> str:
        """The accumulator of the current unroll slot (see tf::slot)."""
        if UNROLL == 1:
            return f"{acc}_0"
        return f"tf::slot<SLOT>({', '.join(f'{acc}_{k}' for k in range(UNROLL))})"

    def _combine_slots(self, acc, combine) -> str:
        total = f"{acc}_0"
        for k in range(1, UNROLL):
            total = combine(total, f"{acc}_{k}")
        return total

    def _float_extremum(self, reduction_type, value, acc, t, identity, dtype, lane_wise):
        """max/min over vectors: a one-instruction combine plus a separate NaN flag."""
        nan = cpp_constant(float("nan"), dtype)
        extremum = f"tf::{reduction_type}_ignoring_nan"
        if lane_wise:
            self.pre.writeline(f"tf::Vec<{t}> {acc}({identity});")
            self.pre.writeline(f"tf::Vec<bool> {acc}_nan(false);")
            self.code.writeline(f"{acc} = {extremum}({acc}, {value});")
            self.code.writeline(f"{acc}_nan = {acc}_nan | tf::isnan({value});")
            result = CppVar(f"{acc}_result", dtype, True)
            self.post.writeline(f"const auto {result} = tf::where({acc}_nan, tf::Vec<{t}>({nan}), {acc});")
            return result
        self._declare_slots(f"tf::Vec<{t}>", acc, identity)
        self._declare_slots("tf::Vec<bool>", f"{acc}_nan", "false")
        v = f"tf::tail_fill<TAIL>({value}, {identity}, count)"
        slot, nan_slot = self._slot(acc), self._slot(f"{acc}_nan")
        self.code.writeline(f"{slot} = {extremum}({slot}, {v});")
        self.code.writeline(f"{nan_slot} = {nan_slot} | tf::isnan({v});")
        values = self._combine_slots(acc, lambda a, b: f"{extremum}({a}, {b})")
        nans = self._combine_slots(f"{acc}_nan", lambda a, b: f"({a} | {b})")
        result = CppVar(f"{acc}_result", dtype, False)
        self.post.writeline(f"const {t} {result} = tf::reduce_any({nans}) ? {nan} : "
                            f"tf::reduce_{reduction_type}({values});")
        return result

    def _arg_reduction(self, reduction_type, value, acc, t, lane_wise):
        flat_r = cexpr(self._local_index())
        vec = value.vec
        if vec and not lane_wise:
            self.pre.writeline(" ".join(f"tf::ArgAcc<tf::Vec<{t}>> {acc}_{k};" for k in range(UNROLL)))
            self._ensure_lanes(self.vector_var)
            index = f"tf::Vec<int64_t>({flat_r} - r{len(self.r_sizes) - 1}) + r{len(self.r_sizes) - 1}_lanes"
            slot = self._slot(acc)
            self.code.writeline(f"if constexpr (TAIL) {slot} = tf::{reduction_type}_update_partial("
                                f"{slot}, {value}, {index}, count);")
            self.code.writeline(f"else {slot} = tf::{reduction_type}_update({slot}, {value}, {index});")
            lanes = [f"tf::{reduction_type}_reduce_lanes({acc}_{k})" for k in range(UNROLL)]
            total = lanes[0]
            for lane in lanes[1:]:
                total = f"tf::{reduction_type}_combine({total}, {lane})"
            result = CppVar(f"{acc}_result", torch.int64, False)
            self.post.writeline(f"const int64_t {result} = {total}.index;")
            return result
        if vec:
            self.pre.writeline(f"tf::ArgAcc<tf::Vec<{t}>> {acc};")
            self.code.writeline(f"{acc} = tf::{reduction_type}_update({acc}, {value}, tf::Vec<int64_t>({flat_r}));")
            return CppVar(f"{acc}.index", torch.int64, True)
        self.pre.writeline(f"tf::ArgAcc<{t}> {acc};")
        self.code.writeline(f"{acc} = tf::{reduction_type}_update({acc}, {value}, int64_t({flat_r}));")
        return CppVar(f"{acc}.index", torch.int64, False)


def _stride(index, var):
    """d index / d var when index is affine in var, else None."""
    if var not in index.free_symbols:
        return 0
    derivative = sympy.diff(index, var)
    if derivative.free_symbols or any(isinstance(a, sympy.Function) for a in sympy.preorder_traversal(index)
                                      if var in getattr(a, "free_symbols", set()) and isinstance(a, sympy.Function)):
        return None
    return int(derivative)


def _lanes_guess():
    return 16


def _cast_python(value, dtype):
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    return int(value)


_COMBINE = {
    "sum": "{acc} + {value}",
    "prod": "{acc} * {value}",
    "max": "tf::maximum({acc}, {value})",
    "min": "tf::minimum({acc}, {value})",
    "any": "{acc} | {value}",
    "all": "{acc} & {value}",
}

_LANE_COMBINE = {
    "sum": "({a} + {b})",
    "prod": "({a} * {b})",
    "max": "tf::maximum({a}, {b})",
    "min": "tf::minimum({a}, {b})",
    "any": "({a} | {b})",
    "all": "({a} & {b})",
}

_HORIZONTAL = {"sum": "reduce_add", "prod": "reduce_mul", "max": "reduce_max", "min": "reduce_min",
               "any": "reduce_any", "all": "reduce_all"}

"""Loop nests of the C++ backend: the parallel row loop, vector loops with their tails,
tiles for transposed reads and full reductions split among threads (outer reductions:
outer_reduction.py). A mixin of CppKernel."""
import functools
import math

import sympy

from tritonfuse import sym
from tritonfuse.codegen.common import IndentedBuffer
from tritonfuse.dependencies import plan_and_deps, refine_dep

from . import common
from .cache_sets import rows_share_one_set
from .common import HALF_TYPES, SIZE_PARAMS, STORAGE_TYPES, TILE_COLS, TILE_ROWS, _stride, cexpr, ctype

SPLITTABLE = ("sum", "prod", "max", "min", "any", "all")   # reductions whose partials combine exactly
OUT_TILE_STEPS = 16   # r steps of a vector-x loop staged before a transposed write (16 x 16 in registers)


class CppLoopNest:
    def _emit_vector_x_chunk(self, out):
        """Pointwise kernels and outer reductions: everything inside one vector chunk of x."""
        inner = IndentedBuffer()
        self.code = inner
        self.vec_mode = True
        for seg in self.segments:
            self.segment_index = seg.index
            if seg.is_loop:
                self._emit_plain_r_loops(inner, seg, stores_through_tiles=True)
            else:
                for layout in seg.layouts:
                    self._run_node(*layout)
        self.vec_mode = False
        if self.tiled:
            self._emit_tiles(out, inner)
        elif not (self._lane_pairs_eligible() and self._emit_lane_pair_loop(out, inner)):
            self._emit_vector_loops(out, [], [], inner, vector_dim=("x", len(self.x_sizes) - 1, self.x_sizes[-1]))

    def _emit_plain_r_loops(self, out, seg, stores_through_tiles=False):
        """One loop segment as plain loops over the reduced dims, one step per element (per
        vector of rows in vector-x code), set-up before and finishing code after.

        ``stores_through_tiles`` (vector-x code): a store contiguous along the innermost
        reduced dim but strided across the lanes (softmax of a transposed input) goes to a
        tile of OUT_TILE_STEPS steps x kVecLanes lanes, written out transposed after each
        block of steps (contiguous runs, no per-lane scatter)."""
        self.pre, self.post = IndentedBuffer(), IndentedBuffer()
        loop_body = IndentedBuffer()
        self.out_tiles = {} if stores_through_tiles else None
        try:
            self._run_loop_segment(seg, loop_body)
            out_tiles, self.out_tiles = self.out_tiles or {}, None
        finally:
            self.out_tiles = None
        self.code = out
        out.splice(self.pre)
        last = len(self.r_sizes) - 1
        for i, size in enumerate(self.r_sizes):
            if i == last and out_tiles:
                self._open_out_tile_block(out, cexpr(size), out_tiles)
            out.writeline(f"for (int64_t r{i} = {f'r{i}_block' if i == last and out_tiles else 0}; "
                          f"r{i} < {f'r{i}_end' if i == last and out_tiles else cexpr(size)}; ++r{i}) {{")
            out._indent += 1
        out.splice(loop_body)
        self._close_blocks(out, 1)
        if out_tiles:
            self._close_out_tile_block(out, out_tiles)
        self._close_blocks(out, last)
        out.splice(self.post)

    def _open_out_tile_block(self, out, size, out_tiles):
        r = f"r{len(self.r_sizes) - 1}"
        out.writeline(f"for (int64_t {r}_block = 0; {r}_block < {size}; {r}_block += {OUT_TILE_STEPS}) {{")
        out._indent += 1
        out.writeline(f"const int64_t {r}_end = std::min<int64_t>({r}_block + {OUT_TILE_STEPS}, {size});")
        for tile, _, _ in out_tiles.values():
            out.writeline(f"alignas(64) float {tile}[{OUT_TILE_STEPS} * tf::kVecLanes];")

    def _close_out_tile_block(self, out, out_tiles):
        r = sympy.Symbol(f"r{len(self.r_sizes) - 1}", integer=True, nonnegative=True)
        block = sympy.Symbol(f"{r}_block", integer=True)
        for pointer, (tile, index, dtype) in out_tiles.items():
            writer = f"store_tile_transposed_{HALF_TYPES[dtype]}" if dtype in HALF_TYPES else "store_tile_transposed"
            out.writeline(f"tf::{writer}({pointer} + {cexpr(index.xreplace({r: block}))}, "
                          f"{_stride(index, self.vector_var)}, {tile}, int({r}_end - {r}_block), count);")
        self._close_blocks(out, 1)

    @staticmethod
    def _close_blocks(code, count):
        """End ``count`` nested blocks (loops, parallel regions) opened with ``{``."""
        for _ in range(count):
            code._indent -= 1
            code.writeline("}")

    def _needs_tiling(self, layouts) -> bool:
        """A pointwise kernel that reads some input transposed (contiguous along the
        second-innermost dim): walk TILE x TILE blocks so the gathered lines get reused."""
        if self.is_reduction or len(self.x_sizes) < 2:
            return False
        inner = sympy.Symbol(f"x{len(self.x_sizes) - 1}", integer=True, nonnegative=True)
        outer = sympy.Symbol(f"x{len(self.x_sizes) - 2}", integer=True, nonnegative=True)
        for node, xs, rs, _ in layouts:
            reads = self.node_reads(node, xs, rs)
            if any(_stride(dep.index, inner) not in (0, 1) and _stride(dep.index, outer) == 1 for dep in reads):
                return True
        return False

    @property
    def tile_rows(self) -> int:
        """Rows of a tile: the rows are the contiguous dim of the transposed reads, and one
        tile row of each read should fill a 64-byte cache line, which a later tile would
        otherwise fetch again: 32 rows for 16-bit types (as Inductor), else TILE_ROWS."""
        if any(STORAGE_TYPES[dtype] == "uint16_t" for *_, dtype in self.tiles.values()):
            return 2 * TILE_ROWS
        return TILE_ROWS

    @property
    def tile_cols(self) -> int:
        """Columns of a tile: TILE_COLS; but 32 rows x 32 columns where every row of a
        row-major buffer falls in one L1 set (cache_sets.py): a tile then uses whole 64-byte
        lines of those buffers too, which a 16-column tile would leave for the next tile,
        after the set has evicted them (x.t() + y, 2048x512 bf16: 216 -> 98 us; Inductor 88-105)."""
        if self.tile_rows > TILE_ROWS and rows_share_one_set(self._row_major_strides):
            return 2 * TILE_COLS
        return TILE_COLS

    @functools.cached_property
    def _row_major_strides(self) -> list[int]:
        """Row strides in bytes of the buffers this tiled kernel reads or writes along its
        rows (contiguous along the innermost dim): one entry per buffer whose stride is a
        number."""
        k = len(self.x_sizes) - 1
        inner = sympy.Symbol(f"x{k}", integer=True, nonnegative=True)
        outer = sympy.Symbol(f"x{k - 1}", integer=True, nonnegative=True)
        deps = {}
        for seg in self.segments:
            for node, xs, rs, _ in seg.layouts:
                _, reads, write = plan_and_deps(node.buffer, xs, rs)
                for dep in reads + [write]:
                    if dep.name not in self.internal:
                        deps.setdefault(dep.name, refine_dep(dep, self.x_sizes))
        strides = []
        for name, dep in deps.items():
            step = _stride(dep.index, outer)
            if _stride(dep.index, inner) == 1 and step is not None and sym.is_static(step):
                itemsize = self.graph.name_to_buffer[name].get_dtype().itemsize
                strides.append(sym.to_int(step) * itemsize)
        return strides

    def _emit_tiles(self, out, inner):
        """tile_rows x tile_cols blocks of the two innermost dims. A full block (every block
        when the sizes divide) runs with compile-time extents and no tail code, which
        measured ~1.5x faster than the general form; edge blocks take the general form."""
        k = len(self.x_sizes) - 1
        rows, cols = self.x_sizes[k - 1], self.x_sizes[k]
        whole = sym.is_static(rows) and sym.is_static(cols) and \
            sym.to_int(rows) % self.tile_rows == 0 and sym.to_int(cols) % self.tile_cols == 0
        rows, cols = cexpr(rows), cexpr(cols)
        out.writeline(f"for (int64_t x{k - 1}_tile = 0; x{k - 1}_tile < {rows}; x{k - 1}_tile += {self.tile_rows}) {{")
        out.writeline(f"for (int64_t x{k}_tile = 0; x{k}_tile < {cols}; x{k}_tile += {self.tile_cols}) {{")
        with out.indent():
            out.writeline(f"constexpr int64_t kTileCols = {self.tile_cols};   // a tile row's stride")
            if whole:
                self._emit_tile(out, inner, full=True)
            else:
                out.writeline(f"const int64_t x{k - 1}_end = std::min<int64_t>(x{k - 1}_tile + {self.tile_rows}, {rows});")
                out.writeline(f"const int64_t x{k}_end = std::min<int64_t>(x{k}_tile + {self.tile_cols}, {cols});")
                out.writeline(f"if (x{k - 1}_end - x{k - 1}_tile == {self.tile_rows} && x{k}_end - x{k}_tile == {self.tile_cols}) {{")
                with out.indent():
                    self._emit_tile(out, inner, full=True)
                out.writeline("} else {")
                with out.indent():
                    self._emit_tile(out, inner, full=False)
                out.writeline("}")
        out.writeline("}")
        out.writeline("}")

    def _emit_tile(self, out, inner, full: bool):
        """One block: its tile fills, then its rows in vector chunks. ``full``: the block's
        extents are tile_rows x tile_cols (constants); else they end at x{k-1}_end/x{k}_end."""
        k = len(self.x_sizes) - 1
        row_end = f"x{k - 1}_tile + {self.tile_rows}" if full else f"x{k - 1}_end"
        col_end = f"x{k}_tile + {self.tile_cols}" if full else f"x{k}_end"
        self._emit_tile_fills(out, str(self.tile_rows) if full else f"x{k - 1}_end - x{k - 1}_tile",
                              str(self.tile_cols) if full else f"x{k}_end - x{k}_tile")
        out.writeline(f"for (int64_t x{k - 1} = x{k - 1}_tile; x{k - 1} < {row_end}; ++x{k - 1}) {{")
        out.writeline(f"for (int64_t x{k} = x{k}_tile; x{k} < {col_end}; x{k} += tf::kVecLanes) {{")
        with out.indent():
            self._emit_chunk(out, inner, None if full else
                             f"x{k}_end - x{k} < tf::kVecLanes ? int(x{k}_end - x{k}) : tf::kVecLanes")
        out.writeline("}")
        out.writeline("}")

    def _emit_unrolled_r_loops(self, out, inner, split_among_threads=False):
        """The reduced dims; the innermost in vector chunks, common.UNROLL chunks per step, each
        with its own accumulator slot so loop-carried chains run in parallel. With
        ``split_among_threads`` (inside a parallel region) each thread takes a share: the
        outermost reduced dim through ``omp for``, or whole vectors of a single one."""
        names = [f"r{i}" for i in range(len(self.r_sizes))]
        out.writeline("{")
        out._indent += 1
        if split_among_threads and len(names) > 1:
            out.writeline("#pragma omp for schedule(static)")
        for name, size in zip(names[:-1], self.r_sizes[:-1]):
            out.writeline(f"for (int64_t {name} = 0; {name} < {cexpr(size)}; ++{name}) {{")
            out._indent += 1
        var, size_expr = names[-1], self.r_sizes[-1]
        size = cexpr(size_expr)
        out.writeline(f"auto body = [&](int64_t {var}, int count, auto tail, auto slot) TF_INLINE_LAMBDA {{")
        with out.indent():
            out.writeline("constexpr bool TAIL = decltype(tail)::value;")
            out.writeline("constexpr int SLOT = decltype(slot)::value;")
            out.writeline("(void)TAIL; (void)SLOT; (void)count;")
            out.splice(inner)
        out.writeline("};")
        end = size
        if split_among_threads and len(names) == 1:
            out.writeline(f"const int64_t {var}_share = ({size} / tf::kVecLanes + team - 1) / team "
                          f"* tf::kVecLanes;")
            out.writeline(f"int64_t {var}_start = std::min<int64_t>(tid * {var}_share, {size});")
            # the last thread also takes the partial vector at the end
            out.writeline(f"const int64_t {var}_end = tid == team - 1 ? {size} : "
                          f"std::min<int64_t>({var}_start + {var}_share, {size});")
            end = f"{var}_end"
        else:
            out.writeline(f"int64_t {var}_start = 0;")
        if common.UNROLL > 1 and sym.hint(size_expr) >= common.UNROLL * 4:
            step = f"{common.UNROLL} * tf::kVecLanes"
            out.writeline(f"for (; {var}_start + {step} <= {end}; {var}_start += {step}) {{")
            with out.indent():
                for k in range(common.UNROLL):
                    offset = f" + {k} * tf::kVecLanes" if k else ""
                    out.writeline(f"body({var}_start{offset}, tf::kVecLanes, std::false_type{{}}, "
                                  f"std::integral_constant<int, {k}>{{}});")
            out.writeline("}")
        # full vectors, then at most one partial vector: no per-iteration tail test
        out.writeline(f"for (; {var}_start + tf::kVecLanes <= {end}; {var}_start += tf::kVecLanes) {{")
        with out.indent():
            out.writeline(f"body({var}_start, tf::kVecLanes, std::false_type{{}}, std::integral_constant<int, 0>{{}});")
        out.writeline("}")
        if not sym.is_static(size_expr) or sym.to_int(size_expr) % 16:   # kVecLanes divides 16
            out.writeline(f"if ({var}_start < {end}) body({var}_start, int({end} - {var}_start), std::true_type{{}}, "
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
        prefix, index, size_expr = vector_dim
        var = f"{prefix}{index}"
        size = cexpr(size_expr)
        for name, s in zip(names, sizes):
            out.writeline(f"for (int64_t {name} = 0; {name} < {cexpr(s)}; ++{name}) {{")
            out._indent += 1
        out.writeline(f"for (int64_t {var} = 0; {var} < {size}; {var} += tf::kVecLanes) {{")
        with out.indent():
            # kVecLanes divides 16: never a tail
            full = sym.is_static(size_expr) and sym.to_int(size_expr) % 16 == 0 and sym.to_int(size_expr) >= 64
            self._emit_chunk(out, inner, "tf::kVecLanes" if full else
                             f"{size} - {var} < tf::kVecLanes ? int({size} - {var}) : tf::kVecLanes")
        out.writeline("}")
        for _ in names:
            out._indent -= 1
            out.writeline("}")

    # ---- full reductions (one output row): the reduced elements split among threads ----
    def _split_full_reduction(self) -> bool:
        if self.axis != "r" or self.x_sizes or not self.is_reduction or self.local_buffers:
            return False
        work = sym.hint(self.group.x_numel * self.group.r_numel)
        if self.num_threads <= 1 or work < common.PARALLEL_THRESHOLD or not sym.is_static(self.group.r_numel):
            return False
        first, rest = self.segments[0], self.segments[1:]
        if not first.is_loop or any(seg.is_loop for seg in rest):
            return False
        return all(kind == "reduction" and node.buffer.data.reduction_type in SPLITTABLE
                   for node, _, _, kind in first.layouts)

    def _generate_split_full_reduction(self) -> str:
        """Each thread reduces its share into partial results; they are combined in thread
        order after the parallel region (deterministic), then the epilogue runs once."""
        self.split_results, self.split_stores = [], IndentedBuffer()
        pre, post, inner, after = IndentedBuffer(), IndentedBuffer(), IndentedBuffer(), IndentedBuffer()
        self.pre, self.post, self.vec_mode = pre, post, True
        self._run_loop_segment(self.segments[0], inner)
        self.vec_mode = False
        for seg in self.segments[1:]:
            self.segment_index, self.code = seg.index, after
            for layout in seg.layouts:
                self._run_node(*layout)
        threads = self.num_threads
        code = IndentedBuffer()
        code.writeline(f'extern "C" void {self.name}({self._params()}) {{')
        with code.indent():
            code.writeline(f"constexpr int nthreads = {threads};")
            code.writeline("int nteam = 1;   // the threads OpenMP gives (OMP_THREAD_LIMIT, OMP_DYNAMIC: maybe fewer)")
            for result, t, _ in self.split_results:
                code.writeline(f"{t} {result}_partial[nthreads];")
            code.writeline("#pragma omp parallel num_threads(nthreads)")
            code.writeline("{")
            with code.indent():
                code.writeline("const int tid = omp_get_thread_num(), team = omp_get_num_threads();")
                code.writeline("if (tid == 0) nteam = team;")
                code.splice(pre)
                self._emit_unrolled_r_loops(code, inner, split_among_threads=True)
                code.splice(post)
                for result, _, _ in self.split_results:
                    code.writeline(f"{result}_partial[tid] = {result};")
            code.writeline("}")
            for result, t, combine in self.split_results:
                code.writeline(f"{t} {result} = {result}_partial[0];")
                code.writeline(f"for (int t = 1; t < nteam; ++t) {result} = "
                               f"{combine.format(a=result, b=f'{result}_partial[t]')};")
            code.splice(self.split_stores)
            code.splice(after)
        code.writeline("}")
        return code.getvalue()

    @staticmethod
    def _emit_chunk(out, inner, count):
        """One vector chunk: ``inner`` as a lambda instantiated for a full vector and for
        the tail, chosen by ``count`` (a C expression); only the full-vector form when
        ``count`` is None (the chunk is known to be whole)."""
        out.writeline(f"const int count = {count or 'tf::kVecLanes'};")
        out.writeline("auto body = [&](auto tail) TF_INLINE_LAMBDA {")
        with out.indent():
            out.writeline("constexpr bool TAIL = decltype(tail)::value;")
            out.writeline("(void)TAIL;")
            out.splice(inner)
        out.writeline("};")
        if count is None:
            out.writeline("body(std::false_type{});")
        else:
            out.writeline("if (count == tf::kVecLanes) body(std::false_type{}); else body(std::true_type{});")

    def _params(self) -> str:
        params = []
        for param, buffer in self.args.call_order():
            dtype = self.graph.name_to_buffer[buffer].get_dtype()
            const = "const " if param.startswith("in_ptr") else ""
            params.append(f"{const}{STORAGE_TYPES[dtype]}* __restrict__ {param}")
        return ", ".join(params) + SIZE_PARAMS

    def _function(self, body: IndentedBuffer) -> str:
        code = IndentedBuffer()
        code.writeline(f'extern "C" void {self.name}({self._params()}) {{')
        with code.indent():
            outer_names = [f"x{i}" for i in range(len(self.x_sizes))]
            outer_sizes = list(self.x_sizes)
            hints = [sym.hint(s) for s in self.x_sizes]
            outer_hint = math.prod(hints[:-2 if self.tiled else -1 if self.axis == "x" else len(hints)])
            if self.tiled:
                outer_names, outer_sizes = outer_names[:-2], outer_sizes[:-2]
                outer_count = outer_hint * -(-hints[-2] // self.tile_rows) * -(-hints[-1] // self.tile_cols)
            elif self.axis == "x":
                outer_names, outer_sizes = outer_names[:-1], outer_sizes[:-1]
                outer_count = outer_hint * -(-hints[-1] // 16)
            else:
                outer_count = outer_hint
            work = self.group.x_numel * self.group.r_numel
            loops = len(outer_names) + (2 if self.tiled else 1 if self.axis == "x" else 0)
            # every x dim is a loop the threads share: one of symbolic size may be long at run time
            many_rows = outer_count > 1 or any(not sym.is_static(s) for s in self.x_sizes)
            parallel = loops > 0 and many_rows and common.worth_threads(self.num_threads, work)
            condition = common.parallel_condition(work)
            if parallel:
                code.writeline(f"#pragma omp parallel num_threads({self.num_threads}){condition}")
                code.writeline("{")
                code._indent += 1
            declarations = IndentedBuffer()
            self._declare_local_buffers(declarations)
            self._declare_read_caches(declarations)
            code.splice(declarations)
            self._declare_lane_group_buffers(code, declarations.getvalue())
            if parallel and loops:
                collapse = f" collapse({loops})" if loops > 1 else ""
                code.writeline(f"#pragma omp for{collapse} schedule(static)")
            for name, size in zip(outer_names, outer_sizes):
                code.writeline(f"for (int64_t {name} = 0; {name} < {cexpr(size)}; ++{name}) {{")
                code._indent += 1
            code.splice(body)
            self._close_blocks(code, len(outer_names) + bool(parallel))
        code.writeline("}")
        return code.getvalue()

    def _declare_local_buffers(self, code):
        row = cexpr(sym.product(self.r_sizes))
        rows, what = (f"{row} * tf::kVecLanes", "a row per vector lane") if self.axis == "x" else (row, "one row")
        for name, local in self.local_buffers.items():
            t = ctype(self.graph.name_to_buffer[name].get_dtype())
            code.writeline(f"tf::LocalBuffer<{t}> {local}_storage({rows});  // {what} of {name}, per thread")
            code.writeline(f"{t}* __restrict__ {local} = {local}_storage.get();")

    def _emit_tile_fills(self, out, row_count: str, col_count: str):
        k = len(self.x_sizes) - 1
        outer = sympy.Symbol(f"x{k - 1}", integer=True, nonnegative=True)
        inner = sympy.Symbol(f"x{k}", integer=True, nonnegative=True)
        for name, pointer, index, dtype in self.tiles.values():
            out.writeline(f"alignas(64) {ctype(dtype)} {name}[{self.tile_rows * self.tile_cols}];")
            corner = index.xreplace({outer: sympy.Symbol(f"x{k - 1}_tile", integer=True),
                                     inner: sympy.Symbol(f"x{k}_tile", integer=True)})
            copy = f"transpose_{HALF_TYPES[dtype]}_to_tile" if dtype in HALF_TYPES else "transpose_to_tile"
            out.writeline(f"tf::{copy}<{self.tile_cols}>({pointer} + {cexpr(corner)}, "
                          f"{_stride(index, inner)}, {name}, {row_count}, {col_count});")

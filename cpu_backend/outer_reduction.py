"""Outer reductions of the C++ backend: reductions over dims that sit outside the
contiguous row dim in memory (``x.sum(0)``, ``x.sum(1)`` of a 3-d ``x``). The vector
lanes run along the contiguous row dim, each lane accumulating its own output, in one of
two forms. A mixin of CppKernel.

Row blocks (when the rows offer enough independent work for the threads):

    #pragma omp for collapse(..)
    for x0 .. (outer row dims), for each block of B columns of the last row dim:
        acc_row[B] = identity                  thread-local, stays in L1
        for r ..: for x_last in block: acc_row[x_last - block] op= value
        for x_last in block: epilogue(acc_row[..]) -> stores

Partial rows (few outputs, a long reduction: ``x.sum(0)`` of a (100000, 16) tensor):

    #pragma omp for
    for r ..: for x ..: acc_row[tid][x] op= value     one row of all outputs per thread
    then, after the region: combine the threads' rows in order, epilogue -> stores

Row blocks need no combine step and keep their accumulators in L1; partial rows split
the reduction itself among the threads.
"""
import math

import sympy

from tritonfuse import sym
from tritonfuse.codegen.common import IndentedBuffer

from . import common
from .common import CppVar, cexpr

# Widest block of a row-block accumulator (elements): 16 KB of float, within L1 with the
# streamed input; and all of a thread's accumulator rows (they live on its stack) together
# at most MAX_ROWS_BYTES.
MAX_BLOCK = 4096
MAX_ROWS_BYTES = 64 * 1024
BLOCK_ALIGN = 16    # blocks are whole vectors of any ISA (kVecLanes divides 16)
# Register strips: row blocks of at most STRIP columns, whose chunk loop has a constant
# trip count and is unrolled, so the compiler keeps each chunk's accumulator in a vector
# register over all the reduced rows (8 AVX-512 / 16 AVX2 float registers per reduction)
# instead of loading and storing it in L1 for every row. Below MIN_STRIP columns a strip
# has too few independent accumulators to hide the add latency, and partial rows split
# the reduction instead. x.sum(0), f32, 2 threads, kernel alone (AMD EPYC, AVX-512):
# 513 x 1531: 33.5 us as partial rows, 26 us as strips (eager 28); 2048 x 512: 27 us
# (eager 46-49); a 64-column block with its accumulator in L1: 53 us.
# Strips read a strided part of every row; beyond the caches the contiguous streams of
# partial rows win: sigmoid((x + y).sum(0)), f32, 1000 x 3072: 348 us as strips, 227 us as
# partial rows; 777 x 3001: 230 / 180 us. Strips serve reductions over at most
# STRIP_MAX_BYTES of (4-byte) elements.
STRIP = 128
MIN_STRIP = 64
STRIP_MAX_BYTES = 8 * 1024 * 1024


class CppOuterReductions:
    def _rows_outer_reduction(self) -> bool:
        """An outer reduction whose loop holds only sum/prod/max/min/any/all nodes."""
        if self.axis != "x" or not self.is_reduction or not self.segments[0].is_loop:
            return False
        if not all(sym.is_static(s) for s in self.x_sizes):   # accumulator rows are sized statically
            return False
        if len(self.segments) > 2 or any(s.is_loop for s in self.segments[1:]):
            return False
        for node, _, _, kind in self.segments[0].layouts:
            if kind != "reduction" or node.buffer.data.reduction_type in ("argmax", "argmin"):
                return False
        return True

    def _row_block_width(self, threads: int, widest=None):
        """Columns per block of the last row dim (at most ``widest``), or None when the
        blocks cannot keep ``threads`` threads busy (then partial rows split the reduction
        instead)."""
        sizes = [sym.to_int(s) for s in self.x_sizes]
        outer, last = math.prod(sizes[:-1]), sizes[-1]
        if widest is None:
            accumulators = len(self.segments[0].layouts)   # one per reduction node, <= 8 bytes each
            widest = MAX_ROWS_BYTES // (8 * accumulators)
        widest = max(BLOCK_ALIGN, min(MAX_BLOCK, widest) // BLOCK_ALIGN * BLOCK_ALIGN)
        most_blocks = max(1, -(-last // BLOCK_ALIGN))
        blocks = min(most_blocks, max(1, -(-last // widest)))
        # enough blocks for every thread, and no thread with a block more than the others
        while blocks < most_blocks and (outer * blocks < threads or (outer * blocks) % threads
                                        and outer * blocks < 4 * threads):
            blocks += 1
        if outer * blocks < threads:
            return None
        width = -(-last // blocks)
        return min(last, -(-width // BLOCK_ALIGN) * BLOCK_ALIGN)

    def _rows_split_among_threads(self, threads: int) -> bool:
        """Partial rows rather than row blocks where the blocks would cut one row among the
        threads (``x.sum(0)``), beyond the caches or into strips too narrow for register
        accumulation: each thread then streams a contiguous share of the rows instead of a
        strided part of every row. x.sum(0), 2048 x 512 f32, 2 threads, kernel alone: row
        blocks of 256 columns 69 us, partial rows 51 us (eager 55 us; strips 27 us)."""
        sizes = [sym.to_int(s) for s in self.x_sizes]
        accumulators = len(self.segments[0].layouts)
        return threads > 1 and math.prod(sizes[:-1]) < threads and sizes[-1] * 8 * accumulators <= MAX_ROWS_BYTES

    def _generate_rows_outer_reduction(self) -> str:
        work = sym.hint(self.group.x_numel * self.group.r_numel)
        threads = self.num_threads if (self.num_threads > 1 and work >= common.PARALLEL_THRESHOLD) else 1
        split = self._rows_split_among_threads(threads)
        if 4 * work <= STRIP_MAX_BYTES:
            width = self._row_block_width(threads, widest=STRIP)
            if width is not None and width < MIN_STRIP and split:
                width = None
        else:
            width = None if split else self._row_block_width(threads)
        self.block_width = width
        self.partials = []                  # (accumulator name, C type, identity, combine)
        self.welford_rows = []              # (mean row, m2 row, C type): cascade_rows.py
        self.cascade_sums = []              # (float sum of partial rows, C type): cascade_rows.py
        loop_body, epilogue = IndentedBuffer(), IndentedBuffer()
        self.pre, self.post = IndentedBuffer(), epilogue
        self.code, self.vec_mode, self.in_r_loop = loop_body, True, True
        self.segment_index = 0
        in_loop = dict(self.cse.cache)     # values of the loop body stay in its scope
        self.finished_reductions = {}
        for layout in self.segments[0].layouts:
            self._run_node(*layout)
        self.in_r_loop = False
        self.cse.cache = dict(in_loop, **self.finished_reductions)
        self.finished_reductions = {}
        self.code = epilogue
        for seg in self.segments[1:]:
            self.segment_index = seg.index
            for layout in seg.layouts:
                self._run_node(*layout)
        self.vec_mode = False
        code = IndentedBuffer()
        code.writeline(f'extern "C" void {self.name}({self._params()}) {{')
        with code.indent():
            if self.block_width is not None:
                self._emit_row_blocks(code, loop_body, epilogue, threads)
            else:
                self._emit_partial_rows(code, loop_body, epilogue, threads)
        code.writeline("}")
        return code.getvalue()

    # ---- the two forms ------------------------------------------------------------------
    def _emit_row_blocks(self, code, loop_body, epilogue, threads):
        opened, whole = self._open_row_blocks(code, threads)
        k, width = len(self.x_sizes) - 1, self.block_width

        def block(strip):
            self._emit_r_loops(code, lambda: self._emit_block_chunks(code, loop_body, k, whole, strip))
            code.writeline("// the block's results: the row-wise epilogue")
            self._emit_block_chunks(code, epilogue, k, whole, strip)

        if width > STRIP or width % BLOCK_ALIGN:
            block(strip=False)
        elif whole:
            block(strip=True)
        else:   # the last block of a row may be short: the strip form for the others
            code.writeline(f"if (xb_end - xb == {width}) {{   // a whole strip: accumulators in registers")
            with code.indent():
                block(strip=True)
            code.writeline("} else {")
            with code.indent():
                block(strip=False)
            code.writeline("}")
        self._close_blocks(code, opened)

    def _open_row_blocks(self, code, threads, block_arrays=()):
        """The skeleton of a row-block kernel up to the body of one block: the parallel
        region (a plain scope on one thread) with each thread's accumulator rows and
        ``block_arrays`` ((C type, name, elements per row of the block)), the
        loops the threads share (outer row dims, blocks of the last), the accumulators
        reset. Returns (blocks to close, whether every block is whole vectors)."""
        width, last = self.block_width, sym.to_int(self.x_sizes[-1])
        whole = last % width == 0 and width % BLOCK_ALIGN == 0   # no block has a tail
        if threads > 1:
            code.writeline(f"#pragma omp parallel num_threads({threads})")
        code.writeline("{")
        code._indent += 1
        for acc, t, _, _ in self.partials:
            code.writeline(f"alignas(64) {t} {acc}_row[{width}];")
        self._cascade_block_arrays(code, width)
        for t, name, per_row in block_arrays:   # whole vectors: a tail chunk's tile spans kVecLanes rows
            code.writeline(f"alignas(64) {t} {name}[{-(-width // BLOCK_ALIGN) * BLOCK_ALIGN * per_row}];")
        split_rows = width < last   # blocks of a row: one more (collapsed) loop
        loops = len(self.x_sizes) - 1 + split_rows
        if threads > 1:
            collapse = f" collapse({loops})" if loops > 1 else ""
            code.writeline(f"#pragma omp for{collapse} schedule(static)")
        for i, size in enumerate(self.x_sizes[:-1]):
            code.writeline(f"for (int64_t x{i} = 0; x{i} < {size}; ++x{i}) {{")
            code._indent += 1
        if split_rows:
            code.writeline(f"for (int64_t xb = 0; xb < {last}; xb += {width}) {{")
            code._indent += 1
            end = f"xb + {width}" if whole else f"std::min<int64_t>(xb + {width}, {last})"
            code.writeline(f"const int64_t xb_end = {end};")
        else:
            code.writeline(f"const int64_t xb = 0, xb_end = {last};   // the whole row")
        for acc, _, identity, _ in self.partials:
            code.writeline(f"for (int64_t i = 0; i < {width}; ++i) {acc}_row[i] = {identity};")
        self._cascade_block_reset(code, width)
        return loops + 1, whole

    def _emit_r_loops(self, code, emit_body):
        """The loops over the reduced dims around what ``emit_body`` writes."""
        for i, size in enumerate(self.r_sizes):
            code.writeline(f"for (int64_t r{i} = 0; r{i} < {cexpr(size)}; ++r{i}) {{")
            code._indent += 1
        self._cascade_step(code, self.block_width)
        emit_body()
        self._close_blocks(code, len(self.r_sizes))
        self._cascade_fold(code, self.block_width)

    def _emit_block_chunks(self, code, inner, k, whole, strip=False):
        """The vector chunks of one block; ``strip``: a block known to be STRIP-sized
        whole vectors, as a loop of constant trip count that the compiler unrolls."""
        if strip:
            code.writeline("#pragma GCC unroll 16")
            code.writeline(f"for (int64_t x{k} = xb; x{k} < xb + {self.block_width}; x{k} += tf::kVecLanes) {{")
            with code.indent():
                self._emit_chunk(code, inner, None)
            code.writeline("}")
            return
        code.writeline(f"for (int64_t x{k} = xb; x{k} < xb_end; x{k} += tf::kVecLanes) {{")
        with code.indent():
            self._emit_chunk(code, inner, None if whole else
                             f"xb_end - x{k} < tf::kVecLanes ? int(xb_end - x{k}) : tf::kVecLanes")
        code.writeline("}")

    def _emit_partial_rows(self, code, loop_body, epilogue, threads):
        code.writeline(f"constexpr int64_t kRows = {cexpr(sym.product(self.x_sizes))};   // accumulator row: one slot per output")
        code.writeline(f"const int nthreads = {threads};")
        code.writeline("int nteam = 1;   // the threads OpenMP gives (OMP_THREAD_LIMIT, OMP_DYNAMIC: maybe fewer)")
        for acc, t, _, _ in self.partials:
            code.writeline(f"std::unique_ptr<{t}[]> {acc}_partial(new {t}[nthreads * kRows + tf::kVecLanes]);")
        self._cascade_partial_arrays(code)
        code.writeline("#pragma omp parallel num_threads(nthreads)" if threads > 1 else "{")
        if threads > 1:
            code.writeline("{")
        with code.indent():
            code.writeline("const int tid = " + ("omp_get_thread_num();" if threads > 1 else "0;"))
            if threads > 1:
                code.writeline("if (tid == 0) nteam = omp_get_num_threads();")
            in_registers = self._partial_rows_in_registers()
            for acc, t, identity, _ in self.partials:
                if in_registers:   # a local row, the chunk loop unrolled: vector registers
                    code.writeline(f"alignas(64) {t} {acc}_row[kRows];")
                else:
                    code.writeline(f"{t}* __restrict__ {acc}_row = {self._thread_row(acc)} + tid * kRows;")
                code.writeline(f"for (int64_t i = 0; i < kRows; ++i) {acc}_row[i] = {identity};")
            self._cascade_thread_reset(code)
            if threads > 1:
                collapse = f" collapse({len(self.r_sizes)})" if len(self.r_sizes) > 1 else ""
                code.writeline(f"#pragma omp for{collapse} schedule(static)")
            for i, size in enumerate(self.r_sizes):
                code.writeline(f"for (int64_t r{i} = 0; r{i} < {cexpr(size)}; ++r{i}) {{")
                code._indent += 1
            slots = sym.to_int(self.x_sizes[0]) if in_registers else "kRows"
            self._cascade_step(code, slots)
            if in_registers:
                code.writeline("#pragma GCC unroll 16")
            self._emit_x_chunks(code, loop_body)
            for _ in self.r_sizes:
                code._indent -= 1
                code.writeline("}")
            self._cascade_fold(code, slots, thread_total=True)
            if in_registers:
                for acc, *_ in self.partials:
                    if acc not in self._cascaded():   # a cascade's totals are already there
                        code.writeline(f"for (int64_t i = 0; i < kRows; ++i) {acc}_partial[tid * kRows + i] = {acc}_row[i];")
        code.writeline("}")
        code.writeline("// combine the threads' rows in a fixed order, then the row-wise epilogue")
        self._emit_x_chunks(code, epilogue)

    def _partial_rows_in_registers(self) -> bool:
        """Whether each thread's accumulator rows fit in vector registers: one row dim of
        at most STRIP outputs in whole vectors, 16 vectors in all. Then they are local
        arrays under an unrolled chunk loop, which the compiler keeps in registers, instead
        of rows in memory whose every step waits on the last one's store. 2 threads, AMD
        EPYC: var_mean of a channels-last (8,64,56,56) f32 over all but the channels 489 ->
        53-61 us (Inductor 254), its sum and sum of squares 225 -> 47 us (Inductor 193)."""
        if len(self.x_sizes) != 1:
            return False
        rows = sym.to_int(self.x_sizes[0])
        return rows <= STRIP and rows % BLOCK_ALIGN == 0 and len(self.partials) * rows <= 16 * 16

    def _emit_x_chunks(self, code, inner):
        names = [f"x{i}" for i in range(len(self.x_sizes))]
        for name, size in zip(names[:-1], self.x_sizes[:-1]):
            code.writeline(f"for (int64_t {name} = 0; {name} < {size}; ++{name}) {{")
            code._indent += 1
        self._emit_vector_loops(code, [], [], inner, vector_dim=("x", len(self.x_sizes) - 1, self.x_sizes[-1]))
        for _ in names[:-1]:
            code._indent -= 1
            code.writeline("}")

    # ---- the accumulator update (called by CppReductions.reduction) ---------------------
    def _rows_outer_reduction_op(self, reduction_type, value, acc, t, identity, combine, dtype):
        self.partials.append((acc, t, identity, combine))
        result = CppVar(f"{acc}_result", dtype, True)
        if self.block_width is not None:
            slot = f"{acc}_row + (x{len(self.x_sizes) - 1} - xb)"
            self.post.writeline(f"const auto {result} = tf::vload<TAIL>({slot}, count);")
        else:
            flat = self._x_flat()
            slot = f"{acc}_row + {flat}"
            if reduction_type == "sum" and dtype.is_floating_point:
                self.cascade_sums.append((acc, t))
            self.post.writeline(f"auto {result} = tf::vload<TAIL>({acc}_partial.get() + {flat}, count);")
            self.post.writeline(f"for (int t = 1; t < nteam; ++t) {result} = "
                                f"{combine.format(a=result, b=f'tf::vload<TAIL>({acc}_partial.get() + t * kRows + {flat}, count)')};")
        self.code.writeline(f"tf::vstore<TAIL>({slot}, "
                            f"{combine.format(a=f'tf::vload<TAIL>({slot}, count)', b=value)}, count);")
        return result

    def _x_flat(self) -> str:
        strides = sym.contiguous_strides(self.x_sizes)
        return cexpr(sum((sympy.Symbol(f"x{i}", integer=True) * st for i, st in enumerate(strides)),
                         sympy.Integer(0)))

"""Accumulator rows of outer reductions (outer_reduction.py: partial rows and row
blocks, where the vector lanes are outputs) that a long reduction folds in chunks, and
Welford (mean, M2) accumulators in such rows. A mixin of CppKernel.

A cascade keeps the rounding error of a long reduction near that of its chunks: every
CASCADE_CHUNK steps a thread's chunk rows are folded into its totals and start over.
Float sums of partial rows: x.sum(0) of 5000 x 16 f32 in [-3, 3], 2 threads, 40 seeds:
worst difference from eager 5.3e-4 sequentially, 1.5e-4 with the cascade (1 of the 40
seeds outside atol 1e-4 + rtol 1e-4 sequentially, none with it).

Welford: every slot of a thread's rows takes one step per reduced index, so one step
count per thread, and one reciprocal of it per step, serves all the slots:

    steps += 1; rcp = 1 / steps                              at the top of each r step
    for x chunks: delta = v - mean[x]; mean[x] += delta * rcp; m2[x] += delta * (v - mean[x])

and the fold is Chan's combination. Var_mean of 100000 x 16 f32 (mean 5) over dim 0, error
of the mean against float64: 2.4e-5 sequentially, 1.8e-6 with the cascade (Inductor
2.1e-6, eager 2.4e-7). Partial rows then combine the threads' totals, weighted by their
step counts, in thread order.
"""
from .common import CppVar, cpp_constant
from .outer_reduction import BLOCK_ALIGN

CASCADE_CHUNK = 256


class CppCascadeRows:
    def _rows_welford_op(self, value, mean, m2, t, dtype):
        """The update of a Welford in accumulator rows ``mean`` and ``m2``; returns the
        (mean, m2) results, read after the r loops."""
        zero = cpp_constant(0, dtype)
        self.partials += [(mean, t, zero, None), (m2, t, zero, None)]
        self.welford_rows.append((mean, m2, t))
        results = (CppVar(f"{mean}_result", dtype, True), CppVar(f"{m2}_result", dtype, True))
        if self.block_width is not None:
            offset = f"(x{len(self.x_sizes) - 1} - xb)"
            for result, acc in zip(results, (mean, m2)):
                self.post.writeline(f"const auto {result} = tf::vload<TAIL>({acc}_total + {offset}, count);")
        else:   # the threads' totals, combined in a fixed order with their step counts
            offset = self._x_flat()

            def thread(index):
                at = f"{index} * kRows + {offset}"
                return (f"tf::Welford<tf::Vec<{t}>>{{tf::vload<TAIL>({mean}_partial.get() + {at}, count), "
                        f"tf::vload<TAIL>({m2}_partial.get() + {at}, count), tf::Vec<{t}>({mean}_weight[{index}])}}")
            self.post.writeline(f"auto {mean}_all = {thread(0)};")
            self.post.writeline(f"for (int t = 1; t < nteam; ++t) {mean}_all = tf::welford_combine({mean}_all, {thread('t')});")
            self.post.writeline(f"const auto {results[0]} = {mean}_all.mean;")
            self.post.writeline(f"const auto {results[1]} = {mean}_all.m2;")
        self.code.writeline(f"tf::welford_row_update<TAIL>({mean}_row + {offset}, {m2}_row + {offset}, "
                            f"{value}, {mean}_rcp, count);")
        return results

    def _cascaded_rows(self):
        """(accumulator, C type) of every row folded in chunks: the float sums of partial
        rows and both rows of each Welford. Their ``_row`` arrays hold the chunk being
        summed, their totals the partial array (partial rows) or ``_total`` (row blocks)."""
        return [*self.cascade_sums, *((acc, t) for mean, m2, t in self.welford_rows for acc in (mean, m2))]

    def _cascaded(self):
        return {acc for acc, _ in self._cascaded_rows()}

    def _thread_row(self, acc) -> str:
        """Where a partial-rows thread's row of ``acc`` starts (plus tid * kRows): its
        share of the partial array, or for a cascaded accumulator its chunk rows."""
        return f"{acc}_chunk.get()" if acc in self._cascaded() else f"{acc}_partial.get()"

    def _step_counters(self, code):
        if self.cascade_sums:
            code.writeline("int64_t sum_steps = 0;")
        for mean, _, t in self.welford_rows:
            code.writeline(f"{t} {mean}_steps = 0, {mean}_total_steps = 0;")

    # ---- partial rows ---------------------------------------------------------------------
    def _cascade_partial_arrays(self, code):
        for acc, t in self._cascaded_rows():
            code.writeline(f"std::unique_ptr<{t}[]> {acc}_chunk(new {t}[nthreads * kRows + tf::kVecLanes]);")
        for mean, _, t in self.welford_rows:
            code.writeline(f"std::unique_ptr<{t}[]> {mean}_weight(new {t}[nthreads]());   // the threads' step counts")

    def _cascade_thread_reset(self, code):
        for acc, t in self._cascaded_rows():
            code.writeline(f"{t}* __restrict__ {acc}_total = {acc}_partial.get() + tid * kRows;")
            code.writeline(f"for (int64_t i = 0; i < kRows; ++i) {acc}_total[i] = {t}(0);")
        self._step_counters(code)

    # ---- row blocks (Welfords only: their sums walk a block's rows whole) -----------------
    def _cascade_block_arrays(self, code, width):
        for acc, t in self._cascaded_rows():
            code.writeline(f"alignas(64) {t} {acc}_total[{width}];")

    def _cascade_block_reset(self, code, width):
        for acc, t in self._cascaded_rows():
            code.writeline(f"for (int64_t i = 0; i < {width}; ++i) {acc}_total[i] = {t}(0);")
        self._step_counters(code)

    # ---- both forms -----------------------------------------------------------------------
    def _cascade_step(self, code, slots):
        """The top of a step of the r loops: fold a full chunk, count the step."""
        if self.cascade_sums:
            code.writeline(f"if (sum_steps == {CASCADE_CHUNK}) {{ {self._sums_fold(slots)} sum_steps = 0; }}")
            code.writeline("++sum_steps;")
        for mean, m2, t in self.welford_rows:
            code.writeline(f"if ({mean}_steps == {CASCADE_CHUNK}) {self._welford_fold(mean, m2, t, slots)}")
            code.writeline(f"{mean}_steps += {t}(1);")
            code.writeline(f"const {t} {mean}_rcp = {t}(1) / {mean}_steps;")

    def _cascade_fold(self, code, slots, thread_total=False):
        """After the r loops: fold the last chunk; a partial-rows thread records its count."""
        if self.cascade_sums:
            code.writeline(self._sums_fold(slots))
        for mean, m2, t in self.welford_rows:
            code.writeline(self._welford_fold(mean, m2, t, slots))
            if thread_total:
                code.writeline(f"{mean}_weight[tid] = {mean}_total_steps;")

    @staticmethod
    def _vector_loop(slots) -> str:
        """An unrolled loop over ``slots`` in whole vectors (rows kept in registers stay
        there), or "" where the slots are not a known number of whole vectors."""
        if isinstance(slots, int) and slots % BLOCK_ALIGN == 0:
            return f"_Pragma(\"GCC unroll 16\") for (int64_t i = 0; i < {slots}; i += tf::kVecLanes) "
        return ""

    def _sums_fold(self, slots) -> str:
        """Add the chunk rows of the cascaded sums to their totals, and zero them."""
        loop = self._vector_loop(slots)
        if loop:
            return " ".join(f"{loop}tf::sum_fold_vec({acc}_row + i, {acc}_total + i);" for acc, _ in self.cascade_sums)
        return " ".join(f"tf::sum_rows_fold({acc}_row, {acc}_total, {slots});" for acc, _ in self.cascade_sums)

    def _welford_fold(self, mean, m2, t, slots) -> str:
        """A fold of a Welford's chunk rows into its totals: vectors where the slots are
        whole vectors (var_mean of a channels-last (8,64,56,56) f32, 2 threads: 105 us with
        the scalar loop, 53-61 us), else a scalar loop."""
        loop = self._vector_loop(slots)
        if not loop:
            return (f"tf::welford_rows_fold({mean}_row, {m2}_row, {mean}_total, {m2}_total, "
                    f"{mean}_steps, {mean}_total_steps, {slots});")
        return (f"if ({mean}_steps > {t}(0)) {{ {t} share, cross; "
                f"tf::welford_fold_shares({mean}_steps, {mean}_total_steps, share, cross); "
                f"{loop}tf::welford_fold_vec({mean}_row + i, {m2}_row + i, {mean}_total + i, {m2}_total + i, "
                f"share, cross); }}")

"""Indirect writes of the C++ backend (scatter, index_put, embedding backward): a kernel
holding one scatter node. A mixin of CppKernel.

Two iterations whose coordinates differ along a dim that the written index names
directly write different elements: an "owned" dim (every dim of the source but ``dim``
for scatter, the dims no index tensor covers for index_put, the hidden dim of embedding
backward). Iterations that differ only along the other dims may hit the same element.
So the threads split the owned dims and each walks the others in order:

    #pragma omp for collapse(..)        owned outer dims
      for ..:                           the other dims, in order (serial)
        for x_last in this thread's share, in vector chunks:   the innermost dim, when it
            out[idx * stride + x_last] op= value                is owned and contiguous

(with no owned outer dim the innermost owned dim is split in one contiguous share per
thread). No atomics and no per-thread copies of the target: every element takes its
writes in the source's row-major order, as in a serial loop, so plain stores keep the
last write as eager's CPU kernels do and float sums are deterministic. Measured on the
2-core EPYC (embedding backward, a 4096x768 gradient into a 32000x768 table, run alone):
1.35 ms split over two threads, 1.47 ms on one, 113 ms with a private table per thread
combined after (zeroing and adding two 98 MB copies).

An index out of bounds writes nothing (the store is guarded): eager raises there, and a
C++ kernel has no way to raise, but it must never write outside the tensor.
"""
import sympy

from tritonfuse.codegen.common import CSE, IndentedBuffer
from tritonfuse.dependencies import plan_and_deps

from . import common
from .common import _stride, cexpr

_COMBINE_OPS = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}


class _NeedsScalarCode(Exception):
    """A vectorized scatter whose lanes would write scattered elements: use scalar code."""


class CppScatter:
    def _is_scatter(self) -> bool:
        return any(node.mutated_name is not None for node in self.group.nodes)

    def _generate_scatter(self) -> str:
        (node, x_sizes, r_sizes, _), = self.group.node_layouts()   # a scatter fuses with nothing here
        _, _, write = plan_and_deps(node.buffer, x_sizes, r_sizes)
        variables = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(len(self.x_sizes))]
        owned = [i for i, v in enumerate(variables) if v in write.index.free_symbols]
        vectorize = bool(variables) and owned[-1:] == [len(variables) - 1] \
            and _stride(write.index, variables[-1]) == 1
        inner = None
        if vectorize:
            try:
                inner = self._scatter_body(node, vector=True)
            except _NeedsScalarCode:
                vectorize = False
        if not vectorize:
            inner = self._scatter_body(node, vector=False)
        return self._scatter_function(inner, owned, vectorize)

    def _scatter_body(self, node, vector: bool) -> IndentedBuffer:
        self.cse, self.stored, self._vector_indirect, self.indirect_sizes = CSE("tmp"), {}, set(), {}
        self.axis = "x" if vector else None
        self.tiled = False   # no tile fills here: transposed reads gather
        body = IndentedBuffer()
        self.code, self.vec_mode, self.segment_index, self.in_r_loop = body, vector, 0, False
        try:
            self._run_node(node, None, None, "x")
        finally:
            self.vec_mode = False
        return body

    def store_scatter(self, name, index, value, mode):
        if name in self.internal:
            return
        dtype = self.graph.name_to_buffer[name].get_dtype()
        pointer = self.args.output(name)
        index = self._index(index)
        if self.vec_mode and self._access_kind(index) != "contiguous":
            raise _NeedsScalarCode()
        guard = [f"0 <= {s} && {s} < {self.indirect_sizes[s.name]}" for s in sorted(index.free_symbols, key=str)
                 if s.name in self.indirect_sizes]
        if guard:
            self.code.writeline(f"if ({' && '.join(guard)}) {{")
            self.code._indent += 1
        if mode is not None:
            current = self._load_from(pointer, index, dtype)
            value = getattr(self, _COMBINE_OPS[mode])(current, value)
        self._store_to(pointer, index, value, dtype)
        if guard:
            self.code._indent -= 1
            self.code.writeline("}")

    def _scatter_function(self, inner, owned, vectorize) -> str:
        sizes = self.x_sizes
        last = len(sizes) - 1
        outer_owned = [i for i in owned if not (vectorize and i == last)]
        serial = [i for i in range(len(sizes)) if i not in owned]
        work = self.group.x_numel
        threads = self.num_threads if common.worth_threads(self.num_threads, work) else 1
        parallel = threads > 1 and (outer_owned or vectorize)
        share = parallel and not outer_owned   # split the vector dim, one share per thread
        condition = common.parallel_condition(work)
        sizes = [cexpr(s) for s in sizes]
        code = IndentedBuffer()
        code.writeline(f'extern "C" void {self.name}({self._params()}) {{')
        with code.indent():
            if parallel:
                code.writeline(f"#pragma omp parallel num_threads({threads}){condition}")
                code.writeline("{")
                code._indent += 1
            if share:
                size = sizes[last]
                code.writeline("const int tid = omp_get_thread_num(), team = omp_get_num_threads();")
                code.writeline(f"const int64_t share = ({size} / tf::kVecLanes + team - 1) / team * tf::kVecLanes;")
                code.writeline(f"const int64_t start = std::min<int64_t>(tid * share, {size});")
                code.writeline(f"const int64_t end = tid == team - 1 ? {size} : std::min<int64_t>(start + share, "
                               f"{size});")
            elif parallel:
                collapse = f" collapse({len(outer_owned)})" if len(outer_owned) > 1 else ""
                code.writeline(f"#pragma omp for{collapse} schedule(static)")
            opened = 0
            for i in outer_owned + serial:
                code.writeline(f"for (int64_t x{i} = 0; x{i} < {sizes[i]}; ++x{i}) {{")
                code._indent += 1
                opened += 1
            if vectorize:
                start, end = ("start", "end") if share else ("0", str(sizes[last]))
                code.writeline(f"for (int64_t x{last} = {start}; x{last} < {end}; x{last} += tf::kVecLanes) {{")
                with code.indent():
                    self._emit_chunk(code, inner, f"{end} - x{last} < tf::kVecLanes ? int({end} - x{last}) "
                                                  f": tf::kVecLanes")
                code.writeline("}")
            else:
                code.splice(inner)
            self._close_blocks(code, opened + bool(parallel))
        code.writeline("}")
        return code.getvalue()

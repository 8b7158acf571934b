"""Scans of the C++ backend (cumsum, cumprod, logcumsumexp): a sequential loop along the
scanned dim, parallel over the rows. A mixin of CppKernel.

A scan kernel holds scans and pointwise nodes over the same elements (what feeds the
scan and what reads it: ``cumsum(x * 2) + 1`` is one kernel). When the scanned dim is
contiguous in memory each thread walks its rows one after the other, in scalar code:

    #pragma omp for
    for x ..:
        acc = identity
        for r in 0..R: acc = acc op value(x, r); out[x, r] = acc; ...

When it is an outer dim (``x.cumsum(0)``), vector lanes run along the contiguous row dim
instead, each lane carrying its own running value (the loop nest of outer reductions):

    for x in vector chunks: acc = identity; for r: acc = acc op load(x.., r); store(x.., r)

The running value is carried in eager's CPU accumulation type (double for float32).
"""
import torch

from tritonfuse.codegen.common import IndentedBuffer
from tritonfuse.ops_table import reduction_identity

from .common import CppVar, compute_dtype, cpp_constant, ctype

# eager's CPU scans carry a float32 running value in double (at::acc_type)
_ACCUMULATE = {torch.float32: torch.float64}

_SCAN_COMBINE = {
    "sum": "({a} + {b})",
    "prod": "({a} * {b})",
    "logaddexp": "tf::scan_logaddexp({a}, {b})",
}


class CppScans:
    def _is_scan(self) -> bool:
        return any(node.is_scan() for node in self.group.nodes)

    def _generate_scan(self) -> str:
        (segment,) = self.segments   # scans fuse only with pointwise nodes here: one loop
        body = IndentedBuffer()
        if self.axis == "x":
            self._emit_vector_x_chunk(body)
            return self._function(body)
        self.axis = None             # scalar code along the scanned dim
        self._emit_plain_r_loops(body, segment)
        return self._function(body)

    def scan(self, dtype, scan_type, value):
        acc_dtype = _ACCUMULATE.get(compute_dtype(dtype), compute_dtype(dtype))
        t = ctype(acc_dtype)
        identity = cpp_constant(reduction_identity(scan_type, acc_dtype), acc_dtype)
        acc = f"scan{self.acc_counter}"
        self.acc_counter += 1
        vec = self.vec_mode
        self.pre.writeline(f"{f'tf::Vec<{t}>' if vec else t} {acc}({identity});")
        step = _SCAN_COMBINE[scan_type].format(a=acc, b=self._vec_if(self.to_dtype(value, acc_dtype), vec))
        self.code.writeline(f"{acc} = {step};")
        return self.to_dtype(CppVar(acc, acc_dtype, vec), dtype)   # each element rounds once, as eager

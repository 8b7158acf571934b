"""Scans of the C++ backend (cumsum, cumprod, logcumsumexp, cummax, cummin): a sequential loop along the
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

from .common import CppVar, cexpr, compute_dtype, cpp_constant, ctype

# eager's CPU cumsum/cumprod/logcumsumexp carry a float32 running value in double (at::acc_type)
_ACCUMULATE = {torch.float32: torch.float64}

_SCAN_COMBINE = {
    "sum": "({a} + {b})",
    "prod": "({a} * {b})",
    "logaddexp": "tf::scan_logaddexp({a}, {b})",
    "max": "tf::maximum({a}, {b})",
    "min": "tf::minimum({a}, {b})",
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
        if scan_type in ("argmax", "argmin"):
            return self._position_scan(scan_type, value)
        acc_dtype = compute_dtype(dtype)
        if scan_type in ("sum", "prod", "logaddexp"):
            acc_dtype = _ACCUMULATE.get(acc_dtype, acc_dtype)
        t = ctype(acc_dtype)
        identity = cpp_constant(reduction_identity(scan_type, acc_dtype), acc_dtype)
        acc = f"scan{self.acc_counter}"
        self.acc_counter += 1
        vec = self.vec_mode
        self.pre.writeline(f"{f'tf::Vec<{t}>' if vec else t} {acc}({identity});")
        step = _SCAN_COMBINE[scan_type].format(a=acc, b=self._vec_if(self.to_dtype(value, acc_dtype), vec))
        self.code.writeline(f"{acc} = {step};")
        return self.to_dtype(CppVar(acc, acc_dtype, vec), dtype)   # each element rounds once, as eager

    def _position_scan(self, scan_type, value):
        """The position of the running max/min: a (value, position) pair per row (lane)."""
        acc_dtype = compute_dtype(value.dtype)
        t = ctype(acc_dtype)
        identity = cpp_constant(reduction_identity(scan_type, acc_dtype), acc_dtype)
        acc = f"scan{self.acc_counter}"
        self.acc_counter += 1
        vec = self.vec_mode
        value = self._vec_if(value, vec)
        position = f"int64_t({cexpr(self._local_index())})"
        if vec:
            self.pre.writeline(f"tf::Vec<{t}> {acc}({identity}); tf::Vec<int64_t> {acc}_index(int64_t(0));")
            position = f"tf::Vec<int64_t>({position})"
        else:
            self.pre.writeline(f"{t} {acc}({identity}); int64_t {acc}_index(0);")
        self.code.writeline(f"const auto {acc}_take = tf::scan_takes_{scan_type[3:]}({acc}, {value});")
        self.code.writeline(f"{acc} = tf::where({acc}_take, {value}, {acc});")
        self.code.writeline(f"{acc}_index = tf::where({acc}_take, {position}, {acc}_index);")
        return CppVar(f"{acc}_index", torch.int64, vec)

"""Shared pieces of the C++ backend: C types, literals, index printers, the value type
of generated code, and the tuning constants of the loop nests."""
import math
from dataclasses import dataclass
from typing import Optional

import sympy
import torch

from tritonfuse import sym
from tritonfuse.codegen.common import IndexPrinter


PARALLEL_THRESHOLD = 32768   # elements of work below which a kernel runs on one thread
UNROLL = 2                   # vector chunks per step of an inner reduction loop (2 and 4 measured
                             # 10-20% faster than 1 on norms and var_mean; 2 keeps the code smaller)
# Blocks of pointwise kernels that read transposed data: 16x16 (one vector wide) with
# compile-time extents measured fastest inside a torch process on the 2-core EPYC, where
# larger tiles (32..128, quicker in a standalone loop) ran 1.5-2x slower.
TILE_ROWS, TILE_COLS = 16, 16
# Where a kernel's signature takes its size symbols (filled in once its body is known).
SIZE_PARAMS = "/*size params*/"


def worth_threads(num_threads: int, work) -> bool:
    """Whether a kernel with ``work`` elements should open a parallel region: static work
    decides here; symbolic work always may, and ``parallel_condition`` decides at run time
    (the example sizes of the first call say nothing about later ones)."""
    return num_threads > 1 and (not sym.is_static(work) or sym.hint(work) >= PARALLEL_THRESHOLD)


def parallel_condition(work) -> str:
    """The ``if(...)`` clause of a parallel region: for symbolic work, threads start only
    when the actual work is large enough; static work needs none."""
    return "" if sym.is_static(work) else f" if({cexpr(work)} >= {PARALLEL_THRESHOLD})"


STORAGE_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "uint16_t", torch.bfloat16: "uint16_t",
    torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
    torch.uint8: "uint8_t", torch.bool: "bool",
}


HALF_TYPES = {torch.float16: "half", torch.bfloat16: "bf16"}


def compute_dtype(dtype):
    return torch.float32 if dtype in HALF_TYPES else dtype


def ctype(dtype) -> str:
    return STORAGE_TYPES[compute_dtype(dtype)]


class CppPrinter(IndexPrinter):
    floordiv_op = "/"
    min_function = "std::min<int64_t>"
    max_function = "std::max<int64_t>"


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




@dataclass(eq=False)
class CppVar:
    """A value in generated C++: ``vec`` tells a tf::Vec from a scalar."""
    name: str
    dtype: torch.dtype
    vec: bool = False
    constant: Optional[object] = None

    def __str__(self):
        return self.name


def _stride(index, var):
    """d index / d var when index is affine in var, else None."""
    if var not in index.free_symbols:
        return 0
    derivative = sympy.diff(index, var)
    if derivative.free_symbols or any(isinstance(a, sympy.Function) for a in sympy.preorder_traversal(index)
                                      if var in getattr(a, "free_symbols", set()) and isinstance(a, sympy.Function)):
        return None
    return int(derivative)


def _cast_python(value, dtype):
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    return int(value)

"""Host-side values of a GPU graph: CPU scalars that eager keeps on the CPU.

Dynamo hands a Python float of the model (an RMSNorm's epsilon under ``dynamic=True``) to
the graph as a 0-d CPU tensor. The graph reads it on the host (``zh0 = arg5.item()``) and
inlines it into the GPU kernels (graph.py, ``_host_scalar``). When the graph also returns a
value computed from it alone, which eager keeps on the CPU (aot_autograd saves
``eps.to(float32)`` for the backward), computing it on the GPU and copying it back costs a
device-to-host copy: the host waits for every kernel queued before it, once per step.

``host_fill_value`` finds such a value that is only a cast of a host scalar, a size or a
constant: ``torch.full(size, value, dtype=meta.dtype)`` on the host then gives exactly
eager's result, with no copy.
"""
from __future__ import annotations

import sympy
import torch

from .virtualized import set_ops_handler


class _NotHostValue(Exception):
    pass


class _CastsOfOneValue:
    """An ops handler that follows one value through casts: each op returns
    (value, dtypes it was cast through); any other op raises _NotHostValue."""

    def index_expr(self, expr, dtype):
        return expr, (dtype,)

    def constant(self, value, dtype):
        return value, (dtype,)

    def to_dtype(self, x, dtype, *args, **kwargs):
        value, dtypes = x
        return value, dtypes + (dtype,)

    def __getattr__(self, name):
        raise _NotHostValue(name)


def _keeps_value_for(dtype: torch.dtype, final: torch.dtype) -> bool:
    """Whether a cast through ``dtype`` before a cast to ``final`` changes nothing, for any
    value: ``dtype`` is ``final`` itself or holds every value of ``final``'s kind exactly
    enough (float64 before any float, int64 before any integer)."""
    if dtype == final:
        return True
    if final.is_floating_point:
        return dtype == torch.float64 or (dtype == torch.float32 and final in (torch.float16, torch.bfloat16))
    return dtype == torch.int64 and not final.is_floating_point and final != torch.bool


def host_fill_value(value, meta: torch.Tensor):
    """The fill value (a number or a size/host-scalar expression) of ``torch.full`` in
    ``meta.dtype`` when ``value`` (an IR TensorBox) holds one element that is a cast of a
    host scalar, a size or a constant, read without any buffer; else None."""
    if meta.dtype.is_complex or meta.dtype == torch.bool or \
            not all(isinstance(s, int) and s == 1 for s in meta.shape):
        return None
    index = [sympy.Integer(0)] * len(meta.shape)
    try:
        with set_ops_handler(_CastsOfOneValue()):
            fill, dtypes = value.make_loader()(index)
    except _NotHostValue:
        return None
    source, casts = dtypes[0], dtypes[1:]
    if casts and casts[-1] != meta.dtype:
        return None
    if not all(_keeps_value_for(d, meta.dtype) for d in casts[:-1]):
        return None
    if source.is_floating_point and not meta.dtype.is_floating_point:
        return None     # float -> integer truncates: left to the general path
    return fill

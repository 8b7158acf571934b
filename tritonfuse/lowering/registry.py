"""The lowering registry: one function per aten op, registered by decorator.

``@register_lowering(aten.add, broadcast=True, type_promotion=DEFAULT)`` does the shared
work once: unwraps arguments, broadcasts tensor operands to one shape, and works out
eager's computation and result dtypes, so a pointwise lowering is one line.
"""
import functools
import logging

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .. import sym
from ..ir import GenericView, Pointwise, ReinterpretView, TensorBox, origins_of, strided_layout_of
from ..virtualized import ops

log = logging.getLogger("tritonfuse.lowering")
aten = torch.ops.aten

DEFAULT = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
INT_TO_FLOAT = ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
ALWAYS_BOOL = ELEMENTWISE_TYPE_PROMOTION_KIND.ALWAYS_BOOL
NO_OPMATH = ELEMENTWISE_TYPE_PROMOTION_KIND.NO_OPMATH
COMPLEX_TO_FLOAT = ELEMENTWISE_TYPE_PROMOTION_KIND.COMPLEX_TO_FLOAT
BOOL_TO_LONG = ELEMENTWISE_TYPE_PROMOTION_KIND.BOOL_TO_LONG

lowerings = {}

SUPPORTED_DTYPES = {
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
}


class Unsupported(Exception):
    """Raised by a lowering that declines a case: the op then runs as an aten fallback."""


def static_sizes(sizes, what):
    """Sizes as ints, for a case lowered for static shapes only: a symbolic size raises
    ``Unsupported`` (the op then runs as an aten call; the rest of the graph stays symbolic)."""
    sizes = [sym.sint(s) for s in sizes]
    if not all(sym.is_static(s) for s in sizes):
        raise Unsupported(f"{what} over symbolic sizes {sizes}")
    return [int(s) for s in sizes]


def normalize_dim(dim: int, ndim: int) -> int:
    """``dim`` as a non-negative index, wrapped as eager wraps it: a 0-d tensor accepts
    dim 0 and -1 (both give 0, a dim it does not have: callers treat it as size 1)."""
    return dim + max(ndim, 1) if dim < 0 else dim


def _overloads(op):
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def register_lowering(*aten_ops, broadcast=False, type_promotion=None):
    def decorator(fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            if broadcast or type_promotion is not None:
                tensor_positions = [i for i, a in enumerate(args) if isinstance(a, TensorBox)]
                args = list(args)
                if type_promotion is not None:
                    compute_dtype, result_dtype = promote_types(args, type_promotion)
                    kwargs = dict(kwargs, compute_dtype=compute_dtype, result_dtype=result_dtype)
                if broadcast and tensor_positions:
                    args = broadcast_operands(args)
            return fn(*args, **kwargs)

        for op in aten_ops:
            for overload in _overloads(op):
                lowerings[overload] = wrapped
        return fn
    return decorator


def promote_types(args, kind):
    """eager's (computation dtype, result dtype) for these operands."""
    proxies = []
    for a in args:
        if isinstance(a, TensorBox):
            ndim = len(a.get_size())
            proxies.append(torch.empty([1] * ndim, dtype=a.get_dtype(), device="meta"))
        elif isinstance(a, (bool, int, float)):
            proxies.append(a)
        elif isinstance(a, sympy.Basic):   # a symbolic size or scalar: an int or a float
            proxies.append(1 if a.is_integer else 1.0)
    compute, result = elementwise_dtypes(*proxies, type_promotion_kind=kind)
    return compute, result


def broadcast_shapes(*shapes):
    """torch's broadcasting of sizes that may be symbolic (Dynamo checked they agree)."""
    ndim = max(len(s) for s in shapes)
    result = []
    for d in range(ndim):
        size = sympy.Integer(1)
        for shape in shapes:
            k = d - (ndim - len(shape))
            if k < 0:
                continue
            candidate = sym.sint(shape[k])
            if size == 1:
                size = candidate
            elif candidate != 1 and not sym.same_size(size, candidate):
                if sym.is_static(size) and sym.is_static(candidate):
                    raise Unsupported(f"shapes {shapes} do not broadcast")
                size = size if sym.is_static(size) else candidate   # equal where the graph runs
        result.append(size)
    return result


def _expanded_stride(old_size, new_size, stride):
    """expand only broadcasts dims of size 1 (a symbolic size is never 1: Dynamo specializes
    it). Comparing the sizes instead gave a stride of 0 to a dim whose symbolic size is spelled
    differently on the two sides (s0*(s1 - 1) against s0*s1 - s0): every row read row 0."""
    return sympy.Integer(0) if old_size == 1 and new_size != 1 else stride


def expand(x: TensorBox, size) -> TensorBox:
    size = [sym.sint(s) for s in size]
    old = list(x.get_size())
    if old == size:
        return x
    lead = len(size) - len(old)
    layout = strided_layout_of(x)
    if layout is not None:
        from ..ir import Layout, buffer_of
        stride = [sympy.Integer(0)] * lead + [_expanded_stride(os, ns, st)
                                             for os, ns, st in zip(old, size[lead:], layout.stride)]
        return TensorBox(ReinterpretView(buffer_of(x), Layout(layout.device, layout.dtype, size, stride, layout.offset)))

    def reindex(index):
        index = index[lead:]
        return [sympy.Integer(0) if os == 1 and ns != 1 else i for i, os, ns in zip(index, old, size[lead:])]

    def restride(base):
        from ..ir import Layout
        stride = [sympy.Integer(0)] * lead + [_expanded_stride(os, ns, st)
                                             for os, ns, st in zip(old, size[lead:], base.stride)]
        return Layout(base.device, base.dtype, size, stride, base.offset)
    return TensorBox(GenericView(x.data, size, reindex, restride))


def broadcast_tensors(*tensors):
    target = broadcast_shapes(*[t.get_size() for t in tensors])
    return [expand(t, target) for t in tensors]


def broadcast_operands(values):
    """``values`` with its tensors broadcast to one shape (scalars and None kept).
    Promote types *before* this: a 0-d tensor takes part in eager's type promotion only
    when its category is higher, and broadcast it is no longer 0-d."""
    tensors = [v for v in values if isinstance(v, TensorBox)]
    expanded = iter(broadcast_tensors(*tensors)) if tensors else iter(())
    return [next(expanded) if isinstance(v, TensorBox) else v for v in values]


def make_loader(value, dtype):
    """A loader that yields ``value`` (tensor or python scalar) cast to ``dtype``."""
    if isinstance(value, TensorBox):
        inner = value.make_loader()
        if value.get_dtype() == dtype:
            return inner
        return lambda index: ops.to_dtype(inner(index), dtype)
    if isinstance(value, sympy.Basic) and not value.is_number:   # a size or a scalar known at run time
        source = torch.int64 if value.is_integer else torch.float64
        return lambda index: ops.to_dtype(ops.index_expr(value, source), dtype)
    if isinstance(value, sympy.Basic):
        value = int(value) if value.is_Integer else float(value)
    return lambda index: ops.constant(value, dtype)


def make_pointwise(fn, args, compute_dtype, result_dtype, origin=""):
    """A Pointwise computing ``fn(*values)`` in ``compute_dtype``, cast to ``result_dtype``."""
    tensors = [a for a in args if isinstance(a, TensorBox)]
    if not tensors:
        raise Unsupported("pointwise op without tensor operands")
    for t in tensors:
        if t.get_dtype() not in SUPPORTED_DTYPES:
            raise Unsupported(f"dtype {t.get_dtype()} is not supported")
    loaders = [make_loader(a, compute_dtype) for a in args]
    size = list(tensors[0].get_size())
    device = tensors[0].get_device()

    def inner_fn(index):
        result = fn(*[load(index) for load in loaders])
        return result if result_dtype == compute_dtype else ops.to_dtype(result, result_dtype)

    origins = origins_of(tensors) + (origin,)
    return TensorBox.create(Pointwise(device, result_dtype, inner_fn, size, origins=tuple(dict.fromkeys(origins))))

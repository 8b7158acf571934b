"""Scans: cumsum, cumprod, logcumsumexp, cummax, cummin.

Each is an ``ir.Scan`` along one dim, realized at once (like a reduction) so that the
scheduler fuses what feeds it and what reads it into its kernel. Values are combined in
eager's accumulation dtype: the result dtype (int64 for integer and bool cumsum/cumprod)
computed in float32 for float16/bfloat16, rounded per element on store.
"""
import torch

from ..ir import Pointwise, Scan, StorageBox, TensorBox, origins_of
from ..virtualized import ops
from .registry import Unsupported, aten, make_loader, register_lowering
from .tensor_ops import _check_dtype, _meta


@register_lowering(aten.cumsum)
def cumsum(x, dim, dtype=None):
    return _scan(x, dim, "sum", "cumsum", _meta().dtype)


@register_lowering(aten.cumprod)
def cumprod(x, dim, dtype=None):
    return _scan(x, dim, "prod", "cumprod", _meta().dtype)


@register_lowering(aten.logcumsumexp)
def logcumsumexp(x, dim):
    if not _meta().dtype.is_floating_point:
        raise Unsupported("logcumsumexp of a non-float tensor")
    return _scan(x, dim, "logaddexp", "logcumsumexp", _meta().dtype)


@register_lowering(aten.cummax)
def cummax(x, dim):
    return _scan_with_positions(x, dim, "max", "cummax")


@register_lowering(aten.cummin)
def cummin(x, dim):
    return _scan_with_positions(x, dim, "min", "cummin")


def _scan_with_positions(x, dim, extremum, origin):
    """(values, indices): two scans of one input, computed in one kernel."""
    if x.get_dtype() == torch.bool:
        raise Unsupported(f"{origin} of a bool tensor")
    return (_scan(x, dim, extremum, origin, x.get_dtype()),
            _scan(x, dim, f"arg{extremum}", origin, torch.int64, x.get_dtype()))


def _scan(x, dim, scan_type, origin, dtype, value_dtype=None):
    """A Scan of ``x`` (read as ``value_dtype``, default the result ``dtype``) along ``dim``."""
    _check_dtype(dtype)
    if dtype == torch.bool:
        raise Unsupported(f"{origin} to bool")
    size = list(x.get_size())
    loader = make_loader(x, value_dtype or dtype)
    origins = tuple(dict.fromkeys(origins_of([x]) + (origin,)))
    # nothing to combine: a copy (a symbolic length is at least 2, Dynamo specializes 0
    # and 1; the scan kernels are right for any length anyway)
    if not size or size[dim] == 1 or x.numel() == 0:
        if value_dtype is not None:   # positions of a single element: 0
            loader = lambda index: ops.constant(0, dtype)   # noqa: E731
        return TensorBox.create(Pointwise(x.get_device(), dtype, loader, size, origins=origins))
    dim = dim + len(size) if dim < 0 else dim
    scan = Scan(x.get_device(), dtype, loader, size[:dim] + size[dim + 1:], origins=origins,
                scan_ranges=[size[dim]], axis=dim, scan_type=scan_type)
    box = StorageBox(scan)
    box.realize()
    return TensorBox(box)

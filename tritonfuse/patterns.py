"""Graph-level rewrites applied while lowering, each enabled by a flag of the backend
that will generate the code.

online softmax: ``sum(exp(x - amax(x, d, keepdim=True)), d)`` becomes one "sumexp"
reduction of x (running max and rescaled running sum). It no longer depends on the
amax, so both reductions share one pass over x: softmax and log_softmax read their
input twice instead of three times, logsumexp and cross-entropy's forward once instead
of twice (worth it on GPUs, where long rows don't stay in cache; the C++ backend keeps
rows in cache and does not ask for it). logsumexp's decomposition shifts by the max with
its infinities replaced by 0, ``where(abs(m) == inf, 0, m)``: the same sum but where m is
+inf (``finite_max`` below).
"""
import math
from typing import NamedTuple, Optional

import torch

aten = torch.ops.aten


class OnlineSoftmaxSum(NamedTuple):
    x: torch.fx.Node
    dims: list
    finite_max: Optional[torch.fx.Node]   # logsumexp's form: the amax node, whose +inf rows differ


def _dims(dims, ndim):
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted(d % ndim for d in dims)


def _target(node):
    return getattr(node, "target", None)


def _is_zero(value) -> bool:
    """A literal 0, or the 0-d tensor node a decomposition made of one."""
    if isinstance(value, (int, float)):
        return value == 0
    return _target(value) is aten.scalar_tensor.default and value.args[0] == 0


def _amax_with_infinities_zeroed(shift):
    """m when ``shift`` is where(abs(m) == inf, 0, m), else None."""
    if _target(shift) not in (aten.where.self, aten.where.ScalarSelf) or len(shift.args) != 3:
        return None
    condition, zero, amax = shift.args
    if _target(condition) is not aten.eq.Scalar or condition.args[1] != math.inf:
        return None
    absolute = condition.args[0]
    if _target(absolute) is not aten.abs.default or absolute.args[0] is not amax or not _is_zero(zero):
        return None
    return amax


def match_online_softmax_sum(node) -> Optional[OnlineSoftmaxSum]:
    """``node`` as sum(exp(x - shift), dims) with shift amax(x, dims, keepdim=True), or
    logsumexp's where(abs(amax) == inf, 0, amax); None when it is neither."""
    if node.target is not aten.sum.dim_IntList or node.kwargs.get("dtype") is not None:
        return None
    exp = node.args[0]
    if _target(exp) is not aten.exp.default:
        return None
    sub = exp.args[0]
    if _target(sub) is not aten.sub.Tensor or sub.kwargs.get("alpha", 1) != 1:
        return None
    x, shift = sub.args
    finite_max = _amax_with_infinities_zeroed(shift)
    amax = finite_max if finite_max is not None else shift
    if _target(amax) is not aten.amax.default or amax.args[0] is not x:
        return None
    keepdim = amax.args[2] if len(amax.args) > 2 else amax.kwargs.get("keepdim", False)
    meta = x.meta.get("val")
    if not keepdim or meta is None or not meta.dtype.is_floating_point or meta.dim() == 0:
        return None   # a 0-d x (logsumexp of a scalar) has no dim to reduce over
    ndim = meta.dim()
    dims = _dims(node.args[1], ndim)
    if dims != _dims(amax.args[1], ndim):
        return None
    return OnlineSoftmaxSum(x, dims, finite_max)

"""Graph-level rewrites applied while lowering, each enabled by a flag of the backend
that will generate the code.

online softmax: ``sum(exp(x - amax(x, d, keepdim=True)), d)`` becomes one "sumexp"
reduction of x (running max and rescaled running sum). It no longer depends on the
amax, so both reductions share one pass over x: softmax and log_softmax read their
input twice instead of three times (worth it on GPUs, where long rows don't stay in
cache; the C++ backend keeps rows in cache and does not ask for it).
"""
import torch

aten = torch.ops.aten


def _dims(dims, ndim):
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted(d % ndim for d in dims)


def match_online_softmax_sum(node):
    """The x node and dims when ``node`` is sum(exp(x - amax(x, dims, True)), dims)."""
    if node.target is not aten.sum.dim_IntList or node.kwargs.get("dtype") is not None:
        return None
    exp = node.args[0]
    if getattr(exp, "target", None) is not aten.exp.default:
        return None
    sub = exp.args[0]
    if getattr(sub, "target", None) is not aten.sub.Tensor or sub.kwargs.get("alpha", 1) != 1:
        return None
    x, amax = sub.args
    if getattr(amax, "target", None) is not aten.amax.default or amax.args[0] is not x:
        return None
    keepdim = amax.args[2] if len(amax.args) > 2 else amax.kwargs.get("keepdim", False)
    meta = x.meta.get("val")
    if not keepdim or meta is None or not meta.dtype.is_floating_point:
        return None
    ndim = meta.dim()
    dims = _dims(node.args[1], ndim)
    if dims != _dims(amax.args[1], ndim):
        return None
    return x, dims

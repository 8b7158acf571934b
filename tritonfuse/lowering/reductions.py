"""Reductions: sum, prod, amax, amin, argmax, argmin, any, all, mean, var, std, var_mean.

Every reduction is realized as soon as it is built: its result is a buffer that the
scheduler can fuse with its producer (as a prologue) and its consumers (as an epilogue).
var/std are computed two-pass (mean, then the mean of squared deviations): exact, and
free of extra memory traffic in a persistent reduction, where the row sits in registers.
"""
import math

import sympy
import torch

from .. import sym
from ..ir import Pointwise, StorageBox, TensorBox, origins_of, strided_layout_of
from ..virtualized import ops
from .registry import SUPPORTED_DTYPES, Unsupported, aten, normalize_dim, register_lowering
from ..codegen.registry import two_pass_variance_max_row, welford_for_strided_rows
from .split_reduction import build_reduction, num_splits
from .views import view


def _reduction_dims(x, dims):
    """The dims reduced, sorted. A 0-d tensor has none: reducing it over dim 0 (or -1),
    as eager allows, reduces its one element."""
    ndim = len(x.get_size())
    if ndim == 0 or dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({normalize_dim(d, ndim) for d in dims})


def _accumulate_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def make_reduction(x: TensorBox, dims, keepdim, reduction_type, result_dtype, src_dtype, value_fn=None,
                   origin=None, value_dtype=None):
    """Reduce ``x`` over ``dims`` accumulating in ``src_dtype``. Elements are read as
    ``value_dtype`` (default ``src_dtype``) and ``value_fn(value, kept_index)`` may
    transform each one (its result must be ``src_dtype``)."""
    value_dtype = value_dtype or src_dtype
    if x.get_dtype() not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {x.get_dtype()}")
    size = list(x.get_size())
    ndim = len(size)
    dims = _reduction_dims(x, dims)
    kept = [d for d in range(ndim) if d not in dims]
    ranges = [size[d] for d in kept]
    reduction_ranges = [size[d] for d in dims]
    if sym.product(reduction_ranges) == 0:
        raise Unsupported("reduction over an empty dimension")
    if sym.product(ranges) == 0:
        raise Unsupported("reduction producing an empty tensor")
    loader = x.make_loader()
    source_dtype = x.get_dtype()

    def inner_fn(index, rindex):
        full = [None] * ndim
        for d, i in zip(kept, index):
            full[d] = i
        for d, r in zip(dims, rindex):
            full[d] = r
        value = loader(full)
        if source_dtype != value_dtype:
            value = ops.to_dtype(value, value_dtype)
        if value_fn is not None:
            value = value_fn(value, index)
        return value

    origins = tuple(dict.fromkeys(origins_of([x]) + (origin or reduction_type,)))
    if sym.product(reduction_ranges) == 1:
        # nothing to reduce: a pointwise copy (argmax/argmin of one element is 0)
        zeros = [sympy.Integer(0)] * len(reduction_ranges)

        def single(index):
            if reduction_type in ("argmax", "argmin"):
                return ops.constant(0, torch.int64)
            if reduction_type == "welford_m2":
                return ops.constant(0, result_dtype)
            if reduction_type == "sumexp":   # exp(v - v): 1, or nan for inf/nan as in eager
                value = inner_fn(index, zeros)
                return ops.exp(ops.sub(value, value))
            value = inner_fn(index, zeros)
            return value if src_dtype == result_dtype else ops.to_dtype(value, result_dtype)
        result = TensorBox.create(Pointwise(x.get_device(), result_dtype, single, ranges, origins=origins))
    else:
        outer = dims != list(range(ndim - len(dims), ndim))   # not the trailing dims: read across rows
        result = build_reduction(x.get_device(), result_dtype, src_dtype, inner_fn, ranges, reduction_ranges,
                                 reduction_type, origins, outer)
    if keepdim:
        result = view(result, [sympy.Integer(1) if d in dims else size[d] for d in range(ndim)])
    return result


def _map(x: TensorBox, fn, dtype, origin):
    loader = x.make_loader()
    origins = tuple(dict.fromkeys(origins_of([x]) + (origin,)))
    return TensorBox.create(Pointwise(x.get_device(), dtype, lambda idx: fn(loader(idx)), list(x.get_size()),
                                      origins=origins))


@register_lowering(aten.sum)
def sum_(x, dim=None, keepdim=False, dtype=None):
    source = dtype or x.get_dtype()
    if dtype is None and (source == torch.bool or not source.is_floating_point):
        source = torch.int64
    acc = _accumulate_dtype(source)
    result = make_reduction(x, dim, keepdim, "sum", acc, acc, origin="sum")
    return result if acc == source else _map(result, lambda v: ops.to_dtype(v, source), source, "sum")


@register_lowering(aten.nansum)
def nansum(x, dim=None, keepdim=False, dtype=None):
    """sum with NaNs counted as zeros."""
    source = x.get_dtype()
    if source.is_floating_point:
        x = _map(x, lambda v: ops.where(ops.isnan(v), ops.constant(0, source), v), source, "nansum")
    return sum_(x, dim, keepdim, dtype)


@register_lowering(aten.count_nonzero)
def count_nonzero(x, dim=None):
    source = x.get_dtype()
    nonzero = _map(x, lambda v: ops.to_dtype(ops.ne(v, ops.constant(0, source)), torch.int64), torch.int64,
                   "count_nonzero")
    return sum_(nonzero, dim, False, torch.int64)


@register_lowering(aten.prod)
def prod(x, dim=None, keepdim=False, dtype=None):
    source = dtype or x.get_dtype()
    if dtype is None and (source == torch.bool or not source.is_floating_point):
        source = torch.int64
    acc = _accumulate_dtype(source)
    result = make_reduction(x, dim, keepdim, "prod", acc, acc, origin="prod")
    return result if acc == source else _map(result, lambda v: ops.to_dtype(v, source), source, "prod")


def _extremum(reduction_type):
    def lowering(x, dim=None, keepdim=False):
        dtype = x.get_dtype()
        if dtype == torch.bool:
            kind = "any" if reduction_type == "max" else "all"
            return make_reduction(x, dim, keepdim, kind, torch.bool, torch.bool, origin=f"a{reduction_type}")
        acc = _accumulate_dtype(dtype)
        result = make_reduction(x, dim, keepdim, reduction_type, acc, acc, origin=f"a{reduction_type}")
        return result if acc == dtype else _map(result, lambda v: ops.to_dtype(v, dtype), dtype, reduction_type)
    return lowering


register_lowering(aten.amax)(_extremum("max"))
register_lowering(aten.amin)(_extremum("min"))


def _arg_extremum(reduction_type):
    def lowering(x, dim=None, keepdim=False):
        if dim is None:
            flat = view(x, [x.numel()])
            result = make_reduction(flat, [0], False, reduction_type, torch.int64, _accumulate_dtype(x.get_dtype()),
                                    origin=reduction_type)
            if keepdim:
                result = view(result, [1] * len(x.get_size()))
            return result
        return make_reduction(x, [dim], keepdim, reduction_type, torch.int64, _accumulate_dtype(x.get_dtype()),
                              origin=reduction_type)
    return lowering


register_lowering(aten.argmax)(_arg_extremum("argmax"))
register_lowering(aten.argmin)(_arg_extremum("argmin"))


@register_lowering(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _extremum("max")(x, [dim], keepdim), _arg_extremum("argmax")(x, dim, keepdim)


@register_lowering(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _extremum("min")(x, [dim], keepdim), _arg_extremum("argmin")(x, dim, keepdim)


@register_lowering(aten.max.default)
def max_all(x):
    return _extremum("max")(x, None, False)


@register_lowering(aten.min.default)
def min_all(x):
    return _extremum("min")(x, None, False)


def _boolean(reduction_type):
    def lowering(x, dim=None, keepdim=False):
        dtype = x.get_dtype()
        as_bool = None if dtype == torch.bool else (lambda v, idx: ops.ne(v, ops.constant(0, dtype)))
        result = make_reduction(x, dim, keepdim, reduction_type, torch.bool, torch.bool, value_fn=as_bool,
                                origin=reduction_type, value_dtype=dtype)
        if dtype == torch.uint8:
            return _map(result, lambda v: ops.to_dtype(v, torch.uint8), torch.uint8, reduction_type)
        return result
    return lowering


register_lowering(aten.any)(_boolean("any"))
register_lowering(aten.all)(_boolean("all"))


def _count(x, dims):
    size = x.get_size()
    return sympy.expand(sym.product([size[d] for d in _reduction_dims(x, dims)]))


def _number(value, dtype):
    """``value`` (an int or a symbolic size) as a loop-body value of ``dtype``."""
    if sym.is_static(value):
        return ops.constant(sym.to_int(value), dtype)
    return ops.to_dtype(ops.index_expr(value, torch.int64), dtype)


@register_lowering(aten.mean)
def mean(x, dim=None, keepdim=False, dtype=None):
    out_dtype = dtype or x.get_dtype()
    if not out_dtype.is_floating_point:
        raise Unsupported("mean of an integer tensor")
    acc = _accumulate_dtype(out_dtype)
    total = make_reduction(x, dim, keepdim, "sum", acc, acc, origin="mean")
    count = _count(x, dim)
    return _map(total, lambda v: ops.to_dtype(ops.truediv(v, _number(count, acc)), out_dtype), out_dtype,
                "mean")


def _var_mean(x, dim, correction, keepdim):
    """Welford: one pass gives the mean and M2 (the sum of squared deviations) together;
    the two reductions share one accumulator in the generated kernel. Backends whose rows
    stay in cache may ask for the exact two-pass form instead (mean, then M2), and so does
    a reduction too long for its few outputs to fill a GPU (batch norm's statistics:
    64 channels of 32x112x112 values): its two sums split in two stages each
    (split_reduction.py), where one Welford pass would run on a few programs."""
    dtype = x.get_dtype()
    if not dtype.is_floating_point:
        raise Unsupported("var of an integer tensor")
    acc = _accumulate_dtype(dtype)
    count = _count(x, dim)
    correction = 1 if correction is None else correction
    device = x.get_device().type
    two_pass = sym.hint(count) <= two_pass_variance_max_row(device) or _sums_would_split(x, dim)
    if two_pass and welford_for_strided_rows(device) and _reads_rows_strided(x, dim):
        two_pass = False
    if two_pass:   # speed only
        mean_value, m2 = _mean_and_m2_two_pass(x, dim, keepdim, acc)
    else:
        mean_value = make_reduction(x, dim, keepdim, "welford_mean", acc, acc, origin="mean")
        m2 = make_reduction(x, dim, keepdim, "welford_m2", acc, acc, origin="var")
    divisor = sympy.Max(count - correction, 0)
    var = _map(m2, lambda v: ops.to_dtype(ops.truediv(v, _number(divisor, acc)), dtype), dtype, "var")
    mean_out = mean_value
    if acc != dtype:
        mean_out = _map(mean_out, lambda v: ops.to_dtype(v, dtype), dtype, "mean")
    return var, mean_out


def _reads_rows_strided(x, dim) -> bool:
    """Whether ``x`` is reduced over its trailing dims (a norm's rows) and read with a
    stride other than 1 along the innermost of them (a transposed input): as a realized
    buffer or view, or through every load of a pointwise value (a cast of one)."""
    ndim = len(x.get_size())
    dims = _reduction_dims(x, dim)
    if not dims or dims != list(range(ndim - len(dims), ndim)) or sym.hint(x.get_size()[-1]) == 1:
        return False
    layout = strided_layout_of(x)
    if layout is not None:
        return sym.hint(layout.stride[-1]) != 1
    data = x.data.data if isinstance(x, TensorBox) and isinstance(x.data, StorageBox) else None
    if not isinstance(data, Pointwise):
        return False
    from ..graph import pointwise_reads
    index = sym.index_vars("i", ndim)
    strides = [sympy.diff(read, index[-1]) for _, read in pointwise_reads(data, index)]
    return bool(strides) and all(s != 1 for s in strides) and any(s != 0 for s in strides)


def _sums_would_split(x, dim) -> bool:
    """Whether a sum of ``x`` over ``dim`` would be computed in two stages."""
    ndim = len(x.get_size())
    dims = _reduction_dims(x, dim)
    count = sym.hint(_count(x, dim))
    outputs = sym.hint(sym.product(x.get_size())) // max(count, 1)
    outer = dims != list(range(ndim - len(dims), ndim))
    return num_splits(x.get_device(), "sum", outputs, count, outer) > 1


def _mean_and_m2_two_pass(x, dim, keepdim, acc):
    mean_value = mean(x, dim, True, acc)           # keepdim, accumulation precision
    mean_loader = mean_value.make_loader()
    ndim = len(x.get_size())
    dims = _reduction_dims(x, dim)
    kept = [d for d in range(ndim) if d not in dims]

    def squared_deviation(value, index):
        full = [sympy.Integer(0)] * ndim
        for d, i in zip(kept, index):
            full[d] = i
        centered = ops.sub(value, mean_loader(full))
        return ops.mul(centered, centered)

    m2 = make_reduction(x, dim, keepdim, "sum", acc, acc, value_fn=squared_deviation, origin="var")
    if not keepdim:
        mean_value = view(mean_value, [s for d, s in enumerate(x.get_size()) if d not in dims])
    return mean_value, m2


@register_lowering(aten.var)
def var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    if isinstance(dim, bool):  # the .default overload: var(x, unbiased)
        dim, unbiased = None, dim
    if correction is None and unbiased is not None:
        correction = 1 if unbiased else 0
    return _var_mean(x, dim, correction, keepdim)[0]


@register_lowering(aten.var_mean)
def var_mean(x, dim=None, unbiased=None, keepdim=False, correction=None):
    if isinstance(dim, bool):  # the .default overload: var(x, unbiased)
        dim, unbiased = None, dim
    if correction is None and unbiased is not None:
        correction = 1 if unbiased else 0
    return _var_mean(x, dim, correction, keepdim)


@register_lowering(aten.std)
def std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    if isinstance(dim, bool):  # the .default overload: var(x, unbiased)
        dim, unbiased = None, dim
    value = var(x, dim, unbiased, keepdim, correction)
    dtype = value.get_dtype()
    acc = _accumulate_dtype(dtype)
    return _map(value, lambda v: ops.to_dtype(ops.sqrt(ops.to_dtype(v, acc)), dtype), dtype, "std")


def sumexp(x, dims, keepdim):
    """sum(exp(x - amax(x))) over ``dims`` as one reduction (the online-softmax rewrite)."""
    dtype = x.get_dtype()
    acc = _accumulate_dtype(dtype)
    result = make_reduction(x, dims, keepdim, "sumexp", acc, acc, origin="sum")
    return result if acc == dtype else _map(result, lambda v: ops.to_dtype(v, dtype), dtype, "sum")


def sumexp_of_finite_shift(x, row_max, dims, keepdim):
    """sum(exp(x - where(abs(m) == inf, 0, m))) over ``dims`` for m = ``row_max`` =
    amax(x, dims, keepdim=True), logsumexp's form, from one sumexp reduction: the two
    sums differ only in rows whose max is +inf (exp(x - 0) sums to inf there, exp(x - m)
    to NaN); rows of -inf sum to 0 either way, and a NaN max gives NaN either way."""
    total = sumexp(x, dims, True)
    dtype = total.get_dtype()
    total_loader, max_loader = total.make_loader(), row_max.make_loader()

    def inner_fn(index):
        infinite = ops.eq(max_loader(index), ops.constant(math.inf, row_max.get_dtype()))
        return ops.where(infinite, ops.constant(math.inf, dtype), total_loader(index))
    origins = tuple(dict.fromkeys(origins_of([total, row_max]) + ("sum",)))
    result = TensorBox.create(Pointwise(x.get_device(), dtype, inner_fn, list(total.get_size()), origins=origins))
    if keepdim:
        return result
    return view(result, [s for d, s in enumerate(total.get_size()) if d not in dims])

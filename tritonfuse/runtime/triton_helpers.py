"""@triton.jit helpers that generated kernels call as ``tf_helpers.*``.

Everything here is written with core ``tl`` ops only, so it runs both compiled and in
Triton's interpreter (which lacks libdevice). NaN handling follows eager PyTorch:
max/min propagate NaN; argmax/argmin treat NaN as the largest/smallest value and pick
the first index among equals.
"""
import triton
import triton.language as tl

# libdevice's math beyond the basics for the interpreter (tf_helpers.asin ...), and sqrt
from .triton_math import (  # noqa: F401
    acos, acosh, asin, asinh, atan, atan2, atanh, copysign, cosh, erfc, erfcx, hypot, lgamma, log10, nextafter,
    signbit, sinh, sqrt,
)
# loops with a per-lane trip count: the orthogonal polynomials' recurrences, Hurwitz zeta
from .triton_special import (  # noqa: F401
    airy_ai_series, chebyshev_loop, hermite_h_loop, hermite_he_loop, igamma_series, igammac_fraction,
    igammac_series, laguerre_loop, legendre_loop, zeta,
)
# integer loops: eager's integer power and gcd
from .triton_integer import gcd, pow_int  # noqa: F401


@triton.jit
def is_nan(x):
    return x != x


@triton.jit
def maximum(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _max_combine(a, b):
    return maximum(a, b)


@triton.jit
def _min_combine(a, b):
    return minimum(a, b)


@triton.jit
def max2(values, axis: tl.constexpr):
    return tl.reduce(values, axis, _max_combine)


@triton.jit
def min2(values, axis: tl.constexpr):
    return tl.reduce(values, axis, _min_combine)


# The interpreter's tl.max / tl.min are numpy's nanmax / nanmin (NaN skipped) and run
# vectorized, while a tl.reduce with a combine function of its own calls it once per
# element pair in Python. Interpreted launches (triton_launcher.py) take these forms of
# max2 / min2: the vectorized reduction, with the NaN of any row that has one put back.

@triton.jit
def _nan_of_rows(values, axis: tl.constexpr, reduced):
    nans = tl.sum(tl.where(values != values, values, 0), axis).to(reduced.dtype)  # NaN or 0
    return tl.where(nans != nans, nans, reduced)


@triton.jit
def max2_interpreted(values, axis: tl.constexpr):
    return _nan_of_rows(values, axis, tl.max(values, axis).to(values.dtype))   # (ints below 32 bits widen)


@triton.jit
def min2_interpreted(values, axis: tl.constexpr):
    return _nan_of_rows(values, axis, tl.min(values, axis).to(values.dtype))


@triton.jit
def _prod_combine(a, b):
    return a * b


@triton.jit
def prod(values, axis: tl.constexpr):
    return tl.reduce(values, axis, _prod_combine)


@triton.jit
def _any_combine(a, b):
    return a | b


@triton.jit
def any(values, axis: tl.constexpr):
    return tl.reduce(values, axis, _any_combine)


@triton.jit
def _all_combine(a, b):
    return a & b


@triton.jit
def all(values, axis: tl.constexpr):
    return tl.reduce(values, axis, _all_combine)


@triton.jit
def argmax_better(value, index, best, best_index):
    """True where (value, index) should replace (best, best_index) for argmax."""
    value_nan = value != value
    best_nan = best != best
    greater = (value > best) | (value_nan & ~best_nan)
    equal = (value == best) | (value_nan & best_nan)
    return greater | (equal & (index < best_index))


@triton.jit
def argmin_better(value, index, best, best_index):
    value_nan = value != value
    best_nan = best != best
    less = (value < best) | (value_nan & ~best_nan)
    equal = (value == best) | (value_nan & best_nan)
    return less | (equal & (index < best_index))


@triton.jit
def _argmax_combine(value_a, index_a, value_b, index_b):
    take_b = argmax_better(value_b, index_b, value_a, index_a)
    return tl.where(take_b, value_b, value_a), tl.where(take_b, index_b, index_a)


@triton.jit
def _argmin_combine(value_a, index_a, value_b, index_b):
    take_b = argmin_better(value_b, index_b, value_a, index_a)
    return tl.where(take_b, value_b, value_a), tl.where(take_b, index_b, index_a)


@triton.jit
def argmax(values, indices, axis: tl.constexpr):
    _, index = tl.reduce((values, indices), axis, _argmax_combine)
    return index


@triton.jit
def argmin(values, indices, axis: tl.constexpr):
    _, index = tl.reduce((values, indices), axis, _argmin_combine)
    return index


# ---- math that libdevice provides on GPUs, in core tl for the interpreter ------------

@triton.jit
def tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def expm1(x):
    """Kahan's (u - 1) x / log(u), u = exp(x): a few ulps everywhere (exp(x) - 1 loses the
    digits of small x: 1e-8 relative at x = 1e-8 in float64)."""
    u = tl.exp(x)
    m = u - 1.0
    r = m * (x / tl.log(tl.where(m == 0.0, 2.0, u)))
    r = tl.where(m == 0.0, x, tl.where(m == -1.0, -1.0, r))
    return tl.where(u == float("inf"), u, r)


@triton.jit
def log1p(x):
    """Goldberg's log(u) x / (u - 1), u = 1 + x: a few ulps everywhere (log(1 + x) keeps
    only the digits of x that 1 + x holds)."""
    u = 1.0 + x
    m = u - 1.0
    r = tl.log(u) * (x / tl.where(m == 0.0, 1.0, m))
    r = tl.where(m == 0.0, x, r)
    return tl.where(x == float("inf"), x, r)


@triton.jit
def rsqrt(x):
    return 1.0 / tl.sqrt(x)


@triton.jit
def trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def nearbyint(x):
    """Round half to even, like torch.round."""
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def pow(a, b):
    # where() rather than & on the tests: either operand may be a Python float constant
    magnitude = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = tl.where(b_int, (b - 2.0 * tl.floor(b * 0.5)) != 0.0, False)
    signed = tl.where(b_odd, -magnitude, magnitude)
    result = tl.where(a < 0, tl.where(b_int, signed, float("nan")), magnitude)
    return tl.where(b == 0, 1.0, result)


@triton.jit
def tan(x):
    return tl.sin(x) / tl.cos(x)


@triton.jit
def welford_combine(mean_a, m2_a, weight_a, mean_b, m2_b, weight_b):
    """Merge two Welford partial results (Chan et al.); empty partials have weight 0."""
    weight = weight_a + weight_b
    delta = mean_b - mean_a
    share_b = tl.where(weight == 0.0, 0.0, weight_b / tl.where(weight == 0.0, 1.0, weight))
    return mean_a + delta * share_b, m2_a + m2_b + delta * delta * weight_a * share_b, weight


@triton.jit
def welford(mean, m2, weight, axis: tl.constexpr):
    return tl.reduce((mean, m2, weight), axis, welford_combine)


@triton.jit
def exp_shifted(value, shift):
    """exp(value - shift), 0 where both are -inf (an empty or fully masked lane)."""
    return tl.where(shift == float("-inf"), 0.0, tl.exp(value - shift))


@triton.jit
def online_softmax_update(running_max, running_sum, value):
    """One step of the online softmax sum: rescale the sum when the max grows."""
    new_max = maximum(running_max, value)
    new_sum = running_sum * exp_shifted(running_max, new_max) + exp_shifted(value, new_max)
    return new_max, new_sum


@triton.jit
def online_softmax_merge(running_max, running_sum, axis: tl.constexpr):
    """Merge the lanes' (max, sum) pairs into sum(exp(v - max(v))) along ``axis``."""
    row_max = max2(running_max, axis)
    if axis == 1:
        shift = row_max[:, None]
    else:
        shift = row_max[None, :]
    return tl.sum(running_sum * exp_shifted(running_max, shift), axis)


# ---- integer division: C's truncating / and %, without LLVM's undefined cases ----------
# sdiv/srem are undefined for a zero divisor and for INT_MIN / -1, and LLVM may fold code
# around them on that assumption. A zero divisor gives 0 (eager's CUDA result there is
# unspecified; the C++ backend raises eager's CPU error), INT_MIN // -1 wraps to INT_MIN
# and INT_MIN % -1 is 0, as in eager.

@triton.jit
def _safe_divisor(b):
    if b.dtype.is_int_signed():
        return tl.where((b == 0) | (b == -1), 1, b)
    return tl.where(b == 0, 1, b)


@triton.jit
def div_trunc(a, b):
    q = a // _safe_divisor(b)
    if b.dtype.is_int_signed():
        q = tl.where(b == -1, -a, q)
    return tl.where(b == 0, 0, q)


@triton.jit
def mod_trunc(a, b):
    r = a % _safe_divisor(b)
    return tl.where(b == 0, 0, r)


# ---- shifts: eager's values for amounts outside [0, bits) ------------------------------
# (LLVM's shl/ashr/lshr give poison there.) a << b is 0; a >> b fills with the sign bit
# for signed a and is 0 for unsigned a.

@triton.jit
def _shift_out_of_range(b):
    return (b < 0) | (b >= b.dtype.primitive_bitwidth)


@triton.jit
def shift_left(a, b):
    out_of_range = _shift_out_of_range(b)
    return tl.where(out_of_range, 0, a << tl.where(out_of_range, 0, b))


@triton.jit
def shift_right(a, b):
    out_of_range = _shift_out_of_range(b)
    if b.dtype.is_int_signed():
        return a >> tl.where(out_of_range, b.dtype.primitive_bitwidth - 1, b)
    return tl.where(out_of_range, 0, a >> tl.where(out_of_range, 0, b))


# ---- scans (ops_table.SCAN_TYPES): the combine step, the inclusive scan of a block along
# an axis, and the block's total (what a looped kernel carries into the next block) -----

@triton.jit
def scan_sum(a, b):
    return a + b


# the reductions' combine steps and totals serve the scans of the same op
scan_prod, scan_max, scan_min = _prod_combine, _max_combine, _min_combine
prod_total, max_total, min_total = prod, max2, min2


@triton.jit
def scan_logaddexp(a, b):
    """log(exp(a) + exp(b)) as eager's logcumsumexp: NaN propagates, two equal infinities
    give that infinity."""
    hi = maximum(a, b)
    lo = minimum(a, b)
    same_infinity = (lo == hi) & (tl.abs(hi) == float("inf"))
    return tl.where(same_infinity, hi, hi + log1p(tl.exp(lo - hi)))


@triton.jit
def sum_scan(values, axis: tl.constexpr):
    return tl.associative_scan(values, axis, scan_sum)


@triton.jit
def prod_scan(values, axis: tl.constexpr):
    return tl.associative_scan(values, axis, _prod_combine)


@triton.jit
def logaddexp_scan(values, axis: tl.constexpr):
    return tl.associative_scan(values, axis, scan_logaddexp)


@triton.jit
def sum_total(values, axis: tl.constexpr):
    return tl.reduce(values, axis, scan_sum)


@triton.jit
def logaddexp_total(values, axis: tl.constexpr):
    return tl.reduce(values, axis, scan_logaddexp)


@triton.jit
def max_scan(values, axis: tl.constexpr):
    return tl.associative_scan(values, axis, _max_combine)


@triton.jit
def min_scan(values, axis: tl.constexpr):
    return tl.associative_scan(values, axis, _min_combine)


# cummax's (value, position) step, in the order a sequential scan takes values (a NaN
# always takes over, a later equal value wins): of two NaNs or two equal values the later
# position, else a NaN, else the larger. Comparing positions rather than relying on which
# operand comes first gives the same pair whatever order tl.reduce combines in.
@triton.jit
def scan_argmax(value_a, index_a, value_b, index_b):
    a_nan = is_nan(value_a)
    b_nan = is_nan(value_b)
    later = index_b > index_a
    take = (b_nan & (~a_nan | later)) | (~a_nan & ~b_nan & ((value_b > value_a) | ((value_b == value_a) & later)))
    return tl.where(take, value_b, value_a), tl.where(take, index_b, index_a)


@triton.jit
def scan_argmin(value_a, index_a, value_b, index_b):
    a_nan = is_nan(value_a)
    b_nan = is_nan(value_b)
    later = index_b > index_a
    take = (b_nan & (~a_nan | later)) | (~a_nan & ~b_nan & ((value_b < value_a) | ((value_b == value_a) & later)))
    return tl.where(take, value_b, value_a), tl.where(take, index_b, index_a)


@triton.jit
def argmax_scan(values, indices, axis: tl.constexpr):
    return tl.associative_scan((values, indices), axis, scan_argmax)


@triton.jit
def argmin_scan(values, indices, axis: tl.constexpr):
    return tl.associative_scan((values, indices), axis, scan_argmin)


@triton.jit
def argmax_total(values, indices, axis: tl.constexpr):
    return tl.reduce((values, indices), axis, scan_argmax)


@triton.jit
def argmin_total(values, indices, axis: tl.constexpr):
    return tl.reduce((values, indices), axis, scan_argmin)


# ---- conversions ----------------------------------------------------------------------

@triton.jit
def round_to_bfloat16(x):
    """float32 ``x`` as bfloat16, rounded to the nearest (ties to even; NaN stays NaN,
    overflow gives inf, subnormals kept): what a compiled store into a bfloat16 buffer
    does. Triton's interpreter truncates instead (and flushes subnormals), so this rounds
    with integer ops and returns the bfloat16 bits, which a store copies as they are."""
    x = x.to(tl.float32)
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    rounded = tl.where(x != x, (bits >> 16) | 0x40, rounded)   # a quiet NaN of the same sign
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def bfloat16_to_float32(x):
    """bfloat16 ``x`` widened to float32, exactly (subnormals included)."""
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)

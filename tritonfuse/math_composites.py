"""Composite math functions, written once in terms of the op table's primitives.

Each function takes its operands (``ops`` values) and the computation dtype (float32 or
float64: lowerings upcast 16-bit floats), and follows eager PyTorch's formulas and special
values, so the results agree with eager to rounding. No backend ever sees these names.

    fmax fmin logaddexp logaddexp2 heaviside sinc angle xlog1py entr  (one-liners)
    spherical_bessel_j0
    digamma trigamma erfinv ndtri log_ndtr                            (recurrences, Halley steps)
    i0 i0e i1 i1e                                                     (Chebyshev series)

The series coefficients come from scripts/gen_special_coefficients.py.
"""
import math

import torch

from .ops_table import isinf
from .virtualized import ops


def _c(value, dtype):
    return ops.constant(value, dtype)


def polynomial(x, coefficients, dtype):
    """Horner's rule; ``coefficients`` from the highest power down."""
    result = _c(coefficients[0], dtype)
    for c in coefficients[1:]:
        result = ops.add(ops.mul(result, x), _c(c, dtype))
    return result


def chebyshev(t, coefficients, dtype):
    """sum_k c_k T_k(t) for t in [-1, 1] (Clenshaw's recurrence). Terms too small to show in
    ``dtype`` are left out."""
    floor = abs(coefficients[0]) * (1e-9 if dtype != torch.float64 else 1e-18)
    terms = list(coefficients)
    while len(terms) > 1 and abs(terms[-1]) < floor:
        terms.pop()
    if len(terms) == 1:
        return _c(terms[0], dtype)
    two_t = ops.add(t, t)
    b1, b2 = _c(terms[-1], dtype), None       # b_k = c_k + 2 t b_(k+1) - b_(k+2)
    for c in reversed(terms[1:-1]):
        step = ops.mul(two_t, b1) if b2 is None else ops.sub(ops.mul(two_t, b1), b2)
        b1, b2 = ops.add(_c(c, dtype), step), b1
    last = ops.mul(t, b1) if b2 is None else ops.sub(ops.mul(t, b1), b2)
    return ops.add(_c(terms[0], dtype), last)


# ---- one-liners --------------------------------------------------------------------------

def fmax(a, b, dtype):
    """The larger value, ignoring NaN unless both are NaN."""
    if not dtype.is_floating_point:
        return ops.logical_or(a, b) if dtype == torch.bool else ops.maximum(a, b)
    return ops.where(ops.logical_or(ops.isnan(b), ops.gt(a, b)), a, b)


def fmin(a, b, dtype):
    if not dtype.is_floating_point:
        return ops.logical_and(a, b) if dtype == torch.bool else ops.minimum(a, b)
    return ops.where(ops.logical_or(ops.isnan(b), ops.lt(a, b)), a, b)


def _logaddexp(a, b, dtype, exp_name, scale):
    """max + log1p(exp(-|a - b|)) * scale; +-inf when both are the same infinity."""
    larger = ops.where(ops.lt(a, b), b, a)
    correction = ops.log1p(getattr(ops, exp_name)(ops.neg(ops.abs(ops.sub(a, b)))))
    if scale != 1:
        correction = ops.mul(correction, _c(scale, dtype))
    same_infinity = ops.logical_and(isinf(a, dtype), ops.eq(a, b))
    return ops.where(same_infinity, a, ops.add(larger, correction))


def logaddexp(a, b, dtype):
    return _logaddexp(a, b, dtype, "exp", 1)


def logaddexp2(a, b, dtype):
    return _logaddexp(a, b, dtype, "exp2", 1 / math.log(2))


def heaviside(x, values, dtype):
    if dtype == torch.bool:
        return ops.where(x, _c(True, dtype), values)
    zero = _c(0, dtype)
    return ops.where(ops.eq(x, zero), values, ops.to_dtype(ops.gt(x, zero), dtype))


def sinc(x, dtype):
    """sin(pi x) / (pi x), 1 at 0."""
    product = ops.mul(_c(math.pi, dtype), x)
    return ops.where(ops.eq(x, _c(0, dtype)), _c(1, dtype), ops.truediv(ops.sin(product), product))


def angle(x, dtype):
    """The argument of a real number: pi below 0, 0 from 0 up, NaN kept."""
    value = ops.where(ops.lt(x, _c(0, dtype)), _c(math.pi, dtype), _c(0, dtype))
    return ops.where(ops.isnan(x), x, value)


def xlog1py(x, y, dtype):
    """x * log1p(y), 0 where x == 0 (unless y is NaN)."""
    product = ops.where(ops.eq(x, _c(0, dtype)), _c(0, dtype), ops.mul(x, ops.log1p(y)))
    return ops.where(ops.isnan(y), _c(math.nan, dtype), product)


def entr(x, dtype):
    """-x log(x) for x > 0, 0 at 0, -inf below."""
    zero = _c(0, dtype)
    negative = ops.where(ops.eq(x, zero), zero, _c(-math.inf, dtype))
    value = ops.where(ops.gt(x, zero), ops.neg(ops.mul(x, ops.log(x))), negative)
    return ops.where(ops.isnan(x), x, value)


# ---- polygamma -----------------------------------------------------------------------------

DIGAMMA_10 = 2.2517525890667211076
# B_2k / 2k for k = 7 .. 1: digamma(x) ~ log x - 1/(2x) - sum_k B_2k / (2k x^2k)
DIGAMMA_ASYMPTOTIC = (1 / 12, -691 / 32760, 1 / 132, -1 / 240, 1 / 252, -1 / 120, 1 / 12)


def digamma(x, dtype):
    """Reflection for x < 0, the recurrence psi(x) = psi(x + 1) - 1/x up to x >= 10, then
    the asymptotic series (as eager, step for step)."""
    zero, one, ten = _c(0, dtype), _c(1, dtype), _c(10, dtype)
    negative = ops.lt(x, zero)
    fraction = ops.sub(x, ops.trunc(x))
    pi_over_tan = ops.truediv(_c(math.pi, dtype), ops.tan(ops.mul(_c(math.pi, dtype), fraction)))
    y = ops.where(negative, ops.sub(one, x), x)
    result = zero
    for _ in range(10):   # y > 0 reaches 10 in at most 10 steps
        below = ops.lt(y, ten)
        result = ops.where(below, ops.sub(result, ops.reciprocal(y)), result)
        y = ops.where(below, ops.add(y, one), y)
    z = ops.reciprocal(ops.mul(y, y))
    series = ops.where(ops.lt(y, _c(1e17, dtype)), ops.mul(z, polynomial(z, DIGAMMA_ASYMPTOTIC, dtype)), zero)
    asymptotic = ops.sub(ops.sub(ops.add(result, ops.log(y)), ops.truediv(_c(0.5, dtype), y)), series)
    value = ops.where(ops.eq(y, ten), ops.add(result, _c(DIGAMMA_10, dtype)), asymptotic)
    value = ops.where(negative, ops.sub(value, pi_over_tan), value)
    pole = ops.logical_and(negative, ops.eq(x, ops.trunc(x)))
    value = ops.where(pole, _c(math.nan, dtype), value)
    # psi(+-0) = -+inf
    return ops.where(ops.eq(x, zero), ops.where(ops.signbit(x), _c(math.inf, dtype), _c(-math.inf, dtype)), value)


def trigamma(x, dtype):
    """Reflection below 1/2, six recurrence steps, then the asymptotic series."""
    one = _c(1, dtype)
    reflect = ops.lt(x, _c(0.5, dtype))
    sin_pi_x = ops.sin(ops.mul(_c(math.pi, dtype), x))
    result = ops.where(reflect, ops.neg(ops.truediv(_c(math.pi ** 2, dtype), ops.mul(sin_pi_x, sin_pi_x))),
                       _c(0, dtype))
    y = ops.where(reflect, ops.sub(one, x), x)
    for _ in range(6):
        result = ops.add(result, ops.reciprocal(ops.mul(y, y)))
        y = ops.add(y, one)
    inv_square = ops.reciprocal(ops.mul(y, y))
    series = ops.mul(inv_square, ops.sub(_c(1 / 6, dtype), ops.mul(inv_square, ops.sub(
        _c(1 / 30, dtype), ops.mul(inv_square, _c(1 / 42, dtype))))))
    tail = ops.truediv(ops.add(ops.add(one, ops.truediv(one, ops.add(y, y))), series), y)
    result = ops.add(result, tail)
    return ops.where(reflect, ops.neg(result), result)


# ---- inverse error function and the normal distribution -----------------------------------

def erfinv(y, dtype):
    """Winitzki's closed-form guess (relative error < 2e-3), refined by two Halley steps
    on erf (cubic convergence: float64-accurate)."""
    one, zero = _c(1, dtype), _c(0, dtype)
    a = ops.abs(y)
    log_term = ops.log(ops.mul(ops.sub(one, a), ops.add(one, a)))   # log(1 - y^2), exact factors
    k = 0.147
    u = ops.add(_c(2 / (math.pi * k), dtype), ops.mul(log_term, _c(0.5, dtype)))
    guess = ops.sqrt(ops.sub(ops.sqrt(ops.sub(ops.mul(u, u), ops.mul(log_term, _c(1 / k, dtype)))), u))
    x = ops.copysign(guess, y)
    two_over_sqrt_pi = _c(2 / math.sqrt(math.pi), dtype)
    for _ in range(2):
        error = ops.sub(ops.erf(x), y)
        slope = ops.mul(two_over_sqrt_pi, ops.exp(ops.neg(ops.mul(x, x))))
        # Halley: erf'' = -2x erf', so x -= f / (f' + x f)
        x = ops.sub(x, ops.truediv(error, ops.add(slope, ops.mul(x, error))))
    x = ops.where(ops.eq(a, one), ops.where(ops.lt(y, zero), _c(-math.inf, dtype), _c(math.inf, dtype)), x)
    x = ops.where(ops.gt(a, one), _c(math.nan, dtype), x)
    return ops.where(ops.eq(y, zero), y, x)   # keeps -0


SQRT1_2 = math.sqrt(0.5)


def _ndtr(x, dtype):
    """Phi(x) = erfc(-x / sqrt 2) / 2: relative accuracy in the lower tail."""
    return ops.mul(_c(0.5, dtype), ops.erfc(ops.mul(x, _c(-SQRT1_2, dtype))))


def ndtri(p, dtype):
    """The normal quantile: Abramowitz & Stegun 26.2.23 for the lower tail q = min(p, 1 - p)
    (error < 4.5e-4), refined by two Halley steps on Phi, mirrored for p > 1/2."""
    one, half = _c(1, dtype), _c(0.5, dtype)
    upper = ops.gt(p, half)
    q = ops.where(upper, ops.sub(one, p), p)          # exact for p >= 1/2
    t = ops.sqrt(ops.mul(_c(-2, dtype), ops.log(q)))
    numerator = polynomial(t, (0.010328, 0.802853, 2.515517), dtype)
    denominator = polynomial(t, (0.001308, 0.189269, 1.432788, 1.0), dtype)
    x = ops.neg(ops.sub(t, ops.truediv(numerator, denominator)))
    inv_sqrt_2pi = _c(1 / math.sqrt(2 * math.pi), dtype)
    for _ in range(2):
        error = ops.sub(_ndtr(x, dtype), q)
        density = ops.mul(inv_sqrt_2pi, ops.exp(ops.mul(ops.mul(x, x), _c(-0.5, dtype))))
        # Halley: Phi'' = -x Phi', so x -= f / (f' + x f / 2)
        x = ops.sub(x, ops.truediv(error, ops.add(density, ops.mul(ops.mul(x, error), half))))
    x = ops.where(upper, ops.neg(x), x)
    x = ops.where(ops.eq(p, _c(0, dtype)), _c(-math.inf, dtype), x)
    x = ops.where(ops.eq(p, one), _c(math.inf, dtype), x)
    outside = ops.logical_or(ops.lt(p, _c(0, dtype)), ops.gt(p, one))
    return ops.where(ops.logical_or(outside, ops.isnan(p)), _c(math.nan, dtype), x)


def log_ndtr(x, dtype):
    """log Phi(x): log(erfcx(-t) / 2) - t^2 in the lower tail (x < -1), log1p(-erfc(t) / 2)
    above, t = x / sqrt 2."""
    t = ops.mul(x, _c(SQRT1_2, dtype))
    lower = ops.sub(ops.log(ops.mul(ops.erfcx(ops.neg(t)), _c(0.5, dtype))), ops.mul(t, t))
    upper = ops.log1p(ops.mul(ops.erfc(t), _c(-0.5, dtype)))
    return ops.where(ops.lt(x, _c(-1, dtype)), lower, upper)


def spherical_bessel_j0(x, dtype):
    """sin(x) / x: its Taylor series to x^12 for |x| < 1/2, 0 at +-inf."""
    z = ops.mul(x, x)
    series = polynomial(z, (1 / 6227020800, -1 / 39916800, 1 / 362880, -1 / 5040, 1 / 120, -1 / 6, 1), dtype)
    value = ops.where(ops.lt(ops.abs(x), _c(0.5, dtype)), series, ops.truediv(ops.sin(x), x))
    return ops.where(isinf(x, dtype), _c(0, dtype), value)


# ---- modified Bessel functions of the first kind -----------------------------------------
# Chebyshev series of the exponentially scaled functions on [0, 8] (t = x / 4 - 1) and,
# times sqrt(x), on [8, inf) (t = 16 / x - 1).

I0_SMALL = (
    3.3839763720473804e-1, -3.046826723431984e-1, 1.7162090152220878e-1,
    -9.4901097048047644e-2, 4.9305284239670708e-2, -2.3737414805899469e-2,
    1.0546460394594998e-2, -4.3243099950505759e-3, 1.6394756169413358e-3,
    -5.7637557453858237e-4, 1.8850288509584166e-4, -5.7541950100821037e-5,
    1.6448448070728897e-5, -4.4167383584587506e-6, 1.1173875391201037e-6,
    -2.6707938539406117e-7, 6.0469950225419189e-8, -1.300025009986248e-8,
    2.6598237246823867e-9, -5.1897956016352629e-10, 9.6758090353732369e-11,
    -1.7268262914415557e-11, 2.9550526631296398e-12, -4.8564467831119295e-13,
    7.6761854986049356e-14, -1.1685332877993452e-14, 1.715391285555133e-15,
    -2.4312798465479547e-16, 3.3307945188222381e-17, -4.4153416464793394e-18,
    5.6691780069214962e-19,
)
I0_LARGE = (
    4.0224520550705442e-1, 3.3691164782556941e-3, 6.889758346916824e-5,
    2.8913705208347565e-6, 2.0489185894690637e-7, 2.2666689904981781e-8,
    3.3962320257083863e-9, 4.9406023882249696e-10, 1.1889147107846438e-11,
    -3.1499165279632414e-11, -1.3215811840447713e-11, -1.7941785315068061e-12,
    7.1801244513836662e-13, 3.8527783827421427e-13, 1.5400862175214098e-14,
    -4.1505693472872221e-14, -9.5548466988283076e-15, 3.8116806693526224e-15,
    1.7725601330565264e-15, -3.4254856196772191e-16, -2.8276239805165835e-16,
    3.4612228676974611e-17, 4.46562142029676e-17, -4.8305044859441821e-18,
    -7.233180487874754e-18, 9.9214754121736986e-19, 1.1936508908459821e-18,
)
I1_SMALL = (
    1.2629359322181683e-1, -1.7641651835783406e-1, 1.026436586898471e-1,
    -5.2945981208094991e-2, 2.4726449030626517e-2, -1.0564084894626198e-2,
    4.1564229443128882e-3, -1.5135724506312531e-3, 5.1228595616857577e-4,
    -1.6176081582589675e-4, 4.7815651075500542e-5, -1.3273163656039436e-5,
    3.4702513081376785e-6, -8.5687202646954547e-7, 2.0032947535521353e-7,
    -4.4450591287963281e-8, 9.3815373864957718e-9, -1.8872497517228293e-9,
    3.625590281552117e-10, -6.6634897235020277e-11, 1.1736186298890902e-11,
    -1.9839743977649437e-12, 3.2237933659455747e-13, -5.0421855047279117e-14,
    7.6006842947354069e-15, -1.1055969477353863e-15, 1.5536319577362005e-16,
    -2.1114212143581661e-17, 2.7779141127610464e-18, -3.5415817725421362e-19,
)
I1_LARGE = (
    3.8928811750914006e-1, -9.7610974913614684e-3, -1.1058893876262372e-4,
    -3.8825648088776904e-6, -2.5122362378702089e-7, -2.6314688468895195e-8,
    -3.835380385964237e-9, -5.5897434621965838e-10, -1.8974958123505412e-11,
    3.2526035830154882e-11, 1.4125807436613781e-11, 2.0356285441470895e-12,
    -7.1985517762459085e-13, -4.0835511110921973e-13, -2.1015418427726643e-14,
    4.2724400167119514e-14, 1.0420276984128803e-14, -3.8144030724370078e-15,
    -1.8803547755107824e-15, 3.3082023109209283e-16, 2.9626289976459501e-16,
    -3.209525921993424e-17, -4.6503053684893583e-17, 4.4143483230717079e-18,
    7.5172963108421048e-18, -9.3141788673268834e-19, -1.242193275194891e-18,
)


def _scaled_bessel(a, small, large, dtype):
    """(series on [0, 8], series on [8, inf) / sqrt(a)) selected by a = |x|."""
    near = chebyshev(ops.sub(ops.mul(a, _c(0.25, dtype)), _c(1, dtype)), small, dtype)
    far = ops.truediv(chebyshev(ops.sub(ops.truediv(_c(16, dtype), a), _c(1, dtype)), large, dtype), ops.sqrt(a))
    return ops.le(a, _c(8, dtype)), near, far


def i0e(x, dtype):
    a = ops.abs(x)
    is_near, near, far = _scaled_bessel(a, I0_SMALL, I0_LARGE, dtype)
    return ops.where(is_near, near, far)


def i0(x, dtype):
    a = ops.abs(x)
    is_near, near, far = _scaled_bessel(a, I0_SMALL, I0_LARGE, dtype)
    return ops.mul(ops.exp(a), ops.where(is_near, near, far))


def i1e(x, dtype):
    a = ops.abs(x)
    is_near, near, far = _scaled_bessel(a, I1_SMALL, I1_LARGE, dtype)
    return ops.where(is_near, ops.mul(near, x), ops.copysign(far, x))


def i1(x, dtype):
    return ops.mul(ops.exp(ops.abs(x)), i1e(x, dtype))

"""Pure-``tl`` versions of libdevice's math, for Triton's interpreter (which has no
libdevice; compiled kernels call libdevice, see codegen/triton/overrides.py), and ``sqrt``,
which both use.

Operands are float32 or float64 tensors. Each function computes in float64, where these
formulas lose nothing that a float32 result could show, and rounds once to the operand's
dtype. Special values (+-0, +-inf, NaN) follow C99 / eager PyTorch. Accuracy: float32 results
are correctly rounded but for rare double roundings; float64 ones are within a few ulp
(asin/acos/atan/atan2 to ~1e-15 relative; lgamma 1e-15 absolute near its zeros).
"""
import triton
import triton.language as tl

PI = 3.141592653589793
HALF_PI = 1.5707963267948966
QUARTER_PI = 0.7853981633974483
LN2 = 0.6931471805599453
LN10 = 2.302585092994046
HALF_LOG_2PI = 0.9189385332046728  # log(2 pi) / 2


@triton.jit
def sqrt(x):
    """Correctly rounded: tl.sqrt_rn for float32 (tl.sqrt is approximate there), tl.sqrt
    for float64 (always IEEE; sqrt_rn does not take it). (if/else, not an early return:
    Triton's compiler goes on past a return inside an if on a dtype and would type-check
    sqrt_rn on float64.)"""
    if x.dtype == tl.float64:
        result = tl.sqrt(x)
    else:
        result = tl.sqrt_rn(x)
    return result


@triton.jit
def signbit(x):
    if x.dtype == tl.float64:
        negative = x.to(tl.int64, bitcast=True) < 0
    else:
        negative = x.to(tl.int32, bitcast=True) < 0
    return negative


@triton.jit
def _f64(x):
    return x.to(tl.float64)


@triton.jit
def _copysign_f64(magnitude, sign_of):
    """|magnitude| with the sign bit of ``sign_of`` (both float64)."""
    return tl.where(signbit(sign_of), -tl.abs(magnitude), tl.abs(magnitude))


@triton.jit
def copysign(a, b):
    return tl.where(signbit(b), -tl.abs(a), tl.abs(a))


@triton.jit
def nextafter(a, b):
    """The next representable value after ``a`` towards ``b`` (bit arithmetic)."""
    if a.dtype == tl.float64:
        bits = a.to(tl.int64, bitcast=True)
        tiny = tl.full(bits.shape, 1, tl.int64).to(tl.float64, bitcast=True)
    else:
        bits = a.to(tl.int32, bitcast=True)
        tiny = tl.full(bits.shape, 1, tl.int32).to(tl.float32, bitcast=True)
    away_from_zero = (b > a) == (a > 0)
    stepped = tl.where(away_from_zero, bits + 1, bits - 1).to(a.dtype, bitcast=True)
    result = tl.where(a == 0, tl.where(b > 0, tiny, -tiny), stepped)
    result = tl.where(a == b, b, result)
    return tl.where((a != a) | (b != b), a + b, result)


@triton.jit
def _log1p_f64(v):
    """log(1 + v) without losing tiny v (Kahan: the rounding of 1 + v is divided out)."""
    u = 1.0 + v
    safe = tl.where((u == 1.0) | (u == float("inf")), 2.0, u)
    accurate = tl.log(safe) * (v / (safe - 1.0))
    return tl.where(u == 1.0, v, tl.where(u == float("inf"), v, accurate))


@triton.jit
def _atan_unit(t):
    """atan(t) for 0 <= t <= 1 (float64): two argument halvings bring t below
    tan(pi / 16), where the Taylor series to t^25 is exact to double precision."""
    t = t / (1.0 + tl.sqrt(1.0 + t * t))
    t = t / (1.0 + tl.sqrt(1.0 + t * t))
    z = t * t
    p = -1.0 / 27.0
    p = p * z + 1.0 / 25.0
    p = p * z - 1.0 / 23.0
    p = p * z + 1.0 / 21.0
    p = p * z - 1.0 / 19.0
    p = p * z + 1.0 / 17.0
    p = p * z - 1.0 / 15.0
    p = p * z + 1.0 / 13.0
    p = p * z - 1.0 / 11.0
    p = p * z + 1.0 / 9.0
    p = p * z - 1.0 / 7.0
    p = p * z + 1.0 / 5.0
    p = p * z - 1.0 / 3.0
    p = p * z + 1.0
    return 4.0 * t * p


@triton.jit
def _atan2_f64(y, x):
    ax = tl.abs(x)
    ay = tl.abs(y)
    swap = ay > ax
    num = tl.where(swap, ax, ay)
    den = tl.where(swap, ay, ax)
    both_zero = (ax == 0.0) & (ay == 0.0)
    both_inf = (ax == float("inf")) & (ay == float("inf"))
    ratio = num / tl.where(both_zero | both_inf, 1.0, den)
    r = _atan_unit(ratio)
    r = tl.where(swap, HALF_PI - r, r)
    r = tl.where(both_zero, 0.0, r)
    r = tl.where(both_inf, QUARTER_PI, r)
    r = tl.where(signbit(x), PI - r, r)
    r = _copysign_f64(r, y)
    return tl.where((x != x) | (y != y), x + y, r)


@triton.jit
def atan2(y, x):
    return _atan2_f64(_f64(y), _f64(x)).to(y.dtype)


@triton.jit
def atan(x):
    return _atan2_f64(_f64(x), tl.full(x.shape, 1.0, tl.float64)).to(x.dtype)


@triton.jit
def asin(x):
    v = _f64(x)
    return _atan2_f64(v, tl.sqrt((1.0 - v) * (1.0 + v))).to(x.dtype)


@triton.jit
def acos(x):
    v = _f64(x)
    return _atan2_f64(tl.sqrt((1.0 - v) * (1.0 + v)), v).to(x.dtype)


@triton.jit
def _sinh_small(v):
    """sinh(v) for |v| < 0.5: Taylor to v^13 (error < 3e-17 relative)."""
    z = v * v
    p = 1.0 / 6227020800.0
    p = p * z + 1.0 / 39916800.0
    p = p * z + 1.0 / 362880.0
    p = p * z + 1.0 / 5040.0
    p = p * z + 1.0 / 120.0
    p = p * z + 1.0 / 6.0
    return v + v * z * p


@triton.jit
def sinh(x):
    v = _f64(x)
    a = tl.abs(v)
    e = tl.exp(a)
    mid = 0.5 * (e - 1.0 / e)
    big = tl.exp(a - LN2)   # e^a / 2, without overflowing e^a first
    r = tl.where(a < 0.5, tl.abs(_sinh_small(v)), tl.where(a > 20.0, big, mid))
    return _copysign_f64(r, v).to(x.dtype)


@triton.jit
def cosh(x):
    a = tl.abs(_f64(x))
    e = tl.exp(a)
    return tl.where(a > 20.0, tl.exp(a - LN2), 0.5 * (e + 1.0 / e)).to(x.dtype)


@triton.jit
def asinh(x):
    v = _f64(x)
    a = tl.abs(v)
    big = tl.log(a) + LN2
    small = _log1p_f64(a + a * a / (1.0 + tl.sqrt(1.0 + a * a)))
    return _copysign_f64(tl.where(a > 268435456.0, big, small), v).to(x.dtype)


@triton.jit
def acosh(x):
    v = _f64(x)
    t = v - 1.0
    big = tl.log(v) + LN2
    small = _log1p_f64(t + tl.sqrt(2.0 * t + t * t))
    r = tl.where(v > 268435456.0, big, small)
    return tl.where(v < 1.0, float("nan"), r).to(x.dtype)


@triton.jit
def atanh(x):
    v = _f64(x)
    a = tl.abs(v)
    r = 0.5 * _log1p_f64(2.0 * a / (1.0 - a))
    r = tl.where(a == 1.0, float("inf"), r)
    return _copysign_f64(tl.where(a > 1.0, float("nan"), r), v).to(x.dtype)


@triton.jit
def log10(x):
    return (tl.log(_f64(x)) * (1.0 / LN10)).to(x.dtype)


@triton.jit
def hypot(a, b):
    x = tl.abs(_f64(a))
    y = tl.abs(_f64(b))
    big = tl.maximum(x, y)
    small = tl.minimum(x, y)
    ratio = small / tl.where(big == 0.0, 1.0, big)
    r = big * tl.sqrt(1.0 + ratio * ratio)
    r = tl.where((x != x) | (y != y), x + y, r)
    return tl.where((x == float("inf")) | (y == float("inf")), float("inf"), r).to(a.dtype)


@triton.jit
def _erfcx_far(a):
    """exp(a^2) erfc(a) for a >= 2 (float64): the continued fraction
    1 / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...)))), 60 terms from the tail
    (converged to double precision from a = 2 on)."""
    t = tl.zeros_like(a)
    for k in range(60):
        t = ((60 - k) * 0.5) / (a + t)
    return 0.5641895835477563 / (a + t)


@triton.jit
def erfc(x):
    v = _f64(x)
    a = tl.abs(v)
    far = _erfcx_far(tl.maximum(a, 2.0)) * tl.exp(-a * a)
    far = tl.where(v < 0.0, 2.0 - far, far)
    r = tl.where(a < 2.0, 1.0 - tl.erf(v), far)     # 1 - erf loses nothing in float64 below 2
    return tl.where(v != v, v, r).to(x.dtype)


@triton.jit
def erfcx(x):
    v = _f64(x)
    near = tl.exp(v * v) * (1.0 - tl.erf(v))
    r = tl.where(v < 2.0, near, _erfcx_far(tl.maximum(v, 2.0)))
    return tl.where(v != v, v, r).to(x.dtype)


@triton.jit
def _lgamma_positive(v):
    """lgamma(v) for v >= 0.5 (Lanczos, g = 7, 9 terms: ~1e-15 relative in gamma)."""
    z = v - 1.0
    s = 0.99999999999980993
    s += 676.5203681218851 / (z + 1.0)
    s += -1259.1392167224028 / (z + 2.0)
    s += 771.32342877765313 / (z + 3.0)
    s += -176.61502916214059 / (z + 4.0)
    s += 12.507343278686905 / (z + 5.0)
    s += -0.13857109526572012 / (z + 6.0)
    s += 9.9843695780195716e-6 / (z + 7.0)
    s += 1.5056327351493116e-7 / (z + 8.0)
    t = z + 7.5
    return HALF_LOG_2PI + (z + 0.5) * tl.log(t) - t + tl.log(s)


@triton.jit
def lgamma(x):
    v = _f64(x)
    reflect = v < 0.5
    offset = v - tl.floor(v + 0.5)      # |sin(pi v)| = |sin(pi offset)|, offset exact in [-1/2, 1/2]
    sin_pi = tl.sin(PI * offset)
    reflected = tl.log(PI / tl.abs(sin_pi)) - _lgamma_positive(tl.where(reflect, 1.0 - v, 1.5))
    direct = _lgamma_positive(tl.where(reflect, 1.5, v))
    r = tl.where(reflect, reflected, direct)
    r = tl.where(v == float("inf"), v, tl.where(v == float("-inf"), -v, r))
    return r.to(x.dtype)

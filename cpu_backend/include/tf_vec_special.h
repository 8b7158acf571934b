// tritonfuse SIMD math, part 2: inverse trigonometric and hyperbolic functions, erfc,
// erfcx, hypot (vectorized for float), nextafter, signbit. Part of tritonfuse_vec.h.
//
// Float vectors: atan/atan2/asin/acos and hypot are evaluated in double lanes (two double
// registers per float register) and rounded once, so they are within 0.5 ulp + 1e-9;
// sinh/cosh/asinh/acosh/atanh/erfc/erfcx are built on the float exp/log/erf kernels of
// tf_vec_math.h (a few ulp). Double vectors go lane by lane through libm. Special inputs
// (+-0, +-inf, NaN) follow C99 / eager PyTorch.
#pragma once

#include "tf_vec_math.h"

namespace tf {
namespace detail {

constexpr double kPiD = 3.14159265358979323846;
constexpr double kTanPiOver8 = 0.41421356237309503;

TF_INLINE vd vabs_pd(vd x) { return (vd)((vl)x & 0x7fffffffffffffffLL); }
TF_INLINE vd vcopysign_pd(vd mag, vd sgn) {
    return (vd)(((vl)mag & 0x7fffffffffffffffLL) | ((vl)sgn & (int64_t)0x8000000000000000ULL));
}

// atan(t) for 0 <= t <= 1: t > tan(pi/8) moves to u = (t - 1) / (t + 1) around pi/4, then
// the odd Taylor series of atan to u^19 (|u| <= tan(pi/8): truncation < 5e-10 relative).
TF_INLINE vd atan_unit_pd(vd t) {
    const vl mid = t > kTanPiOver8;
    const vd u = mid ? (t - 1.0) / (t + 1.0) : t;
    const vd z = u * u;
    vd p = splatd(-1.0 / 19);
    p = p * z + 1.0 / 17;
    p = p * z - 1.0 / 15;
    p = p * z + 1.0 / 13;
    p = p * z - 1.0 / 11;
    p = p * z + 1.0 / 9;
    p = p * z - 1.0 / 7;
    p = p * z + 1.0 / 5;
    p = p * z - 1.0 / 3;
    p = p * z + 1.0;
    return u * p + (mid ? splatd(kPiD / 4) : splatd(0.0));
}
TF_INLINE vd atan_pd(vd x) {
    const vd a = vabs_pd(x);
    const vl inverted = a > 1.0;
    const vd r = atan_unit_pd(inverted ? 1.0 / a : a);  // atan(inf) = pi/2 - atan(0)
    return vcopysign_pd(inverted ? kPiD / 2 - r : r, x);
}
TF_INLINE vd atan2_pd(vd y, vd x) {
    const vd ax = vabs_pd(x), ay = vabs_pd(y);
    const vl swap = ay > ax;
    const vl both_zero = (ax == 0.0) & (ay == 0.0);
    const vl both_inf = (ax == (double)kInf) & (ay == (double)kInf);
    const vd num = swap ? ax : ay;
    const vd den = (both_zero | both_inf) ? splatd(1.0) : (swap ? ay : ax);
    vd r = atan_unit_pd(num / den);
    r = swap ? kPiD / 2 - r : r;
    r = both_zero ? splatd(0.0) : r;
    r = both_inf ? splatd(kPiD / 4) : r;
    r = ((vl)x < 0) ? kPiD - r : r;  // x negative, or -0
    r = vcopysign_pd(r, y);
    return ((x != x) | (y != y)) ? x + y : r;
}
// sqrt(1 - x^2), exact before the square root in double.
TF_INLINE vd cos_of_asin_pd(vd x) { return vsqrt((1.0 - x) * (1.0 + x)); }

template <typename F>
TF_INLINE vf via_double(vf x, F f) {
    vd lo, hi;
    split_to_double(x, lo, hi);
    return join_to_float(f(lo), f(hi));
}
template <typename F>
TF_INLINE vf via_double(vf x, vf y, F f) {
    vd xlo, xhi, ylo, yhi;
    split_to_double(x, xlo, xhi);
    split_to_double(y, ylo, yhi);
    return join_to_float(f(xlo, ylo), f(xhi, yhi));
}

TF_INLINE vf atan_ps(vf x) { return via_double(x, [](vd v) { return atan_pd(v); }); }
TF_INLINE vf atan2_ps(vf y, vf x) { return via_double(y, x, [](vd a, vd b) { return atan2_pd(a, b); }); }
TF_INLINE vf asin_ps(vf x) { return via_double(x, [](vd v) { return atan2_pd(v, cos_of_asin_pd(v)); }); }
TF_INLINE vf acos_ps(vf x) { return via_double(x, [](vd v) { return atan2_pd(cos_of_asin_pd(v), v); }); }
// hypot: a^2 + b^2 is exact in double for float inputs; inf wins over NaN (C99).
TF_INLINE vf hypot_ps(vf a, vf b) {
    const vf r = via_double(a, b, [](vd x, vd y) { return vsqrt(x * x + y * y); });
    return vselect((vabs(a) == kInf) | (vabs(b) == kInf), splat(kInf), r);
}

// e^a / 2 for large a without overflowing e^a: e^(a - 8) * (e^8 / 2), a - 8 exact.
constexpr float kHalfExp8 = 1490.47899f;
TF_INLINE vf sinh_ps(vf x) {
    const vf a = vabs(x);
    const vf e = expm1_ps(a);
    const vf r = 0.5f * (e + e / (e + 1.0f));  // exact for tiny a, no cancellation
    return vcopysign(vselect(a > 80.0f, exp_ps(a - 8.0f) * kHalfExp8, r), x);
}
TF_INLINE vf cosh_ps(vf x) {
    const vf a = vabs(x);
    const vf e = exp_ps(a);
    return vselect(a > 80.0f, exp_ps(a - 8.0f) * kHalfExp8, 0.5f * (e + 1.0f / e));
}
// asinh = log1p(a + a^2 / (1 + sqrt(1 + a^2))); log(2a) beyond 2^12 (error < 2e-9).
TF_INLINE vf asinh_ps(vf x) {
    const vf a = vabs(x);
    const vf small = log1p_ps(a + a * a / (1.0f + vsqrt(vfma(a, a, 1.0f))));
    const vf big = log_ps(a) + 0.693147181f;
    return vcopysign(vselect(a > 4096.0f, big, small), x);
}
TF_INLINE vf acosh_ps(vf x) {
    const vf t = x - 1.0f;  // exact
    const vf small = log1p_ps(t + vsqrt(vfma(t, t, t + t)));
    const vf r = vselect(x > 4096.0f, log_ps(x) + 0.693147181f, small);
    return vselect(x < 1.0f, splat(kNaN), r);
}
TF_INLINE vf atanh_ps(vf x) {
    const vf a = vabs(x);
    return vcopysign(0.5f * log1p_ps((a + a) / (1.0f - a)), x);  // |x| > 1 -> log1p(< -1) = nan
}
// erfcx(x) (x + 3) for x >= 0.875 as a Chebyshev series in s = 2 (t - t0) / (1 - t0) - 1,
// t = 1 - 6 / (x + 3) (scripts/gen_special_coefficients.py; truncation < 1e-12 relative).
constexpr double kErfcxTail[] = {
    1.0374241402958903, -5.8987979273982255e-1, 1.4016473888135534e-1, -2.7218502343422647e-2,
    4.0987747675243796e-3, -4.1497460272069079e-4, 1.1498779974620834e-5, 4.3799187280853032e-6,
    -6.8224286848421772e-7, -1.0159988829004384e-8, 1.4007935613464004e-8, -7.8425547045558259e-10,
    -2.6617510493569587e-10, 3.1124949565307482e-11, 5.5465506465738118e-12, -9.6379763780606539e-13};
TF_INLINE vd erfcx_tail_pd(vd x) {
    constexpr double t0 = 1.0 - 6.0 / (0.875 + 3.0);
    const vd s = ((1.0 - 6.0 / (x + 3.0)) - t0) * (2.0 / (1.0 - t0)) - 1.0;
    const vd s2 = s + s;
    vd b1 = splatd(0.0), b2 = splatd(0.0);
    for (int k = int(sizeof kErfcxTail / sizeof(double)) - 1; k > 0; --k) {
        const vd b0 = kErfcxTail[k] + s2 * b1 - b2;
        b2 = b1;
        b1 = b0;
    }
    return (kErfcxTail[0] + s * b1 - b2) / (x + 3.0);  // 0 at x = inf
}
TF_INLINE vf erfcx_tail_ps(vf ax) {
    return via_double(ax, [](vd v) { return erfcx_tail_pd(v); });
}
// x^2 - h exactly, for h = x * x rounded: an fma, or Dekker's product without one.
TF_INLINE vf square_residual(vf x, vf h) {
#if defined(__AVX512F__) || (defined(__AVX__) && defined(__FMA__)) || defined(__aarch64__)
    return vfma(x, x, -h);
#else
    const vf c = x * 4097.0f;  // splits x into two 12-bit halves
    const vf hi = c - (c - x), lo = x - hi;
    return ((hi * hi - h) + 2.0f * hi * lo) + lo * lo;
#endif
}
// exp(sign x^2) with x^2 = h + l split exactly, so the rounding of x^2 (worth up to x^2
// ulp in the exponent) is not lost: exp(h) (1 + l). Where exp(h) over/underflows anyway
// (h >= 128) the residual is dropped.
TF_INLINE vf exp_square_ps(vf x, float sign) {
    const vf h = x * x;
    const vf l = vselect(h < 128.0f, square_residual(x, h), splat(0.0f));
    return exp_ps(sign * h) * (1.0f + sign * l);
}
// erfc: 1 - erf for |x| < 0.875, exp(-x^2) erfcx(|x|) beyond (2 minus it for x < 0).
TF_INLINE vf erfc_ps(vf x) {
    const vf ax = vabs(x);
    const vf tail = exp_square_ps(ax, -1.0f) * erfcx_tail_ps(ax);
    vf r = vselect(x < 0.0f, 2.0f - tail, tail);
    return vselect(ax < 0.875f, 1.0f - erf_small_ps(x), r);
}
// erfcx = exp(x^2) erfc(x): the tail series for x >= 0.875, exp(x^2) (1 - erf(x)) between,
// 2 exp(x^2) - erfcx(-x) for x <= -0.875 (no cancellation there: the first term is > 4).
TF_INLINE vf erfcx_ps(vf x) {
    const vf ax = vabs(x);
    const vf tail = erfcx_tail_ps(ax);
    const vf e = exp_square_ps(ax, 1.0f);
    vf r = vselect(x < 0.0f, 2.0f * e - tail, tail);
    return vselect(ax < 0.875f, e * (1.0f - erf_small_ps(x)), r);
}

// Scalar erfcx in double (float inputs are exact here): exp(x^2) erfc(x) with x^2 split
// exactly, up to x = 26; then the asymptotic series 1 / (x sqrt(pi)) (1 - z + 3 z^2 -
// 15 z^3 + 105 z^4 - 945 z^5), z = 1 / (2 x^2) (next term < 2e-15).
TF_INLINE double erfcx_scalar(double x) {
    if (!(x >= 26.0)) {  // also nan
        const double h = x * x, l = h < 1024.0 ? std::fma(x, x, -h) : 0.0;
        return std::exp(h) * (1.0 + l) * std::erfc(x);
    }
    const double z = 1.0 / (2.0 * x * x);
    return (1.0 - z * (1.0 - 3.0 * z * (1.0 - 5.0 * z * (1.0 - 7.0 * z * (1.0 - 9.0 * z))))) /
           (x * 1.7724538509055160273);
}

}  // namespace detail

#define TF_FLOAT_VEC_SPECIAL(NAME, IMPL, STD)                                              \
    TF_INLINE Vec<float> NAME(const Vec<float>& x) { return detail::wrap(detail::IMPL(x.r[0])); } \
    TF_INLINE Vec<double> NAME(const Vec<double>& x) {                                     \
        return detail::map_lanes(x, [](double a) { return STD(a); });                     \
    }                                                                                      \
    TF_INLINE float NAME(float x) { return STD(x); }                                       \
    TF_INLINE double NAME(double x) { return STD(x); }
TF_FLOAT_VEC_SPECIAL(asin, asin_ps, std::asin)
TF_FLOAT_VEC_SPECIAL(acos, acos_ps, std::acos)
TF_FLOAT_VEC_SPECIAL(atan, atan_ps, std::atan)
TF_FLOAT_VEC_SPECIAL(sinh, sinh_ps, std::sinh)
TF_FLOAT_VEC_SPECIAL(cosh, cosh_ps, std::cosh)
TF_FLOAT_VEC_SPECIAL(asinh, asinh_ps, std::asinh)
TF_FLOAT_VEC_SPECIAL(acosh, acosh_ps, std::acosh)
TF_FLOAT_VEC_SPECIAL(atanh, atanh_ps, std::atanh)
TF_FLOAT_VEC_SPECIAL(erfc, erfc_ps, std::erfc)
TF_FLOAT_VEC_SPECIAL(erfcx, erfcx_ps, detail::erfcx_scalar)
#undef TF_FLOAT_VEC_SPECIAL

#define TF_FLOAT_VEC_SPECIAL2(NAME, IMPL, STD)                                             \
    TF_INLINE Vec<float> NAME(const Vec<float>& a, const Vec<float>& b) {                  \
        return detail::wrap(detail::IMPL(a.r[0], b.r[0]));                                 \
    }                                                                                      \
    TF_INLINE Vec<double> NAME(const Vec<double>& a, const Vec<double>& b) {               \
        return detail::map_lanes(a, b, [](double x, double y) { return STD(x, y); });     \
    }                                                                                      \
    TF_INLINE float NAME(float a, float b) { return STD(a, b); }                           \
    TF_INLINE double NAME(double a, double b) { return STD(a, b); }
TF_FLOAT_VEC_SPECIAL2(atan2, atan2_ps, std::atan2)
TF_FLOAT_VEC_SPECIAL2(hypot, hypot_ps, std::hypot)
#undef TF_FLOAT_VEC_SPECIAL2

// Rare ops: lane by lane.
TF_INLINE float nextafter(float a, float b) { return std::nextafter(a, b); }
TF_INLINE double nextafter(double a, double b) { return std::nextafter(a, b); }
template <typename T>
TF_INLINE Vec<T> nextafter(const Vec<T>& a, const detail::id_t<Vec<T>>& b) {
    return detail::map_lanes(a, b, [](T x, T y) { return nextafter(x, y); });
}

template <typename T>
TF_INLINE std::enable_if_t<std::is_floating_point_v<T>, bool> signbit(T x) { return std::signbit(x); }
template <typename T>
TF_INLINE std::enable_if_t<std::is_floating_point_v<T>, Vec<bool>> signbit(const Vec<T>& x) {
    using I = typename detail::Layout<T>::sint;
    return bitcast<I>(x) < Vec<I>(I(0));
}

}  // namespace tf

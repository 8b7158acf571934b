// tritonfuse SIMD math: exp/log/tanh/erf/sin/... on Vec<float> (branch-free polynomials
// with Cody-Waite range reduction), Vec<double> (cheap ops vectorized, transcendental ones
// lane by lane through libm), and scalar overloads with the same names so generated code
// writes tf::exp(x) for a scalar or a vector alike. Part of tritonfuse_vec.h.
//
// Accuracy (float32, measured by tests/test_cpp_vec.py against float64 torch over random
// and special inputs): see the report table there; everything here is within a few ulp
// over the full range, and inf/-inf/nan/+-0/denormals follow C99/torch semantics.
#pragma once

#include "tf_vec_core.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace tf {
namespace detail {

using vf = Layout<float>::reg;   // kVecLanes floats: always exactly one register
using vi = Layout<int32_t>::reg;  // kVecLanes int32: comparison results of vf
using vd = Layout<double>::reg;   // kVecLanes / 2 doubles: one register
using vl = Layout<int64_t>::reg;  // kVecLanes / 2 int64
typedef float vf_half __attribute__((vector_size(kVecLanes * 2)));
typedef int32_t vi_half __attribute__((vector_size(kVecLanes * 2)));

// c - (+0) == c exactly; `scalar - vector` broadcasts in one instruction (see Vec(T)).
TF_INLINE vf splat(float c) { return c - vf{}; }
TF_INLINE vd splatd(double c) { return c - vd{}; }
TF_INLINE Vec<float> wrap(vf x) {
    Vec<float> o;
    o.r[0] = x;
    return o;
}
TF_INLINE vf as_f(vi x) { return (vf)x; }
TF_INLINE vi as_i(vf x) { return (vi)x; }
TF_INLINE vf vabs(vf x) { return as_f(as_i(x) & 0x7fffffff); }
TF_INLINE vf vcopysign(vf mag, vf sgn) {
    return as_f((as_i(mag) & 0x7fffffff) | (as_i(sgn) & int32_t(0x80000000u)));
}
TF_INLINE vf vselect(vi m, vf a, vf b) { return m ? a : b; }
// min(x, c) / max(x, c) for clamping, with a NaN x passed through unchanged.
TF_INLINE vf vclamp_hi(vf x, float c) {
#if defined(__AVX512F__)
    return (vf)_mm512_min_ps((__m512)splat(c), (__m512)x);  // returns the 2nd operand on NaN
#elif defined(__AVX__)
    return (vf)_mm256_min_ps((__m256)splat(c), (__m256)x);
#else
    return x > c ? splat(c) : x;
#endif
}
TF_INLINE vf vclamp_lo(vf x, float c) {
#if defined(__AVX512F__)
    return (vf)_mm512_max_ps((__m512)splat(c), (__m512)x);
#elif defined(__AVX__)
    return (vf)_mm256_max_ps((__m256)splat(c), (__m256)x);
#else
    return x < c ? splat(c) : x;
#endif
}
TF_INLINE bool any_lane(vi m) {
    vi z{};
    return std::memcmp(&m, &z, sizeof m) != 0;
}

// Fused multiply-add a*b+c with one rounding (the polynomials below are written for it).
TF_INLINE vf vfma(vf a, vf b, vf c) {
#if defined(__AVX512F__)
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__AVX__) && defined(__FMA__)
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(__aarch64__)
    return (vf)vfmaq_f32((float32x4_t)c, (float32x4_t)a, (float32x4_t)b);
#else
    return a * b + c;
#endif
}
TF_INLINE vf vfma(vf a, vf b, float c) { return vfma(a, b, splat(c)); }

TF_INLINE vf vsqrt(vf x) {
#if defined(__AVX512F__)
    return (vf)_mm512_sqrt_ps((__m512)x);
#elif defined(__AVX__)
    return (vf)_mm256_sqrt_ps((__m256)x);
#elif defined(__SSE2__)
    return (vf)_mm_sqrt_ps((__m128)x);
#elif defined(__aarch64__)
    return (vf)vsqrtq_f32((float32x4_t)x);
#else
    vf r;
    for (int i = 0; i < kVecLanes; ++i) r[i] = __builtin_sqrtf(x[i]);
    return r;
#endif
}
TF_INLINE vd vsqrt(vd x) {
#if defined(__AVX512F__)
    return (vd)_mm512_sqrt_pd((__m512d)x);
#elif defined(__AVX__)
    return (vd)_mm256_sqrt_pd((__m256d)x);
#elif defined(__SSE2__)
    return (vd)_mm_sqrt_pd((__m128d)x);
#else
    vd r;
    for (int i = 0; i < kVecLanes / 2; ++i) r[i] = __builtin_sqrt(x[i]);
    return r;
#endif
}

// Rounding to integral values. Mode: 0 nearest-even, 1 floor, 2 ceil, 3 trunc (the
// _MM_FROUND_* encoding). -0 and NaN are preserved, |x| >= 2^23 (2^52) returns x.
template <int Mode>
TF_INLINE vf vround(vf x) {
#if defined(__AVX512F__)
    return (vf)_mm512_roundscale_ps((__m512)x, Mode | _MM_FROUND_NO_EXC);
#elif defined(__AVX__)
    return (vf)_mm256_round_ps((__m256)x, Mode | _MM_FROUND_NO_EXC);
#else
    vf r;
    for (int i = 0; i < kVecLanes; ++i)
        r[i] = Mode == 0 ? __builtin_nearbyintf(x[i]) : Mode == 1 ? __builtin_floorf(x[i])
             : Mode == 2 ? __builtin_ceilf(x[i]) : __builtin_truncf(x[i]);
    return r;
#endif
}
template <int Mode>
TF_INLINE vd vround(vd x) {
#if defined(__AVX512F__)
    return (vd)_mm512_roundscale_pd((__m512d)x, Mode | _MM_FROUND_NO_EXC);
#elif defined(__AVX__)
    return (vd)_mm256_round_pd((__m256d)x, Mode | _MM_FROUND_NO_EXC);
#else
    vd r;
    for (int i = 0; i < kVecLanes / 2; ++i)
        r[i] = Mode == 0 ? __builtin_nearbyint(x[i]) : Mode == 1 ? __builtin_floor(x[i])
             : Mode == 2 ? __builtin_ceil(x[i]) : __builtin_trunc(x[i]);
    return r;
#endif
}

// The two halves of a float vector as double registers, and back (float rounding).
TF_INLINE void split_to_double(vf x, vd& lo, vd& hi) {
    vf_half a, b;
    std::memcpy(&a, &x, sizeof a);
    std::memcpy(&b, reinterpret_cast<const char*>(&x) + sizeof a, sizeof b);
    lo = __builtin_convertvector(a, vd);
    hi = __builtin_convertvector(b, vd);
}
TF_INLINE vf join_to_float(vd lo, vd hi) {
    vf_half a = __builtin_convertvector(lo, vf_half), b = __builtin_convertvector(hi, vf_half);
    vf r;
    std::memcpy(&r, &a, sizeof a);
    std::memcpy(reinterpret_cast<char*>(&r) + sizeof a, &b, sizeof b);
    return r;
}
TF_INLINE vi join_to_int(vl lo, vl hi) {
    vi_half a = __builtin_convertvector(lo, vi_half), b = __builtin_convertvector(hi, vi_half);
    vi r;
    std::memcpy(&r, &a, sizeof a);
    std::memcpy(reinterpret_cast<char*>(&r) + sizeof a, &b, sizeof b);
    return r;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kLog2e = 1.44269504088896341f;
// ln2 split for Cody-Waite reduction: kLn2Hi has 9 significant bits, so n * kLn2Hi is
// exact for |n| < 2^15 and x - n * kLn2Hi has no rounding error.
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
// 1.5 * 2^23: t = v + kRoundMagic rounds v to an integer (nearest-even) that sits in the
// low mantissa bits of t, so bits(t) - bits(kRoundMagic) is that integer (|v| < 2^22).
constexpr float kRoundMagic = 12582912.0f;
constexpr int32_t kRoundMagicBits = 0x4b400000;

// y * 2^n for integer n in [-152, 129] with a single rounding: 2^(n/2) and 2^(n - n/2)
// are both normal floats, y * 2^(n/2) is exact, and the second product rounds once, so
// results in the denormal range round correctly and too-large ones overflow to inf.
TF_INLINE vf scale_pow2(vf y, vi n) {
    const vi n1 = n >> 1;
    const vi n2 = n - n1;
    return y * as_f((n1 + 127) << 23) * as_f((n2 + 127) << 23);
}

// ---- exp family --------------------------------------------------------------------
// e^x = 2^n * e^r with n = round(x / ln2), r = x - n ln2 in [-0.35, 0.35];
// e^r = 1 + r + r^2 P(r), P: the Cephes expf minimax polynomial (< 1 ulp).
TF_INLINE vf exp_ps(vf x) {
    // Clamp so the exponent arithmetic stays in range: e^-104 is below half the smallest
    // denormal (-> 0) and e^89 overflows (-> inf). NaN passes through.
    const vf xc = vclamp_hi(vclamp_lo(x, -104.0f), 89.0f);
    const vf t = vfma(xc, splat(kLog2e), splat(kRoundMagic));
    const vf n = t - kRoundMagic;
    const vi ni = as_i(t) - kRoundMagicBits;
    vf r = vfma(n, splat(-kLn2Hi), xc);
    r = vfma(n, splat(-kLn2Lo), r);
    vf p = splat(1.9875691500e-4f);
    p = vfma(p, r, 1.3981999507e-3f);
    p = vfma(p, r, 8.3334519073e-3f);
    p = vfma(p, r, 4.1665795894e-2f);
    p = vfma(p, r, 1.6666665459e-1f);
    p = vfma(p, r, 5.0000001201e-1f);
    const vf y = vfma(p, r * r, r) + 1.0f;
#if defined(__AVX512F__)
    (void)ni;  // y * 2^n in one instruction, rounded once (denormals and overflow included)
    return (vf)_mm512_scalef_ps((__m512)y, (__m512)n);
#else
    return scale_pow2(y, ni);
#endif
}

// 2^x = 2^n * 2^f, n = round(x), f = x - n exact; 2^f by its Taylor series in f
// (coefficients ln2^k / k!, truncation < 2e-9 relative on |f| <= 0.5).
TF_INLINE vf exp2_ps(vf x) {
    const vf xc = vclamp_hi(vclamp_lo(x, -152.0f), 129.0f);
    const vf t = xc + kRoundMagic;
    const vf n = t - kRoundMagic;
    const vi ni = as_i(t) - kRoundMagicBits;
    const vf f = xc - n;
    vf p = splat(1.5252734e-5f);               // ln2^7 / 7!
    p = vfma(p, f, 1.5403530e-4f);              // ln2^6 / 6!
    p = vfma(p, f, 1.3333558e-3f);              // ln2^5 / 5!
    p = vfma(p, f, 9.6181291e-3f);              // ln2^4 / 4!
    p = vfma(p, f, 5.5504109e-2f);              // ln2^3 / 3!
    p = vfma(p, f, 2.4022651e-1f);              // ln2^2 / 2!
    p = vfma(p, f, 6.9314718e-1f);              // ln2
    const vf y = vfma(p, f, 1.0f);
    return scale_pow2(y, ni);
}

// expm1(x) = 2^n (1 + q) - 1 with q = expm1(r) by its Taylor series (r + r^2/2 + ...,
// relative error < 1e-9 on |r| <= 0.35, so tiny x is exact to the last bit). The result
// is formed as 2^n q + (2^n - 1), exact for n = 0 and a single rounding otherwise;
// large n (result >> 1) goes through scale_pow2 like exp.
TF_INLINE vf expm1_ps(vf x) {
    const vf xc = vclamp_hi(vclamp_lo(x, -30.0f), 89.0f);  // expm1(-30) rounds to -1
    const vf t = vfma(xc, splat(kLog2e), splat(kRoundMagic));
    const vf n = t - kRoundMagic;
    const vi ni = as_i(t) - kRoundMagicBits;
    vf r = vfma(n, splat(-kLn2Hi), xc);
    r = vfma(n, splat(-kLn2Lo), r);
    vf p = splat(2.4801587e-5f);  // 1/8!
    p = vfma(p, r, 1.9841270e-4f);  // 1/7!
    p = vfma(p, r, 1.3888889e-3f);  // 1/6!
    p = vfma(p, r, 8.3333333e-3f);  // 1/5!
    p = vfma(p, r, 4.1666667e-2f);  // 1/4!
    p = vfma(p, r, 1.6666667e-1f);  // 1/3!
    p = vfma(p, r, 0.5f);
    const vf q = vfma(p, r * r, r);
    const vi n_small = ni > 64 ? vi{} + 64 : ni;
    const vf two_n = as_f((n_small + 127) << 23);
    const vf small = vfma(two_n, q, two_n - 1.0f);
    const vf big = scale_pow2(q + 1.0f, ni);
    const vf res = vselect(ni > 64, big, small);
    return vselect(x == 0.0f, x, res);  // +-0 -> +-0 (the reduction loses the sign of -0)
}

// ---- log family --------------------------------------------------------------------
// x = 2^e * m with m in [sqrt(1/2), sqrt(2)); f = m - 1 (exact). Denormals are scaled by
// 2^23 first. Special inputs give garbage here and are fixed by log_fixup.
TF_INLINE void log_reduce(vf x, vf& f, vf& e) {
    const vi tiny = x < 1.17549435e-38f;
    const vf xs = vselect(tiny, x * 8388608.0f, x);
    const vi ix = as_i(xs) + (0x3f800000 - 0x3f3504f3);  // carries into the exponent iff m' < sqrt(1/2)
    const vi ei = (ix >> 23) - 127 - (tiny & 23);
    f = as_f((ix & 0x007fffff) + 0x3f3504f3) - 1.0f;
    e = __builtin_convertvector(ei, vf);
}
// log(1 + f) - f for f in [-0.29, 0.42]: f^3 P(f) - f^2/2, P: Cephes logf polynomial.
TF_INLINE vf log1p_tail(vf f) {
    const vf z = f * f;
    vf p = splat(7.0376836292e-2f);
    p = vfma(p, f, -1.1514610310e-1f);
    p = vfma(p, f, 1.1676998740e-1f);
    p = vfma(p, f, -1.2420140846e-1f);
    p = vfma(p, f, 1.4249322787e-1f);
    p = vfma(p, f, -1.6668057665e-1f);
    p = vfma(p, f, 2.0000714765e-1f);
    p = vfma(p, f, -2.4999993993e-1f);
    p = vfma(p, f, 3.3333331174e-1f);
    return vfma(z, splat(-0.5f), p * f * z);
}
// log(+inf) = inf, log(+-0) = -inf, log(x < 0) = log(nan) = nan.
TF_INLINE vf log_fixup(vf x, vf r) {
    r = vselect(x == kInf, splat(kInf), r);
    r = vselect(x == 0.0f, splat(-kInf), r);
    return vselect((x < 0.0f) | (x != x), splat(kNaN), r);
}
TF_INLINE vf log_ps(vf x) {
    vf f, e;
    log_reduce(x, f, e);
    // ln x = e ln2 + f + tail(f), with ln2 split so e * kLn2Hi is exact.
    vf y = vfma(e, splat(kLn2Lo), log1p_tail(f));
    const vf r = vfma(e, splat(kLn2Hi), f + y);
    return log_fixup(x, r);
}
TF_INLINE vf log2_ps(vf x) {
    vf f, e;
    log_reduce(x, f, e);
    const vf ln_m = f + log1p_tail(f);
    return log_fixup(x, vfma(ln_m, splat(kLog2e), e));  // exact for powers of two
}
TF_INLINE vf log10_ps(vf x) {
    vf f, e;
    log_reduce(x, f, e);
    const vf ln_m = f + log1p_tail(f);
    // e * log10(2) with log10(2) split (hi has 12 bits: e * hi exact).
    const vf r = vfma(e, splat(3.01025391e-1f), vfma(e, splat(4.605038981e-6f), ln_m * 4.34294482e-1f));
    return log_fixup(x, r);
}
// log1p(x) = log(u) + (x - (u - 1)) / u with u = 1 + x rounded: the second term corrects
// the rounding of u, so tiny x (u == 1) gives exactly x.
TF_INLINE vf log1p_ps(vf x) {
    const vf u = x + 1.0f;
    const vf c = x - (u - 1.0f);
    vf r = log_ps(u) + c / u;
    r = vselect(x == kInf, x, r);
    r = vselect(x == -1.0f, splat(-kInf), r);
    return vselect(x == 0.0f, x, r);  // keeps -0
}

// ---- tanh, sigmoid, erf --------------------------------------------------------------
// c[0] v^(N-1) + c[1] v^(N-2) + ... + c[N-1] by Horner's rule with fused multiply-adds.
template <int N>
TF_INLINE vf vhorner(vf v, const float (&c)[N]) {
    vf acc = splat(c[0]);
    for (int i = 1; i < N; ++i) acc = vfma(acc, v, c[i]);
    return acc;
}
TF_INLINE vf tanh_ps(vf x) {
    const vf ax = vabs(x);
    // |x| < 0.625: x + x^3 P(x^2) (Cephes tanhf), keeps the sign of -0.
    const vf z = x * x;
    vf p = splat(-5.70498872745e-3f);
    p = vfma(p, z, 2.06390887954e-2f);
    p = vfma(p, z, -5.37397155531e-2f);
    p = vfma(p, z, 1.33314422036e-1f);
    p = vfma(p, z, -3.33332819422e-1f);
    const vf small = vfma(p * z, x, x);
    // otherwise 1 - 2 / (e^{2|x|} + 1): e^{2|x|} = inf for large |x| gives exactly 1.
    const vf big = vcopysign(1.0f - 2.0f / (exp_ps(ax + ax) + 1.0f), x);
    const vf r = vselect(ax < 0.625f, small, big);  // nan -> big -> nan
    return vselect(x == 0.0f, x, r);                // tanh(-0) = -0
}
// 1 / (1 + e^-x) computed from z = e^-|x| in (0, 1], so nothing overflows:
// x >= 0: 1 / (1 + z); x < 0: z / (1 + z) (tiny results keep their relative accuracy).
TF_INLINE vf sigmoid_ps(vf x) {
    const vf z = exp_ps(-vabs(x));
    return vselect(x >= 0.0f, splat(1.0f), z) / (z + 1.0f);
}
// erf for |x| < 0.875 as x + x Q(x^2) (Q: a least-squares minimax fit made for this
// header), the part of erfc and erfcx (tf_vec_special.h) near 0.
TF_INLINE vf erf_small_ps(vf x) {  // |x| < 0.875
    const vf s = x * x;
    vf q = splat(8.712057752e-05f);
    q = vfma(q, s, -8.216130664e-04f);
    q = vfma(q, s, 5.206837319e-03f);
    q = vfma(q, s, -2.686146274e-02f);
    q = vfma(q, s, 1.128372774e-01f);
    q = vfma(q, s, -3.761263490e-01f);
    q = vfma(q, s, 1.283791661e-01f);
    return vfma(x, q, x);
}
// erf (GELU's hot spot): |x| < 1: x + x Q(x^2); 1 <= |x| < 3.95: 1 - 2^R(|x|) with
// R ~ log2(erfc(|x|)) in [-25, -2], 2^R = 2^n P(R - n); beyond, erf rounds to +-1. Q (6
// terms), R (8) and P (6) are fits made by scripts/fit_erf.py: 1.7 ulp in float arithmetic.
// The former split at 0.875 took 7 + 9 terms and a full exp_ps (1.1 ulp); this form has
// 12 vector ops fewer: bf16 GELU x y ran 1.3x faster. NaN: vclamp_hi returns x, and the
// polynomials and the scaling keep it NaN.
TF_INLINE vf erf_ps(vf x) {
    static constexpr float kQ[] = {-5.631897366e-04f, 4.917662591e-03f, -2.671140246e-02f, 1.128018275e-01f,
                                   -3.761232793e-01f, 1.283791214e-01f};
    static constexpr float kR[] = {-1.969316509e-05f, 4.663612053e-04f, -5.015204195e-03f, 3.284843266e-02f,
                                   -1.495147198e-01f, -9.214470983e-01f, -1.624747276e+00f, -9.879369754e-04f};
    static constexpr float kP[] = {1.326457947e-03f, 9.671469219e-03f, 5.550733581e-02f, 2.402224243e-01f,
                                   6.931470037e-01f, 1.0f};
    const vf ax = vabs(x);
    const vf small = vfma(x, vhorner(x * x, kQ), x);
    const vf r = vhorner(vclamp_hi(ax, 3.95f), kR);
    const vf t = r + kRoundMagic;   // round(r) in its low mantissa bits
    const vf n = t - kRoundMagic;
    const vf p = vhorner(r - n, kP);   // r - n: exact, in [-0.5, 0.5]
#if defined(__AVX512F__)
    const vf erfc = (vf)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
    const vf erfc = scale_pow2(p, as_i(t) - kRoundMagicBits);
#endif
    return vselect(ax < 1.0f, small, vcopysign(1.0f - erfc, x));
}

// ---- sin, cos ------------------------------------------------------------------------
// Reduction r = |x| - n pi/2 is done in double (n * kPio2Hi exact for n < 2^20, r good
// to ~1e-16 absolute even next to a multiple of pi/2); sin/cos of r in [-pi/4, pi/4] by
// the Cephes sinf/cosf polynomials. Lanes with 2^19 <= |x| < inf (rare) are recomputed
// with libm, which does the exact (Payne-Hanek) reduction.
template <bool kCos>
TF_INLINE vf sincos_ps(vf x) {
    const vf ax = vabs(x);
    vd lo, hi;
    split_to_double(ax, lo, hi);
    constexpr double kTwoOverPi = 6.36619772367581382433e-01;
    constexpr double kPio2Hi = 1.57079632673412561417e+00;  // first 33 bits of pi/2
    constexpr double kPio2Lo = 6.07710050650619224932e-11;  // pi/2 - kPio2Hi
    const vd nlo = vround<0>(lo * kTwoOverPi), nhi = vround<0>(hi * kTwoOverPi);
    const vd rlo = (lo - nlo * kPio2Hi) - nlo * kPio2Lo;
    const vd rhi = (hi - nhi * kPio2Hi) - nhi * kPio2Lo;
    const vf r = join_to_float(rlo, rhi);
    vi q = join_to_int(__builtin_convertvector(nlo, vl), __builtin_convertvector(nhi, vl));
    if (kCos) q += 1;  // cos(x) = sin(x + pi/2)
    const vf z = r * r;
    vf ps = splat(-1.9515295891e-4f);
    ps = vfma(ps, z, 8.3321608736e-3f);
    ps = vfma(ps, z, -1.6666654611e-1f);
    const vf sin_r = vfma(ps * z, r, r);
    vf pc = splat(2.443315711809948e-5f);
    pc = vfma(pc, z, -1.388731625493765e-3f);
    pc = vfma(pc, z, 4.166664568298827e-2f);
    const vf cos_r = vfma(pc * z, z, vfma(z, splat(-0.5f), splat(1.0f)));
    vf res = vselect((q & 1) != 0, cos_r, sin_r);
    vi flip = (q & 2) << 30;                                   // quadrants 2, 3: negate
    if (!kCos) flip ^= as_i(x) & int32_t(0x80000000u);        // sin is odd
    res = as_f(as_i(res) ^ flip);
    const vi huge = (ax >= 524288.0f) & (ax < kInf);
    if (__builtin_expect(any_lane(huge), 0)) {
        for (int i = 0; i < kVecLanes; ++i)
            if (huge[i]) res[i] = kCos ? std::cos(x[i]) : std::sin(x[i]);
    }
    return res;
}

// ---- pow -----------------------------------------------------------------------------
// pow(|x|, y) = 2^(y log2|x|) evaluated in double, where log2 and exp2 are accurate to
// ~1e-12 so the float result is correctly rounded in almost all cases (a float-only
// exp(y log x) would lose ~|y log x| ulp). Special cases follow C99 Annex F (as torch).
TF_INLINE vd pow_abs_pd(vd ax, vd y) {
    // log2(ax): ax = 2^e m, m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(f), f = (m-1)/(m+1).
    const vl ix = (vl)ax + (0x3ff0000000000000LL - 0x3fe6a09e667f3bcdLL);
    const vl e = (ix >> 52) - 1023;
    const vd m = (vd)((ix & 0x000fffffffffffffLL) + 0x3fe6a09e667f3bcdLL);
    const vd f = (m - 1.0) / (m + 1.0);
    const vd s = f * f;
    vd p = splatd(1.0 / 13);
    p = p * s + 1.0 / 11;
    p = p * s + 1.0 / 9;
    p = p * s + 1.0 / 7;
    p = p * s + 1.0 / 5;
    p = p * s + 1.0 / 3;
    const vd ln_m = 2.0 * f + 2.0 * f * s * p;
    const vd log2x = __builtin_convertvector(e, vd) + ln_m * 1.44269504088896338700;
    // 2^t, t clamped (NaN passes) so that 2^n is a normal double; the double -> float
    // conversion later rounds once, overflowing to inf / underflowing to 0 as needed.
    vd t = y * log2x;
    t = t < -400.0 ? splatd(-400.0) : t;
    t = t > 400.0 ? splatd(400.0) : t;
    const vd n = vround<0>(t);
    const vd u = (t - n) * 0.69314718055994530942;
    vd q = splatd(1.0 / 40320);
    q = q * u + 1.0 / 5040;
    q = q * u + 1.0 / 720;
    q = q * u + 1.0 / 120;
    q = q * u + 1.0 / 24;
    q = q * u + 1.0 / 6;
    q = q * u + 0.5;
    q = q * u + 1.0;
    q = q * u + 1.0;
    const vl ni = __builtin_convertvector(n, vl);
    return q * (vd)((ni + 1023) << 52);
}
TF_INLINE vf pow_ps(vf x, vf y) {
    const vf ax = vabs(x);
    vd alo, ahi, ylo, yhi;
    split_to_double(ax, alo, ahi);
    split_to_double(y, ylo, yhi);
    vf r = join_to_float(pow_abs_pd(alo, ylo), pow_abs_pd(ahi, yhi));
    r = vselect(ax == 0.0f, vselect(y < 0.0f, splat(kInf), splat(0.0f)), r);
    r = vselect(ax == kInf, vselect(y < 0.0f, splat(0.0f), splat(kInf)), r);
    const vf ay = vabs(y);
    const vi y_int = vround<3>(y) == y;              // also true for +-inf
    const vf half = y * 0.5f;
    const vi y_odd = y_int & (vround<3>(half) != half) & (ay < kInf);
    // negative base: odd integer y flips the sign (also for x = -0, -inf), a finite
    // non-integer y gives nan.
    r = vselect((as_i(x) < 0) & y_odd, -r, r);
    r = vselect((x < 0.0f) & (x > -kInf) & (ay < kInf) & ~y_int, splat(kNaN), r);
    r = vselect((x != x) | (y != y), splat(kNaN), r);
    r = vselect((x == -1.0f) & (ay == kInf), splat(1.0f), r);  // (-1)^+-inf = 1
    return vselect((y == 0.0f) | (x == 1.0f), splat(1.0f), r);  // even for nan
}

// ---- fmod ----------------------------------------------------------------------------
// fmod is exact: with the quotient below 2^22, q = trunc(x / y) computed in double is
// exact and x - q y is exact in double. Lanes with a larger quotient (rare) use libm.
TF_INLINE vf fmod_ps(vf x, vf y) {
    vd xlo, xhi, ylo, yhi;
    split_to_double(x, xlo, xhi);
    split_to_double(y, ylo, yhi);
    const vd qlo = vround<3>(xlo / ylo), qhi = vround<3>(xhi / yhi);
    const vf r = vcopysign(join_to_float(xlo - qlo * ylo, xhi - qhi * yhi), x);
    const vf qa = vabs(join_to_float(qlo, qhi));
    const vf ay = vabs(y), ax = vabs(x);
    const vi ok = (qa < 4194304.0f) & (ay < kInf);
    vf res = vselect(ok, r, splat(kNaN));                          // y = 0, x = inf, nan
    res = vselect((ay == kInf) & (ax < kInf), x, res);             // fmod(x, inf) = x
    const vi slow = ~ok & (ax < kInf) & (ay < kInf) & (ay > 0.0f);  // huge quotient
    if (__builtin_expect(any_lane(slow), 0)) {
        for (int i = 0; i < kVecLanes; ++i)
            if (slow[i]) res[i] = std::fmod(x[i], y[i]);
    }
    return res;
}

template <typename T, typename F>
TF_INLINE Vec<T> map_lanes(const Vec<T>& a, F f) {
    T lanes[kVecLanes];
    a.store(lanes);
    for (int i = 0; i < kVecLanes; ++i) lanes[i] = f(lanes[i]);
    return Vec<T>::load(lanes);
}
template <typename T, typename F>
TF_INLINE Vec<T> map_lanes(const Vec<T>& a, const Vec<T>& b, F f) {
    T la[kVecLanes], lb[kVecLanes];
    a.store(la);
    b.store(lb);
    for (int i = 0; i < kVecLanes; ++i) la[i] = f(la[i], lb[i]);
    return Vec<T>::load(la);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Public math API. For each name: Vec<float>, Vec<double>, float, double overloads.
// ---------------------------------------------------------------------------------------

// Apply any scalar function lane by lane (escape hatch for ops without a vector kernel).
using detail::map_lanes;

#define TF_FLOAT_VEC_UNARY(NAME, IMPL) \
    TF_INLINE Vec<float> NAME(const Vec<float>& x) { return detail::wrap(detail::IMPL(x.r[0])); }
TF_FLOAT_VEC_UNARY(exp, exp_ps)
TF_FLOAT_VEC_UNARY(exp2, exp2_ps)
TF_FLOAT_VEC_UNARY(expm1, expm1_ps)
TF_FLOAT_VEC_UNARY(log, log_ps)
TF_FLOAT_VEC_UNARY(log2, log2_ps)
TF_FLOAT_VEC_UNARY(log10, log10_ps)
TF_FLOAT_VEC_UNARY(log1p, log1p_ps)
TF_FLOAT_VEC_UNARY(tanh, tanh_ps)
TF_FLOAT_VEC_UNARY(sigmoid, sigmoid_ps)
TF_FLOAT_VEC_UNARY(erf, erf_ps)
TF_FLOAT_VEC_UNARY(sin, sincos_ps<false>)
TF_FLOAT_VEC_UNARY(cos, sincos_ps<true>)
TF_FLOAT_VEC_UNARY(sqrt, vsqrt)
TF_FLOAT_VEC_UNARY(floor, vround<1>)
TF_FLOAT_VEC_UNARY(ceil, vround<2>)
TF_FLOAT_VEC_UNARY(trunc, vround<3>)
TF_FLOAT_VEC_UNARY(round, vround<0>)  // half to even, like torch.round
#undef TF_FLOAT_VEC_UNARY
TF_INLINE Vec<float> rsqrt(const Vec<float>& x) { return Vec<float>(1.0f) / sqrt(x); }
TF_INLINE Vec<float> pow(const Vec<float>& x, const Vec<float>& y) { return detail::wrap(detail::pow_ps(x.r[0], y.r[0])); }
TF_INLINE Vec<float> pow(float x, const Vec<float>& y) { return pow(Vec<float>(x), y); }
TF_INLINE Vec<float> fmod(const Vec<float>& x, const Vec<float>& y) { return detail::wrap(detail::fmod_ps(x.r[0], y.r[0])); }
TF_INLINE Vec<float> fmod(float x, const Vec<float>& y) { return fmod(Vec<float>(x), y); }

// Double vectors: cheap ops are vectorized below; transcendental ones go lane by lane
// through libm (correct, not fast; float32 is the hot path).
#define TF_DOUBLE_VEC_LIBM(NAME, EXPR)                                              \
    TF_INLINE Vec<double> NAME(const Vec<double>& x) {                              \
        return detail::map_lanes(x, [](double a) { return EXPR; });                 \
    }
TF_DOUBLE_VEC_LIBM(exp, std::exp(a))
TF_DOUBLE_VEC_LIBM(exp2, std::exp2(a))
TF_DOUBLE_VEC_LIBM(expm1, std::expm1(a))
TF_DOUBLE_VEC_LIBM(log, std::log(a))
TF_DOUBLE_VEC_LIBM(log2, std::log2(a))
TF_DOUBLE_VEC_LIBM(log10, std::log10(a))
TF_DOUBLE_VEC_LIBM(log1p, std::log1p(a))
TF_DOUBLE_VEC_LIBM(tanh, std::tanh(a))
TF_DOUBLE_VEC_LIBM(erf, std::erf(a))
TF_DOUBLE_VEC_LIBM(sin, std::sin(a))
TF_DOUBLE_VEC_LIBM(cos, std::cos(a))
TF_DOUBLE_VEC_LIBM(sigmoid, a >= 0 ? 1.0 / (1.0 + std::exp(-a)) : std::exp(a) / (1.0 + std::exp(a)))
#undef TF_DOUBLE_VEC_LIBM
TF_INLINE Vec<double> pow(const Vec<double>& x, const Vec<double>& y) {
    return detail::map_lanes(x, y, [](double a, double b) { return std::pow(a, b); });
}
TF_INLINE Vec<double> fmod(const Vec<double>& x, const Vec<double>& y) {
    return detail::map_lanes(x, y, [](double a, double b) { return std::fmod(a, b); });
}
#define TF_DOUBLE_VEC_REG(NAME, IMPL)                                               \
    TF_INLINE Vec<double> NAME(const Vec<double>& x) {                              \
        Vec<double> o;                                                              \
        for (int k = 0; k < Vec<double>::kRegs; ++k) o.r[k] = detail::IMPL(x.r[k]); \
        return o;                                                                   \
    }
TF_DOUBLE_VEC_REG(sqrt, vsqrt)
TF_DOUBLE_VEC_REG(floor, vround<1>)
TF_DOUBLE_VEC_REG(ceil, vround<2>)
TF_DOUBLE_VEC_REG(trunc, vround<3>)
TF_DOUBLE_VEC_REG(round, vround<0>)
#undef TF_DOUBLE_VEC_REG
TF_INLINE Vec<double> rsqrt(const Vec<double>& x) { return Vec<double>(1.0) / sqrt(x); }
TF_INLINE Vec<double> pow(double x, const Vec<double>& y) { return pow(Vec<double>(x), y); }
TF_INLINE Vec<double> fmod(double x, const Vec<double>& y) { return fmod(Vec<double>(x), y); }

// Ops that are the same for every floating (and mostly integer) element type.
template <typename T>
using FloatVec = std::enable_if_t<std::is_floating_point_v<T>, Vec<T>>;
template <typename T>
using NumVec = std::enable_if_t<!std::is_same_v<T, bool>, Vec<T>>;

template <typename T>
TF_INLINE NumVec<T> abs(const Vec<T>& x) {
    if constexpr (std::is_floating_point_v<T>) {  // clear the sign bit: abs(-0) = 0, nan stays nan
        using I = typename detail::Layout<T>::sint;
        return bitcast<T>(bitcast<I>(x) & Vec<I>(std::numeric_limits<I>::max()));
    } else if constexpr (std::is_signed_v<T>) {
        return where(x < Vec<T>(T(0)), -x, x);  // abs(INT_MIN) wraps to INT_MIN, as eager
    } else {
        return x;
    }
}
// NaN-propagating max/min (torch.maximum/minimum): nan if either input is nan.
template <typename T>
TF_INLINE NumVec<T> maximum(const Vec<T>& a, const detail::id_t<Vec<T>>& b) {
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) {
        auto m = a.r[k] > b.r[k] ? a.r[k] : b.r[k];
        if constexpr (std::is_floating_point_v<T>)
            m = (a.r[k] != a.r[k]) | (b.r[k] != b.r[k]) ? a.r[k] + b.r[k] : m;
        o.r[k] = m;
    }
    return o;
}
template <typename T>
TF_INLINE NumVec<T> minimum(const Vec<T>& a, const detail::id_t<Vec<T>>& b) {
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) {
        auto m = a.r[k] < b.r[k] ? a.r[k] : b.r[k];
        if constexpr (std::is_floating_point_v<T>)
            m = (a.r[k] != a.r[k]) | (b.r[k] != b.r[k]) ? a.r[k] + b.r[k] : m;
        o.r[k] = m;
    }
    return o;
}
template <typename T>
TF_INLINE NumVec<T> maximum(T a, const Vec<T>& b) { return maximum(Vec<T>(a), b); }
template <typename T>
TF_INLINE NumVec<T> minimum(T a, const Vec<T>& b) { return minimum(Vec<T>(a), b); }
// torch.sign: -1, 0, +1; sign(nan) = 0, sign(-0) = 0.
template <typename T>
TF_INLINE NumVec<T> sign(const Vec<T>& x) {
    const Vec<T> zero(T(0));
    return where(x > zero, Vec<T>(T(1)), zero) - where(x < zero, Vec<T>(T(1)), zero);
}
template <typename T>
TF_INLINE FloatVec<T> reciprocal(const Vec<T>& x) { return Vec<T>(T(1)) / x; }
template <typename T>
TF_INLINE Vec<bool> isnan(const Vec<T>& x) {
    if constexpr (std::is_floating_point_v<T>) return x != x;
    else return Vec<bool>(false);
}
template <typename T>
TF_INLINE Vec<bool> isinf(const Vec<T>& x) {
    if constexpr (std::is_floating_point_v<T>) return abs(x) == Vec<T>(std::numeric_limits<T>::infinity());
    else return Vec<bool>(false);
}
template <typename T>
TF_INLINE Vec<bool> isfinite(const Vec<T>& x) {
    if constexpr (std::is_floating_point_v<T>) return abs(x) < Vec<T>(std::numeric_limits<T>::infinity());
    else return Vec<bool>(true);
}
template <typename T>
TF_INLINE FloatVec<T> copysign(const Vec<T>& mag, const detail::id_t<Vec<T>>& sgn) {
    using I = typename detail::Layout<T>::sint;
    const Vec<I> sign_bit(std::numeric_limits<I>::min());
    return bitcast<T>((bitcast<I>(mag) & ~sign_bit) | (bitcast<I>(sgn) & sign_bit));
}
// Integer fmod is C's % (no trap on 0: gives 0, see int_div).
template <typename T>
TF_INLINE IntVec<T> fmod(const Vec<T>& a, const detail::id_t<Vec<T>>& b) { return a % b; }

// Per-lane libm fallbacks for ops without a vector kernel (correct, not fast).
#define TF_VEC_LIBM_FALLBACK(NAME)                                                     \
    TF_INLINE Vec<float> NAME(const Vec<float>& x) {                                   \
        return detail::map_lanes(x, [](float a) { return std::NAME(a); });             \
    }                                                                                  \
    TF_INLINE Vec<double> NAME(const Vec<double>& x) {                                 \
        return detail::map_lanes(x, [](double a) { return std::NAME(a); });            \
    }                                                                                  \
    TF_INLINE float NAME(float x) { return std::NAME(x); }                             \
    TF_INLINE double NAME(double x) { return std::NAME(x); }
TF_VEC_LIBM_FALLBACK(tan)
TF_VEC_LIBM_FALLBACK(lgamma)
TF_VEC_LIBM_FALLBACK(cbrt)
#undef TF_VEC_LIBM_FALLBACK
// (inverse trigonometric and hyperbolic functions, erfc, atan2, hypot: tf_vec_special.h)

// ---------------------------------------------------------------------------------------
// Scalar overloads (same names, same semantics) for scalar loops and reductions.
// ---------------------------------------------------------------------------------------
#define TF_SCALAR_LIBM(NAME, STD)                                 \
    TF_INLINE float NAME(float x) { return STD(x); }              \
    TF_INLINE double NAME(double x) { return STD(x); }
TF_SCALAR_LIBM(exp, std::exp)
TF_SCALAR_LIBM(exp2, std::exp2)
TF_SCALAR_LIBM(expm1, std::expm1)
TF_SCALAR_LIBM(log, std::log)
TF_SCALAR_LIBM(log2, std::log2)
TF_SCALAR_LIBM(log10, std::log10)
TF_SCALAR_LIBM(log1p, std::log1p)
TF_SCALAR_LIBM(sqrt, std::sqrt)
TF_SCALAR_LIBM(tanh, std::tanh)
TF_SCALAR_LIBM(erf, std::erf)
TF_SCALAR_LIBM(sin, std::sin)
TF_SCALAR_LIBM(cos, std::cos)
TF_SCALAR_LIBM(floor, std::floor)
TF_SCALAR_LIBM(ceil, std::ceil)
TF_SCALAR_LIBM(trunc, std::trunc)
TF_SCALAR_LIBM(round, std::nearbyint)  // half to even under the default rounding mode
#undef TF_SCALAR_LIBM
template <typename T>
using Float = std::enable_if_t<std::is_floating_point_v<T>, T>;
template <typename T>
using Num = std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, T>;

template <typename T> TF_INLINE Float<T> rsqrt(T x) { return T(1) / std::sqrt(x); }
template <typename T> TF_INLINE Float<T> reciprocal(T x) { return T(1) / x; }
template <typename T> TF_INLINE Float<T> sigmoid(T x) {
    const T z = std::exp(-std::abs(x));
    return (x >= T(0) ? T(1) : z) / (T(1) + z);
}
template <typename T> TF_INLINE Float<T> pow(T x, detail::id_t<T> y) { return std::pow(x, y); }
template <typename T> TF_INLINE Float<T> copysign(T x, detail::id_t<T> y) { return std::copysign(x, y); }
template <typename T> TF_INLINE Num<T> fmod(T x, detail::id_t<T> y) {
    if constexpr (std::is_floating_point_v<T>) return std::fmod(x, y);
    else return y == 0 ? T(0) : (std::is_signed_v<T> && y == T(-1)) ? T(0) : T(x % y);
}
template <typename T> TF_INLINE Num<T> abs(T x) {
    if constexpr (std::is_floating_point_v<T>) return std::fabs(x);
    else if constexpr (std::is_signed_v<T>) return x < 0 ? T(T(0) - x) : x;
    else return x;
}
template <typename T> TF_INLINE Num<T> maximum(T a, detail::id_t<T> b) {
    if constexpr (std::is_floating_point_v<T>)
        if (a != a || b != b) return a + b;
    return a > b ? a : b;
}
template <typename T> TF_INLINE Num<T> minimum(T a, detail::id_t<T> b) {
    if constexpr (std::is_floating_point_v<T>)
        if (a != a || b != b) return a + b;
    return a < b ? a : b;
}
template <typename T> TF_INLINE Num<T> sign(T x) { return T((T(0) < x) - (x < T(0))); }
template <typename T> TF_INLINE std::enable_if_t<std::is_arithmetic_v<T>, bool> isnan(T x) {
    if constexpr (std::is_floating_point_v<T>) return x != x;
    else return false;
}
template <typename T> TF_INLINE std::enable_if_t<std::is_arithmetic_v<T>, bool> isinf(T x) {
    if constexpr (std::is_floating_point_v<T>) return std::isinf(x);
    else return false;
}
template <typename T> TF_INLINE std::enable_if_t<std::is_arithmetic_v<T>, bool> isfinite(T x) {
    if constexpr (std::is_floating_point_v<T>) return std::isfinite(x);
    else return true;
}

}  // namespace tf

// tritonfuse bfloat16 / float16 storage: scalar and vector conversions to and from float.
// Part of tritonfuse_vec.h. Tensors of these dtypes are passed as uint16_t* (raw bits);
// arithmetic happens in float.
//
// Results match torch's conversions bit for bit for every non-NaN input (round to nearest
// even, denormals, overflow to inf). NaN stays NaN (quiet, sign kept); the exact NaN bit
// pattern is not specified (torch itself differs between its scalar and vector paths).
#pragma once

#include "tf_vec_core.h"

// F16C converts half <-> float in hardware (round to nearest even, denormals kept), one
// value or a vector at a time; the arithmetic forms below are for CPUs without it.
#if defined(__F16C__) && !defined(TF_DISABLE_F16C) && (defined(__AVX512F__) || defined(__AVX__))
#define TF_HW_HALF 1
#else
#define TF_HW_HALF 0
#endif

namespace tf {

// ---------------------------------------------------------------------------------------
// scalar
// ---------------------------------------------------------------------------------------
namespace detail {
TF_INLINE uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
TF_INLINE float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
}  // namespace detail

TF_INLINE float bf16_to_float(uint16_t h) { return detail::f32_from_bits(uint32_t(h) << 16); }

// Round to nearest even on the 16 dropped bits: adding 0x7fff + (lsb of the kept part)
// carries into the kept part exactly when the dropped part is > half, or == half and the
// kept part is odd. Overflow carries into the exponent and gives inf, as it should.
TF_INLINE uint16_t float_to_bf16(float f) {
    const uint32_t u = detail::f32_bits(f);
    if (f != f) return uint16_t((u >> 16) | 0x0040);  // quiet NaN, sign kept
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// IEEE half <-> float without lookup tables or branches on the value (the classic
// float-arithmetic formulation): the float unit does the rounding and denormal handling.
TF_INLINE float half_to_float(uint16_t h) {
#if TF_HW_HALF
    return _cvtsh_ss(h);
#else
    const uint32_t w = uint32_t(h) << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;  // exponent + mantissa, sign shifted out
    // Normal (and inf/nan): re-bias the exponent by 0xE0 << 23 (= (127 - 15 + 112) << 23)
    // and scale by 2^-112, which maps the half exponent range onto float's and leaves
    // inf/nan (exponent all ones) at inf/nan.
    const float normalized = detail::f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    // Denormal: place the 10 mantissa bits under an exponent of 2^-1 (126 << 23) and
    // subtract 0.5: leaves mantissa * 2^-24 exactly.
    const float denormalized = detail::f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t mag = two_w < (1u << 27) ? detail::f32_bits(denormalized) : detail::f32_bits(normalized);
    return detail::f32_from_bits(sign | mag);
#endif
}

TF_INLINE uint16_t float_to_half(float f) {
#if TF_HW_HALF
    if (f == f) return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return uint16_t((detail::f32_bits(f) >> 16) & 0x8000u) | 0x7E00u;  // nan -> 0x7E00, as below
#else
    // Scaling by 2^112 then 2^-110 makes the float multiplier round the mantissa at the
    // half precision point (and overflow to inf above the half range); adding a
    // power-of-two bias then aligns the 10 result bits (or the denormal bits) at the
    // bottom of the float mantissa, where they are read off.
    float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = detail::f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = detail::f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = detail::f32_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return uint16_t((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));  // nan -> 0x7E00
#endif
}

// ---------------------------------------------------------------------------------------
// vector
// ---------------------------------------------------------------------------------------
namespace detail {
using vu32 = Layout<uint32_t>::reg;  // kVecLanes x uint32
using vu16 = Layout<uint16_t>::reg;  // kVecLanes x uint16
using vf32 = Layout<float>::reg;

#if defined(__AVX512F__)
// The same arithmetic as below in AVX-512 instructions: GCC lowers the generic 16 x u16
// <-> u32 conversions in 256-bit halves (zero-extend, insert; permute to pack), which made
// bf16 loads and stores a third of a bf16 norm kernel's instructions.
TF_INLINE vf32 bf16_bits_to_float(vu16 h) { return (vf32)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16); }
TF_INLINE vu16 float_to_bf16_bits_rounded(vf32 x) {
    const __m512i u = (__m512i)x;
    const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                          _mm512_set1_epi32(0x7fff));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    const __mmask16 nan = _mm512_cmp_ps_mask((__m512)x, (__m512)x, _CMP_UNORD_Q);
    return (vu16)_mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
#if defined(__AVX512BF16__)
// vcvtneps2bf16 rounds to nearest even and quiets NaNs as above, in one instruction, but
// flushes denormal inputs to zero where eager keeps them: vectors holding one (rare) take
// the integer path.
TF_INLINE vu16 float_to_bf16_bits(vf32 x) {
    if (__builtin_expect(_mm512_fpclass_ps_mask((__m512)x, 0x20) != 0, 0)) return float_to_bf16_bits_rounded(x);
    const __m256bh packed = _mm512_cvtneps_pbh((__m512)x);
    vu16 out;
    std::memcpy(&out, &packed, sizeof out);
    return out;
}
#else
TF_INLINE vu16 float_to_bf16_bits(vf32 x) { return float_to_bf16_bits_rounded(x); }
#endif
#else
TF_INLINE vf32 bf16_bits_to_float(vu16 h) { return (vf32)(__builtin_convertvector(h, vu32) << 16); }
TF_INLINE vu16 float_to_bf16_bits(vf32 x) {
    const vu32 u = (vu32)x;
    const vu32 rounded = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
    const vu32 r = x != x ? (u >> 16) | 0x0040u : rounded;
    return __builtin_convertvector(r, vu16);
}
#endif

TF_INLINE vf32 half_bits_to_float(vu16 h) {
#if TF_HW_HALF && defined(__AVX512F__)
    return (vf32)_mm512_cvtph_ps((__m256i)h);
#elif TF_HW_HALF
    return (vf32)_mm256_cvtph_ps((__m128i)h);
#else  // vector form of tf::half_to_float
    const vu32 w = __builtin_convertvector(h, vu32) << 16;
    const vu32 sign = w & 0x80000000u;
    const vu32 two_w = w + w;
    const vf32 normalized = (vf32)((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const vf32 denormalized = (vf32)((two_w >> 17) | (126u << 23)) - 0.5f;
    const vu32 mag = two_w < (1u << 27) ? (vu32)denormalized : (vu32)normalized;
    return (vf32)(sign | mag);
#endif
}
TF_INLINE vu16 float_to_half_bits(vf32 x) {
#if TF_HW_HALF && defined(__AVX512F__)
    return (vu16)_mm512_cvtps_ph((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif TF_HW_HALF
    return (vu16)_mm256_cvtps_ph((__m256)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else  // vector form of tf::float_to_half
    const vu32 w = (vu32)x;
    const vf32 ax = (vf32)(w & 0x7fffffffu);
    vf32 base = (ax * 0x1.0p+112f) * 0x1.0p-110f;
    const vu32 shl1_w = w + w;
    const vu32 sign = w & 0x80000000u;
    vu32 bias = shl1_w & 0xFF000000u;
    bias = bias < 0x71000000u ? vu32{} + 0x71000000u : bias;
    base = (vf32)((bias >> 1) + 0x07800000u) + base;
    const vu32 bits = (vu32)base;
    const vu32 nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    const vu32 r = (sign >> 16) | (shl1_w > 0xFF000000u ? vu32{} + 0x7E00u : nonsign);
    return __builtin_convertvector(r, vu16);
#endif
}

TF_INLINE Vec<float> wrap_f32(vf32 x) {
    Vec<float> o;
    o.r[0] = x;
    return o;
}
TF_INLINE Vec<uint16_t> wrap_u16(vu16 x) {
    Vec<uint16_t> o;
    o.r[0] = x;
    return o;
}
}  // namespace detail

TF_INLINE Vec<float> load_bf16_as_float(const uint16_t* p) {
    return detail::wrap_f32(detail::bf16_bits_to_float(Vec<uint16_t>::load(p).r[0]));
}
TF_INLINE Vec<float> load_partial_bf16_as_float(const uint16_t* p, int count) {
    return detail::wrap_f32(detail::bf16_bits_to_float(Vec<uint16_t>::load_partial(p, count).r[0]));
}
TF_INLINE void store_float_as_bf16(uint16_t* p, const Vec<float>& x) {
    detail::wrap_u16(detail::float_to_bf16_bits(x.r[0])).store(p);
}
TF_INLINE void store_partial_float_as_bf16(uint16_t* p, const Vec<float>& x, int count) {
    detail::wrap_u16(detail::float_to_bf16_bits(x.r[0])).store_partial(p, count);
}

TF_INLINE Vec<float> load_half_as_float(const uint16_t* p) {
    return detail::wrap_f32(detail::half_bits_to_float(Vec<uint16_t>::load(p).r[0]));
}
TF_INLINE Vec<float> load_partial_half_as_float(const uint16_t* p, int count) {
    return detail::wrap_f32(detail::half_bits_to_float(Vec<uint16_t>::load_partial(p, count).r[0]));
}
TF_INLINE void store_float_as_half(uint16_t* p, const Vec<float>& x) {
    detail::wrap_u16(detail::float_to_half_bits(x.r[0])).store(p);
}
TF_INLINE void store_partial_float_as_half(uint16_t* p, const Vec<float>& x, int count) {
    detail::wrap_u16(detail::float_to_half_bits(x.r[0])).store_partial(p, count);
}

}  // namespace tf

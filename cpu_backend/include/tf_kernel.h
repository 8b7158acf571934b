// tf_kernel.h: small helpers that generated kernels call on top of tritonfuse_vec.h.
//
// Loads and stores come in a TAIL flavour (compile-time): the vectorized inner loop
// body is instantiated twice, once for full vectors and once for the last partial one,
// so the common case carries no masks.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <omp.h>
#include <type_traits>

#include "tritonfuse_vec.h"

// The vector-loop bodies are lambdas instantiated per tail flag and accumulator slot;
// they must inline so accumulators stay in registers.
#define TF_INLINE_LAMBDA __attribute__((always_inline))

namespace tf {

template <bool TAIL, typename T>
TF_INLINE Vec<T> vload(const T* p, int count) {
    if constexpr (TAIL) return Vec<T>::load_partial(p, count);
    else return Vec<T>::load(p);
}

// A contiguous run read under a mask (a piece of a cat, a slice_scatter): lanes off the
// mask, and past `count` in the tail, read 0 and are never touched in memory.
template <bool TAIL, typename T>
TF_INLINE Vec<T> vload_masked(const T* p, const Vec<bool>& mask, int count) {
    if constexpr (TAIL) return Vec<T>::masked_load(p, mask & Vec<bool>::first_n(count));
    else return Vec<T>::masked_load(p, mask);
}

template <bool TAIL>
TF_INLINE Vec<bool> vload(const bool* p, int count) {
    if constexpr (TAIL) return Vec<bool>::load_partial(p, count);
    else return Vec<bool>::load(p);
}

template <bool TAIL>
TF_INLINE Vec<float> vload_bf16(const uint16_t* p, int count) {
    if constexpr (TAIL) return load_partial_bf16_as_float(p, count);
    else return load_bf16_as_float(p);
}

template <bool TAIL>
TF_INLINE Vec<float> vload_half(const uint16_t* p, int count) {
    if constexpr (TAIL) return load_partial_half_as_float(p, count);
    else return load_half_as_float(p);
}

template <bool TAIL, typename T>
TF_INLINE void vstore(T* p, const Vec<T>& v, int count) {
    if constexpr (TAIL) v.store_partial(p, count);
    else v.store(p);
}

template <bool TAIL>
TF_INLINE void vstore_bf16(uint16_t* p, const Vec<float>& v, int count) {
    if constexpr (TAIL) store_partial_float_as_bf16(p, v, count);
    else store_float_as_bf16(p, v);
}

template <bool TAIL>
TF_INLINE void vstore_half(uint16_t* p, const Vec<float>& v, int count) {
    if constexpr (TAIL) store_partial_float_as_half(p, v, count);
    else store_float_as_half(p, v);
}

// Lanes past `count` (in the tail) or where `mask` is false read nothing and give 0.
template <bool TAIL, typename T>
TF_INLINE Vec<T> vgather(const T* base, const Vec<int64_t>& idx, int count) {
    if constexpr (TAIL) return Vec<T>::gather(base, idx, Vec<bool>::first_n(count));
    else return Vec<T>::gather(base, idx);
}

template <bool TAIL, typename T>
TF_INLINE Vec<T> vgather_masked(const T* base, const Vec<int64_t>& idx, const Vec<bool>& mask, int count) {
    if constexpr (TAIL) return Vec<T>::gather(base, idx, mask & Vec<bool>::first_n(count));
    else return Vec<T>::gather(base, idx, mask);
}

// Lane i reads base[2 * i] where `mask` is true (0 elsewhere and past `count`): a read of
// every other element (a stride-2 pooling window, x[..., ::2]). On AVX-512 two masked loads
// and one deinterleave, touching only the elements the lanes read, instead of a gather's
// element per cycle.
template <bool TAIL, typename T>
TF_INLINE Vec<T> vload_stride2(const T* base, const Vec<bool>& mask, int count) {
    const Vec<bool> m = TAIL ? (mask & Vec<bool>::first_n(count)) : mask;
#if TF_AVX512 && defined(__BMI2__)
    if constexpr (sizeof(T) == 4) {
        const uint32_t elements = _pdep_u32(m.bits(), 0x55555555u);   // lane i -> element 2i
        const __m512i lo = _mm512_maskz_loadu_epi32((__mmask16)elements, base);
        const __m512i hi = _mm512_maskz_loadu_epi32((__mmask16)(elements >> 16), base + 16);
        const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        Vec<T> o;
        o.r[0] = (typename Vec<T>::reg_t)_mm512_permutex2var_epi32(lo, even, hi);
        return o;
    }
#endif
    return Vec<T>::gather(base, Vec<int64_t>::arange(0, 2), m);   // elsewhere a gather, as before
}

template <bool TAIL>
TF_INLINE Vec<bool> vgather(const bool* base, const Vec<int64_t>& idx, int count) {
    Vec<bool> out(false);
    bool lanes[kVecLanes] = {};
    const int n = TAIL ? count : kVecLanes;
    for (int i = 0; i < n; ++i) lanes[i] = base[idx[i]];
    return Vec<bool>::load(lanes);
}

template <bool TAIL>
TF_INLINE Vec<bool> vgather_masked(const bool* base, const Vec<int64_t>& idx, const Vec<bool>& mask, int count) {
    bool lanes[kVecLanes] = {};
    const int n = TAIL ? count : kVecLanes;
    for (int i = 0; i < n; ++i) lanes[i] = mask[i] ? base[idx[i]] : false;
    return Vec<bool>::load(lanes);
}

template <bool TAIL, float (*Convert)(uint16_t)>
TF_INLINE Vec<float> vgather_16(const uint16_t* base, const Vec<int64_t>& idx, const Vec<bool>& mask, int count) {
    float lanes[kVecLanes] = {};
    const int n = TAIL ? count : kVecLanes;
    for (int i = 0; i < n; ++i) lanes[i] = mask[i] ? Convert(base[idx[i]]) : 0.0f;
    return Vec<float>::load(lanes);
}

template <bool TAIL>
TF_INLINE Vec<float> vgather_bf16(const uint16_t* base, const Vec<int64_t>& idx, const Vec<bool>& mask, int count) {
    return vgather_16<TAIL, bf16_to_float>(base, idx, mask, count);
}

template <bool TAIL>
TF_INLINE Vec<float> vgather_half(const uint16_t* base, const Vec<int64_t>& idx, const Vec<bool>& mask, int count) {
    return vgather_16<TAIL, half_to_float>(base, idx, mask, count);
}

template <bool TAIL, typename T>
TF_INLINE void vscatter(T* base, const Vec<int64_t>& idx, const Vec<T>& v, int count) {
    const int n = TAIL ? count : kVecLanes;
    for (int i = 0; i < n; ++i) base[idx[i]] = v[i];
}

template <bool TAIL>
TF_INLINE void vscatter(bool* base, const Vec<int64_t>& idx, const Vec<bool>& v, int count) {
    const int n = TAIL ? count : kVecLanes;
    for (int i = 0; i < n; ++i) base[idx[i]] = v[i];
}

template <bool TAIL>
TF_INLINE void vscatter_bf16(uint16_t* base, const Vec<int64_t>& idx, const Vec<float>& v, int count) {
    const int n = TAIL ? count : kVecLanes;
    for (int i = 0; i < n; ++i) base[idx[i]] = float_to_bf16(v[i]);
}

template <bool TAIL>
TF_INLINE void vscatter_half(uint16_t* base, const Vec<int64_t>& idx, const Vec<float>& v, int count) {
    const int n = TAIL ? count : kVecLanes;
    for (int i = 0; i < n; ++i) base[idx[i]] = float_to_half(v[i]);
}

// In the tail, lanes past `count` take the reduction's identity so they change nothing.
template <bool TAIL, typename T>
TF_INLINE Vec<T> tail_fill(const Vec<T>& v, T identity, int count) {
    if constexpr (TAIL) return where(Vec<bool>::first_n(count), v, Vec<T>(identity));
    else return v;
}

template <bool TAIL>
TF_INLINE Vec<bool> tail_fill(const Vec<bool>& v, bool identity, int count) {
    if constexpr (TAIL) return where(Vec<bool>::first_n(count), v, Vec<bool>(identity));
    else return v;
}

// A per-thread scratch buffer for a value computed and consumed inside one outer loop
// iteration (the local buffer of outer-loop fusion).
template <typename T>
struct LocalBuffer {
    std::unique_ptr<T[]> data;
    explicit LocalBuffer(int64_t n) : data(new T[n + kVecLanes]) {}
    T* get() { return data.get(); }
};

}  // namespace tf

namespace tf {

// max/min that ignore NaN (a single vmaxps/vminps): reductions keep a separate NaN flag
// instead, so the loop-carried dependency is one instruction long.
template <typename T>
TF_INLINE Vec<T> max_ignoring_nan(const Vec<T>& a, const Vec<T>& b) {
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) o.r[k] = a.r[k] > b.r[k] ? a.r[k] : b.r[k];
    return o;
}

template <typename T>
TF_INLINE Vec<T> min_ignoring_nan(const Vec<T>& a, const Vec<T>& b) {
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) o.r[k] = a.r[k] < b.r[k] ? a.r[k] : b.r[k];
    return o;
}

}  // namespace tf

namespace tf {

// The accumulator of unroll slot S among the accumulators of an unrolled loop (a
// compile-time choice, so each stays a separate register-resident variable).
template <int S, typename T, typename... Rest>
TF_INLINE T& slot(T& first, Rest&... rest) {
    if constexpr (S == 0) return first;
    else return slot<S - 1>(rest...);
}

}  // namespace tf

namespace tf {
namespace detail {
typedef float v16f __attribute__((vector_size(64)));
typedef float v16f_unaligned __attribute__((vector_size(64), aligned(4), __may_alias__));

// One butterfly stage of a 16x16 transpose: swap the off-diagonal S x S blocks.
template <int S>
TF_INLINE void transpose_stage(v16f* r) {
#define TF_LO(j) ((((j) & S) != 0) ? 16 + (j) - S : (j))
#define TF_HI(j) ((((j) & S) != 0) ? 16 + (j) : (j) + S)
    for (int i = 0; i < 16; ++i) {
        if (i & S) continue;
        const v16f a = r[i], b = r[i + S];
        r[i] = __builtin_shufflevector(a, b, TF_LO(0), TF_LO(1), TF_LO(2), TF_LO(3), TF_LO(4), TF_LO(5), TF_LO(6),
                                       TF_LO(7), TF_LO(8), TF_LO(9), TF_LO(10), TF_LO(11), TF_LO(12), TF_LO(13),
                                       TF_LO(14), TF_LO(15));
        r[i + S] = __builtin_shufflevector(a, b, TF_HI(0), TF_HI(1), TF_HI(2), TF_HI(3), TF_HI(4), TF_HI(5),
                                           TF_HI(6), TF_HI(7), TF_HI(8), TF_HI(9), TF_HI(10), TF_HI(11), TF_HI(12),
                                           TF_HI(13), TF_HI(14), TF_HI(15));
    }
#undef TF_LO
#undef TF_HI
}
}  // namespace detail

namespace detail {
typedef uint16_t v16u16_unaligned __attribute__((vector_size(32), aligned(2), __may_alias__));
typedef uint32_t v16u32 __attribute__((vector_size(64)));

// Element types of a transposing copy or write: 4-byte values copied as they are, or
// 16-bit floats converted to / from the float tile.
struct FloatBits {};
struct Bf16Bits {};
struct HalfBits {};

// 16 contiguous elements as 16 floats (the bits of 4-byte types as they are). Results go
// to an out-parameter: returning a 64-byte vector warns (-Wpsabi) on non-AVX-512 builds.
template <typename T>
TF_INLINE void load16_as_float(v16f& out, const T* p, FloatBits) {
    static_assert(sizeof(T) == 4, "4-byte element types only");
    out = *reinterpret_cast<const v16f_unaligned*>(p);
}
TF_INLINE void load16_as_float(v16f& out, const uint16_t* p, Bf16Bits) {
    out = (v16f)(__builtin_convertvector(*reinterpret_cast<const v16u16_unaligned*>(p), v16u32) << 16);
}
TF_INLINE void load16_as_float(v16f& out, const uint16_t* p, HalfBits) {
    for (int k = 0; k < 16; k += kVecLanes) {   // one register per kVecLanes lanes
        const Vec<float> part = load_half_as_float(p + k);
        std::memcpy(reinterpret_cast<float*>(&out) + k, &part.r[0], kVecLanes * sizeof(float));
    }
}

#if defined(__AVX__) && !defined(__AVX512F__)
// With 8-lane registers (AVX2) transposes go 8x8 at a time in AVX shuffles: GCC lowers the
// v16f butterflies of transpose_stage, vectors of two registers, to far more instructions
// (transpose_add f32 1024x1024 transposed: 1.90 ms -> 0.80 ms, Inductor 1.93 ms).
constexpr int kTransposeBlock = 8;

// r[i] <- column i of the 8x8 matrix whose rows are r[0..7]: unpack pairs of rows, combine
// quads, swap 128-bit halves (24 shuffles).
TF_INLINE void transpose8x8(__m256* r) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

template <typename T>
TF_INLINE __m256 load8_as_float(const T* p, FloatBits) {
    static_assert(sizeof(T) == 4, "4-byte element types only");
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}
TF_INLINE __m256 load8_as_float(const uint16_t* p, Bf16Bits) { return (__m256)load_bf16_as_float(p).r[0]; }
TF_INLINE __m256 load8_as_float(const uint16_t* p, HalfBits) { return (__m256)load_half_as_float(p).r[0]; }

TF_INLINE void store8(float* p, __m256 v, FloatBits) { _mm256_storeu_ps(p, v); }
TF_INLINE void store8(uint16_t* p, __m256 v, Bf16Bits) {
    Vec<float> x;
    x.r[0] = (Vec<float>::reg_t)v;
    store_float_as_bf16(p, x);
}
TF_INLINE void store8(uint16_t* p, __m256 v, HalfBits) {
    Vec<float> x;
    x.r[0] = (Vec<float>::reg_t)v;
    store_float_as_half(p, x);
}
#else
constexpr int kTransposeBlock = 16;
#endif
// The narrowest edge (rows or columns short of a block) that transpose_edges takes in masked
// blocks; one row or column goes element by element. A (128, 128, N) weight's copy to
// (128, N, 128), AVX-512, one thread: N = 1 27 us element by element, 30 us masked; N = 2
// 37 / 33; N = 4 56 / 35; N = 9 105 / 57.
constexpr int kShortEdgeMin = 2;

// The blocks of a transposing copy (see transpose_to_tile), kTransposeBlock square, in
// registers; Bits tells how the source's elements become the tile's.
template <int TILE_COLS, typename Bits, typename S, typename T>
TF_INLINE void transpose_blocks(const S* src, int64_t col_stride, T* tile, int64_t done_rows,
                                int64_t done_cols) {
#if defined(__AVX__) && !defined(__AVX512F__)
    for (int64_t c0 = 0; c0 < done_cols; c0 += 8) {
        for (int64_t r0 = 0; r0 < done_rows; r0 += 8) {
            __m256 block[8];
            for (int c = 0; c < 8; ++c) block[c] = load8_as_float(src + r0 + (c0 + c) * col_stride, Bits{});
            transpose8x8(block);
            for (int r = 0; r < 8; ++r) _mm256_storeu_ps(reinterpret_cast<float*>(tile + (r0 + r) * TILE_COLS + c0), block[r]);
        }
    }
#else
    for (int64_t c0 = 0; c0 < done_cols; c0 += 16) {
        for (int64_t r0 = 0; r0 < done_rows; r0 += 16) {
            // whole-vector loads and stores: a 64-byte memcpy may become two 32-byte
            // moves, and reading the halves back as one vector stalls store forwarding
            // (transpose_add ran 1.5x slower that way)
            v16f block[16];
            for (int c = 0; c < 16; ++c) load16_as_float(block[c], src + r0 + (c0 + c) * col_stride, Bits{});
            transpose_stage<8>(block);
            transpose_stage<4>(block);
            transpose_stage<2>(block);
            transpose_stage<1>(block);
            for (int r = 0; r < 16; ++r)
                *reinterpret_cast<v16f_unaligned*>(tile + (r0 + r) * TILE_COLS + c0) = block[r];
        }
    }
#endif
}

#if defined(__AVX512F__)
// The masked form of load16_as_float: lanes past the mask's read as zero, their memory untouched.
template <typename T>
TF_INLINE void load16_as_float_masked(v16f& out, const T* p, __mmask16 mask, FloatBits) {
    static_assert(sizeof(T) == 4, "4-byte element types only");
    out = (v16f)_mm512_maskz_loadu_ps(mask, p);
}
#if defined(__AVX512BW__)
TF_INLINE void load16_as_float_masked(v16f& out, const uint16_t* p, __mmask16 mask, Bf16Bits) {
    out = (v16f)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16);
}
TF_INLINE void load16_as_float_masked(v16f& out, const uint16_t* p, __mmask16 mask, HalfBits) {
    out = (v16f)_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
}
#endif

// One block of a transposing copy past the whole blocks: nr (<= 16) rows from r0 by nc
// (<= 16) columns from c0. Each column's run of rows is loaded masked (the columns past nc
// are zeros), the block transposed in registers, and each valid row stored masked.
template <int TILE_COLS, typename Bits, typename S, typename T>
TF_INLINE void transpose_block_masked(const S* src, int64_t col_stride, T* tile, int64_t r0, int nr, int64_t c0,
                                      int nc) {
    const __mmask16 rows_mask = (__mmask16)((1u << nr) - 1u), cols_mask = (__mmask16)((1u << nc) - 1u);
    v16f block[16];
    for (int c = 0; c < 16; ++c) {
        if (c < nc) load16_as_float_masked(block[c], src + r0 + (c0 + c) * col_stride, rows_mask, Bits{});
        else block[c] = v16f{};
    }
    transpose_stage<8>(block);
    transpose_stage<4>(block);
    transpose_stage<2>(block);
    transpose_stage<1>(block);
    for (int r = 0; r < nr; ++r)
        _mm512_mask_storeu_ps(reinterpret_cast<float*>(tile + (r0 + r) * TILE_COLS + c0), cols_mask, (__m512)block[r]);
}

// The edges past the whole blocks, in masked blocks where they are at least kShortEdgeMin
// wide: the rows short of a block under the whole blocks of columns, and the columns short
// of a block over every row. done_rows / done_cols grow to what transpose_rest may skip.
// A convolution weight made channels-last transposes 9 rows (a 3x3 window) by the input
// channels per output channel, and its gradient made contiguous again 9 columns by them:
// both took transpose_rest's element-by-element copy before.
template <int TILE_COLS, typename Bits, typename S, typename T>
TF_INLINE void transpose_edges(const S* src, int64_t col_stride, T* tile, int64_t rows, int64_t cols,
                               int64_t& done_rows, int64_t& done_cols) {
    const int short_rows = int(rows - done_rows), short_cols = int(cols - done_cols);
    if (short_rows >= kShortEdgeMin) {
        for (int64_t c0 = 0; c0 < done_cols; c0 += 16)
            transpose_block_masked<TILE_COLS, Bits>(src, col_stride, tile, done_rows, short_rows, c0, 16);
        done_rows = rows;
    }
    if (short_cols >= kShortEdgeMin) {
        for (int64_t r0 = 0; r0 < rows; r0 += 16)
            transpose_block_masked<TILE_COLS, Bits>(src, col_stride, tile, r0, int(std::min<int64_t>(16, rows - r0)),
                                                    done_cols, short_cols);
        done_cols = cols;
    }
}
#endif

template <typename S, typename T, typename LoadOne>
TF_INLINE void transpose_rest(const S* src, int64_t col_stride, T* tile, int TILE_COLS, int64_t rows,
                              int64_t cols, int64_t done_rows, int64_t done_cols, LoadOne load_one) {
    for (int64_t tc = 0; tc < cols; ++tc)
        for (int64_t tr = (tc < done_cols ? done_rows : 0); tr < rows; ++tr)
            tile[tr * TILE_COLS + tc] = load_one(src[tr + tc * col_stride]);
}
}  // namespace detail

namespace detail {
TF_INLINE void store16(float* p, const v16f& v, FloatBits) { *reinterpret_cast<v16f_unaligned*>(p) = v; }
template <typename Bits>
TF_INLINE void store16(uint16_t* p, const v16f& v, Bits) {
    if constexpr (kVecLanes == 16) {
        Vec<float> x;
        std::memcpy(&x.r[0], &v, sizeof v);
        if constexpr (std::is_same_v<Bits, Bf16Bits>) store_float_as_bf16(p, x);
        else store_float_as_half(p, x);
    } else {
        for (int i = 0; i < 16; ++i)
            p[i] = std::is_same_v<Bits, Bf16Bits> ? float_to_bf16(v[i]) : float_to_half(v[i]);
    }
}

// The transposed write of a tile (see store_tile_transposed); put_one(p, float) stores one
// value, Bits how (float as is, or converted to bf16 / half).
template <typename Bits, typename D, typename PutOne>
TF_INLINE void write_tile_transposed(D* dst, int64_t lane_stride, const float* tile, int rows, int count,
                                     PutOne put_one) {
    int done = 0;
#if defined(__AVX__) && !defined(__AVX512F__)
    // 8 steps x 8 lanes at a time: lane l's 8 steps become one register, stored as a run
    for (; done + 8 <= rows; done += 8) {
        __m256 block[8];
        for (int r = 0; r < 8; ++r) block[r] = _mm256_loadu_ps(tile + (done + r) * kVecLanes);
        transpose8x8(block);
        for (int l = 0; l < count; ++l) store8(dst + l * lane_stride + done, block[l], Bits{});
    }
#else
    if (kVecLanes == 16 && rows == 16) {
        v16f block[16];
        for (int r = 0; r < 16; ++r) block[r] = *reinterpret_cast<const v16f_unaligned*>(tile + r * kVecLanes);
        transpose_stage<8>(block);
        transpose_stage<4>(block);
        transpose_stage<2>(block);
        transpose_stage<1>(block);
        for (int l = 0; l < count; ++l) store16(dst + l * lane_stride, block[l], Bits{});
        return;
    }
#endif
    for (int l = 0; l < count; ++l)
        for (int r = done; r < rows; ++r) put_one(dst + l * lane_stride + r, tile[r * kVecLanes + l]);
}
}  // namespace detail

// A loop whose vector lanes are rows (x) and whose output is contiguous along the reduced
// dim (r) -- softmax of a transposed input -- stages up to 16 r steps of its vectors in
// tile[r * kVecLanes + lane] and writes them here, transposed: lane l's values go to
// dst[l * lane_stride + r], contiguous, instead of one scattered element per lane and step.
TF_INLINE void store_tile_transposed(float* dst, int64_t lane_stride, const float* tile, int rows, int count) {
    detail::write_tile_transposed<detail::FloatBits>(dst, lane_stride, tile, rows, count,
                                                     [](float* p, float v) { *p = v; });
}
TF_INLINE void store_tile_transposed_bf16(uint16_t* dst, int64_t lane_stride, const float* tile, int rows, int count) {
    detail::write_tile_transposed<detail::Bf16Bits>(dst, lane_stride, tile, rows, count,
                                                    [](uint16_t* p, float v) { *p = float_to_bf16(v); });
}
TF_INLINE void store_tile_transposed_half(uint16_t* dst, int64_t lane_stride, const float* tile, int rows, int count) {
    detail::write_tile_transposed<detail::HalfBits>(dst, lane_stride, tile, rows, count,
                                                    [](uint16_t* p, float v) { *p = float_to_half(v); });
}

// Copy a rows x cols block whose element (tr, tc) is src[tr + tc * col_stride] into
// tile[tr * TILE_COLS + tc]: a transposing copy, square blocks at a time in registers.
template <int TILE_COLS, typename T>
TF_INLINE void transpose_to_tile(const T* src, int64_t col_stride, T* tile, int64_t rows, int64_t cols) {
    int64_t done_rows = 0, done_cols = 0;
    if constexpr (sizeof(T) == 4) {
        done_rows = rows - rows % detail::kTransposeBlock;
        done_cols = cols - cols % detail::kTransposeBlock;
        detail::transpose_blocks<TILE_COLS, detail::FloatBits>(src, col_stride, tile, done_rows, done_cols);
#if defined(__AVX512F__)
        detail::transpose_edges<TILE_COLS, detail::FloatBits>(src, col_stride, tile, rows, cols, done_rows, done_cols);
#endif
    }
    detail::transpose_rest(src, col_stride, tile, TILE_COLS, rows, cols, done_rows, done_cols,
                           [](T v) { return v; });
}

namespace detail {
template <int TILE_COLS, typename Bits, typename ToFloat>
TF_INLINE void transpose_16bit_to_tile(const uint16_t* src, int64_t col_stride, float* tile, int64_t rows,
                                       int64_t cols, ToFloat to_float) {
    int64_t done_rows = rows - rows % kTransposeBlock, done_cols = cols - cols % kTransposeBlock;
    transpose_blocks<TILE_COLS, Bits>(src, col_stride, tile, done_rows, done_cols);
#if defined(__AVX512BW__)
    transpose_edges<TILE_COLS, Bits>(src, col_stride, tile, rows, cols, done_rows, done_cols);
#endif
    transpose_rest(src, col_stride, tile, TILE_COLS, rows, cols, done_rows, done_cols, to_float);
}
}  // namespace detail

// The same for bf16 / half sources, converted to the float tile on the way.
template <int TILE_COLS>
TF_INLINE void transpose_bf16_to_tile(const uint16_t* src, int64_t col_stride, float* tile, int64_t rows,
                                      int64_t cols) {
    detail::transpose_16bit_to_tile<TILE_COLS, detail::Bf16Bits>(src, col_stride, tile, rows, cols, bf16_to_float);
}
template <int TILE_COLS>
TF_INLINE void transpose_half_to_tile(const uint16_t* src, int64_t col_stride, float* tile, int64_t rows,
                                      int64_t cols) {
    detail::transpose_16bit_to_tile<TILE_COLS, detail::HalfBits>(src, col_stride, tile, rows, cols, half_to_float);
}

}  // namespace tf

namespace tf {

// Welford over a row, vectorized: full vectors update every lane together, so one scalar
// step count (and one scalar reciprocal per step) serves all lanes; the lanes of the
// partial last vector go to a scalar accumulator. welford_finish merges everything.
template <typename T>
struct WelfordAcc {
    Welford<Vec<T>> lanes;
    T steps = T(0);
    Welford<T> tail;
};

template <bool TAIL, typename T>
TF_INLINE void welford_add(WelfordAcc<T>& acc, const Vec<T>& x, int count) {
    if constexpr (TAIL) {
        for (int i = 0; i < count; ++i) acc.tail = welford_update(acc.tail, x[i]);
    } else {
        acc.steps += T(1);
        const Vec<T> reciprocal(T(1) / acc.steps);
        const Vec<T> delta = x - acc.lanes.mean;
        acc.lanes.mean = acc.lanes.mean + delta * reciprocal;
        acc.lanes.m2 = acc.lanes.m2 + delta * (x - acc.lanes.mean);
    }
}

// Welford where every lane takes a step at once (lanes are rows): one scalar step count,
// and its reciprocal, serve all lanes, so no vector division sits on the mean's chain
// (std(x.t(), -1), 513 x 1531 f32, 2 threads: 88 -> 65 us).
template <typename T>
struct WelfordLanes {
    Vec<T> mean = Vec<T>(T(0));
    Vec<T> m2 = Vec<T>(T(0));
    T steps = T(0);
};

template <typename T>
TF_INLINE WelfordLanes<T> welford_lanes_update(WelfordLanes<T> acc, const Vec<T>& x) {
    acc.steps += T(1);
    const Vec<T> delta = x - acc.mean;
    acc.mean = acc.mean + delta * Vec<T>(T(1) / acc.steps);
    acc.m2 = acc.m2 + delta * (x - acc.mean);
    return acc;
}

// Welford in accumulator rows (outer reductions: lanes are outputs). Every slot of a
// thread's rows has seen the same number of steps, so the caller passes one reciprocal of
// the step count for all of them.
template <bool TAIL, typename T>
TF_INLINE void welford_row_update(T* mean, T* m2, const Vec<T>& x, T reciprocal, int count) {
    const Vec<T> old_mean = vload<TAIL>(mean, count);
    const Vec<T> delta = x - old_mean;
    const Vec<T> new_mean = old_mean + delta * Vec<T>(reciprocal);
    vstore<TAIL>(mean, new_mean, count);
    vstore<TAIL>(m2, vload<TAIL>(m2, count) + delta * (x - new_mean), count);
}

// Chan's combination of a chunk of `steps` steps into totals of `total_steps`: the chunk's
// share of the new weight and the cross term's factor, once for all slots; then the
// counts move to the totals.
template <typename T>
TF_INLINE void welford_fold_shares(T& steps, T& total_steps, T& share, T& cross) {
    const T weight = total_steps + steps;
    share = steps / weight;
    cross = total_steps * share;
    total_steps = weight;
    steps = T(0);
}

// Fold a chunk of Welford rows (n slots of `steps` steps each) into the totals (n slots
// of `total_steps` steps each), Chan's combination, and start the chunk over.
template <typename T>
TF_INLINE void welford_rows_fold(T* mean, T* m2, T* total_mean, T* total_m2, T& steps, T& total_steps,
                                 int64_t n) {
    if (steps == T(0)) return;
    T share, cross;
    welford_fold_shares(steps, total_steps, share, cross);
    for (int64_t i = 0; i < n; ++i) {
        const T delta = mean[i] - total_mean[i];
        total_mean[i] += delta * share;
        total_m2[i] += m2[i] + delta * delta * cross;
        mean[i] = T(0);
        m2[i] = T(0);
    }
}

// A cascade of sums: add a chunk of accumulator rows to the totals and start it over.
template <typename T>
TF_INLINE void sum_rows_fold(T* row, T* total, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        total[i] += row[i];
        row[i] = T(0);
    }
}

template <typename T>
TF_INLINE void sum_fold_vec(T* row, T* total) {
    (Vec<T>::load(total) + Vec<T>::load(row)).store(total);
    Vec<T>(T(0)).store(row);
}

// welford_rows_fold for one vector of slots, after welford_fold_shares (the caller unrolls the slots' loop, so that rows
// kept in registers stay there).
template <typename T>
TF_INLINE void welford_fold_vec(T* mean, T* m2, T* total_mean, T* total_m2, T share, T cross) {
    const Vec<T> chunk_mean = Vec<T>::load(mean), old_mean = Vec<T>::load(total_mean);
    const Vec<T> delta = chunk_mean - old_mean;
    (old_mean + delta * Vec<T>(share)).store(total_mean);
    (Vec<T>::load(total_m2) + Vec<T>::load(m2) + delta * delta * Vec<T>(cross)).store(total_m2);
    Vec<T>(T(0)).store(mean);
    Vec<T>(T(0)).store(m2);
}

template <typename T>
TF_INLINE Welford<T> welford_finish(WelfordAcc<T> acc) {
    acc.lanes.weight = Vec<T>(acc.steps);
    return welford_combine(welford_reduce_lanes(acc.lanes), acc.tail);
}

// ---- scans ---------------------------------------------------------------------------
// logcumsumexp's combine, log(exp(a) + exp(b)) as eager computes it: NaN propagates and
// two equal infinities give that infinity (not inf - inf).
template <typename T>
TF_INLINE std::enable_if_t<std::is_floating_point_v<T>, T> scan_logaddexp(T a, T b) {
    const T hi = maximum(a, b), lo = minimum(a, b);
    if (lo == hi && isinf(hi)) return hi;
    return hi + std::log1p(std::exp(lo - hi));
}

template <typename T>
TF_INLINE Vec<T> scan_logaddexp(const Vec<T>& a, const Vec<T>& b) {
    const Vec<T> hi = maximum(a, b), lo = minimum(a, b);
    return where((lo == hi) & isinf(hi), hi, hi + log1p(exp(lo - hi)));
}

// cummax/cummin's indices: whether `v` takes over the running extremum `acc` (a NaN always
// does, a later equal value wins), for scalars and vectors alike.
template <typename T>
TF_INLINE auto scan_takes_max(const T& acc, const T& v) { return isnan(v) || (!isnan(acc) && v >= acc); }

template <typename T>
TF_INLINE auto scan_takes_min(const T& acc, const T& v) { return isnan(v) || (!isnan(acc) && v <= acc); }

}  // namespace tf

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

// 16 contiguous elements as 16 floats (the bits of 4-byte types as they are). Results go
// to an out-parameter: returning a 64-byte vector warns (-Wpsabi) on non-AVX-512 builds.
template <typename T>
TF_INLINE void load16_as_float_bits(v16f& out, const T* p) {
    static_assert(sizeof(T) == 4, "4-byte element types only");
    out = *reinterpret_cast<const v16f_unaligned*>(p);
}
struct Bf16Bits {};
struct HalfBits {};
TF_INLINE void load16_as_float(v16f& out, const uint16_t* p, Bf16Bits) {
    out = (v16f)(__builtin_convertvector(*reinterpret_cast<const v16u16_unaligned*>(p), v16u32) << 16);
}
TF_INLINE void load16_as_float(v16f& out, const uint16_t* p, HalfBits) {
    for (int k = 0; k < 16; k += kVecLanes) {   // one register per kVecLanes lanes
        const Vec<float> part = load_half_as_float(p + k);
        std::memcpy(reinterpret_cast<float*>(&out) + k, &part.r[0], kVecLanes * sizeof(float));
    }
}

// The 16x16 blocks of a transposing copy (see transpose_to_tile); load_row(out, p) puts the
// 16 elements at p into a v16f, for the float (or 4-byte) type the tile holds.
template <int TILE_COLS, typename S, typename T, typename LoadRow>
TF_INLINE void transpose_blocks(const S* src, int64_t col_stride, T* tile, int64_t done_rows,
                                int64_t done_cols, LoadRow load_row) {
    for (int64_t c0 = 0; c0 < done_cols; c0 += 16) {
        for (int64_t r0 = 0; r0 < done_rows; r0 += 16) {
            // whole-vector loads and stores: a 64-byte memcpy may become two 32-byte
            // moves, and reading the halves back as one vector stalls store forwarding
            // (transpose_add ran 1.5x slower that way)
            v16f block[16];
            for (int c = 0; c < 16; ++c) load_row(block[c], src + r0 + (c0 + c) * col_stride);
            transpose_stage<8>(block);
            transpose_stage<4>(block);
            transpose_stage<2>(block);
            transpose_stage<1>(block);
            for (int r = 0; r < 16; ++r)
                *reinterpret_cast<v16f_unaligned*>(tile + (r0 + r) * TILE_COLS + c0) = block[r];
        }
    }
}

template <typename S, typename T, typename LoadOne>
TF_INLINE void transpose_rest(const S* src, int64_t col_stride, T* tile, int TILE_COLS, int64_t rows,
                              int64_t cols, int64_t done_rows, int64_t done_cols, LoadOne load_one) {
    for (int64_t tc = 0; tc < cols; ++tc)
        for (int64_t tr = (tc < done_cols ? done_rows : 0); tr < rows; ++tr)
            tile[tr * TILE_COLS + tc] = load_one(src[tr + tc * col_stride]);
}
}  // namespace detail

namespace detail {
TF_INLINE void store16(float* p, const v16f& v) { *reinterpret_cast<v16f_unaligned*>(p) = v; }
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

// The transposed write of a tile (see store_tile_transposed); put(p, v16f) stores 16
// values, put_one(p, float) one.
template <typename D, typename Put, typename PutOne>
TF_INLINE void write_tile_transposed(D* dst, int64_t lane_stride, const float* tile, int rows, int count, Put put,
                                     PutOne put_one) {
    if (kVecLanes == 16 && rows == 16) {
        v16f block[16];
        for (int r = 0; r < 16; ++r) block[r] = *reinterpret_cast<const v16f_unaligned*>(tile + r * kVecLanes);
        transpose_stage<8>(block);
        transpose_stage<4>(block);
        transpose_stage<2>(block);
        transpose_stage<1>(block);
        for (int l = 0; l < count; ++l) put(dst + l * lane_stride, block[l]);
        return;
    }
    for (int l = 0; l < count; ++l)
        for (int r = 0; r < rows; ++r) put_one(dst + l * lane_stride + r, tile[r * kVecLanes + l]);
}
}  // namespace detail

// A loop whose vector lanes are rows (x) and whose output is contiguous along the reduced
// dim (r) -- softmax of a transposed input -- stages up to 16 r steps of its vectors in
// tile[r * kVecLanes + lane] and writes them here, transposed: lane l's values go to
// dst[l * lane_stride + r], contiguous, instead of one scattered element per lane and step.
TF_INLINE void store_tile_transposed(float* dst, int64_t lane_stride, const float* tile, int rows, int count) {
    detail::write_tile_transposed(dst, lane_stride, tile, rows, count,
                                  [](float* p, const detail::v16f& v) { detail::store16(p, v); },
                                  [](float* p, float v) { *p = v; });
}
TF_INLINE void store_tile_transposed_bf16(uint16_t* dst, int64_t lane_stride, const float* tile, int rows, int count) {
    detail::write_tile_transposed(dst, lane_stride, tile, rows, count,
                                  [](uint16_t* p, const detail::v16f& v) { detail::store16(p, v, detail::Bf16Bits{}); },
                                  [](uint16_t* p, float v) { *p = float_to_bf16(v); });
}
TF_INLINE void store_tile_transposed_half(uint16_t* dst, int64_t lane_stride, const float* tile, int rows, int count) {
    detail::write_tile_transposed(dst, lane_stride, tile, rows, count,
                                  [](uint16_t* p, const detail::v16f& v) { detail::store16(p, v, detail::HalfBits{}); },
                                  [](uint16_t* p, float v) { *p = float_to_half(v); });
}

// Copy a rows x cols block whose element (tr, tc) is src[tr + tc * col_stride] into
// tile[tr * TILE_COLS + tc]: a transposing copy, 16x16 blocks at a time in registers.
template <int TILE_COLS, typename T>
TF_INLINE void transpose_to_tile(const T* src, int64_t col_stride, T* tile, int64_t rows, int64_t cols) {
    int64_t done_rows = 0, done_cols = 0;
    if constexpr (sizeof(T) == 4) {
        done_rows = rows - rows % 16;
        done_cols = cols - cols % 16;
        detail::transpose_blocks<TILE_COLS>(src, col_stride, tile, done_rows, done_cols,
                                            [](detail::v16f& out, const T* p) { detail::load16_as_float_bits(out, p); });
    }
    detail::transpose_rest(src, col_stride, tile, TILE_COLS, rows, cols, done_rows, done_cols,
                           [](T v) { return v; });
}

namespace detail {
template <int TILE_COLS, typename Bits, typename ToFloat>
TF_INLINE void transpose_16bit_to_tile(const uint16_t* src, int64_t col_stride, float* tile, int64_t rows,
                                       int64_t cols, ToFloat to_float) {
    const int64_t done_rows = rows - rows % 16, done_cols = cols - cols % 16;
    transpose_blocks<TILE_COLS>(src, col_stride, tile, done_rows, done_cols,
                                [](v16f& out, const uint16_t* p) { load16_as_float(out, p, Bits{}); });
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

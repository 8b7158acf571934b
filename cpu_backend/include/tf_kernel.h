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

// The accumulator of unroll slot S among four (a compile-time choice, so each stays a
// separate register-resident variable).
template <int S, typename T>
TF_INLINE T& slot(T& a, T& b, T& c, T& d) {
    if constexpr (S == 0) return a;
    else if constexpr (S == 1) return b;
    else if constexpr (S == 2) return c;
    else return d;
}

}  // namespace tf

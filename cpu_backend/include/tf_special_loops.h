// tf_special_loops.h: the recurrence loops of torch.special's orthogonal polynomials, whose
// trip count is a value of the tensor (the degree n). Part of tritonfuse_vec.h.
//
// Each function runs the three-term recurrence of one polynomial family from p = 1 and the
// given q (the degree-1 value), step for step as ATen's Math.h writes it (the same
// operations in the same order and types, so results agree to the bit), and returns the
// last value. The special cases (n < 0, |x| == 1, closed forms for large n, ...) are
// written once in shared code (tritonfuse/special_polynomials.py), which passes n = 0 to
// lanes that do not take the loop. n arrives as a float holding an integer.
//
//   chebyshev_loop(a, n, q)   r = a q - p,                                 k = 2 .. n      (stops at NaN)
//   hermite_h_loop(x, n, q)   r = (x + x) q - k p,                         k = 2, 4 .. < 2n
//   hermite_he_loop(x, n, q)  r = x q - k p,                               k = 1 .. n - 1
//   laguerre_loop(x, n, q)    r = ((k + k) + (1 - x)) q - k p) / (k + 1),  k = 1 .. n - 1  (stops at NaN)
//   legendre_loop(x, n, q)    r = ((k + k + 1) x q - k p) / (k + 1),       k = 1 .. n - 1  (stops at NaN)
#pragma once

#include <cmath>
#include <cstdint>

#include "tf_vec_core.h"

namespace tf {
namespace detail {

template <typename T>
TF_INLINE int64_t loop_degree(T n) {
    return n >= T(0) ? static_cast<int64_t>(n) : int64_t(-1);
}

template <typename T, typename F>
TF_INLINE Vec<T> map_lanes3(const Vec<T>& a, const Vec<T>& b, const Vec<T>& c, F f) {
    T la[kVecLanes], lb[kVecLanes], lc[kVecLanes];
    a.store(la);
    b.store(lb);
    c.store(lc);
    for (int i = 0; i < kVecLanes; ++i) la[i] = f(la[i], lb[i], lc[i]);
    return Vec<T>::load(la);
}

}  // namespace detail

template <typename T>
TF_INLINE T chebyshev_loop(T a, T degree, T q) {
    const int64_t n = detail::loop_degree(degree);
    T p = T(1.0);
    for (int64_t k = 2; (k <= n) && !std::isnan(q); k++) {
        T r = a * q - p;
        p = q;
        q = r;
    }
    return q;
}

template <typename T>
TF_INLINE T hermite_h_loop(T x, T degree, T q) {
    const int64_t n = detail::loop_degree(degree);
    T p = T(1.0);
    for (int64_t k = 2; k < n + n; k += 2) {
        T r = (x + x) * q - k * p;
        p = q;
        q = r;
    }
    return q;
}

template <typename T>
TF_INLINE T hermite_he_loop(T x, T degree, T q) {
    const int64_t n = detail::loop_degree(degree);
    T p = T(1.0);
    for (int64_t k = 1; k < n; k++) {
        T r = x * q - k * p;
        p = q;
        q = r;
    }
    return q;
}

template <typename T>
TF_INLINE T laguerre_loop(T x, T degree, T q) {
    const int64_t n = detail::loop_degree(degree);
    T p = T(1.0);
    for (int64_t k = 1; (k < n) && !std::isnan(q); k++) {
        T r = (((k + k) + (T(1.0) - x)) * q - k * p) / (k + 1);
        p = q;
        q = r;
    }
    return q;
}

template <typename T>
TF_INLINE T legendre_loop(T x, T degree, T q) {
    const int64_t n = detail::loop_degree(degree);
    T p = T(1.0);
    for (int64_t k = 1; (k < n) && !std::isnan(q); k++) {
        T r = ((k + k + 1) * x * q - k * p) / (k + 1);
        p = q;
        q = r;
    }
    return q;
}

// Vectors: lane by lane (each lane has its own trip count).
#define TF_LOOP_LANES(NAME)                                                                      \
    template <typename T>                                                                        \
    TF_INLINE Vec<T> NAME(const Vec<T>& a, const Vec<T>& b, const Vec<T>& c) {                   \
        return detail::map_lanes3(a, b, c, [](T x, T y, T z) { return NAME(x, y, z); });         \
    }
TF_LOOP_LANES(chebyshev_loop)
TF_LOOP_LANES(hermite_h_loop)
TF_LOOP_LANES(hermite_he_loop)
TF_LOOP_LANES(laguerre_loop)
TF_LOOP_LANES(legendre_loop)
#undef TF_LOOP_LANES

}  // namespace tf

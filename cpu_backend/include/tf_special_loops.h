// tf_special_loops.h: loops whose trip count is a value of the tensor: the recurrences of
// torch.special's orthogonal polynomials (the degree n), and the Hurwitz zeta series, Airy
// Ai's power series and the incomplete gamma functions' loops (each run until it converges).
// Part of tritonfuse_vec.h.
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
#include <limits>
#include <type_traits>

#include "tf_vec_core.h"
#include "tf_vec_math.h"

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

// ---- Hurwitz zeta(x, q): ATen's Cephes-derived series, in double (the CPU accumulate type
// of float too): terms of the direct sum until they vanish against it (at least 9, and
// until a > 9: a trip count that follows q), then up to 12 Euler-Maclaurin corrections.
namespace tf {

template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
TF_INLINE T zeta(T x_in, T q_in) {
    const double x = x_in, q = q_in;
    const double MACHEP = 1.11022302462515654042E-16;
    static const double A[] = {12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
                               7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
                               -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18};
    if (x == 1.0) return std::numeric_limits<T>::infinity();
    if (x < 1.0) return std::numeric_limits<T>::quiet_NaN();
    if (q <= 0.0) {
        if (q == std::floor(q)) return std::numeric_limits<T>::infinity();
        if (x != std::floor(x)) return std::numeric_limits<T>::quiet_NaN();
    }
    double s = std::pow(q, -x), a = q, b = 0.0;
    int i = 0;
    while ((i < 9) || (a <= 9.0)) {
        i += 1;
        a += 1.0;
        b = std::pow(a, -x);
        s += b;
        if ((-MACHEP * s < b) && (b < MACHEP * s)) return static_cast<T>(s);
    }
    const double w = a;
    s += b * w / (x - 1.0);
    s -= 0.5 * b;
    a = 1.0;
    double k = 0.0;
    for (int j = 0; j < 12; j++) {
        a *= x + k;
        b /= w;
        double t = a * b / A[j];
        s = s + t;
        t = std::fabs(t / s);
        if (t < MACHEP) return static_cast<T>(s);
        k += 1.0;
        a *= x + k;
        b /= w;
        k += 1.0;
    }
    return static_cast<T>(s);
}

template <typename T>
TF_INLINE Vec<T> zeta(const Vec<T>& x, const detail::id_t<Vec<T>>& q) {
    return detail::map_lanes(x, q, [](T a, T b) { return zeta(a, b); });
}

}  // namespace tf

// ---- Airy Ai's power series (ATen's airy_ai_forward for -2.09 <= x < 2.09): the terms of
// f and g until the last one of f vanishes against f (T's epsilon); returns
// c1 f - c2 g. The asymptotic forms outside are composites (tritonfuse/special_airy.py).
namespace tf {

template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
TF_INLINE T airy_ai_series(T x) {
    T f = 1.0, g = x, k = 1.0, m = 1.0, n = x, t = 1.0;
    const T z = x * x * x;
    while (t > std::numeric_limits<T>::epsilon()) {
        m *= z;
        k += T(1.0);
        m /= k;
        n *= z;
        k += T(1.0);
        n /= k;
        m /= k;
        f += m;
        k += T(1.0);
        n /= k;
        g += n;
        t = std::abs(m / f);
    }
    return T(0.355028053887817239260) * f - T(0.258819403792806798405) * g;
}

template <typename T>
TF_INLINE Vec<T> airy_ai_series(const Vec<T>& x) {
    return detail::map_lanes(x, [](T a) { return airy_ai_series(a); });
}

}  // namespace tf

// ---- The incomplete gamma functions' loops (ATen's Math.h, from SciPy/Cephes), each until
// its terms vanish against its sum (T's MACHEP) or 2000 steps, in T as eager's CPU kernel
// runs them: the power series of P (DLMF 8.11.4, returns the sum), the series of Q for small
// x (DLMF 8.7.3, returns the sum) and Q's continued fraction (DLMF 8.9.2, returns its value).
// What Math.h makes of these, and which one a lane takes, is written once
// (tritonfuse/special_igamma.py).
namespace tf {
namespace detail {

template <typename T>
constexpr T igamma_machep() {
    return std::is_same_v<T, double> ? T(1.11022302462515654042E-16) : T(5.9604644775390625E-8);
}

constexpr int kIgammaMaxIter = 2000;

}  // namespace detail

template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
TF_INLINE T igamma_series(T a, T x) {
    T r = a, c = 1.0, ans = 1.0;
    for (int i = 0; i < detail::kIgammaMaxIter; i++) {
        r += T(1.0);
        c *= x / r;
        ans += c;
        if (c <= detail::igamma_machep<T>() * ans) break;
    }
    return ans;
}

template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
TF_INLINE T igammac_series(T a, T x) {
    T fac = 1.0, sum = 0.0;
    for (int n = 1; n < detail::kIgammaMaxIter; n++) {
        fac *= -x / n;
        const T term = fac / (a + n);
        sum += term;
        if (std::abs(term) <= detail::igamma_machep<T>() * std::abs(sum)) break;
    }
    return sum;
}

template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
TF_INLINE T igammac_fraction(T a, T x) {
    const T big = std::is_same_v<T, double> ? T(4.503599627370496e15) : T(16777216.);
    const T big_inverse = std::is_same_v<T, double> ? T(2.22044604925031308085e-16) : T(5.9604644775390625E-8);
    T y = T(1.0) - a, z = x + y + T(1.0), c = 0.0;
    T pkm2 = 1.0, qkm2 = x, pkm1 = x + T(1.0), qkm1 = z * x;
    T ans = pkm1 / qkm1;
    for (int i = 0; i < detail::kIgammaMaxIter; i++) {
        c += T(1.0);
        y += T(1.0);
        z += T(2.0);
        const T yc = y * c;
        const T pk = pkm1 * z - pkm2 * yc;
        const T qk = qkm1 * z - qkm2 * yc;
        T t = 1.0;
        if (qk != 0) {
            const T r = pk / qk;
            t = std::abs((ans - r) / r);
            ans = r;
        }
        pkm2 = pkm1;
        pkm1 = pk;
        qkm2 = qkm1;
        qkm1 = qk;
        if (std::abs(pk) > big) {
            pkm2 *= big_inverse;
            pkm1 *= big_inverse;
            qkm2 *= big_inverse;
            qkm1 *= big_inverse;
        }
        if (t <= detail::igamma_machep<T>()) break;
    }
    return ans;
}

#define TF_IGAMMA_LANES(NAME)                                                      \
    template <typename T>                                                          \
    TF_INLINE Vec<T> NAME(const Vec<T>& a, const detail::id_t<Vec<T>>& x) {        \
        return detail::map_lanes(a, x, [](T p, T q) { return NAME(p, q); });       \
    }
TF_IGAMMA_LANES(igamma_series)
TF_IGAMMA_LANES(igammac_series)
TF_IGAMMA_LANES(igammac_fraction)
#undef TF_IGAMMA_LANES

}  // namespace tf

// tf_int.h: integer ops with eager's semantics where C++ leaves them undefined or differs.
// Part of tritonfuse_vec.h (include that one). Each op takes scalars or tf::Vec, so one
// spelling in generated code serves scalar and vector loops.
//
//   wrap<T>(x)              a scalar int8/int16/uint8 result back to T: C++ computes them
//                           in int (200 + 100 is 300, eager's uint8 gives 44); Vec lanes
//                           already hold T. Kernels are built with -fwrapv, so int32 and
//                           int64 arithmetic wraps as two's complement too.
//   shift_left/shift_right  eager's rule for amounts < 0 or >= the bit width (the Vec
//                           operators << and >> in tf_vec_core.h follow it too)
//   div_trunc/mod_trunc(a, b, active, zero_division)
//                           C's / and %, without the traps: a zero divisor gives 0 and
//                           INT_MIN / -1 wraps to INT_MIN (remainder 0). A zero divisor in
//                           an active lane (not a tail lane, not masked off) sets the
//                           kernel's zero_division flag; the kernel returns it and the
//                           wrapper raises eager's error.
//   pow_int(a, b)           eager's integer power (ATen's powi): repeated squaring, wrapping
//                           in T; a negative exponent gives 0, but 1 for a == 1 and +-1 for
//                           a == -1
//   gcd(a, b)               ATen's calc_gcd: Euclid's loop on |a|, |b| in T (|INT_MIN| stays
//                           INT_MIN, so a gcd with it can be negative, as eager's)
#pragma once

#include <cstdint>
#include <type_traits>

#include "tf_vec_core.h"
#include "tf_vec_math.h"   // detail::map_lanes

namespace tf {

template <typename T, typename V>
TF_INLINE std::enable_if_t<std::is_arithmetic_v<V>, T> wrap(V x) {
    return T(x);
}
template <typename T>
TF_INLINE Vec<T> wrap(const Vec<T>& x) {
    return x;
}

template <typename T>
TF_INLINE std::enable_if_t<std::is_integral_v<T>, T> shift_left(T a, T b) {
    if (b < 0 || b >= T(sizeof(T) * 8)) return T(0);
    return T(std::make_unsigned_t<T>(a) << b);
}
template <typename T>
TF_INLINE std::enable_if_t<std::is_integral_v<T>, T> shift_right(T a, T b) {
    constexpr T width = T(sizeof(T) * 8);
    if (b < 0 || b >= width) {
        if constexpr (std::is_signed_v<T>) return T(a >> (width - 1));
        return T(0);
    }
    return T(a >> b);
}
template <typename T>
TF_INLINE Vec<T> shift_left(const Vec<T>& a, const Vec<T>& b) { return a << b; }
template <typename T>
TF_INLINE Vec<T> shift_right(const Vec<T>& a, const Vec<T>& b) { return a >> b; }

// The lanes of a vector chunk that hold elements: all, or the first `count` in the tail.
template <bool TAIL>
TF_INLINE Vec<bool> active_lanes(int count) {
    if constexpr (TAIL) return Vec<bool>::first_n(count);
    else return Vec<bool>(true);
}

TF_INLINE void note_zero_division(int& zero_division) {
    __atomic_store_n(&zero_division, 1, __ATOMIC_RELAXED);   // OpenMP threads share it
}

namespace detail {
template <typename T>
TF_INLINE T int_div_scalar(T a, T b, bool remainder) {
    if (b == 0) return T(0);
    if constexpr (std::is_signed_v<T>) {
        if (b == T(-1)) return remainder ? T(0) : T(std::make_unsigned_t<T>(0) - std::make_unsigned_t<T>(a));
    }
    return remainder ? T(a % b) : T(a / b);
}
}  // namespace detail

template <typename T>
TF_INLINE std::enable_if_t<std::is_integral_v<T>, T> div_trunc(T a, T b, bool active, int& zero_division) {
    if (active && b == 0) note_zero_division(zero_division);
    return detail::int_div_scalar(a, b, false);
}
template <typename T>
TF_INLINE std::enable_if_t<std::is_integral_v<T>, T> mod_trunc(T a, T b, bool active, int& zero_division) {
    if (active && b == 0) note_zero_division(zero_division);
    return detail::int_div_scalar(a, b, true);
}
template <typename T>
TF_INLINE Vec<T> div_trunc(const Vec<T>& a, const Vec<T>& b, const Vec<bool>& active, int& zero_division) {
    if (((b == Vec<T>(T(0))) & active).bits()) note_zero_division(zero_division);
    return a / b;   // tf_vec_core.h's int_div: no traps
}
template <typename T>
TF_INLINE Vec<T> mod_trunc(const Vec<T>& a, const Vec<T>& b, const Vec<bool>& active, int& zero_division) {
    if (((b == Vec<T>(T(0))) & active).bits()) note_zero_division(zero_division);
    return a % b;
}

// ---- loops whose trip count follows the values: integer power and gcd, per lane on Vecs.
// The scalar arithmetic stays in T (assigning back to T wraps int8/int16/uint8 as eager's
// int-promoted `result *= a` does; -fwrapv wraps int32/int64).
template <typename T>
TF_INLINE std::enable_if_t<std::is_integral_v<T>, T> pow_int(T a, detail::id_t<T> b) {
    if constexpr (std::is_signed_v<T>) {
        if (b < 0) {
            if (a == T(1)) return T(1);
            if (a == T(-1)) return (b & T(1)) ? T(-1) : T(1);
            return T(0);
        }
    }
    T result = T(1);
    while (b) {
        if (b & T(1)) result = T(result * a);
        b = T(b / 2);
        a = T(a * a);
    }
    return result;
}

template <typename T>
TF_INLINE std::enable_if_t<std::is_integral_v<T>, T> gcd(T a, detail::id_t<T> b) {
    if constexpr (std::is_signed_v<T>) {
        a = T(a < 0 ? -a : a);
        b = T(b < 0 ? -b : b);
    }
    while (a != 0) {
        const T c = a;
        a = T(b % a);
        b = c;
    }
    return b;
}

template <typename T>
TF_INLINE Vec<T> pow_int(const Vec<T>& a, const Vec<T>& b) {
    return detail::map_lanes(a, b, [](T x, T y) { return pow_int(x, y); });
}
template <typename T>
TF_INLINE Vec<T> gcd(const Vec<T>& a, const Vec<T>& b) {
    return detail::map_lanes(a, b, [](T x, T y) { return gcd(x, y); });
}

}  // namespace tf

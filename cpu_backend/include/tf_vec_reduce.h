// tritonfuse reductions: horizontal (across the lanes of one vector), Welford mean/variance
// accumulators and argmax/argmin accumulators, for scalars and for vectors lane-wise.
// Part of tritonfuse_vec.h.
#pragma once

#include "tf_vec_math.h"

namespace tf {

// ---------------------------------------------------------------------------------------
// Horizontal reductions: combine the kVecLanes lanes of one vector (pairwise tree).
// ---------------------------------------------------------------------------------------
namespace detail {
// The same pairwise tree in one register of 16 lanes (AVX-512, 1- to 4-byte lanes): each step
// folds the upper half of the lanes still live onto the lower, by a shuffle, not through
// a store and scalar loads (var_mean f16 8192x512: 189 -> 152 us on the 2-core EPYC).
template <typename T, typename Op>
TF_INLINE T tree_reduce_in_register(const Vec<T>& v, Op op) {
    Vec<T> x = v, y;
    y.r[0] = __builtin_shufflevector(x.r[0], x.r[0], 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    x.r[0] = op(x, y).r[0];
    y.r[0] = __builtin_shufflevector(x.r[0], x.r[0], 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
    x.r[0] = op(x, y).r[0];
    y.r[0] = __builtin_shufflevector(x.r[0], x.r[0], 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    x.r[0] = op(x, y).r[0];
    y.r[0] = __builtin_shufflevector(x.r[0], x.r[0], 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
    return op(x, y).r[0][0];
}

// `op` combines two values of T, or two Vec<T> lane by lane.
template <typename T, typename Op>
TF_INLINE T tree_reduce(const Vec<T>& v, Op op) {
    if constexpr (Vec<T>::kRegs == 1 && Vec<T>::kLanesPerReg == 16 && !std::is_same_v<T, bool>) {
        return tree_reduce_in_register(v, op);
    }
    T lanes[kVecLanes];
    v.store(lanes);
    for (int width = kVecLanes / 2; width > 0; width /= 2)
        for (int i = 0; i < width; ++i) lanes[i] = T(op(lanes[i], lanes[i + width]));
    return lanes[0];
}
}  // namespace detail

template <typename T>
TF_INLINE T reduce_add(const Vec<T>& v) {
    // Fold the registers first (vector adds), then the lanes of the one left.
    if constexpr (Vec<T>::kRegs > 1) {
        Vec<T> lo = v;
        for (int k = 1; k < Vec<T>::kRegs; ++k) lo.r[0] += v.r[k];
        T sum = lo.r[0][0];
        for (int i = 1; i < Vec<T>::kLanesPerReg; ++i) sum += lo.r[0][i];
        return sum;
    }
    return detail::tree_reduce(v, [](auto a, auto b) { return a + b; });
}
template <typename T>
TF_INLINE T reduce_mul(const Vec<T>& v) {
    return detail::tree_reduce(v, [](auto a, auto b) { return a * b; });
}
// NaN-propagating, like torch.max / torch.amax.
template <typename T>
TF_INLINE T reduce_max(const Vec<T>& v) {
    return detail::tree_reduce(v, [](auto a, auto b) { return maximum(a, b); });
}
template <typename T>
TF_INLINE T reduce_min(const Vec<T>& v) {
    return detail::tree_reduce(v, [](auto a, auto b) { return minimum(a, b); });
}
TF_INLINE bool reduce_any(const Vec<bool>& m) { return m.bits() != 0; }
TF_INLINE bool reduce_all(const Vec<bool>& m) { return m.bits() == (1u << kVecLanes) - 1u; }
// Scalar forms, so that a reduction body reads the same whether it is vectorized or not.
template <typename T> TF_INLINE Num<T> reduce_add(T x) { return x; }
template <typename T> TF_INLINE Num<T> reduce_mul(T x) { return x; }
template <typename T> TF_INLINE Num<T> reduce_max(T x) { return x; }
template <typename T> TF_INLINE Num<T> reduce_min(T x) { return x; }
TF_INLINE bool reduce_any(bool x) { return x; }
TF_INLINE bool reduce_all(bool x) { return x; }

// ---------------------------------------------------------------------------------------
// Welford: running mean and sum of squared deviations (m2). T is a scalar (float,
// double) or a vector (Vec<float>: every lane is an independent accumulator).
// variance = m2 / weight (population) or m2 / (weight - 1) (unbiased).
// ---------------------------------------------------------------------------------------
template <typename T>
struct Welford {
    T mean = T(0);
    T m2 = T(0);
    T weight = T(0);
};

template <typename T>
TF_INLINE Welford<T> welford_update(const Welford<T>& acc, const detail::id_t<T>& x) {
    const T weight = acc.weight + T(1);
    const T delta = x - acc.mean;
    const T mean = acc.mean + delta / weight;
    return {mean, acc.m2 + delta * (x - mean), weight};
}

// Chan et al.'s pairwise combination. An empty side returns the other side unchanged
// (selected, not computed: 0 * inf would turn an inf mean into nan).
template <typename T>
TF_INLINE Welford<T> welford_combine(const Welford<T>& a, const Welford<T>& b) {
    const T zero(0);
    const T weight = a.weight + b.weight;
    const T delta = b.mean - a.mean;
    const T nb = where(weight == zero, zero, b.weight / where(weight == zero, T(1), weight));
    Welford<T> r{a.mean + delta * nb, a.m2 + b.m2 + delta * delta * a.weight * nb, weight};
    const auto a_empty = a.weight == zero, b_empty = b.weight == zero;
    r = {where(b_empty, a.mean, r.mean), where(b_empty, a.m2, r.m2), where(b_empty, a.weight, r.weight)};
    r = {where(a_empty, b.mean, r.mean), where(a_empty, b.m2, r.m2), where(a_empty, b.weight, r.weight)};
    return r;
}

// Update only lanes i < count (the tail of a vectorized loop).
template <typename E>
TF_INLINE Welford<Vec<E>> welford_update_partial(const Welford<Vec<E>>& acc, const Vec<E>& x, int count) {
    const Welford<Vec<E>> u = welford_update(acc, x);
    const Vec<bool> m = Vec<bool>::first_n(count);
    return {where(m, u.mean, acc.mean), where(m, u.m2, acc.m2), where(m, u.weight, acc.weight)};
}

// Combine the lanes of a vector accumulator into one scalar accumulator.
template <typename E>
TF_INLINE Welford<E> welford_reduce_lanes(const Welford<Vec<E>>& acc) {
    Welford<E> lanes[kVecLanes];
    for (int i = 0; i < kVecLanes; ++i) lanes[i] = {acc.mean[i], acc.m2[i], acc.weight[i]};
    for (int width = kVecLanes / 2; width > 0; width /= 2)
        for (int i = 0; i < width; ++i) lanes[i] = welford_combine(lanes[i], lanes[i + width]);
    return lanes[0];
}

// ---------------------------------------------------------------------------------------
// argmax / argmin with torch's semantics: the first index of the extreme value; NaN
// counts as larger (argmax) / smaller (argmin) than everything, and the first NaN wins.
// index < 0 marks an empty accumulator. T is a scalar, or Vec<E> (lane-wise, with the
// indices in a Vec<int64_t>). Updates must come in increasing index order per lane.
// ---------------------------------------------------------------------------------------
namespace detail {
template <typename T> struct ArgIndex { using type = int64_t; };
template <typename E> struct ArgIndex<Vec<E>> { using type = Vec<int64_t>; };
}  // namespace detail

template <typename T>
struct ArgAcc {
    T value = T(0);
    typename detail::ArgIndex<T>::type index = -1;
};

namespace detail {
// Would `v` (seen after acc) replace acc? Scalar and vector forms.
template <bool kMax, typename T>
TF_INLINE bool arg_takes(const ArgAcc<T>& acc, T v) {
    const bool better = kMax ? v > acc.value : v < acc.value;
    return acc.index < 0 || better || (isnan(v) && !isnan(acc.value));
}
template <bool kMax, typename E>
TF_INLINE Vec<bool> arg_takes(const ArgAcc<Vec<E>>& acc, const Vec<E>& v) {
    const Vec<bool> better = kMax ? v > acc.value : v < acc.value;
    return (acc.index < Vec<int64_t>(0)) | better | (isnan(v) & !isnan(acc.value));
}
template <bool kMax, typename T>
TF_INLINE ArgAcc<T> arg_update(const ArgAcc<T>& acc, const T& v, const typename ArgIndex<T>::type& i) {
    const auto take = arg_takes<kMax>(acc, v);
    return {where(take, v, acc.value), where(take, i, acc.index)};
}
// Order-independent combination of two scalar accumulators.
template <bool kMax, typename T>
TF_INLINE ArgAcc<T> arg_combine(const ArgAcc<T>& a, const ArgAcc<T>& b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool an = isnan(a.value), bn = isnan(b.value);
    if (an || bn) {
        if (an && bn) return a.index <= b.index ? a : b;
        return an ? a : b;
    }
    if (a.value == b.value) return a.index <= b.index ? a : b;
    return (kMax ? a.value > b.value : a.value < b.value) ? a : b;
}
template <bool kMax, typename E>
TF_INLINE ArgAcc<E> arg_reduce_lanes(const ArgAcc<Vec<E>>& acc) {
    ArgAcc<E> r;
    for (int i = 0; i < kVecLanes; ++i) r = arg_combine<kMax>(r, ArgAcc<E>{acc.value[i], acc.index[i]});
    return r;
}
}  // namespace detail

template <typename T>
TF_INLINE ArgAcc<T> argmax_update(const ArgAcc<T>& acc, const detail::id_t<T>& v,
                                  const typename detail::ArgIndex<T>::type& index) {
    return detail::arg_update<true>(acc, v, index);
}
template <typename T>
TF_INLINE ArgAcc<T> argmin_update(const ArgAcc<T>& acc, const detail::id_t<T>& v,
                                  const typename detail::ArgIndex<T>::type& index) {
    return detail::arg_update<false>(acc, v, index);
}
template <typename T>
TF_INLINE ArgAcc<T> argmax_combine(const ArgAcc<T>& a, const ArgAcc<T>& b) { return detail::arg_combine<true>(a, b); }
template <typename T>
TF_INLINE ArgAcc<T> argmin_combine(const ArgAcc<T>& a, const ArgAcc<T>& b) { return detail::arg_combine<false>(a, b); }
// Vector tails: only lanes i < count are updated.
template <typename E>
TF_INLINE ArgAcc<Vec<E>> argmax_update_partial(const ArgAcc<Vec<E>>& acc, const Vec<E>& v,
                                               const Vec<int64_t>& index, int count) {
    const ArgAcc<Vec<E>> u = argmax_update(acc, v, index);
    const Vec<bool> m = Vec<bool>::first_n(count);
    return {where(m, u.value, acc.value), where(m, u.index, acc.index)};
}
template <typename E>
TF_INLINE ArgAcc<Vec<E>> argmin_update_partial(const ArgAcc<Vec<E>>& acc, const Vec<E>& v,
                                               const Vec<int64_t>& index, int count) {
    const ArgAcc<Vec<E>> u = argmin_update(acc, v, index);
    const Vec<bool> m = Vec<bool>::first_n(count);
    return {where(m, u.value, acc.value), where(m, u.index, acc.index)};
}
template <typename E>
TF_INLINE ArgAcc<E> argmax_reduce_lanes(const ArgAcc<Vec<E>>& acc) { return detail::arg_reduce_lanes<true>(acc); }
template <typename E>
TF_INLINE ArgAcc<E> argmin_reduce_lanes(const ArgAcc<Vec<E>>& acc) { return detail::arg_reduce_lanes<false>(acc); }

}  // namespace tf

#include "tritonfuse_vec.h"
#include <algorithm>

using tf::Vec;
constexpr int64_t L = tf::kVecLanes;
static inline int tail(int64_t n, int64_t i) { return n - i < L ? int(n - i) : int(L); }

extern "C" void lanes(int64_t* out) { *out = L; }

// y = f(x) elementwise, vector loop with a partial tail; and the scalar overload.
#define UNARY(NAME, T, EXPR)                                                         \
    extern "C" void vec_##NAME##_##T(const T* xp, T* yp, int64_t n) {                \
        using E = T;                                                                 \
        for (int64_t i = 0; i < n; i += L) {                                         \
            const int c = tail(n, i);                                                \
            const Vec<T> x = Vec<T>::load_partial(xp + i, c);                        \
            const Vec<T> y = EXPR;                                                   \
            y.store_partial(yp + i, c);                                              \
        }                                                                            \
    }                                                                                \
    extern "C" void scalar_##NAME##_##T(const T* xp, T* yp, int64_t n) {             \
        using E = T;                                                                 \
        for (int64_t i = 0; i < n; ++i) { const T x = xp[i]; yp[i] = EXPR; }         \
    }
#define FLOAT_UNARY(NAME, EXPR) UNARY(NAME, float, EXPR) UNARY(NAME, double, EXPR)
FLOAT_UNARY(exp, tf::exp(x))
FLOAT_UNARY(exp2, tf::exp2(x))
FLOAT_UNARY(expm1, tf::expm1(x))
FLOAT_UNARY(log, tf::log(x))
FLOAT_UNARY(log2, tf::log2(x))
FLOAT_UNARY(log10, tf::log10(x))
FLOAT_UNARY(log1p, tf::log1p(x))
FLOAT_UNARY(sqrt, tf::sqrt(x))
FLOAT_UNARY(rsqrt, tf::rsqrt(x))
FLOAT_UNARY(tanh, tf::tanh(x))
FLOAT_UNARY(sigmoid, tf::sigmoid(x))
FLOAT_UNARY(erf, tf::erf(x))
FLOAT_UNARY(sin, tf::sin(x))
FLOAT_UNARY(cos, tf::cos(x))
FLOAT_UNARY(abs, tf::abs(x))
// tf_vec_special.h
FLOAT_UNARY(asin, tf::asin(x))
FLOAT_UNARY(acos, tf::acos(x))
FLOAT_UNARY(atan, tf::atan(x))
FLOAT_UNARY(sinh, tf::sinh(x))
FLOAT_UNARY(cosh, tf::cosh(x))
FLOAT_UNARY(asinh, tf::asinh(x))
FLOAT_UNARY(acosh, tf::acosh(x))
FLOAT_UNARY(atanh, tf::atanh(x))
FLOAT_UNARY(erfc, tf::erfc(x))
FLOAT_UNARY(erfcx, tf::erfcx(x))
FLOAT_UNARY(signbit, tf::where(tf::signbit(x), E(1), E(0)))
FLOAT_UNARY(floor, tf::floor(x))
FLOAT_UNARY(ceil, tf::ceil(x))
FLOAT_UNARY(trunc, tf::trunc(x))
FLOAT_UNARY(round, tf::round(x))
FLOAT_UNARY(reciprocal, tf::reciprocal(x))
FLOAT_UNARY(sign, tf::sign(x))
FLOAT_UNARY(neg, -x)
FLOAT_UNARY(tan, tf::tan(x))
FLOAT_UNARY(isnan, tf::where(tf::isnan(x), E(1), E(0)))
FLOAT_UNARY(isinf, tf::where(tf::isinf(x), E(1), E(0)))

#define BINARY(NAME, T, EXPR)                                                        \
    extern "C" void vec_##NAME##_##T(const T* ap, const T* bp, T* yp, int64_t n) {   \
        for (int64_t i = 0; i < n; i += L) {                                         \
            const int c = tail(n, i);                                                \
            const Vec<T> a = Vec<T>::load_partial(ap + i, c);                        \
            const Vec<T> b = Vec<T>::load_partial(bp + i, c);                        \
            const Vec<T> y = EXPR;                                                   \
            y.store_partial(yp + i, c);                                              \
        }                                                                            \
    }                                                                                \
    extern "C" void scalar_##NAME##_##T(const T* ap, const T* bp, T* yp, int64_t n) { \
        for (int64_t i = 0; i < n; ++i) { const T a = ap[i], b = bp[i]; yp[i] = EXPR; } \
    }
#define FLOAT_BINARY(NAME, EXPR) BINARY(NAME, float, EXPR) BINARY(NAME, double, EXPR)
FLOAT_BINARY(pow, tf::pow(a, b))
FLOAT_BINARY(fmod, tf::fmod(a, b))
FLOAT_BINARY(maximum, tf::maximum(a, b))
FLOAT_BINARY(minimum, tf::minimum(a, b))
FLOAT_BINARY(add, a + b)
FLOAT_BINARY(sub, a - b)
FLOAT_BINARY(mul, a * b)
FLOAT_BINARY(div, a / b)
FLOAT_BINARY(copysign, tf::copysign(a, b))
FLOAT_BINARY(atan2, tf::atan2(a, b))
FLOAT_BINARY(hypot, tf::hypot(a, b))
FLOAT_BINARY(nextafter, tf::nextafter(a, b))

#define INT_BINARIES(T)                                                              \
    BINARY(add, T, a + b) BINARY(sub, T, a - b) BINARY(mul, T, a * b)                \
    BINARY(div, T, a / b) BINARY(mod, T, a % b) BINARY(and, T, a & b)                \
    BINARY(or, T, a | b) BINARY(xor, T, a ^ b) BINARY(shl, T, a << b)                \
    BINARY(shr, T, a >> b) BINARY(maximum, T, tf::maximum(a, b))                     \
    BINARY(minimum, T, tf::minimum(a, b)) UNARY(neg, T, -x) UNARY(not, T, ~x)        \
    UNARY(abs, T, tf::abs(x)) UNARY(sign, T, tf::sign(x))
INT_BINARIES(int32_t)
INT_BINARIES(int64_t)
INT_BINARIES(uint8_t)
INT_BINARIES(int8_t)

// Comparisons and where: out = where(a OP b, a, b) and the mask stored as bool.
#define COMPARE(NAME, T, OP)                                                          \
    extern "C" void cmp_##NAME##_##T(const T* ap, const T* bp, bool* mp, T* yp, int64_t n) { \
        for (int64_t i = 0; i < n; i += L) {                                          \
            const int c = tail(n, i);                                                 \
            const Vec<T> a = Vec<T>::load_partial(ap + i, c);                         \
            const Vec<T> b = Vec<T>::load_partial(bp + i, c);                         \
            const tf::VecMask m = a OP b;                                             \
            m.store_partial(mp + i, c);                                               \
            tf::where(m, a, b).store_partial(yp + i, c);                              \
        }                                                                             \
    }
#define COMPARES(T) COMPARE(eq, T, ==) COMPARE(ne, T, !=) COMPARE(lt, T, <) \
    COMPARE(le, T, <=) COMPARE(gt, T, >) COMPARE(ge, T, >=)
COMPARES(float)
COMPARES(double)
COMPARES(int64_t)
COMPARES(uint8_t)

// Mask algebra: m = (a < b) ^ c | !(d) with bool inputs, plus reduce_any / reduce_all per
// block of L.
extern "C" void mask_ops(const bool* cp, const bool* dp, const float* ap, bool* out, bool* any_all, int64_t n) {
    for (int64_t i = 0; i < n; i += L) {
        const int c = tail(n, i);
        const tf::VecMask cm = tf::VecMask::load_partial(cp + i, c);
        const tf::VecMask dm = tf::VecMask::load_partial(dp + i, c);
        const Vec<float> a = Vec<float>::load_partial(ap + i, c);
        const tf::VecMask m = ((a < Vec<float>(0.0f)) ^ cm) | !dm;
        m.store_partial(out + i, c);
        const tf::VecMask active = tf::VecMask::first_n(c);
        any_all[2 * (i / L)] = tf::reduce_any(m & active);
        any_all[2 * (i / L) + 1] = tf::reduce_all(m | !active);
    }
}

// convert<To>(Vec<From>)
#define CONVERT(FROM, TO)                                                            \
    extern "C" void convert_##FROM##_##TO(const FROM* xp, TO* yp, int64_t n) {       \
        for (int64_t i = 0; i < n; i += L) {                                         \
            const int c = tail(n, i);                                                \
            tf::convert<TO>(Vec<FROM>::load_partial(xp + i, c)).store_partial(yp + i, c); \
        }                                                                            \
    }                                                                                \
    extern "C" void sconvert_##FROM##_##TO(const FROM* xp, TO* yp, int64_t n) {      \
        for (int64_t i = 0; i < n; ++i) yp[i] = tf::convert<TO>(xp[i]);              \
    }
CONVERT(float, double) CONVERT(float, int32_t) CONVERT(float, int64_t) CONVERT(float, uint8_t)
CONVERT(float, int8_t) CONVERT(float, bool) CONVERT(double, float) CONVERT(double, int64_t)
CONVERT(int64_t, float) CONVERT(int64_t, double) CONVERT(int64_t, int32_t) CONVERT(int32_t, int64_t)
CONVERT(int32_t, float) CONVERT(uint8_t, float) CONVERT(uint8_t, int64_t) CONVERT(bool, float)
CONVERT(bool, int64_t) CONVERT(int64_t, bool) CONVERT(int8_t, float) CONVERT(double, bool)

// Gathers: y[i] = base[idx[i]] (the tail through a first_n-masked gather), and a masked
// gather that must not touch base[idx[i]] where !m[i].
#define GATHER(T)                                                                    \
    extern "C" void gather_##T(const T* base, const int64_t* ip, T* yp, int64_t n) { \
        for (int64_t i = 0; i < n; i += L) {                                         \
            const int c = tail(n, i);                                                \
            const Vec<int64_t> idx = Vec<int64_t>::load_partial(ip + i, c);          \
            if (c == L) Vec<T>::gather(base, idx).store(yp + i);                     \
            else Vec<T>::gather(base, idx, tf::VecMask::first_n(c)).store_partial(yp + i, c); \
        }                                                                            \
    }                                                                                \
    extern "C" void masked_gather_##T(const T* base, const int64_t* ip, const bool* mp, T* yp, int64_t n) { \
        for (int64_t i = 0; i < n; i += L) {                                         \
            const int c = tail(n, i);                                                \
            const Vec<int64_t> idx = Vec<int64_t>::load_partial(ip + i, c);          \
            const tf::VecMask m = tf::VecMask::load_partial(mp + i, c);              \
            Vec<T>::gather(base, idx, m).store_partial(yp + i, c);                   \
        }                                                                            \
    }
GATHER(float) GATHER(double) GATHER(int32_t) GATHER(int64_t) GATHER(uint8_t)

// masked_load / masked_store / arange / operator[] / broadcast.
extern "C" void misc_float(const float* xp, const bool* mp, float* ml, float* ms, float* ar, float* lanes_out, int64_t n) {
    for (int64_t i = 0; i < n; i += L) {
        const int c = tail(n, i);
        const tf::VecMask m = tf::VecMask::load_partial(mp + i, c) & tf::VecMask::first_n(c);
        Vec<float>::masked_load(xp + i, m).store_partial(ml + i, c);
        Vec<float>(-1.0f).masked_store(ms + i, m);
        Vec<float>::arange(float(i) * 0.5f, 0.5f).store_partial(ar + i, c);
        const Vec<float> x = Vec<float>::load_partial(xp + i, c);
        for (int j = 0; j < c; ++j) lanes_out[i + j] = x[j];
    }
}
extern "C" void arange_int64(int64_t* out, int64_t n) {
    for (int64_t i = 0; i < n; i += L) Vec<int64_t>::arange(i * 3, 3).store_partial(out + i, tail(n, i));
}

// bf16 / fp16: vector and scalar conversions.
extern "C" void bf16_to_float_vec(const uint16_t* xp, float* yp, int64_t n) {
    for (int64_t i = 0; i < n; i += L) tf::load_partial_bf16_as_float(xp + i, tail(n, i)).store_partial(yp + i, tail(n, i));
}
extern "C" void float_to_bf16_vec(const float* xp, uint16_t* yp, int64_t n) {
    for (int64_t i = 0; i < n; i += L) {
        const int c = tail(n, i);
        if (c == L) tf::store_float_as_bf16(yp + i, Vec<float>::load(xp + i));
        else tf::store_partial_float_as_bf16(yp + i, Vec<float>::load_partial(xp + i, c), c);
    }
}
extern "C" void half_to_float_vec(const uint16_t* xp, float* yp, int64_t n) {
    for (int64_t i = 0; i < n; i += L) {
        const int c = tail(n, i);
        const Vec<float> v = c == L ? tf::load_half_as_float(xp + i) : tf::load_partial_half_as_float(xp + i, c);
        v.store_partial(yp + i, c);
    }
}
extern "C" void float_to_half_vec(const float* xp, uint16_t* yp, int64_t n) {
    for (int64_t i = 0; i < n; i += L) {
        const int c = tail(n, i);
        if (c == L) tf::store_float_as_half(yp + i, Vec<float>::load(xp + i));
        else tf::store_partial_float_as_half(yp + i, Vec<float>::load_partial(xp + i, c), c);
    }
}
extern "C" void bf16_to_float_scalar(const uint16_t* xp, float* yp, int64_t n) { for (int64_t i = 0; i < n; ++i) yp[i] = tf::bf16_to_float(xp[i]); }
extern "C" void float_to_bf16_scalar(const float* xp, uint16_t* yp, int64_t n) { for (int64_t i = 0; i < n; ++i) yp[i] = tf::float_to_bf16(xp[i]); }
extern "C" void half_to_float_scalar(const uint16_t* xp, float* yp, int64_t n) { for (int64_t i = 0; i < n; ++i) yp[i] = tf::half_to_float(xp[i]); }
extern "C" void float_to_half_scalar(const float* xp, uint16_t* yp, int64_t n) { for (int64_t i = 0; i < n; ++i) yp[i] = tf::float_to_half(xp[i]); }

// Row reductions over a [rows, cols] matrix: vector accumulator + tail, then lanes.
#define ROW_REDUCE(NAME, T, INIT, COMBINE, HORIZONTAL)                                \
    extern "C" void row_##NAME##_##T(const T* xp, T* yp, int64_t rows, int64_t cols) { \
        for (int64_t r = 0; r < rows; ++r) {                                          \
            const T* row = xp + r * cols;                                             \
            Vec<T> acc(INIT);                                                         \
            for (int64_t j = 0; j < cols; j += L) {                                   \
                const int c = tail(cols, j);                                          \
                const Vec<T> v = tf::where(tf::VecMask::first_n(c), Vec<T>::load_partial(row + j, c), Vec<T>(INIT)); \
                acc = COMBINE;                                                        \
            }                                                                         \
            yp[r] = HORIZONTAL(acc);                                                  \
        }                                                                             \
    }
ROW_REDUCE(sum, float, 0.0f, acc + v, tf::reduce_add)
ROW_REDUCE(sum, double, 0.0, acc + v, tf::reduce_add)
ROW_REDUCE(sum, int64_t, 0, acc + v, tf::reduce_add)
ROW_REDUCE(prod, float, 1.0f, acc * v, tf::reduce_mul)
ROW_REDUCE(max, float, -INFINITY, tf::maximum(acc, v), tf::reduce_max)
ROW_REDUCE(min, float, INFINITY, tf::minimum(acc, v), tf::reduce_min)
ROW_REDUCE(max, int32_t, INT32_MIN, tf::maximum(acc, v), tf::reduce_max)

// Welford per row: lane accumulators with a partial tail, reduced over lanes; a scalar
// accumulator; and two half-row accumulators combined.
extern "C" void row_welford_float(const float* xp, float* out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = xp + r * cols;
        tf::Welford<Vec<float>> acc;
        for (int64_t j = 0; j < cols; j += L) {
            const int c = tail(cols, j);
            if (c == L) acc = tf::welford_update(acc, Vec<float>::load(row + j));
            else acc = tf::welford_update_partial(acc, Vec<float>::load_partial(row + j, c), c);
        }
        const tf::Welford<float> w = tf::welford_reduce_lanes(acc);
        tf::Welford<float> s, h1, h2;
        for (int64_t j = 0; j < cols; ++j) s = tf::welford_update(s, row[j]);
        for (int64_t j = 0; j < cols / 3; ++j) h1 = tf::welford_update(h1, row[j]);
        for (int64_t j = cols / 3; j < cols; ++j) h2 = tf::welford_update(h2, row[j]);
        const tf::Welford<float> comb = tf::welford_combine(h1, h2);
        float* o = out + r * 9;
        o[0] = w.mean; o[1] = w.m2 / w.weight; o[2] = w.weight;
        o[3] = s.mean; o[4] = s.m2 / s.weight; o[5] = s.weight;
        o[6] = comb.mean; o[7] = comb.m2 / comb.weight; o[8] = comb.weight;
    }
}

// argmax / argmin per row: lane accumulators (+ partial tail) reduced over lanes, and the
// scalar accumulator. out[r] = {vec argmax, vec argmin, scalar argmax, scalar argmin,
// argmax of two halves combined}.
extern "C" void row_arg_float(const float* xp, int64_t* out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = xp + r * cols;
        tf::ArgAcc<Vec<float>> amax, amin;
        for (int64_t j = 0; j < cols; j += L) {
            const int c = tail(cols, j);
            const Vec<float> v = Vec<float>::load_partial(row + j, c);
            const Vec<int64_t> idx = Vec<int64_t>::arange(j);
            amax = tf::argmax_update_partial(amax, v, idx, c);
            amin = tf::argmin_update_partial(amin, v, idx, c);
        }
        tf::ArgAcc<float> smax, smin, h1, h2;
        for (int64_t j = 0; j < cols; ++j) {
            smax = tf::argmax_update(smax, row[j], j);
            smin = tf::argmin_update(smin, row[j], j);
            if (j < cols / 2) h1 = tf::argmax_update(h1, row[j], j);
            else h2 = tf::argmax_update(h2, row[j], j);
        }
        int64_t* o = out + r * 5;
        o[0] = tf::argmax_reduce_lanes(amax).index;
        o[1] = tf::argmin_reduce_lanes(amin).index;
        o[2] = smax.index;
        o[3] = smin.index;
        o[4] = tf::argmax_combine(h2, h1).index;
    }
}
extern "C" void row_arg_int64(const int64_t* xp, int64_t* out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t* row = xp + r * cols;
        tf::ArgAcc<Vec<int64_t>> amax;
        tf::ArgAcc<int64_t> smin;
        for (int64_t j = 0; j < cols; j += L)
            amax = tf::argmax_update_partial(amax, Vec<int64_t>::load_partial(row + j, tail(cols, j)),
                                             Vec<int64_t>::arange(j), tail(cols, j));
        for (int64_t j = 0; j < cols; ++j) smin = tf::argmin_update(smin, row[j], j);
        out[r * 2] = tf::argmax_reduce_lanes(amax).index;
        out[r * 2 + 1] = smin.index;
    }
}

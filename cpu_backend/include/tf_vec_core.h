// tritonfuse SIMD vectors: types, loads/stores, arithmetic, comparisons, where, convert.
// Part of tritonfuse_vec.h (include that one).
//
// Every tf::Vec<T> has the same number of lanes, kVecLanes, whatever T is, so lane i of a
// float vector and lane i of an int64 vector refer to the same element of a loop. A
// vector is stored as an array of native registers (GCC/Clang vector extensions): one
// register for float/int32 (and smaller), two for double/int64 on AVX-512 (16 lanes x 8
// bytes). GCC scalarizes comparisons and selects on vector types wider than the hardware
// register, which is why the wide types are split by hand instead of using one 128-byte
// vector type.
//
// Masks are tf::Vec<bool>: one int32 lane per element holding 0 or -1 (all bits set).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define TF_INLINE inline __attribute__((always_inline))

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define TF_AVX512 1
#else
#define TF_AVX512 0
#endif

namespace tf {

#if defined(__AVX512F__)
constexpr int kVecLanes = 16;
constexpr int kRegBytes = 64;
#elif defined(__AVX2__) || defined(__AVX__)
constexpr int kVecLanes = 8;
constexpr int kRegBytes = 32;
#else
constexpr int kVecLanes = 4;
constexpr int kRegBytes = 16;
#endif

template <typename T>
struct Vec;

namespace detail {

template <int Bytes> struct SignedOfSize;
template <> struct SignedOfSize<1> { using type = int8_t; };
template <> struct SignedOfSize<2> { using type = int16_t; };
template <> struct SignedOfSize<4> { using type = int32_t; };
template <> struct SignedOfSize<8> { using type = int64_t; };

// How kVecLanes elements of type E sit in registers.
template <typename E>
struct Layout {
    static constexpr int bytes = kVecLanes * int(sizeof(E));
    static constexpr int reg_bytes = bytes < kRegBytes ? bytes : kRegBytes;
    static constexpr int regs = bytes / reg_bytes;
    static constexpr int lanes_per_reg = kVecLanes / regs;
    using sint = typename SignedOfSize<sizeof(E)>::type;
    typedef E reg __attribute__((vector_size(reg_bytes)));        // one register
    typedef sint sreg __attribute__((vector_size(reg_bytes)));    // its comparison result
    typedef E full __attribute__((vector_size(bytes)));           // all lanes (for converts)
};

typedef int32_t mask_reg __attribute__((vector_size(kVecLanes * 4)));  // Vec<bool> storage

template <typename T> struct Identity { using type = T; };
template <typename T> using id_t = typename Identity<T>::type;  // blocks template deduction

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Vec<bool>: lane masks
// ---------------------------------------------------------------------------------------
template <>
struct Vec<bool> {
    using value_type = bool;
    static constexpr int size = kVecLanes;
    detail::mask_reg v;  // 0 or -1 per lane

    Vec() : v{} {}
    Vec(detail::mask_reg x) : v(x) {}
    Vec(bool b) : v(detail::mask_reg{} - int32_t(b ? 1 : 0)) {}
    static Vec broadcast(bool b) { return Vec(b); }

    // bool tensors are one byte per element (0 or 1); any non-zero byte reads as true.
    static TF_INLINE Vec load(const bool* p) {
        typedef uint8_t bytes __attribute__((vector_size(kVecLanes)));
        bytes b;
        std::memcpy(&b, p, sizeof b);
        return Vec(__builtin_convertvector(b != 0, detail::mask_reg));
    }
    static TF_INLINE Vec load_partial(const bool* p, int count) {
        bool tmp[kVecLanes] = {};
        for (int i = 0; i < count && i < kVecLanes; ++i) tmp[i] = p[i];
        return load(tmp);
    }
    TF_INLINE void store(bool* p) const {
        typedef uint8_t bytes __attribute__((vector_size(kVecLanes)));
        bytes b = __builtin_convertvector(v & 1, bytes);
        std::memcpy(p, &b, sizeof b);
    }
    TF_INLINE void store_partial(bool* p, int count) const {
        for (int i = 0; i < count && i < kVecLanes; ++i) p[i] = v[i] != 0;
    }
    TF_INLINE bool operator[](int i) const { return v[i] != 0; }
    // Lane i is true for i < count: the mask of a tail of `count` elements.
    static TF_INLINE Vec first_n(int count) {
        detail::mask_reg iota;
        for (int i = 0; i < kVecLanes; ++i) iota[i] = i;
        return Vec(iota < count);
    }
    // Bit i set <=> lane i is true.
    TF_INLINE uint32_t bits() const {
#if TF_AVX512
        return _mm512_movepi32_mask((__m512i)v);
#elif defined(__AVX__) && !defined(__AVX512F__)
        return uint32_t(_mm256_movemask_ps((__m256)v));   // kVecLanes == 8: one sign bit per lane
#else
        uint32_t b = 0;
        for (int i = 0; i < kVecLanes; ++i) b |= uint32_t(v[i] != 0) << i;
        return b;
#endif
    }

    friend TF_INLINE Vec operator&(Vec a, Vec b) { return Vec(a.v & b.v); }
    friend TF_INLINE Vec operator|(Vec a, Vec b) { return Vec(a.v | b.v); }
    friend TF_INLINE Vec operator^(Vec a, Vec b) { return Vec(a.v ^ b.v); }
    friend TF_INLINE Vec operator~(Vec a) { return Vec(~a.v); }
    friend TF_INLINE Vec operator!(Vec a) { return Vec(~a.v); }
    friend TF_INLINE Vec operator&&(Vec a, Vec b) { return Vec(a.v & b.v); }
    friend TF_INLINE Vec operator||(Vec a, Vec b) { return Vec(a.v | b.v); }
    friend TF_INLINE Vec operator==(Vec a, Vec b) { return Vec(a.v == b.v); }
    friend TF_INLINE Vec operator!=(Vec a, Vec b) { return Vec(a.v != b.v); }
};
using VecMask = Vec<bool>;

namespace detail {

// The part of a mask that covers register k of a Vec<E>, as E-sized 0/-1 lanes.
template <typename E>
TF_INLINE typename Layout<E>::sreg mask_for_reg(const Vec<bool>& m, int k) {
    using L = Layout<E>;
    typedef int32_t part __attribute__((vector_size(L::lanes_per_reg * 4)));
    part p;
    std::memcpy(&p, reinterpret_cast<const int32_t*>(&m.v) + k * L::lanes_per_reg, sizeof p);
    return __builtin_convertvector(p, typename L::sreg);
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define TF_HAS_SHUFFLEVECTOR 1
#endif
#endif

#ifdef TF_HAS_SHUFFLEVECTOR
// Two half-width vectors joined into one (a's lanes first), in registers.
template <typename Half, size_t... I>
TF_INLINE auto join_halves(Half a, Half b, std::index_sequence<I...>) {
    return __builtin_shufflevector(a, b, int(I)...);
}
#endif

// Assemble a mask from per-register comparison results of a Vec<E>.
template <typename E>
TF_INLINE Vec<bool> mask_from_regs(const typename Layout<E>::sreg* parts) {
    using L = Layout<E>;
    typedef int32_t part __attribute__((vector_size(L::lanes_per_reg * 4)));
    if constexpr (L::regs == 1) {
        return Vec<bool>(__builtin_convertvector(parts[0], mask_reg));
#ifdef TF_HAS_SHUFFLEVECTOR
    } else if constexpr (L::regs == 2) {
        // joined in registers: halves stored to the stack and read back as one vector
        // stall store forwarding (an int64 comparison cost ~4x its arithmetic)
        return Vec<bool>(join_halves(__builtin_convertvector(parts[0], part), __builtin_convertvector(parts[1], part),
                                     std::make_index_sequence<2 * L::lanes_per_reg>{}));
#endif
    } else {
        mask_reg m;
        for (int k = 0; k < L::regs; ++k) {
            part p = __builtin_convertvector(parts[k], part);
            std::memcpy(reinterpret_cast<int32_t*>(&m) + k * L::lanes_per_reg, &p, sizeof p);
        }
        return Vec<bool>(m);
    }
}

#if !defined(__AVX512F__) && defined(__AVX2__)
#define TF_AVX2_MASKED_MOVES 1
// The lanes of one 32-byte register whose bit is set in `bits`, as all-ones 4- or 8-byte
// lanes: the mask operand of AVX's vmaskmov (which never touches memory of a lane off it).
template <int Bytes>
TF_INLINE __m256i lane_mask_avx2(uint32_t bits) {
    if constexpr (Bytes == 4) {
        const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(bits)), bit), bit);
    } else {
        const __m256i bit = _mm256_setr_epi64x(1, 2, 4, 8);
        return _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(bits), bit), bit);
    }
}
#else
#define TF_AVX2_MASKED_MOVES 0
#endif

// Masked loads/stores of the lanes whose bit is set in `bits`; other lanes read as 0 and
// are never touched in memory (so a tail load cannot fault past the end of a buffer).
// AVX-512: mask registers; AVX2: vmaskmov for 4- and 8-byte lanes (a symbolic length's
// tail stays one vector instruction); else lane by lane.
template <typename E>
TF_INLINE void masked_load_lanes(typename Layout<E>::reg* out, const E* p, uint32_t bits) {
#if TF_AVX512
    using L = Layout<E>;
    for (int k = 0; k < L::regs; ++k) {
        const uint32_t kb = bits >> (k * L::lanes_per_reg);
        const E* src = p + k * L::lanes_per_reg;
        if constexpr (L::reg_bytes == 64 && sizeof(E) == 8) {
            out[k] = (typename L::reg)_mm512_maskz_loadu_epi64((__mmask8)kb, src);
        } else if constexpr (L::reg_bytes == 64 && sizeof(E) == 4) {
            out[k] = (typename L::reg)_mm512_maskz_loadu_epi32((__mmask16)kb, src);
        } else if constexpr (L::reg_bytes == 32 && sizeof(E) == 2) {
            out[k] = (typename L::reg)_mm256_maskz_loadu_epi16((__mmask16)kb, src);
        } else if constexpr (L::reg_bytes == 16 && sizeof(E) == 1) {
            out[k] = (typename L::reg)_mm_maskz_loadu_epi8((__mmask16)kb, src);
        } else {
            static_assert(sizeof(E) == 0, "unexpected layout");
        }
    }
#else
#if TF_AVX2_MASKED_MOVES
    using L = Layout<E>;
    if constexpr ((sizeof(E) == 4 || sizeof(E) == 8) && L::reg_bytes == 32) {
        for (int k = 0; k < L::regs; ++k) {
            const __m256i m = lane_mask_avx2<sizeof(E)>(bits >> (k * L::lanes_per_reg));
            const E* src = p + k * L::lanes_per_reg;
            if constexpr (sizeof(E) == 4)
                out[k] = (typename L::reg)_mm256_maskload_ps(reinterpret_cast<const float*>(src), m);
            else
                out[k] = (typename L::reg)_mm256_maskload_pd(reinterpret_cast<const double*>(src), m);
        }
        return;
    }
#endif
    E lanes[kVecLanes] = {};
    for (int i = 0; i < kVecLanes; ++i)
        if (bits >> i & 1) lanes[i] = p[i];
    std::memcpy(out, lanes, sizeof lanes);
#endif
}

template <typename E>
TF_INLINE void masked_store_lanes(E* p, const typename Layout<E>::reg* in, uint32_t bits) {
#if TF_AVX512
    using L = Layout<E>;
    for (int k = 0; k < L::regs; ++k) {
        const uint32_t kb = bits >> (k * L::lanes_per_reg);
        E* dst = p + k * L::lanes_per_reg;
        if constexpr (L::reg_bytes == 64 && sizeof(E) == 8) {
            _mm512_mask_storeu_epi64(dst, (__mmask8)kb, (__m512i)in[k]);
        } else if constexpr (L::reg_bytes == 64 && sizeof(E) == 4) {
            _mm512_mask_storeu_epi32(dst, (__mmask16)kb, (__m512i)in[k]);
        } else if constexpr (L::reg_bytes == 32 && sizeof(E) == 2) {
            _mm256_mask_storeu_epi16(dst, (__mmask16)kb, (__m256i)in[k]);
        } else if constexpr (L::reg_bytes == 16 && sizeof(E) == 1) {
            _mm_mask_storeu_epi8(dst, (__mmask16)kb, (__m128i)in[k]);
        } else {
            static_assert(sizeof(E) == 0, "unexpected layout");
        }
    }
#else
#if TF_AVX2_MASKED_MOVES
    using L = Layout<E>;
    if constexpr ((sizeof(E) == 4 || sizeof(E) == 8) && L::reg_bytes == 32) {
        for (int k = 0; k < L::regs; ++k) {
            const __m256i m = lane_mask_avx2<sizeof(E)>(bits >> (k * L::lanes_per_reg));
            E* dst = p + k * L::lanes_per_reg;
            if constexpr (sizeof(E) == 4)
                _mm256_maskstore_ps(reinterpret_cast<float*>(dst), m, (__m256)in[k]);
            else
                _mm256_maskstore_pd(reinterpret_cast<double*>(dst), m, (__m256d)in[k]);
        }
        return;
    }
#endif
    E lanes[kVecLanes];
    std::memcpy(lanes, in, sizeof lanes);
    for (int i = 0; i < kVecLanes; ++i)
        if (bits >> i & 1) p[i] = lanes[i];
#endif
}

TF_INLINE uint32_t first_n_bits(int count) {
    return count >= kVecLanes ? (1u << kVecLanes) - 1u : count <= 0 ? 0u : (1u << count) - 1u;
}

// Integer division with C semantics (truncation) that never traps: lanes with a zero
// divisor give 0 (tails are zero-filled by load_partial, and x86 would raise SIGFPE),
// INT_MIN / -1 wraps to INT_MIN. The code generator implements Python floor semantics.
template <typename R>
TF_INLINE R int_div(R a, R b, bool remainder) {
    using E = std::remove_reference_t<decltype(a[0])>;
    const auto zero = b == 0;
    if constexpr (std::is_signed_v<E>) {
        const auto minus_one = b == -1;
        const R safe = (zero | minus_one) ? R{} + 1 : b;
        typedef std::make_unsigned_t<E> UE __attribute__((vector_size(sizeof(R))));
        const R neg = (R)(UE{} - (UE)a);  // wrapping -a
        R q = remainder ? a % safe : a / safe;
        q = minus_one ? (remainder ? R{} : neg) : q;
        return zero ? R{} : q;
    } else {
        const R safe = zero ? R{} + 1 : b;
        R q = remainder ? a % safe : a / safe;
        return zero ? R{} : q;
    }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Vec<T> for arithmetic T (float, double, int8/16/32/64, uint8)
// ---------------------------------------------------------------------------------------
template <typename T>
struct Vec {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "Vec<T>: arithmetic T");
    using value_type = T;
    using L = detail::Layout<T>;
    using reg_t = typename L::reg;
    static constexpr int size = kVecLanes;
    static constexpr int kRegs = L::regs;
    static constexpr int kLanesPerReg = L::lanes_per_reg;

    reg_t r[kRegs];

    Vec() : r{} {}
    Vec(T x) {  // broadcast (implicit, so `v + 1.0f` works)
        // `scalar - vector` splats the scalar in one instruction, and x - (+0) == x exactly
        // (-0.0, inf and NaN included). A lane-by-lane fill can compile to 16 masked moves
        // that GCC then fails to hoist out of an unrolled loop.
        for (int k = 0; k < kRegs; ++k) r[k] = x - reg_t{};
    }
    static TF_INLINE Vec broadcast(T x) { return Vec(x); }
    static TF_INLINE Vec from_regs(const reg_t* regs) {
        Vec o;
        for (int k = 0; k < kRegs; ++k) o.r[k] = regs[k];
        return o;
    }

    // ---- memory ----
    static TF_INLINE Vec load(const T* p) {
        Vec o;
        std::memcpy(o.r, p, sizeof o.r);
        return o;
    }
    // Lanes >= count are 0; memory past p[count-1] is not read.
    static TF_INLINE Vec load_partial(const T* p, int count) {
        Vec o;
        detail::masked_load_lanes<T>(o.r, p, detail::first_n_bits(count));
        return o;
    }
    // Inactive lanes are 0 and not read.
    static TF_INLINE Vec masked_load(const T* p, const Vec<bool>& m) {
        Vec o;
        detail::masked_load_lanes<T>(o.r, p, m.bits());
        return o;
    }
    TF_INLINE void store(T* p) const { std::memcpy(p, r, sizeof r); }
    TF_INLINE void store_partial(T* p, int count) const {
        detail::masked_store_lanes<T>(p, r, detail::first_n_bits(count));
    }
    TF_INLINE void masked_store(T* p, const Vec<bool>& m) const {
        detail::masked_store_lanes<T>(p, r, m.bits());
    }
    // Lane i = base[idx[i]] (idx in elements).
    static TF_INLINE Vec gather(const T* base, const Vec<int64_t>& idx);
    // Inactive lanes are 0 and their addresses are never read.
    static TF_INLINE Vec gather(const T* base, const Vec<int64_t>& idx, const Vec<bool>& m);
    // Lane i = start + i * step.
    // Whole-register arithmetic on a constant iota (start + i * step, each lane rounded as
    // the scalar formula): a lane-by-lane fill compiled to 16 inserts per call, which made
    // a one-hot row (iota == target, cross-entropy's backward) 6x slower than Inductor's.
    static TF_INLINE Vec arange(T start, T step = T(1)) {
        Vec o;
        for (int k = 0; k < kRegs; ++k) o.r[k] = (start - reg_t{}) + iota_reg(k) * (step - reg_t{});
        return o;
    }
    // Register k of [0, 1, ..., kVecLanes - 1].
    static TF_INLINE reg_t iota_reg(int k) {
        reg_t v{};
        for (int i = 0; i < kLanesPerReg; ++i) v[i] = T(k * kLanesPerReg + i);
        return v;
    }

    TF_INLINE T operator[](int i) const { return r[i / kLanesPerReg][i % kLanesPerReg]; }

    // ---- arithmetic (elementwise; ints wrap like eager) ----
#define TF_VEC_BINOP(OP)                                                        \
    friend TF_INLINE Vec operator OP(const Vec& a, const Vec& b) {              \
        Vec o;                                                                  \
        for (int k = 0; k < kRegs; ++k) o.r[k] = a.r[k] OP b.r[k];              \
        return o;                                                               \
    }
    TF_VEC_BINOP(+)
    TF_VEC_BINOP(-)
    TF_VEC_BINOP(*)
#undef TF_VEC_BINOP
    friend TF_INLINE Vec operator/(const Vec& a, const Vec& b) {
        Vec o;
        for (int k = 0; k < kRegs; ++k) {
            if constexpr (std::is_floating_point_v<T>)
                o.r[k] = a.r[k] / b.r[k];
            else
                o.r[k] = detail::int_div(a.r[k], b.r[k], false);
        }
        return o;
    }
    friend TF_INLINE Vec operator-(const Vec& a) {
        Vec o;
        for (int k = 0; k < kRegs; ++k) o.r[k] = -a.r[k];
        return o;
    }
    TF_INLINE Vec& operator+=(const Vec& b) { return *this = *this + b; }
    TF_INLINE Vec& operator-=(const Vec& b) { return *this = *this - b; }
    TF_INLINE Vec& operator*=(const Vec& b) { return *this = *this * b; }
    TF_INLINE Vec& operator/=(const Vec& b) { return *this = *this / b; }

    // ---- comparisons -> Vec<bool> (IEEE: anything compared with NaN is false, != true) ----
#define TF_VEC_CMP(OP)                                                          \
    friend TF_INLINE Vec<bool> operator OP(const Vec& a, const Vec& b) {        \
        typename L::sreg parts[kRegs];                                          \
        for (int k = 0; k < kRegs; ++k) parts[k] = a.r[k] OP b.r[k];            \
        return detail::mask_from_regs<T>(parts);                                \
    }
    TF_VEC_CMP(==)
    TF_VEC_CMP(!=)
    TF_VEC_CMP(<)
    TF_VEC_CMP(<=)
    TF_VEC_CMP(>)
    TF_VEC_CMP(>=)
#undef TF_VEC_CMP
};

// Integer-only operators, as templates constrained to integral T.
template <typename T>
using IntVec = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, Vec<T>>;

template <typename T>
TF_INLINE IntVec<T> operator%(const Vec<T>& a, const detail::id_t<Vec<T>>& b) {
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) o.r[k] = detail::int_div(a.r[k], b.r[k], true);
    return o;
}
#define TF_VEC_BITOP(OP)                                                                   \
    template <typename T>                                                                  \
    TF_INLINE IntVec<T> operator OP(const Vec<T>& a, const detail::id_t<Vec<T>>& b) {      \
        Vec<T> o;                                                                          \
        for (int k = 0; k < Vec<T>::kRegs; ++k) o.r[k] = a.r[k] OP b.r[k];                 \
        return o;                                                                          \
    }                                                                                      \
    template <typename T>                                                                  \
    TF_INLINE IntVec<T> operator OP(T a, const Vec<T>& b) { return Vec<T>(a) OP b; }
TF_VEC_BITOP(&)
TF_VEC_BITOP(|)
TF_VEC_BITOP(^)
#undef TF_VEC_BITOP
template <typename T>
TF_INLINE IntVec<T> operator%(T a, const Vec<T>& b) { return Vec<T>(a) % b; }
template <typename T>
TF_INLINE IntVec<T> operator~(const Vec<T>& a) {
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) o.r[k] = ~a.r[k];
    return o;
}
// Shifts follow eager (ATen) semantics, which define the C++ undefined cases:
// a << b is 0 when b < 0 or b >= bit width; a >> b is a >> (width - 1) for signed a
// (all sign bits) and 0 for unsigned a when b is out of range.
template <typename T>
TF_INLINE IntVec<T> operator<<(const Vec<T>& a, const detail::id_t<Vec<T>>& b) {
    using L = detail::Layout<T>;
    using UE = std::make_unsigned_t<T>;
    typedef UE ureg __attribute__((vector_size(L::reg_bytes)));
    constexpr T width = T(sizeof(T) * 8);
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) {
        const auto bad = (b.r[k] < 0) | (b.r[k] >= width);
        const typename L::reg cnt = bad ? typename L::reg{} : b.r[k];
        const typename L::reg shifted = (typename L::reg)((ureg)a.r[k] << (ureg)cnt);
        o.r[k] = bad ? typename L::reg{} : shifted;
    }
    return o;
}
template <typename T>
TF_INLINE IntVec<T> operator>>(const Vec<T>& a, const detail::id_t<Vec<T>>& b) {
    using L = detail::Layout<T>;
    constexpr T width = T(sizeof(T) * 8);
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) {
        const auto bad = (b.r[k] < 0) | (b.r[k] >= width);
        if constexpr (std::is_signed_v<T>) {
            const typename L::reg cnt = bad ? typename L::reg{} + (width - 1) : b.r[k];
            o.r[k] = a.r[k] >> cnt;
        } else {
            const typename L::reg cnt = bad ? typename L::reg{} : b.r[k];
            o.r[k] = bad ? typename L::reg{} : a.r[k] >> cnt;
        }
    }
    return o;
}
template <typename T>
TF_INLINE IntVec<T> operator<<(T a, const Vec<T>& b) { return Vec<T>(a) << b; }
template <typename T>
TF_INLINE IntVec<T> operator>>(T a, const Vec<T>& b) { return Vec<T>(a) >> b; }

// ---------------------------------------------------------------------------------------
// where / select
// ---------------------------------------------------------------------------------------
template <typename T>
TF_INLINE Vec<T> where(const Vec<bool>& m, const Vec<T>& a, const detail::id_t<Vec<T>>& b) {
    Vec<T> o;
    for (int k = 0; k < Vec<T>::kRegs; ++k) {
        const auto mk = detail::mask_for_reg<T>(m, k);
        o.r[k] = mk ? a.r[k] : b.r[k];
    }
    return o;
}
template <typename T>
TF_INLINE Vec<T> where(const Vec<bool>& m, T a, const Vec<T>& b) { return where(m, Vec<T>(a), b); }
template <typename T>
TF_INLINE std::enable_if_t<std::is_arithmetic_v<T>, Vec<T>> where(const Vec<bool>& m, T a, detail::id_t<T> b) {
    return where(m, Vec<T>(a), Vec<T>(b));
}
TF_INLINE Vec<bool> where(const Vec<bool>& m, const Vec<bool>& a, const Vec<bool>& b) {
    return Vec<bool>(m.v ? a.v : b.v);
}
// Scalar form, so generated code spells `tf::where(c, a, b)` the same in scalar loops.
template <typename T>
TF_INLINE std::enable_if_t<std::is_arithmetic_v<T>, T> where(bool c, T a, detail::id_t<T> b) {
    return c ? a : b;
}

// ---------------------------------------------------------------------------------------
// convert<U>: C++ cast semantics lane by lane, with eager's choices where C++ leaves it
// undefined: float -> uint8/int8/int16 goes through int64 (ATen: -1.5 -> 255), float ->
// bool is x != 0 (NaN -> true), bool -> number is 0/1.
// ---------------------------------------------------------------------------------------
namespace detail {
template <typename U, typename T>
TF_INLINE Vec<U> convert_vec(const Vec<T>& x) {
    using FT = typename Layout<T>::full;
    using FU = typename Layout<U>::full;
    FT f;
    std::memcpy(&f, x.r, sizeof f);
    FU t = __builtin_convertvector(f, FU);
    Vec<U> o;
    std::memcpy(o.r, &t, sizeof t);
    return o;
}
}  // namespace detail

template <typename U, typename T>
TF_INLINE Vec<U> convert(const Vec<T>& x) {
    if constexpr (std::is_same_v<U, T>) {
        return x;
    } else if constexpr (std::is_same_v<U, bool>) {
        return x != Vec<T>(T(0));
    } else if constexpr (std::is_same_v<T, bool>) {
        Vec<int32_t> ones;
        ones.r[0] = x.v & 1;
        return detail::convert_vec<U>(ones);
    } else if constexpr (std::is_floating_point_v<T> && std::is_integral_v<U> && sizeof(U) < 4) {
        return detail::convert_vec<U>(detail::convert_vec<int64_t>(x));
    } else {
        return detail::convert_vec<U>(x);
    }
}
// Scalar form with the same semantics.
template <typename U, typename T>
TF_INLINE std::enable_if_t<std::is_arithmetic_v<T>, U> convert(T x) {
    if constexpr (std::is_same_v<U, bool>) {
        return x != T(0);
    } else if constexpr (std::is_floating_point_v<T> && std::is_integral_v<U> && sizeof(U) < 4) {
        return static_cast<U>(static_cast<int64_t>(x));
    } else {
        return static_cast<U>(x);
    }
}

// Same bits, different type (sizes must match): bitcast<int32_t>(Vec<float>) etc.
template <typename U, typename T>
TF_INLINE Vec<U> bitcast(const Vec<T>& x) {
    static_assert(sizeof(U) == sizeof(T), "bitcast between equal-size lanes only");
    Vec<U> o;
    std::memcpy(o.r, x.r, sizeof o.r);
    return o;
}

// ---------------------------------------------------------------------------------------
// gathers
// ---------------------------------------------------------------------------------------
template <typename T>
TF_INLINE Vec<T> Vec<T>::gather(const T* base, const Vec<int64_t>& idx) {
    Vec o;
#if TF_AVX512
    if constexpr (sizeof(T) == 4) {  // 16 lanes: two 8-lane gathers with 64-bit indices
        const __m256i lo = _mm512_i64gather_epi32((__m512i)idx.r[0], base, 4);
        const __m256i hi = _mm512_i64gather_epi32((__m512i)idx.r[1], base, 4);
        o.r[0] = (reg_t)_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        return o;
    } else if constexpr (sizeof(T) == 8) {
        for (int k = 0; k < 2; ++k)
            o.r[k] = (reg_t)_mm512_i64gather_epi64((__m512i)idx.r[k], base, 8);
        return o;
    }
#endif
    T lanes[kVecLanes];
    for (int i = 0; i < kVecLanes; ++i) lanes[i] = base[idx[i]];
    return load(lanes);
}

template <typename T>
TF_INLINE Vec<T> Vec<T>::gather(const T* base, const Vec<int64_t>& idx, const Vec<bool>& m) {
    Vec o;
#if TF_AVX512
    const uint32_t bits = m.bits();
    if constexpr (sizeof(T) == 4) {
        const __m256i z = _mm256_setzero_si256();
        const __m256i lo = _mm512_mask_i64gather_epi32(z, (__mmask8)bits, (__m512i)idx.r[0], base, 4);
        const __m256i hi = _mm512_mask_i64gather_epi32(z, (__mmask8)(bits >> 8), (__m512i)idx.r[1], base, 4);
        o.r[0] = (reg_t)_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        return o;
    } else if constexpr (sizeof(T) == 8) {
        const __m512i z = _mm512_setzero_si512();
        for (int k = 0; k < 2; ++k)
            o.r[k] = (reg_t)_mm512_mask_i64gather_epi64(z, (__mmask8)(bits >> (8 * k)), (__m512i)idx.r[k], base, 8);
        return o;
    }
#endif
    T lanes[kVecLanes];
    for (int i = 0; i < kVecLanes; ++i) lanes[i] = m[i] ? base[idx[i]] : T(0);
    return load(lanes);
}

}  // namespace tf

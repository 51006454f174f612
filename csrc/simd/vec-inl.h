// The SIMD layer every kernel is written in. Vec<T> is one register of the ISA this
// translation unit is compiled for, through GCC/Clang vector extensions, which lower to
// SSE2 (baseline), AVX2+FMA, AVX-512 or NEON (aarch64) by the TU's flags alone, and to
// one-lane "vectors" (the scalar reference path) when FASTATTN_VEC_BYTES is 0.
// Arithmetic, comparisons (lane masks) and `mask ? a : b` selects are the operators;
// everything else a kernel needs is here: loads and stores (unaligned; partial ones for
// tails), broadcast, fused multiply-add, min/max, lane reductions in a fixed order, and
// (simd/math-inl.h, included at the end) exp, exp2 and tanh.
//
// Kernel TUs are compiled with -ffp-contract=off: a multiply-add is fused exactly where the
// source says vfma, never by the compiler's choice, so results depend on the source and the
// ISA only. Include only inside an ISA namespace (FASTATTN_ISA_NS): every function here is
// per ISA, so none can leak into another ISA's code.
#pragma once  // per translation unit

#if defined(__SSE2__)
#include <immintrin.h>  // inline intrinsics only (gnu_inline: nothing emitted out of line)
#endif
#if defined(FASTATTN_NEON)
#include <arm_neon.h>  // the neon ISA (aarch64): inline intrinsics only, as above
#endif

#include <cstdint>
#include <type_traits>
#include <utility>

namespace fastattn {
namespace FASTATTN_ISA_NS {

template <typename T>
constexpr int kVecBytes = FASTATTN_VEC_BYTES > 0 ? FASTATTN_VEC_BYTES : int(sizeof(T));

template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes<T>)));
};

template <typename T>
using Vec = typename VecOf<T>::type;

// Lanes in one Vec<T>.
template <typename T>
constexpr int kLanes = kVecBytes<T> / int(sizeof(T));

// The lane masks comparisons of Vec<T> give (all bits set = true), and one bool byte per lane.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
template <typename T>
struct MaskOf {
  typedef Bits<T> type __attribute__((vector_size(kVecBytes<T>)));
  typedef uint8_t bytes __attribute__((vector_size(kLanes<T>)));
};

// Index arithmetic every kernel uses.
inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

// The lane type of a vector (or a scalar itself).
template <typename V>
struct LaneOf {
  using type = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<V&>()[0])>>;
};
template <>
struct LaneOf<float> {
  using type = float;
};
template <>
struct LaneOf<double> {
  using type = double;
};

template <typename T>
inline Vec<T> vload(const T* p) {
  Vec<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline void vstore(T* p, Vec<T> v) {
  __builtin_memcpy(p, &v, sizeof v);
}

// The first n < kLanes elements at p, the other lanes 0; p[n..] is never touched.
template <typename T>
inline Vec<T> vload_partial(const T* p, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(Vec<T>) == 64) {
    if constexpr (sizeof(T) == 4)
      return (Vec<T>)_mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p);
    else
      return (Vec<T>)_mm512_maskz_loadu_pd(__mmask8((1u << n) - 1), p);
  }
#endif
  Vec<T> v = {};
  for (int64_t i = 0; i < n; ++i) v[i] = p[i];
  return v;
}

// Stores the first n < kLanes lanes of v at p; p[n..] is never touched.
template <typename T>
inline void vstore_partial(T* p, Vec<T> v, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (sizeof(Vec<T>) == 64) {
    if constexpr (sizeof(T) == 4)
      _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1), (__m512)v);
    else
      _mm512_mask_storeu_pd(p, __mmask8((1u << n) - 1), (__m512d)v);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) p[i] = v[i];
}

// Stores v at p, which is aligned to a whole vector, with a non-temporal store where the
// ISA has one (x86: the line goes to memory without being read into the caches first and
// without evicting what they hold), a plain store elsewhere. For a large result written once
// and not read again by the kernel; stream_fence() after the last one orders them before
// the thread's later stores.
template <typename T>
inline void vstore_stream(T* p, Vec<T> v) {
#if defined(__AVX512F__)
  if constexpr (sizeof(v) == 64) {
    if constexpr (sizeof(T) == 4)
      _mm512_stream_ps(p, (__m512)v);
    else
      _mm512_stream_pd(p, (__m512d)v);
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(v) == 32) {
    if constexpr (sizeof(T) == 4)
      _mm256_stream_ps(p, (__m256)v);
    else
      _mm256_stream_pd(p, (__m256d)v);
    return;
  }
#endif
#if defined(__SSE2__)
  if constexpr (sizeof(v) == 16) {
    if constexpr (sizeof(T) == 4)
      _mm_stream_ps(p, (__m128)v);
    else
      _mm_stream_pd(p, (__m128d)v);
    return;
  }
#endif
  vstore(p, v);
}

inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// x - 0, not 0 + x: x - 0 is x for every x (-0 included), so it compiles to a bare
// broadcast; 0 + x turns -0 into +0, so the compiler must do that addition (a scalar add
// before every broadcast in the multiply-add loops).
template <typename T>
inline Vec<T> vbroadcast(T x) {
  return x - Vec<T>{};
}

#if defined(__AVX512F__)
// transpose_lanes' last step on 512-bit vectors: x[S * g + k] (S = kLanes / 4) holds, in its
// 128-bit block l, the block-l elements (pairs of lanes done) of row group g; r[S * l + k]
// gets block l of x[k], x[S + k], x[2S + k], x[3S + k], in that order (two rounds of
// 128-bit block shuffles, whatever the lane width).
template <typename T>
inline void transpose_blocks_512(const __m512i* x, Vec<T>* r) {
  constexpr int S = kLanes<T> / 4;
  for (int k = 0; k < S; ++k) {
    const __m512i a = _mm512_shuffle_i64x2(x[k], x[S + k], 0x88);
    const __m512i b = _mm512_shuffle_i64x2(x[k], x[S + k], 0xDD);
    const __m512i c = _mm512_shuffle_i64x2(x[2 * S + k], x[3 * S + k], 0x88);
    const __m512i d = _mm512_shuffle_i64x2(x[2 * S + k], x[3 * S + k], 0xDD);
    r[k] = (Vec<T>)_mm512_shuffle_i64x2(a, c, 0x88);
    r[2 * S + k] = (Vec<T>)_mm512_shuffle_i64x2(a, c, 0xDD);
    r[S + k] = (Vec<T>)_mm512_shuffle_i64x2(b, d, 0x88);
    r[3 * S + k] = (Vec<T>)_mm512_shuffle_i64x2(b, d, 0xDD);
  }
}
#endif

// r[i] lane j <-> r[j] lane i for the kLanes<T> vectors r[0..kLanes): a square transpose in
// registers where the ISA has the shuffles (pairs within 128-bit lanes, then 128-bit lanes
// across vectors), through memory elsewhere.
template <typename T>
inline void transpose_lanes(Vec<T>* r) {
  constexpr int L = kLanes<T>;
  static_assert(std::is_floating_point_v<T>, "the wide paths below are float or double");
#if defined(__AVX512F__)
  if constexpr (sizeof(Vec<T>) == 64 && sizeof(T) == 4) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_epi32((__m512i)r[2 * i], (__m512i)r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32((__m512i)r[2 * i], (__m512i)r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // u[4i + k], 128-bit lane l: word 4l + k of rows 4i..4i+3
      u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    transpose_blocks_512<T>(u, r);
    return;
  } else if constexpr (sizeof(Vec<T>) == 64) {
    __m512i t[8];  // t[2i + k], 128-bit lane l: element 2l + k of rows 2i, 2i + 1
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm512_unpacklo_epi64((__m512i)r[2 * i], (__m512i)r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi64((__m512i)r[2 * i], (__m512i)r[2 * i + 1]);
    }
    transpose_blocks_512<T>(t, r);
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(Vec<T>) == 32 && sizeof(T) == 4) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps((__m256)r[2 * i], (__m256)r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps((__m256)r[2 * i], (__m256)r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // u[4i + k], 128-bit lane l: element 4l + k of rows 4i..4i+3
      u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
      r[k] = (Vec<T>)_mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
      r[4 + k] = (Vec<T>)_mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
    }
    return;
  } else if constexpr (sizeof(Vec<T>) == 32) {
    const __m256d t0 = _mm256_unpacklo_pd((__m256d)r[0], (__m256d)r[1]);
    const __m256d t1 = _mm256_unpackhi_pd((__m256d)r[0], (__m256d)r[1]);
    const __m256d t2 = _mm256_unpacklo_pd((__m256d)r[2], (__m256d)r[3]);
    const __m256d t3 = _mm256_unpackhi_pd((__m256d)r[2], (__m256d)r[3]);
    r[0] = (Vec<T>)_mm256_permute2f128_pd(t0, t2, 0x20);
    r[1] = (Vec<T>)_mm256_permute2f128_pd(t1, t3, 0x20);
    r[2] = (Vec<T>)_mm256_permute2f128_pd(t0, t2, 0x31);
    r[3] = (Vec<T>)_mm256_permute2f128_pd(t1, t3, 0x31);
    return;
  }
#endif
  T m[L][L];
  for (int i = 0; i < L; ++i)
    for (int j = 0; j < L; ++j) m[j][i] = r[i][j];
  for (int i = 0; i < L; ++i)
    for (int j = 0; j < L; ++j) r[i][j] = m[i][j];
}

// Lane i = p[i % N]: N values repeated across the vector (one block broadcast where the
// ISA has it, where GCC would insert lane by lane).
template <int N, typename T>
inline Vec<T> vtile(const T* p) {
#if defined(__AVX512F__)
  if constexpr (sizeof(Vec<T>) == 64 && sizeof(T) == 4 && N == 4)
    return (Vec<T>)_mm512_broadcast_f32x4(_mm_loadu_ps(p));
#endif
#if defined(__AVX__)
  if constexpr (sizeof(Vec<T>) == 32 && sizeof(T) == 4 && N == 4)
    return (Vec<T>)_mm256_broadcast_ps(reinterpret_cast<const __m128*>(p));
#endif
  Vec<T> v;
  for (int i = 0; i < kLanes<T>; ++i) v[i] = p[i % N];
  return v;
}

// Lanes whose bool byte at m is nonzero (kLanes bytes are read).
template <typename T>
inline typename MaskOf<T>::type vkeep(const uint8_t* m) {
  typename MaskOf<T>::bytes b;
  __builtin_memcpy(&b, m, sizeof b);
  return __builtin_convertvector(b, typename MaskOf<T>::type) != 0;
}

// Bit j set where p[j] == x, for the 64 contiguous entries at p (bool bytes, float or
// double): a comparison as a bitmap, for scans that ask only which entries match (a
// register compare and one movemask per vector, where the loop would test entry by entry).
template <typename E>
inline uint64_t match_bits64(const E* p, E x) {
  static_assert(sizeof(E) == 1 || std::is_floating_point_v<E>, "bytes, float or double");
  uint64_t b = 0;
#if defined(__AVX512BW__)
  if constexpr (FASTATTN_VEC_BYTES == 64) {
    if constexpr (sizeof(E) == 1) {
      return _mm512_cmpeq_epi8_mask(_mm512_loadu_si512(p), _mm512_set1_epi8(char(x)));
    } else if constexpr (sizeof(E) == 4) {
      for (int i = 0; i < 4; ++i)
        b |=
            uint64_t(_mm512_cmp_ps_mask(_mm512_loadu_ps(p + 16 * i), _mm512_set1_ps(x), _CMP_EQ_OQ))
            << (16 * i);
      return b;
    } else {
      for (int i = 0; i < 8; ++i)
        b |= uint64_t(_mm512_cmp_pd_mask(_mm512_loadu_pd(p + 8 * i), _mm512_set1_pd(x), _CMP_EQ_OQ))
             << (8 * i);
      return b;
    }
  }
#endif
#if defined(__AVX2__)
  if constexpr (FASTATTN_VEC_BYTES >= 32) {
    if constexpr (sizeof(E) == 1) {
      const __m256i v = _mm256_set1_epi8(char(x));
      for (int i = 0; i < 2; ++i)
        b |= uint64_t(uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(
                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i)), v))))
             << (32 * i);
    } else if constexpr (sizeof(E) == 4) {
      for (int i = 0; i < 8; ++i)
        b |= uint64_t(_mm256_movemask_ps(
                 _mm256_cmp_ps(_mm256_loadu_ps(p + 8 * i), _mm256_set1_ps(x), _CMP_EQ_OQ)))
             << (8 * i);
    } else {
      for (int i = 0; i < 16; ++i)
        b |= uint64_t(_mm256_movemask_pd(
                 _mm256_cmp_pd(_mm256_loadu_pd(p + 4 * i), _mm256_set1_pd(x), _CMP_EQ_OQ)))
             << (4 * i);
    }
    return b;
  }
#endif
#if defined(__SSE2__)
  if constexpr (FASTATTN_VEC_BYTES >= 16) {
    if constexpr (sizeof(E) == 1) {
      const __m128i v = _mm_set1_epi8(char(x));
      for (int i = 0; i < 4; ++i)
        b |= uint64_t(uint32_t(_mm_movemask_epi8(
                 _mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)), v))))
             << (16 * i);
    } else if constexpr (sizeof(E) == 4) {
      for (int i = 0; i < 16; ++i)
        b |= uint64_t(_mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(p + 4 * i), _mm_set1_ps(x))))
             << (4 * i);
    } else {
      for (int i = 0; i < 32; ++i)
        b |= uint64_t(_mm_movemask_pd(_mm_cmpeq_pd(_mm_loadu_pd(p + 2 * i), _mm_set1_pd(x))))
             << (2 * i);
    }
    return b;
  }
#endif
  for (int j = 0; j < 64; ++j) b |= uint64_t(p[j] == x) << j;
  return b;
}

// a * b + c with one rounding, on a vector or a scalar, where the ISA has an FMA unit (the
// neon ISA: FMLA on vectors, FMADD on one value). Elsewhere (baseline SSE2, the scalar path,
// aarch64's baseline) a multiply, then an add: two roundings, as the hardware gives; the
// result still depends on nothing but the source and the ISA.
template <typename V>
inline V vfma(V a, V b, V c) {
  using T = typename LaneOf<V>::type;
  constexpr bool f32 = sizeof(T) == 4;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    if constexpr (f32)
      return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
    else
      return (V)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
  }
#endif
#if defined(__FMA__)
  if constexpr (sizeof(V) == 32) {
    if constexpr (f32)
      return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
    else
      return (V)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
  } else if constexpr (sizeof(V) == 16) {
    if constexpr (f32)
      return (V)_mm_fmadd_ps((__m128)a, (__m128)b, (__m128)c);
    else
      return (V)_mm_fmadd_pd((__m128d)a, (__m128d)b, (__m128d)c);
  }
#endif
#if defined(FASTATTN_NEON)
  if constexpr (sizeof(V) == 16) {  // c + a * b, the accumulator first
    if constexpr (f32)
      return (V)vfmaq_f32((float32x4_t)c, (float32x4_t)a, (float32x4_t)b);
    else
      return (V)vfmaq_f64((float64x2_t)c, (float64x2_t)a, (float64x2_t)b);
  }
#endif
#if defined(__FMA__) || defined(FASTATTN_NEON)
  if constexpr (std::is_arithmetic_v<V>) {
    if constexpr (f32)
      return __builtin_fmaf(a, b, c);
    else
      return __builtin_fma(a, b, c);
  } else if constexpr (sizeof(V) == sizeof(T)) {  // a one-lane vector
    V r;
    r[0] = f32 ? __builtin_fmaf(a[0], b[0], c[0]) : __builtin_fma(a[0], b[0], c[0]);
    return r;
  }
#endif
  return a * b + c;
}

// Lane-wise min(a, b) = a < b ? a : b and max(a, b) = a > b ? a : b, as the min/max
// instructions define them (b when either is NaN): one instruction where the ISA has it,
// where GCC would otherwise emit a compare and a blend.
template <typename V>
inline V vmin(V a, V b) {
  using T = typename LaneOf<V>::type;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    // maskz with every lane set: the plain instruction, without the unmasked form's
    // "undefined" source operand (which GCC 12 warns about).
    if constexpr (sizeof(T) == 4)
      return (V)_mm512_maskz_min_ps(__mmask16(-1), (__m512)a, (__m512)b);
    else
      return (V)_mm512_maskz_min_pd(__mmask8(-1), (__m512d)a, (__m512d)b);
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) {
    if constexpr (sizeof(T) == 4)
      return (V)_mm256_min_ps((__m256)a, (__m256)b);
    else
      return (V)_mm256_min_pd((__m256d)a, (__m256d)b);
  }
#endif
#if defined(__SSE2__)
  if constexpr (sizeof(V) == 16) {
    if constexpr (sizeof(T) == 4)
      return (V)_mm_min_ps((__m128)a, (__m128)b);
    else
      return (V)_mm_min_pd((__m128d)a, (__m128d)b);
  }
#endif
  return a < b ? a : b;
}
template <typename V>
inline V vmax(V a, V b) {
  using T = typename LaneOf<V>::type;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    if constexpr (sizeof(T) == 4)
      return (V)_mm512_maskz_max_ps(__mmask16(-1), (__m512)a, (__m512)b);
    else
      return (V)_mm512_maskz_max_pd(__mmask8(-1), (__m512d)a, (__m512d)b);
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) {
    if constexpr (sizeof(T) == 4)
      return (V)_mm256_max_ps((__m256)a, (__m256)b);
    else
      return (V)_mm256_max_pd((__m256d)a, (__m256d)b);
  }
#endif
#if defined(__SSE2__)
  if constexpr (sizeof(V) == 16) {
    if constexpr (sizeof(T) == 4)
      return (V)_mm_max_ps((__m128)a, (__m128)b);
    else
      return (V)_mm_max_pd((__m128d)a, (__m128d)b);
  }
#endif
  return a > b ? a : b;
}

#if defined(__clang__)
// Clang has no __builtin_shuffle (GCC's, with a mask vector): the same lane moves through
// __builtin_shufflevector, whose lane indices are constants, one per lane.
template <int W, typename V, size_t... I>
inline V xor_lanes(V x, std::index_sequence<I...>) {
  return __builtin_shufflevector(x, x, (int(I) ^ W)...);
}
template <int Odd, typename V, size_t... I>
inline V even_or_odd_lanes(V a, V b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, (2 * int(I) + Odd)...);
}
#endif

// Rounds w, 2w, ... of reduce_add: lane i gets lane i plus lane i ^ w. The indices are
// constants, so each round is one in-lane permute or 128-bit block swap and an add, in
// registers. Always inlined, as reduce_add: GCC kept the recursion (or reduce_add over it)
// out of line, a call (and the caller's vectors saved around it) wherever the softmax sums
// a row.
template <typename T, int W = 1>
[[gnu::always_inline]] inline Vec<T> add_lane_pairs(Vec<T> x) {
  if constexpr (W >= kLanes<T>) {
    return x;
  } else {
#if defined(__clang__)
    return add_lane_pairs<T, 2 * W>(x + xor_lanes<W>(x, std::make_index_sequence<kLanes<T>>()));
#else
    typename MaskOf<T>::type partner;
    for (int i = 0; i < kLanes<T>; ++i) partner[i] = i ^ W;
    return add_lane_pairs<T, 2 * W>(x + __builtin_shuffle(x, partner));
#endif
  }
}

// Sum of the lanes as a pairwise tree: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + ...), the
// order reduce_lanes_of gives every lane it produces (lane 0 of add_lane_pairs).
template <typename T>
[[gnu::always_inline]] inline T reduce_add(Vec<T> x) {
  static_assert(std::is_floating_point_v<T>, "lanes of a float or double vector");
  return add_lane_pairs<T>(x)[0];
}

// a[0..L) -> one vector whose lane i is reduce_add(a[i]): log2(L) rounds of adding the even
// and odd lanes of neighbouring vectors (a may be overwritten). The wide ISAs take each round
// with the cheapest shuffle that pairs the same lanes: in-lane shuffles while the lanes
// summed share a 128-bit block, block shuffles after; the generic form's two-source
// permutes cost about a fifth of an int8 decoding pass (they overwrite a source, so the
// 16 accumulators spill). Every lane is summed in the same tree either way. Always
// inlined: GCC kept it out of line, its caller's accumulators then stored and reloaded
// through memory on every call (10 % of int8 GQA decode's profile, 6 % of its CPU time).
template <typename T>
[[gnu::always_inline]] inline Vec<T> reduce_lanes_of(Vec<T>* a) {
  constexpr int L = kLanes<T>;
  static_assert(std::is_floating_point_v<T>, "the wide paths below are float or double");
#if defined(__AVX512F__)
  if constexpr (sizeof(Vec<T>) == 64 && sizeof(T) == 4) {
    // Round 1 adds lanes 4j+0/1 and 4j+2/3 of a pair of vectors; round 2 makes block j of
    // c[i] the four block-j sums of a[4i..4i+4); rounds 3 and 4 add blocks 0/1 and 2/3.
    const auto pairs = [](__m512 x, __m512 y) {
      return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
    };
    const auto blocks = [](__m512 x, __m512 y) {
      return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
    };
    __m512 b[8], c[4];
    for (int i = 0; i < 8; ++i) b[i] = pairs((__m512)a[2 * i], (__m512)a[2 * i + 1]);
    for (int i = 0; i < 4; ++i) c[i] = pairs(b[2 * i], b[2 * i + 1]);
    return (Vec<T>)blocks(blocks(c[0], c[1]), blocks(c[2], c[3]));
  } else if constexpr (sizeof(Vec<T>) == 64) {
    // Round 1 adds the two doubles of each block; rounds 2 and 3 add blocks 0/1 and 2/3.
    const auto pairs = [](__m512d x, __m512d y) {
      return _mm512_add_pd(_mm512_shuffle_pd(x, y, 0x00), _mm512_shuffle_pd(x, y, 0xFF));
    };
    const auto blocks = [](__m512d x, __m512d y) {
      return _mm512_add_pd(_mm512_shuffle_f64x2(x, y, 0x88), _mm512_shuffle_f64x2(x, y, 0xDD));
    };
    __m512d b[4];
    for (int i = 0; i < 4; ++i) b[i] = pairs((__m512d)a[2 * i], (__m512d)a[2 * i + 1]);
    return (Vec<T>)blocks(blocks(b[0], b[1]), blocks(b[2], b[3]));
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(Vec<T>) == 32 && sizeof(T) == 4) {
    const auto pairs = [](__m256 x, __m256 y) {
      return _mm256_add_ps(_mm256_shuffle_ps(x, y, 0x88), _mm256_shuffle_ps(x, y, 0xDD));
    };
    __m256 b[4];
    for (int i = 0; i < 4; ++i) b[i] = pairs((__m256)a[2 * i], (__m256)a[2 * i + 1]);
    const __m256 c0 = pairs(b[0], b[1]), c1 = pairs(b[2], b[3]);
    return (Vec<T>)_mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20),
                                 _mm256_permute2f128_ps(c0, c1, 0x31));
  } else if constexpr (sizeof(Vec<T>) == 32) {
    const auto pairs = [](__m256d x, __m256d y) {
      return _mm256_add_pd(_mm256_shuffle_pd(x, y, 0x0), _mm256_shuffle_pd(x, y, 0xF));
    };
    const __m256d b0 = pairs((__m256d)a[0], (__m256d)a[1]);
    const __m256d b1 = pairs((__m256d)a[2], (__m256d)a[3]);
    return (Vec<T>)_mm256_add_pd(_mm256_permute2f128_pd(b0, b1, 0x20),
                                 _mm256_permute2f128_pd(b0, b1, 0x31));
  }
#endif
#if defined(__clang__)
  constexpr auto lanes = std::make_index_sequence<L>();
  for (int count = L; count > 1; count /= 2)
    for (int i = 0; i < count / 2; ++i)
      a[i] = even_or_odd_lanes<0>(a[2 * i], a[2 * i + 1], lanes) +
             even_or_odd_lanes<1>(a[2 * i], a[2 * i + 1], lanes);
#else
  typename MaskOf<T>::type even, odd;
  for (int i = 0; i < L; ++i) {
    even[i] = 2 * i;
    odd[i] = 2 * i + 1;
  }
  for (int count = L; count > 1; count /= 2)
    for (int i = 0; i < count / 2; ++i)
      a[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], even) +
             __builtin_shuffle(a[2 * i], a[2 * i + 1], odd);
#endif
  return a[0];
}

// Max of the lanes, NaN lanes ignored (-inf for a vector of NaNs).
template <typename T>
inline T reduce_max(Vec<T> v) {
#if defined(__AVX512F__)
  if constexpr (sizeof(Vec<T>) == 64) {
    // A tree (halves, then quarters, ...: 4 shuffles and maxes for float) instead of 16
    // dependent scalar maxes, once per row and key block in the softmax. NaN lanes become
    // -inf first (vmax keeps its second operand when the first is NaN), then max is exact,
    // so the same value comes out (a tie of +0 and -0 may pick the other zero, which no
    // softmax use of the max tells apart: s - m, exp2 and m + log l see the same numbers).
    v = vmax(v, Vec<T>{} - T(__builtin_inf()));
    if constexpr (sizeof(T) == 4) {
      __m512 x = (__m512)v;
      x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4e));  // blocks 2,3,0,1
      x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xb1));  // blocks 1,0,3,2
      x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4e));        // lanes 2,3,0,1
      x = _mm512_max_ps(x, _mm512_permute_ps(x, 0xb1));        // lanes 1,0,3,2
      return _mm512_cvtss_f32(x);
    } else {
      __m512d x = (__m512d)v;
      x = _mm512_max_pd(x, _mm512_shuffle_f64x2(x, x, 0x4e));
      x = _mm512_max_pd(x, _mm512_shuffle_f64x2(x, x, 0xb1));
      x = _mm512_max_pd(x, _mm512_permute_pd(x, 0x55));
      return _mm512_cvtsd_f64(x);
    }
  }
#endif
  T m = -T(__builtin_inf());
  for (int lane = 0; lane < kLanes<T>; ++lane) m = v[lane] > m ? v[lane] : m;
  return m;
}

// Max of the lanes where a NaN lane wins (NaN propagates).
template <typename T>
inline T reduce_max_nan(Vec<T> v) {
  T m = -T(__builtin_inf());
  for (int lane = 0; lane < kLanes<T>; ++lane) {
    const T x = v[lane];
    m = (x > m || x != x) ? x : m;
  }
  return m;
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

#include "simd/math-inl.h"

// Storage <-> compute conversions of the SIMD layer: a storage element (simd/storage.h, or
// the compute type itself) widened to the compute type, one at a time or a whole vector
// at a time, and a compute value narrowed back, rounding to nearest even. Widening is
// exact. The kernels widen block by block as they read (packing, or the decode path's
// direct reads), so no whole-array copy in the compute type is ever made. Per ISA, like
// vec-inl.h (include only inside a TU that defines FASTATTN_ISA_NS).
#pragma once  // per translation unit

#include <cstdint>
#include <type_traits>

#include "api/params.h"
#include "simd/storage.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

inline uint32_t float_bits(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float x;
  __builtin_memcpy(&x, &u, 4);
  return x;
}

// binary16 -> float32 (exact). F16C has an instruction; elsewhere the fields are moved.
inline float half_to_float(Half h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16, mag = h.bits & 0x7fffu;
  if (mag >= 0x7c00u) return bits_float(sign | 0x7f800000u | ((mag & 0x3ffu) << 13));
  // Normal: rebias the exponent (15 -> 127) in place; subnormal: mantissa * 2^-24.
  if (mag >= 0x0400u) return bits_float(sign | ((mag + ((127u - 15u) << 10)) << 13));
  return bits_float(sign | float_bits(float(mag) * 0x1p-24f));
#endif
}

// float32 -> binary16, round to nearest even (as NumPy's astype); overflow gives inf.
inline Half float_to_half(float x) {
#if defined(__F16C__)
  return Half{uint16_t(_cvtss_sh(x, 0))};  // 0: round to nearest even
#else
  uint32_t u = float_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x47800000u)  // >= 2^16 (past every finite half, however it rounds), inf, NaN
    return Half{uint16_t(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (u < 0x38800000u) {  // below 2^-14: a subnormal half. Adding 0.5 puts the value's
    // 2^-24 units in the low mantissa bits of a float in [0.5, 1), rounded to nearest even
    // by the addition itself; what lies above 0.5 is the half's bits.
    const float f = bits_float(u) + 0.5f;
    return Half{uint16_t(sign | (float_bits(f) - 0x3f000000u))};
  }
  // Normal: rebias the exponent, then round the 13 dropped bits to nearest even (a carry
  // into the exponent is right, up to inf).
  const uint32_t odd = (u >> 13) & 1u;
  u += ((15u - 127u) << 23) + 0xfffu + odd;
  return Half{uint16_t(sign | (u >> 13))};
#endif
}

inline float bf16_to_float(BFloat16 b) { return bits_float(uint32_t(b.bits) << 16); }

// float32 bits -> bfloat16 bits (in the low half): round to nearest even; a NaN stays a
// (quiet) NaN. U: uint32_t, or a vector of them (the same expression lane by lane).
template <typename U>
inline U bf16_bits_of(U u) {
  return (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u
                                         : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// float32 -> bfloat16 (bf16_bits_of).
inline BFloat16 float_to_bf16(float x) { return BFloat16{uint16_t(bf16_bits_of(float_bits(x)))}; }

// One stored element as the compute type T.
template <typename T, typename S>
inline T widen(S x) {
  if constexpr (std::is_same_v<S, T>) {
    return x;
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    static_assert(std::is_same_v<T, float>, "16-bit storage is computed in float32");
    return bf16_to_float(x);
  } else if constexpr (std::is_same_v<S, Half>) {
    static_assert(std::is_same_v<T, float>, "16-bit storage is computed in float32");
    return half_to_float(x);
  } else {
    static_assert(std::is_same_v<S, int8_t>, "unknown storage type");
    return T(x);
  }
}

// A compute value as the storage type S (rounded to nearest even).
template <typename S, typename T>
inline S narrow(T x) {
  if constexpr (std::is_same_v<S, T>) {
    return x;
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    return float_to_bf16(x);
  } else {
    static_assert(std::is_same_v<S, Half>, "only the 16-bit floats are written");
    return float_to_half(x);
  }
}

// kLanes<float> 16-bit patterns, and as many 32-bit ones (one float vector).
typedef uint16_t Bits16x __attribute__((vector_size(2 * kLanes<float>)));
typedef uint32_t Bits32x __attribute__((vector_size(4 * kLanes<float>)));
typedef int8_t Int8x __attribute__((vector_size(kLanes<float>)));

// kLanes<T> stored elements at p as one Vec<T> (unaligned).
template <typename T, typename S>
inline Vec<T> vload_wide(const S* p) {
  if constexpr (std::is_same_v<S, T>) {
    return vload(p);
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    // Zero-extend each 16-bit pattern to 32 bits and shift it into the top half.
    Bits16x h;
    __builtin_memcpy(&h, p, sizeof h);
    const Bits32x w = __builtin_convertvector(h, Bits32x) << 16;
    Vec<float> r;
    __builtin_memcpy(&r, &w, sizeof r);
    return r;
  } else if constexpr (std::is_same_v<S, int8_t>) {
    static_assert(std::is_same_v<T, float>, "int8 storage is computed in float32");
    // Sign-extended and converted, exactly. GCC lowers the generic conversion of an int8
    // vector lane by lane, so the wide ISAs say which instructions.
#if defined(__AVX512F__)
    if constexpr (sizeof(Vec<float>) == 64)
      return (Vec<float>)_mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
#if defined(__AVX2__)
    if constexpr (sizeof(Vec<float>) == 32)
      return (Vec<float>)_mm256_cvtepi32_ps(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#endif
    Int8x b;
    __builtin_memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, Vec<float>);
  } else {
    if constexpr (std::is_same_v<S, Half>) {
#if defined(__AVX512F__)
      if constexpr (sizeof(Vec<float>) == 64)
        return (Vec<float>)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#endif
#if defined(__F16C__)
      if constexpr (sizeof(Vec<float>) == 32)
        return (Vec<float>)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
    }
    Vec<T> r;
    for (int i = 0; i < kLanes<T>; ++i) r[i] = widen<T>(p[i]);
    return r;
  }
}

// dst[0, n) = narrow<S>(src[c] * scale) for each c: whole vectors at a time (the same
// product, and narrow's bits: bf16_bits_of, or F16C's nearest even), then the tail one by one.
// Output rows are written this way; element by element it was about 4 % of a bfloat16
// SDPA call (1x8 1024^2 E64).
template <typename S, typename T>
inline void narrow_scaled(S* dst, const T* src, int64_t n, T scale) {
  constexpr int L = kLanes<T>;
  int64_t c = 0;
  if constexpr (std::is_same_v<S, T>) {
    for (; c + L <= n; c += L) vstore(dst + c, vload(src + c) * scale);
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    for (; c + L <= n; c += L) {
      const Vec<float> x = vload(src + c) * scale;
      Bits32x u;
      __builtin_memcpy(&u, &x, sizeof u);
      const Bits16x h = __builtin_convertvector(bf16_bits_of(u), Bits16x);
      __builtin_memcpy(dst + c, &h, sizeof h);
    }
  } else {
    static_assert(std::is_same_v<S, Half>, "only the 16-bit floats are written");
#if defined(__AVX512F__)
    if constexpr (sizeof(Vec<float>) == 64)
      for (; c + L <= n; c += L)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c),
                            _mm512_cvtps_ph((__m512)(vload(src + c) * scale),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#if defined(__F16C__)
    if constexpr (sizeof(Vec<float>) == 32)
      for (; c + L <= n; c += L)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c),
                         _mm256_cvtps_ph((__m256)(vload(src + c) * scale),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  }
  for (; c < n; ++c) dst[c] = narrow<S>(src[c] * scale);
}

// The one switch from a float32 kernel entry to its instance for the arrays' storage
// type (params.storage: float32 itself, float16 or bfloat16): returns run(S{}).
template <typename Run>
inline bool with_float_storage(Storage storage, Run&& run) {
  switch (storage) {
    case Storage::kF16:
      return run(Half{});
    case Storage::kBF16:
      return run(BFloat16{});
    default:
      return run(float{});
  }
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

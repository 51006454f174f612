// Fast vectorised activations for the attention-family kernels (additive attention's
// tanh). Compiled once per ISA: include only from an <op>_<isa>.cpp that defines
// FASTATTN_ISA_NS, so no inline function leaks across ISAs. No libm, no std templates.
#pragma once  // per translation unit

#if defined(__SSE2__)
#include <immintrin.h>  // min/max instructions only (gnu_inline: nothing emitted out of line)
#endif

#include "kernels/math-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// Lane-wise min(a, b) = a < b ? a : b and max(a, b) = a > b ? a : b, as the min/max
// instructions define them (b when either is NaN): one instruction where the ISA has it,
// where GCC would otherwise emit a compare and a blend.
template <typename T, typename V>
inline V vmin(V a, V b) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    // maskz with every lane set: the plain instruction, without the unmasked form's
    // "undefined" source operand (which GCC 12 warns about).
    if constexpr (sizeof(T) == 4) return (V)_mm512_maskz_min_ps(__mmask16(-1), (__m512)a, (__m512)b);
    else return (V)_mm512_maskz_min_pd(__mmask8(-1), (__m512d)a, (__m512d)b);
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) {
    if constexpr (sizeof(T) == 4) return (V)_mm256_min_ps((__m256)a, (__m256)b);
    else return (V)_mm256_min_pd((__m256d)a, (__m256d)b);
  }
#endif
#if defined(__SSE2__)
  if constexpr (sizeof(V) == 16) {
    if constexpr (sizeof(T) == 4) return (V)_mm_min_ps((__m128)a, (__m128)b);
    else return (V)_mm_min_pd((__m128d)a, (__m128d)b);
  }
#endif
  return a < b ? a : b;
}
template <typename T, typename V>
inline V vmax(V a, V b) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    // maskz with every lane set: the plain instruction, without the unmasked form's
    // "undefined" source operand (which GCC 12 warns about).
    if constexpr (sizeof(T) == 4) return (V)_mm512_maskz_max_ps(__mmask16(-1), (__m512)a, (__m512)b);
    else return (V)_mm512_maskz_max_pd(__mmask8(-1), (__m512d)a, (__m512d)b);
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) {
    if constexpr (sizeof(T) == 4) return (V)_mm256_max_ps((__m256)a, (__m256)b);
    else return (V)_mm256_max_pd((__m256d)a, (__m256d)b);
  }
#endif
#if defined(__SSE2__)
  if constexpr (sizeof(V) == 16) {
    if constexpr (sizeof(T) == 4) return (V)_mm_max_ps((__m128)a, (__m128)b);
    else return (V)_mm_max_pd((__m128d)a, (__m128d)b);
  }
#endif
  return a > b ? a : b;
}

// tanh on a whole vector, for the Lq x Lk x hidden evaluations of additive attention.
// float: Eigen's rational approximation (odd degree-13 / even degree-6 polynomial on
// [-7.905, 7.905], where it reaches 1 in float): one division and 11 multiply-adds, at most
// 3.3 ulp from tanh (measured densely on [-10, 10] and on a log grid down to 1e-8; near 0
// p/q is x * (1 - 1.3e-7), so Eigen's "x below 4e-4" branch is not needed). NaN propagates.
// double: the expm1-based tanh_approx_vec of math-inl.h (a few ulp).
template <typename T, typename V>
inline V tanh_fast_vec(V x) {
  if constexpr (sizeof(T) == 4) {
    const V zero = V{};
    const V hi = zero + 7.90531110763549805f, lo = zero - 7.90531110763549805f;
    // min(hi, x) returns x when x is NaN, so NaN passes both clamps and propagates.
    const V xc = vmax<T>(lo, vmin<T>(hi, x));
    const V x2 = xc * xc;
    V p = zero - 2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 - 8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    p = p * xc;
    V q = zero + 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    return p / q;
  } else {
    return tanh_approx_vec<T>(x);
  }
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

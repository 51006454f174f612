// The SIMD layer's math (reached through simd/vec-inl.h, which includes this after its
// primitives): branch-free exp, exp2, expm1 and tanh on vectors (and exp/exp2 on one value)
// for the softmaxes, the softcap and additive attention. Multiply-adds are vfma, so each
// ISA's results are fixed by this source. Per ISA like the rest of the layer; no libm.
#pragma once  // per translation unit; each ISA has its own TU

#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

template <typename T>
struct ExpTraits;

template <>
struct ExpTraits<float> {
  using Bits = int32_t;
  static constexpr float kMin = -87.33f;  // below: result under FLT_MIN, returned as 0
  static constexpr float kMax = 88.0f;
  static constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to integer
  static constexpr float kLn2Hi = 0.693359375f;
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr int kMantissa = 23;
  static constexpr int kBias = 127;
};

template <>
struct ExpTraits<double> {
  using Bits = int64_t;
  static constexpr double kMin = -708.3;
  static constexpr double kMax = 709.0;
  static constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr int kMantissa = 52;
  static constexpr int kBias = 1023;
};

template <typename T>
inline T select(bool c, T a, T b) {
  return c ? a : b;
}

// 1 / k!, exactly as the double 1.0 / (k!) (k! is exact in a double up to 18!).
constexpr double inv_factorial(int k) {
  double f = 1;
  for (int i = 2; i <= k; ++i) f *= i;
  return 1.0 / f;
}

// sum_{k=First}^{Last} x^(k-First) / k! by Horner's rule from the highest term, one vfma per
// term: the Taylor polynomials of e^x (First = 0) and of (e^x - 1) / x (First = 1).
template <typename T, int K, int First, typename V>
inline V taylor_horner(V poly, V x) {
  if constexpr (K < First) {
    return poly;
  } else {
    constexpr T c = T(inv_factorial(K));
    return taylor_horner<T, K - 1, First>(vfma(poly, x, V{} + c), x);
  }
}

template <typename T, int First, int Last, typename V>
inline V taylor_poly(V x) {
  constexpr T top = T(inv_factorial(Last));
  return taylor_horner<T, Last - 1, First>(V{} + top, x);
}

// e^x with x = n ln2 + r, |r| <= ln2/2, and a Taylor polynomial for e^r: degree 7 for
// float (truncation 5e-9, ~1 ulp) and 13 for double (4e-18). Returns 0 for x < kMin
// (so e^-inf = 0), NaN for NaN. Accurate to a few ulp on [kMin, kMax].
template <typename T>
inline T exp_approx(T x) {
  using V = T;
  using Tr = ExpTraits<T>;
  using Bits = typename Tr::Bits;
  constexpr T kLog2e = T(1.4426950408889634);
  T xc = select(x < Tr::kMin, Tr::kMin, x);
  xc = select(xc > Tr::kMax, Tr::kMax, xc);
  xc = select(x != x, T(0), xc);  // keep the integer conversion below defined for NaN
  const T n = vfma(xc, kLog2e, Tr::kRound) - Tr::kRound;
  const T r = vfma(-n, T(Tr::kLn2Lo), vfma(-n, T(Tr::kLn2Hi), xc));
  const V poly = sizeof(T) == 4 ? taylor_poly<T, 0, 7>(r) : taylor_poly<T, 0, 13>(r);
  const Bits e = (static_cast<Bits>(n) + Tr::kBias) << Tr::kMantissa;
  const T result = poly * __builtin_bit_cast(T, e);
  return select(x < Tr::kMin, T(0), select(x != x, x, result));
}

// exp_approx on a whole vector (GCC vector extensions): same algorithm, same results
// lane by lane as the scalar version.
template <typename T, typename V>
inline V exp_approx_vec(V x) {
  using Tr = ExpTraits<T>;
  typedef typename Tr::Bits BitsV __attribute__((vector_size(sizeof(V))));
  constexpr T kLog2e = T(1.4426950408889634);
  const V lo = V{} + Tr::kMin, hi = V{} + Tr::kMax, zero = V{};
  V xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  xc = x != x ? zero : xc;
  const V n = vfma(xc, V{} + kLog2e, V{} + Tr::kRound) - Tr::kRound;
  const V r = vfma(-n, V{} + Tr::kLn2Lo, vfma(-n, V{} + Tr::kLn2Hi, xc));
  const V poly = sizeof(T) == 4 ? taylor_poly<T, 0, 7>(r) : taylor_poly<T, 0, 13>(r);
  const BitsV e = (__builtin_convertvector(n, BitsV) + Tr::kBias) << Tr::kMantissa;
  const V result = poly * (V)e;  // GCC vector cast: reinterprets the bits
  const V out = x != x ? x : result;
  return x < lo ? zero : out;
}

// 2^x for the softmax, whose scores carry log2(e) folded in: x = n + f, |f| <= 1/2.
// float: a degree-6 polynomial interpolating 2^f at Chebyshev nodes (max relative error
// 1.0e-7 evaluated in float, about 1 ulp); double: Taylor of e^(f ln2) to degree 13
// (truncation 4e-18). Returns 0 below 2^(kMin - 1/2) (so 2^-inf = 0), NaN for NaN.
template <typename T>
struct Exp2Traits;
template <>
struct Exp2Traits<float> {
  using Bits = int32_t;
  using UBits = uint32_t;
  static constexpr float kMin = -126.0f, kMax = 127.0f;
};
template <>
struct Exp2Traits<double> {
  using Bits = int64_t;
  using UBits = uint64_t;
  static constexpr double kMin = -1022.0, kMax = 1023.0;
};

template <typename T, bool kToBf16 = false, typename V>
inline V exp2_poly(V f) {
  V poly;
  if constexpr (kToBf16) {
    static_assert(sizeof(T) == 4, "bfloat16 results are computed in float");
    poly = V{} + T(0.009570068876633584);
    poly = vfma(poly, f, V{} + T(0.05591780847534119));
    poly = vfma(poly, f, V{} + T(0.24024745057296643));
    poly = vfma(poly, f, V{} + T(0.6931218212643259));
    poly = vfma(poly, f, V{} + T(0.9999992615692183));
  } else if constexpr (sizeof(T) == 4) {
    poly = V{} + T(0.00015461444683652947);
    poly = vfma(poly, f, V{} + T(0.0013400428178361574));
    poly = vfma(poly, f, V{} + T(0.00961805667859009));
    poly = vfma(poly, f, V{} + T(0.055503272266688435));
    poly = vfma(poly, f, V{} + T(0.24022650922288005));
    poly = vfma(poly, f, V{} + T(0.6931472067028333));
    poly = vfma(poly, f, V{} + T(1.0));
  } else {
    poly = taylor_poly<T, 0, 13>(f * T(0.69314718055994530942));
  }
  return poly;
}

// kNonPositive: the caller guarantees x <= 0 or NaN (a softmax's s - max), so the upper
// clamp, which only acts above kMax, is left out; the results are the same.
// kToBf16: the caller rounds the result to bfloat16 (P for vdpbf16ps), whose rounding
// error is up to 2^-9 relative: a degree-4 polynomial (minimax relative error 2.7e-6
// evaluated in float, 1/700 of that rounding) replaces the degree-6 one, two fused
// multiply-adds fewer per lane.
template <typename T, bool kNonPositive = false, bool kToBf16 = false, typename V>
inline V exp2_approx_vec(V x) {
  using Tr = Exp2Traits<T>;
  typedef typename Tr::UBits UBitsV __attribute__((vector_size(sizeof(V))));
  // Clamp to [kMin - 1, kMax]: n = kMin - 1 gives a zero exponent field, so the result
  // is exactly 0 there (2^-inf = 0, denormals flushed) with no select. A NaN passes the
  // clamps (written so they compile to max/min) and the polynomial keeps it NaN.
  const V lo = V{} + (Tr::kMin - 1), hi = V{} + Tr::kMax;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    // The same n, polynomial and product in fewer instructions on the vector ports (the
    // ports the FMAs use): the fraction f = x - n by one vreduce (exact, AVX512-DQ; one
    // instruction where a roundscale is two on Intel cores) and n = x - f (exact); poly *
    // 2^n by scalef (a power-of-two scaling rounded once, as the multiply is); and the
    // lanes the clamp would have set to n = kMin - 1 (n <= kMin - 1, -inf included: its
    // f is 0) zeroed by a mask instead of clamped (a NaN lane compares unordered, so it
    // is kept), the lower clamp's max saved.
    V xc = x;
    if constexpr (!kNonPositive) xc = vmin(hi, xc);
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    if constexpr (sizeof(T) == 4) {
      const __m512 f = _mm512_reduce_ps((__m512)xc, kNearest);
      const __m512 n = _mm512_sub_ps((__m512)xc, f);
      const V poly = exp2_poly<T, kToBf16>((V)f);
      const __mmask16 keep = _mm512_cmp_ps_mask(n, (__m512)lo, _CMP_NLE_UQ);
      return (V)_mm512_maskz_scalef_ps(keep, (__m512)poly, n);
    } else {
      const __m512d f = _mm512_reduce_pd((__m512d)xc, kNearest);
      const __m512d n = _mm512_sub_pd((__m512d)xc, f);
      const V poly = exp2_poly<T, kToBf16>((V)f);
      const __mmask8 keep = _mm512_cmp_pd_mask(n, (__m512d)lo, _CMP_NLE_UQ);
      return (V)_mm512_maskz_scalef_pd(keep, (__m512d)poly, n);
    }
  }
#endif
  V xc = vmax(lo, x);  // x < lo ? lo : x (a NaN x kept: vmax gives its second operand)
  if constexpr (!kNonPositive) xc = vmin(hi, xc);
  // n = xc rounded to nearest (ties to even) by adding kRound = 1.5 * 2^mantissa: the sum
  // lies in [2^mantissa, 2^(mantissa+1)), where the spacing is 1, so its low bits hold n
  // (kRound's own bits there are 0) and shifting them, biased, into the exponent field
  // pushes kRound's bits out: 2^n without converting n to an integer (AVX2: one
  // instruction fewer per vector on the ports the FMAs use), the same bits as before.
  // Unsigned, so a NaN's bits make the shift defined.
  const V t = xc + ExpTraits<T>::kRound;
  const V n = t - ExpTraits<T>::kRound;
  const V poly = exp2_poly<T, kToBf16>(xc - n);
  const UBitsV e = ((UBitsV)t + ExpTraits<T>::kBias) << ExpTraits<T>::kMantissa;
  return poly * (V)e;
}

// The same on one value (a one-lane vector), for per-row terms.
template <typename T>
inline T exp2_approx(T x) {
  typedef T V1 __attribute__((vector_size(sizeof(T))));
  const V1 v = {x};
  return exp2_approx_vec<T>(v)[0];
}

// e^y - 1 without cancellation: y * (1 + y/2 + y^2/6 + ...) for |y| <= ln2/2 (Taylor to the
// same order as exp_approx), e^y - 1 elsewhere (where it has no cancellation to speak of).
template <typename T, typename V>
inline V expm1_approx_vec(V y) {
  const V zero = V{};
  const V poly = sizeof(T) == 4 ? taylor_poly<T, 1, 8>(y) : taylor_poly<T, 1, 14>(y);
  const V small = y * poly;
  const V ay = y < zero ? -y : y;
  return ay <= T(0.34657359027997264) ? small : exp_approx_vec<T>(y) - T(1);
}

// tanh(x) = sign(x) * -m / (2 + m) with m = e^{-2|x|} - 1: relative error of a few ulp for
// every x (a softcap with a large cap sees small x, where 1 - e^{-2|x|} would cancel).
template <typename T, typename V>
inline V tanh_approx_vec(V x) {
  const V zero = V{};
  const V ax = x < zero ? -x : x;
  const V m = expm1_approx_vec<T>(T(-2) * ax);
  const V th = -m / (T(2) + m);
  return x < zero ? -th : th;
}

// tanh on a whole vector, for the Lq x Lk x hidden evaluations of additive attention.
// float: Eigen's rational approximation (odd degree-13 / even degree-6 polynomial on
// [-7.905, 7.905], where it reaches 1 in float): one division and 11 multiply-adds, at most
// 3.3 ulp from tanh (measured densely on [-10, 10] and on a log grid down to 1e-8; near 0
// p/q is x * (1 - 1.3e-7), so Eigen's "x below 4e-4" branch is not needed). NaN propagates.
// double: tanh_approx_vec above (a few ulp).
template <typename T, typename V>
inline V tanh_fast_vec(V x) {
  if constexpr (sizeof(T) == 4) {
    const V zero = V{};
    const V hi = zero + 7.90531110763549805f, lo = zero - 7.90531110763549805f;
    // min(hi, x) returns x when x is NaN, so NaN passes both clamps and propagates.
    const V xc = vmax(lo, vmin(hi, x));
    const V x2 = xc * xc;
    V p = zero - 2.76076847742355e-16f;
    p = vfma(p, x2, V{} + 2.00018790482477e-13f);
    p = vfma(p, x2, V{} - 8.60467152213735e-11f);
    p = vfma(p, x2, V{} + 5.12229709037114e-08f);
    p = vfma(p, x2, V{} + 1.48572235717979e-05f);
    p = vfma(p, x2, V{} + 6.37261928875436e-04f);
    p = vfma(p, x2, V{} + 4.89352455891786e-03f);
    p = p * xc;
    V q = zero + 1.19825839466702e-06f;
    q = vfma(q, x2, V{} + 1.18534705686654e-04f);
    q = vfma(q, x2, V{} + 2.26843463243900e-03f);
    q = vfma(q, x2, V{} + 4.89352518554385e-03f);
    return p / q;
  } else {
    return tanh_approx_vec<T>(x);
  }
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

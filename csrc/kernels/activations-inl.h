// Fast vectorised activations for the attention-family kernels (additive attention's
// tanh). Compiled once per ISA: include only from an <op>_<isa>.cpp that defines
// FASTATTN_ISA_NS, so no inline function leaks across ISAs. No libm, no std templates.
#pragma once  // per translation unit

#include "kernels/math-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// tanh on a whole vector, for the Lq x Lk x hidden evaluations of additive attention.
// float: Eigen's rational approximation (odd degree-13 / even degree-6 polynomial on
// [-7.905, 7.905], where it reaches 1 in float; x itself below 4e-4): one division and
// 11 multiply-adds, at most 3.3 ulp from tanh (measured densely on [-10, 10] and on a
// log grid down to 1e-8). NaN propagates (the clamps are comparisons NaN fails).
// double: the expm1-based tanh_approx_vec of math-inl.h (a few ulp).
template <typename T, typename V>
inline V tanh_fast_vec(V x) {
  if constexpr (sizeof(T) == 4) {
    const V zero = V{};
    const V hi = zero + 7.90531110763549805f, lo = zero - 7.90531110763549805f;
    V xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
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
    const V ax = x < zero ? -x : x;
    return ax < 0.0004f ? x : p / q;
  } else {
    return tanh_approx_vec<T>(x);
  }
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

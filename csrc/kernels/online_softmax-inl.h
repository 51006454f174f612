// The online softmax's arithmetic, shared by every kernel that normalises scores with it
// (SDPA's engine, the family's OnlineSoftmax and top-k, masked_softmax): exp is taken as
// exp2((s - m) * log2(e)). Scores, masks, the row max m and the weights' scores stay in
// natural units, which keeps every finite score and mask value finite; log2(e) enters only
// the exp2 argument (s - m), which is <= 0 and can overflow only towards -inf, whose exp2
// is the right 0. The log-sum-exp is reported in natural log. Per ISA, in that ISA's
// namespace, like the kernels that include it.
#pragma once  // per translation unit

#include <cstdint>

#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

constexpr double kLog2e = 1.4426950408889634074;

// e^(s - m) on whole vectors and on one value (the same algorithm lane by lane).
// kToBf16: the weights are rounded to bfloat16 (math-inl.h: exp2_approx_vec's shorter
// polynomial).
template <bool kToBf16 = false, typename T, typename V>
inline V softmax_exp_vec(V s, T m) {
  return exp2_approx_vec<T, true, kToBf16>((s - m) * T(kLog2e));  // s - m <= 0 (or NaN)
}
template <typename T>
inline T softmax_exp(T s, T m) {
  return exp2_approx((s - m) * T(kLog2e));
}

// The running max after a block whose own max is mx: NaN wins, so a NaN score makes the
// row NaN whatever came before.
template <typename T>
inline T softmax_new_max(T mx, T m_old) {
  return (mx > m_old || mx != mx) ? mx : m_old;
}

// The row max moved from m_old to m_new: rescale the unnormalised output acc[0:dv) and
// the sum *l (only when the max grew), then add the block's sum. Not on a row's first
// visible block (m_old = -inf): nothing has been added to acc and l yet but products of
// zero probabilities, so they hold +0 (or NaN from 0 * inf), which the factor e^-inf = 0
// would leave as they are; skipping it saves a scalar exp2 and a pass over acc per row.
template <typename T>
inline void softmax_rescale_add(T m_old, T m_new, T block_sum, T* acc, int64_t dv, T* l) {
  if (m_new != m_old && m_old != -T(__builtin_inf())) {
    const T alpha = softmax_exp(m_old, m_new);
    for (int64_t c = 0; c < dv; ++c) acc[c] *= alpha;
    *l *= alpha;
  }
  *l += block_sum;
}

// Masked scores -> weights, e^(s - m) / l from the row's final max m and sum l (not
// e^(s - lse): once |m| is large, m + log(l) loses log(l) and the weights would no longer
// sum to 1); a row that saw nothing (m = -inf) gets zeros.
template <typename T>
inline void finish_weights(T* w, int64_t len, T m, T l) {
  if (m == -T(__builtin_inf())) {
    for (int64_t j = 0; j < len; ++j) w[j] = T(0);
  } else {
    for (int64_t j = 0; j < len; ++j) w[j] = softmax_exp(w[j], m) / l;
  }
}

// Row state (max m, sum l) -> log-sum-exp.
template <typename T>
inline T lse_of(T m, T l) {
  return m == -T(__builtin_inf()) ? m : T(double(m) + __builtin_log(double(l)));
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

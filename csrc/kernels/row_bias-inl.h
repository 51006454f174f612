// Per-head row options of the softmax attention kernels (SDPA and the family's online
// softmax): the attention sink, one extra logit per row that joins the denominator as a key
// of value zero, and the ALiBi bias -slope * |j - (i + diag_offset)|. Per ISA, like the
// SIMD layer it is written in (include only inside a TU that defines FASTATTN_ISA_NS).
#pragma once  // per translation unit

#include <cstdint>

#include "simd/math-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// s[j] -= slope * |off + j| for j < ncols (ncols a whole number of vectors), where off =
// kb - (i + diag_offset) for the row i scoring keys kb, kb + 1, ... The distances are
// integers, exact in T for any key count a call can have in float32 (< 2^24 apart), and
// are formed per vector from a lane ramp: no bias matrix, no per-key table.
template <typename T>
inline void alibi_row(T slope, int64_t off, int64_t ncols, T* s) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  V ramp = V{};
  for (int lane = 0; lane < L; ++lane) ramp[lane] = T(lane);
  const V neg_slope = V{} - slope;
  for (int64_t j = 0; j < ncols; j += L) {
    const V d = ramp + T(off + j);
    const V dist = d < T(0) ? -d : d;
    vstore(s + j, vfma(neg_slope, dist, vload(s + j)));
  }
}

// Folds a sink logit into a row's final softmax state (running max *m, sum *l of e^(s - m)
// over the keys it saw): the sink becomes one more term of the sum. *alpha receives the
// factor the row's unnormalised output must be multiplied by (the old terms rescaled to
// the new max). A row that saw no key (m = -inf) ends with m = sink, l = 1, so its lse is
// the sink. A sink of -inf is no sink (the state is left as it is); NaN makes the row NaN.
template <typename T>
inline void fold_sink(T sink, T* m, T* l, T* alpha) {
  constexpr T kLog2e = T(1.4426950408889634074);
  *alpha = T(1);
  if (sink == -T(__builtin_inf())) return;
  const T m_old = *m;
  const T m_new = (sink > m_old || sink != sink) ? sink : m_old;
  // 2^-inf = 0 when the row saw no key (then *l is 0 too).
  if (m_new != m_old) *alpha = exp2_approx((m_old - m_new) * kLog2e);
  *l = *l * *alpha + exp2_approx((sink - m_new) * kLog2e);
  *m = m_new;
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

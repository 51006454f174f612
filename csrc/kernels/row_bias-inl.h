// Per-head row options of the softmax attention kernels (SDPA and the family's online
// softmax): the attention sink, one extra logit per row that joins the denominator as a key
// of value zero, and the ALiBi bias -slope * |j - (i + diag_offset)|. Per ISA, like the
// SIMD layer it is written in (include only inside a TU that defines FASTATTN_ISA_NS).
#pragma once  // per translation unit

#include <cstdint>

#include "kernels/online_softmax-inl.h"
#include "simd/math-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// s[j] -= slope * |off + j| for j < ncols (ncols a whole number of vectors), where off =
// kb - (i + diag_offset) for the row i scoring keys kb, kb + 1, ...; returns the lane-wise
// running max of the biased scores (as the softmax's row-max pass would). The distances
// d = off + j are integers, exact in T for any key count a call can have in float32
// (< 2^24 apart), stepped by L per vector from a lane ramp: no bias matrix, no per-key
// table. Left of the diagonal (d <= 0) the bias is slope * d, right of it -slope * d, the
// same products with the sign moved: one multiply-add per vector, |d| only in the vector
// that straddles the diagonal. A masked score (-inf) stays -inf.
template <typename T>
inline typename VecOf<T>::type alibi_row_max(T slope, int64_t off, int64_t ncols, T* s) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  V d = V{};
  for (int lane = 0; lane < L; ++lane) d[lane] = T(off + lane);
  const V pos_slope = V{} + slope, neg_slope = V{} - slope;
  V best = V{} - T(__builtin_inf());
  int64_t j = 0;
  auto step = [&](V factor, V dist) {
    const V x = vfma(factor, dist, vload(s + j));
    vstore(s + j, x);
    best = x > best ? x : best;
    d += T(L);
    j += L;
  };
  while (j < ncols && off + j + L - 1 <= 0) step(pos_slope, d);   // every lane d <= 0
  while (j < ncols && off + j < 0) step(neg_slope, vmax(d, -d));  // straddles d = 0
  while (j < ncols) step(neg_slope, d);                           // every lane d >= 0
  return best;
}

// Folds a sink logit into a row's final softmax state (running max *m, sum *l of e^(s - m)
// over the keys it saw): the sink becomes one more term of the sum. *alpha receives the
// factor the row's unnormalised output must be multiplied by (the old terms rescaled to
// the new max). A row that saw no key (m = -inf) ends with m = sink, l = 1, so its lse is
// the sink. A sink of -inf is no sink (the state is left as it is); NaN makes the row NaN.
template <typename T>
inline void fold_sink(T sink, T* m, T* l, T* alpha) {
  *alpha = T(1);
  if (sink == -T(__builtin_inf())) return;
  const T m_old = *m;
  const T m_new = (sink > m_old || sink != sink) ? sink : m_old;
  // 2^-inf = 0 when the row saw no key (then *l is 0 too).
  if (m_new != m_old) *alpha = softmax_exp(m_old, m_new);
  *l = *l * *alpha + softmax_exp(sink, m_new);
  *m = m_new;
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

// fastattn.block_mask's summary: the mask summary of a bool mask (mask_summary-inl.h),
// built once, ahead of the calls that reuse the mask, by the same function a call uses;
// a call handed it (AttnParams::mask_summary) reads it instead of summarising the mask
// again. Per ISA (include only inside a TU that defines FASTATTN_ISA_NS).
#pragma once  // per translation unit

#include <cstdint>

#include "api/params.h"
#include "kernels/mask_summary-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// p describes the mask alone: its batch dims, heads (num_heads_q), len_q, len_k and
// bool_mask (with the strides the mask has; a size-1 axis counts once either way).
int64_t mask_summary_f32(const AttnParams& p, uint64_t* out, int64_t* row_words) {
  MaskSummary sum;
  const StridedView& bm = summary_layout(p, &sum);
  *row_words = sum.row_words;
  if (out && bm.data && p.len_k > 0 && sum.rows > 0) fill_summary<float>(p, bm, sum, out);
  return sum.rows;
}

// Bool masks only: the compute type does not enter.
int64_t mask_summary_f64(const AttnParams& p, uint64_t* out, int64_t* row_words) {
  return mask_summary_f32(p, out, row_words);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

#pragma once

#include "api/array_ref.h"

namespace fastattn {

struct SdpaCall {
  // query/key/value/out: (batch..., H, L, E) with equal batch dims (broadcast views are
  // fine). Masks: (batch..., Hq, Lq, Lk); valid_lens: (batch..., Hq, Lq) int64.
  ArrayRef query, key, value, out, bool_mask, float_mask, valid_lens, lse, weights;
  double scale = 1.0;
  double softcap = 0.0;
  bool causal = false;
  int64_t diag_offset = 0;
  int64_t window_left = -1, window_right = -1;
  int num_threads = 1;
};

// Checks the invariants the Python layer established (cheaply), fills SdpaParams and
// runs the active ISA's kernel. Throws std::invalid_argument on a broken invariant and
// std::bad_alloc when scratch cannot be had. Call without the GIL.
void scaled_dot_product_attention(const SdpaCall& call);

}  // namespace fastattn

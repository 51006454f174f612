// The struct that carries a scaled_dot_product_attention_backward call (and, one sequence at
// a time, a varlen_attention_backward call) to its kernel (see params.h for the conventions).
#pragma once

#include <cstdint>

#include "api/params.h"

namespace fastattn {

// The forward call as it was made (`fwd`: q, k, v, masks, options; fwd.out is the forward's
// output and fwd.lse its log-sum-exp, both read, not written), the output gradient in the
// layout of fwd.out, and the results, C-contiguous in the compute type over the full batch:
// dq (batch..., Hq, Lq, E), dk (batch..., Hkv, Lk, E) and dv (batch..., Hkv, Lk, Ev), the
// key/value gradients summed over each GQA group; delta (batch..., Hq, Lq) receives
// rowsum(grad_out * out), which the caller needs for the sinks' gradient.
struct SdpaBackwardParams {
  SdpaParams fwd;
  StridedView dout;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* delta = nullptr;
  // Rows per head of lse, delta and dq (0: fwd.len_q) and of dk, dv (0: fwd.len_k): a
  // packed varlen call runs one sequence at a time over its share of the packed arrays.
  int64_t q_rows = 0, k_rows = 0;
};

}  // namespace fastattn

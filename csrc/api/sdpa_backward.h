// The entry points of scaled_dot_product_attention_backward and varlen_attention_backward.
#pragma once

#include "api/sdpa.h"
#include "api/varlen.h"

namespace fastattn {

// The forward's call (SdpaCall: `out` is the forward's output and `lse` its log-sum-exp,
// both read), the output gradient (the layout of out) and the results: grad_query,
// grad_key, grad_value and delta, C-contiguous in the compute dtype over the full batch
// (SdpaBackwardParams).
struct SdpaBackwardCall : SdpaCall {
  ArrayRef grad_out, grad_query, grad_key, grad_value, delta;
};

// Checks the invariants the Python layer established (cheaply), fills SdpaBackwardParams
// and runs the active ISA's kernel. Throws std::invalid_argument on a broken invariant and
// std::bad_alloc when scratch cannot be had. Call without the GIL.
void scaled_dot_product_attention_backward(const SdpaBackwardCall& call);

// The packed call as varlen_attention's (VarlenCall's layout: (H, tokens, features) views,
// no batch), with lse (Hq, total_q) C-contiguous, and the backward's arrays of
// SdpaBackwardCall in the same (H, tokens, ...) layout; each sequence is run as one SDPA
// backward over its share of the packed arrays.
struct VarlenBackwardCall : SdpaBackwardCall {
  ArrayRef cu_seqlens_q, cu_seqlens_k;
  bool bottom_right = false;
};
void varlen_attention_backward(const VarlenBackwardCall& call);

}  // namespace fastattn

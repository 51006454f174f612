// The entry point of fastattn.varlen_attention.
#pragma once

#include "api/sdpa.h"

namespace fastattn {

// The packed call as one SDPA without a batch (SdpaCall: query (Hq, total_q, E), key
// (Hkv, total_k, E), value (Hkv, total_k, Ev), out (Hq, total_q, Ev): the token-major
// arrays seen with their first two axes swapped; no masks, lse or weights there), the
// sequence boundaries (int64, 1-D, C-contiguous, N + 1 each), the alignment of each
// sequence's causal/window diagonal, and the optional lse (total_q, Hq), C-contiguous.
struct VarlenCall : SdpaCall {
  ArrayRef cu_seqlens_q, cu_seqlens_k, lse_tokens;
  bool bottom_right = false;
};

// Checks the invariants the Python layer established (cheaply, the boundaries included),
// fills VarlenParams and runs the active ISA's kernel. Throws std::invalid_argument on a
// broken invariant and std::bad_alloc when scratch cannot be had. Call without the GIL.
void varlen_attention(const VarlenCall& call);

}  // namespace fastattn

// The struct that carries a fastattn.varlen_attention call to its kernel (see params.h for
// the conventions).
#pragma once

#include <cstdint>

#include "api/params.h"

namespace fastattn {

// N sequences packed token-major. `packed` is the whole call seen as one SDPA over every
// token, without a batch: q (Hq, total_q, E), k (Hkv, total_k, E), v (Hkv, total_k, Ev),
// out (Hq, total_q, Ev) through their strides (row = token); its len_q/len_k are the
// totals, its lse/weights/masks null. Sequence n is that call on query rows
// [cu_q[n], cu_q[n+1]) and key rows [cu_k[n], cu_k[n+1]) alone, its causal/window
// diagonal at len_k - len_q when bottom_right (else 0).
struct VarlenParams {
  SdpaParams packed;
  int64_t num_seqs = 0;
  const int64_t* cu_q = nullptr;   // num_seqs + 1, non-decreasing, 0 .. total_q
  const int64_t* cu_k = nullptr;   // num_seqs + 1, non-decreasing, 0 .. total_k
  const int64_t* order = nullptr;  // the num_seqs sequences, largest tasks first
  bool bottom_right = false;
  // Optional, C-contiguous in the compute dtype: sequence n's lse (Hq, len_q) at Hq * cu_q[n]
  // (the layout a one-sequence call writes; the entry point transposes it to the tokens').
  void* lse = nullptr;
};

}  // namespace fastattn

// The entry point of scaled_dot_product_attention.
#pragma once

#include "api/attention.h"

namespace fastattn {

// The shared arguments (AttnCall), and the softcap (0 = none).
struct SdpaCall : AttnCall {
  double softcap = 0.0;
  // int8 key/value only: float32 (batch..., Hkv, Lk), one scale per key (SdpaParams).
  ArrayRef key_scale, value_scale;
};

// check_attention plus SDPA's own checks (head dim, softcap, scale) into *p, with its
// thread count for the call's size and the L1 size; `fn` names the entry in messages.
void check_sdpa(const SdpaCall& call, const char* fn, SdpaParams* p);

// Checks the invariants the Python layer established (cheaply), fills SdpaParams and
// runs the active ISA's kernel. Throws std::invalid_argument on a broken invariant and
// std::bad_alloc when scratch cannot be had. Call without the GIL.
void scaled_dot_product_attention(const SdpaCall& call);

// The threads an SDPA-like call of this many multiply-adds runs on: 1 below the size where
// waking a second thread costs more than it saves, else num_threads.
int threads_for_work(double multiply_adds, int num_threads);

}  // namespace fastattn

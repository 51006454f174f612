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

// Checks the invariants the Python layer established (cheaply), fills SdpaParams and
// runs the active ISA's kernel. Throws std::invalid_argument on a broken invariant and
// std::bad_alloc when scratch cannot be had. Call without the GIL.
void scaled_dot_product_attention(const SdpaCall& call);

}  // namespace fastattn

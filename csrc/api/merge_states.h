// The entry point of merge_attention_states (see fastattn/_sdpa.py).
#pragma once

#include <vector>

#include "api/array_ref.h"

namespace fastattn {

// outputs[i]: (rows..., Ev) with a unit-stride last axis; lses[i]: (rows...); all in the
// compute dtype, as many lses as outputs (at least one). out (rows..., Ev) with a
// unit-stride last axis and lse (rows...) are written.
struct MergeStatesCall {
  std::vector<ArrayRef> outputs, lses;
  ArrayRef out, lse;
  int num_threads = 1;
};

// Checks the invariants the Python layer established (cheaply), fills MergeStatesParams and
// runs the active ISA's kernel. Throws std::invalid_argument on a broken invariant and
// std::bad_alloc when scratch cannot be had. Call without the GIL.
void merge_attention_states(const MergeStatesCall& call);

}  // namespace fastattn

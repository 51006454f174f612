// The one C++ entry check of every attention op: the arguments all of them share, checked
// against the invariants the Python layer established (cheaply), into AttnParams; plus
// the small checks the entry points build their own on. Throws std::invalid_argument
// "fastattn._core.<fn>: <what>".
#pragma once

#include <cstdint>
#include <string>

#include "api/array_ref.h"
#include "api/params.h"

namespace fastattn {

// query/key/value/out: (batch..., H, L, D) with equal batch dims (broadcast views are fine).
// Masks: (batch..., Hq, Lq, Lk); valid_lens: (batch..., Hq, Lq) int64; lse (batch..., Hq,
// Lq) and weights (batch..., Hq, Lq, Lk) C-contiguous; sinks and ALiBi slopes (batch...,
// Hq). Absent arrays are not given.
struct AttnCall {
  ArrayRef query, key, value, out, bool_mask, float_mask, valid_lens, lse, weights;
  ArrayRef sinks, alibi;  // (batch..., Hq) in the query's dtype (broadcast views are fine)
  double scale = 1.0;
  bool causal = false;
  int64_t diag_offset = 0;
  int64_t window_left = -1, window_right = -1;
  int num_threads = 1;
};

// Checks c and fills the shared fields of p. `dims_differ`: the message when key and query
// feature sizes differ, or null where they may (additive scores project each separately).
// `storage_ok`: q/k/v/out may be stored as a 16-bit float (p->storage), computed in float32;
// ops whose kernels read only the compute type leave it false.
void check_attention(const AttnCall& c, const char* fn, const char* dims_differ, AttnParams* p,
                     bool storage_ok = false);

// The 16-bit storage type of an array (float16, ml_dtypes' bfloat16), kCompute for any other.
Storage storage_of(const ArrayRef& a);

// Throws std::invalid_argument("fastattn._core." + fn + ": " + what + more) unless ok; the
// message is built only on failure (these checks run on every call).
[[noreturn]] void fail(const char* fn, const char* what, const char* more);
inline void require(bool ok, const char* fn, const char* what, const char* more = "") {
  if (!ok) fail(fn, what, more);
}
bool is_empty(const ArrayRef& a);
bool is_contiguous(const ArrayRef& a);
// The element stride of axis d. An axis of length 0 or 1 is never stepped along, so its
// byte stride may be anything (NumPy leaves odd ones on views); it counts as 0.
int64_t element_stride(const ArrayRef& a, int64_t d, const char* fn, const char* name);

}  // namespace fastattn

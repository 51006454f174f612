// The entry point of scaled_dot_product_attention.
#pragma once

#include <cstdint>
#include <vector>

#include "api/attention.h"

namespace fastattn {

// The shared arguments (AttnCall), and the softcap (0 = none).
struct SdpaCall : AttnCall {
  double softcap = 0.0;
  // int8 key/value only: float32 (batch..., Hkv, Lk), one scale per key (SdpaParams).
  ArrayRef key_scale, value_scale;
  // A summary of bool_mask built ahead (fastattn.block_mask): AttnParams::mask_summary.
  PrebuiltSummary mask_summary;
};

// check_attention plus SDPA's own checks (head dim, softcap, scale) into *p, with its
// thread count for the call's size and the L1 size; `fn` names the entry in messages.
void check_sdpa(const SdpaCall& call, const char* fn, SdpaParams* p);

// Checks the invariants the Python layer established (cheaply), fills SdpaParams and
// runs the active ISA's kernel. Throws std::invalid_argument on a broken invariant and
// std::bad_alloc when scratch cannot be had. Call without the GIL.
void scaled_dot_product_attention(const SdpaCall& call);

// The mask summary (kernels/mask_summary-inl.h) of the C-contiguous bool mask `data` of
// the given shape (..., Lq, Lk), at least 2-D and at most kMaxBatchDims + 3 dims, into
// *words (resized); returns its rows, *row_words the words per row. Call without the GIL.
int64_t summarise_bool_mask(const void* data, const int64_t* shape, int64_t ndim, int num_threads,
                            std::vector<uint64_t>* words, int64_t* row_words);

// The threads an SDPA-like call of this many multiply-adds runs on: 1 below the size where
// waking a second thread costs more than it saves, else num_threads (kAvailableCpus: the
// CPUs available now, api/threads.h), capped.
int threads_for_work(double multiply_adds, int num_threads);

}  // namespace fastattn

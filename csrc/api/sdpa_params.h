// The one plain struct that carries a scaled_dot_product_attention call from the
// Python validation layer to a kernel: pointers, int64 element strides, sizes, flags.
// Python (fastattn/_validate.py) has already checked and normalised everything;
// csrc/api/sdpa.cpp re-checks the cheap invariants before any kernel sees it.
#pragma once

#include <cstdint>

namespace fastattn {

// Leading ("batch") dims are passed unflattened, each with its own stride per tensor,
// so broadcast (stride-0) views are never materialised. NumPy allows 64 dims; three
// of them are (heads, rows, columns), which leaves this many for the batch.
constexpr int kMaxBatchDims = 61;

// One tensor seen through element strides: batch dims, head, row, and column
// (the last axis; 1 for q/k/v/out, possibly 0 for a broadcast mask column).
struct StridedView {
  const void* data = nullptr;
  int64_t batch_stride[kMaxBatchDims] = {};
  int64_t head_stride = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
};

struct SdpaParams {
  // Shapes. Query is (batch..., num_heads_q, len_q, head_dim); key/value share
  // (batch..., num_heads_kv, len_k, .); output is (batch..., num_heads_q, len_q, head_dim_v).
  int64_t batch_ndim = 0;
  int64_t batch_shape[kMaxBatchDims] = {};
  int64_t num_heads_q = 1, num_heads_kv = 1;
  int64_t len_q = 0, len_k = 0, head_dim = 0, head_dim_v = 0;

  StridedView q, k, v;
  StridedView out;         // data is written (const_cast in the kernel)
  StridedView bool_mask;   // uint8 (NumPy bool), 1 = may attend; data null if absent
  StridedView float_mask;  // same dtype as q; added to the scaled scores; null if absent
  StridedView valid_lens;  // int64 per score row (col_stride unused); null if absent

  // Optional outputs, C-contiguous: lse (batch..., Hq, Lq), weights (batch..., Hq, Lq, Lk).
  void* lse = nullptr;
  void* weights = nullptr;

  double scale = 1.0;
  double softcap = 0.0;  // 0 = no softcap

  // Key j is visible to row i iff lo(i) <= j < hi(i) where, with d = i + diag_offset,
  //   causal: j <= d;  window: d - window_left <= j <= d + window_right (-1 = unbounded).
  bool causal = false;
  int64_t diag_offset = 0;  // 0 = top-left alignment, len_k - len_q = bottom-right
  int64_t window_left = -1, window_right = -1;

  int num_threads = 1;
  int64_t l1_bytes = 32 * 1024;  // L1 data cache of this CPU (sizes the key blocks)
};

}  // namespace fastattn

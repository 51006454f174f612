// Plain structs that carry the attention-family calls (masked softmax, additive attention,
// hardmax/top-k attention, Nadaraya-Watson kernel regression, row projection) from the
// Python validation layer to the kernels: pointers, int64 element strides, sizes, flags.
// fastattn/_family.py has checked and normalised everything; csrc/api/family.cpp
// re-checks the cheap invariants before any kernel sees a struct.
#pragma once

#include <cstdint>

#include "api/sdpa_params.h"  // kMaxBatchDims, StridedView

namespace fastattn {

// masked_softmax sees x as rows (every axis but the softmax axis) x len (the softmax axis).
constexpr int kMaxRowDims = 64;

struct RowsView {
  const void* data = nullptr;
  int64_t row_stride[kMaxRowDims] = {};  // per row axis
  int64_t col_stride = 1;                // along the softmax axis (any value, 0 included)
};

struct MaskedSoftmaxParams {
  int64_t row_ndim = 0;
  int64_t row_shape[kMaxRowDims] = {};
  int64_t len = 0;        // entries per row
  RowsView x, out;        // compute dtype; out is written
  RowsView mask;          // uint8 (NumPy bool), 1 = keep; data null if absent
  RowsView valid_lens;    // int64 per row (col_stride unused); data null if absent
  int num_threads = 1;
};

// How a block of scores becomes weights.
enum class Normalizer : int {
  kSoftmax = 0,    // online softmax (additive attention, gaussian kernel regression)
  kSelect = 1,     // hardmax / top-k: softmax over the k largest visible scores
  kKernelSum = 2,  // compact kernel regression: weights K(u), divided by their sum
};

enum class RegressionKernel : int { kGaussian = 0, kBoxcar, kTriangular, kEpanechnikov };

// One attention-family call. Layout as SdpaParams: q (batch..., Hq, Lq, dim_q),
// k (batch..., Hkv, Lk, dim_k), v (batch..., Hkv, Lk, dim_v), out (batch..., Hq, Lq, dim_v),
// masks (batch..., Hq, Lq, Lk), valid_lens (batch..., Hq, Lq); unit-stride last axes for
// q/k/v/out. Scores are formed from q and k by the kernel's score source, then
// s = s + float_mask, and bool mask / valid_lens / causal / window make keys invisible.
struct FamilyParams {
  int64_t batch_ndim = 0;
  int64_t batch_shape[kMaxBatchDims] = {};
  int64_t num_heads_q = 1, num_heads_kv = 1;
  int64_t len_q = 0, len_k = 0, dim_q = 0, dim_k = 0, dim_v = 0;

  StridedView q, k, v, out, bool_mask, float_mask, valid_lens;
  void* weights = nullptr;  // C-contiguous (batch..., Hq, Lq, Lk) or null

  double scale = 1.0;  // dot scores: s = scale * q.k
  bool causal = false;
  int64_t diag_offset = 0;
  int64_t window_left = -1, window_right = -1;

  Normalizer normalizer = Normalizer::kSoftmax;
  int64_t top_k = 1;     // kSelect: keys kept per row (1 <= top_k)
  bool hardmax = false;  // kSelect with top_k == 1: weight exactly 1, no exponential

  // Additive scores: s = w_v . tanh(q @ w_q + k @ w_k); C-contiguous (dim_q, hidden),
  // (dim_k, hidden), (hidden,) in the compute dtype.
  const void* w_q = nullptr;
  const void* w_k = nullptr;
  const void* w_v = nullptr;
  int64_t hidden = 0;

  // Kernel regression: the kernel and one bandwidth per batch entry (batch strides only).
  RegressionKernel kernel = RegressionKernel::kGaussian;
  StridedView bandwidth;

  int num_threads = 1;
};

// out[r, :] = x[r, :] @ w for r < rows: x rows with a row stride and unit column stride,
// w C-contiguous (dim_in, dim_out), out C-contiguous (rows, dim_out).
struct ProjectParams {
  const void* x = nullptr;
  int64_t rows = 0, dim_in = 0, dim_out = 0, x_row_stride = 0;
  const void* w = nullptr;
  void* out = nullptr;
  int num_threads = 1;
};

}  // namespace fastattn

// The plain structs that carry a call from the Python validation layer to a kernel:
// pointers, int64 element strides, sizes, flags. Python (fastattn/_validate.py,
// fastattn/_family.py) has checked and normalised everything; the C++ entry points
// (csrc/api) re-check the cheap invariants before any kernel sees a struct.
#pragma once

#include <cstdint>

namespace fastattn {

// Leading ("batch") dims are passed unflattened, each with its own stride per tensor,
// so broadcast (stride-0) views are never materialised. NumPy allows 64 dims; three
// of them are (heads, rows, columns), which leaves this many for the batch.
constexpr int kMaxBatchDims = 61;

// One tensor seen through element strides: batch dims, head, row, and column
// (the last axis; 1 for q/k/v/out, possibly 0 for a broadcast mask column). Axes of
// length 0 or 1 have stride 0.
struct StridedView {
  const void* data = nullptr;
  int64_t batch_stride[kMaxBatchDims] = {};
  int64_t head_stride = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
};

// The element type of an array when it is not the compute type (float32 or float64 for
// kCompute): a 16-bit float (simd/storage.h) or int8 (a quantised KV cache), computed in
// float32.
enum class Storage : int { kCompute = 0, kF16, kBF16, kI8 };

// What every attention op shares. Query is (batch..., num_heads_q, len_q, dim_q); key
// (batch..., num_heads_kv, len_k, dim_k); value (batch..., num_heads_kv, len_k, dim_v);
// output (batch..., num_heads_q, len_q, dim_v); masks (batch..., Hq, Lq, Lk); valid_lens
// (batch..., Hq, Lq). q/k/v/out have unit-stride last axes. Scores are formed from q and k
// by the op's score, then s = s + float_mask, and bool mask / valid_lens / causal / window
// make keys invisible.
// A bool mask's summary built ahead of the calls that reuse the mask (fastattn.block_mask;
// the layout of kernels/mask_summary-inl.h): rows x row_words words, of the mask whose data
// is `of`, over its len_k keys. The kernel uses it only for that very mask read the same
// way (same data, same row layout, the same keys at unit stride: a mask broadcast along
// the keys is summarised over its one column, not the call's keys), else it summarises
// the mask itself; words null: none.
struct PrebuiltSummary {
  const uint64_t* words = nullptr;
  const void* of = nullptr;
  int64_t rows = 0, row_words = 0, len_k = 0;
};

// Query rows an SDPA task takes at most (kernels/sdpa-inl.h: sdpa_plan, which takes fewer
// when that leaves threads idle; heads of a GQA group share them).
constexpr int64_t kSdpaTaskRows = 512;

struct AttnParams {
  int64_t batch_ndim = 0;
  int64_t batch_shape[kMaxBatchDims] = {};
  int64_t num_heads_q = 1, num_heads_kv = 1;
  int64_t len_q = 0, len_k = 0, dim_q = 0, dim_k = 0, dim_v = 0;

  StridedView q, k, v;
  StridedView out;         // data is written (const_cast in the kernel)
  StridedView bool_mask;   // uint8 (NumPy bool), 1 = may attend; data null if absent
  StridedView float_mask;  // same dtype as q; added to the scores; null if absent
  StridedView valid_lens;  // int64 per score row (col_stride unused); null if absent
  // One value per (batch..., query head) in q's dtype (batch strides and head_stride; null
  // if absent): sinks, a logit joining each row's softmax denominator as a key of value 0
  // (not scaled, capped or masked); alibi, a slope adding -slope * |j - (i + diag_offset)|
  // to the scores (with the float mask).
  StridedView sinks, alibi;
  // The element type of q/k/v/out (kv_storage: of k/v, when int8); masks, lse and weights
  // are in the compute type.
  Storage storage = Storage::kCompute;
  Storage kv_storage = Storage::kCompute;

  // Optional outputs, C-contiguous: lse (batch..., Hq, Lq), weights (batch..., Hq, Lq, Lk).
  void* lse = nullptr;
  void* weights = nullptr;

  double scale = 1.0;  // dot scores: s = scale * q . k

  // Key j is visible to row i iff lo(i) <= j < hi(i) where, with d = i + diag_offset,
  //   causal: j <= d;  window: d - window_left <= j <= d + window_right (-1 = unbounded).
  bool causal = false;
  int64_t diag_offset = 0;  // 0 = top-left alignment, len_k - len_q = bottom-right
  int64_t window_left = -1, window_right = -1;

  int num_threads = 1;

  // A summary of bool_mask built ahead of the call (fastattn.block_mask), or none.
  PrebuiltSummary mask_summary;
};

// scaled_dot_product_attention: dot scores (dim_k == dim_q), optional softcap, online softmax.
struct SdpaParams : AttnParams {
  double softcap = 0.0;          // 0 = no softcap
  int64_t l1_bytes = 32 * 1024;  // L1 data cache of this CPU (sizes the key blocks)
  // int8 k/v (kv_storage kI8): key j stands for key_scale[j] * k[j, :], value likewise.
  // float32, (batch..., Hkv, Lk) with a unit stride along Lk; data null otherwise.
  StridedView key_scale, value_scale;
};

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
  int64_t len = 0;      // entries per row
  RowsView x, out;      // stored as `storage` (out is written); backward: x = the weights
  RowsView grad;        // backward only: the result's gradient, stored as `storage`
  RowsView mask;        // uint8 (NumPy bool), 1 = keep; data null if absent
  RowsView valid_lens;  // int64 per row (col_stride unused); data null if absent
  int num_threads = 1;
  Storage storage = Storage::kCompute;  // x/out as a 16-bit float, computed in float32
};

// How a block of scores becomes weights.
enum class Normalizer : int {
  kSoftmax = 0,    // online softmax (additive attention, gaussian kernel regression)
  kSelect = 1,     // hardmax / top-k: softmax over the k largest visible scores
  kKernelSum = 2,  // compact kernel regression: weights K(u), divided by their sum
};

enum class RegressionKernel : int { kGaussian = 0, kBoxcar, kTriangular, kEpanechnikov };

// An attention-family call (additive attention, hardmax/top-k attention, Nadaraya-Watson
// kernel regression): the shared fields, then the score's and the normaliser's own.
struct FamilyParams : AttnParams {
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
};

// merge_attention_states: num_parts partial results of the same query rows, each an output
// (rows..., dim_v) with a unit-stride last axis and an lse (rows...), seen through row
// strides per row axis; out (rows..., dim_v) and lse (rows...) are written.
struct MergeStatesParams {
  int64_t row_ndim = 0;
  int64_t row_shape[kMaxRowDims] = {};
  int64_t dim_v = 0;
  int64_t num_parts = 0;
  const RowsView* outputs = nullptr;  // num_parts views (col_stride 1)
  const RowsView* lses = nullptr;     // num_parts views (col_stride unused)
  RowsView out, lse;                  // written
  int num_threads = 1;
};

// out[r, :] = x[r, :] @ w for r < rows: x rows with a row stride and unit column stride,
// w C-contiguous (dim_in, dim_out), out C-contiguous (rows, dim_out).
// The tanh chain of additive attention's backward (kernels/additive-inl.h), on contiguous
// arrays prepared by fastattn/_cpu.py: qp (groups, rows, hidden), kp (groups, keys, hidden),
// ds (groups, rows, keys) and its transpose ds_t (groups, keys, rows), w_v (hidden,);
// hidden a multiple of 64 bytes' worth of T (zero-padded). Writes d_qp (groups, rows,
// hidden), d_kp (groups, keys, hidden) and d_wv (groups, rows, hidden): row i's terms of
// the w_v gradient, summed by the caller.
struct AdditiveBackwardParams {
  const void *qp = nullptr, *kp = nullptr, *ds = nullptr, *ds_t = nullptr, *w_v = nullptr;
  void *d_qp = nullptr, *d_kp = nullptr, *d_wv = nullptr;
  int64_t groups = 0, rows = 0, keys = 0, hidden = 0;
  int num_threads = 1;
};

// Nadaraya-Watson's backward (kernels/nadaraya_watson-inl.h) on contiguous arrays prepared
// by fastattn/_cpu.py, G batch entries, Lq queries, Lk keys of D features; "padded" lengths
// are multiples of 64 bytes' worth of T, the padding's coordinates NaN and weights 0.
// Pass 1, one query row each: xq (G, Lq, D), xk_t (G, D, Lk_pad), w and gy (G, Lq, Lk_pad):
// the weights (0 for undefined rows) and grad_out_i . y_j; gf (G, Lq_pad) grad_out_i . f_i.
// Pass 2, one key row each: xk (G, Lk, D), xq_t (G, D, Lq_pad), w_t and gy_t (G, Lk, Lq_pad).
// h (G,) the bandwidths. Writes gxq (G, Lq, D), gxk (G, Lk, D), gh (G, Lq): each query
// row's term of the bandwidth's gradient, and inv_s (G, Lq_pad) (compact kernels: 1 / the
// row's kernel mass, 0 for none; pass 1 writes it, pass 2 reads it).
struct NwBackwardParams {
  const void *xq = nullptr, *xk_t = nullptr, *w = nullptr, *gy = nullptr, *gf = nullptr;
  const void *xk = nullptr, *xq_t = nullptr, *w_t = nullptr, *gy_t = nullptr, *h = nullptr;
  void *gxq = nullptr, *gxk = nullptr, *gh = nullptr, *inv_s = nullptr;
  int64_t groups = 0, len_q = 0, len_k = 0, dim = 0, len_q_pad = 0, len_k_pad = 0;
  RegressionKernel kernel = RegressionKernel::kGaussian;
  int num_threads = 1;
};

struct ProjectParams {
  const void* x = nullptr;
  int64_t rows = 0, dim_in = 0, dim_out = 0, x_row_stride = 0;
  const void* w = nullptr;
  void* out = nullptr;
  int num_threads = 1;
};

}  // namespace fastattn

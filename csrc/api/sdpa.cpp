#include "api/sdpa.h"

#include <new>
#include <stdexcept>
#include <string>

#include "api/errors.h"
#include "api/sdpa_params.h"
#include "dispatch/isa.h"

namespace fastattn {
namespace {

// The message is built only on failure: these checks run on every call.
void require(bool ok, const char* what, const char* more = "") {
  if (!ok) throw std::invalid_argument(std::string("fastattn._core.sdpa: ") + what + more);
}

// Fills a StridedView from an array whose last `tail` axes are (head, row[, col]) after
// `batch_ndim` batch axes; strides become element strides.
StridedView view_of(const ArrayRef& a, const char* name, int64_t batch_ndim, int tail,
                    bool unit_last) {
  StridedView v;
  v.data = a.data;
  require(a.ndim() == batch_ndim + tail,
          name, " has the wrong number of dimensions");
  for (int64_t d = 0; d < a.ndim(); ++d)
    require(a.strides[d] % a.itemsize == 0,
            name, " has a stride that is not a multiple of its item size");
  for (int64_t d = 0; d < batch_ndim; ++d) v.batch_stride[d] = a.strides[d] / a.itemsize;
  v.head_stride = a.strides[batch_ndim] / a.itemsize;
  v.row_stride = a.strides[batch_ndim + 1] / a.itemsize;
  if (tail == 3) {
    v.col_stride = a.strides[batch_ndim + 2] / a.itemsize;
    bool empty = false;  // an empty array's strides mean nothing (NumPy may zero them)
    for (int64_t n : a.shape) empty = empty || n == 0;
    if (unit_last)
      require(v.col_stride == 1 || a.shape[batch_ndim + 2] <= 1 || empty,
              name, " must have a unit-stride last axis");
  }
  return v;
}

bool is_contiguous(const ArrayRef& a) {
  for (int64_t n : a.shape)
    if (n == 0) return true;
  int64_t expected = a.itemsize;
  for (int64_t d = a.ndim() - 1; d >= 0; --d) {
    if (a.shape[d] != 1 && a.strides[d] != expected) return false;
    expected *= a.shape[d];
  }
  return true;
}

}  // namespace

void scaled_dot_product_attention(const SdpaCall& c) {
  require(c.query.kind == 'f' && (c.query.itemsize == 4 || c.query.itemsize == 8),
          "query must be float32 or float64");
  const int64_t itemsize = c.query.itemsize;
  for (const ArrayRef* a : {&c.key, &c.value, &c.out})
    require(a->kind == 'f' && a->itemsize == itemsize, "query/key/value/out dtypes differ");
  require(c.out.writeable, "out must be writeable");
  const int64_t nd = c.query.ndim();
  require(nd >= 3 && nd - 3 <= kMaxBatchDims, "query must have 3 to 64 dimensions");
  const int64_t bn = nd - 3;

  SdpaParams p;
  p.batch_ndim = bn;
  for (int64_t d = 0; d < bn; ++d) {
    p.batch_shape[d] = c.query.shape[d];
    for (const ArrayRef* a : {&c.key, &c.value, &c.out})
      require(a->ndim() == nd && a->shape[d] == c.query.shape[d], "batch dimensions differ");
  }
  p.num_heads_q = c.query.shape[bn];
  p.len_q = c.query.shape[bn + 1];
  p.head_dim = c.query.shape[bn + 2];
  p.num_heads_kv = c.key.shape[bn];
  p.len_k = c.key.shape[bn + 1];
  p.head_dim_v = c.value.shape[bn + 2];
  require(c.key.shape[bn + 2] == p.head_dim, "key and query head dims differ");
  require(c.value.shape[bn] == p.num_heads_kv && c.value.shape[bn + 1] == p.len_k,
          "key and value heads/lengths differ");
  require(p.num_heads_kv > 0 ? p.num_heads_q % p.num_heads_kv == 0 : p.num_heads_q == 0,
          "key heads do not divide query heads");
  require(c.out.shape[bn] == p.num_heads_q && c.out.shape[bn + 1] == p.len_q &&
              c.out.shape[bn + 2] == p.head_dim_v,
          "out has the wrong shape");
  require(p.head_dim > 0, "head dim must be positive");

  p.q = view_of(c.query, "query", bn, 3, true);
  p.k = view_of(c.key, "key", bn, 3, true);
  p.v = view_of(c.value, "value", bn, 3, true);
  p.out = view_of(c.out, "out", bn, 3, true);

  auto check_scores_shape = [&](const ArrayRef& a, const char* name, int tail) {
    for (int64_t d = 0; d < bn; ++d)
      require(a.shape[d] == c.query.shape[d], name, " batch dims differ");
    require(a.shape[bn] == p.num_heads_q && a.shape[bn + 1] == p.len_q &&
                (tail == 2 || a.shape[bn + 2] == p.len_k),
            name, " has the wrong shape");
  };
  if (c.bool_mask.present()) {
    require(c.bool_mask.kind == 'b' && c.bool_mask.itemsize == 1, "bool_mask must be bool");
    p.bool_mask = view_of(c.bool_mask, "bool_mask", bn, 3, false);
    check_scores_shape(c.bool_mask, "bool_mask", 3);
  }
  if (c.float_mask.present()) {
    require(c.float_mask.kind == 'f' && c.float_mask.itemsize == itemsize,
            "float_mask must have the query's dtype");
    p.float_mask = view_of(c.float_mask, "float_mask", bn, 3, false);
    check_scores_shape(c.float_mask, "float_mask", 3);
  }
  if (c.valid_lens.present()) {
    require(c.valid_lens.kind == 'i' && c.valid_lens.itemsize == 8, "valid_lens must be int64");
    p.valid_lens = view_of(c.valid_lens, "valid_lens", bn, 2, false);
    check_scores_shape(c.valid_lens, "valid_lens", 2);
  }
  if (c.lse.present()) {
    require(c.lse.kind == 'f' && c.lse.itemsize == itemsize && c.lse.writeable &&
                c.lse.ndim() == nd - 1 && is_contiguous(c.lse),
            "lse must be a writeable C-contiguous array of the query's dtype");
    check_scores_shape(c.lse, "lse", 2);
    p.lse = c.lse.data;
  }
  if (c.weights.present()) {
    require(c.weights.kind == 'f' && c.weights.itemsize == itemsize && c.weights.writeable &&
                c.weights.ndim() == nd && is_contiguous(c.weights),
            "weights must be a writeable C-contiguous array of the query's dtype");
    check_scores_shape(c.weights, "weights", 3);
    p.weights = c.weights.data;
  }
  require(c.num_threads >= 1, "num_threads must be >= 1");
  require(c.softcap >= 0.0, "softcap must be >= 0 (0 = none)");
  p.scale = c.scale;
  p.softcap = c.softcap;
  p.causal = c.causal;
  p.diag_offset = c.diag_offset;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.num_threads = c.num_threads;
  p.l1_bytes = l1_data_cache_bytes();

  const KernelTable& kernels = active_kernels();
  const bool ok = itemsize == 4 ? kernels.sdpa_forward_f32(p) : kernels.sdpa_forward_f64(p);
  if (!ok) throw ScratchAllocationError("sdpa");
}

}  // namespace fastattn

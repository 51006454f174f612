#include "api/attention.h"

#include <stdexcept>
#include <string>

namespace fastattn {

void fail(const char* fn, const char* what, const char* more) {
  throw std::invalid_argument(std::string("fastattn._core.") + fn + ": " + what + more);
}

bool is_empty(const ArrayRef& a) {
  for (int64_t n : a.shape)
    if (n == 0) return true;
  return false;
}

bool is_contiguous(const ArrayRef& a) {
  if (is_empty(a)) return true;
  int64_t expected = a.itemsize;
  for (int64_t d = a.ndim() - 1; d >= 0; --d) {
    if (a.shape[d] != 1 && a.strides[d] != expected) return false;
    expected *= a.shape[d];
  }
  return true;
}

int64_t element_stride(const ArrayRef& a, int64_t d, const char* fn, const char* name) {
  if (a.shape[d] <= 1 || is_empty(a)) return 0;
  require(a.strides[d] % a.itemsize == 0, fn, name,
          " has a stride that is not a multiple of its item size");
  return a.strides[d] / a.itemsize;
}

namespace {
// A StridedView of an array laid out (batch..., head, row[, col]).
StridedView view_of(const ArrayRef& a, const char* fn, const char* name, int64_t bn, int tail,
                    bool unit_last) {
  require(a.ndim() == bn + tail, fn, name, " has the wrong number of dimensions");
  StridedView v;
  v.data = a.data;
  for (int64_t d = 0; d < bn; ++d) v.batch_stride[d] = element_stride(a, d, fn, name);
  v.head_stride = element_stride(a, bn, fn, name);
  v.row_stride = element_stride(a, bn + 1, fn, name);
  if (tail == 3) {
    v.col_stride = element_stride(a, bn + 2, fn, name);
    if (unit_last)
      require(v.col_stride == 1 || a.shape[bn + 2] <= 1 || is_empty(a), fn, name,
              " must have a unit-stride last axis");
    if (unit_last) v.col_stride = 1;
  }
  return v;
}

}  // namespace

void check_attention(const AttnCall& c, const char* fn, const char* dims_differ, AttnParams* out,
                     bool storage_ok) {
  const Storage storage = storage_ok ? storage_of(c.query) : Storage::kCompute;
  int64_t itemsize = 4;  // of the compute type (masks, lse, weights)
  // int8 key and value (a quantised cache) with a float32 query.
  auto is_int8 = [](const ArrayRef& a) { return a.kind == 'i' && a.itemsize == 1; };
  const bool int8_kv = storage_ok && storage == Storage::kCompute && c.query.kind == 'f' &&
                       c.query.itemsize == 4 && is_int8(c.key) && is_int8(c.value);
  if (int8_kv) {
    require(c.out.kind == 'f' && c.out.itemsize == 4, fn, "query/key/value/out dtypes differ");
  } else if (storage == Storage::kCompute) {
    require(c.query.kind == 'f' && (c.query.itemsize == 4 || c.query.itemsize == 8), fn,
            "query must be float32 or float64");
    itemsize = c.query.itemsize;
    for (const ArrayRef* a : {&c.key, &c.value, &c.out})
      require(a->kind == 'f' && a->itemsize == itemsize, fn, "query/key/value/out dtypes differ");
  } else {
    for (const ArrayRef* a : {&c.key, &c.value, &c.out})
      require(storage_of(*a) == storage, fn, "query/key/value/out dtypes differ");
  }
  require(c.out.writeable, fn, "out must be writeable");
  const int64_t nd = c.query.ndim();
  require(nd >= 3 && nd - 3 <= kMaxBatchDims, fn, "query must have 3 to 64 dimensions");
  const int64_t bn = nd - 3;

  AttnParams& p = *out;
  p.storage = storage;
  p.kv_storage = int8_kv ? Storage::kI8 : storage;
  p.batch_ndim = bn;
  for (int64_t d = 0; d < bn; ++d) {
    p.batch_shape[d] = c.query.shape[d];
    for (const ArrayRef* a : {&c.key, &c.value, &c.out})
      require(a->ndim() == nd && a->shape[d] == c.query.shape[d], fn, "batch dimensions differ");
  }
  for (const ArrayRef* a : {&c.key, &c.value, &c.out})
    require(a->ndim() == nd, fn, "query/key/value/out ranks differ");
  p.num_heads_q = c.query.shape[bn];
  p.len_q = c.query.shape[bn + 1];
  p.dim_q = c.query.shape[bn + 2];
  p.num_heads_kv = c.key.shape[bn];
  p.len_k = c.key.shape[bn + 1];
  p.dim_k = c.key.shape[bn + 2];
  p.dim_v = c.value.shape[bn + 2];
  if (dims_differ) require(p.dim_k == p.dim_q, fn, dims_differ);
  require(c.value.shape[bn] == p.num_heads_kv && c.value.shape[bn + 1] == p.len_k, fn,
          "key and value heads/lengths differ");
  require(p.num_heads_kv > 0 ? p.num_heads_q % p.num_heads_kv == 0 : p.num_heads_q == 0, fn,
          "key heads do not divide query heads");
  require(c.out.shape[bn] == p.num_heads_q && c.out.shape[bn + 1] == p.len_q &&
              c.out.shape[bn + 2] == p.dim_v,
          fn, "out has the wrong shape");

  p.q = view_of(c.query, fn, "query", bn, 3, true);
  p.k = view_of(c.key, fn, "key", bn, 3, true);
  p.v = view_of(c.value, fn, "value", bn, 3, true);
  p.out = view_of(c.out, fn, "out", bn, 3, true);

  auto check_scores_shape = [&](const ArrayRef& a, const char* name, int tail) {
    for (int64_t d = 0; d < bn; ++d)
      require(a.shape[d] == c.query.shape[d], fn, name, " batch dims differ");
    require(a.shape[bn] == p.num_heads_q && a.shape[bn + 1] == p.len_q &&
                (tail == 2 || a.shape[bn + 2] == p.len_k),
            fn, name, " has the wrong shape");
  };
  if (c.bool_mask.present()) {
    require(c.bool_mask.kind == 'b' && c.bool_mask.itemsize == 1, fn, "bool_mask must be bool");
    p.bool_mask = view_of(c.bool_mask, fn, "bool_mask", bn, 3, false);
    check_scores_shape(c.bool_mask, "bool_mask", 3);
  }
  if (c.float_mask.present()) {
    require(c.float_mask.kind == 'f' && c.float_mask.itemsize == itemsize, fn,
            "float_mask must have the query's dtype");
    p.float_mask = view_of(c.float_mask, fn, "float_mask", bn, 3, false);
    check_scores_shape(c.float_mask, "float_mask", 3);
  }
  if (c.valid_lens.present()) {
    require(c.valid_lens.kind == 'i' && c.valid_lens.itemsize == 8, fn, "valid_lens must be int64");
    p.valid_lens = view_of(c.valid_lens, fn, "valid_lens", bn, 2, false);
    check_scores_shape(c.valid_lens, "valid_lens", 2);
  }
  if (c.weights.present()) {
    require(c.weights.kind == 'f' && c.weights.itemsize == itemsize && c.weights.writeable &&
                c.weights.ndim() == nd && is_contiguous(c.weights),
            fn, "weights must be a writeable C-contiguous array of the query's dtype");
    check_scores_shape(c.weights, "weights", 3);
    p.weights = c.weights.data;
  }
  if (c.lse.present()) {
    require(c.lse.kind == 'f' && c.lse.itemsize == itemsize && c.lse.writeable &&
                c.lse.ndim() == nd - 1 && is_contiguous(c.lse),
            fn, "lse must be a writeable C-contiguous array of the query's dtype");
    check_scores_shape(c.lse, "lse", 2);
    p.lse = c.lse.data;
  }
  // Per-head values (sinks, ALiBi slopes): (batch..., Hq) in the query's dtype.
  auto head_values = [&](const ArrayRef& a, const char* name) {
    require(a.kind == 'f' && a.itemsize == itemsize, fn, name, " must have the query's dtype");
    require(a.ndim() == bn + 1, fn, name, " has the wrong number of dimensions");
    for (int64_t d = 0; d < bn; ++d)
      require(a.shape[d] == c.query.shape[d], fn, name, " batch dims differ");
    require(a.shape[bn] == p.num_heads_q, fn, name, " has the wrong shape");
    StridedView v;
    v.data = a.data;
    for (int64_t d = 0; d < bn; ++d) v.batch_stride[d] = element_stride(a, d, fn, name);
    v.head_stride = element_stride(a, bn, fn, name);
    return v;
  };
  if (c.sinks.present()) p.sinks = head_values(c.sinks, "sinks");
  if (c.alibi.present()) p.alibi = head_values(c.alibi, "alibi_slopes");
  require(c.num_threads >= 1, fn, "num_threads must be >= 1");
  require(c.window_left >= -1 && c.window_right >= -1, fn, "window sides must be >= -1");
  p.scale = c.scale;
  p.causal = c.causal;
  p.diag_offset = c.diag_offset;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.num_threads = c.num_threads;
}

Storage storage_of(const ArrayRef& a) {
  if (a.itemsize != 2) return Storage::kCompute;
  if (a.kind == 'f') return Storage::kF16;
  if (a.kind == 'V' && a.code == 'E') return Storage::kBF16;
  return Storage::kCompute;
}

}  // namespace fastattn

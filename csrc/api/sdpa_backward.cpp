#include "api/sdpa_backward.h"

#include <type_traits>
#include <vector>

#include "api/errors.h"
#include "api/sdpa_backward_params.h"
#include "dispatch/isa.h"

namespace fastattn {

namespace {

// A C-contiguous result of the compute type (itemsize) and the given shape.
void* result_array(const ArrayRef& a, const char* fn, const char* name, int64_t itemsize,
                   const std::vector<int64_t>& shape) {
  require(a.present() && a.kind == 'f' && a.itemsize == itemsize && a.writeable && is_contiguous(a),
          fn, name, " must be a writeable C-contiguous array of the compute dtype");
  require(a.shape == shape, fn, name, " has the wrong shape");
  return a.data;
}

// The checked call (forward, gradient and results) into *bp; returns the itemsize of the
// compute type.
int64_t check_backward(const SdpaBackwardCall& c, const char* fn, SdpaBackwardParams* out) {
  SdpaBackwardParams& bp = *out;
  SdpaParams& p = bp.fwd;
  check_sdpa(c, fn, &p);  // out and lse: the forward's, read (checked as written ones are)
  require(p.kv_storage == p.storage, fn, "int8 key/value have no gradient");
  require(p.lse != nullptr, fn, "lse is required");
  require(p.weights == nullptr, fn, "weights are not taken");
  require(p.dim_v > 0, fn, "value head dim must be positive");
  const ArrayRef& g = c.grad_out;
  require(g.present() && g.kind == c.out.kind && g.itemsize == c.out.itemsize &&
              g.code == c.out.code && g.shape == c.out.shape,
          fn, "grad_out must have the shape and dtype of out");
  const int64_t bn = p.batch_ndim;
  for (int64_t d = 0; d < bn; ++d) bp.dout.batch_stride[d] = element_stride(g, d, fn, "grad_out");
  bp.dout.head_stride = element_stride(g, bn, fn, "grad_out");
  bp.dout.row_stride = element_stride(g, bn + 1, fn, "grad_out");
  require(element_stride(g, bn + 2, fn, "grad_out") <= 1, fn,
          "grad_out must have a unit-stride last axis");
  bp.dout.data = g.data;
  const int64_t itemsize = c.query.itemsize == 8 ? 8 : 4;
  std::vector<int64_t> batch(c.query.shape.begin(), c.query.shape.begin() + bn);
  auto shape = [&](std::initializer_list<int64_t> tail) {
    std::vector<int64_t> s = batch;
    s.insert(s.end(), tail);
    return s;
  };
  bp.dq = result_array(c.grad_query, fn, "grad_query", itemsize,
                       shape({p.num_heads_q, p.len_q, p.dim_q}));
  bp.dk =
      result_array(c.grad_key, fn, "grad_key", itemsize, shape({p.num_heads_kv, p.len_k, p.dim_k}));
  bp.dv = result_array(c.grad_value, fn, "grad_value", itemsize,
                       shape({p.num_heads_kv, p.len_k, p.dim_v}));
  bp.delta = result_array(c.delta, fn, "delta", itemsize, shape({p.num_heads_q, p.len_q}));
  return itemsize;
}

bool run_backward(const SdpaBackwardParams& bp, int64_t itemsize) {
  const KernelTable& kernels = active_kernels();
  return itemsize == 8 ? kernels.sdpa_backward_f64(bp) : kernels.sdpa_backward_f32(bp);
}

// Boundaries of one side: int64, 1-D, C-contiguous, 0 first, `total` last, non-decreasing.
const int64_t* check_bounds(const ArrayRef& a, int64_t total, const char* fn, const char* name) {
  require(a.present() && a.kind == 'i' && a.itemsize == 8 && a.ndim() == 1 && is_contiguous(a), fn,
          name, " must be a 1-D C-contiguous int64 array");
  require(a.shape[0] >= 1, fn, name, " must hold at least one boundary");
  const int64_t* c = static_cast<const int64_t*>(a.data);
  const int64_t n = a.shape[0] - 1;
  require(c[0] == 0 && c[n] == total, fn, name, " must start at 0 and end at the token count");
  for (int64_t i = 0; i < n; ++i) require(c[i] <= c[i + 1], fn, name, " must be non-decreasing");
  return c;
}

// `data` moved by `elements` elements of `itemsize` bytes.
template <typename P>
P* advance(P* data, int64_t elements, int64_t itemsize) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(data) + elements * itemsize);
}

}  // namespace

void scaled_dot_product_attention_backward(const SdpaBackwardCall& c) {
  const char* fn = "sdpa_backward";
  SdpaBackwardParams bp;
  const int64_t itemsize = check_backward(c, fn, &bp);
  if (!run_backward(bp, itemsize)) throw ScratchAllocationError(fn);
}

void varlen_attention_backward(const VarlenBackwardCall& c) {
  const char* fn = "varlen_backward";
  require(!c.bool_mask.present() && !c.float_mask.present() && !c.valid_lens.present(), fn,
          "takes no masks or valid_lens in the packed call");
  SdpaBackwardParams packed;
  const int64_t itemsize = check_backward(c, fn, &packed);
  const SdpaParams& p = packed.fwd;
  require(p.batch_ndim == 0, fn, "query must be (Hq, total_q, E) in the packed call");
  const int64_t* cu_q = check_bounds(c.cu_seqlens_q, p.len_q, fn, "cu_seqlens_q");
  const int64_t* cu_k = check_bounds(c.cu_seqlens_k, p.len_k, fn, "cu_seqlens_k");
  require(c.cu_seqlens_q.shape[0] == c.cu_seqlens_k.shape[0], fn,
          "cu_seqlens_q and cu_seqlens_k must have the same length");
  const int64_t storage_size = c.query.itemsize;  // q/k/v/out/grad_out as stored
  // Sequence n: its rows and keys of the packed arrays, its own diagonal and thread count.
  for (int64_t n = 0; n + 1 < c.cu_seqlens_q.shape[0]; ++n) {
    const int64_t q0 = cu_q[n], k0 = cu_k[n], lq = cu_q[n + 1] - q0, lk = cu_k[n + 1] - k0;
    if (lq == 0 && lk == 0) continue;
    SdpaBackwardParams bp = packed;
    SdpaParams& s = bp.fwd;
    s.len_q = lq;
    s.len_k = lk;
    s.diag_offset = c.bottom_right ? lk - lq : 0;
    s.q.data = advance(p.q.data, q0 * p.q.row_stride, storage_size);
    s.out.data = advance(p.out.data, q0 * p.out.row_stride, storage_size);
    s.k.data = advance(p.k.data, k0 * p.k.row_stride, storage_size);
    s.v.data = advance(p.v.data, k0 * p.v.row_stride, storage_size);
    bp.dout.data = advance(packed.dout.data, q0 * packed.dout.row_stride, storage_size);
    s.lse = advance(p.lse, q0, itemsize);
    bp.delta = advance(packed.delta, q0, itemsize);
    bp.dq = advance(packed.dq, q0 * p.dim_q, itemsize);
    bp.dk = advance(packed.dk, k0 * p.dim_q, itemsize);
    bp.dv = advance(packed.dv, k0 * p.dim_v, itemsize);
    bp.q_rows = p.len_q;
    bp.k_rows = p.len_k;
    s.num_threads = threads_for_work(
        2.5 * double(p.num_heads_q) * double(lq) * double(lk) * double(p.dim_q + p.dim_v),
        c.num_threads);
    if (!run_backward(bp, itemsize)) throw ScratchAllocationError(fn);
  }
}

}  // namespace fastattn

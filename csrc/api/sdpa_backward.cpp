#include "api/sdpa_backward.h"

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

}  // namespace

void scaled_dot_product_attention_backward(const SdpaBackwardCall& c) {
  const char* fn = "sdpa_backward";
  SdpaBackwardParams bp;
  SdpaParams& p = bp.fwd;
  check_sdpa(c, fn, &p);  // out and lse: the forward's, read (checked as written ones are)
  require(p.kv_storage == p.storage, fn, "int8 key/value have no gradient");
  require(p.lse != nullptr, fn, "lse is required");
  require(p.weights == nullptr, fn, "weights are not taken");
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
  require(p.dim_v > 0, fn, "value head dim must be positive");
  const KernelTable& kernels = active_kernels();
  const bool ok = itemsize == 8 ? kernels.sdpa_backward_f64(bp) : kernels.sdpa_backward_f32(bp);
  if (!ok) throw ScratchAllocationError(fn);
}

}  // namespace fastattn

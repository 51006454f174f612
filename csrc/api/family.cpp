#include "api/family.h"

#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/errors.h"
#include "api/params.h"
#include "dispatch/isa.h"

namespace fastattn {
namespace {

void require_float(const ArrayRef& a, int64_t itemsize, const char* fn, const char* name) {
  require(a.kind == 'f' && a.itemsize == itemsize, fn, name,
          " must have the compute dtype (float32 or float64)");
}

FamilyParams family_params(const FamilyCall& c, const char* fn, bool same_dims) {
  FamilyParams p;
  // A float16/bfloat16 query (then key, value, out alike) is read as stored and widened in
  // the kernel; only then is storage allowed, so an int8 key stays a dtype error here.
  check_attention(c, fn, same_dims ? "key and query feature sizes differ" : nullptr, &p,
                  /*storage_ok=*/storage_of(c.query) != Storage::kCompute);
  require(!c.alibi.present(), fn, "ALiBi slopes are an option of sdpa only");
  require(!c.lse.present(), fn, "the family kernels write no lse");  // a shared binding argument
  return p;
}

void set_normalizer(FamilyParams& p, const FamilyCall& c, const char* fn) {
  require(c.normalizer == int(Normalizer::kSoftmax) || c.normalizer == int(Normalizer::kSelect), fn,
          "normalizer must be softmax (0) or select (1)");
  p.normalizer = Normalizer(c.normalizer);
  require(!c.sinks.present() || p.normalizer == Normalizer::kSoftmax, fn,
          "sinks need the softmax normalizer");
  require(c.top_k >= 1, fn, "top_k must be >= 1");
  require(!c.hardmax || c.top_k == 1, fn, "hardmax keeps one key (top_k == 1)");
  p.top_k = c.top_k;
  p.hardmax = c.hardmax;
}

}  // namespace

namespace {

// The checked masked-softmax call (forward, or backward with x = the weights and grad)
// into its params.
MaskedSoftmaxParams softmax_params(const MaskedSoftmaxCall& c, const char* fn) {
  // float16/bfloat16 x is read as it is (widened in the kernel) and out written in its type.
  const Storage storage = storage_of(c.x);
  if (storage == Storage::kCompute) {
    require(c.x.kind == 'f' && (c.x.itemsize == 4 || c.x.itemsize == 8), fn,
            "x must be float32 or float64");
    require_float(c.x, c.x.itemsize, fn, "x");
    require_float(c.out, c.x.itemsize, fn, "out");
    if (c.grad.present()) require_float(c.grad, c.x.itemsize, fn, "grad");
  } else {
    require(storage_of(c.out) == storage, fn, "out must have x's dtype");
    require(!c.grad.present() || storage_of(c.grad) == storage, fn, "grad must have x's dtype");
  }
  require(c.out.writeable, fn, "out must be writeable");
  const int64_t nd = c.x.ndim();
  require(nd >= 1 && nd - 1 <= kMaxRowDims, fn, "x must have 1 to 64 dimensions");
  require(c.out.shape == c.x.shape, fn, "out has the wrong shape");
  MaskedSoftmaxParams p;
  p.row_ndim = nd - 1;
  p.len = c.x.shape[nd - 1];
  auto rows_of = [&](const ArrayRef& a, const char* name, bool has_col) {
    RowsView v;
    v.data = a.data;
    for (int64_t d = 0; d < nd - 1; ++d) v.row_stride[d] = element_stride(a, d, fn, name);
    if (has_col) v.col_stride = element_stride(a, nd - 1, fn, name);
    return v;
  };
  for (int64_t d = 0; d < nd - 1; ++d) p.row_shape[d] = c.x.shape[d];
  p.x = rows_of(c.x, "x", true);
  p.out = rows_of(c.out, "out", true);
  if (c.grad.present()) {
    require(c.grad.shape == c.x.shape, fn, "grad has the wrong shape");
    p.grad = rows_of(c.grad, "grad", true);
  }
  if (c.mask.present()) {
    require(c.mask.kind == 'b' && c.mask.itemsize == 1 && c.mask.shape == c.x.shape, fn,
            "mask must be bool with x's shape");
    p.mask = rows_of(c.mask, "mask", true);
  }
  if (c.valid_lens.present()) {
    require(c.valid_lens.kind == 'i' && c.valid_lens.itemsize == 8 && c.valid_lens.ndim() == nd - 1,
            fn, "valid_lens must be int64 with one entry per row");
    for (int64_t d = 0; d < nd - 1; ++d)
      require(c.valid_lens.shape[d] == c.x.shape[d], fn, "valid_lens has the wrong shape");
    p.valid_lens = rows_of(c.valid_lens, "valid_lens", false);
  }
  require(c.num_threads >= 1, fn, "num_threads must be >= 1");
  p.num_threads = c.num_threads;
  p.storage = storage;
  return p;
}

}  // namespace

void masked_softmax(const MaskedSoftmaxCall& c) {
  const char* fn = "masked_softmax";
  require(!c.grad.present(), fn, "takes no grad");
  const MaskedSoftmaxParams p = softmax_params(c, fn);
  const KernelTable& kernels = active_kernels();
  const bool ok = c.x.itemsize == 8 ? kernels.masked_softmax_f64(p) : kernels.masked_softmax_f32(p);
  if (!ok) throw ScratchAllocationError(fn);
}

void masked_softmax_backward(const MaskedSoftmaxCall& c) {
  const char* fn = "masked_softmax_backward";
  require(c.grad.present(), fn, "grad is required");
  const MaskedSoftmaxParams p = softmax_params(c, fn);
  const KernelTable& kernels = active_kernels();
  const bool ok = c.x.itemsize == 8 ? kernels.masked_softmax_backward_f64(p)
                                    : kernels.masked_softmax_backward_f32(p);
  if (!ok) throw ScratchAllocationError(fn);
}

void additive_attention(const FamilyCall& c) {
  const char* fn = "additive";
  FamilyParams p = family_params(c, fn, false);
  set_normalizer(p, c, fn);
  // The projection weights are in the compute dtype (float32 for 16-bit storage).
  const int64_t itemsize = p.storage == Storage::kCompute ? c.query.itemsize : 4;
  for (const ArrayRef* a : {&c.w_q, &c.w_k, &c.w_v}) {
    require(a->present() && a->kind == 'f' && a->itemsize == itemsize && is_contiguous(*a), fn,
            "w_q, w_k, w_v must be C-contiguous arrays of the query's dtype");
  }
  require(c.w_q.ndim() == 2 && c.w_k.ndim() == 2 && c.w_v.ndim() == 1, fn,
          "w_q, w_k must be 2-D and w_v 1-D");
  p.hidden = c.w_v.shape[0];
  require(c.w_q.shape[0] == p.dim_q && c.w_q.shape[1] == p.hidden, fn,
          "w_q must have shape (query features, hidden)");
  require(c.w_k.shape[0] == p.dim_k && c.w_k.shape[1] == p.hidden, fn,
          "w_k must have shape (key features, hidden)");
  p.w_q = c.w_q.data;
  p.w_k = c.w_k.data;
  p.w_v = c.w_v.data;
  const KernelTable& kernels = active_kernels();
  const bool ok =
      itemsize == 8 ? kernels.additive_attention_f64(p) : kernels.additive_attention_f32(p);
  if (!ok) throw ScratchAllocationError(fn);
}

void select_attention(const FamilyCall& c) {
  const char* fn = "select";
  FamilyParams p = family_params(c, fn, true);
  set_normalizer(p, c, fn);
  require(p.normalizer == Normalizer::kSelect, fn, "the select kernel needs normalizer 1");
  const KernelTable& kernels = active_kernels();
  const bool ok =
      c.query.itemsize == 8 ? kernels.select_attention_f64(p) : kernels.select_attention_f32(p);
  if (!ok) throw ScratchAllocationError(fn);
}

void nadaraya_watson(const FamilyCall& c) {
  const char* fn = "nadaraya_watson";
  FamilyParams p = family_params(c, fn, true);
  // The shared binding arguments it has no use for (its compact kernels take no masks).
  require(!c.bool_mask.present() && !c.float_mask.present() && !c.valid_lens.present() &&
              !c.sinks.present() && !c.causal && c.window_left < 0 && c.window_right < 0,
          fn, "takes no masks, valid_lens, sinks, causal or window");
  require(c.kernel >= 0 && c.kernel <= int(RegressionKernel::kEpanechnikov), fn,
          "kernel must be 0..3");
  p.kernel = RegressionKernel(c.kernel);
  p.normalizer =
      p.kernel == RegressionKernel::kGaussian ? Normalizer::kSoftmax : Normalizer::kKernelSum;
  const int64_t bn = p.batch_ndim;
  require(c.bandwidth.present() && c.bandwidth.kind == 'f' && c.bandwidth.itemsize == 8 &&
              c.bandwidth.ndim() == bn,
          fn, "bandwidth must be a float64 array of the batch shape");
  for (int64_t d = 0; d < bn; ++d) {
    require(c.bandwidth.shape[d] == p.batch_shape[d], fn, "bandwidth has the wrong shape");
    p.bandwidth.batch_stride[d] = element_stride(c.bandwidth, d, fn, "bandwidth");
  }
  p.bandwidth.data = c.bandwidth.data;
  const KernelTable& kernels = active_kernels();
  const bool ok =
      c.query.itemsize == 8 ? kernels.nadaraya_watson_f64(p) : kernels.nadaraya_watson_f32(p);
  if (!ok) throw ScratchAllocationError(fn);
}

void additive_backward(const AdditiveBackwardCall& c) {
  const char* fn = "additive_backward";
  const int64_t itemsize = c.qp.itemsize;
  require(itemsize == 4 || itemsize == 8, fn, "qp must be float32 or float64");
  for (const ArrayRef* a : {&c.qp, &c.kp, &c.ds, &c.ds_t, &c.w_v, &c.d_qp, &c.d_kp, &c.d_wv}) {
    require(a->present() && a->kind == 'f' && a->itemsize == itemsize && is_contiguous(*a), fn,
            "every array must be C-contiguous, of qp's dtype");
  }
  for (const ArrayRef* a : {&c.d_qp, &c.d_kp, &c.d_wv})
    require(a->writeable, fn, "d_qp, d_kp, d_wv must be writeable");
  require(c.qp.ndim() == 3 && c.kp.ndim() == 3 && c.ds.ndim() == 3 && c.w_v.ndim() == 1, fn,
          "qp, kp, ds must be 3-D and w_v 1-D");
  const int64_t G = c.qp.shape[0], R = c.qp.shape[1], H = c.qp.shape[2], K = c.kp.shape[1];
  const std::vector<int64_t> qshape{G, R, H}, kshape{G, K, H}, sshape{G, R, K}, tshape{G, K, R};
  require(c.kp.shape == kshape && c.d_kp.shape == kshape && c.d_qp.shape == qshape &&
              c.d_wv.shape == qshape && c.ds.shape == sshape && c.ds_t.shape == tshape &&
              c.w_v.shape[0] == H,
          fn, "shapes disagree");
  require((H * itemsize) % 64 == 0, fn, "hidden must be padded to 64 bytes");
  require(c.num_threads >= 1, fn, "num_threads must be >= 1");
  AdditiveBackwardParams p;
  p.qp = c.qp.data;
  p.kp = c.kp.data;
  p.ds = c.ds.data;
  p.ds_t = c.ds_t.data;
  p.w_v = c.w_v.data;
  p.d_qp = c.d_qp.data;
  p.d_kp = c.d_kp.data;
  p.d_wv = c.d_wv.data;
  p.groups = G;
  p.rows = R;
  p.keys = K;
  p.hidden = H;
  p.num_threads = c.num_threads;
  const KernelTable& kernels = active_kernels();
  const bool ok =
      itemsize == 4 ? kernels.additive_backward_f32(p) : kernels.additive_backward_f64(p);
  if (!ok) throw ScratchAllocationError(fn);
}

void nadaraya_watson_backward(const NwBackwardCall& c) {
  const char* fn = "nadaraya_watson_backward";
  const int64_t itemsize = c.xq.itemsize;
  require(itemsize == 4 || itemsize == 8, fn, "xq must be float32 or float64");
  for (const ArrayRef* a : {&c.xq, &c.xk_t, &c.w, &c.gy, &c.gf, &c.xk, &c.xq_t, &c.w_t, &c.gy_t,
                            &c.h, &c.gxq, &c.gxk, &c.gh, &c.inv_s}) {
    require(a->present() && a->kind == 'f' && a->itemsize == itemsize && is_contiguous(*a), fn,
            "every array must be C-contiguous, of xq's dtype");
  }
  for (const ArrayRef* a : {&c.gxq, &c.gxk, &c.gh, &c.inv_s})
    require(a->writeable, fn, "gxq, gxk, gh, inv_s must be writeable");
  require(c.xq.ndim() == 3 && c.xk.ndim() == 3 && c.xq_t.ndim() == 3, fn,
          "xq, xk, xq_t must be 3-D");
  const int64_t G = c.xq.shape[0], Lq = c.xq.shape[1], D = c.xq.shape[2], Lk = c.xk.shape[1];
  const int64_t Lqp = c.xq_t.shape[2], Lkp = c.xk_t.ndim() == 3 ? c.xk_t.shape[2] : -1;
  using S = std::vector<int64_t>;
  require(c.xk.shape == S{G, Lk, D} && c.xk_t.shape == S{G, D, Lkp} &&
              c.xq_t.shape == S{G, D, Lqp} && c.w.shape == S{G, Lq, Lkp} &&
              c.gy.shape == S{G, Lq, Lkp} && c.w_t.shape == S{G, Lk, Lqp} &&
              c.gy_t.shape == S{G, Lk, Lqp} && c.gf.shape == S{G, Lqp} &&
              c.inv_s.shape == S{G, Lqp} && c.h.shape == S{G} && c.gxq.shape == S{G, Lq, D} &&
              c.gxk.shape == S{G, Lk, D} && c.gh.shape == S{G, Lq},
          fn, "shapes disagree");
  require(Lqp >= Lq && Lkp >= Lk && (Lqp * itemsize) % 64 == 0 && (Lkp * itemsize) % 64 == 0, fn,
          "the padded lengths must cover the rows in whole multiples of 64 bytes");
  require(c.kernel >= 0 && c.kernel <= int(RegressionKernel::kEpanechnikov), fn,
          "kernel must be 0..3");
  require(c.num_threads >= 1, fn, "num_threads must be >= 1");
  NwBackwardParams p;
  p.xq = c.xq.data;
  p.xk_t = c.xk_t.data;
  p.w = c.w.data;
  p.gy = c.gy.data;
  p.gf = c.gf.data;
  p.xk = c.xk.data;
  p.xq_t = c.xq_t.data;
  p.w_t = c.w_t.data;
  p.gy_t = c.gy_t.data;
  p.h = c.h.data;
  p.gxq = c.gxq.data;
  p.gxk = c.gxk.data;
  p.gh = c.gh.data;
  p.inv_s = c.inv_s.data;
  p.groups = G;
  p.len_q = Lq;
  p.len_k = Lk;
  p.dim = D;
  p.len_q_pad = Lqp;
  p.len_k_pad = Lkp;
  p.kernel = RegressionKernel(c.kernel);
  p.num_threads = c.num_threads;
  const KernelTable& kernels = active_kernels();
  const bool ok = itemsize == 4 ? kernels.nadaraya_watson_backward_f32(p)
                                : kernels.nadaraya_watson_backward_f64(p);
  if (!ok) throw ScratchAllocationError(fn);
}

void project(const ProjectCall& c) {
  const char* fn = "project";
  require(c.x.kind == 'f' && (c.x.itemsize == 4 || c.x.itemsize == 8) && c.x.ndim() == 2, fn,
          "x must be a 2-D float32 or float64 array");
  const int64_t itemsize = c.x.itemsize;
  require_float(c.w, itemsize, fn, "w");
  require_float(c.out, itemsize, fn, "out");
  require(c.w.ndim() == 2 && is_contiguous(c.w), fn, "w must be C-contiguous 2-D");
  require(c.out.ndim() == 2 && is_contiguous(c.out) && c.out.writeable, fn,
          "out must be writeable C-contiguous 2-D");
  require(c.w.shape[0] == c.x.shape[1] && c.out.shape[0] == c.x.shape[0] &&
              c.out.shape[1] == c.w.shape[1],
          fn, "shapes do not chain: out (rows, n) = x (rows, m) @ w (m, n)");
  require(element_stride(c.x, 1, fn, "x") == 1 || c.x.shape[1] <= 1 || is_empty(c.x), fn,
          "x must have a unit-stride last axis");
  require(c.num_threads >= 1, fn, "num_threads must be >= 1");
  ProjectParams p;
  p.x = c.x.data;
  p.rows = c.x.shape[0];
  p.dim_in = c.x.shape[1];
  p.dim_out = c.w.shape[1];
  p.x_row_stride = element_stride(c.x, 0, fn, "x");
  p.w = c.w.data;
  p.out = c.out.data;
  p.num_threads = c.num_threads;
  const KernelTable& kernels = active_kernels();
  const bool ok = itemsize == 4 ? kernels.project_f32(p) : kernels.project_f64(p);
  if (!ok) throw ScratchAllocationError(fn);
}

}  // namespace fastattn

// Entry points of the attention family: masked softmax, additive attention, hardmax/top-k
// attention, Nadaraya-Watson kernel regression, and the row projection used by the
// "general" score. Each checks the invariants the Python layer established (cheaply),
// fills its params struct and runs the active ISA's kernel. Throws std::invalid_argument
// on a broken invariant and std::bad_alloc when scratch cannot be had. Call without the GIL.
#pragma once

#include <cstdint>

#include "api/array_ref.h"
#include "api/attention.h"

namespace fastattn {

// x/out: (rows..., len) with the softmax axis last (any strides); mask: bool of the same
// shape (broadcast views fine); valid_lens: int64 (rows...). The backward takes the
// forward's result as x and the gradient of that result as grad (x's shape and dtype),
// and writes the gradient of the forward's x to out.
struct MaskedSoftmaxCall {
  ArrayRef x, out, mask, valid_lens, grad;
  int num_threads = 1;
};
void masked_softmax(const MaskedSoftmaxCall& call);
void masked_softmax_backward(const MaskedSoftmaxCall& call);

// The shared arguments (AttnCall; no lse), then the score's and the normaliser's own.
// Additive: w_q (Dq, hidden), w_k (Dk, hidden), w_v (hidden,), C-contiguous. Kernel
// regression: bandwidth float64 (batch...).
struct FamilyCall : AttnCall {
  ArrayRef w_q, w_k, w_v, bandwidth;
  int normalizer = 0;  // Normalizer in api/params.h
  int64_t top_k = 1;
  bool hardmax = false;
  int kernel = 0;  // RegressionKernel in api/params.h
};
void additive_attention(const FamilyCall& call);
void select_attention(const FamilyCall& call);
void nadaraya_watson(const FamilyCall& call);

// The tanh chain of additive attention's backward (AdditiveBackwardParams in api/params.h):
// C-contiguous float32/float64 arrays of one dtype.
struct AdditiveBackwardCall {
  ArrayRef qp, kp, ds, ds_t, w_v, d_qp, d_kp, d_wv;
  int num_threads = 1;
};
void additive_backward(const AdditiveBackwardCall& call);

// Nadaraya-Watson's backward (NwBackwardParams in api/params.h): C-contiguous float32/float64
// arrays of one dtype; kernel as RegressionKernel.
struct NwBackwardCall {
  ArrayRef xq, xk_t, w, gy, gf, xk, xq_t, w_t, gy_t, h, gxq, gxk, gh, inv_s;
  int kernel = 0;
  int num_threads = 1;
};
void nadaraya_watson_backward(const NwBackwardCall& call);

// out (rows, dim_out) = x (rows, dim_in) @ w (dim_in, dim_out); x with unit column stride.
struct ProjectCall {
  ArrayRef x, w, out;
  int num_threads = 1;
};
void project(const ProjectCall& call);

}  // namespace fastattn

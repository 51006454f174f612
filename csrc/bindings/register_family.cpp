// The attention family: masked softmax, additive attention, hardmax/top-k attention,
// Nadaraya-Watson kernel regression and the row projection (see fastattn/_family.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "api/family.h"
#include "bindings/array_ref.h"
#include "bindings/attention_args.h"
#include "bindings/interruptible.h"

namespace py = pybind11;

namespace fastattn {

void register_family(py::module_& m) {
  // masked_softmax and its backward: one call struct, the arrays as the caller names them.
  auto softmax_call = [](void (*entry)(const MaskedSoftmaxCall&), const py::object& x,
                         const py::object& grad, const py::object& out, const py::object& mask,
                         const py::object& valid_lens, int num_threads) {
    MaskedSoftmaxCall call;
    call.x = array_ref(x, "x");
    call.grad = array_ref(grad, "grad");
    call.out = array_ref(out, "out");
    call.mask = array_ref(mask, "mask");
    call.valid_lens = array_ref(valid_lens, "valid_lens");
    call.num_threads = num_threads;
    Interruptible ctrl_c;  // Ctrl-C between the kernel's row chunks
    {
      // The arrays stay referenced by the caller's frame while the GIL is released.
      py::gil_scoped_release release;
      entry(call);
    }
    ctrl_c.check();
  };
  m.def(
      "masked_softmax",
      [softmax_call](const py::object& x, const py::object& out, const py::object& mask,
                     const py::object& valid_lens, int num_threads) {
        softmax_call(masked_softmax, x, py::none(), out, mask, valid_lens, num_threads);
      },
      py::arg("x"), py::arg("out"), py::arg("mask"), py::arg("valid_lens"), py::arg("num_threads"),
      "Softmax over the last axis of validated arrays (see fastattn/_family.py).");
  m.def(
      "masked_softmax_backward",
      [softmax_call](const py::object& weights, const py::object& grad, const py::object& out,
                     const py::object& mask, const py::object& valid_lens, int num_threads) {
        softmax_call(masked_softmax_backward, weights, grad, out, mask, valid_lens, num_threads);
      },
      py::arg("weights"), py::arg("grad"), py::arg("out"), py::arg("mask"), py::arg("valid_lens"),
      py::arg("num_threads"),
      "The gradient of masked_softmax's x from its result (weights) and that result's "
      "gradient, over the last axis of validated arrays (see fastattn/_family_grad.py).");

  // The shared keyword arguments (query ... num_threads) are attention_args.h's.
  def_attention(
      m, "additive",
      [](FamilyCall& call, const py::object& w_q, const py::object& w_k, const py::object& w_v,
         int normalizer, int64_t top_k, bool hardmax) {
        call.w_q = array_ref(w_q, "w_q");
        call.w_k = array_ref(w_k, "w_k");
        call.w_v = array_ref(w_v, "w_v");
        call.normalizer = normalizer;
        call.top_k = top_k;
        call.hardmax = hardmax;
        py::gil_scoped_release release;
        additive_attention(call);
      },
      "Blocked additive attention on validated, broadcast arrays.", py::arg("w_q"), py::arg("w_k"),
      py::arg("w_v"), py::arg("normalizer"), py::arg("top_k"), py::arg("hardmax"));

  def_attention(
      m, "select",
      [](FamilyCall& call, int64_t top_k, bool hardmax) {
        call.normalizer = 1;
        call.top_k = top_k;
        call.hardmax = hardmax;
        py::gil_scoped_release release;
        select_attention(call);
      },
      "Blocked hardmax/top-k attention over dot-product scores.", py::arg("top_k"),
      py::arg("hardmax"));

  // query/key/value: x_query, x_keys, y_values as (batch..., 1, L, D) views.
  def_attention(
      m, "nadaraya_watson",
      [](FamilyCall& call, const py::object& bandwidth, int kernel) {
        call.bandwidth = array_ref(bandwidth, "bandwidth");
        call.kernel = kernel;
        py::gil_scoped_release release;
        nadaraya_watson(call);
      },
      "Blocked Nadaraya-Watson kernel regression.", py::arg("bandwidth"), py::arg("kernel"));

  m.def(
      "additive_backward",
      [](const py::object& qp, const py::object& kp, const py::object& ds, const py::object& ds_t,
         const py::object& w_v, const py::object& d_qp, const py::object& d_kp,
         const py::object& d_wv, int num_threads) {
        AdditiveBackwardCall call;
        call.qp = array_ref(qp, "qp");
        call.kp = array_ref(kp, "kp");
        call.ds = array_ref(ds, "ds");
        call.ds_t = array_ref(ds_t, "ds_t");
        call.w_v = array_ref(w_v, "w_v");
        call.d_qp = array_ref(d_qp, "d_qp");
        call.d_kp = array_ref(d_kp, "d_kp");
        call.d_wv = array_ref(d_wv, "d_wv");
        call.num_threads = num_threads;
        py::gil_scoped_release release;
        additive_backward(call);
      },
      py::arg("qp"), py::arg("kp"), py::arg("ds"), py::arg("ds_t"), py::arg("w_v"), py::arg("d_qp"),
      py::arg("d_kp"), py::arg("d_wv"), py::arg("num_threads"),
      "The tanh chain of additive attention's backward (see fastattn/_cpu.py).");

  m.def(
      "nadaraya_watson_backward",
      [](const py::kwargs& kw) {
        NwBackwardCall call;
        call.xq = array_ref(kw["xq"], "xq");
        call.xk_t = array_ref(kw["xk_t"], "xk_t");
        call.w = array_ref(kw["w"], "w");
        call.gy = array_ref(kw["gy"], "gy");
        call.gf = array_ref(kw["gf"], "gf");
        call.xk = array_ref(kw["xk"], "xk");
        call.xq_t = array_ref(kw["xq_t"], "xq_t");
        call.w_t = array_ref(kw["w_t"], "w_t");
        call.gy_t = array_ref(kw["gy_t"], "gy_t");
        call.h = array_ref(kw["h"], "h");
        call.gxq = array_ref(kw["gxq"], "gxq");
        call.gxk = array_ref(kw["gxk"], "gxk");
        call.gh = array_ref(kw["gh"], "gh");
        call.inv_s = array_ref(kw["inv_s"], "inv_s");
        call.kernel = kw["kernel"].cast<int>();
        call.num_threads = kw["num_threads"].cast<int>();
        py::gil_scoped_release release;
        nadaraya_watson_backward(call);
      },
      "Nadaraya-Watson's backward on prepared arrays (see fastattn/_cpu.py); keywords only.");

  m.def(
      "project",
      [](const py::object& x, const py::object& w, const py::object& out, int num_threads) {
        ProjectCall call;
        call.x = array_ref(x, "x");
        call.w = array_ref(w, "w");
        call.out = array_ref(out, "out");
        call.num_threads = num_threads;
        py::gil_scoped_release release;
        project(call);
      },
      py::arg("x"), py::arg("w"), py::arg("out"), py::arg("num_threads"),
      "out = x @ w, rows split across threads (bit-identical for any thread count).");
}

}  // namespace fastattn

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "api/sdpa_backward.h"
#include "bindings/array_ref.h"
#include "bindings/attention_args.h"
#include "bindings/mask_summary.h"

namespace py = pybind11;

namespace fastattn {

void register_grad(py::module_& m) {
  // The shared keyword arguments (query ... num_threads) are attention_args.h's: `out` and
  // `lse` are the forward's output and log-sum-exp, read here (never written).
  def_attention(
      m, "sdpa_backward",
      [](SdpaBackwardCall& call, const py::object& grad_out, const py::object& grad_query,
         const py::object& grad_key, const py::object& grad_value, const py::object& delta,
         double softcap, const py::object& mask_summary) {
        call.out.writeable = call.lse.writeable = true;      // read only: no write check
        call.mask_summary = prebuilt_summary(mask_summary);  // a BlockMask's, as in sdpa
        call.grad_out = array_ref(grad_out, "grad_out");
        call.grad_query = array_ref(grad_query, "grad_query");
        call.grad_key = array_ref(grad_key, "grad_key");
        call.grad_value = array_ref(grad_value, "grad_value");
        call.delta = array_ref(delta, "delta");
        call.softcap = softcap;
        py::gil_scoped_release release;
        scaled_dot_product_attention_backward(call);
      },
      "Gradients of blocked attention on validated, broadcast arrays (see fastattn/_grad.py).",
      py::arg("grad_out"), py::arg("grad_query"), py::arg("grad_key"), py::arg("grad_value"),
      py::arg("delta"), py::arg("softcap") = 0.0, py::arg("mask_summary") = py::none());
  // The packed call of varlen_attention_backward: (H, tokens, features) views as
  // sdpa_varlen's, lse and delta (Hq, total_q), alibi_slopes (Hq,); diag_offset unused.
  def_attention(
      m, "sdpa_varlen_backward",
      [](VarlenBackwardCall& call, const py::object& grad_out, const py::object& grad_query,
         const py::object& grad_key, const py::object& grad_value, const py::object& delta,
         const py::object& cu_seqlens_q, const py::object& cu_seqlens_k, double softcap,
         bool bottom_right) {
        call.out.writeable = call.lse.writeable = true;  // read only: no write check
        call.grad_out = array_ref(grad_out, "grad_out");
        call.grad_query = array_ref(grad_query, "grad_query");
        call.grad_key = array_ref(grad_key, "grad_key");
        call.grad_value = array_ref(grad_value, "grad_value");
        call.delta = array_ref(delta, "delta");
        call.cu_seqlens_q = array_ref(cu_seqlens_q, "cu_seqlens_q");
        call.cu_seqlens_k = array_ref(cu_seqlens_k, "cu_seqlens_k");
        call.softcap = softcap;
        call.bottom_right = bottom_right;
        py::gil_scoped_release release;
        varlen_attention_backward(call);
      },
      "Gradients of packed variable-length attention on validated (H, tokens, features) "
      "views (see fastattn/_grad.py).",
      py::arg("grad_out"), py::arg("grad_query"), py::arg("grad_key"), py::arg("grad_value"),
      py::arg("delta"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("softcap") = 0.0,
      py::arg("bottom_right") = false);
}

}  // namespace fastattn

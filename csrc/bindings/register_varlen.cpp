#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "api/varlen.h"
#include "bindings/array_ref.h"
#include "bindings/attention_args.h"

namespace py = pybind11;

namespace fastattn {

void register_varlen(py::module_& m) {
  // The shared keyword arguments (query ... num_threads) are attention_args.h's; out is the
  // (H, tokens, E) view, sinks and alibi_slopes one value per query head, (Hq,) (the packed
  // call has no batch dims), diag_offset unused (bottom_right says where each sequence's
  // diagonal is).
  def_attention(
      m, "sdpa_varlen",
      [](VarlenCall& call, const py::object& cu_seqlens_q, const py::object& cu_seqlens_k,
         const py::object& lse_tokens, double softcap, bool bottom_right) {
        call.cu_seqlens_q = array_ref(cu_seqlens_q, "cu_seqlens_q");
        call.cu_seqlens_k = array_ref(cu_seqlens_k, "cu_seqlens_k");
        call.lse_tokens = array_ref(lse_tokens, "lse");
        call.softcap = softcap;
        call.bottom_right = bottom_right;
        py::gil_scoped_release release;
        varlen_attention(call);
      },
      "Packed variable-length attention on validated arrays, (H, tokens, E) views (see "
      "fastattn/_varlen.py).",
      py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("lse_tokens") = py::none(),
      py::arg("softcap") = 0.0, py::arg("bottom_right") = false);
}

}  // namespace fastattn

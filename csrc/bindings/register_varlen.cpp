#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "api/varlen.h"
#include "bindings/array_ref.h"

namespace py = pybind11;

namespace fastattn {

void register_varlen(py::module_& m) {
  m.def(
      "sdpa_varlen",
      [](const py::object& query, const py::object& key, const py::object& value,
         const py::object& out, const py::object& cu_seqlens_q, const py::object& cu_seqlens_k,
         const py::object& lse, double scale, double softcap, bool causal, bool bottom_right,
         int64_t window_left, int64_t window_right, int num_threads, const py::object& sinks,
         const py::object& alibi_slopes) {
        VarlenCall call;
        call.query = array_ref(query, "query");
        call.key = array_ref(key, "key");
        call.value = array_ref(value, "value");
        call.out = array_ref(out, "out");
        call.cu_seqlens_q = array_ref(cu_seqlens_q, "cu_seqlens_q");
        call.cu_seqlens_k = array_ref(cu_seqlens_k, "cu_seqlens_k");
        call.lse_tokens = array_ref(lse, "lse");
        call.scale = scale;
        call.softcap = softcap;
        call.causal = causal;
        call.bottom_right = bottom_right;
        call.window_left = window_left;
        call.window_right = window_right;
        call.num_threads = num_threads;
        // One value per query head, (Hq,): the packed call has no batch dims.
        call.sinks = array_ref(sinks, "sinks");
        call.alibi = array_ref(alibi_slopes, "alibi_slopes");
        // The arrays stay referenced by the caller's frame while the GIL is released.
        py::gil_scoped_release release;
        varlen_attention(call);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"), py::arg("cu_seqlens_q"),
      py::arg("cu_seqlens_k"), py::arg("lse"), py::arg("scale"), py::arg("softcap"),
      py::arg("causal"), py::arg("bottom_right"), py::arg("window_left"), py::arg("window_right"),
      py::arg("num_threads"), py::arg("sinks") = py::none(), py::arg("alibi_slopes") = py::none(),
      "Packed variable-length attention on validated arrays, (H, tokens, E) views (see "
      "fastattn/_varlen.py).");
}

}  // namespace fastattn

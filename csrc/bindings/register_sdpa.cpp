#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "api/merge_states.h"
#include "api/sdpa.h"
#include "bindings/array_ref.h"

namespace py = pybind11;

namespace fastattn {

void register_sdpa(py::module_& m) {
  m.def(
      "sdpa",
      [](const py::object& query, const py::object& key, const py::object& value,
         const py::object& out, const py::object& bool_mask, const py::object& float_mask,
         const py::object& valid_lens, const py::object& lse, const py::object& weights,
         double scale, double softcap, bool causal, int64_t diag_offset, int64_t window_left,
         int64_t window_right, int num_threads) {
        SdpaCall call;
        call.query = array_ref(query, "query");
        call.key = array_ref(key, "key");
        call.value = array_ref(value, "value");
        call.out = array_ref(out, "out");
        call.bool_mask = array_ref(bool_mask, "bool_mask");
        call.float_mask = array_ref(float_mask, "float_mask");
        call.valid_lens = array_ref(valid_lens, "valid_lens");
        call.lse = array_ref(lse, "lse");
        call.weights = array_ref(weights, "weights");
        call.scale = scale;
        call.softcap = softcap;
        call.causal = causal;
        call.diag_offset = diag_offset;
        call.window_left = window_left;
        call.window_right = window_right;
        call.num_threads = num_threads;
        // The arrays stay referenced by the caller's frame while the GIL is released.
        py::gil_scoped_release release;
        scaled_dot_product_attention(call);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"), py::arg("bool_mask"),
      py::arg("float_mask"), py::arg("valid_lens"), py::arg("lse"), py::arg("weights"),
      py::arg("scale"), py::arg("softcap"), py::arg("causal"), py::arg("diag_offset"),
      py::arg("window_left"), py::arg("window_right"), py::arg("num_threads"),
      "Blocked attention on validated, broadcast arrays (see fastattn/_sdpa.py).");

  m.def(
      "merge_states",
      [](const py::sequence& outputs, const py::sequence& lses, const py::object& out,
         const py::object& lse, int num_threads) {
        MergeStatesCall call;
        for (const py::handle& a : outputs)
          call.outputs.push_back(array_ref(py::reinterpret_borrow<py::object>(a), "outputs[i]"));
        for (const py::handle& a : lses)
          call.lses.push_back(array_ref(py::reinterpret_borrow<py::object>(a), "lses[i]"));
        call.out = array_ref(out, "out");
        call.lse = array_ref(lse, "lse");
        call.num_threads = num_threads;
        // The sequences (and so the arrays) stay referenced by the caller's frame.
        py::gil_scoped_release release;
        merge_attention_states(call);
      },
      py::arg("outputs"), py::arg("lses"), py::arg("out"), py::arg("lse"), py::arg("num_threads"),
      "Merges partial attention states by log-sum-exp (see fastattn/_sdpa.py).");
}

}  // namespace fastattn

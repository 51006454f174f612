// The attention family: masked softmax, additive attention, hardmax/top-k attention,
// Nadaraya-Watson kernel regression and the row projection (see fastattn/_family.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "api/family.h"
#include "bindings/array_ref.h"

namespace py = pybind11;

namespace fastattn {

namespace {

// The arguments every attention-family kernel takes, in one order.
FamilyCall family_call(const py::object& query, const py::object& key, const py::object& value,
                       const py::object& out, const py::object& bool_mask,
                       const py::object& float_mask, const py::object& valid_lens,
                       const py::object& weights, bool causal, int64_t diag_offset,
                       int64_t window_left, int64_t window_right, int num_threads) {
  FamilyCall call;
  call.query = array_ref(query, "query");
  call.key = array_ref(key, "key");
  call.value = array_ref(value, "value");
  call.out = array_ref(out, "out");
  call.bool_mask = array_ref(bool_mask, "bool_mask");
  call.float_mask = array_ref(float_mask, "float_mask");
  call.valid_lens = array_ref(valid_lens, "valid_lens");
  call.weights = array_ref(weights, "weights");
  call.causal = causal;
  call.diag_offset = diag_offset;
  call.window_left = window_left;
  call.window_right = window_right;
  call.num_threads = num_threads;
  return call;
}

}  // namespace

void register_family(py::module_& m) {
  m.def(
      "masked_softmax",
      [](const py::object& x, const py::object& out, const py::object& mask,
         const py::object& valid_lens, int num_threads) {
        MaskedSoftmaxCall call;
        call.x = array_ref(x, "x");
        call.out = array_ref(out, "out");
        call.mask = array_ref(mask, "mask");
        call.valid_lens = array_ref(valid_lens, "valid_lens");
        call.num_threads = num_threads;
        // The arrays stay referenced by the caller's frame while the GIL is released.
        py::gil_scoped_release release;
        masked_softmax(call);
      },
      py::arg("x"), py::arg("out"), py::arg("mask"), py::arg("valid_lens"), py::arg("num_threads"),
      "Softmax over the last axis of validated arrays (see fastattn/_family.py).");

  m.def(
      "additive",
      [](const py::object& query, const py::object& key, const py::object& value,
         const py::object& out, const py::object& bool_mask, const py::object& float_mask,
         const py::object& valid_lens, const py::object& weights, const py::object& w_q,
         const py::object& w_k, const py::object& w_v, bool causal, int64_t diag_offset,
         int64_t window_left, int64_t window_right, int normalizer, int64_t top_k, bool hardmax,
         int num_threads, const py::object& sinks) {
        FamilyCall call =
            family_call(query, key, value, out, bool_mask, float_mask, valid_lens, weights, causal,
                        diag_offset, window_left, window_right, num_threads);
        call.sinks = array_ref(sinks, "sinks");
        call.w_q = array_ref(w_q, "w_q");
        call.w_k = array_ref(w_k, "w_k");
        call.w_v = array_ref(w_v, "w_v");
        call.normalizer = normalizer;
        call.top_k = top_k;
        call.hardmax = hardmax;
        py::gil_scoped_release release;
        additive_attention(call);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"), py::arg("bool_mask"),
      py::arg("float_mask"), py::arg("valid_lens"), py::arg("weights"), py::arg("w_q"),
      py::arg("w_k"), py::arg("w_v"), py::arg("causal"), py::arg("diag_offset"),
      py::arg("window_left"), py::arg("window_right"), py::arg("normalizer"), py::arg("top_k"),
      py::arg("hardmax"), py::arg("num_threads"), py::arg("sinks") = py::none(),
      "Blocked additive attention on validated, broadcast arrays.");

  m.def(
      "select",
      [](const py::object& query, const py::object& key, const py::object& value,
         const py::object& out, const py::object& bool_mask, const py::object& float_mask,
         const py::object& valid_lens, const py::object& weights, double scale, bool causal,
         int64_t diag_offset, int64_t window_left, int64_t window_right, int64_t top_k,
         bool hardmax, int num_threads) {
        FamilyCall call =
            family_call(query, key, value, out, bool_mask, float_mask, valid_lens, weights, causal,
                        diag_offset, window_left, window_right, num_threads);
        call.scale = scale;
        call.normalizer = 1;
        call.top_k = top_k;
        call.hardmax = hardmax;
        py::gil_scoped_release release;
        select_attention(call);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"), py::arg("bool_mask"),
      py::arg("float_mask"), py::arg("valid_lens"), py::arg("weights"), py::arg("scale"),
      py::arg("causal"), py::arg("diag_offset"), py::arg("window_left"), py::arg("window_right"),
      py::arg("top_k"), py::arg("hardmax"), py::arg("num_threads"),
      "Blocked hardmax/top-k attention over dot-product scores.");

  m.def(
      "nadaraya_watson",
      [](const py::object& x_query, const py::object& x_keys, const py::object& y_values,
         const py::object& out, const py::object& weights, const py::object& bandwidth, int kernel,
         int num_threads) {
        FamilyCall call = family_call(x_query, x_keys, y_values, out, py::none(), py::none(),
                                      py::none(), weights, false, 0, -1, -1, num_threads);
        call.bandwidth = array_ref(bandwidth, "bandwidth");
        call.kernel = kernel;
        py::gil_scoped_release release;
        nadaraya_watson(call);
      },
      py::arg("x_query"), py::arg("x_keys"), py::arg("y_values"), py::arg("out"),
      py::arg("weights"), py::arg("bandwidth"), py::arg("kernel"), py::arg("num_threads"),
      "Blocked Nadaraya-Watson kernel regression.");

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

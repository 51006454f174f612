// The keyword arguments every attention binding (sdpa, sdpa_varlen, additive, select,
// nadaraya_watson) shares, declared and converted into AttnCall in one place. A binding is
// a body `void(Call& call, Extra... extra)` and the py::arg list of its extras:
//
//   def_attention(m, "select", [](FamilyCall& call, int64_t top_k, ...) {...}, "doc",
//                 py::arg("top_k"), ...);
//
// gives _core.select(*, query, key, value, out, <the shared options>, top_k, ...). Every
// argument is keyword-only (swapping two ints cannot pass silently); the optional arrays
// default to None and the options to AttnCall's defaults (no mask, no window), so a caller
// names only what it uses. The body runs with the GIL held; it fills its own fields and
// releases the GIL around the kernel (the arrays stay referenced by the caller's frame).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <utility>

#include "api/attention.h"
#include "bindings/array_ref.h"
#include "bindings/interruptible.h"

namespace fastattn {

namespace attention_args_detail {

// The call type and extra parameter types of a body's operator().
template <typename F>
struct Body : Body<decltype(&F::operator())> {};
template <typename C, typename Call, typename... Extra>
struct Body<void (C::*)(Call&, Extra...) const> {
  using call = Call;
  // The pybind11-facing function: the shared arguments, then the body's extras.
  template <typename F>
  static auto wrap(F body) {
    return
        [body](const pybind11::object& query, const pybind11::object& key,
               const pybind11::object& value, const pybind11::object& out,
               const pybind11::object& bool_mask, const pybind11::object& float_mask,
               const pybind11::object& valid_lens, const pybind11::object& lse,
               const pybind11::object& weights, const pybind11::object& sinks,
               const pybind11::object& alibi_slopes, double scale, bool causal, int64_t diag_offset,
               int64_t window_left, int64_t window_right, int num_threads, Extra... extra) {
          Call call;
          call.query = array_ref(query, "query");
          call.key = array_ref(key, "key");
          call.value = array_ref(value, "value");
          call.out = array_ref(out, "out");
          call.bool_mask = array_ref(bool_mask, "bool_mask");
          call.float_mask = array_ref(float_mask, "float_mask");
          call.valid_lens = array_ref(valid_lens, "valid_lens");
          call.lse = array_ref(lse, "lse");
          call.weights = array_ref(weights, "weights");
          call.sinks = array_ref(sinks, "sinks");
          call.alibi = array_ref(alibi_slopes, "alibi_slopes");
          call.scale = scale;
          call.causal = causal;
          call.diag_offset = diag_offset;
          call.window_left = window_left;
          call.window_right = window_right;
          call.num_threads = num_threads;
          Interruptible ctrl_c;  // Ctrl-C between the kernel's tasks
          body(call, std::forward<Extra>(extra)...);
          ctrl_c.check();
        };
  }
};

}  // namespace attention_args_detail

// Defines _core.<name>: the shared keyword arguments (above), then the body's own.
template <typename F, typename... ExtraArgs>
void def_attention(pybind11::module_& m, const char* name, F body, const char* doc,
                   ExtraArgs&&... extra_args) {
  namespace py = pybind11;
  const AttnCall defaults;
  m.def(name, attention_args_detail::Body<F>::wrap(body), py::kw_only(), py::arg("query"),
        py::arg("key"), py::arg("value"), py::arg("out"), py::arg("bool_mask") = py::none(),
        py::arg("float_mask") = py::none(), py::arg("valid_lens") = py::none(),
        py::arg("lse") = py::none(), py::arg("weights") = py::none(), py::arg("sinks") = py::none(),
        py::arg("alibi_slopes") = py::none(), py::arg("scale") = defaults.scale,
        py::arg("causal") = defaults.causal, py::arg("diag_offset") = defaults.diag_offset,
        py::arg("window_left") = defaults.window_left,
        py::arg("window_right") = defaults.window_right, py::arg("num_threads"),
        std::forward<ExtraArgs>(extra_args)..., doc);
}

}  // namespace fastattn

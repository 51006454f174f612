// The compiled core of fastattn. This file only registers; each area has its own
// register_*.cpp. The public API is fastattn/__init__.py.
#include <pybind11/pybind11.h>

namespace fastattn {
void register_sdpa(pybind11::module_& m);
void register_config(pybind11::module_& m);
void register_family(pybind11::module_& m);
void register_capi(pybind11::module_& m);
void register_varlen(pybind11::module_& m);
void register_grad(pybind11::module_& m);
}  // namespace fastattn

// Free-threading safe (PEP 703): every kernel call detaches its thread state
// (py::gil_scoped_release) and the bindings' shared state is guarded (register_sdpa.cpp's
// StateLock; atomics in api/threads.cpp), so a free-threaded CPython keeps the GIL off after
// import. docs/threads.md#free-threaded-cpython says what was run to show it.
PYBIND11_MODULE(_core, m, pybind11::mod_gil_not_used()) {
  m.doc() = "fastattn compiled kernels (private; use the fastattn package)";
  fastattn::register_config(m);
  fastattn::register_sdpa(m);
  fastattn::register_family(m);
  fastattn::register_capi(m);
  fastattn::register_varlen(m);
  fastattn::register_grad(m);
}

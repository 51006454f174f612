#include <omp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dispatch/isa.h"

namespace py = pybind11;

namespace fastattn {

void register_config(py::module_& m) {
  m.def("available_isas", &available_isas, "ISAs compiled in and supported here, best last.");
  m.def("compiled_isas", &compiled_isas, "ISAs compiled into this build.");
  m.def("active_isa", [] { return std::string(active_kernels().name); },
        "The ISA the kernels currently run with.");
  m.def("set_isa", &set_isa, py::arg("name"), "Select the kernels' ISA by name.");
  m.def("omp_max_threads", [] { return omp_get_max_threads(); });
  m.attr("version") = FASTATTN_VERSION;
  m.attr("compiler") = FASTATTN_COMPILER;
  m.attr("openmp_version") = _OPENMP;
}

}  // namespace fastattn

// A symbol threadpoolctl looks for to recognise this library among loaded modules
// named "_core.*" (see fastattn/_threads.py).
extern "C" __attribute__((visibility("default"))) int fastattn_threadpool_marker() { return 1; }

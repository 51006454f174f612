#include <pybind11/pybind11.h>

#include "api/capi.h"

namespace py = pybind11;

namespace fastattn {

// The C API's function table as a capsule (NumPy's _ARRAY_API pattern): C, Cython and
// ctypes consumers fetch it once and then call without Python (fastattn/capi.pxd,
// fastattn/capi.py). The table is static: the capsule owns nothing.
void register_capi(py::module_& m) {
  m.attr("_C_API") = py::capsule(static_cast<const void*>(capi_table()), FASTATTN_CAPI_CAPSULE);
}

}  // namespace fastattn

// py::array <-> ArrayRef, shared by the register_*.cpp files.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "api/array_ref.h"

namespace fastattn {

// None -> absent; anything else must already be a NumPy array (the Python layer converts).
inline ArrayRef array_ref(const pybind11::object& obj, const char* name) {
  ArrayRef r;
  if (obj.is_none()) return r;
  if (!pybind11::isinstance<pybind11::array>(obj))
    throw pybind11::type_error(std::string(name) + " must be a numpy.ndarray");
  auto a = pybind11::reinterpret_borrow<pybind11::array>(obj);
  r.given = true;
  r.data = const_cast<void*>(a.data());
  const pybind11::dtype dt = a.dtype();
  r.kind = dt.kind();
  r.code = dt.char_();
  r.itemsize = a.itemsize();
  r.writeable = a.writeable();
  // '=' native, '|' not applicable (one byte), '<' or '>' explicit.
  const char order = dt.byteorder();
  const uint16_t probe = 1;
  const char native = *reinterpret_cast<const unsigned char*>(&probe) == 1 ? '<' : '>';
  if (order != '=' && order != '|' && order != native)
    throw pybind11::value_error(std::string(name) + " must be in native byte order");
  // The kernels read whole elements through typed pointers: an unaligned one is undefined
  // behaviour (the Python layer copies unaligned arrays; this catches one it missed).
  if (a.size() > 0 && reinterpret_cast<std::uintptr_t>(a.data()) % a.itemsize() != 0)
    throw pybind11::value_error(std::string(name) + " must be aligned to its item size");
  // One allocation each (a decode step's whole call costs a few microseconds).
  r.shape.assign(a.shape(), a.shape() + a.ndim());
  r.strides.assign(a.strides(), a.strides() + a.ndim());
  return r;
}

}  // namespace fastattn

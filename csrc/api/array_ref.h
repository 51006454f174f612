// A dtype-tagged view of an array (pointer, shape, byte strides) so the C++ entry
// points can check and unpack arguments without depending on pybind11.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fastattn {

struct ArrayRef {
  bool given = false;  // false = argument absent
  void* data = nullptr;
  char kind = 0;  // NumPy dtype kind: 'f', 'b', 'i', 'u'
  char code = 0;  // NumPy dtype char ('E' with kind 'V': ml_dtypes.bfloat16)
  int64_t itemsize = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // bytes
  bool writeable = false;

  bool present() const { return given; }
  int64_t ndim() const { return int64_t(shape.size()); }
};

}  // namespace fastattn

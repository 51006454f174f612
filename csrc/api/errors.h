// Errors the entry points throw besides std::invalid_argument (-> ValueError).
#pragma once

#include <new>
#include <string>

namespace fastattn {

// A kernel could not allocate its scratch. A std::bad_alloc, which pybind11 raises as
// MemoryError with what(): the message says which call failed and why, instead of
// "std::bad_alloc".
class ScratchAllocationError : public std::bad_alloc {
 public:
  explicit ScratchAllocationError(const char* kernel)
      : message_(std::string("fastattn: could not allocate the scratch memory of the ") + kernel +
                 " kernel (the call is too large for the memory available)") {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace fastattn

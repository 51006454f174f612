// The reference path of the select kernels: one-lane vectors, auto-vectoriser off (flags in
// CMakeLists.txt). FASTATTN_ISA=scalar selects it.
#define FASTATTN_ISA_NS scalar
#define FASTATTN_VEC_BYTES 0
#include "kernels/family.h"
#include "kernels/select-inl.h"

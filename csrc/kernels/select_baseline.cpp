// The select kernels compiled for ISA "baseline" (flags in CMakeLists.txt).
#define FASTATTN_ISA_NS baseline
#define FASTATTN_VEC_BYTES 16
#include "kernels/family.h"
#include "kernels/select-inl.h"

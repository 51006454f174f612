// The masked_softmax kernels compiled for ISA "baseline" (flags in CMakeLists.txt).
#define FASTATTN_ISA_NS baseline
#define FASTATTN_VEC_BYTES 16
#include "kernels/family.h"
#include "kernels/masked_softmax-inl.h"

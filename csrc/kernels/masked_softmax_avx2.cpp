// The masked_softmax kernels compiled for ISA "avx2" (flags in CMakeLists.txt).
#define FASTATTN_ISA_NS avx2
#define FASTATTN_VEC_BYTES 32
#include "kernels/family.h"
#include "kernels/masked_softmax-inl.h"

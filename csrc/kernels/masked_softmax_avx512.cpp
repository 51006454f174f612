// The masked_softmax kernels compiled for ISA "avx512" (flags in CMakeLists.txt).
#define FASTATTN_ISA_NS avx512
#define FASTATTN_VEC_BYTES 64
#include "kernels/family.h"
#include "kernels/masked_softmax-inl.h"

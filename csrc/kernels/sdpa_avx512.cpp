// The attention kernels compiled for ISA "avx512" (flags in CMakeLists.txt).
#define FASTATTN_ISA_NS avx512
#define FASTATTN_VEC_BYTES 64
#include "kernels/sdpa.h"
#include "kernels/sdpa-inl.h"

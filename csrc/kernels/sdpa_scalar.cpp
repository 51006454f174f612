// The reference kernel path: the same blocked algorithm with one-lane vectors and the
// auto-vectoriser off (flags in CMakeLists.txt). FASTATTN_ISA=scalar selects it.
#define FASTATTN_ISA_NS scalar
#define FASTATTN_VEC_BYTES 0
#include "kernels/sdpa.h"
#include "kernels/sdpa-inl.h"

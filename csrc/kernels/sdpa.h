// Declarations of the attention kernels, one set per ISA namespace. The definitions
// come from csrc/kernels/sdpa-inl.h, compiled once per ISA (sdpa_<isa>.cpp) with that
// ISA's flags; csrc/dispatch picks one set at import. This header has no SIMD in it.
#pragma once

#include "api/sdpa_params.h"

#define FASTATTN_DECLARE_SDPA_KERNELS(isa)                        \
  namespace isa {                                                 \
  bool sdpa_forward_f32(const SdpaParams& params);                \
  bool sdpa_forward_f64(const SdpaParams& params);                \
  void exp2_f32(const float* x, float* out, int64_t n);            \
  void exp2_f64(const double* x, double* out, int64_t n);          \
  }

namespace fastattn {
FASTATTN_DECLARE_SDPA_KERNELS(scalar)
FASTATTN_DECLARE_SDPA_KERNELS(baseline)
FASTATTN_DECLARE_SDPA_KERNELS(avx2)
FASTATTN_DECLARE_SDPA_KERNELS(avx512)
}  // namespace fastattn

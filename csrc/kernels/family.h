// Declarations of the attention-family kernels, one set per ISA namespace. The definitions
// come from csrc/kernels/<op>-inl.h, compiled once per ISA (<op>_<isa>.cpp) with that ISA's
// flags; csrc/dispatch picks one set at import. This header has no SIMD in it.
#pragma once

#include "api/family_params.h"

#define FASTATTN_DECLARE_FAMILY_KERNELS(isa)                         \
  namespace isa {                                                    \
  bool masked_softmax_f32(const MaskedSoftmaxParams& params);        \
  bool masked_softmax_f64(const MaskedSoftmaxParams& params);        \
  bool additive_attention_f32(const FamilyParams& params);           \
  bool additive_attention_f64(const FamilyParams& params);           \
  bool project_f32(const ProjectParams& params);                     \
  bool project_f64(const ProjectParams& params);                     \
  bool select_attention_f32(const FamilyParams& params);             \
  bool select_attention_f64(const FamilyParams& params);             \
  bool nadaraya_watson_f32(const FamilyParams& params);              \
  bool nadaraya_watson_f64(const FamilyParams& params);              \
  }

namespace fastattn {
FASTATTN_DECLARE_FAMILY_KERNELS(scalar)
FASTATTN_DECLARE_FAMILY_KERNELS(baseline)
FASTATTN_DECLARE_FAMILY_KERNELS(avx2)
FASTATTN_DECLARE_FAMILY_KERNELS(avx512)
}  // namespace fastattn

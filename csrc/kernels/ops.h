// The one registration point of the kernels: FASTATTN_OPS lists every kernel function as
// X(source, name, Signature). From this list
//   - CMakeLists.txt compiles each kernels/<source>-inl.h once per ISA (it reads the
//     X(...) lines of this file), in a generated TU that defines FASTATTN_ISA_NS and
//     FASTATTN_VEC_BYTES and includes this header and then the source;
//   - this header declares name_f32 and name_f64 in every ISA namespace (the source
//     defines them), and dispatch/isa.h makes them the KernelTable's fields and rows.
// Adding an op: its -inl.h source, one X(...) line here, and its binding. No SIMD here.
#pragma once

#include <cstdint>

#include "api/params.h"
#include "api/sdpa_backward_params.h"
#include "api/varlen_params.h"

namespace fastattn {

// Signatures, as templates of the compute type T (float or double).
template <typename T>
using SdpaFn = bool(const SdpaParams&);
template <typename T>
using VarlenFn = bool(const VarlenParams&);
template <typename T>
using SdpaBackwardFn = bool(const SdpaBackwardParams&);
template <typename T>
using ArrayFn = void(const T* x, T* out, int64_t n);
template <typename T>
using MaskedSoftmaxFn = bool(const MaskedSoftmaxParams&);
template <typename T>
using FamilyFn = bool(const FamilyParams&);
template <typename T>
using ProjectFn = bool(const ProjectParams&);
template <typename T>
using AdditiveBackwardFn = bool(const AdditiveBackwardParams&);
template <typename T>
using NwBackwardFn = bool(const NwBackwardParams&);
template <typename T>
using MergeStatesFn = bool(const MergeStatesParams&);
template <typename T>
using FmaPeakFn = double(int num_threads, double seconds);
template <typename T>
using ReadBandwidthFn = double(int64_t nbytes, int num_threads, int repeats);
// The mask summary of p's bool mask (kernels/mask_summary-inl.h) into out (null: only
// sizes it); returns its rows, *row_words the words per row.
template <typename T>
using MaskSummaryFn = int64_t(const AttnParams& p, uint64_t* out, int64_t* row_words);

// sdpa_varlen (varlen_attention) is in kernels/varlen-inl.h, which sdpa-inl.h includes.
// The attention kernels return false when scratch could not be allocated (the entry point
// raises); the machine-limit probes return their measurement.
#define FASTATTN_OPS(X)                                       \
  X(sdpa, sdpa_forward, SdpaFn)                               \
  X(sdpa, exp2, ArrayFn) /* the softmax's exp2, for tests */  \
  X(sdpa, sdpa_varlen, VarlenFn)                              \
  X(sdpa_backward, sdpa_backward, SdpaBackwardFn)             \
  X(masked_softmax, masked_softmax, MaskedSoftmaxFn)          \
  X(masked_softmax, masked_softmax_backward, MaskedSoftmaxFn) \
  X(additive, additive_attention, FamilyFn)                   \
  X(additive, project, ProjectFn)                             \
  X(additive, additive_backward, AdditiveBackwardFn)          \
  X(select, select_attention, FamilyFn)                       \
  X(nadaraya_watson, nadaraya_watson, FamilyFn)               \
  X(nadaraya_watson, nadaraya_watson_backward, NwBackwardFn)  \
  X(merge_states, merge_states, MergeStatesFn)                \
  X(machine_limits, fma_peak, FmaPeakFn)                      \
  X(machine_limits, read_bandwidth, ReadBandwidthFn)          \
  X(block_mask, mask_summary, MaskSummaryFn)

#define FASTATTN_DECLARE_OP(source, name, Sig) \
  Sig<float> name##_f32;                       \
  Sig<double> name##_f64;

#define FASTATTN_DECLARE_ISA(isa)   \
  namespace isa {                   \
  FASTATTN_OPS(FASTATTN_DECLARE_OP) \
  }

FASTATTN_DECLARE_ISA(scalar)
FASTATTN_DECLARE_ISA(baseline)
FASTATTN_DECLARE_ISA(avx2)
FASTATTN_DECLARE_ISA(avx512)
FASTATTN_DECLARE_ISA(neon)
// avx512bf16 (kernels/sdpa_bf16.cpp): the avx512 table with its own bfloat16 SDPA/varlen.
namespace avx512bf16 {
SdpaFn<float> sdpa_forward_f32;
VarlenFn<float> sdpa_varlen_f32;
// GFLOP/s of vdpbf16ps (kernels/machine_limits_bf16.cpp); dispatch/isa.h's bf16_dot_peak.
double bf16_dot_peak(int num_threads, double seconds);
}  // namespace avx512bf16
// neon_bf16 (kernels/sdpa_bf16.cpp on aarch64): the neon table with its own bfloat16
// SDPA/varlen (BFDOT, FEAT_BF16).
namespace neon_bf16 {
SdpaFn<float> sdpa_forward_f32;
VarlenFn<float> sdpa_varlen_f32;
// GFLOP/s of BFDOT (kernels/machine_limits_bf16.cpp); dispatch/isa.h's bf16_dot_peak.
double bf16_dot_peak(int num_threads, double seconds);
}  // namespace neon_bf16

}  // namespace fastattn

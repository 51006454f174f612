// The bfloat16 dot-product ISAs: "avx512bf16" (x86-64, AVX512-BF16's vdpbf16ps) and
// "neon_bf16" (aarch64, FEAT_BF16's BFDOT) are the avx512 and neon kernels with one
// difference, bfloat16 SDPA computes Q K^T and P V with that instruction
// (kernels/sdpa_bf16-inl.h). This TU compiles the SDPA engine (and its packed-sequence
// driver, varlen_attention) once more with the instruction enabled (CMake gives it the
// flag: -mavx512bf16 or -march=armv8.2-a+bf16); every other op and dtype of the table is
// the widening ISA's own (dispatch/isa.cpp), so only bfloat16 SDPA and varlen differ between
// the two.
#if defined(__aarch64__)
#define FASTATTN_ISA_NS neon_bf16
#define FASTATTN_WIDENING_NS neon
#define FASTATTN_VEC_BYTES 16
#else
#define FASTATTN_ISA_NS avx512bf16
#define FASTATTN_WIDENING_NS avx512
#define FASTATTN_VEC_BYTES 64
#endif
#define FASTATTN_DPBF16 1
#include "kernels/ops.h"
#include "kernels/sdpa-inl.h"
#include "kernels/varlen-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

bool sdpa_forward_f32(const SdpaParams& params) {
  if (params.storage == Storage::kBF16 && params.kv_storage != Storage::kI8)
    return sdpa_forward<float, BFloat16>(params);
  return FASTATTN_WIDENING_NS::sdpa_forward_f32(params);  // every other dtype: widening kernel
}

bool sdpa_varlen_f32(const VarlenParams& params) {
  if (params.packed.storage == Storage::kBF16) return sdpa_varlen<float, BFloat16>(params);
  return FASTATTN_WIDENING_NS::sdpa_varlen_f32(params);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

// The "avx512bf16" ISA: the AVX-512 kernels with one difference, bfloat16 SDPA computes
// Q K^T and P V with vdpbf16ps (kernels/sdpa_bf16-inl.h). This TU compiles the SDPA engine
// (and its packed-sequence driver, varlen_attention) once more with AVX512-BF16 enabled;
// every other op and dtype of the avx512bf16 table is the avx512 one (dispatch/isa.cpp), so
// only bfloat16 SDPA and varlen differ between the two.
#define FASTATTN_ISA_NS avx512bf16
#define FASTATTN_VEC_BYTES 64
#define FASTATTN_DPBF16 1
#include "kernels/ops.h"
#include "kernels/sdpa-inl.h"
#include "kernels/varlen-inl.h"

namespace fastattn {
namespace avx512bf16 {

bool sdpa_forward_f32(const SdpaParams& params) {
  if (params.storage == Storage::kBF16 && params.kv_storage != Storage::kI8)
    return sdpa_forward<float, BFloat16>(params);
  return avx512::sdpa_forward_f32(params);  // every other dtype: the avx512 kernel itself
}

bool sdpa_varlen_f32(const VarlenParams& params) {
  if (params.packed.storage == Storage::kBF16) return sdpa_varlen<float, BFloat16>(params);
  return avx512::sdpa_varlen_f32(params);
}

}  // namespace avx512bf16
}  // namespace fastattn

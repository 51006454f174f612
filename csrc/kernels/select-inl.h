// Hardmax / top-k attention over dot-product scores, compiled once per ISA
// (in a TU CMake generates from kernels/ops.h): s = scale * q . k + float_mask, masks as SDPA; per
// row the k best visible keys are kept in a small heap while the key blocks stream past
// (family-inl.h), then hardmax puts weight 1 on the first best key and top-k takes a softmax over
// the kept scores. Only the kept keys' values are read.
#pragma once  // per translation unit

#include "kernels/family-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {
namespace family {

// q/k/v/out stored as S (T, or a 16-bit float widened as it is read).
template <typename T, typename S = T>
bool select_attention(const FamilyParams& p) {
  // Key blocks: the packed K^T block (dim x keys) stays about L1-sized.
  const int64_t keys = 32 * 1024 / (imax(p.dim_q, 1) * int64_t(sizeof(T)));
  const int64_t block_k = imax(kColTile<T>, imin(512, keys / kColTile<T> * kColTile<T>));
  // Fewer rows per task when k is large, so the per-thread heaps stay small.
  const int64_t k = imax(1, p.hardmax ? 1 : p.top_k);
  const int64_t block_q = imax(1, imin(64, (int64_t(1) << 16) / k));
  typename DotScores<T>::Shared sh;
  return run_family<T, DotScores<T>, SelectTopK<T>, S>(p, sh, block_q, block_k);
}

}  // namespace family

// float32 compute serves float32 arrays and the 16-bit storage types (params.storage).
bool select_attention_f32(const FamilyParams& params) {
  return with_float_storage(
      params.storage, [&](auto s) { return family::select_attention<float, decltype(s)>(params); });
}
bool select_attention_f64(const FamilyParams& params) {
  return family::select_attention<double>(params);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

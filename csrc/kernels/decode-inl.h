// The thin (decoding) specialisation's block products: a few query rows (the query heads of
// one GQA group, a short query block) against key and value rows read straight from the
// cache, each K/V row read once for all the rows. Decoding is bound by the bytes of K/V
// read, so every row of the group is served while a row is in registers, instead of
// re-reading the block once per query row. Per ISA (include only inside a TU that defines
// FASTATTN_ISA_NS).
//
// Each dot product sums its head dim in whole vectors, then the lanes in reduce_add's
// order, then the tail scalars (keys stored narrower are widened as read; an int8 key's
// dot is multiplied by its scale); each output element takes its keys in order, one fused
// multiply-add at a time, as pv_row (attention-inl.h). So results do not depend on how
// rows are grouped here.
#pragma once  // per translation unit

#include <cstdint>
#include <type_traits>

#include "kernels/attention-inl.h"
#include "simd/convert-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// Query rows served together by one pass over the keys (a GQA group of 4 query heads per
// kv head fills it); more rows take more passes.
constexpr int kThinGroup = 4;
static_assert(kRowTile % kThinGroup == 0, "scores_group reads q padded to whole groups of rows");

// Rows the thin specialisation takes per task (fewer than this: no packing, dot products
// straight from the key rows).
constexpr int64_t kThinRows = 2 * kThinGroup;

// Prefetch distance ahead of the key/value row being read, in bytes: the hardware
// prefetcher follows the two streams, this keeps more lines in flight per core.
constexpr int64_t kPrefetchBytes = 2048;

template <typename S>
inline void prefetch_row(const S* row, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64)
    __builtin_prefetch(reinterpret_cast<const char*>(row) + b + kPrefetchBytes, 0, 0);
}

// s[r, j] = q[r, :] . k[j, :] (times scale[j] for int8 keys) for rows [0, nrows) and keys
// [0, n). q has nrows rounded up to kThinGroup rows (padding rows are computed, their
// scores never read). L accumulators hold G rows x (L / G) keys, reduced to one vector at
// once (reduce_lanes_of), so each key row is loaded once per group of G rows.
template <typename T, typename S>
inline void scores_group(const T* q, int64_t head_dim, const S* k, int64_t k_row_stride, T* s,
                         int64_t s_ld, int64_t nrows, int64_t n, const float* scale) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  constexpr int G = L < kThinGroup ? L : kThinGroup;  // rows per pass
  constexpr int KG = L / G;                           // keys per pass
  const int64_t e_whole = head_dim / L * L;
  const int64_t row_bytes = head_dim * int64_t(sizeof(S));
  for (int64_t r0 = 0; r0 < nrows; r0 += G) {
    const T* qg = q + r0 * head_dim;
    T* sg = s + r0 * s_ld;
    int64_t j = 0;
    for (; j + KG <= n; j += KG) {
      if (r0 == 0)
        for (int kk = 0; kk < KG; ++kk) prefetch_row(k + (j + kk) * k_row_stride, row_bytes);
      V acc[L];
      for (int i = 0; i < L; ++i) acc[i] = V{};
      for (int64_t e = 0; e < e_whole; e += L) {
        V kv[KG];
        for (int kk = 0; kk < KG; ++kk) kv[kk] = vload_wide<T>(k + (j + kk) * k_row_stride + e);
        for (int g = 0; g < G; ++g) {
          const V qv = vload(qg + g * head_dim + e);
          for (int kk = 0; kk < KG; ++kk) acc[kk * G + g] = vfma(qv, kv[kk], acc[kk * G + g]);
        }
      }
      // Lane kk * G + g: row g, key j + kk.
      V dots = L > 1 ? reduce_lanes_of<T>(acc) : acc[0];
      for (int kk = 0; kk < KG; ++kk) {
        const S* kr = k + (j + kk) * k_row_stride;
        for (int g = 0; g < G; ++g) {
          const T* qr = qg + g * head_dim;
          T dot = dots[kk * G + g];
          for (int64_t e = e_whole; e < head_dim; ++e) dot = vfma(qr[e], widen<T>(kr[e]), dot);
          if constexpr (std::is_same_v<S, int8_t>) dot *= scale[j + kk];
          sg[g * s_ld + j + kk] = dot;
        }
      }
    }
    for (; j < n; ++j) {  // the last keys, one at a time
      const S* kr = k + j * k_row_stride;
      for (int g = 0; g < G; ++g) {
        const T* qr = qg + g * head_dim;
        V acc = V{};
        for (int64_t e = 0; e < e_whole; e += L)
          acc = vfma(vload(qr + e), vload_wide<T>(kr + e), acc);
        T dot = reduce_add<T>(acc);
        for (int64_t e = e_whole; e < head_dim; ++e) dot = vfma(qr[e], widen<T>(kr[e]), dot);
        if constexpr (std::is_same_v<S, int8_t>) dot *= scale[j];
        sg[g * s_ld + j] = dot;
      }
    }
  }
}

// Columns [c, c + U * L) of G rows' acc += p v over keys [0, n), every probability
// multiplied (the caller has checked none is 0, so this is pv_row's arithmetic). An int8
// value row's scale folds into each row's probability, as in pv_row.
template <typename T, int G, int U, typename S>
inline void pv_group_cols(const T* p, int64_t p_ld, int64_t n, const S* v, int64_t v_row_stride,
                          int64_t c, T* acc, int64_t acc_ld, const float* scale, bool lead) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  const int64_t row_bytes = v_row_stride * int64_t(sizeof(S));
  V a[G][U];
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u) a[g][u] = vload(acc + g * acc_ld + c + u * L);
  for (int64_t j = 0; j < n; ++j) {
    const S* vr = v + j * v_row_stride + c;
    if (lead) prefetch_row(v + j * v_row_stride, row_bytes < 512 ? row_bytes : 512);
    V x[U];
    for (int u = 0; u < U; ++u) x[u] = vload_wide<T>(vr + u * L);
    for (int g = 0; g < G; ++g) {
      T pj = p[g * p_ld + j];
      if constexpr (std::is_same_v<S, int8_t>) pj *= scale[j];
      const V pb = vbroadcast(pj);
      for (int u = 0; u < U; ++u) a[g][u] = vfma(pb, x[u], a[g][u]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u) vstore(acc + g * acc_ld + c + u * L, a[g][u]);
}

// acc[r, :] += sum_j p[r, j] * v[j, :] for rows [0, nrows), keys [0, n): pv_row's results.
// Groups of rows whose probabilities are all nonzero share each value row read (a zero
// must skip its key, as pv_row does, so such a group goes row by row).
template <typename T, typename S>
inline void pv_group(const T* p, int64_t p_ld, int64_t nrows, int64_t n, const S* v,
                     int64_t v_row_stride, int64_t dv, T* acc, int64_t acc_ld, const float* scale) {
  constexpr int L = kLanes<T>;
  constexpr int G = 2;  // rows per pass: G x UM accumulators + UM value vectors in registers
  constexpr int UM = kVecBytes<T> == 64 ? 8 : 4;  // 32 vector registers, or 16
  int64_t r = 0;
  for (; r + G <= nrows; r += G) {
    bool dense = true;
    for (int g = 0; g < G; ++g)
      for (int64_t j = 0; j < n; ++j) dense &= p[(r + g) * p_ld + j] != T(0);
    if (!dense) {
      for (int g = 0; g < G; ++g)
        pv_row(p + (r + g) * p_ld, n, v, v_row_stride, dv, acc + (r + g) * acc_ld, scale);
      continue;
    }
    const T* pr = p + r * p_ld;
    T* ar = acc + r * acc_ld;
    int64_t c = 0;
    bool lead = r == 0;
    for (; c + UM * L <= dv; c += UM * L, lead = false)
      pv_group_cols<T, G, UM, S>(pr, p_ld, n, v, v_row_stride, c, ar, acc_ld, scale, lead);
    if (UM > 4 && c + 4 * L <= dv) {
      pv_group_cols<T, G, 4, S>(pr, p_ld, n, v, v_row_stride, c, ar, acc_ld, scale, lead);
      c += 4 * L;
      lead = false;
    }
    if (c + 2 * L <= dv) {
      pv_group_cols<T, G, 2, S>(pr, p_ld, n, v, v_row_stride, c, ar, acc_ld, scale, lead);
      c += 2 * L;
      lead = false;
    }
    if (c + L <= dv) {
      pv_group_cols<T, G, 1, S>(pr, p_ld, n, v, v_row_stride, c, ar, acc_ld, scale, lead);
      c += L;
    }
    for (int g = 0; g < G; ++g)  // the column tail, pv_row's scalar loop
      for (int64_t cc = c; cc < dv; ++cc) {
        T a = ar[g * acc_ld + cc];
        for (int64_t j = 0; j < n; ++j) {
          T pj = pr[g * p_ld + j];
          if constexpr (std::is_same_v<S, int8_t>) pj *= scale[j];
          a = vfma(pj, widen<T>(v[j * v_row_stride + cc]), a);
        }
        ar[g * acc_ld + cc] = a;
      }
  }
  for (; r < nrows; ++r) pv_row(p + r * p_ld, n, v, v_row_stride, dv, acc + r * acc_ld, scale);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

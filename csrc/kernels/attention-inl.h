// What every attention kernel shares, whatever its score and normaliser: which keys a row
// may see, where a batch entry's data starts, the masks applied to a row of scores, and
// acc += P V one row at a time. Per ISA, like the SIMD layer it is written in (include
// only inside a TU that defines FASTATTN_ISA_NS).
#pragma once  // per translation unit

#include <cstdint>

#include "api/params.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// Keys row `row` may see: [lo, hi), lo <= hi. valid_lens, causal and window AND together.
inline void row_key_range(const AttnParams& p, int64_t row, int64_t valid_len, int64_t* lo,
                          int64_t* hi) {
  int64_t l = 0, h = imin(p.len_k, valid_len);
  const int64_t d = row + p.diag_offset;
  if (p.causal) h = imin(h, d + 1);
  if (p.window_left >= 0) l = imax(l, d - p.window_left);
  if (p.window_right >= 0) h = imin(h, d + p.window_right + 1);
  *lo = l;
  *hi = imax(h, l);
}

inline int64_t batch_offset(const int64_t* stride, const int64_t* coord, int64_t ndim) {
  int64_t off = 0;
  for (int64_t d = 0; d < ndim; ++d) off += stride[d] * coord[d];
  return off;
}

// Masks on one row of scores s[0:ncols) for the keys [kb, kb + ncols) (s[j] is key kb + j):
// s += float_mask, bool-mask holes and keys outside the visible columns [jlo, jhi) become
// -inf. fmask/bmask point at the row's first key (strided by their col_stride) or are null.
template <typename T>
inline void mask_row(const AttnParams& p, const T* fmask, const uint8_t* bmask, int64_t kb,
                     int64_t jlo, int64_t jhi, int64_t ncols, T* s) {
  constexpr T kNegInf = -T(__builtin_inf());
  if (fmask) {
    const int64_t cs = p.float_mask.col_stride;
    const T* fm = fmask + kb * cs;
    for (int64_t j = jlo; j < jhi; ++j) s[j] += fm[j * cs];
  }
  if (bmask) {
    const int64_t cs = p.bool_mask.col_stride;
    const uint8_t* bm = bmask + kb * cs;
    for (int64_t j = jlo; j < jhi; ++j) s[j] = bm[j * cs] ? s[j] : kNegInf;
  }
  for (int64_t j = 0; j < jlo; ++j) s[j] = kNegInf;
  for (int64_t j = jhi; j < ncols; ++j) s[j] = kNegInf;
}

// Columns [c, c + U * L) of pv_row, the U accumulator vectors held in registers over all
// the keys (no store-to-load chain through acc from one key to the next).
template <typename T, int U>
inline void pv_row_cols(const T* p, int64_t n, const T* v, int64_t v_row_stride, int64_t c,
                        T* acc) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  V a[U];
  for (int u = 0; u < U; ++u) a[u] = vload(acc + c + u * L);
  for (int64_t j = 0; j < n; ++j) {
    const T pj = p[j];
    if (pj == T(0)) continue;
    const T* vr = v + j * v_row_stride + c;
    for (int u = 0; u < U; ++u) a[u] = vfma(vbroadcast(pj), vload(vr + u * L), a[u]);
  }
  for (int u = 0; u < U; ++u) vstore(acc + c + u * L, a[u]);
}

// acc[r, :] += sum_j p[r, j] * v[j, :] for one row, skipping p == 0 so that values of
// keys a row does not attend (padding, NaN, or past an underflowed weight) never reach it.
// Each element still sums its keys in order, one fused multiply-add at a time.
template <typename T>
inline void pv_row(const T* p, int64_t n, const T* v, int64_t v_row_stride, int64_t dv, T* acc) {
  constexpr int L = kLanes<T>;
  int64_t c = 0;
  for (; c + 8 * L <= dv; c += 8 * L) pv_row_cols<T, 8>(p, n, v, v_row_stride, c, acc);
  if (c + 4 * L <= dv) {
    pv_row_cols<T, 4>(p, n, v, v_row_stride, c, acc);
    c += 4 * L;
  }
  if (c + 2 * L <= dv) {
    pv_row_cols<T, 2>(p, n, v, v_row_stride, c, acc);
    c += 2 * L;
  }
  if (c + L <= dv) {
    pv_row_cols<T, 1>(p, n, v, v_row_stride, c, acc);
    c += L;
  }
  for (; c < dv; ++c) {
    T a = acc[c];
    for (int64_t j = 0; j < n; ++j)
      if (p[j] != T(0)) a = vfma(p[j], v[j * v_row_stride + c], a);
    acc[c] = a;
  }
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

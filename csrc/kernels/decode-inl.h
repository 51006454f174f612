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
#include <cstring>
#include <type_traits>

#include "kernels/attention-inl.h"
#include "simd/convert-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// Query rows served together by one pass over the keys (a GQA group of 4 query heads per
// kv head fills it); more rows take more passes.
constexpr int kThinGroup = 4;

// Rows the thin specialisation takes per task: fewer than this, no packing, dot products
// straight from the key rows. Two groups (a GQA group of 8 query heads) still read K/V
// faster this way than packed (measured: 1x64/8 heads, 16384 keys, E128, float32 decode
// 20-22 ms tiled against 15 ms thin, CPU time on one thread; int8 K/V 14 against 8-10).
constexpr int64_t kThinRows = 2 * kThinGroup + 1;

// Key rows ahead of the one being read whose cache lines the score pass asks for: the
// hardware prefetcher alone left decoding at about half the read bandwidth of one core
// (measured: 10 GB/s against 20 for a plain streaming sum); prefetching the key rows 32
// ahead gave 10 % (16 to 64 alike). Value rows are not prefetched with 512-bit vectors:
// their P V pass already streams them near the bandwidth, and prefetching them measured
// slower (into L1 during the P V pass or the score pass; into L2 during the score pass: no
// gain). AVX2 and int8 values are (pv_group).
constexpr int64_t kPrefetchRows = 32;
// Only a call whose K/V exceed this many bytes prefetches: smaller ones stay in the caches
// between calls, where a prefetch is an instruction for nothing (31 % more instructions
// for a lone decoding row, 1x8 heads x 512-2048 keys).
constexpr int64_t kPrefetchMinBytes = int64_t(16) << 20;

// Whether p[0, n) holds no zero (whole vectors, then the tail).
template <typename T>
inline bool all_nonzero(const T* p, int64_t n) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  typename MaskOf<T>::type zero{};
  int64_t j = 0;
  for (; j + L <= n; j += L) zero |= vload(p + j) == V{};
  bool any = false;
  for (int i = 0; i < L; ++i) any |= zero[i] != 0;
  for (; j < n; ++j) any |= p[j] == T(0);
  return !any;
}

// s[g, j] = q[g, :] . k[j, :] (times scale[j] for int8 keys) for G rows and keys [0, n).
// L accumulators hold G rows x (L / G) keys, reduced to one vector at once
// (reduce_lanes_of), so each key row is loaded once for the G rows. Lane g * KG + kk is
// row g, key j + kk: a row's keys are neighbouring lanes, stored as one piece of the vector.
template <int G, typename T, typename S>
inline void scores_rows(const T* qg, int64_t head_dim, const S* k, int64_t k_row_stride, T* sg,
                        int64_t s_ld, int64_t n, const float* scale, bool prefetch) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  constexpr int KG = L / G;  // keys per pass
  static_assert(KG * G == L, "a pass fills the L accumulators");
  const int64_t e_whole = head_dim / L * L;
  int64_t j = 0;
  for (; j + KG <= n; j += KG) {
    V acc[L];
    for (int i = 0; i < L; ++i) acc[i] = V{};
    // Keys stored as computed: one key row at a time, its cache lines in order. Reading the
    // KG rows a line each in turn streamed far slower from memory (float32 GQA decode
    // 1x32/8 16384 E128, 2 threads: 4.7-5.3 ms row by row against 6.5-7.1, min of 61).
    // Row by row, each key vector serves G FMAs for G query loads, which costs where a
    // narrower key must also be widened (float16, bfloat16, int8 are bound by that work,
    // not by the bytes: float16 measured 3 % slower row by row), so those keep the KG
    // rows together.
    if constexpr (std::is_same_v<S, T>) {
      // The row's G accumulators as locals: indexed by kk in acc, GCC kept them in memory
      // and stored them on every step.
      for (int kk = 0; kk < KG; ++kk) {
        const S* kr = k + (j + kk) * k_row_stride;
        V a[G];
        for (int g = 0; g < G; ++g) a[g] = V{};
        for (int64_t e = 0; e < e_whole; e += L) {
          if (prefetch && (e * int64_t(sizeof(S))) % 64 == 0)  // once per cache line of each row
            __builtin_prefetch(kr + kPrefetchRows * k_row_stride + e);
          const V kv = vload_wide<T>(kr + e);
          for (int g = 0; g < G; ++g) a[g] = vfma(vload(qg + g * head_dim + e), kv, a[g]);
        }
        for (int g = 0; g < G; ++g) acc[g * KG + kk] = a[g];
      }
    } else {
      for (int64_t e = 0; e < e_whole; e += L) {
        V kv[KG];
        if (prefetch && (e * int64_t(sizeof(S))) % 64 == 0)  // once per cache line of each row
          for (int kk = 0; kk < KG; ++kk)
            __builtin_prefetch(k + (j + kk + kPrefetchRows) * k_row_stride + e);
        for (int kk = 0; kk < KG; ++kk) kv[kk] = vload_wide<T>(k + (j + kk) * k_row_stride + e);
        for (int g = 0; g < G; ++g) {
          const V qv = vload(qg + g * head_dim + e);
          for (int kk = 0; kk < KG; ++kk) acc[g * KG + kk] = vfma(qv, kv[kk], acc[g * KG + kk]);
        }
      }
    }
    V dots = L > 1 ? reduce_lanes_of<T>(acc) : acc[0];
    if (e_whole < head_dim) {  // the head dim's tail, scalar, after the lanes
      for (int g = 0; g < G; ++g)
        for (int kk = 0; kk < KG; ++kk) {
          const S* kr = k + (j + kk) * k_row_stride;
          const T* qr = qg + g * head_dim;
          T dot = dots[g * KG + kk];
          for (int64_t e = e_whole; e < head_dim; ++e) dot = vfma(qr[e], widen<T>(kr[e]), dot);
          dots[g * KG + kk] = dot;
        }
    }
    if constexpr (std::is_same_v<S, int8_t>) dots *= vtile<KG>(scale + j);
    alignas(64) T lanes[L];
    vstore(lanes, dots);
    for (int g = 0; g < G; ++g) std::memcpy(sg + g * s_ld + j, lanes + g * KG, KG * sizeof(T));
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

// scores_rows for rows [0, nrows): groups of kThinGroup rows (fewer on narrow vectors),
// then the rest one at a time (a single decoding row reads its L keys at once).
// prefetch: the call's K/V are larger than kPrefetchMinBytes.
template <typename T, typename S>
inline void scores_group(const T* q, int64_t head_dim, const S* k, int64_t k_row_stride, T* s,
                         int64_t s_ld, int64_t nrows, int64_t n, const float* scale,
                         bool prefetch) {
  constexpr int L = kLanes<T>;
  constexpr int G = L < kThinGroup ? L : kThinGroup;
  int64_t r = 0;
  for (; r + G <= nrows; r += G)
    scores_rows<G>(q + r * head_dim, head_dim, k, k_row_stride, s + r * s_ld, s_ld, n, scale,
                   prefetch);
  for (; r < nrows; ++r)
    scores_rows<1>(q + r * head_dim, head_dim, k, k_row_stride, s + r * s_ld, s_ld, n, scale,
                   prefetch);
}

// Columns [c, c + U * L) of G rows' acc += p v over keys [0, n), every probability
// multiplied (the caller has checked none is 0, so this is pv_row's arithmetic; an int8
// value row's scale is already folded into p).
// prefetch_bytes: bytes of the value row kPrefetchRows ahead to prefetch (from column c).
template <typename T, int G, int U, typename S>
inline void pv_group_cols(const T* p, int64_t p_ld, int64_t n, const S* v, int64_t v_row_stride,
                          int64_t c, T* acc, int64_t acc_ld, int64_t prefetch_bytes) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  V a[G][U];
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u) a[g][u] = vload(acc + g * acc_ld + c + u * L);
  for (int64_t j = 0; j < n; ++j) {
    const S* vr = v + j * v_row_stride + c;
    for (int64_t b = 0; b < prefetch_bytes; b += 64)  // (see pv_group)
      __builtin_prefetch(reinterpret_cast<const char*>(vr + kPrefetchRows * v_row_stride) + b);
    V x[U];
    for (int u = 0; u < U; ++u) x[u] = vload_wide<T>(vr + u * L);
    for (int g = 0; g < G; ++g) {
      const V pb = vbroadcast(p[g * p_ld + j]);
      for (int u = 0; u < U; ++u) a[g][u] = vfma(pb, x[u], a[g][u]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u) vstore(acc + g * acc_ld + c + u * L, a[g][u]);
}

// acc[r, :] += sum_j p[r, j] * v[j, :] for rows [0, nrows), keys [0, n): pv_row's results.
// A group of kThinGroup rows whose probabilities are all nonzero shares each value read
// (a zero must skip its key, as pv_row does, so such a group goes row by row); its columns
// go in register tiles of U vectors, so each value element is read (and widened) once.
// p is scratch the caller reads no more: an int8 value row's scale is folded into it here
// (the product pv_row forms), once rather than once per column tile.
// prefetch: as scores_group's; int8 values then have the whole row kPrefetchRows ahead
// prefetched during the first column tile. int8 decoding is bound by its arithmetic, not
// by the bytes, and this lets the loads of the later tiles hit the cache (measured: GQA
// decode 1x32/8 16384 E128, one thread, min CPU time 3.3-3.6 ms against 3.8-4.1, with
// reduce_lanes_of inlined). Wider values measured slower with it (float16 6.8 ms against
// 5.7; float32 with AVX-512 as noted at kPrefetchRows), and so did prefetching each tile's
// own columns (int8 3.8 ms). AVX2 float32/float64 values are prefetched too: their P V
// pass walks a head dim of 128 in 8 column tiles (4 with AVX-512), reading one cache line
// of each value row per tile, and the first tile's strided misses were about a quarter
// of a float32 call (GQA decode 1x32/8 16384 E128, one thread, min CPU time 12.0 ms
// against 15.8; float64 25.0 against 32.7).
template <typename T, typename S>
inline void pv_group(T* p, int64_t p_ld, int64_t nrows, int64_t n, const S* v, int64_t v_row_stride,
                     int64_t dv, T* acc, int64_t acc_ld, const float* scale, bool prefetch) {
  constexpr int L = kLanes<T>, G = kThinGroup;
  // G x U accumulators + U value vectors in registers (32 of them with AVX-512, else 16).
  constexpr int U = kVecBytes<T> == 64 ? 4 : 2;
  constexpr bool kPrefetchValues =
      std::is_same_v<S, int8_t> || (kVecBytes<T> == 32 && std::is_same_v<S, T>);
  const int64_t prefetch_bytes = kPrefetchValues && prefetch ? dv * int64_t(sizeof(S)) : 0;
  int64_t r = 0;
  for (; r + G <= nrows; r += G) {
    bool dense = true;
    for (int g = 0; g < G; ++g) dense = dense && all_nonzero(p + (r + g) * p_ld, n);
    if (!dense) {
      for (int g = 0; g < G; ++g)
        pv_row(p + (r + g) * p_ld, n, v, v_row_stride, dv, acc + (r + g) * acc_ld, scale);
      continue;
    }
    T* pr = p + r * p_ld;
    if constexpr (std::is_same_v<S, int8_t>)
      for (int g = 0; g < G; ++g)
        for (int64_t j = 0; j < n; ++j) pr[g * p_ld + j] *= scale[j];
    T* ar = acc + r * acc_ld;
    int64_t c = 0;
    for (; c + U * L <= dv; c += U * L)
      pv_group_cols<T, G, U, S>(pr, p_ld, n, v, v_row_stride, c, ar, acc_ld,
                                c == 0 ? prefetch_bytes : 0);
    for (; c + L <= dv; c += L)  // a head dim of fewer whole vectors
      pv_group_cols<T, G, 1, S>(pr, p_ld, n, v, v_row_stride, c, ar, acc_ld,
                                c == 0 ? prefetch_bytes : 0);
    for (int g = 0; g < G; ++g)  // the column tail, pv_row's scalar loop
      for (int64_t cc = c; cc < dv; ++cc) {
        T a = ar[g * acc_ld + cc];
        for (int64_t j = 0; j < n; ++j)
          a = vfma(pr[g * p_ld + j], widen<T>(v[j * v_row_stride + cc]), a);
        ar[g * acc_ld + cc] = a;
      }
  }
  for (; r < nrows; ++r) pv_row(p + r * p_ld, n, v, v_row_stride, dv, acc + r * acc_ld, scale);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

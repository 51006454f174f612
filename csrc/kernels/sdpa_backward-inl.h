// Gradients of scaled dot-product attention, blocked FlashAttention-2 style, compiled once
// per ISA (in a TU CMake generates from kernels/ops.h). No Lq x Lk matrix: each pair of a
// key block and a query block recomputes its scores S = q k^T * scale (softcap, masks and
// ALiBi as the forward applies them, attention-inl.h / row_bias-inl.h) and its weights
// P = e^(S - lse) from the forward's log-sum-exp, then
//   dP = dO V^T,  dS = P (dP - D) [* (1 - tanh^2) under a softcap],  D = rowsum(dO * O),
//   dV += P^T dO,  dK += scale dS^T Q,  dQ += scale dS K:
// five products per pair (S, dP, dV, dK, dQ), P computed once.
//
// Work: a task is (batch entry, kv head, key chunk) and covers every query head of the kv
// head's GQA group, so it owns the key/value gradients of its key blocks outright (summed
// over the group's rows in a fixed order) and writes them once. The key blocks of a call
// are dealt to a fixed number of chunks (block kbi to chunk kbi % chunks: a causal mask's
// work spreads evenly), chosen from the shape alone; each chunk adds its share of dQ into
// an accumulator of its own, and the chunks' accumulators are summed in chunk order at the
// end. Nothing depends on the thread count (no atomics, no sum whose order follows the
// schedule), so results are bit-identical for any number of threads. Extra memory: the
// accumulators (at most kAccBudget bytes beyond the first) and per-thread block scratch.
#pragma once  // per translation unit

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "api/sdpa_backward_params.h"
#include "kernels/attention-inl.h"
#include "kernels/mask_summary-inl.h"
#include "kernels/online_softmax-inl.h"
#include "kernels/parallel-inl.h"
#include "kernels/row_bias-inl.h"
#include "simd/convert-inl.h"
#include "simd/math-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {
namespace grad {

// Query rows per block (all heads of a GQA group together) and keys per block. 256 keys
// rather than 128 halve the per-pair work that scales with the rows (their q, dO, lse and
// delta loaded and packed, dQ in and out, setup_task_rows) against the same products.
constexpr int64_t kBlockRows = 64;
constexpr int64_t kBlockKeys = 256;
// Tasks a call is cut into at least, when its (batch, kv head) pairs are fewer, and the
// bytes the extra dQ accumulators may take (the chunks of one long head: at Lq = 32768,
// E = 64, float32, one accumulator is 8 MiB). Each chunk past the first costs an
// accumulator zeroed and summed (4-5 % of a 1x8 1024^2 backward at 2 chunks per head), so
// 8 tasks, enough for a few threads: 8 heads take one chunk each.
constexpr int64_t kTargetTasks = 8;
constexpr int64_t kAccBudget = int64_t(40) << 20;
// dK and dV of at least this many bytes in all are written out with non-temporal stores
// (copy_stream): the lines of a result this large are not in the caches when the kernel
// writes them, and a plain store reads each from memory first. Measured, avx512 one
// thread, 1x8 1024^2 E128 (8 MiB): full 2 %, causal 3 % faster than memcpy.
constexpr int64_t kStreamMinBytes = int64_t(4) << 20;

// How a call is cut (from the shape alone).
struct BwdPlan {
  int64_t group = 1;        // query heads per kv head
  int64_t nq = 1;           // query positions per block (rows = group * nq)
  int64_t rows_pad = 1;     // rows of a block, padded (whole vectors and register tiles)
  int64_t block_k = 1;      // keys per block (whole column tiles)
  int64_t s_ld = 1;         // row stride of the block's scores, dP and tanh (see plan)
  int64_t k_blocks = 0;     // key blocks of a head
  int64_t chunks = 1;       // key chunks per (batch entry, kv head)
  int64_t units = 0;        // batch entries x kv heads
  int64_t ep = 1, evp = 1;  // E and Ev rounded up to whole column tiles
  bool direct = false;      // chunk 0 accumulates dQ in dq itself (ep == E)
  bool stream = false;      // dK and dV are written out with non-temporal stores
};

// Rows of a block padded to whole vectors and register tiles; key columns to whole column
// tiles and register tiles (the key block's rows are the dK/dV products' rows).
template <typename T>
inline constexpr int64_t row_align() {
  return kLanes<T> > kRowTile ? kLanes<T> : kRowTile;
}
template <typename T>
inline constexpr int64_t col_align() {
  return kColTile<T> > kRowTile ? kColTile<T> : kRowTile;
}

template <typename T>
inline BwdPlan plan_backward(const AttnParams& p, int64_t batch) {
  BwdPlan pl;
  constexpr int64_t CT = kColTile<T>;
  pl.group = p.num_heads_q / p.num_heads_kv;
  pl.nq = imax(1, imin(imax(p.len_q, 1), kBlockRows / pl.group));
  pl.rows_pad = round_up(pl.group * pl.nq, row_align<T>());
  pl.block_k = imin(kBlockKeys, round_up(imax(p.len_k, 1), col_align<T>()));
  // One cache line more than the block: dK/dV's tiles read a column of P and dS down the
  // rows, which at a power-of-two stride of 1 KiB map into 4 of L1's 64 sets.
  pl.s_ld = pl.block_k + 64 / int64_t(sizeof(T));
  pl.k_blocks = (p.len_k + pl.block_k - 1) / pl.block_k;
  pl.units = batch * p.num_heads_kv;
  pl.ep = round_up(p.dim_q, CT);
  pl.evp = round_up(imax(p.dim_v, 1), CT);
  pl.direct = pl.ep == p.dim_q;
  int64_t chunks = imax(1, imin(pl.k_blocks, (kTargetTasks + pl.units - 1) / pl.units));
  const int64_t acc_bytes = batch * p.num_heads_q * p.len_q * pl.ep * int64_t(sizeof(T));
  if (chunks > 1 && acc_bytes > 0) chunks = imax(1, imin(chunks, kAccBudget / acc_bytes + 1));
  pl.chunks = chunks;
  pl.stream = batch * p.num_heads_kv * p.len_k * (p.dim_q + p.dim_v) * int64_t(sizeof(T)) >=
              kStreamMinBytes;
  return pl;
}

// Per-thread scratch, sized for one (key block, query block) pair.
template <typename T, typename S>
struct BwdScratch {
  T* kt;     // scale * K^T as panels (pack_keys), widened: the scores' right operand
  T* kp;     // K as panels (pack_values), widened: dQ's right operand
  T* vt;     // V^T panels: dP's right operand
  T* q;      // rows_pad x E: the block's query rows, widened (zero padding rows)
  T* qp;     // q as panels: dK's right operand
  T* go;     // rows_pad x Ev: the block's output-gradient rows
  T* gop;    // go as panels: dV's right operand
  T* s;      // rows_pad x block_k (rows s_ld apart): scores, then P
  T* th;     // rows_pad x block_k: tanh(score / softcap) (softcap only)
  T* dp;     // rows_pad x block_k: dP, then scale * dS
  T* dkb;    // block_k x ep: the key block's dK
  T* dvb;    // block_k x evp: the key block's dV
  T* dqb;    // rows_pad x ep: the query block's dQ rows
  T* lse;    // rows_pad
  T* delta;  // rows_pad
  RowRef<T, S>* rows;
  const S** dout;   // rows_pad: each row's output-gradient row
  uint8_t* zeroed;  // per query block of the task: its dQ rows zeroed yet

  void layout(Arena& a, const AttnParams& p, const BwdPlan& pl) {
    const int64_t E = p.dim_q, Ev = imax(p.dim_v, 1), R = pl.rows_pad, K = pl.block_k;
    kt = a.take<T>(K * E);
    kp = a.take<T>(K * pl.ep);
    vt = a.take<T>(K * Ev);
    q = a.take<T>(R * E);
    qp = a.take<T>(R * pl.ep);
    go = a.take<T>(R * Ev);
    gop = a.take<T>(R * pl.evp);
    s = a.take<T>(R * pl.s_ld);
    th = a.take<T>(R * pl.s_ld);
    dp = a.take<T>(R * pl.s_ld);
    dkb = a.take<T>(K * pl.ep);
    dvb = a.take<T>(K * pl.evp);
    dqb = a.take<T>(R * pl.ep);
    lse = a.take<T>(R);
    delta = a.take<T>(R);
    rows = a.take<RowRef<T, S>>(R);
    dout = a.take<const S*>(R);
    zeroed = a.take<uint8_t>((p.len_q + pl.nq - 1) / pl.nq);
  }
};

// dst[0, n) = src[0, n) widened to T, whole vectors then the tail.
template <typename T, typename S>
inline void widen_row(const S* src, T* dst, int64_t n) {
  constexpr int L = kLanes<T>;
  int64_t e = 0;
  for (; e + L <= n; e += L) vstore(dst + e, vload_wide<T>(src + e));
  for (; e < n; ++e) dst[e] = widen<T>(src[e]);
}

// The right operand of dK = dS^T Q and dV = P^T dO: row r's columns [c, c + kColTile) at
// x + (c / kColTile) * chunk + r * ld. Panels (pack_values, panel_rows rows): ld =
// kColTile, chunk = panel_rows * kColTile; rows read in place (a row's width a whole number
// of column tiles): ld = the row stride, chunk = kColTile.
template <typename T>
struct RowsOperand {
  const T* x;
  int64_t ld, chunk;
};

// pv_tile with p read transposed in place: acc[j, :] += sum_{r < n} p[r * p_ld + j] *
// x[r, :] for the key rows j < nrows of dK and dV (a multiple of kRowTile), dpad columns.
// A tile's R probabilities of one query row are adjacent, so P and dS are multiplied where
// the exp loop left them (no P^T, dS^T). Each element takes its terms in order, one fused
// multiply-add at a time. Never inlined: a whole pass over a key tile's rows per call, and
// GCC's choice of which of pair_block's call sites to inline flipped with unrelated edits
// (inlined, the 4-row remainder tile cost avx2 2x6/3 300x333 E40 4 % of its CPU time).
template <typename T, int R>
[[gnu::noinline]] inline void pvt_rows(const T* p, int64_t p_ld, int64_t n, RowsOperand<T> x,
                                       int64_t dpad, T* acc, int64_t acc_ld) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>, CT = kColTile<T>;
  for (int64_t c = 0; c < dpad; c += CT) {
    const T* panel = x.x + (c / CT) * x.chunk;
    V a[R][2];
    for (int jj = 0; jj < R; ++jj) {
      a[jj][0] = vload(acc + jj * acc_ld + c);
      a[jj][1] = vload(acc + jj * acc_ld + c + L);
    }
    for (int64_t r = 0; r < n; ++r) {
      const V x0 = vload(panel + r * x.ld), x1 = vload(panel + r * x.ld + L);
      const T* pr = p + r * p_ld;
      for (int jj = 0; jj < R; ++jj) {
        a[jj][0] = vfma(vbroadcast(pr[jj]), x0, a[jj][0]);
        a[jj][1] = vfma(vbroadcast(pr[jj]), x1, a[jj][1]);
      }
    }
    for (int jj = 0; jj < R; ++jj) {
      vstore(acc + jj * acc_ld + c, a[jj][0]);
      vstore(acc + jj * acc_ld + c + L, a[jj][1]);
    }
  }
}

// first(j, h): the first row r whose P and dS entries of the key tile [j, j + h) may be
// nonzero (the rows before it are skipped: their products are exact zeros); n: none is.
template <typename T, typename First>
inline void pvt_tile(const T* p, int64_t p_ld, int64_t n, RowsOperand<T> x, int64_t dpad, T* acc,
                     int64_t acc_ld, int64_t nrows, First first) {
  for (int64_t j = 0; j < nrows;) {
    const int R = tile_rows_next<T>(nrows - j);
    const int64_t r0 = first(j, R);
    if (r0 < n) {
      const T* pj = p + r0 * p_ld + j;
      const RowsOperand<T> xr{x.x + r0 * x.ld, x.ld, x.chunk};
      with_tile_rows<T>(R, [&](auto rows) {
        pvt_rows<T, decltype(rows)::value>(pj, p_ld, n - r0, xr, dpad, acc + j * acc_ld, acc_ld);
      });
    }
    j += R;
  }
}

// A pair's register-tile rows (tile_rows_next's cut of its rows) and the columns each
// tile needs: past the last key any of its rows sees (rounded to whole column tiles), every
// weight of the tile is 0, so its scores, dS and products there are skipped. Only when
// the columns grow from tile to tile (a causal diagonal): dK and dV then skip, for each
// key tile, the row tiles before the first whose columns reach it.
constexpr int kMaxTiles = 16;
struct RowTiles {
  int count = 0;
  int64_t row0[kMaxTiles + 1];
  int64_t cols[kMaxTiles];
  int64_t seen[kMaxTiles];  // keys up to the last one the tile's rows see (cols unrounded)
};

// scores_tile for one register tile of h rows over cols columns (whole column tiles) of
// which its rows see the first seen: a last column tile whose second vector none of them
// sees is scored half (its rows' exp loop stops before it, pair_block).
template <typename T>
inline void scores_tile_seen(const T* q, int64_t head_dim, const T* kt, T* s, int64_t s_ld, int h,
                             int64_t cols, int64_t seen) {
  constexpr int CT = kColTile<T>, L = kLanes<T>;
  const int64_t whole = seen <= cols - CT + L ? cols - CT : cols;
  if (whole > 0) scores_tile(q, head_dim, kt, s, s_ld, h, whole);
  if (whole == cols) return;
  const T* panel = kt + (whole / CT) * head_dim * CT;
  with_tile_rows<T>(h, [&](auto rows) {
    scores_rows_col<T, decltype(rows)::value, 1>(q, head_dim, panel, s + whole, s_ld, nullptr);
  });
}

// The pair's row tiles, or false when its tiles all need every column (or too many).
template <typename T, typename S>
inline bool trim_row_tiles(const RowRef<T, S>* rows, int64_t nrows, int64_t R, int64_t kb,
                           int64_t n, int64_t ncols, RowTiles* rt) {
  int64_t r = 0, last = 0;
  bool any_short = false;
  rt->count = 0;
  while (r < R) {
    if (rt->count == kMaxTiles) return false;
    const int h = tile_rows_next<T>(R - r);
    int64_t seen = 0;
    for (int64_t i = r; i < imin(r + h, nrows); ++i)
      if (rows[i].lo < rows[i].hi) seen = imax(seen, imin(rows[i].hi - kb, n));
    const int64_t cols = imin(round_up(seen, col_align<T>()), ncols);
    if (cols < last) return false;
    any_short = any_short || cols < ncols;
    rt->row0[rt->count] = r;
    rt->seen[rt->count] = imin(seen, cols);
    rt->cols[rt->count++] = last = cols;
    r += h;
  }
  rt->row0[rt->count] = R;
  return any_short;
}

// The index of row (batch entry b, query head h, position i) in lse, delta and dq, whose
// heads are q_rows rows apart.
inline int64_t flat_row(const SdpaBackwardParams& bp, int64_t b, int64_t h, int64_t i) {
  const int64_t rows = bp.q_rows ? bp.q_rows : bp.fwd.len_q;
  return (b * bp.fwd.num_heads_q + h) * rows + i;
}

// One pair: the query block (rows sc.rows[0:nrows), their q rows at q (rows E apart), dO
// rows at go (Ev apart), lse and delta loaded) against the key block at kb of n keys (packed
// in sc.kt/kp/vt). Adds into sc.dkb, sc.dvb and the rows' dQ so far at dq (rows ep apart).
template <typename T, typename S>
inline void pair_block(const AttnParams& p, double softcap, const BwdPlan& pl, BwdScratch<T, S>& sc,
                       const T* q, const T* go, RowsOperand<T> qx, RowsOperand<T> gox, T* dq,
                       int64_t nrows, int64_t kb, int64_t n) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  const int64_t E = p.dim_q, Ev = p.dim_v, K = pl.block_k, SL = pl.s_ld;
  const int64_t R = round_up(nrows, row_align<T>());
  const int64_t ncols = round_up(n, col_align<T>());
  const bool capped = softcap > 0;
  const T cap = T(softcap),
          inv_cap =
              T(std::min(1.0 / (capped ? softcap : 1.0), double(std::numeric_limits<T>::max())));
  const T scale = T(p.scale);

  RowTiles rt;
  const bool trim = trim_row_tiles(sc.rows, nrows, R, kb, n, ncols, &rt);
  if (trim) {
    for (int t = 0; t < rt.count; ++t) {
      const int64_t r0 = rt.row0[t], h = rt.row0[t + 1] - r0;
      if (rt.cols[t] == 0) continue;
      const int64_t cols = rt.cols[t], seen = rt.seen[t];
      scores_tile_seen(q + r0 * E, E, sc.kt, sc.s + r0 * SL, SL, int(h), cols, seen);
      scores_tile_seen(go + r0 * imax(Ev, 1), imax(Ev, 1), sc.vt, sc.dp + r0 * SL, SL, int(h), cols,
                       seen);
    }
  } else {
    scores_tile(q, E, sc.kt, sc.s, SL, R, ncols);
    scores_tile(go, imax(Ev, 1), sc.vt, sc.dp, SL, R, ncols);
  }
  int tile = 0;  // the row tile of row r (trim)
  for (int64_t r = 0; r < R; ++r) {
    T* s = sc.s + r * SL;
    T* dp = sc.dp + r * SL;
    const RowRef<T, S>* row = r < nrows ? &sc.rows[r] : nullptr;
    const T lse = r < nrows ? sc.lse[r] : T(0);
    const int64_t jlo = row ? imax(row->lo - kb, 0) : 0, jhi = row ? imin(row->hi - kb, n) : 0;
    if (trim && r == rt.row0[tile + 1]) ++tile;
    // The columns this row's tile computes, and those dK/dV's key tiles may read (a key
    // tile of 6 rows can straddle the end of a column tile: zeros past it).
    const int64_t cols = trim ? rt.cols[tile] : ncols;
    const int64_t read = trim ? imin(cols + col_align<T>(), ncols) : ncols;
    if (!row || jlo >= jhi || lse == -T(__builtin_inf())) {  // no weight in this block
      std::memset(s, 0, size_t(read) * sizeof(T));
      std::memset(dp, 0, size_t(read) * sizeof(T));
      continue;
    }
    // The row's own columns, to the vector holding its last visible key: past them its
    // weights and dS are zeros (as the exp below would leave them), stored as such.
    const int64_t own = imin(cols, round_up(jhi, L));
    if (read > own) {
      std::memset(s + own, 0, size_t(read - own) * sizeof(T));
      std::memset(dp + own, 0, size_t(read - own) * sizeof(T));
    }
    T* th = sc.th + r * SL;
    if (capped)
      for (int64_t j = 0; j < own; j += L) {
        const V t = tanh_approx_vec<T>(vload(s + j) * inv_cap);
        vstore(th + j, t);
        vstore(s + j, cap * t);
      }
    if (row->chunks)
      mask_row_chunked(p, *row, kb, jlo, jhi, 0, own, s);
    else
      mask_row(p, row->fmask, row->bmask, kb, jlo, jhi, own, s);
    if (row->slope) alibi_row_max(*row->slope, kb - row->diag, own, s);
    const T delta = sc.delta[r];
    for (int64_t j = 0; j < own; j += L) {
      const V e = exp2_approx_vec<T>((vload(s + j) - lse) * T(kLog2e));
      V ds = e * (vload(dp + j) - delta);
      if (capped) {
        const V t = vload(th + j);
        ds *= T(1) - t * t;
      }
      ds *= scale;
      vstore(s + j, e);
      vstore(dp + j, e == V{} ? V{} : ds);  // a hidden key's dP (NaN values) stays out
    }
  }
  if (trim) {
    // The first row tile whose columns reach the key tile, then past the rows that see
    // none of its keys (a causal diagonal's upper rows): their P and dS there are zeros.
    const auto first = [&](int64_t j, int h) {
      int64_t r = R;
      for (int t = 0; t < rt.count; ++t)
        if (rt.cols[t] > j) {
          r = rt.row0[t];
          break;
        }
      const int64_t a = kb + j, b = kb + j + h;
      for (; r < nrows; ++r) {
        const RowRef<T, S>& row = sc.rows[r];
        if (row.lo < row.hi && row.lo < b && row.hi > a) return r;
      }
      return R;
    };
    pvt_tile(sc.s, SL, R, gox, pl.evp, sc.dvb, pl.evp, ncols, first);
    pvt_tile(sc.dp, SL, R, qx, pl.ep, sc.dkb, pl.ep, ncols, first);
    // dQ: each row tile's keys up to the last its rows see (dS is 0 past it).
    for (int t = 0; t < rt.count; ++t) {
      const int64_t r0 = rt.row0[t], h = rt.row0[t + 1] - r0, inner = imin(rt.seen[t], n);
      if (inner > 0)
        pv_tile(sc.dp + r0 * SL, SL, inner, sc.kp, K, pl.ep, dq + r0 * pl.ep, pl.ep, h);
    }
  } else {
    const auto first = [](int64_t, int) { return int64_t(0); };
    pvt_tile(sc.s, SL, R, gox, pl.evp, sc.dvb, pl.evp, ncols, first);
    pvt_tile(sc.dp, SL, R, qx, pl.ep, sc.dkb, pl.ep, ncols, first);
    pv_tile(sc.dp, SL, n, sc.kp, K, pl.ep, dq, pl.ep, R);
  }
}

// delta = rowsum(dO * O) for rows [i0, i1) of (batch entry b, query head h), in T.
template <typename T, typename S>
inline void delta_rows(const SdpaBackwardParams& bp, int64_t b, int64_t h, int64_t i0, int64_t i1) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  const AttnParams& p = bp.fwd;
  int64_t coord[kMaxBatchDims];
  for (int64_t d = p.batch_ndim - 1, rest = b; d >= 0; --d) {
    coord[d] = rest % p.batch_shape[d];
    rest /= p.batch_shape[d];
  }
  const S* o = static_cast<const S*>(p.out.data) +
               batch_offset(p.out.batch_stride, coord, p.batch_ndim) + h * p.out.head_stride;
  const S* g = static_cast<const S*>(bp.dout.data) +
               batch_offset(bp.dout.batch_stride, coord, p.batch_ndim) + h * bp.dout.head_stride;
  T* delta = static_cast<T*>(bp.delta) + flat_row(bp, b, h, 0);
  const int64_t Ev = p.dim_v;
  for (int64_t i = i0; i < i1; ++i) {
    const S* orow = o + i * p.out.row_stride;
    const S* grow = g + i * bp.dout.row_stride;
    V acc = V{};
    int64_t e = 0;
    for (; e + L <= Ev; e += L) acc = vfma(vload_wide<T>(grow + e), vload_wide<T>(orow + e), acc);
    T d = reduce_add<T>(acc);
    for (; e < Ev; ++e) d = vfma(widen<T>(grow[e]), widen<T>(orow[e]), d);
    delta[i] = d;
  }
}

// dst[0, n) = src[0, n) through non-temporal stores (vstore_stream) from dst's first
// whole-vector boundary on.
template <typename T>
inline void copy_stream(T* dst, const T* src, int64_t n) {
  constexpr int L = kLanes<T>;
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % sizeof(Vec<T>) != 0; ++i) dst[i] = src[i];
  for (; i + L <= n; i += L) vstore_stream(dst + i, vload(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// Task (unit u = batch entry b, kv head hk; chunk c): every key block of the chunk against
// every query block of the group's heads. acc: the chunk's dQ accumulator of head h0's row 0
// (rows of ep, heads acc_heads rows apart).
template <typename T, typename S>
inline void run_task(const SdpaBackwardParams& bp, const BwdPlan& pl, const MaskSummary& sum,
                     BwdScratch<T, S>& sc, int64_t u, int64_t c, T* acc, int64_t acc_heads) {
  const AttnParams& p = bp.fwd;
  const int64_t E = p.dim_q, Ev = p.dim_v, K = pl.block_k;
  const int64_t b = u / p.num_heads_kv, hk = u % p.num_heads_kv, h0 = hk * pl.group;
  // The chunk's dQ rows are zeroed a query block at a time, just before the block's first
  // pair (its rows then come into cache once, for the pair, rather than in a pass of their
  // own over the whole head first), and the blocks no pair reached at the end; with one
  // chunk per head (the task owns the rows) their delta is computed there too.
  const int64_t q_blocks = (p.len_q + pl.nq - 1) / pl.nq;
  std::memset(sc.zeroed, 0, size_t(q_blocks));
  const auto start_block = [&](int64_t i0) {
    const int64_t nq = imin(pl.nq, p.len_q - i0);
    for (int64_t h = 0; h < pl.group; ++h) {
      std::memset(acc + (h * acc_heads + i0) * pl.ep, 0, size_t(nq * pl.ep) * sizeof(T));
      if (pl.chunks == 1) delta_rows<T, S>(bp, b, h0 + h, i0, i0 + nq);
    }
    sc.zeroed[i0 / pl.nq] = 1;
  };
  const int64_t key_rows = bp.k_rows ? bp.k_rows : p.len_k;
  T* dk = static_cast<T*>(bp.dk) + (b * p.num_heads_kv + hk) * key_rows * E;
  T* dv = static_cast<T*>(bp.dv) + (b * p.num_heads_kv + hk) * key_rows * Ev;
  const T* lse_all = static_cast<const T*>(p.lse);
  const T* delta_all = static_cast<const T*>(bp.delta);
  const T scale = T(p.scale);
  TaskRefs<S> refs;
  for (int64_t kbi = c; kbi < pl.k_blocks; kbi += pl.chunks) {
    const int64_t kb = kbi * K, n = imin(K, p.len_k - kb), ncols = round_up(n, col_align<T>());
    bool packed = false;
    std::memset(sc.dkb, 0, size_t(ncols * pl.ep) * sizeof(T));
    std::memset(sc.dvb, 0, size_t(ncols * pl.evp) * sizeof(T));
    for (int64_t i0 = 0; i0 < p.len_q; i0 += pl.nq) {
      TaskCoord tc;
      tc.b = b;
      tc.h0 = h0;
      tc.heads = pl.group;
      tc.hk = hk;
      tc.i0 = i0;
      tc.nq = imin(pl.nq, p.len_q - i0);
      int64_t klo, khi;
      setup_task_rows(p, tc, 0, p.len_k, &refs, sc.rows, &klo, &khi);
      if (sum.data) narrow_task_rows(p, sum, tc, refs.coord, sc.rows, &klo, &khi);
      const int64_t nrows = tc.heads * tc.nq;
      // The block's keys up to the last one a row sees (a causal diagonal's upper rows see
      // few): the columns past it are neither scored nor multiplied (their weights would be
      // exactly 0 and add nothing).
      int64_t seen = 0;
      for (int64_t r = 0; r < nrows; ++r) {
        const RowRef<T, S>& row = sc.rows[r];
        if (row.lo < row.hi && row.lo < kb + n && row.hi > kb)
          seen = imax(seen, imin(row.hi, kb + n) - kb);
      }
      if (seen == 0) continue;
      if (sum.data) {  // chunks the mask hides from every row of the block: skipped
        int64_t seg_a[kBlockKeys / kChunk + 2], seg_b[kBlockKeys / kChunk + 2];
        if (visible_segments(sc.rows, 0, nrows, kb, 0, n, seg_a, seg_b) == 0) continue;
      }
      if (!packed) {  // the key block, once per block
        const S* k = refs.k + kb * p.k.row_stride;
        pack_keys<T, S>(k, p.k.row_stride, n, ncols, E, sc.kt, nullptr, scale);  // scale * K^T
        pack_values<T, S>(k, p.k.row_stride, n, E, K, sc.kp);
        pack_keys<T, S>(refs.v + kb * p.v.row_stride, p.v.row_stride, n, ncols, imax(Ev, 1), sc.vt);
        packed = true;
      }
      // The query block: q, dO, lse, delta, dQ so far; padding rows zero. A whole block of
      // one head (rows == R) whose float rows lie packed in the arrays is read in place, and
      // its dQ accumulated in place (the accumulator's rows of a head are ep apart): no
      // copies in and out per pair.
      if (!sc.zeroed[i0 / pl.nq]) start_block(i0);
      const int64_t R = round_up(nrows, row_align<T>());
      const bool one_head = pl.group == 1 && nrows == R;
      const S* dout_b = static_cast<const S*>(bp.dout.data) +
                        batch_offset(bp.dout.batch_stride, refs.coord, p.batch_ndim);
      const S* dout_0 = dout_b + h0 * bp.dout.head_stride + i0 * bp.dout.row_stride;
      const T* qrows = sc.q;
      const T* gorows = sc.go;
      T* dqrows = one_head ? acc + i0 * pl.ep : sc.dqb;
      if constexpr (std::is_same_v<S, T>) {
        if (one_head && E > 0 && p.q.row_stride == E) qrows = sc.rows[0].q;
        if (one_head && Ev > 0 && bp.dout.row_stride == Ev) gorows = dout_0;
      }
      for (int64_t r = 0; r < nrows; ++r) {
        const int64_t h = h0 + r / tc.nq, i = i0 + r % tc.nq;
        if (qrows == sc.q) widen_row(sc.rows[r].q, sc.q + r * E, E);
        if (gorows == sc.go)
          widen_row(dout_b + h * bp.dout.head_stride + i * bp.dout.row_stride, sc.go + r * Ev, Ev);
        const int64_t fr = flat_row(bp, b, h, i);
        sc.lse[r] = lse_all[fr];
        sc.delta[r] = delta_all[fr];
        if (!one_head)
          std::memcpy(sc.dqb + r * pl.ep, acc + ((h - h0) * acc_heads + i) * pl.ep,
                      size_t(pl.ep) * sizeof(T));
      }
      if (nrows < R) {
        std::memset(sc.q + nrows * E, 0, size_t((R - nrows) * E) * sizeof(T));
        std::memset(sc.go + nrows * Ev, 0, size_t((R - nrows) * Ev) * sizeof(T));
        std::memset(sc.dqb + nrows * pl.ep, 0, size_t((R - nrows) * pl.ep) * sizeof(T));
      }
      // dK's and dV's right operands: the rows themselves where their width is a whole
      // number of column tiles, else panels.
      constexpr int64_t CT = kColTile<T>;
      RowsOperand<T> qx{qrows, E, CT}, gox{gorows, Ev, CT};
      if (pl.ep != E) {
        pack_values<T, T>(qrows, E, R, E, pl.rows_pad, sc.qp);
        qx = {sc.qp, CT, pl.rows_pad * CT};
      }
      if (pl.evp != Ev) {
        pack_values<T, T>(gorows, Ev, R, Ev, pl.rows_pad, sc.gop);
        gox = {sc.gop, CT, pl.rows_pad * CT};
      }
      pair_block<T, S>(p, bp.fwd.softcap, pl, sc, qrows, gorows, qx, gox, dqrows, nrows, kb, seen);
      if (!one_head)
        for (int64_t r = 0; r < nrows; ++r) {
          const int64_t h = h0 + r / tc.nq, i = i0 + r % tc.nq;
          std::memcpy(acc + ((h - h0) * acc_heads + i) * pl.ep, sc.dqb + r * pl.ep,
                      size_t(pl.ep) * sizeof(T));
        }
    }
    if (pl.stream && pl.ep == E && pl.evp == Ev) {  // the block's rows lie packed on both sides
      copy_stream(dk + kb * E, sc.dkb, n * E);
      copy_stream(dv + kb * Ev, sc.dvb, n * Ev);
      stream_fence();
    } else {
      for (int64_t j = 0; j < n; ++j) {
        std::memcpy(dk + (kb + j) * E, sc.dkb + j * pl.ep, size_t(E) * sizeof(T));
        std::memcpy(dv + (kb + j) * Ev, sc.dvb + j * pl.evp, size_t(Ev) * sizeof(T));
      }
    }
  }
  for (int64_t i0 = 0; i0 < p.len_q; i0 += pl.nq)
    if (!sc.zeroed[i0 / pl.nq]) start_block(i0);
}

template <typename T, typename S>
bool sdpa_backward(const SdpaBackwardParams& bp) {
  const AttnParams& p = bp.fwd;
  int64_t batch = 1;
  for (int64_t d = 0; d < p.batch_ndim; ++d) batch *= p.batch_shape[d];
  if (batch == 0 || p.num_heads_q == 0) return true;
  const BwdPlan pl = plan_backward<T>(p, batch);
  const int64_t E = p.dim_q;
  const int64_t rows_total = batch * p.num_heads_q * p.len_q;
  // The chunks' dQ accumulators beyond dq itself (chunk 0's when direct).
  const int64_t extra = pl.chunks - (pl.direct ? 1 : 0);
  T* acc_buf = nullptr;
  if (extra > 0 && rows_total > 0) {
    acc_buf = static_cast<T*>(std::aligned_alloc(
        64, size_t(round_up(extra * rows_total * pl.ep * int64_t(sizeof(T)), 64))));
    if (!acc_buf) return false;
  }
  // Chunk c's accumulator of row (b, h, i), and how far apart its heads' rows are: dq
  // itself (its own row layout, flat_row) or the compact buffer.
  const int64_t dq_heads = bp.q_rows ? bp.q_rows : p.len_q;
  auto acc_row = [&](int64_t c, int64_t b, int64_t h, int64_t i) {
    if (pl.direct && c == 0) return static_cast<T*>(bp.dq) + flat_row(bp, b, h, i) * pl.ep;
    return acc_buf +
           ((c - (pl.direct ? 1 : 0)) * rows_total + (b * p.num_heads_q + h) * p.len_q + i) * pl.ep;
  };
  auto acc_heads = [&](int64_t c) { return pl.direct && c == 0 ? dq_heads : p.len_q; };
  MaskSummary sum;
  summarise_mask<T>(p, &sum);
  bool failed = false;
  const int64_t tasks = pl.units * pl.chunks;
  const int64_t bh = batch * p.num_heads_q;
  const int threads = int(imax(1, imin(p.num_threads, imax(tasks, bh))));
  parallel_region(threads, [&] {
#pragma omp for schedule(static)
    for (int64_t x = 0; x < bh; ++x)  // (one chunk per head: run_task computes delta)
      if (pl.chunks > 1 && p.len_q > 0)
        delta_rows<T, S>(bp, x / p.num_heads_q, x % p.num_heads_q, 0, p.len_q);
    BwdScratch<T, S> sc;
    void* raw = arena_allocate([&](Arena& a) { sc.layout(a, p, pl); });
    if (!raw) {
#pragma omp atomic write
      failed = true;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      if (!raw || interrupted()) continue;
      const int64_t u = t / pl.chunks, c = t % pl.chunks;
      const int64_t b = u / p.num_heads_kv, hk = u % p.num_heads_kv;
      run_task<T, S>(bp, pl, sum, sc, u, c, acc_row(c, b, hk * pl.group, 0), acc_heads(c));
    }
    std::free(raw);
    // dQ: the chunks' accumulators summed in chunk order, row by row.
    if (!(pl.direct && pl.chunks == 1)) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows_total; ++r) {
        if (failed) continue;
        const int64_t bh_ = r / imax(p.len_q, 1), i = r % imax(p.len_q, 1);
        const int64_t b = bh_ / p.num_heads_q, h = bh_ % p.num_heads_q;
        T* out = static_cast<T*>(bp.dq) + flat_row(bp, b, h, i) * E;
        for (int64_t c = 0; c < pl.chunks; ++c) {
          const T* a = acc_row(c, b, h, i);
          if (c == 0) {
            if (!pl.direct) std::memcpy(out, a, size_t(E) * sizeof(T));
          } else {
            for (int64_t e = 0; e < E; ++e) out[e] += a[e];
          }
        }
      }
    }
  });
  release_summary(&sum);
  std::free(acc_buf);
  return !failed;
}

}  // namespace grad

// float32 compute serves float32 arrays and the 16-bit storage types (params.storage).
bool sdpa_backward_f32(const SdpaBackwardParams& params) {
  return with_float_storage(
      params.fwd.storage, [&](auto s) { return grad::sdpa_backward<float, decltype(s)>(params); });
}
bool sdpa_backward_f64(const SdpaBackwardParams& params) {
  return grad::sdpa_backward<double, double>(params);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

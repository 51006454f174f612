// Blocked ("flash") scaled dot-product attention: the (dot scores, online softmax) engine of
// the blocked driver (driver-inl.h), compiled once per ISA in the TU CMake generates for it.
// Everything here lives in that ISA's namespace so no inline code leaks across ISAs; it uses
// no std containers or std templates that could be emitted out of line.
//
// A task (batch entry, kv head with its GQA group of query heads, block of query rows) walks
// the keys its rows may see in blocks, keeping a running row max m, row sum l and an
// unnormalised output accumulator, and normalises once at the end. No Lq x Lk buffer exists
// unless the caller asked for the weights. Two specialisations: tiled (K^T and V packed into
// panels per key block, register-tiled products) and thin (decoding: a few rows, dot
// products straight from the key rows); decode-like calls also split the keys (driver Plan)
// and merge the splits by log-sum-exp.
#pragma once  // per translation unit

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "api/params.h"
#include "kernels/attention-inl.h"
#include "kernels/decode-inl.h"
#include "kernels/driver-inl.h"
#include "kernels/online_softmax-inl.h"
#include "kernels/row_bias-inl.h"
#include "kernels/sdpa_bf16-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// Keys per block: the packed K^T block (head_dim x keys) takes about twice the L1 data
// cache (its panels stream through L1 one column tile at a time; measured best here).
template <typename T>
inline int64_t key_block_size(int64_t head_dim, int64_t l1_bytes) {
  const int64_t keys = 2 * l1_bytes / (head_dim * int64_t(sizeof(T)));
  return imax(kColTile<T>, imin(512, keys / kColTile<T> * kColTile<T>));
}

// Accumulator row width: head_dim_v rounded up to whole register-tile columns.
template <typename T>
inline int64_t padded_dv(int64_t head_dim_v) {
  return round_up(imax(head_dim_v, 1), kColTile<T>);
}

// Runs of visible chunks in one key block (at most 512 keys, key_block_size).
constexpr int64_t kMaxSegments = 512 / kChunk + 1;

// Per-thread scratch, pieces of the driver's arena reused by every task the thread runs.
template <typename T>
struct SdpaScratch {
  T* q = nullptr;   // max_rows x head_dim, pre-scaled
  T* kt = nullptr;  // the key block as K^T panels (see pack_keys), zero-padded
  T* vp = nullptr;  // the value block as panels (see pack_values)
  T* s = nullptr;   // sub_rows x kt_ld, scores then probabilities
  // sub_rows x kt_ld / 2 words: bfloat16 SDPA's probabilities as bfloat16 pairs, written by
  // the exp pass (sdpa_bf16-inl.h); unused by every other kernel.
  uint32_t* pb = nullptr;
  T* acc = nullptr;  // max_rows x padded_dv(head_dim_v), unnormalised output
  T* m = nullptr;    // max_rows running row max
  T* l = nullptr;    // max_rows running row sum
  // The thread's next task's rows, asked for a few lines per epilogue row (SdpaEngine).
  RowPrefetch next;
  // The task's next key block of K and V, asked for during this block's epilogue rows
  // (calls that read ahead only, SdpaEngine).
  RowPrefetch next_block;
  // The task's last key block (and no key splits): the epilogue asks for each row's output
  // lines, to be written, so that finish's stores do not wait for them one row at a time.
  bool out_ahead = false;

  void layout(Arena& a, const SdpaParams& p, const Plan& plan) {
    constexpr int RT = kRowTile;
    const int64_t max_rows = round_up(plan.max_rows, RT);
    const int64_t sub_rows = round_up(imin(kSubRows, plan.max_rows), RT);
    const int64_t E = imax(p.dim_q, 1), dv = padded_dv<T>(p.dim_v), kt_ld = plan.block_k;
    q = a.take<T>(max_rows * E);
    kt = a.take<T>(E * kt_ld);
    vp = a.take<T>(dv * kt_ld);
    s = a.take<T>(sub_rows * kt_ld);
    pb = a.take<uint32_t>(sub_rows * kt_ld / 2);
    acc = a.take<T>(max_rows * dv);
    m = a.take<T>(max_rows);
    l = a.take<T>(max_rows);
  }
};

// Rows [r0, r1) of the task against columns [c0, c1) of the key block that starts at key
// kb_block and holds n_block keys (K^T already packed in sc.kt; V packed on first need).
// c0 is a multiple of kColTile, so column lanes line up with the block's whatever the
// sub-block, and skipped columns are ones no row of the sub-block sees. Only the columns
// of the nseg runs [seg_a, seg_b) (within [c0, c1), starting on kColTile columns; see
// visible_segments) are computed: the others are hidden from every row of the sub-block,
// so their probabilities would be exactly 0.
// ks/vs: the block's int8 key/value scales (null for float K/V).
// Never inlined into SdpaEngine::block: inlined there (GCC did so for AVX-512 once this
// function grew by a few lines), the 8-row P V tile ran out of general registers, kept its
// row pointers in vector registers and moved one back per broadcast, an extra instruction
// on an FMA port each: 1x8 2048x2048 E64 15-20 % slower.
template <typename T, typename S, typename KV, bool kThin>
__attribute__((noinline)) void attend_block(
    const SdpaParams& p, const Plan& plan, SdpaScratch<T>& sc, const RowRef<T, S>* rows, int64_t r0,
    int64_t r1, int64_t kb_block, int64_t n_block, int64_t c0, int64_t c1, const int64_t* seg_a,
    const int64_t* seg_b, int64_t nseg, const KV* k_block, const KV* v_block, const float* ks,
    const float* vs, bool* v_packed, bool* v_finite) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>, CT = kColTile<T>;
  constexpr T kNegInf = -T(__builtin_inf());
  const int64_t E = p.dim_q, Ev = p.dim_v, Eva = padded_dv<T>(Ev);
  const int64_t kt_ld = plan.block_k;
  const int64_t kb = kb_block + c0, n = c1 - c0;  // the keys this sub-block needs
  const int64_t ncols = round_up(n, CT);
  const int64_t nrows = r1 - r0;
  const T* kt = sc.kt + (c0 / CT) * E * CT;
  const KV* vb = v_block + c0 * p.v.row_stride;
  const float* vsb = vs ? vs + c0 : nullptr;
  // Scores, masks and m stay in natural units (online_softmax-inl.h).
  const bool softcap = p.softcap > 0;
  // 1 / softcap held below the dtype's largest: a tiny cap (softcap=1e-40 in float32) would
  // otherwise give inf, and a score of 0 times inf is NaN; scores the clamp shrinks are
  // below 8 / FLT_MAX, where cap * tanh is within the cap of the reference's anyway.
  const T cap = T(p.softcap),
          inv_cap =
              T(std::min(1.0 / (softcap ? p.softcap : 1.0), double(std::numeric_limits<T>::max())));
  // Padded to whole register tiles: every row goes through the same tile code whichever
  // rows share its tile, so its rounding does not depend on how rows fall into tasks.
  const int64_t tile_rows = round_up(nrows, kRowTile);

  // Per register tile of rows, the width of columns it computes: up to the last column any
  // of its rows sees, in whole column tiles (on a causal diagonal the top rows see few
  // keys). Columns past a tile's width are neither scored nor multiplied.
  constexpr int RT = kRowTile;
  int64_t width[kSubRows / RT];
  for (int64_t t = 0; t < tile_rows / RT; ++t) {
    int64_t hi = 0;
    for (int64_t r = t * RT; r < imin(nrows, t * RT + RT); ++r)
      hi = imax(hi, imin(rows[r0 + r].hi - kb, n));
    width[t] = kThin ? ncols : round_up(hi, CT);
  }
  // Run g in local columns: [sa(g), sb(g)) of keys, [sa(g), se(g, w)) of a width-w row.
  auto sa = [&](int64_t g) { return seg_a[g] - c0; };
  auto sb = [&](int64_t g) { return seg_b[g] - c0; };
  auto se = [&](int64_t g, int64_t w) { return imin(round_up(sb(g), CT), w); };
  constexpr bool kDot = kDotBf16<S> && !kThin;  // bfloat16 products (sdpa_bf16-inl.h)
  // Thin: whether the call's K/V are too large to stay cached (decode-inl.h).
  const bool prefetch = kThin && batch_count(p) * p.num_heads_kv * p.len_k * (p.dim_q + p.dim_v) *
                                         int64_t(sizeof(KV)) >=
                                     kPrefetchMinBytes;
  // With nothing to apply to the scores before the softmax (no softcap, mask or ALiBi in
  // the call), the score tiles take each row's max as they store it (tile_max), and a row
  // whose whole width is visible skips the max pass; max is exact, so the result is the
  // same whichever pass takes it.
  const bool fuse_max = !kThin && !softcap && !p.float_mask.data && !p.bool_mask.data &&
                        !p.alibi.data && nseg == 1 && sa(0) == 0;
  T tile_max[kSubRows];
  if (fuse_max)
    for (int64_t r = 0; r < tile_rows; ++r) tile_max[r] = kNegInf;
  for (int64_t g = 0; g < nseg; ++g) {
    if (kThin) {
      scores_group(sc.q + r0 * E, E, k_block + (c0 + sa(g)) * p.k.row_stride, p.k.row_stride,
                   sc.s + sa(g), kt_ld, nrows, sb(g) - sa(g), ks ? ks + c0 + sa(g) : nullptr,
                   prefetch);
    } else {
      // Register tiles of equal width in one call (the micro-kernel picks its row tiles).
      for (int64_t t = 0, t2; t < tile_rows / RT; t = t2) {
        for (t2 = t + 1; t2 < tile_rows / RT && width[t2] == width[t];) ++t2;
        if (se(g, width[t]) <= sa(g)) continue;
        if constexpr (kDot)
          for (int64_t u = t; u < t2; ++u)
            scores_tile_bf16(
                reinterpret_cast<const uint32_t*>(sc.q) + (r0 + u * RT) * ((E + 1) / 2), E,
                reinterpret_cast<const uint32_t*>(sc.kt) + (c0 + sa(g)) * ((E + 1) / 2), T(p.scale),
                sc.s + u * RT * kt_ld + sa(g), kt_ld, RT, se(g, width[u]) - sa(g),
                fuse_max ? tile_max + u * RT : nullptr);
        else
          scores_tile(sc.q + (r0 + t * RT) * E, E, kt + (sa(g) / CT) * E * CT,
                      sc.s + t * RT * kt_ld + sa(g), kt_ld, (t2 - t) * RT, se(g, width[t]) - sa(g),
                      fuse_max ? tile_max + t * RT : nullptr);
      }
    }
  }

  // bfloat16 products: V is packed before the epilogue, so that when every value is finite
  // the exp pass writes P straight as the bfloat16 pairs P V reads (sc.pb, pb_ld words per
  // row) instead of float32 probabilities read back and rounded by a pass of their own.
  if constexpr (kDot) {
    if (!*v_packed) {
      *v_finite = pack_values_bf16(v_block, p.v.row_stride, n_block, Ev, kt_ld,
                                   reinterpret_cast<uint32_t*>(sc.vp));
      *v_packed = true;
    }
  }
  const bool p16 = kDot && *v_finite;
  const int64_t pb_ld = kt_ld / 2;

  // Epilogue per row: softcap, masks and the visible range; the row max; then one pass
  // of exp2 and row sum. All in whole vectors over the tile's width w (its runs).
  for (int64_t r = 0; r < nrows; ++r) {
    const RowRef<T, S>& row = rows[r0 + r];
    T* s = sc.s + r * kt_ld;
    uint16_t* ph = reinterpret_cast<uint16_t*>(sc.pb + r * pb_ld);  // p16: P as bfloat16
    const int64_t w = width[r / RT];
    const int64_t jlo = imax(row.lo - kb, 0), jhi = imin(row.hi - kb, n);
    // Run bounds are read into locals before each loop: vstore is a memcpy, which may
    // alias seg_a/seg_b, so bounds read through them would be reloaded every iteration.
    auto zero = [&] {
      for (int64_t g = 0; g < nseg; ++g) {
        const int64_t a = sa(g), e = se(g, w);
        for (int64_t j = a; j < e; ++j) s[j] = T(0);
        if (p16)
          for (int64_t j = a; j < e; ++j) ph[j] = 0;
      }
    };
    if (jlo >= jhi) {  // this row sees nothing in this block (its weights stay -inf)
      zero();
      continue;
    }
    if (softcap) {
      for (int64_t g = 0; g < nseg; ++g) {
        const int64_t a = sa(g), e = se(g, w);
        for (int64_t j = a; j < e; j += L)
          vstore(s + j, cap * tanh_approx_vec<T>(vload(s + j) * inv_cap));
      }
    }
    // A row that sees its whole width with nothing to apply has its max from the tiles.
    const bool whole = fuse_max && jlo == 0 && jhi >= w && !row.chunks;
    if (row.chunks) {
      for (int64_t g = 0; g < nseg; ++g) mask_row_chunked(p, row, kb, jlo, jhi, sa(g), se(g, w), s);
    } else if (!whole) {  // one run, the whole width (visible_segments)
      mask_row(p, row.fmask, row.bmask, kb, jlo, jhi, w, s);
    }

    // Row max; NaN is left to the exp2 pass to propagate, except in a row whose other
    // scores are all masked, which must give NaN rather than "nothing attended". ALiBi
    // joins this pass (masked keys stay -inf), saving a pass over the row.
    V vmax = V{} + kNegInf;
    for (int64_t g = 0; g < nseg && !whole; ++g) {
      if (row.slope) {
        const V x = alibi_row_max(*row.slope, kb + sa(g) - row.diag, se(g, w) - sa(g), s + sa(g));
        vmax = x > vmax ? x : vmax;
      } else {
        const int64_t a = sa(g), e = se(g, w);
        for (int64_t j = a; j < e; j += L) {
          const V x = vload(s + j);
          vmax = x > vmax ? x : vmax;
        }
      }
    }
    // Keys past jhi keep the -inf the task wrote, and so do the keys between runs.
    if (row.weights)
      for (int64_t g = 0; g < nseg; ++g)
        if (imin(se(g, w), jhi) > sa(g))
          std::memcpy(row.weights + kb + sa(g), s + sa(g),
                      size_t(imin(se(g, w), jhi) - sa(g)) * sizeof(T));
    T mx = whole ? tile_max[r] : reduce_max<T>(vmax);
    if (mx == kNegInf)
      for (int64_t g = 0; g < nseg; ++g)
        for (int64_t j = imax(jlo, sa(g)); j < imin(jhi, se(g, w)); ++j)
          mx = s[j] != s[j] ? s[j] : mx;
    sc.next.step();
    sc.next_block.step();
    if (sc.out_ahead) prefetch_for_write(row.out, p.dim_v * int64_t(sizeof(S)));
    const T m_old = sc.m[r0 + r];
    const T m_new = softmax_new_max(mx, m_old);
    if (m_new == kNegInf) {  // everything so far masked
      zero();
      continue;
    }
    V vsum = V{};
    for (int64_t g = 0; g < nseg; ++g) {
      const int64_t a = sa(g), b = se(g, w);  // locals: vstore may alias seg_a/seg_b
      for (int64_t j = a; j < b; j += L) {
        const V e = softmax_exp_vec<kDot>(vload(s + j), m_new);
        if constexpr (kDot) {
          if (p16)
            store_bf16(ph + j, e);
          else
            vstore(s + j, e);
        } else {
          vstore(s + j, e);
        }
        vsum += e;
      }
    }
    softmax_rescale_add(m_old, m_new, reduce_add<T>(vsum), sc.acc + (r0 + r) * Eva, Ev,
                        &sc.l[r0 + r]);
    sc.m[r0 + r] = m_new;
  }

  // acc += P V run by run: each element still takes its keys in order, one fused
  // multiply-add at a time, and the skipped keys' probabilities are 0.
  T* acc = sc.acc + r0 * Eva;
  if (kThin) {  // straight from the value rows, each read once for the rows (decode-inl.h)
    for (int64_t g = 0; g < nseg; ++g)
      pv_group(sc.s + sa(g), kt_ld, nrows, sb(g) - sa(g), vb + sa(g) * p.v.row_stride,
               p.v.row_stride, Ev, acc, Eva, vsb ? vsb + sa(g) : nullptr, prefetch);
    return;
  }
  // The probabilities of a tile's rows are written up to its width (zeros past each row's
  // last visible key) and the value panels hold n rows.
  // acc += P V, register-tiled over whole (padded) tiles when every value of the block is
  // finite. Otherwise row by row, skipping zero probabilities: a key that is masked, that
  // scores -inf or whose weight underflows must not bring 0 * inf = NaN into the row.
  if (!*v_packed) {  // (bfloat16 products packed V before the epilogue)
    *v_finite = pack_values<T>(v_block, p.v.row_stride, n_block, Ev, kt_ld, sc.vp, vs);
    *v_packed = true;
  }
  // Padding rows of the last register tile go through P V too (their results are dropped):
  // give them zero probabilities rather than what the scratch held.
  if (p16)
    for (int64_t r = nrows; r < tile_rows; ++r)
      std::memset(sc.pb + r * pb_ld, 0, size_t(pb_ld) * sizeof(uint32_t));
  for (int64_t g = 0; g < nseg; ++g) {
    const auto jb_of = [&](int64_t r) { return imin(imin(width[r / RT], n), sb(g)); };
    for (int64_t r = 0, r2; r < tile_rows; r = r2) {
      const int64_t jb = jb_of(r);
      // Register tiles of equal width in one call (float products on finite values).
      for (r2 = r + RT; r2 < tile_rows && *v_finite && !kDot && jb_of(r2) == jb;) r2 += RT;
      if (jb <= sa(g)) continue;
      if (*v_finite) {
        if constexpr (kDot)
          pv_tile_bf16(sc.pb + r * pb_ld + sa(g) / 2, pb_ld, jb - sa(g),
                       reinterpret_cast<const uint32_t*>(sc.vp) + (c0 + sa(g)) / 2 * CT, kt_ld / 2,
                       Eva, acc + r * Eva, Eva);
        else
          pv_tile(sc.s + r * kt_ld + sa(g), kt_ld, jb - sa(g), sc.vp + (c0 + sa(g)) * CT, kt_ld,
                  Eva, acc + r * Eva, Eva, r2 - r);
      } else {
        for (int64_t rr = r; rr < imin(r2, nrows); ++rr)
          pv_row(sc.s + rr * kt_ld + sa(g), jb - sa(g), vb + sa(g) * p.v.row_stride, p.v.row_stride,
                 Ev, acc + rr * Eva, vsb ? vsb + sa(g) : nullptr);
      }
    }
  }
}

// Key splits: per (task, split, row) the Ev accumulators, m and l.
template <typename T>
struct SdpaShared {
  T* partial = nullptr;
};

// The driver's engine (driver-inl.h): dot scores (tiled, or direct when kThin) with softcap
// and the online softmax; splittable over keys. q/k/v/out are stored as S (T itself, or a
// 16-bit float computed in T = float32): q is widened into the pre-scaled scratch, K and V
// as they are packed or read, and out is rounded to S as it is written. K/V stored as KV:
// S itself, or int8 dequantised with their per-key scales as they are packed or read.
template <typename T, typename S, typename KV, bool kThin>
struct SdpaEngine {
  using Params = SdpaParams;
  using Shared = SdpaShared<T>;
  static constexpr bool kSplitKeys = true;
  static constexpr bool kSkipMasked = true;  // reads row.chunks (mask_summary-inl.h)
  const SdpaParams& p;
  const Plan& plan;
  const Shared& sh;
  SdpaScratch<T> sc;
  const float* ks = nullptr;  // the task's int8 key/value scales, per key (null for float)
  const float* vs = nullptr;

  SdpaEngine(const SdpaParams& params, const Plan& pl, const Shared& shared)
      : p(params), plan(pl), sh(shared) {}

  void layout(Arena& a) { sc.layout(a, p, plan); }

  // Reading ahead (driver-inl.h): while a task computes its last key block, its epilogue
  // asks for the thread's next task's first key block of K and V and its query rows (into
  // L2, at most kAheadBytes, K and V first), which otherwise come from memory in loops
  // that do nothing else (packing, the query's scaling). Tiled calls only, and only calls
  // whose q/k/v outgrow the caches (kPrefetchMinBytes, as decoding's prefetch).
  static constexpr bool kPrefetchNext = !kThin;
  static constexpr int64_t kAheadBytes = int64_t(192) << 10;
  int64_t cur_rows = 1;             // the current task's rows (the epilogue rows of its last block)
  int64_t task_hi = 0;              // past the last key any row of the current task sees
  int64_t cur_b = -1, cur_hk = -1;  // the current task's batch entry and kv head
  bool ahead = false;               // whether this call reads ahead (set by run_blocked)

  static bool reads_ahead(const SdpaParams& p, const Plan& plan) {
    const int64_t heads_kv = batch_count(p) * p.num_heads_kv;
    const int64_t bytes = heads_kv * (plan.heads * p.len_q * p.dim_q * int64_t(sizeof(S)) +
                                      p.len_k * (p.dim_q + p.dim_v) * int64_t(sizeof(KV)));
    return bytes >= kPrefetchMinBytes;
  }

  void prefetch_task(const TaskCoord& c) {
    TaskRefs<KV> refs;
    const S* q_b = task_refs<S>(p, c, &refs);
    RowPrefetch& pf = sc.next;
    pf.clear();
    const int64_t keys = imin(plan.block_k, p.len_k);
    const int64_t ks = p.k.row_stride * int64_t(sizeof(KV)),
                  vs = p.v.row_stride * int64_t(sizeof(KV));
    int64_t budget = kAheadBytes;
    const auto add = [&](const void* base, int64_t stride, int64_t bytes, int64_t rows) {
      rows = imax(0, imin(rows, budget / imax(bytes, 1)));
      pf.add(base, stride, bytes, rows);
      budget -= rows * bytes;
    };
    // A next task of the same kv head reads K/V this task just read (in cache still):
    // its query rows, which come from memory, get the budget instead (GQA E128 avx2 one
    // thread: about 1 % less CPU time; otherwise K and V took all 192 KiB and no query row).
    if (c.b != cur_b || c.hk != cur_hk) {
      add(refs.k, ks, p.dim_q * int64_t(sizeof(KV)), keys);
      add(refs.v, vs, p.dim_v * int64_t(sizeof(KV)), keys);
    }
    const int64_t qs = p.q.row_stride * int64_t(sizeof(S)), qrow = p.dim_q * int64_t(sizeof(S));
    const S* q0 = q_b + c.h0 * p.q.head_stride + c.i0 * p.q.row_stride;
    if (c.heads == 1 || (c.nq == p.len_q && p.q.head_stride == p.len_q * p.q.row_stride))
      add(q0, qs, qrow, c.heads * c.nq);  // (the group's rows follow one another)
    else
      for (int64_t h = 0; h < c.heads; ++h) add(q0 + h * p.q.head_stride, qs, qrow, c.nq);
    pf.per_step = imax(1, (pf.lines() + cur_rows - 1) / cur_rows);
  }

  void begin(const TaskView<T, S, KV>& tv) {
    constexpr T kNegInf = -T(__builtin_inf());
    const int64_t E = p.dim_q, Eva = padded_dv<T>(p.dim_v), nrows = tv.nrows;
    sc.next.clear();
    cur_rows = imax(1, nrows);
    cur_b = tv.c.b;
    cur_hk = tv.c.hk;
    const T scale = T(p.scale);
    if constexpr (std::is_same_v<KV, int8_t>) {
      ks = static_cast<const float*>(p.key_scale.data) +
           batch_offset(p.key_scale.batch_stride, tv.refs.coord, p.batch_ndim) +
           tv.c.hk * p.key_scale.head_stride;
      vs = static_cast<const float*>(p.value_scale.data) +
           batch_offset(p.value_scale.batch_stride, tv.refs.coord, p.batch_ndim) +
           tv.c.hk * p.value_scale.head_stride;
    }
    constexpr bool kDot = kDotBf16<S> && !kThin;  // unscaled pairs (sdpa_bf16-inl.h)
    task_hi = 0;
    for (int64_t r = 0; r < nrows; ++r) {
      const RowRef<T, S>& row = tv.rows[r];
      if (row.lo < row.hi) task_hi = imax(task_hi, row.hi);
      sc.m[r] = kNegInf;
      sc.l[r] = T(0);
      if (!kDot)
        for (int64_t e = 0; e < E; ++e) sc.q[r * E + e] = scale * widen<T>(row.q[e]);
      // Weights hold the masked scores (-inf = not attended) until the final lse is known.
      if (row.weights)
        for (int64_t j = tv.key_begin; j < tv.key_end; ++j) row.weights[j] = kNegInf;
    }
    // Rows up to the next whole register tile are padding: zero queries, never read back.
    const int64_t tile_rows = round_up(nrows, kRowTile);
    if constexpr (kDot)
      pack_queries_bf16(tv.rows, nrows, tile_rows, E, reinterpret_cast<uint32_t*>(sc.q));
    else
      std::memset(sc.q + nrows * E, 0, size_t((tile_rows - nrows) * E) * sizeof(T));
    std::memset(sc.acc, 0, size_t(tile_rows * Eva) * sizeof(T));
  }

  // Keys [kb, kb + n), kSubRows rows at a time, each sub-block over only the columns some
  // of its rows see; K^T is packed once per block, V on first need.
  void block(const TaskView<T, S, KV>& tv, int64_t kb, int64_t n) {
    const int64_t ncols = round_up(n, kColTile<T>);
    const KV* k = tv.refs.k + kb * p.k.row_stride;
    const KV* v = tv.refs.v + kb * p.v.row_stride;
    const float* kbs = ks ? ks + kb : nullptr;
    const float* vbs = vs ? vs + kb : nullptr;
    bool packed = false, v_packed = false, v_finite = true;
    sc.out_ahead = !kThin && plan.key_splits == 1 && kb + n >= task_hi;
    sc.next_block.clear();
    if (ahead && kb + n < task_hi) {
      const int64_t keys = imin(plan.block_k, task_hi - (kb + n));
      sc.next_block.add(k + n * p.k.row_stride, p.k.row_stride * int64_t(sizeof(KV)),
                        p.dim_q * int64_t(sizeof(KV)), keys);
      sc.next_block.add(v + n * p.v.row_stride, p.v.row_stride * int64_t(sizeof(KV)),
                        p.dim_v * int64_t(sizeof(KV)), keys);
      sc.next_block.per_step = imax(1, (sc.next_block.lines() + cur_rows - 1) / cur_rows);
    }
    for (int64_t r0 = 0; r0 < tv.nrows; r0 += kSubRows) {
      const int64_t r1 = imin(tv.nrows, r0 + kSubRows);
      int64_t lo_min = kb + n, hi_max = kb;
      for (int64_t r = r0; r < r1; ++r) {
        const RowRef<T, S>& row = tv.rows[r];
        const int64_t lo = imax(row.lo, kb), hi = imin(row.hi, kb + n);
        if (lo < hi) {
          lo_min = imin(lo_min, lo);
          hi_max = imax(hi_max, hi);
        }
      }
      if (lo_min >= hi_max) continue;  // no row of this sub-block sees this key block
      const int64_t c0 = (lo_min - kb) / kColTile<T> * kColTile<T>;
      // The runs of chunks some row of the sub-block sees (all of [c0, c1) without a summary).
      int64_t seg_a[kMaxSegments], seg_b[kMaxSegments];
      const int64_t nseg = visible_segments(tv.rows, r0, r1, kb, c0, hi_max - kb, seg_a, seg_b);
      if (nseg == 0) continue;  // the bool mask hides this whole tile
      if (!kThin && !packed) {
        if constexpr (kDotBf16<S>)
          pack_keys_bf16(k, p.k.row_stride, n, ncols, p.dim_q, reinterpret_cast<uint32_t*>(sc.kt));
        else
          pack_keys<T>(k, p.k.row_stride, n, ncols, p.dim_q, sc.kt, kbs);
        packed = true;
      }
      attend_block<T, S, KV, kThin>(p, plan, sc, tv.rows, r0, r1, kb, n, c0, hi_max - kb, seg_a,
                                    seg_b, nseg, k, v, kbs, vbs, &v_packed, &v_finite);
    }
  }

  // Normalise once (a sink joins the sum first); a row that saw no key gets output 0 and
  // lse -inf (the sink, if it has one).
  void finish(const TaskView<T, S, KV>& tv) {
    const int64_t Ev = p.dim_v, Eva = padded_dv<T>(Ev);
    for (int64_t r = 0; r < tv.nrows; ++r) {
      const RowRef<T, S>& row = tv.rows[r];
      T m = sc.m[r], l = sc.l[r], alpha = T(1);
      const bool empty = (m == -T(__builtin_inf()));
      if (row.sink) fold_sink(*row.sink, &m, &l, &alpha);
      const T inv = empty ? T(0) : alpha / l;  // alpha = 1 without a sink: 1 / l exactly
      if (empty)
        std::fill(row.out, row.out + Ev, narrow<S>(T(0)));
      else
        narrow_scaled(row.out, sc.acc + r * Eva, Ev, inv);
      if (row.lse) *row.lse = lse_of(m, l);
      if (row.weights) finish_weights(row.weights, p.len_k, m, l);
    }
  }

  void save_partial(const TaskView<T, S, KV>& tv, int64_t t, int64_t split) {
    const int64_t Ev = p.dim_v, Eva = padded_dv<T>(Ev);
    T* part = sh.partial + ((t * plan.key_splits + split) * plan.max_rows) * (Ev + 2);
    for (int64_t r = 0; r < tv.nrows; ++r) {
      T* dst = part + r * (Ev + 2);
      std::memcpy(dst, sc.acc + r * Eva, size_t(Ev) * sizeof(T));
      dst[Ev] = sc.m[r];
      dst[Ev + 1] = sc.l[r];
    }
  }

  // The key splits of task t in split order (fixed, so results do not depend on which
  // thread ran which split) -> the normalised output, lse and weights. The output row is
  // summed in the scratch accumulator (in T) and written once.
  void merge(const TaskView<T, S, KV>& tv, int64_t t) {
    constexpr T kNegInf = -T(__builtin_inf());
    const int64_t Ev = p.dim_v;
    const T* part = sh.partial + t * plan.key_splits * plan.max_rows * (Ev + 2);
    const int64_t split_stride = plan.max_rows * (Ev + 2);
    for (int64_t r = 0; r < tv.nrows; ++r) {
      const RowRef<T, S>& row = tv.rows[r];
      T* out = sc.acc;
      T m = kNegInf;
      for (int64_t sp = 0; sp < plan.key_splits; ++sp) {
        const T ms = part[sp * split_stride + r * (Ev + 2) + Ev];
        m = (ms > m || ms != ms) ? ms : m;
      }
      for (int64_t c = 0; c < Ev; ++c) out[c] = T(0);
      T l = 0;
      const bool empty = m == kNegInf;
      if (!empty) {
        for (int64_t sp = 0; sp < plan.key_splits; ++sp) {
          const T* src = part + sp * split_stride + r * (Ev + 2);
          if (src[Ev] == kNegInf) continue;  // this split saw no key of this row
          const T w = softmax_exp(src[Ev], m);
          l = vfma(w, src[Ev + 1], l);
          for (int64_t c = 0; c < Ev; ++c) out[c] = vfma(w, src[c], out[c]);
        }
      }
      T alpha = T(1);  // the sink joins the merged sum, as in finish
      if (row.sink) fold_sink(*row.sink, &m, &l, &alpha);
      narrow_scaled(row.out, out, Ev, empty ? T(1) : alpha / l);  // (empty: out is 0)
      if (row.lse) *row.lse = lse_of(m, l);
      if (row.weights) finish_weights(row.weights, p.len_k, m, l);
    }
  }
};

// The plan: a task is (batch entry, kv head, block of query rows) and covers the rows of
// every query head of the kv head's GQA group, so each packed K^T and V block serves all
// of them. block_q (and so the task count) may follow the thread count (the driver keeps
// results bit-identical); thin and the key splits are fixed by the shape alone, since the
// specialisations round differently. Fills *out for a call of `batch` entries with rows to
// compute; returns whether it is thin.
template <typename T, typename S = T>
inline bool sdpa_plan(const SdpaParams& p, int64_t batch, Plan* out) {
  Plan& plan = *out;
  plan.heads = p.num_heads_q / p.num_heads_kv;
  // bfloat16 K^T panels (sdpa_bf16-inl.h) take half the bytes per key: twice the keys.
  const bool dot = kDotBf16<S> && plan.heads * p.len_q >= kRowTile;
  plan.block_k = key_block_size<T>(dot ? (p.dim_q + 1) / 2 : imax(p.dim_q, 1), p.l1_bytes);
  // Tasks of about kSdpaTaskRows rows (a task packs each K/V block it reads, so larger
  // tasks pack less), fewer when that leaves threads idle. The key splits below follow the
  // count of 256-row tasks, as they were chosen before, which depends on the shape alone.
  const int64_t heads = batch * p.num_heads_kv;
  const int64_t shape_block_q = imax(1, imin(p.len_q, 256 / plan.heads));
  const int64_t shape_tasks = heads * ((p.len_q + shape_block_q - 1) / shape_block_q);
  plan.block_q = imax(1, imin(p.len_q, kSdpaTaskRows / plan.heads));
  while (plan.block_q > 16 &&
         heads * ((p.len_q + plan.block_q - 1) / plan.block_q) < 4 * int64_t(p.num_threads))
    plan.block_q /= 2;
  plan_tasks(p, batch, &plan);
  // Thin: a few rows per task (decoding, a GQA group's heads), no packing (decode-inl.h).
  const bool thin = plan.heads * p.len_q < kThinRows;
  // Few tasks over long key ranges (decoding): split the keys.
  plan.key_splits = 1;
  plan.split_len = imax(p.len_k, 1);
  constexpr int64_t kTargetItems = 32;
  if (shape_tasks < kTargetItems) {
    const int64_t want = (kTargetItems + shape_tasks - 1) / shape_tasks;
    const int64_t most = p.len_k / (4 * plan.block_k);  // at least 4 blocks per split
    const int64_t splits = imin(want, most);
    if (splits > 1) {
      plan.split_len = round_up((p.len_k + splits - 1) / splits, plan.block_k);
      plan.key_splits = (p.len_k + plan.split_len - 1) / plan.split_len;
    }
  }
  return thin;
}

// Returns false if scratch could not be allocated.
template <typename T, typename S, typename KV = S>
bool sdpa_forward(const SdpaParams& p) {
  const int64_t batch = batch_count(p);
  if (batch == 0 || p.num_heads_q == 0 || p.len_q == 0) return true;
  Plan plan;
  const bool thin = sdpa_plan<T, S>(p, batch, &plan);
  SdpaShared<T> sh;
  if (plan.key_splits > 1) {
    const int64_t count = plan.tasks * plan.key_splits * plan.max_rows * (p.dim_v + 2);
    sh.partial =
        static_cast<T*>(std::aligned_alloc(64, size_t(round_up(count * int64_t(sizeof(T)), 64))));
    if (!sh.partial) return false;
  }
  const bool ok = FASTATTN_BOOL_SWITCH(thin, kThin, [&] {
    return FASTATTN_BOOL_SWITCH(plan.key_splits > 1, kSplit, [&] {
      return run_blocked<T, SdpaEngine<T, S, KV, kThin>, kSplit, S, KV>(p, plan, sh);
    });
  });
  std::free(sh.partial);
  return ok;
}

#if !defined(FASTATTN_DPBF16)  // the avx512bf16 TU defines its own entry point
// The softmax's exp2 on an array (whole vectors, then one-lane tail), for the accuracy test.
template <typename T>
void exp2_array(const T* x, T* out, int64_t n) {
  constexpr int L = kLanes<T>;
  int64_t i = 0;
  for (; i + L <= n; i += L) vstore(out + i, exp2_approx_vec<T>(vload(x + i)));
  for (; i < n; ++i) out[i] = exp2_approx(x[i]);
}

void exp2_f32(const float* x, float* out, int64_t n) { exp2_array(x, out, n); }
void exp2_f64(const double* x, double* out, int64_t n) { exp2_array(x, out, n); }

// float32 compute serves float32 arrays, the 16-bit storage types (params.storage) and
// int8 K/V with a float32 query (params.kv_storage).
bool sdpa_forward_f32(const SdpaParams& params) {
  if (params.kv_storage == Storage::kI8) return sdpa_forward<float, float, int8_t>(params);
  return with_float_storage(params.storage,
                            [&](auto s) { return sdpa_forward<float, decltype(s)>(params); });
}
bool sdpa_forward_f64(const SdpaParams& params) { return sdpa_forward<double, double>(params); }
#endif  // !FASTATTN_DPBF16

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

// fastattn.varlen_attention runs this engine over packed sequences; compiled in this TU.
#if !defined(FASTATTN_DPBF16)
#include "kernels/varlen-inl.h"
#endif

// What every attention kernel shares, whatever its score and normaliser: the scratch arena,
// how a task (batch entry, query heads, block of query rows) finds its data and its rows'
// visible keys, the masks applied to a row of scores, and the block micro-kernels: K^T and
// V panels, dot-score tiles, and acc += P V (panels, register tiles or row by row). Per ISA,
// like the SIMD layer it is written in (include only inside a TU that defines FASTATTN_ISA_NS).
#pragma once  // per translation unit

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "api/params.h"
#include "simd/convert-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// Register tiles of the block products: kRowTile query rows x kColTile keys or value
// columns (two vectors). The neon ISA has 32 vector registers: 8 rows give 16 accumulators
// beside the two key (value) vectors and the rows' query values (probabilities), which
// FMLA takes by lane; the x86 ISAs keep 4 rows (8 accumulators).
#if defined(FASTATTN_NEON)
constexpr int kRowTile = 8;
#else
constexpr int kRowTile = 4;
#endif
template <typename T>
constexpr int kColTile = 2 * kLanes<T>;

// Panels of more bytes than this are walked one column tile (chunk) at a time for every
// row tile (scores_tile, pv_tile), so that the panel being read stays in L1 across the row
// tiles instead of streaming from L2 once per row tile.
constexpr int64_t kPanelL1Bytes = 32 << 10;

// A bump allocator over one aligned block: run a layout once with base == nullptr to learn
// the size, then again over the block to hand out the pieces (64-byte aligned each).
struct Arena {
  char* base = nullptr;
  int64_t used = 0;
  template <typename U>
  U* take(int64_t n) {
    U* p = base ? reinterpret_cast<U*>(base + used) : nullptr;
    used += round_up(imax(n, 1) * int64_t(sizeof(U)), 64);
    return p;
  }
};

// Runs layout(Arena&) twice as above; returns the block (std::free it), null if allocation
// failed.
template <typename Layout>
inline void* arena_allocate(Layout&& layout) {
  Arena sizing;
  layout(sizing);
  void* raw = std::aligned_alloc(64, size_t(sizing.used));
  if (!raw) return nullptr;
  Arena a;
  a.base = static_cast<char*>(raw);
  layout(a);
  return raw;
}

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

// Task t of a call cut into (batch entry, group of `heads` consecutive query heads, block of
// block_q query rows), q_blocks per group. Late query blocks come first (a causal mask
// gives them more keys). The heads of a group share kv head hk (heads divides the GQA
// group or equals it).
struct TaskCoord {
  int64_t b, h0, heads, hk, i0, nq;
};

inline TaskCoord task_coord(const AttnParams& p, int64_t t, int64_t heads, int64_t block_q,
                            int64_t q_blocks) {
  TaskCoord c;
  const int64_t groups = p.num_heads_q / heads;
  const int64_t bg = t / q_blocks;
  c.b = bg / groups;
  c.h0 = bg % groups * heads;
  c.heads = heads;
  c.hk = c.h0 / (p.num_heads_q / p.num_heads_kv);
  c.i0 = (q_blocks - 1 - t % q_blocks) * block_q;
  c.nq = imin(block_q, p.len_q - c.i0);
  return c;
}

// One row of a task: a (query head, query position) pair and where its data lives. q and
// out are in the storage type S (the compute type T, or a 16-bit float); the rest in T.
template <typename T, typename S = T>
struct RowRef {
  const S* q;            // query row
  S* out;                // output row
  const uint8_t* bmask;  // bool-mask row (strided by bool_mask.col_stride) or null
  const T* fmask;        // float-mask row (strided by float_mask.col_stride) or null
  T* weights;            // weights row (len_k, contiguous) or null
  T* lse;                // lse element or null
  int64_t lo, hi;        // visible keys [lo, hi), clipped to the task's key range
  const T* sink;         // the head's sink logit or null
  const T* slope;        // the head's ALiBi slope or null
  int64_t diag;          // i + diag_offset: the key at ALiBi distance 0
  // The bool-mask row's chunk bits (mask_summary-inl.h), or null: no summary, or a row
  // whose visible keys are exactly [lo, hi).
  const uint64_t* chunks;
};

// A task's batch entry (coordinates) and kv head (k, v, in their storage type S).
template <typename S>
struct TaskRefs {
  int64_t coord[kMaxBatchDims];
  const S* k;
  const S* v;
};

// Resolves task c: fills refs and rows[0:c.heads * c.nq) (head-major: row r is query head
// h0 + r / nq, position i0 + r % nq) with visible keys clipped to [key_begin, key_end).
// Returns the union of the rows' ranges in *klo, *khi (klo >= khi when no row sees a key).
// Task c's batch coordinates and key/value rows in *refs; returns its batch entry's query
// (head 0, row 0).
template <typename S, typename KV>
inline const S* task_refs(const AttnParams& p, const TaskCoord& c, TaskRefs<KV>* refs) {
  const int64_t bn = p.batch_ndim;
  int64_t* coord = refs->coord;
  for (int64_t d = bn - 1, rest = c.b; d >= 0; --d) {
    coord[d] = rest % p.batch_shape[d];
    rest /= p.batch_shape[d];
  }
  refs->k = static_cast<const KV*>(p.k.data) + batch_offset(p.k.batch_stride, coord, bn) +
            c.hk * p.k.head_stride;
  refs->v = static_cast<const KV*>(p.v.data) + batch_offset(p.v.batch_stride, coord, bn) +
            c.hk * p.v.head_stride;
  return static_cast<const S*>(p.q.data) + batch_offset(p.q.batch_stride, coord, bn);
}

template <typename T, typename S = T, typename KV = S>
inline void setup_task_rows(const AttnParams& p, const TaskCoord& c, int64_t key_begin,
                            int64_t key_end, TaskRefs<KV>* refs, RowRef<T, S>* rows, int64_t* klo,
                            int64_t* khi) {
  const int64_t bn = p.batch_ndim;
  const int64_t* coord = refs->coord;
  const S* q_b = task_refs<S>(p, c, refs);
  S* out_b =
      static_cast<S*>(const_cast<void*>(p.out.data)) + batch_offset(p.out.batch_stride, coord, bn);
  const uint8_t* bmask_b = p.bool_mask.data ? static_cast<const uint8_t*>(p.bool_mask.data) +
                                                  batch_offset(p.bool_mask.batch_stride, coord, bn)
                                            : nullptr;
  const T* fmask_b = p.float_mask.data ? static_cast<const T*>(p.float_mask.data) +
                                             batch_offset(p.float_mask.batch_stride, coord, bn)
                                       : nullptr;
  const int64_t* vlens_b = p.valid_lens.data
                               ? static_cast<const int64_t*>(p.valid_lens.data) +
                                     batch_offset(p.valid_lens.batch_stride, coord, bn)
                               : nullptr;
  const T* sinks_b = p.sinks.data ? static_cast<const T*>(p.sinks.data) +
                                        batch_offset(p.sinks.batch_stride, coord, bn)
                                  : nullptr;
  const T* alibi_b = p.alibi.data ? static_cast<const T*>(p.alibi.data) +
                                        batch_offset(p.alibi.batch_stride, coord, bn)
                                  : nullptr;
  int64_t lo_all = key_end, hi_all = key_begin;
  for (int64_t r = 0; r < c.heads * c.nq; ++r) {
    const int64_t h = c.h0 + r / c.nq, i = c.i0 + r % c.nq;
    RowRef<T, S>& row = rows[r];
    row.q = q_b + h * p.q.head_stride + i * p.q.row_stride;
    row.out = out_b + h * p.out.head_stride + i * p.out.row_stride;
    row.bmask =
        bmask_b ? bmask_b + h * p.bool_mask.head_stride + i * p.bool_mask.row_stride : nullptr;
    row.fmask =
        fmask_b ? fmask_b + h * p.float_mask.head_stride + i * p.float_mask.row_stride : nullptr;
    const int64_t flat_row = (c.b * p.num_heads_q + h) * p.len_q + i;
    row.lse = p.lse ? static_cast<T*>(p.lse) + flat_row : nullptr;
    row.weights = p.weights ? static_cast<T*>(p.weights) + flat_row * p.len_k : nullptr;
    row.sink = sinks_b ? sinks_b + h * p.sinks.head_stride : nullptr;
    row.slope = alibi_b ? alibi_b + h * p.alibi.head_stride : nullptr;
    row.diag = i + p.diag_offset;
    row.chunks = nullptr;
    const int64_t vl =
        vlens_b ? vlens_b[h * p.valid_lens.head_stride + i * p.valid_lens.row_stride] : p.len_k;
    int64_t lo, hi;
    row_key_range(p, i, vl, &lo, &hi);
    row.lo = imax(lo, key_begin);
    row.hi = imax(imin(hi, key_end), row.lo);
    if (row.lo < row.hi) {
      lo_all = imin(lo_all, row.lo);
      hi_all = imax(hi_all, row.hi);
    }
  }
  *klo = lo_all;
  *khi = hi_all;
}

// Masks on one row of scores s[0:ncols) for the keys [kb, kb + ncols) (s[j] is key kb + j):
// s += float_mask, bool-mask holes and keys outside the visible columns [jlo, jhi) become
// -inf. A -inf float entry removes its key as a False bool entry does (its score is never
// added, so a NaN or +inf score there stays out; docs/semantics.md#float-mask).
// fmask/bmask point at the row's first key (strided by their col_stride) or are null.
template <typename T>
inline void mask_row(const AttnParams& p, const T* fmask, const uint8_t* bmask, int64_t kb,
                     int64_t jlo, int64_t jhi, int64_t ncols, T* s) {
  constexpr T kNegInf = -T(__builtin_inf());
  if (fmask) {
    const int64_t cs = p.float_mask.col_stride;
    const T* fm = fmask + kb * cs;
    int64_t j = jlo;
    if (cs == 1) {  // whole vectors: the select would otherwise go entry by entry
      using V = typename VecOf<T>::type;
      constexpr int L = kLanes<T>;
      const V ninf = vbroadcast(kNegInf);
      for (; j + L <= jhi; j += L) {
        const V f = vload(fm + j), x = vload(s + j);
        vstore(s + j, f == ninf ? ninf : x + f);
      }
    }
    for (; j < jhi; ++j) {
      const T f = fm[j * cs];
      s[j] = f == kNegInf ? kNegInf : s[j] + f;
    }
  }
  if (bmask) {
    const int64_t cs = p.bool_mask.col_stride;
    const uint8_t* bm = bmask + kb * cs;
    for (int64_t j = jlo; j < jhi; ++j) s[j] = bm[j * cs] ? s[j] : kNegInf;
  }
  for (int64_t j = 0; j < jlo; ++j) s[j] = kNegInf;
  for (int64_t j = jhi; j < ncols; ++j) s[j] = kNegInf;
}

// ---------------------------------------------------------------------------------------
// Dot scores and acc += P V over one key block

// Keys [kb, kb + n) as K^T panels: column tile c (kColTile keys) is a contiguous
// head_dim x kColTile block, so the score micro-kernel streams it. Zero-padded to ncols.
// Keys stored in a narrower type S are widened here, once per block; int8 keys are
// dequantised with their scales (scale[j] for key j; null for float keys). mul: every
// key entry is multiplied by it as it is packed, mul * k rounded once (the backward's
// scale * K^T; 1, no multiplication, elsewhere).
template <typename T, typename S = T>
inline void pack_keys(const S* k, int64_t row_stride, int64_t n, int64_t ncols, int64_t head_dim,
                      T* kt, const float* scale = nullptr, T mul = T(1)) {
  constexpr int CT = kColTile<T>, L = kLanes<T>;
  using V = typename VecOf<T>::type;
  const bool scaled = mul != T(1);
  const V vmul = vbroadcast(mul);
  // Key j's element e as the compute type (widened; an int8 key dequantised; times mul).
  const auto elem = [&](int64_t j, int64_t e) {
    T x = widen<T>(k[j * row_stride + e]);
    if constexpr (std::is_same_v<S, int8_t>) x = T(x * T(scale[j]));
    return scaled ? T(x * mul) : x;
  };
  // Whole groups of L keys (never across a column tile: CT = 2L) by whole vectors of
  // head_dim: L key rows read as vectors (widened, scaled) and transposed in registers, so
  // each store writes L keys; the rest element by element below.
  int64_t j0 = 0;
  if constexpr (L > 1) {
    const int64_t e_whole = head_dim / L * L;
    for (; j0 + L <= n; j0 += L) {
      T* dst = kt + (j0 / CT) * head_dim * CT + (j0 % CT);
      for (int64_t e = 0; e < e_whole; e += L) {
        V r[L];
        for (int i = 0; i < L; ++i) {
          r[i] = vload_wide<T>(k + (j0 + i) * row_stride + e);
          if constexpr (std::is_same_v<S, int8_t>) r[i] *= vbroadcast(T(scale[j0 + i]));
          if (scaled) r[i] *= vmul;
        }
        transpose_lanes<T>(r);
        for (int i = 0; i < L; ++i) vstore(dst + (e + i) * CT, r[i]);
      }
      for (int64_t e = e_whole; e < head_dim; ++e)
        for (int i = 0; i < L; ++i) dst[e * CT + i] = elem(j0 + i, e);
    }
  }
  for (int64_t j = j0; j < ncols; ++j) {
    T* dst = kt + (j / CT) * head_dim * CT + (j % CT);
    if (j < n) {
      int64_t e = 0;
      if constexpr (!std::is_same_v<S, T>) {
        // A narrower key row is widened a whole vector at a time (one conversion
        // instruction where the ISA has one, not one per element), then scattered.
        for (; e + L <= head_dim; e += L) {
          V x = vload_wide<T>(k + j * row_stride + e);
          if constexpr (std::is_same_v<S, int8_t>) x *= vbroadcast(T(scale[j]));
          if (scaled) x *= vmul;
          T lanes[L];
          vstore(lanes, x);
          for (int i = 0; i < L; ++i) dst[(e + i) * CT] = lanes[i];
        }
      }
      for (; e < head_dim; ++e) dst[e * CT] = elem(j, e);
    } else {
      for (int64_t e = 0; e < head_dim; ++e) dst[e * CT] = T(0);
    }
  }
}

// Values [kb, kb + n) as panels: column chunk c (kColTile of the head_dim_v columns; the
// last chunk zero-padded) is a contiguous n x kColTile block for the P V micro-kernel.
// Returns whether every value of the block is finite: only then may P V multiply a zero
// probability by a value (0 * inf = NaN otherwise). Values stored in a narrower type S are
// widened here; int8 values dequantised with their scales (as pack_keys).
template <typename T, typename S = T>
inline bool pack_values(const S* v, int64_t row_stride, int64_t n, int64_t head_dim_v,
                        int64_t panel_rows, T* vp, const float* scale = nullptr) {
  using V = typename VecOf<T>::type;
  constexpr int CT = kColTile<T>, L = kLanes<T>;
  V bad = V{};  // NaN in a lane once an inf or NaN went through it
  const int64_t whole = head_dim_v / CT * CT;
  for (int64_t c = 0; c < whole; c += CT) {
    T* dst = vp + (c / CT) * panel_rows * CT;
    for (int64_t j = 0; j < n; ++j) {
      V a = vload_wide<T>(v + j * row_stride + c), b = vload_wide<T>(v + j * row_stride + c + L);
      if constexpr (std::is_same_v<S, int8_t>) {
        a *= vbroadcast(T(scale[j]));
        b *= vbroadcast(T(scale[j]));
      }
      vstore(dst + j * CT, a);
      vstore(dst + j * CT + L, b);
      bad += (a - a) + (b - b);
    }
  }
  T bad_tail = T(0);
  if (whole < head_dim_v) {
    T* dst = vp + (whole / CT) * panel_rows * CT;
    const int64_t w = head_dim_v - whole;
    for (int64_t j = 0; j < n; ++j) {
      const S* src = v + j * row_stride + whole;
      T* d = dst + j * CT;
      for (int64_t c = 0; c < w; ++c) {
        d[c] = widen<T>(src[c]);
        if constexpr (std::is_same_v<S, int8_t>) d[c] *= scale[j];
        bad_tail += d[c] - d[c];
      }
      for (int64_t c = w; c < CT; ++c) d[c] = T(0);
    }
  }
  bool finite = bad_tail == T(0);
  for (int lane = 0; lane < L; ++lane) finite = finite && bad[lane] == T(0);
  return finite;
}

// The score and P V micro-kernels below run register tiles of R rows x kColTile columns
// (two vectors), R fused multiply-add chains per column vector. Rows are padded to
// kRowTile (4); a call's rows are cut into tiles by tile_rows_next. Every element still
// takes its terms in order, one fused multiply-add at a time, so the tile shape changes
// no bit.
//
// The loops over head_dim (scores) and keys (P V) are unrolled 4 times: one pointer step
// and one compare-and-branch per 4 * 2R fused multiply-adds instead of per 2R, which
// otherwise now and then take a slot of an FMA port (measured, one thread, avx2: GQA
// 32/8 1024^2 E128 1-1.5 % less CPU time, 4x12 512^2 E64 1 %; avx512 no slower).
//
// AVX2 (16 ymm registers, no embedded broadcast): tiles of 6 rows where the rows allow,
// 12 accumulators + 2 column vectors + 1 broadcast. The 4-row tile's 8 accumulators only
// just cover two FMA ports of latency 4, so every broadcast, load or loop step that
// delays an FMA left a port idle; 12 chains leave slack, and a tile's 8 loads per 12
// FMAs fit two load ports.
// AVX-512 (32 zmm registers): tiles of 8 rows, 16 accumulators + 2 column vectors + 1
// broadcast, for the same slack (GCC issues each row's broadcast as its own vbroadcastss,
// so 10 loads per 16 FMAs); a call's rows, whole 4-row tiles, are cut 8 at a time and a
// last 4.
template <typename T>
constexpr int kWideRowTile = kVecBytes<T> == 32   ? 6
                             : kVecBytes<T> == 64 ? 8
                                                  : kRowTile;

// Rows of the next tile of a call's nrows (a multiple of kRowTile) with `left` rows still
// to do: kWideRowTile while what remains can still be cut into tiles, else kRowTile
// (left = 4 or 8 after 6-row tiles never leaves 2; 8-row tiles leave 0 or 4).
template <typename T>
inline int tile_rows_next(int64_t left) {
  if constexpr (kWideRowTile<T> != kRowTile)
    if (left >= kWideRowTile<T> && (kWideRowTile<T> % kRowTile == 0 || (left != 4 && left != 8)))
      return kWideRowTile<T>;
  return kRowTile;
}

// f(std::integral_constant<int, rows>{}) for a register tile of `rows` rows, kRowTile or
// kWideRowTile<T> (tile_rows_next's cut): the one place a tile's row count becomes the
// template argument of its micro-kernel.
template <typename T, typename F>
inline void with_tile_rows(int rows, F&& f) {
  if (rows == kRowTile)
    f(std::integral_constant<int, kRowTile>());
  else
    f(std::integral_constant<int, kWideRowTile<T>>());
}

// AVX-512 (float32 and float64): key (value) columns in groups of 3 vectors, one and a half
// column tiles: 8 rows x 3 vectors = 24 accumulators + 3 column vectors + 1 broadcast,
// 11 loads per 24 FMAs instead of 10 per 16. Measured, one thread, machine loaded: hot in
// L1, float32, % of the register-only FMA peak (min of 25 rounds), scores E64 78.8 -> 83.2,
// E128 80.0 -> 86.2, P V (192 keys) E64 86.7 -> 91.2, E128 84.2 -> 86.7 (6 rows x 4
// vectors: scores about as fast, P V not faster; 12 x 2, 9 x 3, 7 x 4, 5 x 4 slower);
// forward 1x8 1024^2 E128 -3.6 %, GQA 32/8 E128 -4 %, E64 -2.6 %. Elsewhere groups of 2,
// whole column tiles.
template <typename T>
constexpr int kColGroup = kVecBytes<T> == 64 ? 3 : 2;

// Vectors of the next column group with `left` vectors (an even number) still to do:
// kColGroup unless that would leave one vector alone (left = 4 gives 2 + 2). A group of 2
// then always starts a column tile.
template <typename T>
inline int col_group_next(int64_t left) {
  if constexpr (kColGroup<T> == 3)
    if (left >= 3 && left != 4) return 3;
  return 2;
}

// Scores of NV vectors of key columns for R rows: vectors H .. H + NV - 1 of the K^T panels
// from `panel` on (vector u: panel u / 2, half u % 2); NV = 2, H = 0: one column tile;
// NV = 1: its first half (a tile whose second half no row sees, sdpa_backward); NV = 3:
// a column group (kColGroup). Each element's terms in the same order whatever the shape.
// vm (optional): the R rows' running max vectors, NaN ignored.
template <typename T, int R, int NV = 2, int H = 0>
inline void scores_rows_col(const T* q, int64_t head_dim, const T* panel, T* s, int64_t s_ld,
                            typename VecOf<T>::type* vm) {
  static_assert(NV >= 1 && NV <= 3 && (H == 0 || NV == 3), "a column tile or group");
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>, CT = kColTile<T>;
  const T* col[NV];
  for (int u = 0; u < NV; ++u) col[u] = panel + (H + u) / 2 * head_dim * CT + (H + u) % 2 * L;
  V acc[R][NV] = {};
#pragma GCC unroll 4  // (see above)
  for (int64_t e = 0; e < head_dim; ++e) {
    V k[NV];
    for (int u = 0; u < NV; ++u) k[u] = vload(col[u] + e * CT);
    for (int rr = 0; rr < R; ++rr) {
      const T qv = q[rr * head_dim + e];
      for (int u = 0; u < NV; ++u) acc[rr][u] = vfma(vbroadcast(qv), k[u], acc[rr][u]);
    }
  }
  for (int rr = 0; rr < R; ++rr) {
    for (int u = 0; u < NV; ++u) vstore(s + rr * s_ld + u * L, acc[rr][u]);
    if (vm)
      for (int u = 0; u < NV; ++u) vm[rr] = acc[rr][u] > vm[rr] ? acc[rr][u] : vm[rr];
  }
}

// scores_rows_col for the column group of nv vectors (col_group_next) from vector v of the
// K^T panels at kt; s: the rows' first column.
template <typename T, int R>
inline void scores_rows_group(const T* q, int64_t head_dim, const T* kt, int64_t v, int nv, T* s,
                              int64_t s_ld, typename VecOf<T>::type* vm) {
  constexpr int L = kLanes<T>, CT = kColTile<T>;
  const T* panel = kt + v / 2 * head_dim * CT;
  if constexpr (kColGroup<T> == 3)
    if (nv == 3) {
      if (v % 2)
        scores_rows_col<T, R, 3, 1>(q, head_dim, panel, s + v * L, s_ld, vm);
      else
        scores_rows_col<T, R, 3, 0>(q, head_dim, panel, s + v * L, s_ld, vm);
      return;
    }
  scores_rows_col<T, R>(q, head_dim, panel, s + v * L, s_ld, vm);
}

// scores_tile for R rows: scores_rows_col over the column groups, the rows' max in vectors
// until the end.
template <typename T, int R>
inline void scores_rows(const T* q, int64_t head_dim, const T* kt, T* s, int64_t s_ld,
                        int64_t ncols, T* rmax) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  V vm[R];
  for (int rr = 0; rr < R; ++rr) vm[rr] = V{} - T(__builtin_inf());
  for (int64_t v = 0, nv; v < ncols / L; v += nv) {
    nv = col_group_next<T>(ncols / L - v);
    scores_rows_group<T, R>(q, head_dim, kt, v, int(nv), s, s_ld, rmax ? vm : nullptr);
  }
  if (rmax)
    for (int rr = 0; rr < R; ++rr) {
      const T m = reduce_max<T>(vm[rr]);
      rmax[rr] = m > rmax[rr] ? m : rmax[rr];
    }
}

// s[r, 0:ncols) = q[r, :] . K^T[:, 0:ncols) for r < nrows, from K^T panels (pack_keys);
// nrows is a multiple of kRowTile (rows are padded) and ncols of kColTile, so the
// register tile needs no tail. rmax (optional): rmax[r] = the larger of rmax[r] and the
// row's largest score, NaN ignored, taken from the registers (the softmax's max pass
// without reading the row back).
template <typename T>
inline void scores_tile(const T* q, int64_t head_dim, const T* kt, T* s, int64_t s_ld,
                        int64_t nrows, int64_t ncols, T* rmax = nullptr) {
  // Large K^T blocks: column tile outer, the rows' max in vectors until the end (bit-identical:
  // every element still takes its terms in order). Measured, avx2 one thread: encoder 4x12
  // 512x512 E64 -4 to -7 %, 1x8 2048x2048 E64 -3 to -4 % (with pv_tile's order below).
  if (head_dim * ncols * int64_t(sizeof(T)) > kPanelL1Bytes) {
    using V = typename VecOf<T>::type;
    constexpr int L = kLanes<T>;
    for (int64_t g0 = 0; g0 < nrows; g0 += 64) {
      const int64_t gn = imin(64, nrows - g0);
      V vm[64];
      if (rmax)
        for (int64_t i = 0; i < gn; ++i) vm[i] = V{} - T(__builtin_inf());
      for (int64_t v = 0, nv; v < ncols / L; v += nv) {
        nv = col_group_next<T>(ncols / L - v);
        for (int64_t r = 0; r < gn;) {
          const int R = tile_rows_next<T>(gn - r);
          V* m = rmax ? vm + r : nullptr;
          with_tile_rows<T>(R, [&](auto rows) {
            scores_rows_group<T, decltype(rows)::value>(q + (g0 + r) * head_dim, head_dim, kt, v,
                                                        int(nv), s + (g0 + r) * s_ld, s_ld, m);
          });
          r += R;
        }
      }
      if (rmax)
        for (int64_t i = 0; i < gn; ++i) {
          const T m = reduce_max<T>(vm[i]);
          rmax[g0 + i] = m > rmax[g0 + i] ? m : rmax[g0 + i];
        }
    }
    return;
  }
  for (int64_t r = 0; r < nrows;) {
    const int R = tile_rows_next<T>(nrows - r);
    T* rm = rmax ? rmax + r : nullptr;
    with_tile_rows<T>(R, [&](auto rows) {
      scores_rows<T, decltype(rows)::value>(q + r * head_dim, head_dim, kt, s + r * s_ld, s_ld,
                                            ncols, rm);
    });
    r += R;
  }
}

// pv_tile for R rows and the NV value column vectors H .. H + NV - 1 of the panels from
// `panel` on (as scores_rows_col); acc: the rows' first column.
template <typename T, int R, int NV = 2, int H = 0>
inline void pv_rows_col(const T* p, int64_t p_ld, int64_t n, const T* panel, int64_t panel_rows,
                        T* acc, int64_t acc_ld) {
  static_assert(NV >= 2 && NV <= 3 && (H == 0 || NV == 3), "a column tile or group");
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>, CT = kColTile<T>;
  const T* col[NV];
  for (int u = 0; u < NV; ++u) col[u] = panel + (H + u) / 2 * panel_rows * CT + (H + u) % 2 * L;
  V a[R][NV];
  for (int rr = 0; rr < R; ++rr)
    for (int u = 0; u < NV; ++u) a[rr][u] = vload(acc + rr * acc_ld + u * L);
#pragma GCC unroll 4  // (see above)
  for (int64_t j = 0; j < n; ++j) {
    V x[NV];
    for (int u = 0; u < NV; ++u) x[u] = vload(col[u] + j * CT);
    for (int rr = 0; rr < R; ++rr) {
      const T pj = p[rr * p_ld + j];
      for (int u = 0; u < NV; ++u) a[rr][u] = vfma(vbroadcast(pj), x[u], a[rr][u]);
    }
  }
  for (int rr = 0; rr < R; ++rr)
    for (int u = 0; u < NV; ++u) vstore(acc + rr * acc_ld + u * L, a[rr][u]);
}

// pv_rows_col for the column group of nv vectors (col_group_next) from vector v of the value
// panels at vp; acc: the rows' first column.
template <typename T, int R>
inline void pv_rows_group(const T* p, int64_t p_ld, int64_t n, const T* vp, int64_t panel_rows,
                          int64_t v, int nv, T* acc, int64_t acc_ld) {
  constexpr int L = kLanes<T>, CT = kColTile<T>;
  const T* panel = vp + v / 2 * panel_rows * CT;
  if constexpr (kColGroup<T> == 3)
    if (nv == 3) {
      if (v % 2)
        pv_rows_col<T, R, 3, 1>(p, p_ld, n, panel, panel_rows, acc + v * L, acc_ld);
      else
        pv_rows_col<T, R, 3, 0>(p, p_ld, n, panel, panel_rows, acc + v * L, acc_ld);
      return;
    }
  pv_rows_col<T, R>(p, p_ld, n, panel, panel_rows, acc + v * L, acc_ld);
}

// pv_tile for R rows.
template <typename T, int R>
inline void pv_rows(const T* p, int64_t p_ld, int64_t n, const T* vp, int64_t panel_rows,
                    int64_t dv_pad, T* acc, int64_t acc_ld) {
  constexpr int L = kLanes<T>;
  for (int64_t v = 0, nv; v < dv_pad / L; v += nv) {
    nv = col_group_next<T>(dv_pad / L - v);
    pv_rows_group<T, R>(p, p_ld, n, vp, panel_rows, v, int(nv), acc, acc_ld);
  }
}

// acc[r, :] += sum_j p[r, j] * v[j, :] for r < nrows (a multiple of kRowTile), multiplying
// every probability (so only for a block whose values are all finite), over the value
// panels (pack_values) and the padded width dv_pad: no column tail, so every row of a tile
// runs the same vector code.
template <typename T>
inline void pv_tile(const T* p, int64_t p_ld, int64_t n, const T* vp, int64_t panel_rows,
                    int64_t dv_pad, T* acc, int64_t acc_ld, int64_t nrows = kRowTile) {
  // Large value blocks: value column group outer (its panels stay in L1 across row tiles).
  if (n * dv_pad * int64_t(sizeof(T)) > kPanelL1Bytes) {
    constexpr int L = kLanes<T>;
    for (int64_t v = 0, nv; v < dv_pad / L; v += nv) {
      nv = col_group_next<T>(dv_pad / L - v);
      for (int64_t r = 0; r < nrows;) {
        const int R = tile_rows_next<T>(nrows - r);
        with_tile_rows<T>(R, [&](auto rows) {
          pv_rows_group<T, decltype(rows)::value>(p + r * p_ld, p_ld, n, vp, panel_rows, v, int(nv),
                                                  acc + r * acc_ld, acc_ld);
        });
        r += R;
      }
    }
    return;
  }
  for (int64_t r = 0; r < nrows;) {
    const int R = tile_rows_next<T>(nrows - r);
    with_tile_rows<T>(R, [&](auto rows) {
      pv_rows<T, decltype(rows)::value>(p + r * p_ld, p_ld, n, vp, panel_rows, dv_pad,
                                        acc + r * acc_ld, acc_ld);
    });
    r += R;
  }
}

constexpr int64_t kSubRows = 64;  // rows per score block (the scratch s is kSubRows x kt_ld)

// Columns [c, c + U * L) of pv_row, the U accumulator vectors held in registers over all
// the keys (no store-to-load chain through acc from one key to the next).
template <typename T, int U, typename S = T>
inline void pv_row_cols(const T* p, int64_t n, const S* v, int64_t v_row_stride, int64_t c, T* acc,
                        const float* scale) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  V a[U];
  for (int u = 0; u < U; ++u) a[u] = vload(acc + c + u * L);
  for (int64_t j = 0; j < n; ++j) {
    if (p[j] == T(0)) continue;
    // An int8 value row's scale folds into its probability.
    T pj = p[j];
    if constexpr (std::is_same_v<S, int8_t>) pj *= scale[j];
    const S* vr = v + j * v_row_stride + c;
    for (int u = 0; u < U; ++u) a[u] = vfma(vbroadcast(pj), vload_wide<T>(vr + u * L), a[u]);
  }
  for (int u = 0; u < U; ++u) vstore(acc + c + u * L, a[u]);
}

// acc[r, :] += sum_j p[r, j] * v[j, :] for one row, skipping p == 0 so that values of
// keys a row does not attend (padding, NaN, or past an underflowed weight) never reach it.
// Each element still sums its keys in order, one fused multiply-add at a time. Values
// stored in a narrower type S are widened as they are read; int8 ones scaled by scale[j]
// (null for float values), folded into the probability.
template <typename T, typename S = T>
inline void pv_row(const T* p, int64_t n, const S* v, int64_t v_row_stride, int64_t dv, T* acc,
                   const float* scale = nullptr) {
  constexpr int L = kLanes<T>;
  int64_t c = 0;
  for (; c + 8 * L <= dv; c += 8 * L) pv_row_cols<T, 8, S>(p, n, v, v_row_stride, c, acc, scale);
  if (c + 4 * L <= dv) {
    pv_row_cols<T, 4, S>(p, n, v, v_row_stride, c, acc, scale);
    c += 4 * L;
  }
  if (c + 2 * L <= dv) {
    pv_row_cols<T, 2, S>(p, n, v, v_row_stride, c, acc, scale);
    c += 2 * L;
  }
  if (c + L <= dv) {
    pv_row_cols<T, 1, S>(p, n, v, v_row_stride, c, acc, scale);
    c += L;
  }
  for (; c < dv; ++c) {
    T a = acc[c];
    for (int64_t j = 0; j < n; ++j)
      if (p[j] != T(0)) {
        T pj = p[j];
        if constexpr (std::is_same_v<S, int8_t>) pj *= scale[j];
        a = vfma(pj, widen<T>(v[j * v_row_stride + c]), a);
      }
    acc[c] = a;
  }
}

// pv_row for kRowTile rows at once, straight from the value rows (any dv, column tail
// included), multiplying every probability: only for rows whose p in [0, n) are all
// nonzero or a block whose values are all finite.
template <typename T>
inline void pv_tile_strided(const T* p, int64_t p_ld, int64_t n, const T* v, int64_t v_row_stride,
                            int64_t dv, T* acc, int64_t acc_ld) {
  using V = typename VecOf<T>::type;
  constexpr int RT = kRowTile, L = kLanes<T>;
  int64_t c = 0;
  for (; c + 2 * L <= dv; c += 2 * L) {
    V a[RT][2];
    for (int rr = 0; rr < RT; ++rr) {
      a[rr][0] = vload(acc + rr * acc_ld + c);
      a[rr][1] = vload(acc + rr * acc_ld + c + L);
    }
    for (int64_t j = 0; j < n; ++j) {
      const V v0 = vload(v + j * v_row_stride + c), v1 = vload(v + j * v_row_stride + c + L);
      for (int rr = 0; rr < RT; ++rr) {
        const T pj = p[rr * p_ld + j];
        a[rr][0] = vfma(vbroadcast(pj), v0, a[rr][0]);
        a[rr][1] = vfma(vbroadcast(pj), v1, a[rr][1]);
      }
    }
    for (int rr = 0; rr < RT; ++rr) {
      vstore(acc + rr * acc_ld + c, a[rr][0]);
      vstore(acc + rr * acc_ld + c + L, a[rr][1]);
    }
  }
  for (; c < dv; ++c) {
    for (int rr = 0; rr < RT; ++rr) {
      T a = acc[rr * acc_ld + c];
      for (int64_t j = 0; j < n; ++j) a = vfma(p[rr * p_ld + j], v[j * v_row_stride + c], a);
      acc[rr * acc_ld + c] = a;
    }
  }
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

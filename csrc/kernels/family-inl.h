// The attention family's score sources and normalisers (additive attention, hardmax/top-k
// attention, Nadaraya-Watson kernel regression; composed as docs/semantics.md#composition
// describes), plugged into the one blocked driver (driver-inl.h) by FamilyEngine. Per ISA,
// included by the kernel sources that use it; everything lives in that ISA's namespace
// (nested in `family`, so nothing collides with the SDPA kernel's helpers); no std
// containers or std templates that could be emitted out of line.
//
// A kernel is a score source and a normaliser:
//   Scores: Shared; Scores(params, shared); layout(Arena&, rows, ld); begin(task);
//           block(task, kb, n, ncols, s, ld) writes s[r * ld + j], r < nrows, j < ncols
//           (ncols: n rounded up to whole column tiles; the padding is masked afterwards);
//   Norm:   Norm(params); layout(Arena&, rows, ld); begin(task); block(task, kb, n, ncols,
//           s, ld) consumes the masked scores; finish(task) writes out (and weights);
//           kWeightsFromScores: whether the weights row holds the masked scores until
//           finish turns them into weights (so a skipped block must write its -inf there).
#pragma once  // per translation unit

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "api/params.h"
#include "kernels/attention-inl.h"
#include "kernels/driver-inl.h"
#include "kernels/online_softmax-inl.h"
#include "kernels/row_bias-inl.h"
#include "simd/convert-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {
namespace family {

template <typename T>
inline T neg_inf() {
  return -T(__builtin_inf());
}
template <typename T>
inline T quiet_nan() {
  return T(__builtin_nan(""));
}

// x[0:n) widened from its storage type S into buf (a 16-bit float: computed in float32), or x
// itself when it is stored as T. A whole vector at a time (one conversion instruction where
// the ISA has one), exactly as widen.
template <typename T, typename S>
inline const T* widened_row(const S* x, int64_t n, T* buf) {
  if constexpr (std::is_same_v<S, T>) {
    return x;
  } else {
    constexpr int L = kLanes<T>;
    int64_t i = 0;
    for (; i + L <= n; i += L) vstore(buf + i, vload_wide<T>(x + i));
    for (; i < n; ++i) buf[i] = widen<T>(x[i]);
    return buf;
  }
}

// out[0:dout) = x[0:din) @ w, w C-contiguous (din, dout); the sum runs over d in order.
template <typename T>
inline void project_row(const T* x, int64_t din, const T* w, int64_t dout, T* out) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  int64_t c = 0;
  for (; c + 4 * L <= dout; c += 4 * L) {
    V a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int64_t d = 0; d < din; ++d) {
      const T xd = x[d];
      const T* wr = w + d * dout + c;
      const V xv = vbroadcast(xd);
      a0 = vfma(xv, vload(wr), a0);
      a1 = vfma(xv, vload(wr + L), a1);
      a2 = vfma(xv, vload(wr + 2 * L), a2);
      a3 = vfma(xv, vload(wr + 3 * L), a3);
    }
    vstore(out + c, a0);
    vstore(out + c + L, a1);
    vstore(out + c + 2 * L, a2);
    vstore(out + c + 3 * L, a3);
  }
  for (; c + L <= dout; c += L) {
    V a = {};
    for (int64_t d = 0; d < din; ++d) a = vfma(vbroadcast(x[d]), vload(w + d * dout + c), a);
    vstore(out + c, a);
  }
  for (; c < dout; ++c) {
    T a = 0;
    for (int64_t d = 0; d < din; ++d) a = vfma(x[d], w[d * dout + c], a);
    out[c] = a;
  }
}

// A task as the driver sets it up (one query head per task here), with per row the
// visible columns of the current key block. S: the storage type of q/k/v/out.
template <typename T, typename S = T>
struct Task : TaskView<T, S, S> {
  int64_t* jlo = nullptr;  // per row, current block: visible columns [jlo, jhi)
  int64_t* jhi = nullptr;
  uint8_t* active = nullptr;  // per row, current block: jlo < jhi
};

// Whether some row of the task sees a key of [kb, kb + n) that its bool mask's summary
// (mask_summary-inl.h) leaves visible; a row without chunk bits sees its whole range.
template <typename T, typename S>
inline bool block_seen(const RowRef<T, S>* rows, int64_t nrows, int64_t kb, int64_t n) {
  for (int64_t r = 0; r < nrows; ++r) {
    const RowRef<T, S>& row = rows[r];
    const int64_t lo = imax(row.lo, kb), hi = imin(row.hi, kb + n);
    if (lo >= hi) continue;
    if (!row.chunks) return true;
    for (int64_t ch = lo / kChunk; ch <= (hi - 1) / kChunk; ++ch)
      if (chunk_bit(row.chunks, ch)) return true;
  }
  return false;
}

// The driver's engine for a score source and a normaliser: score each key block, apply
// the masks, hand the block to the normaliser. Not splittable over keys: the normalisers
// (heaps, kernel sums) keep no state that merges. Reads the bool mask's summary: rows are
// narrowed to the keys it leaves visible and a block no row sees is skipped whole. Exact
// for the normalisers that take masks (softmax, top-k): a hidden key scores -inf, whose
// probability is exactly 0 and which no heap keeps, so skipping it changes nothing else.
// S: the storage type of q/k/v/out (T, or a 16-bit float widened where it is read).
template <typename T, typename Scores, typename Norm, typename S = T>
struct FamilyEngine {
  using Params = FamilyParams;
  using Shared = typename Scores::Shared;
  static constexpr bool kSplitKeys = false;
  static constexpr bool kSkipMasked = true;  // reads row.chunks
  const FamilyParams& p;
  const Plan& plan;
  Scores sc;
  Norm nm;
  Task<T, S> t;
  T* s = nullptr;  // max_rows (rounded up to kRowTile) x block_k scores

  FamilyEngine(const FamilyParams& params, const Plan& pl, const Shared& shared)
      : p(params), plan(pl), sc(params, shared), nm(params) {}

  void layout(Arena& a) {
    const int64_t rows = plan.max_rows, ld = plan.block_k;
    s = a.take<T>(round_up(rows, kRowTile) * ld);  // whole register tiles of rows
    t.jlo = a.take<int64_t>(rows);
    t.jhi = a.take<int64_t>(rows);
    t.active = a.take<uint8_t>(rows);
    sc.layout(a, rows, ld);
    nm.layout(a, rows, ld);
  }

  void begin(const TaskView<T, S, S>& tv) {
    static_cast<TaskView<T, S, S>&>(t) = tv;
    for (int64_t r = 0; r < t.nrows; ++r)
      if (t.rows[r].weights) std::memset(t.rows[r].weights, 0, size_t(p.len_k) * sizeof(T));
    sc.begin(t);
    nm.begin(t);
  }

  void block(const TaskView<T, S, S>&, int64_t kb, int64_t n) {
    const int64_t ld = plan.block_k, ncols = round_up(n, kColTile<T>);
    if (!block_seen(t.rows, t.nrows, kb, n)) {
      // Hidden from every row: where the weights row holds the masked scores, those in the
      // rows' ranges are -inf (a normaliser that writes only its chosen keys' weights
      // leaves the zeros of begin).
      if constexpr (Norm::kWeightsFromScores)
        for (int64_t r = 0; r < t.nrows; ++r) {
          const RowRef<T, S>& row = t.rows[r];
          if (row.weights)
            for (int64_t j = imax(row.lo, kb); j < imin(row.hi, kb + n); ++j)
              row.weights[j] = neg_inf<T>();
        }
      return;
    }
    sc.block(t, kb, n, ncols, s, ld);
    for (int64_t r = 0; r < t.nrows; ++r) {
      T* sr = s + r * ld;
      const RowRef<T, S>& row = t.rows[r];
      const int64_t jlo = imax(row.lo - kb, 0), jhi = imin(row.hi - kb, n);
      t.jlo[r] = jlo;
      t.jhi[r] = jhi;
      t.active[r] = jlo < jhi;
      if (jlo >= jhi) continue;
      if (row.chunks) {  // hidden chunks -inf unread, whole visible chunks without the mask
        mask_row_chunked(p, row, kb, jlo, jhi, 0, ncols, sr);
      } else {
        mask_row(p, row.fmask, row.bmask, kb, jlo, jhi, ncols, sr);
      }
    }
    nm.block(t, kb, n, ncols, s, ld);
  }

  void finish(const TaskView<T, S, S>&) { nm.finish(t); }
};

// Runs a family kernel: tasks of one query head x block_q rows, keys in blocks of block_k
// (rounded to whole column tiles). False if a thread's scratch could not be allocated.
template <typename T, typename Scores, typename Norm, typename S = T>
bool run_family(const FamilyParams& p, const typename Scores::Shared& shared, int64_t block_q,
                int64_t block_k) {
  const int64_t batch = batch_count(p);
  if (batch == 0 || p.num_heads_q == 0 || p.len_q == 0) return true;
  Plan plan;
  plan.heads = 1;
  plan.block_q = imax(1, imin(block_q, p.len_q));
  plan.block_k = round_up(imax(block_k, 1), kColTile<T>);
  plan_tasks(p, batch, &plan);
  return run_blocked<T, FamilyEngine<T, Scores, Norm, S>, false, S, S>(p, plan, shared);
}

// ---------------------------------------------------------------------------------------
// acc += P V

// Whether v[0:n, 0:dv) is all finite (then 0 * v == 0 and zero-skipping is unnecessary).
template <typename T>
inline bool block_finite(const T* v, int64_t n, int64_t v_row_stride, int64_t dv) {
  bool ok = true;
  for (int64_t j = 0; j < n; ++j) {
    const T* vr = v + j * v_row_stride;
    for (int64_t c = 0; c < dv; ++c) ok &= (vr[c] - vr[c] == T(0));  // false for inf, NaN
  }
  return ok;
}

// The value block [kb, kb + n) in T: v itself when stored as T, else widened into buf
// (n x dv, row stride dv) once per block, so that P V runs the compute type's code.
template <typename T, typename S>
inline const T* value_block(const S* v, int64_t row_stride, int64_t n, int64_t dv, T* buf,
                            int64_t* stride) {
  if constexpr (std::is_same_v<S, T>) {
    *stride = row_stride;
    return v;
  } else {
    for (int64_t j = 0; j < n; ++j) widened_row(v + j * row_stride, dv, buf + j * dv);
    *stride = dv;
    return buf;
  }
}

// The scratch value_block needs for a key block of ld keys (none for values stored as T).
template <typename T>
inline T* take_value_block(Arena& a, const FamilyParams& p, int64_t ld) {
  return p.storage == Storage::kCompute ? nullptr : a.take<T>(ld * imax(p.dim_v, 1));
}

// Values per row below which P V runs as dot products over the keys (the value block
// transposed once per block) instead of register tiles over the value columns.
template <typename T>
constexpr int64_t kNarrowValues = 2 * kLanes<T>;

// acc (nrows x dv) += P (nrows x ncols, row stride ld, zero past n) V. Wide values:
// register tiles over row tiles whose probabilities are all nonzero (zeros[r] == 0) or whose
// value block is finite (0 * v is then exactly 0); zero-skipping elsewhere, so that NaN
// values of excluded keys never reach a row. Narrow values (dv < kNarrowValues): vt
// (scratch, kNarrowValues x ld) receives V^T and each row is a few vectorised dot products.
template <typename T>
inline void accumulate_pv(const T* s, int64_t ld, int64_t nrows, int64_t n, int64_t ncols,
                          const int64_t* zeros, const T* v, int64_t v_row_stride, int64_t dv,
                          T* acc, T* vt) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  const bool finite = block_finite(v, n, v_row_stride, dv);
  if (dv < kNarrowValues<T>) {
    if (finite) {
      for (int64_t c = 0; c < dv; ++c) {
        for (int64_t j = 0; j < n; ++j) vt[c * ld + j] = v[j * v_row_stride + c];
        for (int64_t j = n; j < ncols; ++j) vt[c * ld + j] = T(0);
      }
    }
    for (int64_t r = 0; r < nrows; ++r) {
      if (zeros[r] >= n) continue;  // nothing to add
      const T* p = s + r * ld;
      if (!finite) {
        pv_row(p, n, v, v_row_stride, dv, acc + r * dv);
        continue;
      }
      for (int64_t c = 0; c < dv; ++c) {
        V a0 = {}, a1 = {};
        const T* col = vt + c * ld;
        for (int64_t j = 0; j < ncols; j += 2 * L) {
          a0 = vfma(vload(p + j), vload(col + j), a0);
          a1 = vfma(vload(p + j + L), vload(col + j + L), a1);
        }
        acc[r * dv + c] += reduce_add<T>(a0 + a1);
      }
    }
    return;
  }
  int64_t r = 0;
  for (; r + kRowTile <= nrows; r += kRowTile) {
    bool dense = true;
    for (int rr = 0; rr < kRowTile; ++rr) dense = dense && zeros[r + rr] == 0;
    if (dense || finite) {
      pv_tile_strided(s + r * ld, ld, n, v, v_row_stride, dv, acc + r * dv, dv);
    } else {
      for (int rr = 0; rr < kRowTile; ++rr)
        pv_row(s + (r + rr) * ld, n, v, v_row_stride, dv, acc + (r + rr) * dv);
    }
  }
  for (; r < nrows; ++r) pv_row(s + r * ld, n, v, v_row_stride, dv, acc + r * dv);
}

// ---------------------------------------------------------------------------------------
// Normalisers

// Online softmax: running row max m, row sum l, unnormalised output acc; rescale only when
// the max grows; normalise once. A row that saw no key gets `empty` (0 for attention).
template <typename T>
struct OnlineSoftmax {
  static constexpr bool kWeightsFromScores = true;  // block copies the scores; finish maps
  const FamilyParams& p;
  T empty;
  T* m = nullptr;
  T* l = nullptr;
  T* acc = nullptr;
  T* vt = nullptr;
  T* vw = nullptr;  // a widened value block (16-bit values)
  int64_t* zeros = nullptr;

  explicit OnlineSoftmax(const FamilyParams& params, T empty_value = T(0))
      : p(params), empty(empty_value) {}

  void layout(Arena& a, int64_t block_q, int64_t ld) {
    m = a.take<T>(block_q);
    l = a.take<T>(block_q);
    acc = a.take<T>(block_q * imax(p.dim_v, 1));
    vt = a.take<T>(kNarrowValues<T> * ld);
    vw = take_value_block<T>(a, p, ld);
    zeros = a.take<int64_t>(block_q);
  }

  template <typename S>
  void begin(const Task<T, S>& t) {
    for (int64_t r = 0; r < t.nrows; ++r) {
      m[r] = neg_inf<T>();
      l[r] = T(0);
    }
    std::memset(acc, 0, size_t(t.nrows * p.dim_v) * sizeof(T));
  }

  template <typename S>
  void block(const Task<T, S>& t, int64_t kb, int64_t n, int64_t ncols, T* s, int64_t ld) {
    using V = typename VecOf<T>::type;
    constexpr int L = kLanes<T>;
    const T ninf = neg_inf<T>();
    for (int64_t r = 0; r < t.nrows; ++r) {
      T* sr = s + r * ld;
      if (!t.active[r]) {
        for (int64_t j = 0; j < ncols; ++j) sr[j] = T(0);
        zeros[r] = n;
        continue;
      }
      if (t.rows[r].weights)
        std::memcpy(t.rows[r].weights + kb + t.jlo[r], sr + t.jlo[r],
                    size_t(t.jhi[r] - t.jlo[r]) * sizeof(T));
      V vmax = V{} + ninf;
      for (int64_t j = 0; j < ncols; j += L) {
        const V x = vload(sr + j);
        vmax = (x > vmax) | (x != x) ? x : vmax;
      }
      const T mx = reduce_max_nan<T>(vmax);
      const T m_old = m[r];
      const T m_new = softmax_new_max(mx, m_old);
      if (m_new == ninf) {  // everything so far masked
        for (int64_t j = 0; j < ncols; ++j) sr[j] = T(0);
        zeros[r] = n;
        continue;
      }
      V vsum = V{}, vzeros = V{};
      for (int64_t j = 0; j < ncols; j += L) {
        const V e = softmax_exp_vec(vload(sr + j), m_new);
        vstore(sr + j, e);
        vsum += e;
        vzeros += e == T(0) ? V{} + T(1) : V{};
      }
      zeros[r] = int64_t(reduce_add<T>(vzeros)) - (ncols - n);  // padding is always 0
      softmax_rescale_add(m_old, m_new, reduce_add<T>(vsum), acc + r * p.dim_v, p.dim_v, &l[r]);
      m[r] = m_new;
    }
    int64_t vs;
    const T* vb = value_block(t.refs.v + kb * p.v.row_stride, p.v.row_stride, n, p.dim_v, vw, &vs);
    accumulate_pv(s, ld, t.nrows, n, ncols, zeros, vb, vs, p.dim_v, acc, vt);
  }

  template <typename S>
  void finish(const Task<T, S>& t) {
    for (int64_t r = 0; r < t.nrows; ++r) {
      const RowRef<T, S>& row = t.rows[r];
      S* o = row.out;
      const bool is_empty = m[r] == neg_inf<T>();
      T alpha = T(1);  // a sink joins the sum as a key of value 0 (see row_bias-inl.h)
      if (row.sink) fold_sink(*row.sink, &m[r], &l[r], &alpha);
      const T inv = is_empty ? T(0) : alpha / l[r];  // alpha = 1 without a sink: 1 / l exactly
      const T* a = acc + r * p.dim_v;
      if (is_empty)
        std::fill(o, o + p.dim_v, narrow<S>(empty));
      else
        narrow_scaled(o, a, p.dim_v, inv);
      // A NaN row (a NaN or +inf score, a NaN sink, or a NaN `empty`) has NaN weights
      // throughout, as the other kernels and the reference give them.
      const bool nan_row = m[r] != m[r] || l[r] != l[r] || (is_empty && empty != empty);
      if (row.weights && nan_row) {
        T* w = row.weights;
        for (int64_t j = 0; j < p.len_k; ++j) w[j] = quiet_nan<T>();
      } else if (row.weights && row.lo < row.hi) {  // outside [lo, hi): the zeros of begin
        finish_weights(row.weights + row.lo, row.hi - row.lo, m[r], l[r]);
      }
    }
  }
};

// Hardmax / top-k: per row a min-heap of the k best (score, key) pairs seen so far, the
// root being the worst (lowest score; on equal scores the later key). Keys arrive in
// increasing order, so a new key enters only with a strictly higher score than the root:
// ties keep the first keys. Scores of -inf count as masked; a NaN makes the row NaN.
// finish: hardmax puts weight exactly 1 on the best key; top-k takes a softmax over the
// kept scores.
template <typename T>
struct SelectTopK {
  static constexpr bool kWeightsFromScores = false;  // finish writes the chosen keys only
  const FamilyParams& p;
  int64_t k;
  T* hs = nullptr;        // block_q x k scores
  int64_t* hj = nullptr;  // block_q x k keys
  int64_t* hn = nullptr;  // heap sizes
  uint8_t* nan = nullptr;
  T* w = nullptr;  // k weights (finish)
  T* o = nullptr;  // one output row (finish), rounded to the storage type as it is stored

  explicit SelectTopK(const FamilyParams& params)
      : p(params), k(imax(1, params.hardmax ? 1 : params.top_k)) {}

  void layout(Arena& a, int64_t block_q, int64_t) {
    hs = a.take<T>(block_q * k);
    hj = a.take<int64_t>(block_q * k);
    hn = a.take<int64_t>(block_q);
    nan = a.take<uint8_t>(block_q);
    w = a.take<T>(k);
    o = a.take<T>(imax(p.dim_v, 1));
  }

  template <typename S>
  void begin(const Task<T, S>& t) {
    for (int64_t r = 0; r < t.nrows; ++r) {
      hn[r] = 0;
      nan[r] = 0;
    }
  }

  // (sa, ja) is worse than (sb, jb)
  static bool worse(T sa, int64_t ja, T sb, int64_t jb) { return sa < sb || (sa == sb && ja > jb); }

  void offer(T* s, int64_t* j, int64_t& size, T x, int64_t key) const {
    if (size < k) {  // push and sift up
      int64_t c = size++;
      while (c > 0) {
        const int64_t parent = (c - 1) / 2;
        if (!worse(x, key, s[parent], j[parent])) break;
        s[c] = s[parent];
        j[c] = j[parent];
        c = parent;
      }
      s[c] = x;
      j[c] = key;
      return;
    }
    if (!(x > s[0])) return;  // the later key loses ties
    int64_t c = 0;            // replace the root and sift down
    for (;;) {
      const int64_t a = 2 * c + 1, b = a + 1;
      if (a >= size) break;
      int64_t child = a;
      if (b < size && worse(s[b], j[b], s[a], j[a])) child = b;
      if (!worse(s[child], j[child], x, key)) break;
      s[c] = s[child];
      j[c] = j[child];
      c = child;
    }
    s[c] = x;
    j[c] = key;
  }

  template <typename S>
  void block(const Task<T, S>& t, int64_t kb, int64_t, int64_t, T* s, int64_t ld) {
    using V = typename VecOf<T>::type;
    constexpr int L = kLanes<T>;
    const T ninf = neg_inf<T>();
    for (int64_t r = 0; r < t.nrows; ++r) {
      if (!t.active[r] || nan[r]) continue;
      const T* sr = s + r * ld;
      T* rs = hs + r * k;
      int64_t* rj = hj + r * k;
      int64_t size = hn[r];
      int64_t j = t.jlo[r];
      const int64_t jend = t.jhi[r];
      while (j < jend) {
        if (size == k && j + L <= jend) {  // skip whole vectors that cannot enter
          const V x = vload(sr + j);
          const T thr = rs[0];
          bool any = false;
          for (int lane = 0; lane < L; ++lane) any = any || !(x[lane] <= thr);
          if (!any) {
            j += L;
            continue;
          }
        }
        const int64_t stop = imin(jend, j + L);
        for (; j < stop; ++j) {
          const T x = sr[j];
          if (x != x) {
            nan[r] = 1;
            break;
          }
          if (x > ninf) offer(rs, rj, size, x, kb + j);
        }
        if (nan[r]) break;
      }
      hn[r] = size;
    }
  }

  template <typename S>
  void finish(const Task<T, S>& t) {
    const int64_t dv = p.dim_v, Lk = p.len_k;
    for (int64_t r = 0; r < t.nrows; ++r) {
      S* out = t.rows[r].out;
      T* wrow = t.rows[r].weights;
      const T* rs = hs + r * k;
      const int64_t* rj = hj + r * k;
      const int64_t size = hn[r];
      bool bad = nan[r] != 0;
      T sum = 0;
      if (!bad && size > 0 && !p.hardmax) {
        T mx = rs[0];
        for (int64_t e = 1; e < size; ++e) mx = rs[e] > mx ? rs[e] : mx;
        for (int64_t e = 0; e < size; ++e) {
          w[e] = softmax_exp(rs[e], mx);
          sum += w[e];
        }
        bad = sum != sum;  // +inf scores: inf - inf
      }
      if (bad) {
        for (int64_t c = 0; c < dv; ++c) out[c] = narrow<S>(quiet_nan<T>());
        if (wrow)
          for (int64_t j = 0; j < Lk; ++j) wrow[j] = quiet_nan<T>();
        continue;
      }
      if (size == 0) {  // nothing visible: output 0, weights 0
        for (int64_t c = 0; c < dv; ++c) out[c] = narrow<S>(T(0));
        continue;
      }
      if (p.hardmax) {  // the best key's value row, as stored
        const S* vr = t.refs.v + rj[0] * p.v.row_stride;
        for (int64_t c = 0; c < dv; ++c) out[c] = vr[c];
        if (wrow) wrow[rj[0]] = T(1);
        continue;
      }
      for (int64_t c = 0; c < dv; ++c) o[c] = T(0);
      const T inv = T(1) / sum;
      for (int64_t e = 0; e < size; ++e) {
        const T we = w[e] * inv;
        if (wrow) wrow[rj[e]] = we;
        if (we == T(0)) continue;
        const S* vr = t.refs.v + rj[e] * p.v.row_stride;
        for (int64_t c = 0; c < dv; ++c) o[c] = vfma(we, widen<T>(vr[c]), o[c]);
      }
      for (int64_t c = 0; c < dv; ++c) out[c] = narrow<S>(o[c]);
    }
  }
};

// ---------------------------------------------------------------------------------------
// Score sources shared by several kernels

// Scaled dot products: s = scale * q . k, with the query rows pre-scaled (padded with zero
// rows to whole register tiles) and each key block packed as K^T panels (pack_keys) for the
// register-tiled product scores_tile.
template <typename T>
struct DotScores {
  struct Shared {};
  const FamilyParams& p;
  T* q = nullptr;
  T* kt = nullptr;

  DotScores(const FamilyParams& params, const Shared&) : p(params) {}

  void layout(Arena& a, int64_t rows, int64_t ld) {
    q = a.take<T>(round_up(rows, kRowTile) * imax(p.dim_q, 1));
    kt = a.take<T>(imax(p.dim_q, 1) * ld);
  }

  template <typename S>
  void begin(const Task<T, S>& t) {
    const T scale = T(p.scale);
    const int64_t E = p.dim_q, tile_rows = round_up(t.nrows, kRowTile);
    for (int64_t r = 0; r < t.nrows; ++r) {
      const S* qr = t.rows[r].q;
      for (int64_t e = 0; e < E; ++e) q[r * E + e] = scale * widen<T>(qr[e]);
    }
    std::memset(q + t.nrows * E, 0, size_t((tile_rows - t.nrows) * E) * sizeof(T));
  }

  template <typename S>
  void block(const Task<T, S>& t, int64_t kb, int64_t n, int64_t ncols, T* s, int64_t ld) {
    pack_keys(t.refs.k + kb * p.k.row_stride, p.k.row_stride, n, ncols, p.dim_q, kt);
    scores_tile(q, p.dim_q, kt, s, ld, round_up(t.nrows, kRowTile), ncols);
  }
};

}  // namespace family
}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

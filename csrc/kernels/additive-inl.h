// Additive (Bahdanau) attention and the row projection it is built on, compiled once per
// ISA (in a TU CMake generates from kernels/ops.h). score[i, j] = w_v . tanh(q[i] @ w_q + k[j] @
// w_k):
//   1. project every query row and key row once (O((Lq + Lk) * hidden) memory; the keys
//      go into panels of one vector's width, hidden-major, so the score loop streams them);
//      and each value x also as e^(2x); when every projection is moderate the scores use
//      those (see AdditiveScores: tanh(a + b) then costs a multiply-add and half a division);
//   2. run the blocked driver (driver-inl.h, family-inl.h): per (query-row tile, key vector)
//   accumulate
//      the hidden terms, never forming the Lq x Lk x hidden tensor; then online softmax
//      (or hardmax/top-k) and P V.
#pragma once  // per translation unit

#include "kernels/family-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {
namespace family {

// Bounds of the exponential path: |q w_q|, |k w_k| <= kMaxArg keeps e^(2x) and every
// product of two of them finite and normal; |w_v| <= kMaxWeight keeps the paired sums finite.
template <typename T>
struct AdditiveLimits;
template <>
struct AdditiveLimits<float> {
  static constexpr float kMaxArg = 40.0f, kMaxWeight = 1e20f, kBig = 1e12f;
};
template <>
struct AdditiveLimits<double> {
  static constexpr double kMaxArg = 300.0, kMaxWeight = 1e200, kBig = 1e30;
};

// Scores from the projections. kExp (the usual case, see additive_attention): the buffers
// hold A = e^(2 qp) and B = e^(2 kp), and
//   w . tanh(a + b) = sum_h w_h (1 - 2 / (A_h B_h + 1)) = W - sum_h 2 w_h / d_h,
// one multiply-add and a division per term instead of a whole tanh; two terms share one
// division, c0 / d0 + c1 / d1 = (c0 d1 + c1 d0) / (d0 d1), with d capped at kBig (where
// 2 w / d is below the rounding of the sum) so the products stay finite. The absolute error
// of each term is a few ulp of w_h, as with a direct tanh. Otherwise (huge or non-finite
// projections) the buffers hold qp and kp and each term is w_h * tanh_fast_vec(a + b).
template <typename T, bool kExp>
struct AdditiveScores {
  struct Shared {
    const T* qp = nullptr;  // (batch, Hq, Lq, hidden)
    const T* kp = nullptr;  // (batch, Hkv) panels: [key / L][hidden][key % L]
    int64_t kp_stride = 0;  // elements per (batch, kv head)
    const T* w = nullptr;   // kExp: 2 w_v; else w_v
    T w_sum = 0;            // kExp: sum of w_v
  };
  const FamilyParams& p;
  const Shared& sh;
  const T* qp = nullptr;  // this task's first row
  const T* kp = nullptr;  // this task's (batch, kv head)

  AdditiveScores(const FamilyParams& params, const Shared& shared) : p(params), sh(shared) {}

  void layout(Arena&, int64_t, int64_t) {}

  template <typename S>
  void begin(const Task<T, S>& t) {
    qp = sh.qp + ((t.c.b * p.num_heads_q + t.c.h0) * p.len_q + t.c.i0) * p.hidden;
    kp = sh.kp + (t.c.b * p.num_heads_kv + t.c.hk) * sh.kp_stride;
  }

  // acc[rr] (rows q0 + rr * H) for the key vector whose panel is `panel`.
  template <int RT>
  void column(const T* q0, const T* panel, typename VecOf<T>::type* acc) const {
    using V = typename VecOf<T>::type;
    constexpr int L = kLanes<T>;
    const int64_t H = p.hidden;
    const T* w = sh.w;
    if constexpr (kExp) {
      const V one = V{} + T(1), big = V{} + AdditiveLimits<T>::kBig;
      int64_t h = 0;
      for (; h + 2 <= H; h += 2) {
        const V k0 = vload(panel + h * L), k1 = vload(panel + (h + 1) * L);
        const T c0 = w[h], c1 = w[h + 1];
        for (int rr = 0; rr < RT; ++rr) {
          const V d0 = vmin(vfma(vbroadcast(q0[rr * H + h]), k0, one), big);
          const V d1 = vmin(vfma(vbroadcast(q0[rr * H + h + 1]), k1, one), big);
          acc[rr] += vfma(vbroadcast(c0), d1, c1 * d0) / (d0 * d1);
        }
      }
      if (h < H) {
        const V k0 = vload(panel + h * L);
        for (int rr = 0; rr < RT; ++rr)
          acc[rr] += w[h] / vmin(vfma(vbroadcast(q0[rr * H + h]), k0, one), big);
      }
      for (int rr = 0; rr < RT; ++rr) acc[rr] = sh.w_sum - acc[rr];
    } else {
      for (int64_t h = 0; h < H; ++h) {
        const V kv = vload(panel + h * L);
        for (int rr = 0; rr < RT; ++rr)
          acc[rr] = vfma(vbroadcast(w[h]), tanh_fast_vec<T>(q0[rr * H + h] + kv), acc[rr]);
      }
    }
  }

  // kb is a multiple of the column tile (the driver aligns it), so column c of the block
  // starts panel (kb + c) / L.
  template <typename S>
  void block(const Task<T, S>& t, int64_t kb, int64_t, int64_t ncols, T* s, int64_t ld) {
    using V = typename VecOf<T>::type;
    constexpr int RT = kRowTile, L = kLanes<T>;
    const int64_t H = p.hidden;
    int64_t r = 0;
    for (; r + RT <= t.nrows; r += RT) {
      for (int64_t c = 0; c < ncols; c += L) {
        V acc[RT] = {};
        column<RT>(qp + r * H, kp + (kb + c) / L * H * L, acc);
        for (int rr = 0; rr < RT; ++rr) vstore(s + (r + rr) * ld + c, acc[rr]);
      }
    }
    for (; r < t.nrows; ++r) {
      for (int64_t c = 0; c < ncols; c += L) {
        V acc[1] = {};
        column<1>(qp + r * H, kp + (kb + c) / L * H * L, acc);
        vstore(s + r * ld + c, acc[0]);
      }
    }
  }
};

// The driver for one score path and the call's normaliser (q/k/v/out stored as S).
template <typename T, bool kExp, typename S>
bool additive_run(const FamilyParams& p, const typename AdditiveScores<T, kExp>::Shared& sh) {
  // The score loop dominates: small query blocks balance the threads; a key block of a few
  // hundred keys keeps its panels (hidden x 256 values) in L2.
  const int64_t block_q = 16, block_k = 256;
  if (p.normalizer == Normalizer::kSelect)
    return run_family<T, AdditiveScores<T, kExp>, SelectTopK<T>, S>(p, sh, block_q, block_k);
  return run_family<T, AdditiveScores<T, kExp>, OnlineSoftmax<T>, S>(p, sh, block_q, block_k);
}

template <typename T>
inline T* alloc_values(int64_t n) {
  return static_cast<T*>(
      std::aligned_alloc(64, size_t(round_up(imax(n, 1) * int64_t(sizeof(T)), 64))));
}

// e^(2 x) in place, x[0:n).
template <typename T>
inline void exp2x_inplace(T* x, int64_t n) {
  constexpr int L = kLanes<T>;
  int64_t i = 0;
  for (; i + L <= n; i += L) vstore(x + i, exp_approx_vec<T>(T(2) * vload(x + i)));
  for (; i < n; ++i) x[i] = exp_approx(T(2) * x[i]);
}

// Whether every |x[0:n)| <= limit (false for NaN).
template <typename T>
inline bool all_within(const T* x, int64_t n, T limit) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok = ok && (x[i] <= limit && x[i] >= -limit);
  return ok;
}

// q/k/v/out stored as S (T, or a 16-bit float: each query and key row widened as it is
// projected, values as the driver reads them); w_q, w_k, w_v in T.
template <typename T, typename S = T>
bool additive_attention(const FamilyParams& p) {
  int64_t batch = 1;
  for (int64_t d = 0; d < p.batch_ndim; ++d) batch *= p.batch_shape[d];
  if (batch == 0 || p.num_heads_q == 0 || p.len_q == 0) return true;
  constexpr int L = kLanes<T>;
  const int64_t H = p.hidden, Lq = p.len_q, Lk = p.len_k;
  const int64_t lk_pad = round_up(imax(Lk, 1), kColTile<T>);
  const int64_t q_rows = batch * p.num_heads_q * Lq;
  const int64_t k_rows = batch * p.num_heads_kv * lk_pad;
  const int64_t kp_stride = lk_pad * H;
  T* qp = alloc_values<T>(q_rows * H);  // projections
  T* kp = alloc_values<T>(k_rows * H);
  T* qe = alloc_values<T>(q_rows * H);  // e^(2 x) of them
  T* ke = alloc_values<T>(k_rows * H);
  T* w2 = alloc_values<T>(H);
  // Keys each (batch, kv head) may show to some row: those past every row's valid length
  // are never read (they may hold garbage) -- their projections are zeros, and masked.
  int64_t* kv_len = static_cast<int64_t*>(
      std::aligned_alloc(64, size_t(round_up(imax(batch * p.num_heads_kv, 1) * 8, 64))));
  bool ok = qp && kp && qe && ke && w2 && kv_len;
  bool in_range = true;
  if (ok) {
    const int64_t group = p.num_heads_q / p.num_heads_kv;
    int64_t coord[kMaxBatchDims];
    for (int64_t bh = 0; bh < batch * p.num_heads_kv; ++bh) {
      int64_t len = 0;
      if (!p.valid_lens.data) {
        len = Lk;
      } else {
        for (int64_t d = p.batch_ndim - 1, rest = bh / p.num_heads_kv; d >= 0; --d) {
          coord[d] = rest % p.batch_shape[d];
          rest /= p.batch_shape[d];
        }
        const int64_t* vl = static_cast<const int64_t*>(p.valid_lens.data) +
                            batch_offset(p.valid_lens.batch_stride, coord, p.batch_ndim);
        for (int64_t h = (bh % p.num_heads_kv) * group; h < (bh % p.num_heads_kv + 1) * group; ++h)
          for (int64_t i = 0; i < Lq && len < Lk; ++i)
            len =
                imax(len, imin(Lk, vl[h * p.valid_lens.head_stride + i * p.valid_lens.row_stride]));
      }
      kv_len[bh] = len;
    }
  }
  if (ok) {
    // One parallel region, no barrier inside: every projection row is written both as is
    // (qp, kp) and as e^(2x) (qe, ke), and checked against AdditiveLimits on the way (an
    // AND-reduction, so the choice of path does not depend on the thread count). Few
    // synchronisation points matter when the machine is oversubscribed.
    const T* wq = static_cast<const T*>(p.w_q);
    const T* wk = static_cast<const T*>(p.w_k);
    const T lim = AdditiveLimits<T>::kMaxArg;
    const int threads = int(imax(1, imin(p.num_threads, (q_rows + k_rows + 63) / 64)));
#pragma omp parallel num_threads(threads) reduction(&& : in_range)
    {
      T* row = alloc_values<T>(H);
      // A query or key row widened from S (unused when stored as T).
      T* wide = std::is_same_v<S, T> ? nullptr : alloc_values<T>(imax(p.dim_q, p.dim_k));
      if (!row || (!std::is_same_v<S, T> && !wide)) {
#pragma omp atomic write
        ok = false;
      }
      int64_t coord[kMaxBatchDims];
#pragma omp for schedule(static) nowait
      for (int64_t r = 0; r < q_rows; ++r) {
        const int64_t i = r % Lq, bh = r / Lq, h = bh % p.num_heads_q;
        for (int64_t d = p.batch_ndim - 1, rest = bh / p.num_heads_q; d >= 0; --d) {
          coord[d] = rest % p.batch_shape[d];
          rest /= p.batch_shape[d];
        }
        if (!std::is_same_v<S, T> && !wide) continue;
        const S* x = static_cast<const S*>(p.q.data) +
                     batch_offset(p.q.batch_stride, coord, p.batch_ndim) + h * p.q.head_stride +
                     i * p.q.row_stride;
        T* out = qp + r * H;
        project_row(widened_row(x, p.dim_q, wide), p.dim_q, wq, H, out);
        in_range = in_range && all_within(out, H, lim);
        std::memcpy(qe + r * H, out, size_t(H) * sizeof(T));
        exp2x_inplace(qe + r * H, H);
      }
#pragma omp for schedule(static) nowait
      for (int64_t r = 0; r < k_rows; ++r) {
        if (!row || (!std::is_same_v<S, T> && !wide)) continue;
        const int64_t j = r % lk_pad, bh = r / lk_pad, h = bh % p.num_heads_kv;
        const int64_t at = bh * kp_stride + j / L * H * L + j % L;
        if (j >= kv_len[bh]) {  // never read: zero (e^0 = 1), masked by the driver
          for (int64_t c = 0; c < H; ++c) {
            kp[at + c * L] = T(0);
            ke[at + c * L] = T(1);
          }
          continue;
        }
        for (int64_t d = p.batch_ndim - 1, rest = bh / p.num_heads_kv; d >= 0; --d) {
          coord[d] = rest % p.batch_shape[d];
          rest /= p.batch_shape[d];
        }
        const S* x = static_cast<const S*>(p.k.data) +
                     batch_offset(p.k.batch_stride, coord, p.batch_ndim) + h * p.k.head_stride +
                     j * p.k.row_stride;
        project_row(widened_row(x, p.dim_k, wide), p.dim_k, wk, H, row);
        in_range = in_range && all_within(row, H, lim);
        for (int64_t c = 0; c < H; ++c) kp[at + c * L] = row[c];
        exp2x_inplace(row, H);
        for (int64_t c = 0; c < H; ++c) ke[at + c * L] = row[c];
      }
      std::free(row);
      std::free(wide);
    }
  }
  if (ok) {
    const T* wv = static_cast<const T*>(p.w_v);
    const bool use_exp = in_range && all_within(wv, H, AdditiveLimits<T>::kMaxWeight);
    T w_sum = 0;
    for (int64_t h = 0; h < H; ++h) {
      w2[h] = use_exp ? T(2) * wv[h] : wv[h];
      w_sum += wv[h];
    }
    if (use_exp) {
      typename AdditiveScores<T, true>::Shared sh;
      sh.qp = qe;
      sh.kp = ke;
      sh.kp_stride = kp_stride;
      sh.w = w2;
      sh.w_sum = w_sum;
      ok = additive_run<T, true, S>(p, sh);
    } else {
      typename AdditiveScores<T, false>::Shared sh;
      sh.qp = qp;
      sh.kp = kp;
      sh.kp_stride = kp_stride;
      sh.w = w2;
      ok = additive_run<T, false, S>(p, sh);
    }
  }
  std::free(qp);
  std::free(kp);
  std::free(qe);
  std::free(ke);
  std::free(w2);
  std::free(kv_len);
  return ok;
}

// out[r, :] = x[r, :] @ w for every row, rows split across threads.
template <typename T>
bool project(const ProjectParams& p) {
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  T* out = static_cast<T*>(p.out);
  const int threads = int(imax(1, imin(p.num_threads, (p.rows + 63) / 64)));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < p.rows; ++r)
    project_row(x + r * p.x_row_stride, p.dim_in, w, p.dim_out, out + r * p.dim_out);
  return true;
}

// The backward's tanh chain for one row a (a query's projection, or a key's): over the n
// rows b_m of the other side with coef[m] != 0 (0: a hidden pair, or one of weight 0,
// never read), t = tanh(a + b_m) and
//   d_a += coef[m] * w_v * (1 - t^2),   d_wv += coef[m] * t   (d_wv may be null).
// H is a multiple of the vector width; d_a and d_wv are overwritten.
template <typename T>
inline void tanh_chain_row(const T* a, const T* b, const T* coef, int64_t n, int64_t H, const T* wv,
                           T* d_a, T* d_wv) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  for (int64_t h = 0; h < H; ++h) d_a[h] = T(0);
  if (d_wv)
    for (int64_t h = 0; h < H; ++h) d_wv[h] = T(0);
  const V one = V{} + T(1);
  for (int64_t m = 0; m < n; ++m) {
    const T c = coef[m];
    if (c == T(0)) continue;
    const V cv = V{} + c;
    const T* bm = b + m * H;
    for (int64_t h = 0; h < H; h += L) {
      const V t = tanh_fast_vec<T>(vload(a + h) + vload(bm + h));
      vstore(d_a + h, vfma(cv * vload(wv + h), vfma(-t, t, one), vload(d_a + h)));
      if (d_wv) vstore(d_wv + h, vfma(cv, t, vload(d_wv + h)));
    }
  }
}

// Both passes: one owns each query row (d_qp and its w_v terms), the other each key row
// (d_kp), so every output row is one thread's, summed in key (query) order: bit-identical
// for any thread count. tanh is evaluated twice per pair, once per pass.
template <typename T>
bool additive_backward(const AdditiveBackwardParams& p) {
  const int64_t G = p.groups, R = p.rows, K = p.keys, H = p.hidden;
  if (G == 0 || H == 0) return true;
  const T* qp = static_cast<const T*>(p.qp);
  const T* kp = static_cast<const T*>(p.kp);
  const T* ds = static_cast<const T*>(p.ds);
  const T* ds_t = static_cast<const T*>(p.ds_t);
  const T* wv = static_cast<const T*>(p.w_v);
  T* d_qp = static_cast<T*>(p.d_qp);
  T* d_kp = static_cast<T*>(p.d_kp);
  T* d_wv = static_cast<T*>(p.d_wv);
  const int64_t work = G * (R + K);
  const int threads = int(imax(1, imin(p.num_threads, work)));
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 4) nowait
    for (int64_t r = 0; r < G * R; ++r) {
      const int64_t g = r / R;
      tanh_chain_row(qp + r * H, kp + g * K * H, ds + r * K, K, H, wv, d_qp + r * H, d_wv + r * H);
    }
#pragma omp for schedule(dynamic, 4) nowait
    for (int64_t r = 0; r < G * K; ++r) {
      const int64_t g = r / K;
      tanh_chain_row<T>(kp + r * H, qp + g * R * H, ds_t + r * R, R, H, wv, d_kp + r * H, nullptr);
    }
  }
  return true;
}

}  // namespace family

// float32 compute serves float32 arrays and the 16-bit storage types (params.storage).
bool additive_attention_f32(const FamilyParams& params) {
  return with_float_storage(params.storage, [&](auto s) {
    return family::additive_attention<float, decltype(s)>(params);
  });
}
bool additive_attention_f64(const FamilyParams& params) {
  return family::additive_attention<double>(params);
}
bool project_f32(const ProjectParams& params) { return family::project<float>(params); }
bool additive_backward_f32(const AdditiveBackwardParams& params) {
  return family::additive_backward<float>(params);
}
bool additive_backward_f64(const AdditiveBackwardParams& params) {
  return family::additive_backward<double>(params);
}
bool project_f64(const ProjectParams& params) { return family::project<double>(params); }

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

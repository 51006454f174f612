// Additive (Bahdanau) attention and the row projection it is built on, compiled once per
// ISA (additive_<isa>.cpp). score[i, j] = w_v . tanh(q[i] @ w_q + k[j] @ w_k):
//   1. project every query row and key row once (O((Lq + Lk) * hidden) memory; the keys
//      go into panels of one vector's width, hidden-major, so the score loop streams them);
//   2. run the blocked driver (family-inl.h): per (query-row tile, key vector) accumulate
//      w_v[h] * tanh(qp[i, h] + kp[j, h]) over h with a vectorised tanh, never forming
//      the Lq x Lk x hidden tensor; then online softmax (or hardmax/top-k) and P V.
#pragma once  // per translation unit

#include "kernels/activations-inl.h"
#include "kernels/family-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {
namespace family {

template <typename T>
struct AdditiveScores {
  struct Shared {
    const T* qp = nullptr;  // (batch, Hq, Lq, hidden)
    const T* kp = nullptr;  // (batch, Hkv) panels: [key / L][hidden][key % L]
    int64_t kp_stride = 0;  // elements per (batch, kv head)
    const T* w_v = nullptr;
  };
  const FamilyParams& p;
  const Shared& sh;
  const T* qp = nullptr;  // this task's first row
  const T* kp = nullptr;  // this task's (batch, kv head)

  AdditiveScores(const FamilyParams& params, const Shared& shared) : p(params), sh(shared) {}

  void layout(Arena&, int64_t, int64_t) {}

  void begin(const Task<T>& t) {
    qp = sh.qp + ((t.b * p.num_heads_q + t.h) * p.len_q + t.i0) * p.hidden;
    kp = sh.kp + (t.b * p.num_heads_kv + t.hk) * sh.kp_stride;
  }

  // kb is a multiple of the column tile (the driver aligns it), so column c of the block
  // starts panel (kb + c) / L.
  void block(const Task<T>& t, int64_t kb, int64_t, int64_t ncols, T* s, int64_t ld) {
    using V = typename VecOf<T>::type;
    constexpr int RT = kRowTile, L = kLanes<T>;
    const int64_t H = p.hidden;
    const T* wv = sh.w_v;
    int64_t r = 0;
    for (; r + RT <= t.nrows; r += RT) {
      const T* q0 = qp + r * H;
      for (int64_t c = 0; c < ncols; c += L) {
        const T* panel = kp + (kb + c) / L * H * L;
        V acc[RT] = {};
        for (int64_t h = 0; h < H; ++h) {
          const V kv = vload(panel + h * L);
          const T w = wv[h];
          for (int rr = 0; rr < RT; ++rr)
            acc[rr] += w * tanh_fast_vec<T>(q0[rr * H + h] + kv);
        }
        for (int rr = 0; rr < RT; ++rr) vstore(s + (r + rr) * ld + c, acc[rr]);
      }
    }
    for (; r < t.nrows; ++r) {
      const T* q0 = qp + r * H;
      for (int64_t c = 0; c < ncols; c += L) {
        const T* panel = kp + (kb + c) / L * H * L;
        V acc = {};
        for (int64_t h = 0; h < H; ++h) acc += wv[h] * tanh_fast_vec<T>(q0[h] + vload(panel + h * L));
        vstore(s + r * ld + c, acc);
      }
    }
  }
};

template <typename T>
bool additive_attention(const FamilyParams& p) {
  int64_t batch = 1;
  for (int64_t d = 0; d < p.batch_ndim; ++d) batch *= p.batch_shape[d];
  if (batch == 0 || p.num_heads_q == 0 || p.len_q == 0) return true;
  constexpr int L = kLanes<T>;
  const int64_t H = p.hidden, Lq = p.len_q, Lk = p.len_k;
  const int64_t lk_pad = round_up(imax(Lk, 1), kColTile<T>);
  const int64_t q_rows = batch * p.num_heads_q * Lq;
  const int64_t k_rows = batch * p.num_heads_kv * lk_pad;
  typename AdditiveScores<T>::Shared sh;
  sh.kp_stride = lk_pad * H;
  sh.w_v = static_cast<const T*>(p.w_v);
  T* qp = static_cast<T*>(std::aligned_alloc(64, size_t(round_up(imax(q_rows * H, 1) * int64_t(sizeof(T)), 64))));
  T* kp = static_cast<T*>(std::aligned_alloc(64, size_t(round_up(imax(k_rows * H, 1) * int64_t(sizeof(T)), 64))));
  bool ok = qp && kp;
  if (ok) {
    const T* wq = static_cast<const T*>(p.w_q);
    const T* wk = static_cast<const T*>(p.w_k);
    const int threads = int(imax(1, imin(p.num_threads, (q_rows + k_rows + 63) / 64)));
#pragma omp parallel num_threads(threads)
    {
      T* row = static_cast<T*>(std::aligned_alloc(64, size_t(round_up(imax(H, 1) * int64_t(sizeof(T)), 64))));
      if (!row) {
#pragma omp atomic write
        ok = false;
      }
      int64_t coord[kMaxBatchDims];
#pragma omp for schedule(static)
      for (int64_t r = 0; r < q_rows; ++r) {
        const int64_t i = r % Lq, bh = r / Lq, h = bh % p.num_heads_q;
        for (int64_t d = p.batch_ndim - 1, rest = bh / p.num_heads_q; d >= 0; --d) {
          coord[d] = rest % p.batch_shape[d];
          rest /= p.batch_shape[d];
        }
        const T* x = static_cast<const T*>(p.q.data) +
                     batch_offset(p.q.batch_stride, coord, p.batch_ndim) + h * p.q.head_stride +
                     i * p.q.row_stride;
        project_row(x, p.dim_q, wq, H, qp + r * H);
      }
#pragma omp for schedule(static)
      for (int64_t r = 0; r < k_rows; ++r) {
        if (!row) continue;
        const int64_t j = r % lk_pad, bh = r / lk_pad, h = bh % p.num_heads_kv;
        T* panel = kp + bh * sh.kp_stride + j / L * H * L + j % L;
        if (j >= Lk) {
          for (int64_t c = 0; c < H; ++c) panel[c * L] = T(0);
          continue;
        }
        for (int64_t d = p.batch_ndim - 1, rest = bh / p.num_heads_kv; d >= 0; --d) {
          coord[d] = rest % p.batch_shape[d];
          rest /= p.batch_shape[d];
        }
        const T* x = static_cast<const T*>(p.k.data) +
                     batch_offset(p.k.batch_stride, coord, p.batch_ndim) + h * p.k.head_stride +
                     j * p.k.row_stride;
        project_row(x, p.dim_k, wk, H, row);
        for (int64_t c = 0; c < H; ++c) panel[c * L] = row[c];
      }
      std::free(row);
    }
  }
  if (ok) {
    sh.qp = qp;
    sh.kp = kp;
    // The tanh loop dominates: small query blocks balance the threads; a key block of a
    // few hundred keys keeps its panels (hidden x 256 values) in L2.
    const int64_t block_q = 16, block_k = 256;
    if (p.normalizer == Normalizer::kSelect)
      ok = run_family<T, AdditiveScores<T>, SelectTopK<T>>(p, sh, block_q, block_k);
    else
      ok = run_family<T, AdditiveScores<T>, OnlineSoftmax<T>>(p, sh, block_q, block_k);
  }
  std::free(qp);
  std::free(kp);
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

}  // namespace family

bool additive_attention_f32(const FamilyParams& params) {
  return family::additive_attention<float>(params);
}
bool additive_attention_f64(const FamilyParams& params) {
  return family::additive_attention<double>(params);
}
bool project_f32(const ProjectParams& params) { return family::project<float>(params); }
bool project_f64(const ProjectParams& params) { return family::project<double>(params); }

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

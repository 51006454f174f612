// Blocked ("flash") scaled dot-product attention, written once and compiled once per ISA
// (sdpa_<isa>.cpp defines FASTATTN_ISA_NS and FASTATTN_VEC_BYTES, then includes this).
// Everything here lives in that ISA's namespace so no inline code leaks across ISAs;
// it uses no std containers or std templates that could be emitted out of line.
//
// Work unit ("task"): one (batch, query head, block of query rows). A task walks the
// keys its rows may see in blocks, keeping a running row max m, row sum l and an
// unnormalised output accumulator (online softmax), and normalises once at the end.
// No Lq x Lk buffer exists unless the caller asked for the weights. Each task is done
// by one thread start to finish, so results are bit-identical for any thread count.
#pragma once  // per translation unit

#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "api/sdpa_params.h"
#include "kernels/math-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// GCC/Clang vector extensions: one register of this ISA; lowered to its instructions.
// FASTATTN_VEC_BYTES == 0 is the scalar reference path: one-lane "vectors".
template <typename T>
constexpr int kVecBytes = FASTATTN_VEC_BYTES > 0 ? FASTATTN_VEC_BYTES : int(sizeof(T));

template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes<T>)));
};

template <typename T>
struct SdpaTraits {
  static constexpr int kLanes = kVecBytes<T> / int(sizeof(T));
  static constexpr int kRowTile = 4;            // query rows per register tile
  static constexpr int kColTile = 2 * kLanes;   // columns per register tile (2 vectors)
  static constexpr int64_t kBlockQ = 64;        // query rows per task
  static constexpr int64_t kKtBytes = 32 * 1024;  // packed K^T block: about L1-sized
};

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

template <typename T>
inline typename VecOf<T>::type vload(const T* p) {
  typename VecOf<T>::type v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
inline void vstore(T* p, typename VecOf<T>::type v) {
  __builtin_memcpy(p, &v, sizeof v);
}

// Keys per block: the packed K^T block (head_dim x keys) stays about L1-sized.
template <typename T>
inline int64_t key_block_size(int64_t head_dim) {
  using Tr = SdpaTraits<T>;
  const int64_t keys = Tr::kKtBytes / (head_dim * int64_t(sizeof(T)));
  return imax(Tr::kColTile, imin(512, keys / Tr::kColTile * Tr::kColTile));
}

// Keys row `row` may see: [lo, hi), lo <= hi. valid_lens, causal and window AND together.
inline void row_key_range(const SdpaParams& p, int64_t row, int64_t valid_len, int64_t* lo,
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

// Per-thread scratch, one aligned allocation reused by every task the thread runs.
template <typename T>
struct Scratch {
  T* q = nullptr;      // kBlockQ x head_dim, pre-scaled
  T* kt = nullptr;     // head_dim x kt_ld, the key block transposed, zero-padded
  T* s = nullptr;      // kBlockQ x kt_ld, scores then probabilities
  T* acc = nullptr;    // kBlockQ x head_dim_v, unnormalised output
  T* m = nullptr;      // kBlockQ running row max
  T* l = nullptr;      // kBlockQ running row sum
  int64_t* lo = nullptr;  // kBlockQ visible key range per row
  int64_t* hi = nullptr;
  int64_t* zeros = nullptr;  // kBlockQ: probabilities exactly 0 in the current block
  void* raw = nullptr;

  bool allocate(int64_t block_q, int64_t head_dim, int64_t head_dim_v, int64_t kt_ld) {
    const int64_t sizes[9] = {block_q * head_dim * int64_t(sizeof(T)),
                              head_dim * kt_ld * int64_t(sizeof(T)),
                              block_q * kt_ld * int64_t(sizeof(T)),
                              block_q * imax(head_dim_v, 1) * int64_t(sizeof(T)),
                              block_q * int64_t(sizeof(T)),
                              block_q * int64_t(sizeof(T)),
                              block_q * 8,
                              block_q * 8,
                              block_q * 8};
    int64_t total = 0;
    for (int64_t b : sizes) total += round_up(b, 64);
    raw = std::aligned_alloc(64, size_t(total));
    if (!raw) return false;
    char* c = static_cast<char*>(raw);
    void* parts[9];
    for (int i = 0; i < 9; ++i) {
      parts[i] = c;
      c += round_up(sizes[i], 64);
    }
    q = static_cast<T*>(parts[0]);
    kt = static_cast<T*>(parts[1]);
    s = static_cast<T*>(parts[2]);
    acc = static_cast<T*>(parts[3]);
    m = static_cast<T*>(parts[4]);
    l = static_cast<T*>(parts[5]);
    lo = static_cast<int64_t*>(parts[6]);
    hi = static_cast<int64_t*>(parts[7]);
    zeros = static_cast<int64_t*>(parts[8]);
    return true;
  }
  ~Scratch() { std::free(raw); }
};

// s[r, 0:ncols) = q[r, :] . kt[:, 0:ncols) for r < nrows; ncols is a multiple of kColTile
// (kt is zero-padded), so the register tile needs no column tail.
template <typename T>
inline void scores_tile(const T* q, int64_t head_dim, const T* kt, int64_t kt_ld, T* s,
                        int64_t nrows, int64_t ncols) {
  using V = typename VecOf<T>::type;
  using Tr = SdpaTraits<T>;
  constexpr int RT = Tr::kRowTile, L = Tr::kLanes;
  int64_t r = 0;
  for (; r + RT <= nrows; r += RT) {
    for (int64_t c = 0; c < ncols; c += Tr::kColTile) {
      V acc[RT][2] = {};
      for (int64_t e = 0; e < head_dim; ++e) {
        const V k0 = vload(kt + e * kt_ld + c), k1 = vload(kt + e * kt_ld + c + L);
        for (int rr = 0; rr < RT; ++rr) {
          const T qv = q[(r + rr) * head_dim + e];
          acc[rr][0] += qv * k0;
          acc[rr][1] += qv * k1;
        }
      }
      for (int rr = 0; rr < RT; ++rr) {
        vstore(s + (r + rr) * kt_ld + c, acc[rr][0]);
        vstore(s + (r + rr) * kt_ld + c + L, acc[rr][1]);
      }
    }
  }
  for (; r < nrows; ++r) {
    for (int64_t c = 0; c < ncols; c += Tr::kColTile) {
      V a0 = {}, a1 = {};
      for (int64_t e = 0; e < head_dim; ++e) {
        const T qv = q[r * head_dim + e];
        a0 += qv * vload(kt + e * kt_ld + c);
        a1 += qv * vload(kt + e * kt_ld + c + L);
      }
      vstore(s + r * kt_ld + c, a0);
      vstore(s + r * kt_ld + c + L, a1);
    }
  }
}

// acc[r, :] += sum_j p[r, j] * v[j, :] for one row, skipping p == 0 so that values of
// keys a row does not attend (padding, NaN) never reach it.
template <typename T>
inline void pv_row(const T* p, int64_t n, const T* v, int64_t v_row_stride, int64_t dv,
                   T* acc) {
  using V = typename VecOf<T>::type;
  constexpr int L = SdpaTraits<T>::kLanes;
  for (int64_t j = 0; j < n; ++j) {
    const T pj = p[j];
    if (pj == T(0)) continue;
    const T* vr = v + j * v_row_stride;
    int64_t c = 0;
    for (; c + L <= dv; c += L) vstore(acc + c, vload(acc + c) + pj * vload(vr + c));
    for (; c < dv; ++c) acc[c] += pj * vr[c];
  }
}

// The same for kRowTile rows at once, all of whose probabilities in [0, n) are nonzero.
template <typename T>
inline void pv_tile(const T* p, int64_t p_ld, int64_t n, const T* v, int64_t v_row_stride,
                    int64_t dv, T* acc, int64_t acc_ld) {
  using V = typename VecOf<T>::type;
  using Tr = SdpaTraits<T>;
  constexpr int RT = Tr::kRowTile, L = Tr::kLanes;
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
        a[rr][0] += pj * v0;
        a[rr][1] += pj * v1;
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
      for (int64_t j = 0; j < n; ++j) a += p[rr * p_ld + j] * v[j * v_row_stride + c];
      acc[rr * acc_ld + c] = a;
    }
  }
}

template <typename T>
struct TaskContext {
  const SdpaParams* p;
  int64_t kt_ld;      // padded key block width
  int64_t block_k;    // keys per block
};

// One task: rows [i0, i0 + nrows) of query head h in batch entry b (flat index).
template <typename T>
void attend_rows(const TaskContext<T>& ctx, Scratch<T>& sc, int64_t b, int64_t h, int64_t i0,
                 int64_t nrows) {
  const SdpaParams& p = *ctx.p;
  using Tr = SdpaTraits<T>;
  constexpr T kNegInf = -T(__builtin_inf());
  const int64_t E = p.head_dim, Ev = p.head_dim_v, Lk = p.len_k;
  const int64_t kt_ld = ctx.kt_ld;

  int64_t coord[kMaxBatchDims];
  for (int64_t d = p.batch_ndim - 1, rest = b; d >= 0; --d) {
    coord[d] = rest % p.batch_shape[d];
    rest /= p.batch_shape[d];
  }
  const int64_t hk = h / (p.num_heads_q / p.num_heads_kv);
  const int64_t bn = p.batch_ndim;
  const T* q = static_cast<const T*>(p.q.data) + batch_offset(p.q.batch_stride, coord, bn) +
               h * p.q.head_stride;
  const T* k = static_cast<const T*>(p.k.data) + batch_offset(p.k.batch_stride, coord, bn) +
               hk * p.k.head_stride;
  const T* v = static_cast<const T*>(p.v.data) + batch_offset(p.v.batch_stride, coord, bn) +
               hk * p.v.head_stride;
  T* out = static_cast<T*>(const_cast<void*>(p.out.data)) +
           batch_offset(p.out.batch_stride, coord, bn) + h * p.out.head_stride;
  const uint8_t* bmask = nullptr;
  if (p.bool_mask.data)
    bmask = static_cast<const uint8_t*>(p.bool_mask.data) +
            batch_offset(p.bool_mask.batch_stride, coord, bn) + h * p.bool_mask.head_stride;
  const T* fmask = nullptr;
  if (p.float_mask.data)
    fmask = static_cast<const T*>(p.float_mask.data) +
            batch_offset(p.float_mask.batch_stride, coord, bn) + h * p.float_mask.head_stride;
  const int64_t* vlens = nullptr;
  if (p.valid_lens.data)
    vlens = static_cast<const int64_t*>(p.valid_lens.data) +
            batch_offset(p.valid_lens.batch_stride, coord, bn) + h * p.valid_lens.head_stride;
  const int64_t row0 = (b * p.num_heads_q + h) * p.len_q;  // flat row index for lse/weights
  T* lse = p.lse ? static_cast<T*>(p.lse) + row0 : nullptr;
  T* weights = p.weights ? static_cast<T*>(p.weights) + row0 * Lk : nullptr;

  // Visible key ranges; the task visits the union [klo, khi).
  int64_t klo = Lk, khi = 0;
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t i = i0 + r;
    const int64_t vl = vlens ? vlens[i * p.valid_lens.row_stride] : Lk;
    row_key_range(p, i, vl, &sc.lo[r], &sc.hi[r]);
    if (sc.lo[r] < sc.hi[r]) {
      klo = imin(klo, sc.lo[r]);
      khi = imax(khi, sc.hi[r]);
    }
    sc.m[r] = kNegInf;
    sc.l[r] = T(0);
  }
  std::memset(sc.acc, 0, size_t(nrows * Ev) * sizeof(T));
  if (weights) std::memset(weights + i0 * Lk, 0, size_t(nrows * Lk) * sizeof(T));

  if (klo < khi) {
    const T scale = T(p.scale);
    for (int64_t r = 0; r < nrows; ++r) {
      const T* qr = q + (i0 + r) * p.q.row_stride;
      for (int64_t e = 0; e < E; ++e) sc.q[r * E + e] = scale * qr[e];
    }
  }
  using V = typename VecOf<T>::type;
  constexpr int L = Tr::kLanes;
  const bool softcap = p.softcap > 0;
  const T cap = T(p.softcap), inv_cap = T(1.0 / (softcap ? p.softcap : 1.0));

  for (int64_t kb = klo; kb < khi; kb += ctx.block_k) {
    const int64_t n = imin(ctx.block_k, khi - kb);
    const int64_t ncols = round_up(n, Tr::kColTile);
    // Pack K^T for this block, zero-padded to a whole number of column tiles.
    for (int64_t j = 0; j < n; ++j) {
      const T* kr = k + (kb + j) * p.k.row_stride;
      for (int64_t e = 0; e < E; ++e) sc.kt[e * kt_ld + j] = kr[e];
    }
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = n; j < ncols; ++j) sc.kt[e * kt_ld + j] = T(0);

    scores_tile(sc.q, E, sc.kt, kt_ld, sc.s, nrows, ncols);

    // Epilogue per row: softcap, masks, visible range, row max; then exp and row sum,
    // all in whole vectors over the padded width ncols (padding is masked out).
    for (int64_t r = 0; r < nrows; ++r) {
      T* s = sc.s + r * kt_ld;
      const int64_t i = i0 + r;
      const int64_t jlo = imax(sc.lo[r] - kb, 0), jhi = imin(sc.hi[r] - kb, n);
      if (jlo >= jhi) {  // this row sees nothing in this block
        for (int64_t j = 0; j < ncols; ++j) s[j] = T(0);
        if (weights)
          for (int64_t j = 0; j < n; ++j) weights[i * Lk + kb + j] = kNegInf;
        sc.zeros[r] = n;
        continue;
      }
      if (softcap) {
        for (int64_t j = 0; j < ncols; j += L)
          vstore(s + j, cap * tanh_approx_vec<T>(vload(s + j) * inv_cap));
      }
      if (fmask) {
        const T* fm = fmask + i * p.float_mask.row_stride + kb * p.float_mask.col_stride;
        const int64_t cs = p.float_mask.col_stride;
        for (int64_t j = jlo; j < jhi; ++j) s[j] += fm[j * cs];
      }
      if (bmask) {
        const uint8_t* bm = bmask + i * p.bool_mask.row_stride + kb * p.bool_mask.col_stride;
        const int64_t cs = p.bool_mask.col_stride;
        for (int64_t j = jlo; j < jhi; ++j) s[j] = bm[j * cs] ? s[j] : kNegInf;
      }
      for (int64_t j = 0; j < jlo; ++j) s[j] = kNegInf;
      for (int64_t j = jhi; j < ncols; ++j) s[j] = kNegInf;
      V vmax = V{} + kNegInf;
      for (int64_t j = 0; j < ncols; j += L) {
        const V x = vload(s + j);
        vmax = (x > vmax) | (x != x) ? x : vmax;  // NaN propagates to the output
      }
      T mx = kNegInf;
      for (int lane = 0; lane < L; ++lane) {
        const T x = vmax[lane];
        mx = (x > mx || x != x) ? x : mx;
      }
      if (weights) std::memcpy(weights + i * Lk + kb, s, size_t(n) * sizeof(T));
      const T m_old = sc.m[r];
      const T m_new = (mx > m_old || mx != mx) ? mx : m_old;
      if (m_new == kNegInf) {  // everything so far masked
        for (int64_t j = 0; j < ncols; ++j) s[j] = T(0);
        sc.zeros[r] = n;
        continue;
      }
      V vsum = V{}, vzeros = V{};
      for (int64_t j = 0; j < ncols; j += L) {
        const V e = exp_approx_vec<T>(vload(s + j) - m_new);
        vstore(s + j, e);
        vsum += e;
        vzeros += e == T(0) ? V{} + T(1) : V{};
      }
      T sum = 0, zeros = 0;
      for (int lane = 0; lane < L; ++lane) {
        sum += vsum[lane];
        zeros += vzeros[lane];
      }
      sc.zeros[r] = int64_t(zeros) - (ncols - n);  // the padding is always zero
      // Rescale only when the max grew (alpha == 1 otherwise); e^-inf = 0 on first use.
      if (m_new != m_old) {
        const T alpha = exp_approx(m_old - m_new);
        T* a = sc.acc + r * Ev;
        for (int64_t c = 0; c < Ev; ++c) a[c] *= alpha;
        sc.l[r] *= alpha;
      }
      sc.l[r] += sum;
      sc.m[r] = m_new;
    }

    // acc += P V, register-tiled where a whole row tile has no zero probabilities.
    const T* vb = v + kb * p.v.row_stride;
    int64_t r = 0;
    for (; r + Tr::kRowTile <= nrows; r += Tr::kRowTile) {
      bool dense = true;
      for (int rr = 0; rr < Tr::kRowTile; ++rr) dense = dense && sc.zeros[r + rr] == 0;
      if (dense) {
        pv_tile(sc.s + r * kt_ld, kt_ld, n, vb, p.v.row_stride, Ev, sc.acc + r * Ev, Ev);
      } else {
        for (int rr = 0; rr < Tr::kRowTile; ++rr)
          pv_row(sc.s + (r + rr) * kt_ld, n, vb, p.v.row_stride, Ev, sc.acc + (r + rr) * Ev);
      }
    }
    for (; r < nrows; ++r) pv_row(sc.s + r * kt_ld, n, vb, p.v.row_stride, Ev, sc.acc + r * Ev);
  }

  // Normalise once; a row that saw no key gets output 0 and lse -inf.
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t i = i0 + r;
    T* o = out + i * p.out.row_stride;
    const T m = sc.m[r];
    const bool empty = (m == kNegInf);
    const T inv = empty ? T(0) : T(1) / sc.l[r];
    const T* a = sc.acc + r * Ev;
    for (int64_t c = 0; c < Ev; ++c) o[c] = empty ? T(0) : a[c] * inv;
    const T row_lse = empty ? kNegInf : m + T(__builtin_log(double(sc.l[r])));
    if (lse) lse[i] = row_lse;
    if (weights && klo < khi) {
      T* w = weights + i * Lk;
      if (empty) {
        for (int64_t j = klo; j < khi; ++j) w[j] = T(0);
      } else {
        for (int64_t j = klo; j < khi; ++j) w[j] = exp_approx(w[j] - row_lse);
      }
    }
  }
}

// Returns false if a thread's scratch could not be allocated (the caller raises).
template <typename T>
bool sdpa_forward(const SdpaParams& p) {
  using Tr = SdpaTraits<T>;
  int64_t batch = 1;
  for (int64_t d = 0; d < p.batch_ndim; ++d) batch *= p.batch_shape[d];
  if (batch == 0 || p.num_heads_q == 0 || p.len_q == 0) return true;
  const int64_t block_q = imin(Tr::kBlockQ, p.len_q);
  const int64_t q_blocks = (p.len_q + block_q - 1) / block_q;
  const int64_t tasks = batch * p.num_heads_q * q_blocks;
  TaskContext<T> ctx;
  ctx.p = &p;
  ctx.block_k = key_block_size<T>(imax(p.head_dim, 1));
  ctx.kt_ld = ctx.block_k;  // a multiple of kColTile already
  bool failed = false;
  const int threads = int(imax(1, imin(p.num_threads, tasks)));
#pragma omp parallel num_threads(threads)
  {
    Scratch<T> sc;
    const bool ok = sc.allocate(block_q, imax(p.head_dim, 1), p.head_dim_v, ctx.kt_ld);
    if (!ok) {
#pragma omp atomic write
      failed = true;
    }
    // Later query blocks carry more keys under a causal mask: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      if (!ok) continue;
      const int64_t qb = q_blocks - 1 - t % q_blocks;
      const int64_t bh = t / q_blocks;
      const int64_t i0 = qb * block_q;
      attend_rows<T>(ctx, sc, bh / p.num_heads_q, bh % p.num_heads_q, i0,
                     imin(block_q, p.len_q - i0));
    }
  }
  return !failed;
}

bool sdpa_forward_f32(const SdpaParams& params) { return sdpa_forward<float>(params); }
bool sdpa_forward_f64(const SdpaParams& params) { return sdpa_forward<double>(params); }

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

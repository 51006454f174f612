// Nadaraya-Watson kernel regression as attention pooling, compiled once per ISA
// (in a TU CMake generates from kernels/ops.h). Scores are squared distances d2 = ||x_q - x_k||^2
// between the query and key features (computed as differences, never through the dot-product
// expansion, so nearby points keep their precision):
//   gaussian: s = -d2 / (2 h^2), online softmax (family-inl.h) -- never 0/0 while keys exist;
//   boxcar / triangular / epanechnikov: weights K(u), u = sqrt(d2) / h, summed directly;
//   a query with no key inside the support gets 0/0 = NaN (the estimator is undefined).
// One bandwidth h per batch entry (a float64 array broadcast over the batch).
#pragma once  // per translation unit

#include <algorithm>

#include "kernels/family-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {
namespace family {

inline double task_bandwidth(const FamilyParams& p, const int64_t* coord) {
  return static_cast<const double*>(
      p.bandwidth.data)[batch_offset(p.bandwidth.batch_stride, coord, p.batch_ndim)];
}

// Lane-wise square root of d2 >= 0 (one sqrt instruction per lane; libm is reached only
// for a NaN, to set errno).
template <typename T, typename V>
inline V vsqrt(V x) {
  V r;
  for (int i = 0; i < kLanes<T>; ++i) r[i] = __builtin_sqrt(x[i]);
  return r;
}
template <typename V>
inline V vsqrt_f32(V x) {
  V r;
  for (int i = 0; i < kLanes<float>; ++i) r[i] = __builtin_sqrtf(x[i]);
  return r;
}

// s = c * ||q_i - k_j||^2 with c = -1 / (2 h^2) (gaussian) or -1 (compact kernels, which
// read d2 back as -s). Masked keys become -inf, i.e. d2 = +inf: outside every support.
template <typename T>
struct DistanceScores {
  struct Shared {};
  const FamilyParams& p;
  T* q = nullptr;
  T* kt = nullptr;
  T c = T(-1);

  DistanceScores(const FamilyParams& params, const Shared&) : p(params) {}

  void layout(Arena& a, int64_t block_q, int64_t ld) {
    q = a.take<T>(block_q * imax(p.dim_q, 1));
    kt = a.take<T>(imax(p.dim_q, 1) * ld);
  }

  template <typename S>
  void begin(const Task<T, S>& t) {
    const double h = task_bandwidth(p, t.refs.coord);
    c = p.kernel == RegressionKernel::kGaussian ? T(-0.5 / (h * h)) : T(-1);
    const int64_t D = p.dim_q;
    for (int64_t r = 0; r < t.nrows; ++r) {
      const S* qr = t.rows[r].q;
      for (int64_t e = 0; e < D; ++e) q[r * D + e] = widen<T>(qr[e]);
    }
  }

  template <typename S>
  void block(const Task<T, S>& t, int64_t kb, int64_t n, int64_t ncols, T* s, int64_t ld) {
    using V = typename VecOf<T>::type;
    constexpr int L = kLanes<T>;
    const int64_t D = p.dim_q;
    for (int64_t j = 0; j < n; ++j) {  // keys stored as S widened as they are transposed
      const S* kr = t.refs.k + (kb + j) * p.k.row_stride;
      for (int64_t e = 0; e < D; ++e) kt[e * ld + j] = widen<T>(kr[e]);
    }
    for (int64_t e = 0; e < D; ++e)
      for (int64_t j = n; j < ncols; ++j) kt[e * ld + j] = T(0);
    for (int64_t r = 0; r < t.nrows; ++r) {
      const T* qr = q + r * D;
      for (int64_t col = 0; col < ncols; col += L) {
        V acc = {};
        for (int64_t e = 0; e < D; ++e) {
          const V d = qr[e] - vload(kt + e * ld + col);
          acc = vfma(d, d, acc);
        }
        vstore(s + r * ld + col, c * acc);
      }
    }
  }
};

// Gaussian kernel: the online softmax, with NaN (0/0) for a query when there are no keys.
template <typename T>
struct RegressionSoftmax : OnlineSoftmax<T> {
  explicit RegressionSoftmax(const FamilyParams& params)
      : OnlineSoftmax<T>(params, quiet_nan<T>()) {}
};

// Compact kernels: w = K(u) with u^2 = d2 / h^2, sums of w and of w * y, one division.
template <typename T>
struct KernelSum {
  static constexpr bool kWeightsFromScores = false;  // the row holds K(u): hidden keys 0
  const FamilyParams& p;
  T* l = nullptr;
  T* acc = nullptr;
  T* vt = nullptr;
  T* vw = nullptr;  // a widened value block (16-bit values)
  int64_t* zeros = nullptr;
  T h = 1, h2 = 1;

  explicit KernelSum(const FamilyParams& params) : p(params) {}

  void layout(Arena& a, int64_t block_q, int64_t ld) {
    l = a.take<T>(block_q);
    acc = a.take<T>(block_q * imax(p.dim_v, 1));
    vt = a.take<T>(kNarrowValues<T> * ld);
    vw = take_value_block<T>(a, p, ld);
    zeros = a.take<int64_t>(block_q);
  }

  template <typename S>
  void begin(const Task<T, S>& t) {
    const double bw = task_bandwidth(p, t.refs.coord);
    h = T(bw);
    h2 = T(bw * bw);
    for (int64_t r = 0; r < t.nrows; ++r) l[r] = T(0);
    std::memset(acc, 0, size_t(t.nrows * p.dim_v) * sizeof(T));
  }

  // Comparisons that NaN fails: a NaN distance is outside the support (weight 0). Divided,
  // not multiplied by 1/h: a key exactly at the edge (d2 == h^2) gets u == 1, weight 0.
  template <typename V>
  V weigh(V d2) const {
    const V zero = V{}, one = zero + T(1);
    switch (p.kernel) {
      case RegressionKernel::kBoxcar:
        return d2 <= h2 ? one : zero;
      case RegressionKernel::kTriangular: {
        V root;
        if constexpr (sizeof(T) == 4)
          root = vsqrt_f32(d2);
        else
          root = vsqrt<T>(d2);
        const V u = root / h;
        return u <= T(1) ? one - u : zero;
      }
      default: {  // epanechnikov
        const V u2 = d2 / h2;
        return u2 <= T(1) ? T(0.75) * (one - u2) : zero;
      }
    }
  }

  template <typename S>
  void block(const Task<T, S>& t, int64_t kb, int64_t n, int64_t ncols, T* s, int64_t ld) {
    using V = typename VecOf<T>::type;
    constexpr int L = kLanes<T>;
    for (int64_t r = 0; r < t.nrows; ++r) {
      T* sr = s + r * ld;
      if (!t.active[r]) {
        for (int64_t j = 0; j < ncols; ++j) sr[j] = T(0);
        zeros[r] = n;
        continue;
      }
      V vsum = V{}, vzeros = V{};
      for (int64_t j = 0; j < ncols; j += L) {
        const V w = weigh(-vload(sr + j));
        vstore(sr + j, w);
        vsum += w;
        vzeros += w == T(0) ? V{} + T(1) : V{};
      }
      zeros[r] = int64_t(reduce_add<T>(vzeros)) - (ncols - n);
      l[r] += reduce_add<T>(vsum);
      if (t.rows[r].weights)
        std::memcpy(t.rows[r].weights + kb + t.jlo[r], sr + t.jlo[r],
                    size_t(t.jhi[r] - t.jlo[r]) * sizeof(T));
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
      const bool undefined = !(l[r] > T(0));
      const T inv = undefined ? quiet_nan<T>() : T(1) / l[r];
      const T* a = acc + r * p.dim_v;
      if (undefined)
        std::fill(o, o + p.dim_v, narrow<S>(quiet_nan<T>()));
      else
        narrow_scaled(o, a, p.dim_v, inv);
      if (row.weights) {
        T* w = row.weights;
        for (int64_t j = row.lo; j < row.hi; ++j) w[j] = undefined ? quiet_nan<T>() : w[j] * inv;
      }
    }
  }
};

// x_query/x_keys/y_values/out stored as S (T, or a 16-bit float widened as it is read).
template <typename T, typename S = T>
bool nadaraya_watson(const FamilyParams& p) {
  const int64_t keys = 32 * 1024 / (imax(p.dim_q, 1) * int64_t(sizeof(T)));
  const int64_t block_k = imax(kColTile<T>, imin(512, keys / kColTile<T> * kColTile<T>));
  typename DistanceScores<T>::Shared sh;
  if (p.kernel == RegressionKernel::kGaussian)
    return run_family<T, DistanceScores<T>, RegressionSoftmax<T>, S>(p, sh, 64, block_k);
  return run_family<T, DistanceScores<T>, KernelSum<T>, S>(p, sh, 64, block_k);
}

// The backward for one owner row: its coordinates x (D), against n (a multiple of the
// vector width) others, transposed: ot (D, stride), with their weights w, gy = g . y_j and
// gf (the row's own, or per other: `gf_per_other`), inv_s likewise (compact kernels). Per
// pair, dL/dr (`coef`), then d r / d x = (x - o) / r: acc (D) += coef * unit; gh += coef * r.
// sign = +1 for a query row (d = x_q - x_k), -1 for a key row (d = x_k - x_q, the same
// pair's unit vector negated, which is what dL/dx_k needs).
template <typename T>
struct NwRow {
  using V = typename VecOf<T>::type;
  RegressionKernel kernel;
  T h, inv_h, inv_h2;
  int64_t D;

  // ||x - o_j|| for the others j .. j + L - 1.
  inline V distance(const T* x, const T* ot, int64_t stride, int64_t j) const {
    V r2 = V{};
    for (int64_t d = 0; d < D; ++d) {
      const V diff = vbroadcast(x[d]) - vload(ot + d * stride + j);
      r2 = vfma(diff, diff, r2);
    }
    if constexpr (sizeof(T) == 4) {
      return vsqrt_f32(r2);
    } else {
      return vsqrt<T>(r2);
    }
  }

  // One vector of pairs: the others j .. j + L - 1.
  inline void pairs(const T* x, const T* ot, int64_t stride, int64_t j, V w, V gy, V gf, V inv_s,
                    V* acc, V& gh) const {
    const V zero = V{};
    const V r = distance(x, ot, stride, j);
    V coef;
    auto reach = w != zero;
    if (kernel == RegressionKernel::kGaussian) {
      coef = -(w * ((reach ? gy : zero) - gf)) * r * inv_h2;
    } else {
      const V u = r * inv_h;
      reach = u <= V{} + T(1);
      const V slope = kernel == RegressionKernel::kTriangular     ? V{} - T(1)
                      : kernel == RegressionKernel::kEpanechnikov ? T(-1.5) * u
                                                                  : zero;  // boxcar
      coef = (gy - gf) * inv_s * slope * inv_h;
    }
    // Pairs out of reach (hidden, weight 0, NaN distance, the NaN padding) and r = 0 add
    // nothing: selected away, never multiplied in (0 * NaN).
    const auto live = reach & (r > zero);
    coef = live ? coef : zero;
    const V scale = live ? coef / r : zero;
    for (int64_t d = 0; d < D; ++d) {
      const V diff = vbroadcast(x[d]) - vload(ot + d * stride + j);
      acc[d] += live ? scale * diff : zero;
    }
    gh += live ? coef * r : zero;
  }
};

template <typename T>
bool nadaraya_watson_backward(const NwBackwardParams& p) {
  using V = typename VecOf<T>::type;
  constexpr int L = kLanes<T>;
  const int64_t G = p.groups, Lq = p.len_q, Lk = p.len_k, D = p.dim;
  const int64_t Lqp = p.len_q_pad, Lkp = p.len_k_pad;
  if (G == 0 || D == 0) return true;
  const bool compact = p.kernel != RegressionKernel::kGaussian;
  const T* xq = static_cast<const T*>(p.xq);
  const T* xk = static_cast<const T*>(p.xk);
  const T* xq_t = static_cast<const T*>(p.xq_t);
  const T* xk_t = static_cast<const T*>(p.xk_t);
  const T* w = static_cast<const T*>(p.w);
  const T* w_t = static_cast<const T*>(p.w_t);
  const T* gy = static_cast<const T*>(p.gy);
  const T* gy_t = static_cast<const T*>(p.gy_t);
  const T* gf = static_cast<const T*>(p.gf);
  const T* hs = static_cast<const T*>(p.h);
  T* gxq = static_cast<T*>(p.gxq);
  T* gxk = static_cast<T*>(p.gxk);
  T* gh = static_cast<T*>(p.gh);
  T* inv_s = static_cast<T*>(p.inv_s);
  const int threads = int(imax(1, imin(p.num_threads, G * (Lq + Lk))));
  bool ok = true;
#pragma omp parallel num_threads(threads)
  {
    V* acc = static_cast<V*>(std::aligned_alloc(64, size_t(round_up(D * int64_t(sizeof(V)), 64))));
    if (!acc) {
#pragma omp atomic write
      ok = false;
    }
    // Pass 1: one query row each (its gradient, its bandwidth term, its 1 / kernel mass).
#pragma omp for schedule(dynamic, 8)
    for (int64_t r = 0; r < G * Lq; ++r) {
      if (!acc) continue;
      const int64_t g = r / Lq, i = r % Lq;
      const T h = hs[g];
      const NwRow<T> row{p.kernel, h, T(1) / h, T(1) / (h * h), D};
      const T* x = xq + r * D;
      const T* ot = xk_t + g * D * Lkp;
      const T* wr = w + r * Lkp;
      const T* gyr = gy + r * Lkp;
      T inv = T(0);
      if (compact) {  // the row's kernel mass S = sum_j K(u_j)
        V mass = V{};
        const V one = V{} + T(1);
        for (int64_t j = 0; j < Lkp; j += L) {
          const V rr = row.distance(x, ot, Lkp, j);
          const V u = rr * row.inv_h;
          V k = p.kernel == RegressionKernel::kBoxcar       ? one
                : p.kernel == RegressionKernel::kTriangular ? one - u
                                                            : T(0.75) * (one - u * u);
          mass += u <= one ? k : V{};
        }
        const T s = reduce_add<T>(mass);
        inv = s > T(0) ? T(1) / s : T(0);
        inv_s[g * Lqp + i] = inv;
      }
      for (int64_t d = 0; d < D; ++d) acc[d] = V{};
      V ghv = V{};
      const V gfv = V{} + gf[g * Lqp + i], invv = V{} + inv;
      for (int64_t j = 0; j < Lkp; j += L)
        row.pairs(x, ot, Lkp, j, vload(wr + j), vload(gyr + j), gfv, invv, acc, ghv);
      for (int64_t d = 0; d < D; ++d) gxq[r * D + d] = reduce_add<T>(acc[d]);
      gh[r] = -reduce_add<T>(ghv) * row.inv_h;
    }
    // (the implicit barrier: pass 2 reads every row's inv_s)
    // Pass 2: one key row each; the pair's unit vector is negated for the key.
#pragma omp for schedule(dynamic, 8) nowait
    for (int64_t r = 0; r < G * Lk; ++r) {
      if (!acc) continue;
      const int64_t g = r / Lk;
      const T h = hs[g];
      const NwRow<T> row{p.kernel, h, T(1) / h, T(1) / (h * h), D};
      for (int64_t d = 0; d < D; ++d) acc[d] = V{};
      V ghv = V{};
      const T* x = xk + r * D;
      const T* ot = xq_t + g * D * Lqp;
      for (int64_t i = 0; i < Lqp; i += L)
        row.pairs(x, ot, Lqp, i, vload(w_t + r * Lqp + i), vload(gy_t + r * Lqp + i),
                  vload(gf + g * Lqp + i), vload(inv_s + g * Lqp + i), acc, ghv);
      for (int64_t d = 0; d < D; ++d) gxk[r * D + d] = reduce_add<T>(acc[d]);
    }
    std::free(acc);
  }
  return ok;
}

}  // namespace family

// float32 compute serves float32 arrays and the 16-bit storage types (params.storage).
bool nadaraya_watson_f32(const FamilyParams& params) {
  return with_float_storage(
      params.storage, [&](auto s) { return family::nadaraya_watson<float, decltype(s)>(params); });
}
bool nadaraya_watson_f64(const FamilyParams& params) {
  return family::nadaraya_watson<double>(params);
}
bool nadaraya_watson_backward_f32(const NwBackwardParams& params) {
  return family::nadaraya_watson_backward<float>(params);
}
bool nadaraya_watson_backward_f64(const NwBackwardParams& params) {
  return family::nadaraya_watson_backward<double>(params);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

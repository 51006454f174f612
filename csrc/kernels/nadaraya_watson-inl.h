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

}  // namespace family

// float32 compute serves float32 arrays and the 16-bit storage types (params.storage).
bool nadaraya_watson_f32(const FamilyParams& params) {
  return with_float_storage(
      params.storage, [&](auto s) { return family::nadaraya_watson<float, decltype(s)>(params); });
}
bool nadaraya_watson_f64(const FamilyParams& params) {
  return family::nadaraya_watson<double>(params);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

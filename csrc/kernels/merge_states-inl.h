// Merging partial attention states (fastattn.merge_attention_states), compiled once per ISA
// (in a TU CMake generates from kernels/ops.h). Each part is the attention of the same query
// rows over a disjoint set of keys, with its log-sum-exp; per row, with m = max_i lse_i
// (NaN wins), w_i = e^(lse_i - m) and l = sum_i w_i:
//   lse = m + log(l),  out = sum_i (w_i / l) * out_i.
// Parts with lse_i = -inf saw no key: they are skipped (their rows are never read, so a NaN
// there does not leak); a row where every part is -inf gets zeros and -inf. A NaN or +inf
// lse makes every weight of the row NaN (e^(inf - inf)), so the row and its lse are NaN.
// Rows are split across threads in fixed chunks and each row sums its parts in part order,
// so the result does not depend on the thread count. Memory-bound: each part's row is read
// once, the output row written once.
#pragma once  // per translation unit

#include <omp.h>

#include <cstdint>
#include <cstdlib>

#include "api/params.h"
#include "kernels/parallel-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {
namespace merge {

// out[0:n) = sum_i c[i] * x[i][0:n) for i < k in order (k >= 1), columns in register blocks
// of up to four vectors so the output row is stored once.
template <typename T>
inline void weighted_sum(const T* const* x, const T* c, int64_t k, int64_t n, T* out) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  constexpr int B = 4 * L;
  int64_t j = 0;
  for (; j + B <= n; j += B) {
    const V c0 = vbroadcast(c[0]);
    V a0 = c0 * vload(x[0] + j), a1 = c0 * vload(x[0] + j + L);
    V a2 = c0 * vload(x[0] + j + 2 * L), a3 = c0 * vload(x[0] + j + 3 * L);
    for (int64_t i = 1; i < k; ++i) {
      const V ci = vbroadcast(c[i]);
      const T* xi = x[i] + j;
      a0 = vfma(ci, vload(xi), a0);
      a1 = vfma(ci, vload(xi + L), a1);
      a2 = vfma(ci, vload(xi + 2 * L), a2);
      a3 = vfma(ci, vload(xi + 3 * L), a3);
    }
    vstore(out + j, a0);
    vstore(out + j + L, a1);
    vstore(out + j + 2 * L, a2);
    vstore(out + j + 3 * L, a3);
  }
  for (; j < n; j += L) {  // the same sums, one (possibly partial) vector at a time
    const int64_t w = imin(L, n - j);
    V a = vbroadcast(c[0]) * (w == L ? vload(x[0] + j) : vload_partial(x[0] + j, w));
    for (int64_t i = 1; i < k; ++i)
      a = vfma(vbroadcast(c[i]), w == L ? vload(x[i] + j) : vload_partial(x[i] + j, w), a);
    if (w == L)
      vstore(out + j, a);
    else
      vstore_partial(out + j, a, w);
  }
}

template <typename T>
bool merge_states(const MergeStatesParams& p) {
  constexpr T kNegInf = -T(__builtin_inf());
  const int64_t nd = p.row_ndim, n = p.dim_v, parts = p.num_parts;
  int64_t rows = 1;
  for (int64_t d = 0; d < nd; ++d) rows *= p.row_shape[d];
  if (rows == 0) return true;
  // Chunks of about 16K output entries per part: many per thread, cheap to schedule.
  const int64_t chunk = imax(1, (int64_t(1) << 14) / imax(1, n * parts));
  const int64_t chunks = (rows + chunk - 1) / chunk;
  const int threads = int(imax(1, imin(p.num_threads, chunks)));
  bool failed = false;
  parallel_region(threads, [&] {
    // Per row: the parts that saw a key (their output rows and weights).
    const size_t bytes = size_t(parts) * (sizeof(const T*) + 2 * sizeof(T));
    void* scratch = std::malloc(bytes);
    if (!scratch) {
#pragma omp atomic write
      failed = true;
    }
    const T** x = static_cast<const T**>(scratch);
    T* lse_i = reinterpret_cast<T*>(x + parts);
    T* c = lse_i + parts;
    int64_t coord[kMaxRowDims];
#pragma omp for schedule(static) nowait  // (each thread frees only its own scratch)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      if (!scratch || interrupted()) continue;  // (Ctrl-C: the call raises)
      const int64_t r0 = ch * chunk, r1 = imin(rows, r0 + chunk);
      for (int64_t d = nd - 1, rest = r0; d >= 0; --d) {
        coord[d] = rest % p.row_shape[d];
        rest /= p.row_shape[d];
      }
      for (int64_t r = r0; r < r1; ++r) {
        // The row's max lse (NaN wins) and the parts that saw a key.
        T m = kNegInf;
        int64_t k = 0;
        for (int64_t i = 0; i < parts; ++i) {
          int64_t lo = 0, oo = 0;
          for (int64_t d = 0; d < nd; ++d) {
            lo += coord[d] * p.lses[i].row_stride[d];
            oo += coord[d] * p.outputs[i].row_stride[d];
          }
          const T li = static_cast<const T*>(p.lses[i].data)[lo];
          m = (li > m || li != li) ? li : m;
          if (li == kNegInf) continue;
          x[k] = static_cast<const T*>(p.outputs[i].data) + oo;
          lse_i[k++] = li;
        }
        int64_t oo = 0, lo = 0;
        for (int64_t d = 0; d < nd; ++d) {
          oo += coord[d] * p.out.row_stride[d];
          lo += coord[d] * p.lse.row_stride[d];
        }
        T* out = static_cast<T*>(const_cast<void*>(p.out.data)) + oo;
        T* lse = static_cast<T*>(const_cast<void*>(p.lse.data)) + lo;
        if (k == 0) {  // no part saw a key
          for (int64_t j = 0; j < n; ++j) out[j] = T(0);
          *lse = kNegInf;
        } else {
          T l = T(0);
          for (int64_t i = 0; i < k; ++i) {
            c[i] = exp_approx(lse_i[i] - m);
            l += c[i];
          }
          const T inv = T(1) / l;
          for (int64_t i = 0; i < k; ++i) c[i] *= inv;
          weighted_sum<T>(x, c, k, n, out);
          // In double: once |m| is large, m + log(l) in T would lose log(l).
          *lse = T(double(m) + __builtin_log(double(l)));
        }
        for (int64_t d = nd - 1; d >= 0; --d) {  // next row: odometer over the row axes
          if (++coord[d] < p.row_shape[d]) break;
          coord[d] = 0;
        }
      }
    }
    std::free(scratch);
  });
  return !failed;
}

}  // namespace merge

bool merge_states_f32(const MergeStatesParams& params) {
  return merge::merge_states<float>(params);
}
bool merge_states_f64(const MergeStatesParams& params) {
  return merge::merge_states<double>(params);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

// Masked softmax over one axis (d2l's masked_softmax, generalised), compiled once per ISA
// (in a TU CMake generates from kernels/ops.h). Memory-bound, so one read of x from memory per row:
// pass 1 takes the max of the kept entries, pass 2 writes e^(x - max) (0 where not kept; the
// exp of online_softmax-inl.h) and sums it while the row is in L1, pass 3 scales the row by 1/sum
// in place. A row whose kept entries are all -inf (or that keeps nothing) is all zeros; a NaN or
// +inf among the kept entries makes the whole row NaN. Entries past the row's valid length are
// never read. Rows are split across threads in fixed chunks; each row is one thread's, start to
// finish. x/out stored as a 16-bit float S are widened row by row into the (float32)
// scratch and the row rounded to S as it is written: never a whole-array copy.
//
// The backward (masked_softmax_backward) runs the same rows: x holds the weights w, grad
// the gradient g of the result, and each kept entry gets w * (g - sum(w * g)) (the sum
// over the row's kept entries, lane by lane then across the lanes: a fixed order, so the
// same bits on any thread count); entries not kept get 0 and are not read.
#pragma once  // per translation unit

#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "api/params.h"
#include "kernels/online_softmax-inl.h"
#include "kernels/parallel-inl.h"
#include "simd/convert-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {
namespace softmax {

// One row: x[0:n) (x already gathered to unit stride), keep mask m (null = keep all),
// entries [0, ne) may be kept (ne = the valid length), o[0:n) written.
template <typename T>
void softmax_row(const T* x, const uint8_t* m, int64_t n, int64_t ne, T* o) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  constexpr T kNegInf = -T(__builtin_inf());
  const V ninf = V{} + kNegInf;
  const int64_t nv = ne / L * L;

  V vmax = ninf;
  if (m) {
    for (int64_t j = 0; j < nv; j += L) {
      const V xv = vkeep<T>(m + j) ? vload(x + j) : ninf;
      vmax = (xv > vmax) | (xv != xv) ? xv : vmax;
    }
  } else {
    for (int64_t j = 0; j < nv; j += L) {
      const V xv = vload(x + j);
      vmax = (xv > vmax) | (xv != xv) ? xv : vmax;
    }
  }
  T mx = reduce_max_nan<T>(vmax);
  for (int64_t j = nv; j < ne; ++j) {
    const T v = (!m || m[j]) ? x[j] : kNegInf;
    mx = (v > mx || v != v) ? v : mx;
  }
  if (mx == kNegInf) {  // nothing kept (or only -inf): all zeros
    for (int64_t j = 0; j < n; ++j) o[j] = T(0);
    return;
  }

  V vsum = V{};
  const V zero = V{};
  if (m) {
    for (int64_t j = 0; j < nv; j += L) {
      // Masked lanes were not in mx: they go to the exp as -inf (softmax_exp_vec takes
      // s <= m) and to the output as 0 (a NaN row max must not reach them).
      const auto keep = vkeep<T>(m + j);
      const V e = softmax_exp_vec(keep ? vload(x + j) : ninf, mx);
      const V w = keep ? e : zero;
      vstore(o + j, w);
      vsum += w;
    }
  } else {
    for (int64_t j = 0; j < nv; j += L) {
      const V e = softmax_exp_vec(vload(x + j), mx);
      vstore(o + j, e);
      vsum += e;
    }
  }
  T sum = reduce_add<T>(vsum);
  for (int64_t j = nv; j < ne; ++j) {
    const T e = (!m || m[j]) ? softmax_exp(x[j], mx) : T(0);
    o[j] = e;
    sum += e;
  }

  const T inv = T(1) / sum;  // NaN when a kept entry was NaN or +inf: the whole row NaN
  for (int64_t j = 0; j < nv; j += L) vstore(o + j, vload(o + j) * inv);
  for (int64_t j = nv; j < ne; ++j) o[j] *= inv;
  for (int64_t j = ne; j < n; ++j) o[j] = T(0) * inv;
}

// The backward of one row: w, g [0:n) (unit stride), keep mask m as softmax_row's,
// o[0:n) = the gradient of the softmax's input.
template <typename T>
void softmax_backward_row(const T* w, const T* g, const uint8_t* m, int64_t n, int64_t ne, T* o) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  const int64_t nv = ne / L * L;
  const V zero = V{};
  V vdot = zero;
  if (m) {
    for (int64_t j = 0; j < nv; j += L)
      vdot += vkeep<T>(m + j) ? vload(w + j) * vload(g + j) : zero;
  } else {
    for (int64_t j = 0; j < nv; j += L) vdot += vload(w + j) * vload(g + j);
  }
  T dot = reduce_add<T>(vdot);
  for (int64_t j = nv; j < ne; ++j)
    if (!m || m[j]) dot += w[j] * g[j];
  const V vd = zero + dot;
  if (m) {
    for (int64_t j = 0; j < nv; j += L)
      vstore(o + j, vkeep<T>(m + j) ? vload(w + j) * (vload(g + j) - vd) : zero);
  } else {
    for (int64_t j = 0; j < nv; j += L) vstore(o + j, vload(w + j) * (vload(g + j) - vd));
  }
  for (int64_t j = nv; j < ne; ++j) o[j] = (!m || m[j]) ? w[j] * (g[j] - dot) : T(0);
  for (int64_t j = ne; j < n; ++j) o[j] = T(0);
}

// The forward (kBackward false: x -> out) or the backward (weights x and grad -> out).
template <typename T, typename S, bool kBackward>
bool masked_softmax_rows(const MaskedSoftmaxParams& p) {
  const int64_t n = p.len, nd = p.row_ndim;
  int64_t rows = 1;
  for (int64_t d = 0; d < nd; ++d) rows *= p.row_shape[d];
  if (rows == 0 || n == 0) return true;
  // Chunks of about 16K entries: enough to amortise the scheduling, many per thread.
  const int64_t chunk = imax(1, (int64_t(1) << 14) / n);
  const int64_t chunks = (rows + chunk - 1) / chunk;
  const int threads = int(imax(1, imin(p.num_threads, chunks)));
  // Rows read and written in place when stored as T with unit stride, else via scratch.
  constexpr bool kSame = std::is_same_v<S, T>;
  const bool x_unit = kSame && p.x.col_stride == 1, o_unit = kSame && p.out.col_stride == 1;
  const bool g_unit = !kBackward || (kSame && p.grad.col_stride == 1);
  const bool m_unit = !p.mask.data || p.mask.col_stride == 1 || p.mask.col_stride == 0;
  bool failed = false;
  parallel_region(threads, [&] {
    // Scratch for rows that are not unit-stride: gathered x, the row's output, its mask.
    T* xbuf = nullptr;
    T* obuf = nullptr;
    T* gbuf = nullptr;
    uint8_t* mbuf = nullptr;
    const size_t bytes = size_t((n * int64_t(sizeof(T)) + 63) / 64 * 64);
    bool ok = true;
    if (!x_unit) ok = ok && (xbuf = static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!o_unit) ok = ok && (obuf = static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!g_unit) ok = ok && (gbuf = static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!m_unit)
      ok = ok && (mbuf = static_cast<uint8_t*>(std::aligned_alloc(64, size_t((n + 63) / 64 * 64))));
    if (!ok) {
#pragma omp atomic write
      failed = true;
    }
    int64_t coord[kMaxRowDims];
#pragma omp for schedule(static) nowait  // (each thread frees only its own scratch)
    for (int64_t c = 0; c < chunks; ++c) {
      if (!ok || interrupted()) continue;  // (Ctrl-C: the call raises)
      const int64_t r0 = c * chunk, r1 = imin(rows, r0 + chunk);
      int64_t xo = 0, oo = 0, mo = 0, vo = 0, go = 0;  // element offsets of row r
      for (int64_t d = nd - 1, rest = r0; d >= 0; --d) {
        coord[d] = rest % p.row_shape[d];
        rest /= p.row_shape[d];
        xo += coord[d] * p.x.row_stride[d];
        oo += coord[d] * p.out.row_stride[d];
        mo += coord[d] * p.mask.row_stride[d];
        vo += coord[d] * p.valid_lens.row_stride[d];
        go += coord[d] * p.grad.row_stride[d];
      }
      for (int64_t r = r0; r < r1; ++r) {
        int64_t ne = n;
        if (p.valid_lens.data)
          ne = imax(0, imin(n, static_cast<const int64_t*>(p.valid_lens.data)[vo]));
        const uint8_t* m = nullptr;
        if (p.mask.data) {
          const uint8_t* mr = static_cast<const uint8_t*>(p.mask.data) + mo;
          const int64_t ms = p.mask.col_stride;
          if (ms == 0) {
            if (!mr[0]) ne = 0;  // one flag for the whole row
          } else if (ms == 1) {
            m = mr;
          } else {
            for (int64_t j = 0; j < ne; ++j) mbuf[j] = mr[j * ms];
            m = mbuf;
          }
        }
        const S* xs = static_cast<const S*>(p.x.data) + xo;
        const T* xr = reinterpret_cast<const T*>(xs);  // used as is only when x_unit
        if (!x_unit) {
          for (int64_t j = 0; j < ne; ++j) xbuf[j] = widen<T>(xs[j * p.x.col_stride]);
          xr = xbuf;
        }
        S* outr = static_cast<S*>(const_cast<void*>(p.out.data)) + oo;
        T* orow = o_unit ? reinterpret_cast<T*>(outr) : obuf;
        if constexpr (kBackward) {
          const S* gs = static_cast<const S*>(p.grad.data) + go;
          const T* gr = reinterpret_cast<const T*>(gs);
          if (!g_unit) {
            for (int64_t j = 0; j < ne; ++j) gbuf[j] = widen<T>(gs[j * p.grad.col_stride]);
            gr = gbuf;
          }
          softmax_backward_row<T>(xr, gr, m, n, ne, orow);
        } else {
          softmax_row<T>(xr, m, n, ne, orow);
        }
        if (!o_unit)
          for (int64_t j = 0; j < n; ++j) outr[j * p.out.col_stride] = narrow<S>(obuf[j]);
        // Next row: odometer over the row axes.
        for (int64_t d = nd - 1; d >= 0; --d) {
          xo += p.x.row_stride[d];
          oo += p.out.row_stride[d];
          mo += p.mask.row_stride[d];
          vo += p.valid_lens.row_stride[d];
          go += p.grad.row_stride[d];
          if (++coord[d] < p.row_shape[d]) break;
          xo -= p.x.row_stride[d] * p.row_shape[d];
          oo -= p.out.row_stride[d] * p.row_shape[d];
          mo -= p.mask.row_stride[d] * p.row_shape[d];
          vo -= p.valid_lens.row_stride[d] * p.row_shape[d];
          go -= p.grad.row_stride[d] * p.row_shape[d];
          coord[d] = 0;
        }
      }
    }
    std::free(xbuf);
    std::free(obuf);
    std::free(gbuf);
    std::free(mbuf);
  });
  return !failed;
}

}  // namespace softmax

bool masked_softmax_f32(const MaskedSoftmaxParams& params) {
  return with_float_storage(params.storage, [&](auto s) {
    return softmax::masked_softmax_rows<float, decltype(s), false>(params);
  });
}
bool masked_softmax_f64(const MaskedSoftmaxParams& params) {
  return softmax::masked_softmax_rows<double, double, false>(params);
}
bool masked_softmax_backward_f32(const MaskedSoftmaxParams& params) {
  return with_float_storage(params.storage, [&](auto s) {
    return softmax::masked_softmax_rows<float, decltype(s), true>(params);
  });
}
bool masked_softmax_backward_f64(const MaskedSoftmaxParams& params) {
  return softmax::masked_softmax_rows<double, double, true>(params);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

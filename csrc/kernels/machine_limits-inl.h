// Machine-limit probes of the active ISA, compiled once per ISA like every kernel:
//   fma_peak: GFLOP/s of independent chains of vector FMAs (an FMA counts as 2 flops;
//             the harness, chain_peak-inl.h, is the vdpbf16ps probe's too);
//   read_bandwidth: GB/s of a vectorised sum over a buffer larger than the caches.
#pragma once  // per translation unit

#include <omp.h>

#include <cstdint>
#include <cstdlib>

#include "kernels/chain_peak-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// Runs FMA chains until `seconds` have passed; returns GFLOP/s over all threads.
template <typename T>
double fma_peak(int num_threads, double seconds) {
  using V = Vec<T>;
  // acc = acc * m + a converges to a / (1 - m): bounded, never denormal.
  const V m = vbroadcast(T(0.999)), a = vbroadcast(T(0.001));
  return chain_peak(
      num_threads, seconds, 2.0 * kLanes<T>, [](int c) { return vbroadcast(T(c)); },
      [m, a](V acc) { return vfma(acc, m, a); },
      [](const V* acc) {
        V total = {};
        for (int c = 0; c < kChains; ++c) total += acc[c];
        return double(reduce_add<T>(total));
      });
}

// The best of `repeats` parallel sums over nbytes of T (first touched by the threads that
// read them); GB/s, or -1 when the buffer could not be allocated.
template <typename T>
double read_bandwidth(int64_t nbytes, int num_threads, int repeats) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  const int64_t n = imax(4 * L, nbytes / int64_t(sizeof(T)) / (4 * L) * (4 * L));
  T* x = static_cast<T*>(std::aligned_alloc(64, size_t(n) * sizeof(T)));
  if (!x) return -1;
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = T(i & 7);
  double best = 0, sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(num_threads) reduction(+ : sink)
    {
      V a0 = {}, a1 = {}, a2 = {}, a3 = {};
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < n; i += 4 * L) {
        a0 += vload(x + i);
        a1 += vload(x + i + L);
        a2 += vload(x + i + 2 * L);
        a3 += vload(x + i + 3 * L);
      }
      sink += double(reduce_add<T>((a0 + a1) + (a2 + a3)));
    }
    const double gbs = double(n) * double(sizeof(T)) / (omp_get_wtime() - t0) / 1e9;
    best = gbs > best ? gbs : best;
  }
  volatile double keep = sink;
  (void)keep;
  std::free(x);
  return best;
}

double fma_peak_f32(int num_threads, double seconds) {
  return fma_peak<float>(num_threads, seconds);
}
double fma_peak_f64(int num_threads, double seconds) {
  return fma_peak<double>(num_threads, seconds);
}
double read_bandwidth_f32(int64_t nbytes, int num_threads, int repeats) {
  return read_bandwidth<float>(nbytes, num_threads, repeats);
}
double read_bandwidth_f64(int64_t nbytes, int num_threads, int repeats) {
  return read_bandwidth<double>(nbytes, num_threads, repeats);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

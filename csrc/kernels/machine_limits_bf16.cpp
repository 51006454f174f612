// The avx512bf16 machine-limit probe (its own TU in the avx512bf16 object library, built
// with -mavx512bf16, so vdpbf16ps is never reachable on a CPU without it: dispatch/isa.cpp
// calls it only while the avx512bf16 ISA is active). bf16_dot_peak: GFLOP/s of independent
// chains of vdpbf16ps, the instruction bfloat16 SDPA's Q K^T and P V run on; one
// instruction is 16 lanes x 2 bfloat16 products, each multiply-add counted as 2 flops, as
// the attention flop counts are. As fma_peak (machine_limits-inl.h), each thread times its
// own work.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>

#include "kernels/ops.h"

namespace fastattn {
namespace avx512bf16 {

double bf16_dot_peak(int num_threads, double seconds) {
  constexpr int kChains = 12;          // covers the latency on both ports (as fma_peak)
  constexpr int64_t kSteps = 1 << 14;  // instructions per chain between two clock reads
  constexpr int kFlops = 16 * 2 * 2;   // per instruction
  double flops = 0, sink = 0;
  const double start = omp_get_wtime();
  double end = start;
#pragma omp parallel num_threads(num_threads) reduction(+ : flops, sink) reduction(max : end)
  {
    // acc += 2 * 2^-10 * 2^-10 per step: a slow climb from c, never denormal, never
    // reaching overflow within any probe's length.
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0x1p-10f), _mm512_set1_ps(0x1p-10f));
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(float(c));
    int64_t rounds = 0;
    double now = omp_get_wtime();
    while (now - start < seconds) {
      for (int64_t s = 0; s < kSteps; ++s)
        for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, a);
      ++rounds;
      now = omp_get_wtime();
    }
    flops += double(kFlops) * double(rounds * kSteps) * kChains;
    __m512 total = _mm512_setzero_ps();
    for (int c = 0; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
    sink += double(_mm512_reduce_add_ps(total));  // keeps the chains live
    end = now;
  }
  volatile double keep = sink;
  (void)keep;
  return flops / (end - start) / 1e9;
}

}  // namespace avx512bf16
}  // namespace fastattn

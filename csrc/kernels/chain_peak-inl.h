// The timing harness of the throughput probes (machine_limits-inl.h's fma_peak, the
// vdpbf16ps probe of machine_limits_bf16.cpp): kChains independent accumulators, enough to
// cover an FMA unit's latency on every port of current x86 cores (latency 4-5 x 2 ports),
// each stepped until `seconds` have passed; each thread times its own work. Per ISA
// (include only inside a TU that defines FASTATTN_ISA_NS).
#pragma once  // per translation unit

#include <omp.h>

#include <cstdint>

namespace fastattn {
namespace FASTATTN_ISA_NS {

constexpr int kChains = 12;

// GFLOP/s over all threads of acc = step(acc) on kChains accumulators started at init(c),
// each step worth flops_per_step; sum(acc) (the chains' total) keeps them live.
template <typename Init, typename Step, typename Sum>
double chain_peak(int num_threads, double seconds, double flops_per_step, Init init, Step step,
                  Sum sum) {
  using Acc = decltype(init(0));
  constexpr int64_t kSteps = 1 << 14;  // steps per chain between two clock reads
  double flops = 0, sink = 0;
  const double start = omp_get_wtime();
  double end = start;
#pragma omp parallel num_threads(num_threads) reduction(+ : flops, sink) reduction(max : end)
  {
    Acc acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = init(c);
    // At least one round per thread: a thread that starts after `seconds` have passed (a
    // loaded machine, or qemu, where starting a thread takes tens of ms) still measures, so
    // the figure is never 0 (bf16_dot_peak(2, 0.02) gave 0.0 under qemu at load 16).
    int64_t rounds = 0;
    double now;
    do {
      for (int64_t s = 0; s < kSteps; ++s)
        for (int c = 0; c < kChains; ++c) acc[c] = step(acc[c]);
      ++rounds;
      now = omp_get_wtime();
    } while (now - start < seconds);
    flops += flops_per_step * double(rounds * kSteps) * kChains;
    sink += sum(acc);
    end = now;
  }
  volatile double keep = sink;
  (void)keep;
  return flops / (end - start) / 1e9;
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

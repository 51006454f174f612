// The avx512bf16 machine-limit probe (its own TU in the avx512bf16 object library, built
// with -mavx512bf16, so vdpbf16ps is never reachable on a CPU without it: dispatch/isa.cpp
// calls it only while the avx512bf16 ISA is active). bf16_dot_peak: GFLOP/s of independent
// chains of vdpbf16ps, the instruction bfloat16 SDPA's Q K^T and P V run on; one
// instruction is 16 lanes x 2 bfloat16 products, each multiply-add counted as 2 flops, as
// the attention flop counts are. The harness is fma_peak's (chain_peak-inl.h).
#define FASTATTN_ISA_NS avx512bf16
#include <immintrin.h>

#include "kernels/chain_peak-inl.h"
#include "kernels/ops.h"

namespace fastattn {
namespace avx512bf16 {

double bf16_dot_peak(int num_threads, double seconds) {
  // acc += 2 * 2^-10 * 2^-10 per step: a slow climb from c, never denormal, never reaching
  // overflow within any probe's length.
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0x1p-10f), _mm512_set1_ps(0x1p-10f));
  return chain_peak(
      num_threads, seconds, 16 * 2 * 2,  // per instruction: 16 lanes x 2 products x 2 flops
      [](int c) { return _mm512_set1_ps(float(c)); },
      [a](__m512 acc) { return _mm512_dpbf16_ps(acc, a, a); },
      [](const __m512* acc) {
        __m512 total = _mm512_setzero_ps();
        for (int c = 0; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
        return double(_mm512_reduce_add_ps(total));
      });
}

}  // namespace avx512bf16
}  // namespace fastattn

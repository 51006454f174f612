// The bfloat16 dot-product ISAs' machine-limit probe (its own TU in the avx512bf16 or
// neon_bf16 object library, built with -mavx512bf16 or -march=armv8.2-a+bf16, so the
// instruction is never reachable on a CPU without it: dispatch/isa.cpp calls it only while
// that ISA is active). bf16_dot_peak: GFLOP/s of independent chains of the instruction
// bfloat16 SDPA's Q K^T and P V run on (vdpbf16ps: 16 lanes, BFDOT: 4 lanes, each lane
// 2 bfloat16 products), each multiply-add counted as 2 flops, as the attention flop counts
// are. The harness is fma_peak's (chain_peak-inl.h).
#if defined(__aarch64__)
#define FASTATTN_ISA_NS neon_bf16
#include <arm_neon.h>
#else
#define FASTATTN_ISA_NS avx512bf16
#include <immintrin.h>
#endif

#include "kernels/chain_peak-inl.h"
#include "kernels/ops.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

#if defined(__aarch64__)

double bf16_dot_peak(int num_threads, double seconds) {
  // acc += 2 * 2^-10 * 2^-10 per step: a slow climb from c, never denormal, never reaching
  // overflow within any probe's length.
  const bfloat16x8_t a =
      vcombine_bf16(vcvt_bf16_f32(vdupq_n_f32(0x1p-10f)), vcvt_bf16_f32(vdupq_n_f32(0x1p-10f)));
  return chain_peak(
      num_threads, seconds, 4 * 2 * 2,  // per instruction: 4 lanes x 2 products x 2 flops
      [](int c) { return vdupq_n_f32(float(c)); },
      [a](float32x4_t acc) { return vbfdotq_f32(acc, a, a); },
      [](const float32x4_t* acc) {
        float32x4_t total = vdupq_n_f32(0);
        for (int c = 0; c < kChains; ++c) total = vaddq_f32(total, acc[c]);
        return double(vaddvq_f32(total));
      });
}

#else

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

#endif

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

// Which instruction set the kernels run with: detected once (cpuid + OS support),
// overridable with FASTATTN_ISA (applied by fastattn/__init__.py through set_isa).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace fastattn {

// kAvx512Bf16: the avx512 kernels, bfloat16 SDPA with vdpbf16ps (AVX512-BF16).
// kNeon: aarch64's Advanced SIMD kernels (FMLA, 32-register tiles).
// kNeonBf16: the neon kernels, bfloat16 SDPA with BFDOT (Arm FEAT_BF16).
enum class Isa { kScalar = 0, kBaseline, kAvx2, kAvx512, kAvx512Bf16, kNeon, kNeonBf16 };

// One ISA's kernels: a name_f32 and a name_f64 pointer per entry of FASTATTN_OPS.
struct KernelTable {
  Isa isa;
  const char* name;
#define FASTATTN_TABLE_FIELD(source, name, Sig) \
  Sig<float>* name##_f32;                       \
  Sig<double>* name##_f64;
  FASTATTN_OPS(FASTATTN_TABLE_FIELD)
#undef FASTATTN_TABLE_FIELD
};

// ISAs this build compiled and this CPU/OS can run, best last.
std::vector<std::string> available_isas();
// Whether the CPU and OS support AVX512-BF16 (vdpbf16ps), for show_config; the avx512bf16
// ISA (when compiled in) uses it for bfloat16 SDPA.
bool cpu_has_avx512_bf16();
// GFLOP/s of the bfloat16 dot-product instruction's chains (bfloat16 SDPA's products:
// vdpbf16ps, BFDOT) on num_threads threads for about `seconds`, when the active ISA is
// avx512bf16 or neon_bf16; -1 on any other ISA (no such instruction: bfloat16 is widened to
// float32 there, whose peak is fma_peak's).
double bf16_dot_peak(int num_threads, double seconds);
// The Arm architecture features this CPU (and OS) reports that matter to attention kernels
// (asimd, fp16, bf16, i8mm, dotprod, sve, sve2), by their Linux hwcap names, for show_config
// and fastattn-bench's report: getauxval on Linux, sysctlbyname on macOS; empty elsewhere.
std::vector<std::string> arm_features();
// Names compiled into this build, whether the CPU can run them or not.
std::vector<std::string> compiled_isas();
// The table in use (the best available, unless set_isa chose another).
const KernelTable& active_kernels();
// The L1 data cache size in bytes (sysconf; 32 KiB when the OS does not say), read once.
int64_t l1_data_cache_bytes();
// Select by name; throws std::invalid_argument naming the choices if unknown/unavailable.
void set_isa(const std::string& name);

}  // namespace fastattn

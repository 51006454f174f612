#include "dispatch/isa.h"

#if !defined(_WIN32)
#include <unistd.h>  // sysconf
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>  // getauxval
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>  // sysctlbyname
#endif

#include <atomic>
#include <stdexcept>

namespace fastattn {
namespace {

// One row per ISA, its fields in FASTATTN_OPS order.
#define FASTATTN_TABLE_ENTRY(source, name, Sig) \
  FASTATTN_TABLE_NS::name##_f32, FASTATTN_TABLE_NS::name##_f64,
#define FASTATTN_STRINGIFY(x) #x
#define FASTATTN_NAME_OF(ns) FASTATTN_STRINGIFY(ns)
#define FASTATTN_KERNEL_TABLE(tag) \
  {tag, FASTATTN_NAME_OF(FASTATTN_TABLE_NS), FASTATTN_OPS(FASTATTN_TABLE_ENTRY)}

// A bfloat16 dot-product ISA's row: its widening ISA's row (`wide`) with its own bfloat16 SDPA
// and varlen entries (kernels/sdpa_bf16.cpp), which hand every other dtype to the widening
// kernel: FASTATTN_ISA=avx512 (neon) is the widening path on an avx512bf16 (neon_bf16) CPU.
[[maybe_unused]] KernelTable bf16_dot_table(KernelTable wide, Isa isa, const char* name,
                                            SdpaFn<float>* sdpa, VarlenFn<float>* varlen) {
  wide.isa = isa;
  wide.name = name;
  wide.sdpa_forward_f32 = sdpa;
  wide.sdpa_varlen_f32 = varlen;
  return wide;
}

const KernelTable kTables[] = {
#define FASTATTN_TABLE_NS scalar
    FASTATTN_KERNEL_TABLE(Isa::kScalar),
#undef FASTATTN_TABLE_NS
#define FASTATTN_TABLE_NS baseline
    FASTATTN_KERNEL_TABLE(Isa::kBaseline),
#undef FASTATTN_TABLE_NS
#if defined(FASTATTN_HAVE_AVX2)
#define FASTATTN_TABLE_NS avx2
    FASTATTN_KERNEL_TABLE(Isa::kAvx2),
#undef FASTATTN_TABLE_NS
#endif
#if defined(FASTATTN_HAVE_AVX512)
#define FASTATTN_TABLE_NS avx512
    FASTATTN_KERNEL_TABLE(Isa::kAvx512),
#undef FASTATTN_TABLE_NS
#endif
#if defined(FASTATTN_HAVE_AVX512) && defined(FASTATTN_HAVE_AVX512BF16)
#define FASTATTN_TABLE_NS avx512
    bf16_dot_table(FASTATTN_KERNEL_TABLE(Isa::kAvx512), Isa::kAvx512Bf16, "avx512bf16",
                   avx512bf16::sdpa_forward_f32, avx512bf16::sdpa_varlen_f32),
#undef FASTATTN_TABLE_NS
#endif
#if defined(FASTATTN_HAVE_NEON)
#define FASTATTN_TABLE_NS neon
    FASTATTN_KERNEL_TABLE(Isa::kNeon),
#undef FASTATTN_TABLE_NS
#endif
#if defined(FASTATTN_HAVE_NEON) && defined(FASTATTN_HAVE_NEON_BF16)
#define FASTATTN_TABLE_NS neon
    bf16_dot_table(FASTATTN_KERNEL_TABLE(Isa::kNeon), Isa::kNeonBf16, "neon_bf16",
                   neon_bf16::sdpa_forward_f32, neon_bf16::sdpa_varlen_f32),
#undef FASTATTN_TABLE_NS
#endif
};
constexpr int kNumTables = int(sizeof(kTables) / sizeof(kTables[0]));

#if defined(__aarch64__)
// One Arm feature: its Linux hwcap name, the AT_HWCAP (word 1) or AT_HWCAP2 (word 2) bit
// (the kernel's ABI values, spelled here so an older libc's headers need not have them) and
// the macOS sysctl that reports it (null: none).
struct ArmFeature {
  const char* name;
  int word;
  unsigned long bit;
  const char* sysctl;
};
constexpr ArmFeature kArmFeatures[] = {
    {"asimd", 1, 1ul << 1, "hw.optional.neon"},
    {"fp16", 1, 1ul << 10, "hw.optional.arm.FEAT_FP16"},  // asimdhp: half-precision vectors
    {"dotprod", 1, 1ul << 20, "hw.optional.arm.FEAT_DotProd"},
    {"sve", 1, 1ul << 22, nullptr},
    {"sve2", 2, 1ul << 1, nullptr},
    {"i8mm", 2, 1ul << 13, "hw.optional.arm.FEAT_I8MM"},
    {"bf16", 2, 1ul << 14, "hw.optional.arm.FEAT_BF16"},
};
constexpr int kArmBf16 = 6;  // kArmFeatures' bf16 row
static_assert(kArmFeatures[kArmBf16].word == 2 && kArmFeatures[kArmBf16].bit == 1ul << 14);

bool arm_has(const ArmFeature& f) {
#if defined(__linux__)
  return (getauxval(f.word == 1 ? AT_HWCAP : AT_HWCAP2) & f.bit) != 0;
#elif defined(__APPLE__)
  if (!f.sysctl) return false;
  int value = 0;
  size_t size = sizeof value;
  return sysctlbyname(f.sysctl, &value, &size, nullptr, 0) == 0 && value != 0;
#else
  return f.word == 1 && f.bit == (1ul << 1);  // NEON: part of every Armv8-A CPU
#endif
}
#endif

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
    case Isa::kBaseline:
      return true;
#if defined(__x86_64__) || defined(_M_X64)
    // libgcc's cpu model also checks that the OS saves the YMM/ZMM state (xgetbv).
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512Bf16:
      return cpu_supports(Isa::kAvx512) && __builtin_cpu_supports("avx512bf16");
#endif
#if defined(__aarch64__)
    case Isa::kNeon:
      return arm_has(kArmFeatures[0]);
    case Isa::kNeonBf16:  // BFDOT, BFCVTN
      return cpu_supports(Isa::kNeon) && arm_has(kArmFeatures[kArmBf16]);
#endif
    default:
      return false;
  }
}

int best_index() {
  int best = 0;
  for (int i = 0; i < kNumTables; ++i)
    if (cpu_supports(kTables[i].isa)) best = i;
  return best;
}

std::atomic<int>& active_index() {
  static std::atomic<int> index{best_index()};
  return index;
}

}  // namespace

std::vector<std::string> compiled_isas() {
  std::vector<std::string> names;
  for (const auto& t : kTables) names.push_back(t.name);
  return names;
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(_M_X64)
  // libgcc's cpu model also checks that the OS saves the ZMM state (xgetbv).
  return cpu_supports(Isa::kAvx512Bf16);
#else
  return false;
#endif
}

std::vector<std::string> arm_features() {
  std::vector<std::string> names;
#if defined(__aarch64__)
  for (const ArmFeature& f : kArmFeatures)
    if (arm_has(f)) names.push_back(f.name);
#endif
  return names;
}

double bf16_dot_peak(int num_threads, double seconds) {
#if defined(FASTATTN_HAVE_AVX512) && defined(FASTATTN_HAVE_AVX512BF16)
  // Only while avx512bf16 is active, which set_isa/best_index allow only where it runs.
  if (active_kernels().isa == Isa::kAvx512Bf16)
    return avx512bf16::bf16_dot_peak(num_threads, seconds);
#endif
#if defined(FASTATTN_HAVE_NEON) && defined(FASTATTN_HAVE_NEON_BF16)
  if (active_kernels().isa == Isa::kNeonBf16) return neon_bf16::bf16_dot_peak(num_threads, seconds);
#endif
  (void)num_threads;
  (void)seconds;
  return -1;
}

std::vector<std::string> available_isas() {
  std::vector<std::string> names;
  for (const auto& t : kTables)
    if (cpu_supports(t.isa)) names.push_back(t.name);
  return names;
}

int64_t l1_data_cache_bytes() {
  static const int64_t bytes = [] {
    long n = -1;
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    n = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
    return n >= 4096 && n <= (4 << 20) ? int64_t(n) : int64_t(32 * 1024);
  }();
  return bytes;
}

const KernelTable& active_kernels() { return kTables[active_index().load()]; }

void set_isa(const std::string& name) {
  std::string choices;
  for (int i = 0; i < kNumTables; ++i) {
    if (name == kTables[i].name) {
      if (!cpu_supports(kTables[i].isa))
        throw std::invalid_argument("FASTATTN_ISA='" + name +
                                    "' is compiled in but this CPU (or OS) does not support it");
      active_index().store(i);
      return;
    }
    choices += (choices.empty() ? "'" : ", '") + std::string(kTables[i].name) + "'";
  }
  throw std::invalid_argument("FASTATTN_ISA='" + name + "' is not one of " + choices);
}

}  // namespace fastattn

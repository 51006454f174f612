// Which instruction set the kernels run with: detected once (cpuid + OS support),
// overridable with FASTATTN_ISA (applied by fastattn/__init__.py through set_isa).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/family_params.h"
#include "api/sdpa_params.h"

namespace fastattn {

enum class Isa { kScalar = 0, kBaseline, kAvx2, kAvx512 };

struct KernelTable {
  Isa isa;
  const char* name;
  bool (*sdpa_f32)(const SdpaParams&);
  bool (*sdpa_f64)(const SdpaParams&);
  void (*exp2_f32)(const float*, float*, int64_t);  // the softmax's exp2, for tests
  void (*exp2_f64)(const double*, double*, int64_t);
  // The attention family (csrc/kernels/family.h).
  bool (*masked_softmax_f32)(const MaskedSoftmaxParams&);
  bool (*masked_softmax_f64)(const MaskedSoftmaxParams&);
  bool (*additive_f32)(const FamilyParams&);
  bool (*additive_f64)(const FamilyParams&);
  bool (*project_f32)(const ProjectParams&);
  bool (*project_f64)(const ProjectParams&);
  bool (*select_f32)(const FamilyParams&);
  bool (*select_f64)(const FamilyParams&);
  bool (*nadaraya_watson_f32)(const FamilyParams&);
  bool (*nadaraya_watson_f64)(const FamilyParams&);
};

// ISAs this build compiled and this CPU/OS can run, best last.
std::vector<std::string> available_isas();
// Names compiled into this build, whether the CPU can run them or not.
std::vector<std::string> compiled_isas();
// The table in use (the best available, unless set_isa chose another).
const KernelTable& active_kernels();
// The L1 data cache size in bytes (sysconf; 32 KiB when the OS does not say), read once.
int64_t l1_data_cache_bytes();
// Select by name; throws std::invalid_argument naming the choices if unknown/unavailable.
void set_isa(const std::string& name);

}  // namespace fastattn

#include "api/sdpa.h"

#include "api/errors.h"
#include "api/params.h"
#include "dispatch/isa.h"

namespace fastattn {

void scaled_dot_product_attention(const SdpaCall& c) {
  const char* fn = "sdpa";
  SdpaParams p;
  check_attention(c, fn, "key and query head dims differ", &p);
  require(p.dim_q > 0, fn, "head dim must be positive");
  require(c.softcap >= 0.0, fn, "softcap must be >= 0 (0 = none)");
  p.softcap = c.softcap;
  p.l1_bytes = l1_data_cache_bytes();
  const KernelTable& kernels = active_kernels();
  const bool ok = c.query.itemsize == 4 ? kernels.sdpa_forward_f32(p) : kernels.sdpa_forward_f64(p);
  if (!ok) throw ScratchAllocationError(fn);
}

}  // namespace fastattn

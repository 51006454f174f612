#include "api/sdpa.h"

#include <cfloat>
#include <cmath>

#include "api/errors.h"
#include "api/params.h"
#include "api/threads.h"
#include "dispatch/isa.h"

namespace fastattn {

namespace {

// Calls of fewer multiply-adds (heads x rows x keys x (E + Ev), all batches) than this run
// on one thread: below it, waking a second thread costs more than it saves. Measured on a
// 2-core AVX-512 EPYC, float32 decode steps (1, 8, 1, 64) x Lk keys, timeit
// min-of-25 per call, num_threads=1 against 2: Lk = 64 (65k) 1 thread 10 % faster, Lk =
// 128 (131k) even, Lk = 256 (262k) 2 threads 25 % faster. Results do not depend on it.
constexpr double kOneThreadWork = 1 << 17;
// Calls of fewer multiply-adds than this (a few milliseconds on one core) run on one thread
// while worker threads are marked late (api/threads.h): a scheduler time slice spent
// waiting for a worker would cost them several times their work. Larger calls keep their
// team, whose wait is a small share of them.
constexpr double kShareWork = double(1 << 25);

// A per-key scale of int8 keys/values: float32 of shape key.shape[:-1], unit stride along
// the keys.
StridedView scale_view(const ArrayRef& s, const ArrayRef& key, const char* fn, const char* name) {
  const int64_t nd = key.ndim(), bn = nd - 3;
  require(s.kind == 'f' && s.itemsize == 4 && s.ndim() == nd - 1, fn, name,
          " must be a float32 array of shape key.shape[:-1]");
  for (int64_t d = 0; d < nd - 1; ++d)
    require(s.shape[d] == key.shape[d], fn, name, " must have shape key.shape[:-1]");
  StridedView v;
  v.data = s.data;
  for (int64_t d = 0; d < bn; ++d) v.batch_stride[d] = element_stride(s, d, fn, name);
  v.head_stride = element_stride(s, bn, fn, name);
  v.row_stride = element_stride(s, bn + 1, fn, name);
  require(v.row_stride == 1 || s.shape[bn + 1] <= 1 || is_empty(s), fn, name,
          " must have a unit stride along the keys");
  v.row_stride = 1;
  return v;
}

int threads_for(const AttnParams& p) {
  double work =
      double(p.num_heads_q) * double(p.len_q) * double(p.len_k) * double(p.dim_q + p.dim_v);
  for (int64_t d = 0; d < p.batch_ndim; ++d) work *= double(p.batch_shape[d]);
  return threads_for_work(work, p.num_threads);
}

}  // namespace

int threads_for_work(double multiply_adds, int num_threads) {
  if (multiply_adds < kOneThreadWork || num_threads == 1) return 1;
  // The mark first: resolving the default count reads the affinity (a system call), which
  // made a marked call measurably slower than a num_threads=1 call (3 % at 512 keys).
  if (multiply_adds < kShareWork && team_marked()) return 1;
  return resolve_available(num_threads);
}

void check_sdpa(const SdpaCall& c, const char* fn, SdpaParams* out) {
  SdpaParams& p = *out;
  // The SDPA kernels read 16-bit storage (sdpa-inl.h).
  check_attention(c, fn, "key and query head dims differ", &p, /*storage_ok=*/true);
  require(p.dim_q > 0, fn, "head dim must be positive");
  require(c.softcap >= 0.0, fn, "softcap must be >= 0 (0 = none)");
  // The rule of fastattn/_validation.py's _check_scale, re-checked: the fast path
  // (bindings/register_sdpa.cpp) declines a call whose scale breaks it.
  require(
      std::isfinite(c.scale) && std::fabs(c.scale) <= (c.query.itemsize == 8 ? DBL_MAX : FLT_MAX),
      fn, "scale must be finite in the compute dtype");
  p.softcap = c.softcap;
  const bool int8_kv = p.kv_storage == Storage::kI8;
  require(c.key_scale.present() == int8_kv && c.value_scale.present() == int8_kv, fn,
          "key_scale and value_scale go with int8 key and value, and only with them");
  if (int8_kv) {
    p.key_scale = scale_view(c.key_scale, c.key, fn, "key_scale");
    p.value_scale = scale_view(c.value_scale, c.key, fn, "value_scale");
  }
  p.num_threads = threads_for(p);
  p.l1_bytes = l1_data_cache_bytes();
  p.mask_summary = c.mask_summary;
}

int64_t summarise_bool_mask(const void* data, const int64_t* shape, int64_t ndim, int num_threads,
                            std::vector<uint64_t>* words, int64_t* row_words) {
  // The mask alone, as a call sees it: batch dims, heads (axis -3), rows, keys; C strides.
  AttnParams p;
  p.batch_ndim = ndim >= 3 ? ndim - 3 : 0;
  for (int64_t d = 0; d < p.batch_ndim; ++d) p.batch_shape[d] = shape[d];
  p.num_heads_q = ndim >= 3 ? shape[ndim - 3] : 1;
  p.len_q = shape[ndim - 2];
  p.len_k = shape[ndim - 1];
  p.num_threads = num_threads;
  p.bool_mask.data = data;
  int64_t stride = 1;
  p.bool_mask.col_stride = stride;
  stride *= shape[ndim - 1];
  p.bool_mask.row_stride = stride;
  stride *= shape[ndim - 2];
  if (ndim >= 3) {
    p.bool_mask.head_stride = stride;
    stride *= shape[ndim - 3];
  }
  for (int64_t d = p.batch_ndim - 1; d >= 0; --d) {
    p.bool_mask.batch_stride[d] = stride;
    stride *= shape[d];
  }
  const KernelTable& kernels = active_kernels();
  const int64_t rows = kernels.mask_summary_f32(p, nullptr, row_words);
  words->assign(size_t(rows * *row_words), 0);
  kernels.mask_summary_f32(p, words->data(), row_words);
  return rows;
}

void scaled_dot_product_attention(const SdpaCall& c) {
  const char* fn = "sdpa";
  SdpaParams p;
  check_sdpa(c, fn, &p);
  const KernelTable& kernels = active_kernels();
  const bool ok = c.query.itemsize == 8 ? kernels.sdpa_forward_f64(p) : kernels.sdpa_forward_f32(p);
  if (!ok) throw ScratchAllocationError(fn);
}

}  // namespace fastattn

#include "api/varlen.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "api/errors.h"
#include "api/varlen_params.h"
#include "dispatch/isa.h"

namespace fastattn {

namespace {

// Boundaries of one side: int64, 1-D, C-contiguous, 0 first, `total` last, non-decreasing.
const int64_t* check_boundaries(const ArrayRef& a, int64_t total, const char* fn,
                                const char* name) {
  require(a.present() && a.kind == 'i' && a.itemsize == 8 && a.ndim() == 1 && is_contiguous(a), fn,
          name, " must be a 1-D C-contiguous int64 array");
  require(a.shape[0] >= 1, fn, name, " must hold at least one boundary");
  const int64_t* c = static_cast<const int64_t*>(a.data);
  const int64_t n = a.shape[0] - 1;
  require(c[0] == 0 && c[n] == total, fn, name, " must start at 0 and end at the token count");
  for (int64_t i = 0; i < n; ++i) require(c[i] <= c[i + 1], fn, name, " must be non-decreasing");
  return c;
}

// Sequence n's lse (Hq, len) block, written at Hq * cu_q[n] of `blocks`, into the tokens'
// (total_q, Hq) layout.
template <typename T>
void lse_to_tokens(const T* blocks, const int64_t* cu_q, int64_t num_seqs, int64_t heads,
                   T* tokens) {
  for (int64_t n = 0; n < num_seqs; ++n) {
    const int64_t q0 = cu_q[n], len = cu_q[n + 1] - q0;
    const T* src = blocks + heads * q0;
    T* dst = tokens + heads * q0;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < len; ++i) dst[i * heads + h] = src[h * len + i];
  }
}

}  // namespace

void varlen_attention(const VarlenCall& c) {
  const char* fn = "varlen";
  require(!c.bool_mask.present() && !c.float_mask.present() && !c.valid_lens.present() &&
              !c.lse.present() && !c.weights.present(),
          fn, "takes no masks, valid_lens, lse or weights in the packed call");
  VarlenParams vp;
  SdpaParams& p = vp.packed;
  check_sdpa(c, fn, &p);
  require(p.batch_ndim == 0, fn, "query must be (Hq, total_q, E) in the packed call");
  vp.cu_q = check_boundaries(c.cu_seqlens_q, p.len_q, fn, "cu_seqlens_q");
  vp.cu_k = check_boundaries(c.cu_seqlens_k, p.len_k, fn, "cu_seqlens_k");
  require(c.cu_seqlens_q.shape[0] == c.cu_seqlens_k.shape[0], fn,
          "cu_seqlens_q and cu_seqlens_k must have the same length");
  const int64_t N = c.cu_seqlens_q.shape[0] - 1;
  vp.num_seqs = N;
  vp.bottom_right = c.bottom_right;
  // lse is in the compute dtype: float32 for float16/bfloat16 storage (read as stored).
  const int64_t itemsize = p.storage == Storage::kCompute ? c.query.itemsize : 4;
  if (c.lse_tokens.present())
    require(c.lse_tokens.kind == 'f' && c.lse_tokens.itemsize == itemsize &&
                c.lse_tokens.writeable && c.lse_tokens.ndim() == 2 &&
                c.lse_tokens.shape[0] == p.len_q && c.lse_tokens.shape[1] == p.num_heads_q &&
                is_contiguous(c.lse_tokens),
            fn, "lse must be a writeable C-contiguous (total_q, Hq) array of the query's dtype");

  // Threads for the size of all sequences together; each runs its task cut.
  double work = 0;
  const int64_t heads = p.num_heads_kv > 0 ? p.num_heads_q / p.num_heads_kv : 1;
  const int64_t task_rows = std::max<int64_t>(1, kSdpaTaskRows / std::max<int64_t>(heads, 1));
  // Sequences by the size of their largest task (rows x keys, the rows as sdpa_plan cuts
  // them), largest first; ties keep their order. The result does not depend on the order.
  std::vector<int64_t> order(static_cast<size_t>(N)), cost(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t lq = vp.cu_q[n + 1] - vp.cu_q[n], lk = vp.cu_k[n + 1] - vp.cu_k[n];
    work += double(p.num_heads_q) * double(lq) * double(lk) * double(p.dim_q + p.dim_v);
    order[size_t(n)] = n;
    cost[size_t(n)] = lq == 0 ? -1 : std::min(lq, task_rows) * (lk + 1);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[size_t(a)] > cost[size_t(b)]; });
  vp.order = order.data();
  p.num_threads = threads_for_work(work, c.num_threads);

  const KernelTable& kernels = active_kernels();
  bool ok;
  if (itemsize == 4) {
    std::vector<float> blocks(c.lse_tokens.present() ? size_t(p.len_q * p.num_heads_q) : 0);
    vp.lse = blocks.empty() ? nullptr : blocks.data();
    ok = kernels.sdpa_varlen_f32(vp);
    if (ok && vp.lse)
      lse_to_tokens(blocks.data(), vp.cu_q, N, p.num_heads_q,
                    static_cast<float*>(c.lse_tokens.data));
  } else {
    std::vector<double> blocks(c.lse_tokens.present() ? size_t(p.len_q * p.num_heads_q) : 0);
    vp.lse = blocks.empty() ? nullptr : blocks.data();
    ok = kernels.sdpa_varlen_f64(vp);
    if (ok && vp.lse)
      lse_to_tokens(blocks.data(), vp.cu_q, N, p.num_heads_q,
                    static_cast<double*>(c.lse_tokens.data));
  }
  if (!ok) throw ScratchAllocationError(fn);
}

}  // namespace fastattn

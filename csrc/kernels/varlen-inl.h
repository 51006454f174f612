// Packed variable-length batches (fastattn.varlen_attention): the SDPA engine run over N
// sequences in one parallel region. Each sequence is planned as the one-sequence call
// would be (sdpa_plan: its own tasks, thin or tiled, key splits), so its rows go through
// the same arithmetic and come out bit-identical to scaled_dot_product_attention on that
// sequence alone; the tasks of every sequence form one list, handed out dynamically in
// the order the entry point chose (largest tasks first), so one long sequence beside many
// short ones keeps every thread busy. No padding exists. Compiled in the SDPA TU
// (included at the end of sdpa-inl.h), per ISA.
#pragma once  // per translation unit

#include <omp.h>

#include <cstdint>
#include <cstdlib>

#include "api/varlen_params.h"
#include "kernels/driver-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

// One sequence's plan and its place in the call's work lists.
struct VarlenSeq {
  Plan plan;
  bool thin = false;
  int64_t partial = 0;  // its key splits' offset in the shared partial buffer (elements)
};

// *p (a copy of the packed call) restricted to sequence n; q/k/v/out stored as S.
template <typename T, typename S = T>
inline void varlen_select(const VarlenParams& vp, int64_t n, SdpaParams* p) {
  const SdpaParams& all = vp.packed;
  const int64_t q0 = vp.cu_q[n], k0 = vp.cu_k[n];
  p->len_q = vp.cu_q[n + 1] - q0;
  p->len_k = vp.cu_k[n + 1] - k0;
  p->q.data = static_cast<const S*>(all.q.data) + q0 * all.q.row_stride;
  p->out.data = static_cast<const S*>(all.out.data) + q0 * all.out.row_stride;
  p->k.data = static_cast<const S*>(all.k.data) + k0 * all.k.row_stride;
  p->v.data = static_cast<const S*>(all.v.data) + k0 * all.v.row_stride;
  p->diag_offset = vp.bottom_right ? p->len_k - p->len_q : 0;
  p->lse = vp.lse ? static_cast<T*>(vp.lse) + all.num_heads_q * q0 : nullptr;
}

// The position of `item` among the ranges [start[i], start[i + 1]): the last i with
// start[i] <= item (start non-decreasing, start[0] = 0 <= item < start[count]).
inline int64_t varlen_find(const int64_t* start, int64_t count, int64_t item) {
  int64_t lo = 0, hi = count;  // start[lo] <= item < start[hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (start[mid] <= item)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// One work item of a sequence (merge: its task `item`'s merge) with the engine its plan
// chose, laid out over the thread's scratch (sized for the largest plan of the call).
template <typename T, typename S, bool kThin, bool kSplit>
inline void varlen_item(const SdpaParams& p, const VarlenSeq& s, T* partial, void* raw,
                        int64_t item, bool merge) {
  SdpaShared<T> sh;
  sh.partial = partial + s.partial;
  SdpaEngine<T, S, S, kThin> eng(p, s.plan, sh);
  Arena a;
  a.base = static_cast<char*>(raw);
  RowRef<T, S>* rows = a.take<RowRef<T, S>>(s.plan.max_rows);
  eng.layout(a);
  TaskView<T, S, S> tv;
  const MaskSummary none;  // packed sequences take no mask
  if constexpr (kSplit) {
    if (merge) {
      merge_task<T>(p, s.plan, none, eng, rows, &tv, item);
      return;
    }
  }
  run_item<T, SdpaEngine<T, S, S, kThin>, kSplit>(p, s.plan, none, eng, rows, &tv, item);
}

// S: the storage type of q/k/v/out (float16/bfloat16 read as stored, as in sdpa_forward).
template <typename T, typename S = T>
bool sdpa_varlen(const VarlenParams& vp) {
  const SdpaParams& all = vp.packed;
  const int64_t N = vp.num_seqs;
  if (N == 0 || all.num_heads_q == 0) return true;
  // Per sequence its plan; per position in `order` where its items and merges start.
  auto* seqs = static_cast<VarlenSeq*>(std::malloc(size_t(N) * sizeof(VarlenSeq)));
  auto* starts = static_cast<int64_t*>(std::malloc(size_t(2 * (N + 1)) * sizeof(int64_t)));
  if (!seqs || !starts) {
    std::free(seqs);
    std::free(starts);
    return false;
  }
  int64_t* item_start = starts;
  int64_t* merge_start = starts + N + 1;
  int64_t busy = 0;  // sequences with query rows
  for (int64_t n = 0; n < N; ++n) busy += vp.cu_q[n + 1] > vp.cu_q[n];
  // A sequence's own task cut (block_q) follows its share of the threads; results do not
  // depend on it.
  SdpaParams sp = all;
  sp.num_threads = int(imax(1, all.num_threads / imax(busy, 1)));
  Plan widest;  // the largest scratch any plan needs
  widest.block_k = key_block_size<T>(imax(all.dim_q, 1), all.l1_bytes);
  int64_t partial_count = 0;
  item_start[0] = merge_start[0] = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t n = vp.order[i];
    varlen_select<T, S>(vp, n, &sp);
    VarlenSeq& s = seqs[n];
    s = VarlenSeq();
    int64_t items = 0, merges = 0;
    if (sp.len_q > 0) {
      s.thin = sdpa_plan<T, S>(sp, 1, &s.plan);
      items = s.plan.tasks * s.plan.key_splits;
      widest.max_rows = imax(widest.max_rows, s.plan.max_rows);
      // (bfloat16 products take longer key blocks: sdpa_plan)
      widest.block_k = imax(widest.block_k, s.plan.block_k);
      if (s.plan.key_splits > 1) {
        merges = s.plan.tasks;
        s.partial = partial_count;
        partial_count += s.plan.tasks * s.plan.key_splits * s.plan.max_rows * (all.dim_v + 2);
      }
    }
    item_start[i + 1] = item_start[i] + items;
    merge_start[i + 1] = merge_start[i] + merges;
  }
  const int64_t items = item_start[N], merges = merge_start[N];
  T* partial = nullptr;
  if (partial_count > 0) {
    partial = static_cast<T*>(
        std::aligned_alloc(64, size_t(round_up(partial_count * int64_t(sizeof(T)), 64))));
    if (!partial) {
      std::free(seqs);
      std::free(starts);
      return false;
    }
  }

  bool failed = false;
  const int threads = int(imax(1, imin(all.num_threads, items)));
  parallel_region(threads, [&] {
    SdpaParams p = all;  // this thread's view of the sequence it is working on
    void* raw = arena_allocate([&](Arena& a) {
      a.take<RowRef<T, S>>(widest.max_rows);
      SdpaScratch<T> sc;
      sc.layout(a, all, widest);
    });
    if (!raw) {
#pragma omp atomic write
      failed = true;
    }
    // Items in `order`, one at a time to whichever thread is free.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      if (!raw || interrupted()) continue;  // (Ctrl-C: the call raises, out= unspecified)
      const int64_t i = varlen_find(item_start, N, item);
      const int64_t n = vp.order[i];
      const VarlenSeq& s = seqs[n];
      varlen_select<T, S>(vp, n, &p);
      const int64_t local = item - item_start[i];
      FASTATTN_BOOL_SWITCH(s.thin, kThin, [&] {
        FASTATTN_BOOL_SWITCH(s.plan.key_splits > 1, kSplit, [&] {
          varlen_item<T, S, kThin, kSplit>(p, s, partial, raw, local, false);
        });
      });
    }
    // (the loop's barrier: every split is saved before any merge)
#pragma omp for schedule(dynamic, 1)
    for (int64_t m = 0; m < merges; ++m) {
      if (failed || interrupted()) continue;
      const int64_t i = varlen_find(merge_start, N, m);
      const int64_t n = vp.order[i];
      const VarlenSeq& s = seqs[n];
      varlen_select<T, S>(vp, n, &p);
      FASTATTN_BOOL_SWITCH(s.thin, kThin, [&] {
        varlen_item<T, S, kThin, true>(p, s, partial, raw, m - merge_start[i], true);
      });
    }
    std::free(raw);
  });
  std::free(partial);
  std::free(seqs);
  std::free(starts);
  return !failed;
}

#if !defined(FASTATTN_DPBF16)  // the avx512bf16 TU defines its own entry point
// float32 compute serves float32 arrays and the 16-bit storage types (packed.storage).
bool sdpa_varlen_f32(const VarlenParams& params) {
  return with_float_storage(params.packed.storage,
                            [&](auto s) { return sdpa_varlen<float, decltype(s)>(params); });
}
bool sdpa_varlen_f64(const VarlenParams& params) { return sdpa_varlen<double>(params); }
#endif  // !FASTATTN_DPBF16

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

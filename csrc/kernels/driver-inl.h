// The one blocked attention driver. Every attention kernel (SDPA, additive, hardmax/top-k,
// Nadaraya-Watson) is an engine run by run_blocked: the driver cuts the call into tasks,
// gives each thread one scratch arena, resolves each task's rows and walks the keys they
// see in blocks; the engine scores a key block and folds it into its normaliser's state.
// Per ISA (include only inside a TU that defines FASTATTN_ISA_NS).
//
// Engine interface (E below), for the compute type T:
//   E(const E::Params&, const Plan&, const E::Shared&)   per thread
//   void layout(Arena&)                   its scratch, sized for plan.max_rows rows
//   void begin(const TaskView<T>&)        the task's rows are set up
//   void block(const TaskView<T>&, int64_t kb, int64_t n)   keys [kb, kb + n)
//   void finish(const TaskView<T>&)       writes out (and lse / weights)
// and, for key splits (E::kSplitKeys; see Plan), instead of finish:
//   void save_partial(const TaskView<T>&, int64_t task, int64_t split)
//   void merge(const TaskView<T>&, int64_t task)   rows set up over every key
// Specialisations (thin / tiled scores, key splits) are template parameters of the engine
// and of run_blocked, chosen once per call with FASTATTN_BOOL_SWITCH.
//
// A task is done by one thread start to finish, and key blocks sit at multiples of
// block_k whatever the task, so a row's arithmetic does not depend on how rows are grouped
// into tasks: results are bit-identical for any thread count.
#pragma once  // per translation unit

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "api/params.h"
#include "kernels/attention-inl.h"
#include "kernels/mask_summary-inl.h"
#include "kernels/parallel-inl.h"
#include "simd/vec-inl.h"

// Runs the callable __VA_ARGS__ with `name` a constexpr bool equal to the runtime `cond`
// (a runtime flag becomes a template parameter; the callable is compiled for both values).
#define FASTATTN_BOOL_SWITCH(cond, name, ...) \
  [&] {                                       \
    if (cond) {                               \
      constexpr bool name = true;             \
      return __VA_ARGS__();                   \
    } else {                                  \
      constexpr bool name = false;            \
      return __VA_ARGS__();                   \
    }                                         \
  }()

namespace fastattn {
namespace FASTATTN_ISA_NS {

// How a call is cut into work: tasks of `heads` query heads (see TaskCoord) x block_q query
// rows; keys in blocks of block_k at multiples of block_k; key_splits > 1 splits each
// task's keys into ranges of split_len (a multiple of block_k) whose partial results the
// engine merges.
struct Plan {
  int64_t heads = 1;     // query heads per task (a GQA group, or 1)
  int64_t block_q = 1;   // query rows per head per task
  int64_t q_blocks = 0;  // ceil(len_q / block_q)
  int64_t tasks = 0;     // batch * (num_heads_q / heads) * q_blocks
  int64_t max_rows = 0;  // heads * block_q
  int64_t block_k = 1;
  int64_t key_splits = 1;
  int64_t split_len = 1;
};

// Fills the task counts of a plan whose heads and block_q are set.
inline void plan_tasks(const AttnParams& p, int64_t batch, Plan* plan) {
  plan->q_blocks = (p.len_q + plan->block_q - 1) / plan->block_q;
  plan->tasks = batch * (p.num_heads_q / plan->heads) * plan->q_blocks;
  plan->max_rows = plan->heads * plan->block_q;
}

inline int64_t batch_count(const AttnParams& p) {
  int64_t batch = 1;
  for (int64_t d = 0; d < p.batch_ndim; ++d) batch *= p.batch_shape[d];
  return batch;
}

// What an engine sees of a task: its coordinates, data, rows (visible keys clipped to
// [key_begin, key_end)); S is the storage type of q/out (RowRef), KV that of k/v.
template <typename T, typename S = T, typename KV = S>
struct TaskView {
  TaskCoord c;
  TaskRefs<KV> refs;
  RowRef<T, S>* rows;
  int64_t nrows;
  int64_t key_begin, key_end;
};

// Sets up task t over keys [key_begin, key_end) in *tv; returns the keys its rows see
// (narrowed to what the mask leaves visible when it has a summary).
template <typename T, typename S, typename KV>
inline void open_task(const AttnParams& p, const Plan& plan, const MaskSummary& sum, int64_t t,
                      int64_t key_begin, int64_t key_end, RowRef<T, S>* rows,
                      TaskView<T, S, KV>* tv, int64_t* klo, int64_t* khi) {
  tv->c = task_coord(p, t, plan.heads, plan.block_q, plan.q_blocks);
  tv->rows = rows;
  tv->nrows = tv->c.heads * tv->c.nq;
  tv->key_begin = key_begin;
  tv->key_end = key_end;
  setup_task_rows(p, tv->c, key_begin, key_end, &tv->refs, rows, klo, khi);
  if (sum.data) narrow_task_rows(p, sum, tv->c, tv->refs.coord, rows, klo, khi);
}

// The cache lines of up to kRuns runs of strided rows, asked for (into L2) a few at a time
// while other work runs: an engine's next task's rows, read while this one computes.
struct RowPrefetch {
  static constexpr int kRuns = 4;
  struct Run {
    const char* base;
    int64_t stride, bytes, rows;  // (bytes)
  };
  Run run[kRuns];
  int nrun = 0;
  int64_t at = 0, row = 0, off = 0;  // the next line: run[at], its row, its byte offset
  int64_t per_step = 0;

  void clear() { nrun = 0, at = row = off = 0; }
  int64_t lines() const {
    int64_t n = 0;
    for (int i = 0; i < nrun; ++i) n += run[i].rows * ((run[i].bytes + 127) / 64);
    return n;
  }
  void add(const void* base, int64_t stride, int64_t bytes, int64_t rows) {
    if (nrun < kRuns && bytes > 0 && rows > 0)
      run[nrun++] = Run{static_cast<const char*>(base), stride, bytes, rows};
  }
  // Asks for the next per_step lines (a row's lines from its first byte's line to its last).
  // Always inlined: the SDPA epilogue calls it twice per row, and as calls these cost a
  // vzeroupper and spills around them on every row.
  [[gnu::always_inline]] void step() {
    for (int64_t i = 0; i < per_step && at < nrun; ++i) {
      const Run& u = run[at];
      const char* r = u.base + row * u.stride;
      const char* first =
          r - (reinterpret_cast<uintptr_t>(r) & 63);  // the line holding the row's first byte
      __builtin_prefetch(first + off, 0, 2);
      off += 64;
      if (first + off >= r + u.bytes) {
        off = 0;
        if (++row == u.rows) row = 0, ++at;
      }
    }
  }
};

// Asks for the cache lines of [p, p + bytes) into L2, to be written.
inline void prefetch_for_write(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  const char* end = c + bytes;
  for (c -= reinterpret_cast<uintptr_t>(c) & 63; c < end; c += 64) __builtin_prefetch(c, 1, 2);
}

// Whether engine E reads ahead (E::kPrefetchNext): it then has reads_ahead(p, plan), whether
// it does in this call (decided once here and handed to each thread's engine as `ahead`),
// and prefetch_task(coord), called with the thread's next task before the current task's
// last key block, whose rows it then asks for during that block.
template <typename E, typename = void>
struct prefetches_next : std::false_type {};
template <typename E>
struct prefetches_next<E, std::void_t<decltype(E::kPrefetchNext)>>
    : std::bool_constant<E::kPrefetchNext> {};

// Work item `item` (task item / splits, key split item % splits): its rows opened over the
// split's keys, walked in blocks and finished (or saved as a partial for merge_task).
// run_blocked's loop body, shared with the packed variable-length driver (varlen-inl.h).
// before_last(), when given, is called before the item's last key block (run_blocked then
// picks the thread's next item and lets the engine read its rows during that block).
template <typename T, typename Engine, bool kSplit, typename S, typename KV,
          typename BeforeLast = std::nullptr_t>
inline void run_item(const AttnParams& p, const Plan& plan, const MaskSummary& sum, Engine& eng,
                     RowRef<T, S>* rows, TaskView<T, S, KV>* tv, int64_t item,
                     BeforeLast&& before_last = nullptr) {
  const int64_t splits = kSplit ? plan.key_splits : 1;
  const int64_t t = item / splits, split = item % splits;
  const int64_t key_begin = split * plan.split_len;
  const int64_t key_end = kSplit ? imin(p.len_k, key_begin + plan.split_len) : p.len_k;
  int64_t klo, khi;
  open_task(p, plan, sum, t, key_begin, key_end, rows, tv, &klo, &khi);
  eng.begin(*tv);
  for (int64_t kb = klo / plan.block_k * plan.block_k; kb < khi; kb += plan.block_k) {
    if constexpr (!std::is_same_v<std::decay_t<BeforeLast>, std::nullptr_t>)
      if (kb + plan.block_k >= khi) before_last();
    eng.block(*tv, kb, imin(plan.block_k, khi - kb));
  }
  if constexpr (kSplit)
    eng.save_partial(*tv, t, split);
  else
    eng.finish(*tv);
}

// Task t's key splits, every one saved, merged into its rows' results.
template <typename T, typename Engine, typename S, typename KV>
inline void merge_task(const AttnParams& p, const Plan& plan, const MaskSummary& sum, Engine& eng,
                       RowRef<T, S>* rows, TaskView<T, S, KV>* tv, int64_t t) {
  int64_t klo, khi;
  open_task(p, plan, sum, t, 0, p.len_k, rows, tv, &klo, &khi);
  eng.merge(*tv, t);
}

// Whether engine E reads bool-mask summaries (E::kSkipMasked): its rows' key ranges may then
// be narrowed to the keys the mask leaves visible and its blocks skip hidden chunks
// (row.chunks). Engines whose results outside a row's range depend on that range opt out.
template <typename E, typename = void>
struct skips_masked : std::false_type {};
template <typename E>
struct skips_masked<E, std::void_t<decltype(E::kSkipMasked)>> : std::bool_constant<E::kSkipMasked> {
};

// Runs every task of the call; false if a thread's scratch could not be allocated.
template <typename T, typename Engine, bool kSplit, typename S = T, typename KV = S>
bool run_blocked(const typename Engine::Params& p, const Plan& plan,
                 const typename Engine::Shared& shared) {
  static_assert(!kSplit || Engine::kSplitKeys,
                "this engine's normaliser cannot merge key splits: plan key_splits = 1");
  const int64_t splits = kSplit ? plan.key_splits : 1;
  const int64_t items = plan.tasks * splits;
  bool failed = false;
  const int threads = int(imax(1, imin(p.num_threads, items)));
  // Once per call: which keys the mask hides, so that blocks nobody sees are skipped.
  MaskSummary sum;
  if constexpr (skips_masked<Engine>::value) summarise_mask<T>(p, &sum);
  bool ahead = false;  // whether the engine reads each thread's next task ahead
  if constexpr (prefetches_next<Engine>::value && !kSplit) ahead = Engine::reads_ahead(p, plan);
  std::atomic<int64_t> next_item{0};
  parallel_region(threads, [&] {
    Engine eng(p, plan, shared);
    if constexpr (prefetches_next<Engine>::value && !kSplit) eng.ahead = ahead;
    RowRef<T, S>* rows = nullptr;
    void* raw = arena_allocate([&](Arena& a) {
      rows = a.take<RowRef<T, S>>(plan.max_rows);
      eng.layout(a);
    });
    if (!raw) {
#pragma omp atomic write
      failed = true;
    }
    TaskView<T, S, KV> tv;
    constexpr bool kAhead = prefetches_next<Engine>::value && !kSplit;
    if (kAhead && ahead) {
      // Items handed out one at a time as with schedule(dynamic, 1), but a thread takes its
      // next one when it starts the last key block of the current one, so that the engine
      // reads the next one's rows into the cache while it computes (no key splits here:
      // an item is a task).
      int64_t item = next_item.fetch_add(1, std::memory_order_relaxed);
      while (item < items) {
        int64_t next = -1;
        if (raw && !interrupted())  // (Ctrl-C: the call raises, out= unspecified)
          run_item<T, Engine, kSplit>(p, plan, sum, eng, rows, &tv, item, [&] {
            if (next >= 0) return;
            next = next_item.fetch_add(1, std::memory_order_relaxed);
            if constexpr (kAhead)
              if (next < items)
                eng.prefetch_task(task_coord(p, next, plan.heads, plan.block_q, plan.q_blocks));
          });
        item = next >= 0 ? next : next_item.fetch_add(1, std::memory_order_relaxed);
      }
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < items; ++item) {
        if (!raw || interrupted()) continue;  // (Ctrl-C: the call raises, out= unspecified)
        run_item<T, Engine, kSplit>(p, plan, sum, eng, rows, &tv, item);
      }
    }
    if constexpr (kSplit) {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < plan.tasks; ++t) {
        if (failed || interrupted()) continue;
        merge_task<T>(p, plan, sum, eng, rows, &tv, t);
      }
    }
    std::free(raw);
  });
  release_summary(&sum);
  return !failed;
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

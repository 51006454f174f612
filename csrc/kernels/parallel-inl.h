// parallel_region(threads, body): body() run by `threads` OpenMP threads, or called
// directly on this thread when threads == 1. An OpenMP region costs even with one thread
// (libgomp builds a team and ends it with a barrier), a visible share of a decode step;
// called directly, the body's worksharing loops are orphaned and run whole on this thread.
// Not inside an active parallel region, though (a caller's own OpenMP loop, e.g. Cython's
// prange around the C API): there an orphaned `omp for` would bind to the caller's team and
// share out this call's iterations among threads running other calls, so the body gets a
// team of its own as before.
//
// Sharing the machine (api/threads.h): each region notes how late its workers started. A
// worker that cannot get a core (another process holds it) makes the region wait at its
// closing barrier for a scheduler time slice; after such a region the next small calls run
// on one thread for a while (threads_for_work asks team_marked), so a call costs its work
// on the core it has. Results do not depend on the thread count. The team also sees the
// caller's Ctrl-C flag (CallInterrupt), which the kernels ask between tasks.
#pragma once  // per translation unit

#include <omp.h>

#include <atomic>
#include <cstdint>

#include "api/threads.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

template <typename Body>
inline void parallel_region(int threads, Body&& body) {
  const bool nested = omp_in_parallel();
  if (threads <= 1 && !nested) {
    body();
    return;
  }
  if (nested) {
#pragma omp parallel num_threads(threads)
    body();
    return;
  }
  const int64_t start = now_ns();
  std::atomic<int64_t> latest{0};
  CallInterrupt* const call = t_call_interrupt;  // the caller's Ctrl-C flag, for the team
#pragma omp parallel num_threads(threads)
  {
    const bool worker = omp_get_thread_num() != 0;
    if (worker) {
      const int64_t lag = now_ns() - start;
      int64_t seen = latest.load(std::memory_order_relaxed);
      while (lag > seen && !latest.compare_exchange_weak(seen, lag, std::memory_order_relaxed)) {
      }
      t_call_interrupt = call;  // (pooled threads: set for this region, cleared after it)
    }
    body();
    if (worker) t_call_interrupt = nullptr;
  }
  team_report(threads, latest.load(std::memory_order_relaxed), now_ns() - start);
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

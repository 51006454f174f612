// parallel_region(threads, body): body() run by `threads` OpenMP threads, or called
// directly on this thread when threads == 1. An OpenMP region costs even with one thread
// (libgomp builds a team and ends it with a barrier), a visible share of a decode step;
// called directly, the body's worksharing loops are orphaned and run whole on this thread.
// Not inside an active parallel region, though (a caller's own OpenMP loop, e.g. Cython's
// prange around the C API): there an orphaned `omp for` would bind to the caller's team and
// share out this call's iterations among threads running other calls, so the body gets a
// team of its own as before.
#pragma once  // per translation unit

#include <omp.h>

namespace fastattn {
namespace FASTATTN_ISA_NS {

template <typename Body>
inline void parallel_region(int threads, Body&& body) {
  if (threads <= 1 && !omp_in_parallel()) {
    body();
    return;
  }
#pragma omp parallel num_threads(threads)
  body();
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

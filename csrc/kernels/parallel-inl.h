// parallel_region(threads, body): body() run by `threads` OpenMP threads, or called
// directly on this thread when threads == 1. An OpenMP region costs even with one thread
// (libgomp builds a team and ends it with a barrier), a visible share of a decode step;
// called directly, the body's worksharing loops are orphaned and run whole on this thread.
#pragma once  // per translation unit

#include <omp.h>

namespace fastattn {
namespace FASTATTN_ISA_NS {

template <typename Body>
inline void parallel_region(int threads, Body&& body) {
  if (threads <= 1) {
    body();
    return;
  }
#pragma omp parallel num_threads(threads)
  body();
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn

// Threads and the machine, shared by every kernel call (not per ISA): the CPUs this process
// may use now, whether it is a forked child, the per-call thread cap, and the record of
// whether worker threads have been getting a core (parallel-inl.h reads it).
#pragma once

#include <atomic>
#include <cstdint>

namespace fastattn {

// The CPUs this process may run on now: its affinity mask (read on every call: a job
// scheduler or container may narrow it after import), bounded by a cgroup CPU quota
// (rounded up; the quota file is read again at most once a second). At least 1.
int available_cpus();

// The CPUs a cgroup quota allows, from the text of cgroup v2's cpu.max ("max 100000" or
// "150000 100000") or "quota period" of v1 (quota -1 = none): ceil(quota / period), or 0
// for no limit or text it does not recognise.
int cpus_of_quota(const char* text);

// Whether this process was made by fork() after the library loaded (OpenMP's thread pool
// does not survive a fork: calls there run on one thread).
bool in_forked_child();

// At most this many threads per call (4 per CPU; set by fastattn/_threads.py).
int thread_cap();
void set_thread_cap(int cap);

// A num_threads meaning "the CPUs available", resolved by resolve_available only when a
// call is large enough to use more than one thread (reading the affinity is a system call,
// a visible share of the smallest calls).
constexpr int kAvailableCpus = -2;
// n itself, or for kAvailableCpus the CPUs available; capped; 1 in a forked child.
int resolve_available(int n);

// Monotonic nanoseconds.
int64_t now_ns();

// Whether worker threads have been getting a core. A parallel region whose workers started
// late (another process held the cores) marks the team contended for a while, during which
// team_marked says yes and threads_for_work gives calls of up to a few milliseconds one
// thread: a call then costs its work on the core it has, not a scheduler time slice spent
// waiting for a worker that cannot run. The mark lasts 50 ms. The first call after it wakes
// a probe thread of ours and runs on one thread, as the calls after it do until the probe
// reports: woken on time, it clears the mark; late, it renews it as a late region does. A
// late region or probe soon after the last one (within twice the mark plus 50 ms, a probe
// found on time in between or not) marks twice as long, up to 1.6 s. team_marked is one
// clock read: threads_for_work asks it before reading the CPUs (a system call), so a call
// the mark puts on one thread costs what a num_threads=1 call does.
bool team_marked();
// After a region of `threads` threads: the latest start of a worker and the region's
// length, both from the region's start.
void team_report(int threads, int64_t latest_start_ns, int64_t region_ns);
// team_report's rule for a region of 2+ threads ending at `now` (now_ns()); for tests.
void team_report_at(int64_t latest_start_ns, int64_t region_ns, int64_t now);
// The end of the mark (now_ns() time), 0 if none.
int64_t team_contended_until();
// For tests: clear the record; or mark the team contended now.
void team_reset(bool contended);
// For measurements (bench/shared_cores.py): whether team_marked heeds the mark (default on).
void team_watch(bool on);
bool team_contended();

// Ctrl-C during a long call. The bindings open a CallInterrupt on the calling thread
// (bindings/interruptible.h) before releasing the GIL; parallel_region hands it to its
// team; the kernels ask interrupted() between tasks and skip the rest once it says yes.
// Only the opening thread polls: from 100 ms into the call, every 100 ms, through `poll`
// (which takes the GIL and runs Python's signal handlers), so short calls never poll.
struct CallInterrupt {
  std::atomic<bool> raised{false};
  int64_t next_poll_ns = 0;
  bool (*poll)(CallInterrupt*) = nullptr;  // true: stop (a handler raised)
};
extern thread_local CallInterrupt* t_call_interrupt;  // this thread's call, or null
extern thread_local bool t_polls_interrupt;           // whether this thread polls it
bool poll_interrupt(CallInterrupt* c);                // the slow half of interrupted()
inline bool interrupted() {
  CallInterrupt* c = t_call_interrupt;
  if (!c) return false;
  if (c->raised.load(std::memory_order_relaxed)) return true;
  return t_polls_interrupt && poll_interrupt(c);
}
// Interval between polls (and until the first).
constexpr int64_t kInterruptPollNs = 100'000'000;

}  // namespace fastattn

#include "api/threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#elif !defined(_WIN32)
#include <pthread.h>
#include <unistd.h>
#endif

namespace fastattn {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int cpus_of_quota(const char* text) {
  char quota[32] = {0};
  long long period = 0;
  if (std::sscanf(text, "%31s %lld", quota, &period) != 2 || period <= 0) return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota, &end, 10);
  if (end == quota || *end != '\0' || q <= 0) return 0;  // "max", -1, or not a number
  return int(std::min<long long>((q + period - 1) / period, 1 << 20));
}

namespace {

std::atomic<int> g_cap{1};
std::atomic<bool> g_forked{false};

#if defined(__linux__)
std::string read_small_file(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[512];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    text.assign(buf, n);
  }
  return text;
}

// The tightest CPU quota of this process's cgroup and its ancestors (v2), or of its v1 cpu
// controller; 0 if none.
int cgroup_cpus() {
  int best = 0;
  auto take = [&](int c) {
    if (c > 0 && (best == 0 || c < best)) best = c;
  };
  const std::string self = read_small_file("/proc/self/cgroup");
  size_t pos = 0;
  while (pos < self.size()) {
    size_t eol = self.find('\n', pos);
    if (eol == std::string::npos) eol = self.size();
    const std::string line = self.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.rfind("0::", 0) == 0) {  // v2: cpu.max along the path up to the root
      std::string path = line.substr(3);
      while (true) {
        take(cpus_of_quota(read_small_file("/sys/fs/cgroup" + path + "/cpu.max").c_str()));
        if (path.empty() || path == "/") break;
        path = path.substr(0, path.rfind('/'));
      }
    }
  }
  for (const char* dir : {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"}) {  // v1
    const std::string q = read_small_file(std::string(dir) + "/cpu.cfs_quota_us");
    const std::string p = read_small_file(std::string(dir) + "/cpu.cfs_period_us");
    if (!q.empty() && !p.empty()) {
      take(cpus_of_quota((q.substr(0, q.find('\n')) + " " + p).c_str()));
      break;
    }
  }
  return best;
}
#endif

std::atomic<int64_t> g_quota_read_at{INT64_MIN};
std::atomic<int> g_quota_cpus{0};

struct ForkWatch {
  ForkWatch() {
#if !defined(_WIN32)
    pthread_atfork(nullptr, nullptr, [] { g_forked.store(true, std::memory_order_relaxed); });
#endif
  }
} g_fork_watch;

// The team record (see team_marked).
constexpr int64_t kFirstMark = 50'000'000, kLongestMark = 1'600'000'000;
// A worker that starts this late, and later than a quarter of the region, was waiting for
// a core: an idle worker sleeping in the kernel wakes within tens of microseconds.
constexpr int64_t kLateStart = 200'000;
std::atomic<int64_t> g_contended_until{0};
std::atomic<int64_t> g_mark{kFirstMark};
std::atomic<int64_t> g_last_late{0};  // when a region last found its workers late (0: never)
std::atomic<bool> g_watch{true};

}  // namespace

int available_cpus() {
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  const int64_t now = now_ns();
  const int64_t read_at = g_quota_read_at.load(std::memory_order_relaxed);
  // INT64_MIN: never read (now - INT64_MIN would overflow).
  if (read_at == INT64_MIN || now - read_at > 1'000'000'000) {
    g_quota_read_at.store(now, std::memory_order_relaxed);
    g_quota_cpus.store(cgroup_cpus(), std::memory_order_relaxed);
  }
  const int quota = g_quota_cpus.load(std::memory_order_relaxed);
  if (quota > 0 && (n == 0 || quota < n)) n = quota;
#elif !defined(_WIN32)
  n = int(sysconf(_SC_NPROCESSORS_ONLN));
#endif
  return std::max(1, n);
}

bool in_forked_child() { return g_forked.load(std::memory_order_relaxed); }
int thread_cap() { return g_cap.load(std::memory_order_relaxed); }
void set_thread_cap(int cap) { g_cap.store(std::max(1, cap), std::memory_order_relaxed); }

int resolve_available(int n) {
  if (in_forked_child()) return 1;
  if (n == kAvailableCpus) n = available_cpus();
  return std::max(1, std::min(n, thread_cap()));
}

namespace {

// The probe: a thread of ours, asleep until a call finds the mark run out. Woken, it
// reports how late it woke as a region reports its latest worker (team_report_at), so it
// clears the mark (on time) or renews it (late) while the calls go on without it. Made by
// the first probe and never destroyed (it is detached and waits on this record).
struct Probe {
  std::mutex m;
  std::condition_variable wake;
  int64_t posted = 0;  // when the pending probe was posted (0: none)
};
Probe* g_probe = nullptr;
std::once_flag g_probe_made;
std::atomic<bool> g_probe_pending{false};
std::atomic<bool> g_probe_failed{false};  // no thread could be made: the regions probe
// A probe that woke on time sleeps this long and counts as on time only if it wakes from
// that on time too. Beside a busy process one wake often finds a core and the team's worker,
// woken just after it, then waits a time slice (the preempted process may be let finish its
// slice); the second wake cut those waits from 11-12 to 1-3 per 50 rounds of decode loops
// (loaded 2-core Xeon, load 9-10). The calls go on meanwhile, on one thread.
constexpr int64_t kProbeRecheck = 2'000'000;

[[noreturn]] void probe_loop(Probe* p) {
  std::unique_lock<std::mutex> lock(p->m);
  while (true) {
    p->wake.wait(lock, [p] { return p->posted != 0; });
    int64_t now = now_ns(), lag = now - p->posted;
    p->posted = 0;
    lock.unlock();
    if (lag <= kLateStart) {  // on time: confirmed by a second wake (see kProbeRecheck)
      std::this_thread::sleep_for(std::chrono::nanoseconds(kProbeRecheck));
      const int64_t again = now_ns();
      lag = std::max(lag, again - now - kProbeRecheck);
      now = again;
    }
    team_report_at(lag, 0, now);  // (late: lag > kLateStart)
    g_probe_pending.store(false);
    lock.lock();
  }
}

// Wakes the probe unless one is pending; false if there is no probe thread (none could be
// made), when the call's own region probes as before.
bool post_probe() {
  std::call_once(g_probe_made, [] {
    try {
      g_probe = new Probe;
      std::thread probe(probe_loop, g_probe);
#if defined(__linux__)
      pthread_setname_np(probe.native_handle(), "fastattn-probe");  // (named before it runs)
#endif
      probe.detach();
    } catch (...) {
      g_probe_failed.store(true);
    }
  });
  if (g_probe_failed.load(std::memory_order_relaxed)) return false;
  bool idle = false;
  if (!g_probe_pending.compare_exchange_strong(idle, true)) return true;
  {
    std::lock_guard<std::mutex> lock(g_probe->m);
    g_probe->posted = now_ns();
  }
  g_probe->wake.notify_one();
  return true;
}

}  // namespace

bool team_marked() {
  if (!g_watch.load(std::memory_order_relaxed)) return false;
  const int64_t until = g_contended_until.load(std::memory_order_relaxed);
  if (until == 0) return false;
  if (now_ns() < until) return true;
  // The mark has run out. A call's region as the probe waited a scheduler time slice
  // whenever the worker was still late (10-30 ms beside a busy process on the loaded 2-core
  // Xeon, once per mark); the probe thread is woken instead and this call runs on one
  // thread. (A forked child runs on one thread anyway, and has no probe thread.)
  return in_forked_child() || post_probe();
}

void team_report(int threads, int64_t latest_start_ns, int64_t region_ns) {
  if (threads > 1) team_report_at(latest_start_ns, region_ns, now_ns());
}

void team_report_at(int64_t latest_start_ns, int64_t region_ns, int64_t now) {
  const bool late = latest_start_ns > kLateStart && 4 * latest_start_ns > region_ns;
  const int64_t until = g_contended_until.load(std::memory_order_relaxed);
  if (late) {
    // Late again soon after the last late region (while marked, or after a probe found the
    // workers on time: beside a busy process most regions find a core, a few wait a time
    // slice): the other processes are still there, so wait twice as long. Restarting at
    // the first mark made such a neighbour cost a time slice every 50 ms.
    const int64_t mark = g_mark.load(std::memory_order_relaxed);
    const int64_t last = g_last_late.load(std::memory_order_relaxed);
    const bool recent = until != 0 || (last != 0 && now - last < 2 * mark + kFirstMark);
    const int64_t next = recent ? std::min(2 * mark, kLongestMark) : kFirstMark;
    g_mark.store(next, std::memory_order_relaxed);
    g_last_late.store(now, std::memory_order_relaxed);
    g_contended_until.store(now + next, std::memory_order_relaxed);
  } else if (until != 0 && now >= until) {  // (a region begun before the mark says nothing)
    g_contended_until.store(0, std::memory_order_relaxed);  // the mark is kept, for a while
  }
}

int64_t team_contended_until() { return g_contended_until.load(std::memory_order_relaxed); }

void team_reset(bool contended) {
  g_mark.store(kFirstMark);
  g_last_late.store(0);
  g_contended_until.store(contended ? now_ns() + kLongestMark : 0);
}

void team_watch(bool on) { g_watch.store(on); }

thread_local CallInterrupt* t_call_interrupt = nullptr;
thread_local bool t_polls_interrupt = false;

bool poll_interrupt(CallInterrupt* c) {
  if (!c->poll) return false;
  const int64_t now = now_ns();
  if (now < c->next_poll_ns) return false;
  c->next_poll_ns = now + kInterruptPollNs;
  if (c->poll(c)) c->raised.store(true, std::memory_order_relaxed);
  return c->raised.load(std::memory_order_relaxed);
}

bool team_contended() { return g_contended_until.load(std::memory_order_relaxed) != 0; }

}  // namespace fastattn

// Host emulation of the CUDA subset that fastattn/cuda/attention.cu uses, for the tests
// that run without a GPU (tests/helpers/cuda_emulator.py builds it with the C++ compiler).
//
// A CTA's threads are fibers (ucontext) on one OS thread. A fiber runs until it reaches
// __syncthreads() or returns; when every fiber of the block waits at the barrier, all are
// released. Running each thread as far as it can before the next one starts is the most
// adversarial schedule for a missing barrier: a thread that reads shared memory another
// thread has not written yet (or overwrites what another has not read) gets the wrong
// value every time, not once in a while. A barrier reached by only some threads is
// reported as an error, not a hang. Blocks run one after another, so __shared__ variables
// can be plain statics.
#pragma once

#include <math.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#define FASTATTN_CUDA_EMULATION 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)

struct fastattn_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline fastattn_dim3 threadIdx, blockIdx, blockDim, gridDim;

inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
inline double __longlong_as_double(long long i) {
  double d;
  std::memcpy(&d, &i, sizeof d);
  return d;
}
inline float fastattn_emulation_half_to_float(unsigned short bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof h);
  return static_cast<float>(h);
}
inline unsigned short fastattn_emulation_float_to_half(float f) {
  const _Float16 h = static_cast<_Float16>(f);  // round to nearest even, as cvt.rn
  unsigned short bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

namespace fastattn_emulation {

enum State { kRunnable, kAtBarrier, kFinished };

struct Fiber {
  ucontext_t context;
  State state = kRunnable;
};

inline ucontext_t scheduler;
inline std::vector<Fiber> fibers;
inline std::vector<std::vector<char>> stacks;
inline int current = -1;
inline std::function<void()> body;
inline const char* error = "";

inline void fiber_main(int index) {
  body();
  fibers[index].state = kFinished;
}  // returns to uc_link: the scheduler

inline void barrier() {
  Fiber& self = fibers[current];
  self.state = kAtBarrier;
  swapcontext(&self.context, &scheduler);
}

// Runs one block of `threads` fibers to completion; false on a divergent barrier.
inline bool run_block(int threads) {
  constexpr std::size_t kStack = 256 * 1024;
  fibers.assign(threads, Fiber{});
  stacks.resize(threads);
  for (int t = 0; t < threads; ++t) {
    stacks[t].resize(kStack);
    Fiber& f = fibers[t];
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stacks[t].data();
    f.context.uc_stack.ss_size = kStack;
    f.context.uc_link = &scheduler;
    makecontext(&f.context, reinterpret_cast<void (*)()>(fiber_main), 1, t);
  }
  for (;;) {
    for (int t = 0; t < threads; ++t) {
      if (fibers[t].state != kRunnable) continue;
      current = t;
      threadIdx.x = static_cast<unsigned>(t);
      swapcontext(&scheduler, &fibers[t].context);
    }
    int finished = 0;
    for (const Fiber& f : fibers) finished += f.state == kFinished;
    if (finished == threads) return true;
    if (finished > 0) {
      error = "__syncthreads() reached by some threads of a block after others returned";
      return false;
    }
    for (Fiber& f : fibers) f.state = kRunnable;  // everyone arrived: release the barrier
  }
}

template <typename T>
T from_slot(unsigned long long v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<std::uintptr_t>(v));
  } else if constexpr (std::is_same_v<T, long long>) {
    return static_cast<long long>(v);
  } else if constexpr (std::is_same_v<T, double>) {
    double d;
    std::memcpy(&d, &v, sizeof d);
    return d;
  } else {
    static_assert(!sizeof(T),
                  "kernel parameters must be pointers, long long or double: what CuPy passes "
                  "for arrays, Python ints and Python floats");
  }
}

template <typename... A, std::size_t... I>
int launch_impl(void (*kernel)(A...), long long grid, int block, const unsigned long long* slots,
                std::index_sequence<I...>) {
  gridDim.x = static_cast<unsigned>(grid);
  blockDim.x = static_cast<unsigned>(block);
  body = [&] { kernel(from_slot<A>(slots[I])...); };
  for (long long b = 0; b < grid; ++b) {
    blockIdx.x = static_cast<unsigned>(b);
    if (!run_block(block)) return -2;
  }
  return 0;
}

// Launches `kernel` on `grid` blocks of `block` threads with the 8-byte argument slots.
template <typename... A>
int launch(void (*kernel)(A...), long long grid, int block, const unsigned long long* slots,
           int num_slots) {
  if (num_slots != static_cast<int>(sizeof...(A))) {
    error = "wrong number of kernel arguments";
    return -1;
  }
  return launch_impl(kernel, grid, block, slots, std::index_sequence_for<A...>{});
}

}  // namespace fastattn_emulation

inline void __syncthreads() { fastattn_emulation::barrier(); }

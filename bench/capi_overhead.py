"""Per-call time of a tiny SDPA through the C API against the Python API.

Run: python bench/capi_overhead.py [--keys 16] [--dim 64] [--calls 100000] [--rounds 7]

The C API side is a C loop compiled here against fastattn's header (the compiler Python was
built with) and loaded with ctypes: it fills one ``fastattn_sdpa_args`` for a (1, 1, 1, dim)
float32 query against ``keys`` keys, calls ``api->sdpa`` ``calls`` times between two
``clock_gettime`` reads and returns the mean ns per call, so no Python runs inside the
timing. The Python side times ``fastattn.scaled_dot_product_attention`` on the same arrays
with ``out=`` (a Python loop). Both run one thread, interleaved for ``rounds`` rounds; each
side's best round is reported (other processes only add time), as wall-clock time and as
the calling thread's CPU time (which other processes on a shared machine cannot inflate).
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

import fastattn
import fastattn.capi as capi

LOOP = r"""
#define _POSIX_C_SOURCE 199309L
#include <string.h>
#include <time.h>
#include "fastattn/fastattn.h"

static fastattn_tensor tensor(void *data, int64_t rows, int64_t dim) {
  fastattn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.shape[0] = t.shape[1] = 1;
  t.shape[2] = rows;
  t.shape[3] = dim;
  t.strides[2] = dim;
  t.strides[3] = 1;
  t.extent = rows * dim;
  return t;
}

static double seconds(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* Mean ns per call: wall clock, and this thread's CPU time (*cpu_ns; what other processes
   on a shared machine cannot inflate). */
double time_sdpa(const fastattn_capi *api, float *q, float *k, float *v, float *out,
                 int64_t keys, int64_t dim, long calls, int *status, double *cpu_ns) {
  fastattn_sdpa_args a;
  double wall0, cpu0;
  long i;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.dtype = FASTATTN_FLOAT32;
  a.num_threads = 1;
  a.q = tensor(q, 1, dim);
  a.k = tensor(k, keys, dim);
  a.v = tensor(v, keys, dim);
  a.out = tensor(out, 1, dim);
  a.scale = 0.125;
  a.window_left = a.window_right = -1;
  *status = 0;
  wall0 = seconds(CLOCK_MONOTONIC);
  cpu0 = seconds(CLOCK_THREAD_CPUTIME_ID);
  for (i = 0; i < calls; ++i) *status |= api->sdpa(&a, NULL, 0);
  *cpu_ns = (seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0) * 1e9 / calls;
  return (seconds(CLOCK_MONOTONIC) - wall0) * 1e9 / calls;
}
"""


def build_loop(folder: Path) -> ctypes.CDLL:
    src = folder / "capi_loop.c"
    src.write_text(LOOP)
    lib = folder / "capi_loop.so"
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    subprocess.run(
        [*cc, "-O2", "-shared", "-fPIC", "-I", capi.get_include(), str(src), "-o", str(lib)],
        check=True,
    )
    dll = ctypes.CDLL(str(lib))
    fp = ctypes.POINTER(ctypes.c_float)
    dll.time_sdpa.restype = ctypes.c_double
    dll.time_sdpa.argtypes = [
        ctypes.c_void_p,
        fp,
        fp,
        fp,
        fp,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_long,
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_double),
    ]
    return dll


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 1, args.dim), dtype=np.float32)
    k = rng.standard_normal((1, 1, args.keys, args.dim), dtype=np.float32)
    v = rng.standard_normal((1, 1, args.keys, args.dim), dtype=np.float32)
    out_c, out_py = np.empty_like(q), np.empty_like(q)
    fastattn.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dll = build_loop(Path(tmp))
        fp = ctypes.POINTER(ctypes.c_float)
        ptrs = [a.ctypes.data_as(fp) for a in (q, k, v, out_c)]
        status, cpu_ns = ctypes.c_int(), ctypes.c_double()
        sdpa = fastattn.scaled_dot_product_attention
        py_calls = max(1, args.calls // 20)
        best = {"C API": [np.inf, np.inf], "Python API": [np.inf, np.inf]}  # wall, CPU ns
        for _ in range(args.rounds):
            wall = dll.time_sdpa(
                capi.table_address(), *ptrs, args.keys, args.dim, args.calls,
                ctypes.byref(status), ctypes.byref(cpu_ns),
            )  # fmt: skip
            assert status.value == 0
            best["C API"] = [min(best["C API"][0], wall), min(best["C API"][1], cpu_ns.value)]
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(py_calls):
                sdpa(q, k, v, scale=0.125, out=out_py)
            wall, cpu = ((time.perf_counter() - t0), (time.thread_time() - c0))
            best["Python API"] = [
                min(best["Python API"][0], wall / py_calls * 1e9),
                min(best["Python API"][1], cpu / py_calls * 1e9),
            ]
    np.testing.assert_array_equal(out_c, out_py)
    print(
        f"(1, 1, 1, {args.dim}) float32 query, {args.keys} keys, 1 thread, "
        f"ISA {fastattn._core.active_isa()}: best of {args.rounds} rounds "
        f"({args.calls} C calls, {py_calls} Python calls a round)"
    )
    for name, (wall, cpu) in best.items():
        print(f"  {name:10s} {wall / 1e3:8.3f} us/call wall {cpu / 1e3:8.3f} us/call thread CPU")


if __name__ == "__main__":
    main()

"""How fastattn's benchmarks time things: warm-up, interleaved rounds, settle, best of rounds.

The machine a benchmark runs on is rarely quiet (other processes, frequency changes, a
worker pool still spinning from the previous call). Other processes only ever *add* time,
so the least disturbed measurement -- the best round -- is the estimate, and the spread
of the rounds says how noisy the run was. Candidates run interleaved, round after round
(the order rotates each round), so a disturbance hits all of them alike and their ratios
stay fair; each round starts with a short pause that lets the previous candidate's worker
threads go idle, and one untimed call that brings the candidate's data back into cache.
A round times its calls one by one and keeps their median, so one preempted call does not
spoil it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Timing:
    """The rounds of one candidate: seconds per call in each round."""

    times: list[float] = field(default_factory=list)
    calls: int = 1  # calls timed together in each round

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """How far the median round lies above the best one: 0.02 = 2 %."""
        return self.median / self.best - 1.0

    def as_dict(self) -> dict:
        return {
            "best_s": self.best,
            "median_s": self.median,
            "spread": self.spread,
            "rounds": len(self.times),
            "calls_per_round": self.calls,
            "times_s": list(self.times),
        }


@dataclass(frozen=True)
class Method:
    """The knobs of :func:`measure`.

    rounds: rounds per candidate (a candidate slower than ``budget / rounds`` gets fewer,
    never fewer than ``min_rounds``); round_time: seconds of calls timed together in one
    round (fast calls are repeated up to ``max_calls`` times); settle: pause before each
    round; budget: seconds of timed calls one candidate may take in all.
    """

    rounds: int = 5
    round_time: float = 0.2
    settle: float = 0.05
    budget: float = 4.0
    min_rounds: int = 2
    max_calls: int = 50

    def describe(self) -> str:
        return (
            f"{self.rounds} interleaved rounds per candidate (fewer, but at least "
            f"{self.min_rounds}, for one slower than {self.budget / self.rounds:.2g} s a "
            f"call), each "
            f"about {self.round_time:g} s of back-to-back calls (at most {self.max_calls}) "
            f"after a {self.settle:g} s pause and one untimed call, timed one by one; a "
            f"round's time is the median of its calls, and the best round is reported"
        )


def _timed(fn: Callable[[], object], calls: int) -> float:
    """The median of ``calls`` calls timed one by one: on a busy machine one call in a
    round may be preempted (a worker thread descheduled at a barrier) and its time says
    nothing about the candidate."""
    clock = time.perf_counter
    times = []
    for _ in range(calls):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def best_round(
    fn: Callable[[], object], calls: int, settle: float = 0.05, warm: bool = True
) -> float:
    """Seconds per call (the median) of ``calls`` back-to-back calls, after a pause and a
    warm-up call."""
    time.sleep(settle)  # let the other candidate's worker threads go idle
    if warm:
        fn()
    return _timed(fn, calls)


def probe_time(fn: Callable[[], object], method: Method) -> float:
    """A first estimate of one call's time: the least of a few back-to-back calls (a lone
    call after a pause also pays for waking the worker threads, up to milliseconds on a
    busy machine)."""
    time.sleep(method.settle)
    best, spent = float("inf"), 0.0
    for i in range(5):
        t = _timed(fn, 1)
        best, spent = min(best, t), spent + t
        if spent >= method.round_time and (i >= 2 or spent >= method.budget / 4):
            break
    return best


def measure(
    candidates: Mapping[str, Callable[[], object]],
    rounds: int | None = None,
    method: Method | None = None,
    first_calls: Mapping[str, float] | None = None,
) -> dict[str, Timing]:
    """Time every candidate, interleaved, and return a :class:`Timing` for each.

    Every candidate is called once untimed first (thread pools, page faults, JIT), unless
    ``first_calls`` gives the seconds such a call already took (a candidate slower than a
    round then needs no further probing).

    >>> t = measure({"sum": lambda: sum(range(100))}, method=Method(rounds=2, round_time=0.001,
    ...                                                            settle=0))
    >>> t["sum"].best > 0 and len(t["sum"].times) == 2
    True
    """
    method = method or Method()
    if rounds is not None:
        method = Method(
            rounds=rounds,
            round_time=method.round_time,
            settle=method.settle,
            budget=method.budget,
            min_rounds=method.min_rounds,
            max_calls=method.max_calls,
        )
    names = list(candidates)
    if first_calls is None:
        first_calls = {}
        for name in names:  # first calls: thread pools, page faults, JIT compilation
            first_calls[name] = _timed(candidates[name], 1)
    probe = {
        name: first_calls[name]
        if first_calls[name] >= method.round_time
        else probe_time(candidates[name], method)
        for name in names
    }
    timing, planned, warm = {}, {}, {}
    for name, seconds in probe.items():
        seconds = max(seconds, 1e-7)
        calls = max(1, min(method.max_calls, int(method.round_time / seconds)))
        timing[name] = Timing(calls=calls)
        affordable = int(method.budget / (seconds * calls))
        planned[name] = max(min(method.min_rounds, method.rounds), min(method.rounds, affordable))
        warm[name] = seconds < method.round_time  # a slow call is its own warm-up
    for r in range(max(planned.values())):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if r < planned[name]:
                timing[name].times.append(
                    best_round(candidates[name], timing[name].calls, method.settle, warm[name])
                )
    return timing


def matmul_rate(
    rounds: int | None = None, n: int = 2048, method: Method | None = None, dtype=np.float32
) -> tuple[float, Timing]:
    """The machine's matrix-multiply rate (flop/s) measured now: NumPy ``a @ b``, n x n.

    Attention's floor is this rate; benchmarks report kernels as a fraction of it.
    """
    a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    # Only the time is used. Some BLAS builds raise spurious floating-point flags in matmul
    # (OpenBLAS on aarch64 under qemu: "divide by zero"), which must not stop the yardstick.
    with np.errstate(all="ignore"):
        t = measure({"matmul": lambda: a @ a}, rounds, method)["matmul"]
    return 2.0 * n**3 / t.best, t


def machine_limits(
    dtypes,
    threads: int,
    fma_seconds: float = 0.2,
    read_nbytes: int = 1 << 30,
    read_repeats: int = 3,
    fma_rounds: int = 3,
    bf16_dot: bool = False,
) -> dict:
    """The machine's limits measured now with fastattn's own probes, at ``threads`` threads:
    the fused multiply-add peak of the active ISA per dtype (GFLOP/s; the best of
    ``fma_rounds`` probes, as other work on the machine and the clock ramping up only ever
    lower a probe) and the memory read bandwidth (GB/s); with ``bf16_dot`` (bfloat16 rows
    to run) also the bfloat16 dot peak, where the active ISA has it (avx512bf16, neon_bf16).
    A probe this build (or ISA) lacks gives None: the report then says so."""
    from fastattn import _core

    limits = {
        "isa": _core.active_isa(),
        "threads": threads,
        "fma_peak_gflops": None,
        "fma_seconds": fma_seconds,
        "fma_rounds": fma_rounds,
        "bf16_dot_peak_gflops": None,
        "read_bandwidth_gbs": None,
        "read_nbytes": read_nbytes,
        "read_repeats": read_repeats,
    }
    if hasattr(_core, "fma_peak"):
        limits["fma_peak_gflops"] = {
            d: max(float(_core.fma_peak(d, threads, fma_seconds)) for _ in range(fma_rounds))
            for d in dtypes
        }
    if bf16_dot and hasattr(_core, "bf16_dot_peak"):
        try:
            limits["bf16_dot_peak_gflops"] = max(
                float(_core.bf16_dot_peak(threads, fma_seconds)) for _ in range(fma_rounds)
            )
        except RuntimeError:  # not a bfloat16 dot-product ISA: bfloat16 is widened to float32
            pass
    if hasattr(_core, "read_bandwidth"):
        limits["read_bandwidth_gbs"] = float(
            _core.read_bandwidth(read_nbytes, threads, read_repeats)
        )
        limits["read_rate_by_size_gbs"] = {}  # filled by read_rate_at, one probe per size
    return limits


def read_rate_at(limits: dict, nbytes: int) -> float | None:
    """The read rate (GB/s) of a buffer of ``nbytes`` at the limits' thread count, probed
    once per size in this run (the best of repeats reading about 1 GiB in all). Below
    the caches' size it is a cache's rate, not DRAM's: a memory-bound row whose bytes fit
    in a cache is rated against what a read of that size can reach, never against the
    DRAM bandwidth (which it can pass). None where the build has no probe."""
    memo = limits.get("read_rate_by_size_gbs")
    if memo is None:
        return None
    if nbytes >= limits["read_nbytes"]:
        return limits["read_bandwidth_gbs"]
    key = str(int(nbytes))
    if key not in memo:
        from fastattn import _core

        repeats = int(min(20000, max(5, (1 << 30) // max(1, nbytes))))
        memo[key] = float(_core.read_bandwidth(int(nbytes), limits["threads"], repeats))
    return memo[key]

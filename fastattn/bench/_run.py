"""Run the benchmark grid: the same-run matmul rate, then every (case, dtype) row."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import fastattn
from fastattn._config import config
from fastattn.bench._cases import DTYPES, IMPLS, Case, Libraries, build, compute_dtype, grid
from fastattn.bench._measure import (
    Method,
    machine_limits,
    matmul_rate,
    measure,
    probe_time,
    read_rate_at,
)

# A backward row's halves of fastattn's own call, timed beside it: not baselines (nor
# listed among the implementations compared).
PARTS = ("fastattn-forward", "fastattn-backward")
METHODS = {
    "smoke": Method(rounds=2, round_time=0.005, settle=0.001, budget=0.1, min_rounds=1),
    "quick": Method(rounds=3, round_time=0.05, settle=0.01, budget=0.4),
    "default": Method(rounds=5, round_time=0.2, settle=0.05, budget=3.0),
    "full": Method(rounds=7, round_time=0.3, settle=0.1, budget=10.0),
}
MATMUL_SIZE = {"smoke": 256, "quick": 1024, "default": 2048, "full": 2048}
# machine_limits' knobs: seconds of FMA per dtype, bytes read (well past the last-level
# cache), repeats of the read
LIMITS = {
    "smoke": (0.01, 1 << 24, 1),
    "quick": (0.1, 1 << 28, 3),
    "default": (0.2, 1 << 30, 3),
    "full": (0.3, 1 << 30, 5),
}


@dataclass
class Settings:
    preset: str = "default"
    shapes: list[str] = field(default_factory=list)  # substrings selecting cases
    dtypes: tuple[str, ...] = DTYPES
    impls: tuple[str, ...] = IMPLS
    threads: int | None = None
    rounds: int | None = None
    seed: int = 0
    command: str = "python -m fastattn.bench"

    def method(self) -> Method:
        m = METHODS[self.preset]
        if self.rounds is None:
            return m
        return Method(
            rounds=self.rounds,
            round_time=m.round_time,
            settle=m.settle,
            budget=m.budget * self.rounds / m.rounds,
            min_rounds=min(m.min_rounds, self.rounds),
            max_calls=m.max_calls,
        )

    def rows(self) -> list[tuple[Case, str]]:
        return [
            (case, dtype)
            for case in grid(self.preset)
            if case.matches(self.shapes)
            for dtype in case.dtypes
            if dtype in self.dtypes
        ]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@contextlib.contextmanager
def blas_threads(n: int, notes: list[str]):
    """Limit NumPy's BLAS to ``n`` threads (threadpoolctl), so the matmul rate and the NumPy
    baseline use the threads the kernels do."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        notes.append("threadpoolctl is not installed: NumPy's BLAS used its own thread count.")
        yield
        return
    with threadpool_limits(limits=n, user_api="blas"):
        notes.append(f"NumPy's BLAS was limited to {n} threads (threadpoolctl).")
        yield


def _progress(text: str, end: str = "\n") -> None:
    print(text, end=end, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def run(settings: Settings, progress=_progress) -> dict:
    """Measure every row of ``settings`` and return the report document (JSON-ready)."""
    started = time.perf_counter()
    threads = settings.threads or fastattn.get_num_threads()
    rows = settings.rows()
    if not rows:
        raise ValueError(
            f"no case of the {settings.preset!r} preset matches --shapes "
            f"{','.join(settings.shapes)!r} and --dtype {','.join(settings.dtypes)}"
        )
    method = settings.method()
    libs = Libraries(threads, settings.impls)
    impls = libs.available()
    notes: list[str] = []
    doc = {
        "fastattn_bench": 1,
        "command": settings.command,
        "preset": settings.preset,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cpus": _cpu_count(),
            "platform": platform.platform(),
            "threads": threads,
        },
        "config": config(),
        "versions": libs.versions,
        "implementations": [i for i in impls if i not in PARTS],
        "method": {"description": method.describe(), **method.__dict__},
        "rows": [],
        "notes": notes,
    }
    progress(
        f"fastattn.bench: {settings.preset} preset, {len(rows)} rows, {threads} threads; "
        f"comparing {', '.join(i for i in impls if i not in PARTS)}"
    )
    with fastattn.set_num_threads(threads), blas_threads(threads, notes):
        rate, mm = matmul_rate(n=MATMUL_SIZE[settings.preset], method=method)
        doc["matmul"] = {
            "gflops": rate / 1e9,
            "n": MATMUL_SIZE[settings.preset],
            "dtype": "float32",
            **mm.as_dict(),
        }
        progress(
            f"float32 matmul rate (NumPy a @ b, n={MATMUL_SIZE[settings.preset]}): "
            f"{rate / 1e9:.1f} GFLOP/s (spread {mm.spread:.0%})"
        )
        limits = machine_limits(
            sorted({compute_dtype(d) for _, d in rows}),
            threads,
            *LIMITS[settings.preset],
            bf16_dot=any(d == "bfloat16" for _, d in rows),
        )
        doc["limits"] = limits
        progress(limits_line(limits))
        for i, (case, dtype) in enumerate(rows, 1):
            progress(f"[{i:{len(str(len(rows)))}d}/{len(rows)}] {case.name} {dtype} ...", end="")
            row = _measure_row(case, dtype, libs, impls, method, rate, limits, settings.seed)
            doc["rows"].append(row)
            progress(" " + _row_summary(row) + f"  [{_clock(time.perf_counter() - started)}]")
    notes.extend(libs.notes)
    doc["versions"] = libs.versions
    doc["elapsed_s"] = time.perf_counter() - started
    return doc


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def limits_line(limits: dict) -> str:
    """The machine's limits in one line, or the sentence saying they were not measured."""
    peak, bw = limits["fma_peak_gflops"], limits["read_bandwidth_gbs"]
    if peak is None and bw is None:
        return "machine limits not measured (this build has no probes)"
    parts = [f"{d} FMA peak {g:.1f} GFLOP/s" for d, g in (peak or {}).items()] or [
        "FMA peak not measured (this build has no fma_peak probe)"
    ]
    if limits.get("bf16_dot_peak_gflops"):
        parts.append(f"bfloat16 dot peak {limits['bf16_dot_peak_gflops']:.1f} GFLOP/s")
    parts.append(
        f"read bandwidth {bw:.1f} GB/s"
        if bw is not None
        else "read bandwidth not measured (this build has no read_bandwidth probe)"
    )
    return f"machine limits ({limits['isa']}, {limits['threads']} threads): " + ", ".join(parts)


def row_peak(limits: dict, dtype: str) -> float | None:
    """The GFLOP/s a compute-bound row's *% peak* divides by: a bfloat16 row's is the
    bfloat16 dot peak where the avx512bf16 (neon_bf16) ISA runs its products with vdpbf16ps
    (BFDOT); every other row's (bfloat16 widened elsewhere included) is its compute dtype's
    FMA peak."""
    if dtype == "bfloat16" and limits.get("bf16_dot_peak_gflops"):
        return limits["bf16_dot_peak_gflops"]
    return (limits["fma_peak_gflops"] or {}).get(compute_dtype(dtype))


def _measure_row(
    case: Case, dtype: str, libs, impls, method: Method, rate: float, limits: dict, seed: int
) -> dict:
    work = build(case, dtype, libs, impls, seed, probe=lambda fn: probe_time(fn, method))
    errors, first = work.first_calls()  # also the candidates' warm-up calls
    timings = measure(work.candidates, method=method, first_calls=first)
    flops, moved = case.flops(), case.bytes(dtype)
    peak = row_peak(limits, dtype) if case.bound == "compute" else None
    bw = read_rate_at(limits, moved) if case.bound == "memory" else None
    results = {}
    for name, t in timings.items():
        done = case.candidate_flops(name)  # a backward row's parts do less than the row
        results[name] = {
            **t.as_dict(),
            "gflops": done / t.best / 1e9,
            "frac_matmul": done / t.best / rate,
            "max_abs_err": errors[name],
        }
        # The share of the machine's limit for what bounds this case (None: not measured
        # or not the bound).
        results[name]["frac_peak"] = done / t.best / 1e9 / peak if peak else None
        results[name]["gbytes_per_s"] = moved / t.best / 1e9
        results[name]["frac_bandwidth"] = moved / t.best / 1e9 / bw if bw else None
        results[name].update(work.ops.get(name, {}))
    fast = timings["fastattn"].best
    del work
    gc.collect()
    return {
        "case": case.name,
        "kind": case.kind,
        "dims": list(case.dims),
        "causal": case.causal,
        "tags": list(case.tags),
        "series": case.series,
        "seq_len": case.seq_len,
        "dtype": dtype,
        "flops": flops,
        "bytes": moved,
        "bound": case.bound,
        "read_rate_gbs": bw,
        "results": results,
        "speedup": {
            name: t.best / fast
            for name, t in timings.items()
            if name != "fastattn" and name not in PARTS
        },
        **({"backward": _backward_summary(results)} if case.kind == "sdpa_backward" else {}),
    }


def _backward_summary(results: dict) -> dict | None:
    """A backward row's backward / forward time ratio and the backward's rate (2.5x the
    forward's flops) as a share of the FMA peak; None without both halves."""
    fwd, bwd = results.get("fastattn-forward"), results.get("fastattn-backward")
    if fwd is None or bwd is None:
        return None
    return {
        "ratio": bwd["best_s"] / fwd["best_s"],
        "backward_gflops": bwd["gflops"],
        "backward_frac_peak": bwd["frac_peak"],
    }


def _row_summary(row: dict) -> str:
    parts = []
    for name, r in row["results"].items():
        text = f"{name} {format_ms(r['best_s'])} ms"
        if name == "fastattn-backward" and row.get("backward"):
            text += f" ({row['backward']['ratio']:.2f}x the forward)"
        if name in row["speedup"]:
            text += f" ({row['speedup'][name]:.2f}x)"
        parts.append(text)
    return " | ".join(parts)


def format_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"

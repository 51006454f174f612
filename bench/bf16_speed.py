"""bfloat16 SDPA speed: fastattn bfloat16 (the avx512bf16 dot-product kernel where the CPU
has it, and the widening avx512 kernel) against fastattn float32, torch's bfloat16 SDPA and
OpenVINO's bfloat16 SDPA (INFERENCE_PRECISION_HINT=bf16), same process, same threads.

Run: python bench/bf16_speed.py [--shapes 1x8x1024x64,1x8x1024x128] [--threads 2]
     [--causal] [--repeats 15] [--rounds 5] [--clock wall|cpu]

Each row is timed in ``rounds`` interleaved rounds of ``repeats`` calls; the median of the
rounds' medians is printed with each row's ratio to fastattn float32 (a ratio above 1 is
faster than float32) and fastattn bfloat16's ratio over torch and OpenVINO. Needs
ml_dtypes; torch and openvino are used when installed. ``--clock cpu`` times the process's
CPU time instead of wall time: on a machine other processes load, with ``--threads 1``, it
leaves out the time spent waiting for a core (with more threads it counts spin-waits too).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fastattn
from fastattn.bench import _anchors


def median_seconds(fn, repeats: int, clock=time.perf_counter) -> float:
    fn()
    times = np.empty(repeats)
    for i in range(repeats):
        t0 = clock()
        fn()
        times[i] = clock() - t0
    return float(np.median(times))


def with_isa(name, fn):
    def call():
        previous = fastattn._core.active_isa()
        fastattn._core.set_isa(name)
        try:
            return fn()
        finally:
            fastattn._core.set_isa(previous)

    return call


def rows_for(shape, threads: int, causal: bool):
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    qb, kb, vb = (a.astype(bf16) for a in (q, k, v))
    sdpa = fastattn.scaled_dot_product_attention
    kw = {"is_causal": causal, "num_threads": threads}
    rows = [("fastattn float32", lambda: sdpa(q, k, v, **kw))]
    isas = fastattn._core.available_isas()
    if "avx512bf16" in isas:
        rows.append(
            ("fastattn bf16 (vdpbf16ps)", with_isa("avx512bf16", lambda: sdpa(qb, kb, vb, **kw)))
        )
    widen = "avx512" if "avx512" in isas else isas[-1]
    rows.append(
        (f"fastattn bf16 ({widen}, widened)", with_isa(widen, lambda: sdpa(qb, kb, vb, **kw)))
    )
    try:
        import torch

        torch.set_num_threads(threads)
        tq, tk, tv = (torch.from_numpy(a).to(torch.bfloat16) for a in (q, k, v))
        sd = torch.nn.functional.scaled_dot_product_attention

        def torch_call():
            with torch.no_grad():
                return sd(tq, tk, tv, is_causal=causal)

        rows.append(("torch bf16 SDPA", torch_call))
    except ImportError:
        pass
    try:
        _anchors.load("openvino")
        runner = _anchors.openvino_bf16_runner(q, k, v, causal, threads)
        rows.append(("OpenVINO bf16 SDPA", runner.call))
    except ImportError:
        pass
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x8x1024x64,1x8x1024x128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        rows = rows_for(shape, args.threads, args.causal)
        got = {name: [] for name, _ in rows}
        for _ in range(args.rounds):
            for name, fn in rows:
                got[name].append(median_seconds(fn, args.repeats, clock))
        med = {name: float(np.median(t)) for name, t in got.items()}
        base = med["fastattn float32"]
        print(f"shape {text} causal={args.causal} threads={args.threads} clock={args.clock}")
        for name, t in med.items():
            print(f"  {name:34s} {t * 1e3:9.2f} ms   x{base / t:5.2f} vs fastattn float32")
        ours = med.get("fastattn bf16 (vdpbf16ps)")
        if ours:
            for other in ("torch bf16 SDPA", "OpenVINO bf16 SDPA"):
                if other in med:
                    print(f"  fastattn bf16 vs {other}: x{med[other] / ours:.2f}")


if __name__ == "__main__":
    main()

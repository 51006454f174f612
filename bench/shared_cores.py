"""fastattn beside other processes: per-call medians at default threads against ``num_threads=1``.

Run: python bench/shared_cores.py [--rounds 7] [--calls 100] [--scenarios alone,busy,pair]

Each scenario runs a measuring process (a fresh interpreter) that loops, round after round,
over the shapes below, timing ``--calls`` calls at the default thread count and then as many at
``num_threads=1`` and as many with the watch off (interleaved, in the reverse order every other
round, so all see the same conditions), and prints per-call medians:

- ``alone``: nothing else started by this script (the machine may still be loaded by others);
- ``busy``: beside one process spinning a pure-Python loop (a core held by someone else);
- ``pair``: beside a second fastattn process looping decode steps at its default thread count
  (two workers of one service on one machine).

Shapes: the tiny call ``(1,1,1,64)`` x 16 keys, decode ``(1,8,1,64)`` x 16 .. 2048 keys and a
full attention ``(1,8,1024,64)`` (float32). A figure is the median over rounds of each round's
median per call; "ratio" is default / ``num_threads=1`` from the same rounds, "p25-p75" the
spread of the rounds' own ratios; "unwatched" is the default thread count with the late-worker
watch off (``_core.team_watch(False)``: the behaviour before it, for an A/B in the same run);
"mean" is the mean per call over all rounds (where stalls of a scheduler time slice show).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = [("tiny 1x1x1x64 Lk16", (1, 1, 1, 64), 16)] + [
    (f"decode 1x8x1x64 Lk{lk}", (1, 8, 1, 64), lk) for lk in (16, 128, 512, 2048)
]
LARGE = ("full 1x8x1024x64", (1, 8, 1024, 64), 1024)

_MEASURE = r"""
import json, sys, time
import numpy as np
import fastattn
shapes, calls, rounds = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
cases = []
for name, q, lk in shapes:
    q = tuple(q)
    Q = rng.standard_normal(q, dtype=np.float32)
    K = rng.standard_normal(q[:2] + (lk, q[3]), dtype=np.float32)
    V = rng.standard_normal(q[:2] + (lk, q[3]), dtype=np.float32)
    n = calls if lk * q[2] < 1 << 16 else max(5, calls // 20)
    cases.append((name, Q, K, V, n))
sdpa = fastattn.scaled_dot_product_attention
KEYS = ["default", "1", "unwatched"]
res = {name: {k: [] for k in KEYS + ["mean_" + k for k in KEYS]} for name, *_ in cases}
MODES = (("default", None, 1), ("1", 1, 1), ("unwatched", None, 0))
for r in range(rounds):
    for name, Q, K, V, n in cases:
        for key, nt, watch in MODES if r % 2 == 0 else MODES[::-1]:  # no order bias
            fastattn._core.team_watch(bool(watch))
            sdpa(Q, K, V, num_threads=nt)
            t = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                sdpa(Q, K, V, num_threads=nt)
                t.append(time.perf_counter_ns() - t0)
            res[name]["mean_" + key].append(sum(t) / len(t) / 1e3)
            t.sort()
            res[name][key].append(t[len(t) // 2] / 1e3)
print(json.dumps(res))
"""

_BUSY = "while True: pass"

_PAIR = r"""
import numpy as np, fastattn
rng = np.random.default_rng(1)
cases = [tuple(rng.standard_normal((1, 8, n, 64), dtype=np.float32) for n in (1, lk, lk))
         for lk in (128, 512, 2048)]
while True:
    for q, k, v in cases:
        for _ in range(50):
            fastattn.scaled_dot_product_attention(q, k, v)
"""


def run_scenario(scenario: str, shapes, calls: int, rounds: int) -> dict:
    neighbour = None
    if scenario == "busy":
        neighbour = subprocess.Popen([sys.executable, "-c", _BUSY])
    elif scenario == "pair":
        neighbour = subprocess.Popen([sys.executable, "-c", _PAIR])
    try:
        if neighbour is not None:
            time.sleep(1.0)  # let it start and import
        out = subprocess.run(
            [sys.executable, "-c", _MEASURE, json.dumps([shapes, calls, rounds])],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    return json.loads(out.strip().splitlines()[-1])  # (an editable install may print first)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=100, help="timed calls per round (small shapes)")
    p.add_argument("--scenarios", default="alone,busy,pair")
    p.add_argument("--no-large", action="store_true", help="skip the full attention")
    p.add_argument("--json", help="also write the raw per-round medians here")
    a = p.parse_args()
    shapes = SHAPES + ([] if a.no_large else [LARGE])
    import fastattn  # noqa: PLC0415 - only for the header line

    print(
        f"fastattn {fastattn.__version__}, ISA {fastattn._core.active_isa()}, "
        f"{fastattn.get_num_threads()} default threads, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')} "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}"
    )
    raw = {}
    for scenario in a.scenarios.split(","):
        res = raw[scenario] = run_scenario(scenario, shapes, a.calls, a.rounds)
        print(f"\n{scenario}: per-call median over {a.rounds} rounds (us)")
        print(
            f"  {'shape':28s} {'default':>10s} {'threads=1':>10s} {'ratio':>6s} {'p25-p75':>11s}"
            f" {'unwatched':>10s} {'mean: default':>14s} {'threads=1':>10s} {'unwatched':>10s}"
        )
        for name, r in res.items():
            d = sorted(r["default"])[len(r["default"]) // 2]
            o = sorted(r["1"])[len(r["1"]) // 2]
            u = sorted(r["unwatched"])[len(r["unwatched"]) // 2]
            md, mo, mu = (
                sum(r[k]) / len(r[k]) for k in ("mean_default", "mean_1", "mean_unwatched")
            )
            # The spread of the same-round ratios (each round's default over its threads=1).
            ratios = sorted(a / b for a, b in zip(r["default"], r["1"]))
            lo, hi = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
            print(
                f"  {name:28s} {d:10.1f} {o:10.1f} {d / o:6.2f} {lo:5.2f}-{hi:<5.2f} {u:10.1f}"
                f" {md:14.1f} {mo:10.1f} {mu:10.1f}"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f)


if __name__ == "__main__":
    main()

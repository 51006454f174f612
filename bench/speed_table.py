"""The speed table of bench/README.md: fastattn vs PyTorch's CPU SDPA, ONNX Runtime and
OpenVINO (each when installed; and NumPy), same run.

    python bench/speed_table.py [--rounds 5] [--numpy] [--markdown]

Method (the machine is shared and noisy; fastattn.bench.measure, shared with
``python -m fastattn.bench``): for every shape the candidates run interleaved, round after
round; each round times a few calls of each candidate after a short pause that lets worker
threads settle; a candidate's time is its best round (the least disturbed), and ratios are
of times from the same run. The float32 matmul rate is
measured in the same run and kernels are reported as a fraction of it.
"""

from __future__ import annotations

import argparse

import numpy as np

import fastattn
from fastattn import bench
from fastattn.bench import _anchors, numpy_sdpa
from fastattn.bench._measure import probe_time

try:
    import torch
except ImportError:  # the table then has no torch column
    torch = None


def _installed(name: str) -> bool:
    try:
        _anchors.load(name)
    except ImportError:
        return False
    return True


ENGINES = [name for name in _anchors.ANCHORS if _installed(name)]  # a column each

# name: (B, Hq, Hkv, Lq, Lk, E, causal, dtype, target vs torch)
SHAPES = {
    "BERT-base 4x12 512x512 E64": (4, 12, 12, 512, 512, 64, False, np.float32, 1.3),
    "1x8 2048x2048 E64": (1, 8, 8, 2048, 2048, 64, False, np.float32, 1.3),
    "1x16 1024x1024 E128": (1, 16, 16, 1024, 1024, 128, False, np.float32, 1.2),
    "cross 2x8 256x4096 E64": (2, 8, 8, 256, 4096, 64, False, np.float32, 1.3),
    "GQA prefill 1x32/8 1024x1024 E128": (1, 32, 8, 1024, 1024, 128, False, np.float32, 1.2),
    "short 32x8 128x128 E64": (32, 8, 8, 128, 128, 64, False, np.float32, 1.5),
    "causal BERT-base 4x12 512x512 E64": (4, 12, 12, 512, 512, 64, True, np.float32, 1.5),
    "causal 1x8 2048x2048 E64": (1, 8, 8, 2048, 2048, 64, True, np.float32, 1.5),
    "causal 1x16 1024x1024 E128": (1, 16, 16, 1024, 1024, 128, True, np.float32, 1.5),
    "causal GQA prefill 1x32/8 1024x1024 E128": (1, 32, 8, 1024, 1024, 128, True, np.float32, 1.5),
    "causal short 32x8 128x128 E64": (32, 8, 8, 128, 128, 64, True, np.float32, 1.5),
    "GQA decode 1x32/8 1x16384 E128": (1, 32, 8, 1, 16384, 128, False, np.float32, 2.0),
    "MHA decode 1x8 1x2048 E64": (1, 8, 8, 1, 2048, 64, False, np.float32, None),
    "float64 1x8 2048x2048 E64": (1, 8, 8, 2048, 2048, 64, False, np.float64, 1.2),
}


def measure(candidates: dict, rounds: int) -> dict:
    """Best seconds per call of each candidate (fastattn.bench's method)."""
    return {name: t.best for name, t in bench.measure(candidates, rounds).items()}


def table_row(name, spec, rounds: int, with_numpy: bool, mm: float) -> str:
    b, hq, hkv, lq, lk, e, causal, dtype, target = spec
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, hq, lq, e)).astype(dtype)
    k = rng.standard_normal((b, hkv, lk, e)).astype(dtype)
    v = rng.standard_normal((b, hkv, lk, e)).astype(dtype)
    cands = {"fastattn": lambda: fastattn.scaled_dot_product_attention(q, k, v, is_causal=causal)}
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        kw = {"enable_gqa": True} if hq != hkv else {}
        cands["torch"] = lambda: torch.nn.functional.scaled_dot_product_attention(
            tq, tk, tv, is_causal=causal, **kw
        )
    if with_numpy:
        cands["numpy"] = lambda: numpy_sdpa(q, k, v, causal)
    if dtype == np.float32:  # the engines compute float64 inputs at float32 accuracy
        for engine in ENGINES:  # its fastest op, built outside the timing
            runner, _ = _anchors.fastest(
                engine,
                q,
                k,
                v,
                causal,
                fastattn.get_num_threads(),
                probe=lambda fn: probe_time(fn, bench.Method()),
            )
            cands[engine] = runner.call
    t = measure(cands, rounds)
    visible = (sum(min(i + 1, lk) for i in range(lq)) / (lq * lk)) if causal else 1.0
    flops = 4.0 * b * hq * lq * lk * e * visible
    rate = flops / t["fastattn"]
    row = f"| {name} | {t['fastattn'] * 1e3:.2f} | {rate / 1e9:.0f} | {rate / mm:.0%} | "
    if "torch" in t:
        row += f"{t['torch'] * 1e3:.2f} | {t['torch'] / t['fastattn']:.2f}x | "
    else:
        row += "- | - | "
    for engine in ENGINES:
        row += (
            f"{t[engine] * 1e3:.2f} | {t[engine] / t['fastattn']:.2f}x | "
            if engine in t
            else "- | - | "
        )
    row += f"{f'>= {target:.1f}x' if target else '-'} |"
    if with_numpy:
        row += f" {t['numpy'] * 1e3:.2f} | {t['numpy'] / t['fastattn']:.1f}x |"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--numpy", action="store_true", help="also time the NumPy formula")
    parser.add_argument("--shapes", default="", help="comma-separated substrings to select")
    args = parser.parse_args()
    if torch is not None:
        torch.set_num_threads(fastattn.get_num_threads())
    fastattn.show_config()
    mm, _ = bench.matmul_rate(args.rounds)
    print(f"float32 matmul rate, same run: {mm / 1e9:.1f} GFLOP/s\n")
    header = "| shape | fastattn ms | GFLOP/s | % matmul | torch ms | vs torch | "
    header += "".join(f"{e} ms | vs {e} | " for e in ENGINES) + "target |"
    if args.numpy:
        header += " numpy ms | vs numpy |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    wanted = [s for s in args.shapes.split(",") if s]
    for name, spec in SHAPES.items():
        if not wanted or any(w in name for w in wanted):
            print(table_row(name, spec, args.rounds, args.numpy, mm), flush=True)

    # Thread scaling and causal cost on the 2048 shape.
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, 2048, 64), dtype=np.float32) for _ in range(3))
    t = measure(
        {
            "1": lambda: fastattn.scaled_dot_product_attention(q, k, v, num_threads=1),
            "2": lambda: fastattn.scaled_dot_product_attention(q, k, v, num_threads=2),
            "causal": lambda: fastattn.scaled_dot_product_attention(
                q, k, v, is_causal=True, num_threads=2
            ),
        },
        args.rounds,
    )
    print(
        f"\n1x8 2048x2048 E64: 1 -> 2 threads speed-up {t['1'] / t['2']:.2f}x; "
        f"causal / non-causal time {t['causal'] / t['2']:.2f}"
    )


if __name__ == "__main__":
    main()

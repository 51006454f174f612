"""Per-step KV-cache decode time of MultiHeadAttention vs the attention kernel alone.

Run: python bench/decode_step_timing.py [--batch 1] [--embed-dim 512] [--heads 8]
     [--kv-heads 8] [--cache 2048] [--threads N] [--repeats 200] [--rounds 10]

The cache holds ``cache - 1`` positions; each timed step appends one token (then the cache
is rewound, so every step attends over ``cache`` keys). "kernel" times
``fastattn.scaled_dot_product_attention`` on the same arrays the layer passes it
(a ``(B, H, 1, D)`` query view against the head-major cache's ``(B, Hkv, cache, D)`` views),
"projections" the four NumPy matmuls of one step, and "kernel, token-major" the kernel on
a ``(B, cache, Hkv * D)`` layout viewed as heads (what a token-major cache would give it).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fastattn
from fastattn._projection import split_heads


def median_seconds(fn, repeats: int) -> float:
    for _ in range(min(20, repeats)):
        fn()
    times = np.empty(repeats)
    for i in range(repeats):
        t0 = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - t0
    return float(np.median(times))


def timings(rows, repeats: int, rounds: int) -> dict:
    """Median time of each function, measured in ``rounds`` interleaved rounds; the least
    of the rounds' medians is kept (other processes on the machine only ever add time)."""
    best = {name: np.inf for name, _ in rows}
    for _ in range(rounds):
        for name, fn in rows:
            best[name] = min(best[name], median_seconds(fn, repeats))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--embed-dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--cache", type=int, default=2048)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=200, help="timed calls per round")
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args()
    if a.threads is not None:
        fastattn.set_num_threads(a.threads)

    mha = fastattn.MultiHeadAttention(a.embed_dim, a.heads, num_kv_heads=a.kv_heads, seed=0)
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((a.batch, a.cache - 1, a.embed_dim), dtype=np.float32)
    step = rng.standard_normal((a.batch, 1, a.embed_dim), dtype=np.float32)
    cache = mha.new_kv_cache(a.batch, a.cache)
    mha(prompt, kv_cache=cache, is_causal=True)

    def decode_step():
        mha(step, kv_cache=cache, is_causal=True)
        cache.length -= 1  # rewind: every step sees the same cache length

    decode_step()
    q = split_heads(mha.q_proj(step), mha.num_heads)
    k, v = cache._key[:, :, : a.cache], cache._value[:, :, : a.cache]
    kt = split_heads(
        np.ascontiguousarray(k.swapaxes(1, 2)).reshape(a.batch, a.cache, -1), mha.num_kv_heads
    )
    vt = split_heads(
        np.ascontiguousarray(v.swapaxes(1, 2)).reshape(a.batch, a.cache, -1), mha.num_kv_heads
    )
    merged = np.empty((a.batch, 1, mha.num_heads, mha.head_dim), np.float32)
    out_view = merged.swapaxes(1, 2)

    def kernel():
        fastattn.scaled_dot_product_attention(
            q, k, v, is_causal=True, causal_alignment="bottom_right", out=out_view
        )

    def kernel_token_major():
        fastattn.scaled_dot_product_attention(
            q, kt, vt, is_causal=True, causal_alignment="bottom_right", out=out_view
        )

    slot_k, slot_v = cache._key[:, :, :1], cache._value[:, :, :1]

    def projections():
        mha.q_proj(step)
        mha.k_proj.into_heads(step, mha.num_kv_heads, slot_k)
        mha.v_proj.into_heads(step, mha.num_kv_heads, slot_v)
        mha.out_proj(merged.reshape(a.batch, 1, a.embed_dim))

    print(
        f"B={a.batch} E={a.embed_dim} H={a.heads} Hkv={mha.num_kv_heads} "
        f"D={mha.head_dim} cache={a.cache} threads={fastattn.get_num_threads()} "
        f"isa={fastattn._core.active_isa()}"
    )
    rows = [
        ("decode step (layer)", decode_step),
        ("kernel (layer's views)", kernel),
        ("projections (4 matmuls)", projections),
        ("kernel, token-major K/V", kernel_token_major),
    ]
    results = timings(rows, a.repeats, a.rounds)
    step_s = results["decode step (layer)"]
    for name, s in results.items():
        print(f"  {name:26s} {s * 1e6:9.1f} us   {s / step_s:6.1%} of the step")
    other = step_s - results["kernel (layer's views)"] - results["projections (4 matmuls)"]
    print(
        f"  {'rest (python, checks)':26s} {other * 1e6:9.1f} us   {other / step_s:6.1%} of the step"
    )


if __name__ == "__main__":
    main()

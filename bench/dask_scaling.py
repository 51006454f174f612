"""fastattn on Dask arrays: per-task overhead, 1 -> 2 worker scaling, graph size.

Run: python bench/dask_scaling.py [--rounds 5] [--batch 8] [--length 512]

* overhead: one chunk, (1, 8, L, 64) float32 causal, computed by a direct NumPy call and
  by the same call on a one-chunk Dask array (synchronous scheduler, threaded scheduler,
  and a distributed client with one single-threaded worker process holding the inputs:
  persist and wait, the result left on the worker); all on one thread.
* scaling: self-attention (B, 8, L, 64) float32 causal, one chunk per batch entry, on a
  LocalCluster of 1 and of 2 single-threaded worker processes holding the input (both
  clusters up, computed alternately; persist and wait), and the direct call on 1 and 2
  threads in the same run, for what the machine's second core gives.
* graph: the task count of a long-context case (4096 queries in chunks of 512 against
  2**20 keys in chunks of 2**14, causal bottom-right) and the time to build it.

Each timed candidate runs interleaved with the others for ``rounds`` rounds; the median
round is reported and ratios are between medians of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import dask
import dask.array as da
import numpy as np
from dask.distributed import Client, LocalCluster, futures_of, wait

import fastattn


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def on_workers(client, lazy):
    """Compute ``lazy`` on the cluster and wait, leaving the result on the workers."""
    persisted = client.persist(lazy)
    with client.as_current():
        wait(futures_of(persisted))
    return persisted


def interleaved(candidates: dict, rounds: int) -> dict:
    """Median seconds of each candidate, run round-robin (one warm-up round first)."""
    times = {name: [] for name in candidates}
    for r in range(rounds + 1):
        for name, fn in candidates.items():
            t = timed(fn)
            if r:
                times[name].append(t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def overhead(rounds: int, length: int) -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, length, 64), dtype=np.float32) for _ in range(3))
    dq, dk, dv = (da.from_array(x, chunks=x.shape) for x in (q, k, v))
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        # The inputs live on the worker already: only the task's own cost is timed.
        dq, dk, dv = (on_workers(client, a) for a in (dq, dk, dv))
        lazy = fastattn.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
        sync_lazy = fastattn.scaled_dot_product_attention(
            *(da.from_array(x, chunks=x.shape) for x in (q, k, v)), is_causal=True
        )
        candidates = {
            "direct NumPy call": lambda: fastattn.scaled_dot_product_attention(
                q, k, v, is_causal=True, num_threads=1
            ),
            "dask, sync scheduler": lambda: sync_lazy.compute(scheduler="sync"),
            "dask, threaded scheduler (1 thread)": lambda: dask.compute(
                sync_lazy, scheduler="threads", num_workers=1
            ),
            "dask, distributed (1 worker process)": lambda: on_workers(client, lazy),
        }
        med = interleaved(candidates, rounds)
    base = med["direct NumPy call"]
    print(f"\noverhead: one chunk (1, 8, {length}, 64) float32 causal, one thread, {rounds} rounds")
    for name, t in med.items():
        print(f"  {name:40s} {t * 1e3:9.2f} ms  ({t / base:5.2f}x, +{(t - base) * 1e3:7.2f} ms)")


def scaling(rounds: int, batch: int, length: int) -> None:
    shape = (batch, 8, length, 64)
    chunks = (1, 8, length, 64)
    # Made chunk by chunk on the workers (da.from_array would put every chunk on the
    # worker holding the whole array), so the scheduler spreads them.
    lazy_x = da.random.default_rng(1).standard_normal(shape, chunks=chunks, dtype=np.float32)
    x = lazy_x.compute(scheduler="sync")
    want = fastattn.scaled_dot_product_attention(x, x, x, is_causal=True)
    clusters = [
        LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        for n in (1, 2)
    ]
    clients = [Client(c, set_as_default=False) for c in clusters]
    try:
        lazies = []
        for client in clients:
            # Self-attention on inputs already on the workers: a task reads one chunk it
            # holds, so only the compute and the scheduling are timed (no transfers).
            d = on_workers(client, lazy_x)
            lazies.append(fastattn.scaled_dot_product_attention(d, d, d, is_causal=True))
        for client, lazy in zip(clients, lazies):  # each answer checked once
            np.testing.assert_allclose(client.compute(lazy).result(), want, atol=1e-5)
        candidates = {
            f"{n} worker(s)": (lambda c=c, z=z: on_workers(c, z))
            for n, c, z in zip((1, 2), clients, lazies)
        }
        candidates["direct NumPy call, 1 thread"] = lambda: fastattn.scaled_dot_product_attention(
            x, x, x, is_causal=True, num_threads=1
        )
        candidates["direct NumPy call, 2 threads"] = lambda: fastattn.scaled_dot_product_attention(
            x, x, x, is_causal=True, num_threads=2
        )
        med = interleaved(candidates, rounds)
    finally:
        for c in clients + clusters:
            c.close()
    print(f"\nscaling: self-attention {shape} float32 causal, chunks {chunks}, {rounds} rounds")
    for name, t in med.items():
        print(f"  {name:32s} {t * 1e3:9.2f} ms")
    print(f"  speed-up 1 -> 2 workers: {med['1 worker(s)'] / med['2 worker(s)']:.2f}x")
    threads = med["direct NumPy call, 1 thread"] / med["direct NumPy call, 2 threads"]
    print(f"  (the direct call, 1 -> 2 threads, same run: {threads:.2f}x)")


def graph_size() -> None:
    """Task counts: decode-like (few queries, every key chunk visible) and a causal
    prefill (query chunks x key chunks, the blocks above the diagonal left out)."""
    cases = {
        "long context: q (8, 4096, 64) / 512, k/v (8, 2**20, 64) / 2**14, bottom-right": (
            (8, 4096, 64, 512),
            (8, 2**20, 64, 2**14),
            "bottom_right",
        ),
        "prefill: q = k/v (8, 2**16, 64) / 2**12, top-left": (
            (8, 2**16, 64, 2**12),
            (8, 2**16, 64, 2**12),
            "top_left",
        ),
    }
    print("\ngraph size (causal, float32):")
    for label, (qs, ks, alignment) in cases.items():
        q = da.zeros(qs[:3], chunks=(qs[0], qs[3], qs[2]), dtype=np.float32)
        k = da.zeros(ks[:3], chunks=(ks[0], ks[3], ks[2]), dtype=np.float32)
        start = time.perf_counter()
        out = fastattn.scaled_dot_product_attention(
            q, k, k, is_causal=True, causal_alignment=alignment
        )
        built = time.perf_counter() - start
        layers = out.__dask_graph__().layers
        ours = sum(len(layer) for name, layer in layers.items() if name.startswith("fastattn"))
        blocks = len(q.chunks[1]) * len(k.chunks[1])
        print(
            f"  {label}: {blocks} (query, key) chunk pairs -> {ours} fastattn tasks "
            f"(partials, merges, outputs), built in {built * 1e3:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    a = parser.parse_args()
    graph_size()
    overhead(a.rounds, a.length)
    scaling(a.rounds, a.batch, a.length)


if __name__ == "__main__":
    main()

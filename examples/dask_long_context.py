"""
Exact attention over keys on disk, across Dask workers
======================================================

New tokens attend to a long context whose keys and values live in a chunked on-disk
array (Zarr), and the attention is computed by a cluster of Dask workers, none of which
ever holds more than one chunk of the context.

``fastattn.scaled_dot_product_attention`` given Dask arrays returns a lazy Dask array.
Its graph has one task per (query chunk, key chunk): each computes the attention of the
queries over its keys with the block's absolute position (causal alignment included) and
returns the partial output with its log-sum-exp; a tree of
``fastattn.merge_attention_states`` tasks then combines them into exactly the attention
over all the keys (up to rounding). Nothing is approximated.

At full scale (``--full``) the context is 2**20 positions of 4 heads: 1 GiB of keys and
1 GiB of values in float32, against 512 MiB of memory per worker. The default scale is
small so that the example runs in seconds (the test suite runs it); the code is the same.
On a real cluster, replace the ``LocalCluster`` with ``Client("scheduler-address:8786")``
and put the Zarr store where every worker can read it (a shared file system or object
storage, e.g. ``s3://...`` through fsspec).

Run: ``python examples/dask_long_context.py [--full]``
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import dask
import dask.array as da
import numpy as np
from dask.distributed import Client, LocalCluster

import fastattn

HEADS, DIM, NEW = 4, 64, 16


def sizes(full: bool) -> tuple[int, int]:
    """(context length, keys per chunk)."""
    return (2**20, 2**16) if full else (2**13, 2**10)


def write_context(path: Path, context: int, chunk: int, seed: int = 0) -> tuple:
    """Random keys and values, written chunk by chunk to two Zarr stores (no chunk of it
    is ever in memory twice), then opened lazily."""
    rng = da.random.default_rng(seed)
    for name in ("keys", "values"):
        x = rng.standard_normal((HEADS, context, DIM), chunks=(HEADS, chunk, DIM), dtype=np.float32)
        da.to_zarr(x, str(path / f"{name}.zarr"), overwrite=True)
    return da.from_zarr(str(path / "keys.zarr")), da.from_zarr(str(path / "values.zarr"))


def attend(queries: np.ndarray, keys, values):
    """The new tokens are the last positions of the sequence: causal, bottom-right."""
    q = da.from_array(queries, chunks=queries.shape)
    return fastattn.scaled_dot_product_attention(
        q, keys, values, is_causal=True, causal_alignment="bottom_right", return_lse=True
    )


def main(full: bool = False) -> None:
    context, chunk = sizes(full)
    queries = np.random.default_rng(1).standard_normal((HEADS, NEW, DIM), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        keys, values = write_context(Path(tmp), context, chunk)
        out, lse = attend(queries, keys, values)
        tasks = len(dict(out.__dask_graph__()))
        print(
            f"context: {context} keys in {context // chunk} chunks of {chunk}, "
            f"{2 * keys.nbytes / 2**20:.0f} MiB of keys and values on disk; graph: {tasks} tasks"
        )
        memory = "512MiB" if full else "256MiB"
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, memory_limit=memory, dashboard_address=None
            ) as cluster,
            Client(cluster),
        ):
            out, lse = dask.compute(out, lse)
        print(f"output {out.shape} {out.dtype}, lse from {lse.min():.2f} to {lse.max():.2f}")
        if not full:  # small enough to check against one call on the whole context
            want = fastattn.scaled_dot_product_attention(
                queries,
                np.asarray(keys),
                np.asarray(values),
                is_causal=True,
                causal_alignment="bottom_right",
            )
            print(f"max |distributed - one call| = {np.abs(out - want).max():.2e}")


if __name__ == "__main__":
    main(full="--full" in sys.argv)

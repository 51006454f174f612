"""
A large batch on Dask workers: embedding a corpus with a self-attention layer
=============================================================================

A corpus of padded token sequences is embedded by one ``fastattn.MultiHeadAttention``
layer followed by mean pooling over each sequence's valid tokens. The batch is a Dask
array chunked along the sequences, so each worker handles whole chunks of sequences with
no communication: given Dask arrays, the layer returns a lazy Dask array whose tasks run
the projections and the attention kernel on their chunk.

Inside a task fastattn uses the threads the worker gives each task (one per task for a
worker with as many threads as cores; pass ``num_threads=`` to choose), so the workers'
cores are not oversubscribed.

The default scale is small (the test suite runs it); ``--full`` embeds 2**16 sequences of
256 tokens. On a real cluster, replace the ``LocalCluster`` by
``Client("scheduler-address:8786")``.

Run: ``python examples/dask_batch.py [--full]``
"""

from __future__ import annotations

import sys

import dask.array as da
import numpy as np
from dask.distributed import Client, LocalCluster

import fastattn

EMBED, HEADS = 64, 8


def corpus(sequences: int, length: int, chunk: int, seed: int = 0):
    """Token vectors (sequences, length, EMBED) and each sequence's length, lazily made."""
    rng = da.random.default_rng(seed)
    tokens = rng.standard_normal(
        (sequences, length, EMBED), chunks=(chunk, length, EMBED), dtype=np.float32
    )
    lengths = np.random.default_rng(seed).integers(1, length + 1, sequences)
    return tokens, lengths


def embed(layer, tokens, lengths):
    """Self-attention over each sequence's valid tokens, then their mean."""
    hidden = layer(tokens, valid_lens=lengths)
    keep = da.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return (hidden * keep[..., None]).sum(axis=1) / lengths[:, None].astype(np.float32)


def main(full: bool = False) -> None:
    sequences, length, chunk = (2**16, 256, 2**10) if full else (256, 32, 64)
    layer = fastattn.MultiHeadAttention(EMBED, HEADS, seed=0)
    tokens, lengths = corpus(sequences, length, chunk)
    embeddings = embed(layer, tokens, lengths)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster),
    ):
        result = embeddings.compute()
    print(f"embedded {sequences} sequences of up to {length} tokens: {result.shape} {result.dtype}")
    if not full:  # small enough to check against the NumPy call
        x = tokens.compute()
        hidden = layer(x, valid_lens=lengths)
        keep = np.arange(length)[None, :] < lengths[:, None]
        want = (hidden * keep[..., None]).sum(axis=1) / lengths[:, None].astype(np.float32)
        print(f"max |distributed - NumPy| = {np.abs(result - want).max():.2e}")


if __name__ == "__main__":
    main(full="--full" in sys.argv)

"""
Attention over a long context, one chunk at a time
==================================================

Sixteen new tokens attend to a context of 16384 keys that lives on disk, not in memory.

The keys and values are written to ``numpy.memmap`` files chunk by chunk (from a generator,
as a loader or a shard reader would hand them over). Attention then visits one chunk at a
time: ``fastattn.scaled_dot_product_attention(..., return_lse=True)`` on that chunk gives a
partial output and its log-sum-exp, and ``fastattn.merge_attention_states`` combines the
partial results into exactly the attention over all the keys (up to rounding). Only the
chunk being read is ever in memory.

The new tokens are the last 16 positions of the sequence, so the chunk that holds them is
causal with bottom-right alignment and every earlier chunk is fully visible. Each query has
a "needle": a key, hidden somewhere in the context, that resembles it. The figure shows the
share of each query's attention that each chunk carries, ``exp(lse_chunk - lse)``: every
query draws almost all of it from the chunk holding its needle.

Run: ``python examples/chunked_long_context.py [output.png]``
writes the figure to ``output.png`` (default: ``chunked_long_context.png``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import fastattn

HEADS, DIM = 4, 64
CONTEXT, CHUNK, NEW = 16384, 2048, 16  # keys in all, keys per chunk, new query tokens


def make_queries_and_needles(rng):
    """The queries (HEADS, NEW, DIM) and, per query, the key position of its needle."""
    queries = rng.standard_normal((HEADS, NEW, DIM), dtype=np.float32)
    needles = rng.choice(CONTEXT - NEW, NEW, replace=False)
    return queries, needles


def context_chunks(rng, queries, needles):
    """(keys, values) of each chunk in turn, each (HEADS, CHUNK, DIM): random, but the key at
    a query's needle position is that query scaled up, so it scores far above the rest."""
    for start in range(0, CONTEXT, CHUNK):
        keys = rng.standard_normal((HEADS, CHUNK, DIM), dtype=np.float32)
        values = rng.standard_normal((HEADS, CHUNK, DIM), dtype=np.float32)
        for query, position in enumerate(needles):
            if start <= position < start + CHUNK:
                keys[:, position - start] = 2.0 * queries[:, query]
        yield keys, values


def write_context(directory: Path, chunks):
    """The chunks written one after another into two memmaps of (HEADS, CONTEXT, DIM)."""
    shape = (HEADS, CONTEXT, DIM)
    keys = np.memmap(directory / "keys.f32", np.float32, "w+", shape=shape)
    values = np.memmap(directory / "values.f32", np.float32, "w+", shape=shape)
    for start, (k, v) in zip(range(0, CONTEXT, CHUNK), chunks):
        keys[:, start : start + CHUNK] = k
        values[:, start : start + CHUNK] = v
    keys.flush()
    values.flush()
    return keys, values


def chunked_attention(queries, keys, values):
    """Attention of the last NEW positions over all keys, one chunk of keys in memory at a
    time: (output, lse, the per-chunk lses)."""
    outputs, lses = [], []
    for start in range(0, CONTEXT, CHUNK):
        end = start + CHUNK
        out, lse = fastattn.scaled_dot_product_attention(
            queries,
            np.asarray(keys[:, start:end]),  # this chunk only, read from disk
            np.asarray(values[:, start:end]),
            is_causal=end == CONTEXT,  # only the last chunk holds the queries' own positions
            causal_alignment="bottom_right",
            return_lse=True,
        )
        outputs.append(out)
        lses.append(lse)
    merged, merged_lse = fastattn.merge_attention_states(outputs, lses)
    return merged, merged_lse, np.stack(lses)


def main(path: str = "chunked_long_context.png") -> None:
    from matplotlib.figure import Figure  # no pyplot: works on any (or no) display

    rng = np.random.default_rng(0)
    queries, needles = make_queries_and_needles(rng)
    with tempfile.TemporaryDirectory() as tmp:
        keys, values = write_context(Path(tmp), context_chunks(rng, queries, needles))
        out, lse, chunk_lses = chunked_attention(queries, keys, values)
        # The check a long context would not allow: everything in memory at once.
        full = fastattn.scaled_dot_product_attention(
            queries,
            np.asarray(keys),
            np.asarray(values),
            is_causal=True,
            causal_alignment="bottom_right",
        )
        del keys, values  # close the memmaps before the directory goes
    print(
        f"{CONTEXT // CHUNK} chunks of {CHUNK} keys merged; largest difference from the "
        f"one-shot call: {np.abs(out - full).max():.2e}"
    )

    share = np.exp(chunk_lses - lse).mean(axis=1)  # (chunks, NEW), averaged over heads
    found = share.argmax(axis=0) == needles // CHUNK
    print(f"queries that draw most from their needle's chunk: {found.sum()} of {NEW}")

    fig = Figure(figsize=(10, 5), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(share, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.plot(np.arange(NEW), needles // CHUNK, "wx", markersize=8, label="needle's chunk")
    ax.set_xlabel("new token (query)")
    ax.set_ylabel(f"chunk of {CHUNK} context keys")
    ax.legend(loc="upper right")
    fig.colorbar(image, ax=ax, label="share of the attention, exp(lse_chunk - lse)")
    fig.suptitle("Long-context attention computed chunk by chunk, merged by log-sum-exp")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

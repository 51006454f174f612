"""
Local + global attention with a reusable block mask
===================================================

Long-document encoders (Longformer, BigBird) let each token attend to a band of neighbours
plus a few global tokens that see, and are seen by, every token. Written as a dense bool
mask, most of its 64 x 64 tiles hide every key: ``fastattn.block_mask`` freezes the mask
once (read-only, with its per-tile counts), every layer passes it as ``attn_mask=``, and
the kernels skip the tiles it hides. The result is bit for bit that of the dense mask.

The figure shows which tiles hold a kept entry (those are the only ones computed).

Run: ``python examples/local_global_attention.py [output.png]``
writes the figure to ``output.png`` (default: ``local_global_attention.png``).
"""

from __future__ import annotations

import sys
import time

import numpy as np

import fastattn


def local_global_mask(length: int, window: int, global_tokens: list[int]) -> np.ndarray:
    """True where query i may attend key j: |i - j| <= window, or i or j is global."""
    i = np.arange(length)
    mask = np.abs(i[:, None] - i[None, :]) <= window
    mask[:, global_tokens] = True
    mask[global_tokens, :] = True
    return mask


def main(path: str = "local_global_attention.png") -> None:
    from matplotlib.figure import Figure  # no pyplot: works on any (or no) display

    length, heads, dim, layers = 2048, 4, 64, 3
    bm = fastattn.block_mask(local_global_mask(length, 96, [0, 1, 2, 3]))
    print(f"{bm}: {bm.sparsity:.0%} of the 64x64 tiles hide every key")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, heads, length, dim), dtype=np.float32)
    start = time.perf_counter()
    for _ in range(layers):  # one mask, reused by every layer
        y = fastattn.scaled_dot_product_attention(x, x, x, attn_mask=bm)
        x = x + y
    sparse_s = time.perf_counter() - start
    # The same layers with every tile computed (an all-True mask) for comparison.
    everything = np.ones((length, length), bool)
    start = time.perf_counter()
    for _ in range(layers):
        fastattn.scaled_dot_product_attention(x, x, x, attn_mask=everything)
    dense_s = time.perf_counter() - start
    print(
        f"{layers} layers: {sparse_s * 1e3:.0f} ms with the block mask, "
        f"{dense_s * 1e3:.0f} ms dense"
    )

    # The block mask means exactly its dense mask.
    q = x[..., :256, :]
    assert np.array_equal(
        fastattn.scaled_dot_product_attention(q, x, x, attn_mask=bm.mask[:256]),
        fastattn.scaled_dot_product_attention(
            q, x, x, attn_mask=fastattn.block_mask(bm.mask[:256])
        ),
    )

    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.subplots()
    ax.imshow(bm.tile_counts > 0, cmap="Blues", interpolation="nearest")
    ax.set_title(f"Tiles computed ({1 - bm.sparsity:.0%} of {bm.tile_counts.size})")
    ax.set_xlabel("key block (64 keys)")
    ax.set_ylabel("query block (64 queries)")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

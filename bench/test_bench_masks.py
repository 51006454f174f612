"""pytest-benchmark rows for masks that hide whole blocks (#20): a key-padding bool mask next
to the same call with valid_lens, a block-sparse mask (90 % of its 64x64 tiles empty) next to
an all-True mask of the same shape, and a dense random mask (nothing to skip).

Run: python -m pytest bench/test_bench_masks.py   (compare rows within a group, same run).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import attention_flops  # bench/conftest.py

import fastattn

PADDING_LENGTHS = [77, 128, 256, 512]


def padded_batch(length, batch=64, heads=12, dim=32, seed=0):
    """A MiniLM-like batch (12 heads of 32) with about 70 % padding: inputs and lengths."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((batch, heads, length, dim), dtype=np.float32) for _ in range(3))
    lens = np.clip(rng.normal(0.3 * length, 0.1 * length, batch).astype(int), 1, length)
    return q, k, v, lens


@pytest.mark.parametrize("how", ["valid_lens", "key_padding_mask"])
@pytest.mark.parametrize("length", PADDING_LENGTHS)
def test_key_padding(record, benchmark, length, how):
    benchmark.group = f"key padding B64 H12 L{length} E32 (~70 % padding)"
    q, k, v, lens = padded_batch(length)
    flops = attention_flops(q.shape, k.shape, v.shape, False)
    if how == "valid_lens":
        out = record(
            how,
            flops,
            fastattn.scaled_dot_product_attention,
            q,
            k,
            v,
            valid_lens=lens[:, None, None],
        )
    else:
        mask = (np.arange(length) < lens[:, None])[:, None, None, :]
        out = record(how, flops, fastattn.scaled_dot_product_attention, q, k, v, attn_mask=mask)
    want = fastattn.scaled_dot_product_attention(q, k, v, valid_lens=lens[:, None, None])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("how", ["block_sparse", "block_mask", "all_true"])
def test_block_sparse(record, benchmark, how):
    benchmark.group = "block-sparse B1 H2 L4096 E64 (90 % of 64x64 tiles empty)"
    rng = np.random.default_rng(0)
    length = 4096
    q, k, v = (rng.standard_normal((1, 2, length, 64), dtype=np.float32) for _ in range(3))
    tiles = rng.random((length // 64, length // 64)) < 0.1
    mask = np.kron(tiles, np.ones((64, 64), bool))
    flops = attention_flops(q.shape, k.shape, v.shape, False)
    m = {"block_sparse": mask, "block_mask": fastattn.block_mask(mask)}.get(how)
    if m is None:
        m = np.ones_like(mask)
    out = record(how, flops, fastattn.scaled_dot_product_attention, q, k, v, attn_mask=m)
    assert np.isfinite(out).all()


def test_dense_random_mask(record, benchmark):
    benchmark.group = "dense random mask B1 H8 L1024 E64 (nothing to skip)"
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, 1024, 64), dtype=np.float32) for _ in range(3))
    mask = rng.random((1, 8, 1024, 1024)) < 0.5
    flops = attention_flops(q.shape, k.shape, v.shape, False)
    out = record("fastattn", flops, fastattn.scaled_dot_product_attention, q, k, v, attn_mask=mask)
    assert np.isfinite(out).all()

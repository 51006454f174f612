"""fastattn.block_mask: a frozen bool mask with its tile counts, meaning exactly its mask."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close_attention, unpack

# The isa fixture is set once per test; every drawn example runs on that ISA.
FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=30, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    lq=st.integers(0, 150),
    lk=st.integers(0, 150),
    block=st.integers(1, 70),
)
def test_tile_counts_and_sparsity(seed, lq, lk, block):
    rng = np.random.default_rng(seed)
    m = rng.random((2, lq, lk)) < rng.random()
    bm = fastattn.block_mask(m, block_size=block)
    tq, tk = -(-lq // block), -(-lk // block)
    assert bm.tile_counts.shape == (2, tq, tk)
    for b in range(2):
        for i in range(tq):
            for j in range(tk):
                tile = m[b, i * block : (i + 1) * block, j * block : (j + 1) * block]
                assert bm.tile_counts[b, i, j] == tile.sum()
    empty = (bm.tile_counts == 0).sum() / bm.tile_counts.size if bm.tile_counts.size else 0.0
    assert bm.sparsity == pytest.approx(empty)
    assert bm.shape == m.shape and bm.block_size == block
    np.testing.assert_array_equal(np.asarray(bm), m)


def test_frozen():
    m = np.zeros((4, 4), bool)
    bm = fastattn.block_mask(m)
    m[0, 0] = True  # a copy: the caller's later changes do not reach it
    assert not bm.mask.any()
    with pytest.raises(ValueError):
        bm.mask[0, 0] = True
    with pytest.raises(AttributeError):
        bm.block_size = 3
    assert "BlockMask(shape=(4, 4)" in repr(bm)
    assert fastattn.block_mask(bm).mask is not bm.mask


@pytest.mark.parametrize(
    ("mask", "kw", "error", "match"),
    [
        (np.zeros((4, 4)), {}, TypeError, "mask must be a bool array"),
        (np.zeros(4, bool), {}, ValueError, "at least 2-D"),
        (np.zeros((4, 4), bool), {"block_size": 0}, ValueError, "block_size must be >= 1"),
        (np.zeros((4, 4), bool), {"block_size": 2.5}, TypeError, "block_size must be an integer"),
        (np.zeros((4, 4), bool), {"block_size": True}, TypeError, "block_size must be an integer"),
    ],
)
def test_errors(mask, kw, error, match):
    with pytest.raises(error, match=match):
        fastattn.block_mask(mask, **kw)


def local_global(length, window, global_tokens):
    """Longformer-style: each token sees a band of +-window, and a few global tokens see and
    are seen by every token."""
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    m = np.abs(i - j) <= window
    m[:, global_tokens] = True
    m[global_tokens, :] = True
    return m


@settings(max_examples=10, suppress_health_check=FIXTURE_OK)
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from([np.float32, np.float64]))
def test_local_global_reused_across_calls(isa, seed, dtype):
    """One BlockMask serves several calls (layers); each is the reference's result for the
    dense mask and bit for bit the dense-mask call."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(64, 600))
    bm = fastattn.block_mask(local_global(length, int(rng.integers(1, 64)), [0, length // 2]))
    for _ in range(2):
        q, k, v = (rng.standard_normal((2, 4, length, 16)).astype(dtype) for _ in range(3))
        got = unpack(
            fastattn.scaled_dot_product_attention(q, k, v, attn_mask=bm, return_lse=True), True
        )
        want = unpack(
            reference.scaled_dot_product_attention(q, k, v, attn_mask=bm, return_lse=True), True
        )
        assert_close_attention(got, want, q, k, v, attn_mask=bm.mask)
        dense = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=bm.mask, return_lse=True)
        np.testing.assert_array_equal(got[0], dense[0])
        np.testing.assert_array_equal(got[1], dense[1])


def test_accepted_by_attention_family():
    """Every function that takes attn_mask takes a BlockMask as its mask."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 70, 8)) for _ in range(3))
    m = rng.random((70, 70)) < 0.3
    bm = fastattn.block_mask(m)
    np.testing.assert_array_equal(
        fastattn.attention(q, k, v, attn_mask=bm), fastattn.attention(q, k, v, attn_mask=m)
    )

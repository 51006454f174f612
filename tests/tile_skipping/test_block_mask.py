"""fastattn.block_mask: a frozen bool mask with its tile counts, meaning exactly its mask."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import _core, reference

from helpers.attention_checks import assert_close_attention, unpack
from tile_skipping.test_tile_skipping import tile_pattern

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
    # nor can it be made writeable again (its summary would go stale under an edit)
    with pytest.raises(ValueError):
        bm.mask.flags.writeable = True
    with pytest.raises(AttributeError):
        bm.block_size = 3
    assert "BlockMask(shape=(4, 4)" in repr(bm)
    # pickles (for process pools and Dask workers) and copies as its mask and block size
    for again in (pickle.loads(pickle.dumps(bm)), copy.deepcopy(bm)):
        assert isinstance(again, fastattn.BlockMask) and again.block_size == bm.block_size
        np.testing.assert_array_equal(again.mask, bm.mask)
        np.testing.assert_array_equal(again.tile_counts, bm.tile_counts)
    assert fastattn.block_mask(bm).mask is not bm.mask


def test_unpickled_block_mask_computes_the_same():
    rng = np.random.default_rng(7)
    m = rng.random((2, 1, 150, 300)) < 0.05
    m[..., :64] = False  # a hidden chunk in every row: the summary skips it
    bm = pickle.loads(pickle.dumps(fastattn.block_mask(m)))
    q = rng.standard_normal((2, 3, 150, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 3, 300, 16)).astype(np.float32) for _ in range(2))
    sdpa = fastattn.scaled_dot_product_attention
    np.testing.assert_array_equal(sdpa(q, k, v, attn_mask=bm), sdpa(q, k, v, attn_mask=m))


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


@settings(max_examples=25, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.float32, np.float64]),
    kind=st.sampled_from(["key_padding", "padding_holes", "tiles", "small_tiles", "per_head"]),
    shape=st.tuples(
        st.integers(1, 3),  # batch
        st.integers(1, 3),  # heads
        st.integers(1, 150),  # Lq
        st.integers(1, 400),  # Lk
    ),
    rank=st.sampled_from([2, 3, 4]),
    compose=st.sampled_from(["none", "valid_lens", "causal"]),
)
def test_summary_reused_equals_dense_mask(isa, seed, dtype, kind, shape, rank, compose):
    """A BlockMask's summary, built once, is what its calls' kernels read: each call is the
    reference's result and bit for bit the call with the dense mask, for every mask rank
    that broadcasts (incl. tiles keeping exactly one entry and rows keeping nothing)."""
    rng = np.random.default_rng(seed)
    batch, heads, lq, lk = shape
    if kind in ("key_padding", "padding_holes"):
        lens = rng.integers(0, lk + 1, batch)
        m = (np.arange(lk) < lens[:, None])[:, None, None, :]
        if kind == "padding_holes":
            m = m & (rng.random((batch, 1, 1, lk)) < 0.8)
        rank = 4
    elif kind == "per_head":
        m = np.stack([tile_pattern(rng, lq, lk, 32, 64, 0.2, 0.5) for _ in range(heads)])
        m = m[None] if rank == 4 else m
        rank = max(rank, 3)
    else:
        tiles = (64, 64) if kind == "tiles" else tuple(int(x) for x in rng.integers(1, 48, 2))
        m = tile_pattern(rng, lq, lk, *tiles, 0.3, 0.4)
        m = m.reshape((1,) * (rank - 2) + m.shape)
    m[..., : min(2, m.shape[-2]), :] = False  # rows that keep nothing give 0
    bm = fastattn.block_mask(m)
    assert bm.summary is not None
    kw = {}
    if compose == "valid_lens":
        kw["valid_lens"] = rng.integers(0, lk + 1, (batch, heads, lq))
    elif compose == "causal":
        kw["is_causal"] = True
    for _ in range(2):  # one BlockMask, several calls (layers)
        q, k, v = (rng.standard_normal((batch, heads, n, 24)).astype(dtype) for n in (lq, lk, lk))
        out = np.full((batch, heads, lq, 24), np.nan, dtype)  # poisoned: all written
        got = unpack(
            fastattn.scaled_dot_product_attention(
                q, k, v, attn_mask=bm, return_lse=True, out=out, **kw
            ),
            True,
        )
        assert got[0] is out
        want = unpack(
            reference.scaled_dot_product_attention(
                q, k, v, attn_mask=np.asarray(m), return_lse=True, **kw
            ),
            True,
        )
        assert_close_attention(got, want, q, k, v, attn_mask=np.asarray(m))
        assert not got[0][..., : min(2, lq), :].any()
        for threads in (1, 2):
            dense = fastattn.scaled_dot_product_attention(
                q, k, v, attn_mask=np.array(m), return_lse=True, num_threads=threads, **kw
            )
            np.testing.assert_array_equal(got[0], dense[0])
            np.testing.assert_array_equal(got[1], dense[1])


def test_summary_of_another_mask_is_not_used(isa):
    """The kernel takes a prebuilt summary only for the very mask it was built from: handed
    with another mask of the same shape, the call is that mask's own (bit for bit)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 130, 16), dtype=np.float32) for _ in range(3))
    m1 = tile_pattern(rng, 130, 130, 64, 64, 0.3, 0.0)
    m2 = ~m1
    summary = fastattn.block_mask(m1).summary

    def run(mask, summary):
        out = np.full_like(q, np.nan)
        _core.sdpa(
            query=q,
            key=k,
            value=v,
            out=out,
            bool_mask=np.broadcast_to(mask, (1, 2, 130, 130)),
            scale=0.25,
            num_threads=2,
            mask_summary=summary,
        )
        return out

    np.testing.assert_array_equal(run(m2, summary), run(m2, None))
    bm = fastattn.block_mask(m1)
    np.testing.assert_array_equal(run(bm.mask, bm.summary), run(m1, None))

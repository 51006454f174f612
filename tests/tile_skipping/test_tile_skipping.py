"""Bool masks that hide keys in whole chunks and tiles (key padding, block-sparse,
local + global, rows that keep nothing, one kept key in a tile): the kernels skip what the
mask hides, and the result must still be the reference's, on every ISA, for any thread
count, composed with valid_lens, causal, window, GQA, broadcasting and the decode path's
key splits."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close_attention, unpack

# The isa fixture is set once per test; every drawn example runs on that ISA.
FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

DTYPES = [np.float32, np.float64]


def tile_pattern(rng, lq, lk, tile_q, tile_k, density, one_fraction):
    """A bool (lq, lk) mask made of tile_q x tile_k tiles kept with probability
    ``density``; a ``one_fraction`` of the kept tiles keeps exactly one entry instead."""
    tq, tk = -(-lq // tile_q), -(-lk // tile_k)
    kept = rng.random((tq, tk)) < density
    m = np.kron(kept, np.ones((tile_q, tile_k), bool))[:lq, :lk].copy()
    for a, b in zip(*np.nonzero(kept & (rng.random((tq, tk)) < one_fraction))):
        r0, c0 = a * tile_q, b * tile_k
        m[r0 : r0 + tile_q, c0 : c0 + tile_k] = False
        m[min(r0 + rng.integers(tile_q), lq - 1), min(c0 + rng.integers(tile_k), lk - 1)] = True
    return m


# The option a sparse mask is composed with: valid_lens, causal (bottom right), a window,
# or none.
def composed(rng, compose, batch, h, lq, lk):
    if compose == "valid_lens":
        return {"valid_lens": rng.integers(0, lk + 1, (batch, h, lq))}
    if compose == "causal":
        return {"is_causal": True, "causal_alignment": "bottom_right"}
    if compose == "window":
        return {"window": (int(rng.integers(0, 100)), int(rng.integers(0, 100)))}
    return {}


def draw_mask(rng, kind, batch, hq, lq, lk):
    """A mask of the named kind, shaped to broadcast against (batch, hq, lq, lk)."""
    if kind == "key_padding":  # (B, 1, 1, Lk), what ~key_padding_mask[:, None, None, :] is
        lens = rng.integers(0, lk + 1, batch)
        return (np.arange(lk) < lens[:, None])[:, None, None, :]
    if kind == "padding_holes":  # key padding with holes: not an interval
        lens = rng.integers(0, lk + 1, batch)
        holes = rng.random((batch, 1, 1, lk)) < 0.2
        return ((np.arange(lk) < lens[:, None])[:, None, None, :]) & ~holes
    if kind == "tiles":
        return tile_pattern(rng, lq, lk, 64, 64, 0.15, 0.3)
    if kind == "small_tiles":  # tiles that straddle the kernels' 64-key chunks
        tq, tk = (int(x) for x in rng.integers(1, 48, 2))
        return tile_pattern(rng, lq, lk, tq, tk, 0.3, 0.3)
    if kind == "per_head_tiles":
        return np.stack([tile_pattern(rng, lq, lk, 32, 64, 0.2, 0.5) for _ in range(hq)])
    if kind == "local_global":  # a band plus a few global keys and rows
        i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
        m = np.abs(i - j) <= int(rng.integers(0, 80))
        m[:, rng.integers(0, lk, 2)] = True
        m[rng.integers(0, lq, 2), :] = True
        return m
    if kind == "rows_empty":  # whole rows hidden, broadcast along the keys (stride 0)
        return np.broadcast_to(rng.random((lq, 1)) < 0.5, (lq, lk))
    if kind == "transposed":  # a column stride other than 1
        return tile_pattern(rng, lk, lq, 64, 16, 0.3, 0.3).T
    raise AssertionError(kind)


KINDS = [
    "key_padding",
    "padding_holes",
    "tiles",
    "small_tiles",
    "per_head_tiles",
    "local_global",
    "rows_empty",
    "transposed",
]


@settings(max_examples=25, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(KINDS),
    shape=st.tuples(
        st.integers(1, 2),  # batch
        st.integers(1, 2),  # kv heads
        st.sampled_from([1, 3]),  # query heads per kv head (GQA)
        st.integers(1, 200),  # Lq
        st.integers(1, 700),  # Lk
        st.sampled_from([8, 40, 64]),  # E
    ),
    compose=st.sampled_from(["none", "valid_lens", "causal", "window"]),
    extras=st.booleans(),
)
def test_sparse_masks_match_reference(isa, seed, dtype, kind, shape, compose, extras):
    rng = np.random.default_rng(seed)
    batch, hkv, group, lq, lk, e = shape
    hq = hkv * group
    q = rng.standard_normal((batch, hq, lq, e)).astype(dtype)
    k = rng.standard_normal((batch, hkv, lk, e)).astype(dtype)
    v = rng.standard_normal((batch, hkv, lk, e)).astype(dtype)
    mask = draw_mask(rng, kind, batch, hq, lq, lk)
    kw = composed(rng, compose, batch, hq, lq, lk)
    want = unpack(
        reference.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, return_lse=True, return_weights=True, **kw
        ),
        True,
        True,
    )
    # Poisoned output buffer: every element must be written.
    out = np.full((batch, hq, lq, e), np.nan, dtype)
    got = unpack(
        fastattn.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, return_lse=True, return_weights=extras, out=out, **kw
        ),
        True,
        extras,
    )
    assert got[0] is out
    assert_close_attention(got, want, q, k, v, attn_mask=mask)
    # Bit-identical for any thread count, and through a BlockMask.
    for threads, m in ((1, mask), (2, fastattn.block_mask(mask))):
        again = unpack(
            fastattn.scaled_dot_product_attention(
                q, k, v, attn_mask=m, return_lse=True, num_threads=threads, **kw
            ),
            True,
        )
        np.testing.assert_array_equal(again[0], got[0])
        np.testing.assert_array_equal(again[1], got[1])


@settings(max_examples=10, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    lk=st.integers(2048, 5000),
    queries=st.sampled_from([1, 2]),
    kind=st.sampled_from(["key_padding", "padding_holes", "tiles", "local_global"]),
)
def test_decode_key_splits(isa, seed, dtype, lk, queries, kind):
    """A few query rows over many keys: the thin kernel with the keys split."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 2, queries, 64)).astype(dtype)
    k = rng.standard_normal((1, 2, lk, 64)).astype(dtype)
    v = rng.standard_normal((1, 2, lk, 64)).astype(dtype)
    mask = draw_mask(rng, kind, 1, 2, queries, lk)
    want = unpack(
        reference.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True), True
    )
    got = unpack(
        fastattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True), True
    )
    assert_close_attention(got, want, q, k, v, attn_mask=mask)
    one = unpack(
        fastattn.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, return_lse=True, num_threads=1
        ),
        True,
    )
    np.testing.assert_array_equal(one[0], got[0])


@settings(max_examples=15, suppress_health_check=FIXTURE_OK)
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(DTYPES))
def test_hidden_keys_are_never_read(isa, seed, dtype):
    """Keys and values in tiles the mask hides are NaN: skipped or masked, they must not
    reach any row."""
    rng = np.random.default_rng(seed)
    lq, lk = int(rng.integers(1, 300)), int(rng.integers(1, 900))
    mask = tile_pattern(rng, lq, lk, 64, 64, 0.2, 0.3)
    q = rng.standard_normal((2, lq, 32)).astype(dtype)
    k = rng.standard_normal((2, lk, 32)).astype(dtype)
    v = rng.standard_normal((2, lk, 32)).astype(dtype)
    hidden = ~mask.any(axis=0)  # keys no row sees
    k[:, hidden] = np.nan
    v[:, hidden] = np.nan
    want = unpack(
        reference.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True), True
    )
    got = unpack(
        fastattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True), True
    )
    assert not np.isnan(got[0]).any()
    assert_close_attention(got, want, q, k, v, attn_mask=mask)


@settings(max_examples=15, suppress_health_check=FIXTURE_OK)
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(DTYPES))
def test_float_masks_with_hidden_tiles(isa, seed, dtype):
    """A float mask that is -inf over whole tiles, alone and beside valid_lens."""
    rng = np.random.default_rng(seed)
    lq, lk = int(rng.integers(1, 200)), int(rng.integers(1, 600))
    kept = tile_pattern(rng, lq, lk, 64, 64, 0.3, 0.3)
    fmask = np.where(kept, rng.standard_normal((lq, lk)), -np.inf).astype(dtype)
    q = rng.standard_normal((2, 2, lq, 16)).astype(dtype)
    k = rng.standard_normal((2, 2, lk, 16)).astype(dtype)
    v = rng.standard_normal((2, 2, lk, 16)).astype(dtype)
    lens = rng.integers(0, lk + 1, (2, 2, lq))
    for kw in ({}, {"valid_lens": lens}):
        want = unpack(
            reference.scaled_dot_product_attention(q, k, v, attn_mask=fmask, return_lse=True, **kw),
            True,
        )
        got = unpack(
            fastattn.scaled_dot_product_attention(q, k, v, attn_mask=fmask, return_lse=True, **kw),
            True,
        )
        assert_close_attention(got, want, q, k, v, attn_mask=fmask)


def test_key_padding_equals_valid_lens(isa):
    """A key-padding mask (B, 1, 1, L) is an interval per row: bit for bit the same call
    with valid_lens."""
    rng = np.random.default_rng(0)
    b, h, length, e = 5, 3, 140, 32
    q, k, v = (rng.standard_normal((b, h, length, e)).astype(np.float32) for _ in range(3))
    lens = rng.integers(0, length + 1, b)
    pad = (np.arange(length) < lens[:, None])[:, None, None, :]
    got = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=pad, return_lse=True)
    want = fastattn.scaled_dot_product_attention(
        q, k, v, valid_lens=lens[:, None, None], return_lse=True
    )
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])

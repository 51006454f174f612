"""A BlockMask's precomputed summary travels with the checked arguments to every call of
the SDPA kernel: scaled_dot_product_attention, attention() with a dot-product softmax,
and MultiHeadAttention. Each such call is bit for bit the dense mask's call."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import _core, reference

from helpers.attention_checks import assert_close_attention, unpack
from tile_skipping.test_tile_skipping import DTYPES, KINDS, composed, draw_mask

FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=25, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(KINDS),
    score=st.sampled_from(["dot", "scaled_dot"]),
    shape=st.tuples(
        st.integers(1, 2),  # batch
        st.integers(1, 3),  # heads
        st.integers(1, 150),  # Lq
        st.integers(1, 400),  # Lk
    ),
    compose=st.sampled_from(["none", "valid_lens", "causal", "window"]),
)
def test_attention_block_mask_is_the_dense_mask(isa, seed, dtype, kind, score, shape, compose):
    """attention(score="dot"/"scaled_dot") with a BlockMask: the reference's result for the
    dense mask, and bit for bit the dense-mask call at 1 and 2 threads, for each of two
    calls (layers) reusing the one BlockMask."""
    rng = np.random.default_rng(seed)
    batch, h, lq, lk = shape
    m = draw_mask(rng, kind, batch, h, lq, lk)
    bm = fastattn.block_mask(m)
    kw = composed(rng, compose, batch, h, lq, lk)
    scale = 1.0 if score == "dot" else None
    for _ in range(2):
        q, k, v = (rng.standard_normal((batch, h, n, 16)).astype(dtype) for n in (lq, lk, lk))
        out = np.full((batch, h, lq, 16), np.nan, dtype)  # poisoned: all written
        got = fastattn.attention(q, k, v, attn_mask=bm, score=score, out=out, **kw)
        assert got is out
        want = reference.scaled_dot_product_attention(
            q, k, v, attn_mask=np.asarray(m), scale=scale, return_lse=True, **kw
        )
        assert_close_attention(
            (got, None, None), unpack(want, True), q, k, v, attn_mask=np.asarray(m), scale=scale
        )
        for threads in (1, 2):
            dense = fastattn.attention(
                q, k, v, attn_mask=np.array(m), score=score, num_threads=threads, **kw
            )
            np.testing.assert_array_equal(got, dense)


@pytest.fixture
def sdpa_summaries(monkeypatch):
    """The mask_summary of every _core.sdpa call made while the test runs (the kernel
    itself still runs)."""
    seen = []
    sdpa = _core.sdpa

    def spy(**kwargs):
        seen.append(kwargs.get("mask_summary"))
        return sdpa(**kwargs)

    monkeypatch.setattr(_core, "sdpa", spy)
    return seen


def test_block_mask_summary_reaches_the_sdpa_kernel(sdpa_summaries):
    """Each path into the SDPA kernel hands it the BlockMask's own summary (not a rebuilt
    one, not none); a plain bool mask goes without."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 4, 70, 8), dtype=np.float32) for _ in range(3))
    m = rng.random((70, 70)) < 0.3
    bm = fastattn.block_mask(m)
    assert bm.summary is not None
    calls = [
        lambda mask: fastattn.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        lambda mask: fastattn.attention(q, k, v, attn_mask=mask, score="dot"),
        lambda mask: fastattn.attention(q, k, v, attn_mask=mask, score="scaled_dot"),
    ]
    mha = fastattn.MultiHeadAttention(32, 4, seed=0)
    x = rng.standard_normal((2, 70, 32), dtype=np.float32)
    calls.append(lambda mask: mha(x, x, x, attn_mask=mask))
    for call in calls:
        sdpa_summaries.clear()
        want = call(m)
        assert sdpa_summaries == [None]
        sdpa_summaries.clear()
        np.testing.assert_array_equal(call(bm), want)
        assert len(sdpa_summaries) == 1 and sdpa_summaries[0] is bm.summary


@settings(max_examples=20, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    lq=st.integers(1, 130),
    lk=st.integers(2, 300),
    mask_shape=st.sampled_from(["rows x 1", "1 x 1", "heads x rows x 1", "1 x keys"]),
    score=st.sampled_from([None, "dot"]),
)
def test_block_mask_broadcast_along_an_axis(isa, seed, dtype, lq, lk, mask_shape, score):
    """A BlockMask whose mask broadcasts along the keys (a size-1 last axis) was summarised
    over its one column: the kernel must not read that summary as one of the call's lk
    keys (it would see key 0 alone). Such a mask, and one broadcast along the rows, give
    the reference's result and bit for bit the dense mask's call."""
    rng = np.random.default_rng(seed)
    h = 2
    shape = {
        "rows x 1": (lq, 1),
        "1 x 1": (1, 1),
        "heads x rows x 1": (h, lq, 1),
        "1 x keys": (1, lk),
    }[mask_shape]
    m = rng.random(shape) < 0.7
    bm = fastattn.block_mask(m)
    q, k, v = (rng.standard_normal((1, h, n, 16)).astype(dtype) for n in (lq, lk, lk))

    def call(mask, threads=None):
        if score is None:
            return fastattn.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, num_threads=threads
            )
        return fastattn.attention(q, k, v, attn_mask=mask, score=score, num_threads=threads)

    got = call(bm)
    scale = 1.0 if score == "dot" else None
    want = reference.scaled_dot_product_attention(
        q, k, v, attn_mask=np.asarray(m), scale=scale, return_lse=True
    )
    assert_close_attention(
        (got, None, None), unpack(want, True), q, k, v, attn_mask=np.asarray(m), scale=scale
    )
    for threads in (1, 2):
        np.testing.assert_array_equal(got, call(np.array(m), threads))

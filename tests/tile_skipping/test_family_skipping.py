"""The attention family's blocked kernels (additive attention; hardmax and top-k attention)
read the bool mask's summary too: rows narrowed to what the mask leaves visible, key blocks
no row sees skipped whole. Skipping changes no arithmetic on kept keys, so a sparse bool
mask gives the bits of the same mask written as a float mask of 0 / -inf (read in full),
for any thread count, on every ISA, and the reference's values."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close, assert_same_bits
from helpers.family_checks import (
    additive_score_error,
    compute_eps,
    finite_max,
    tolerances,
    unambiguous_rows,
)
from tile_skipping.test_tile_skipping import DTYPES, KINDS, composed, draw_mask

FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

SHAPES = st.tuples(
    st.integers(1, 2),  # batch
    st.integers(1, 2),  # heads
    st.integers(1, 150),  # Lq
    st.integers(1, 600),  # Lk
    st.sampled_from([3, 16]),  # E
)
COMPOSE = st.sampled_from(["none", "valid_lens", "causal", "window"])


def as_float_mask(mask, dtype):
    """The same mask as additive 0 / -inf, which no kernel summarises."""
    return np.where(mask, 0.0, -np.inf).astype(dtype)


@settings(max_examples=20, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(KINDS),
    shape=SHAPES,
    compose=COMPOSE,
)
def test_additive_sparse_masks(isa, seed, dtype, kind, shape, compose):
    rng = np.random.default_rng(seed)
    batch, h, lq, lk, e = shape
    q = rng.standard_normal((batch, h, lq, e)).astype(dtype)
    k = rng.standard_normal((batch, h, lk, e)).astype(dtype)
    v = rng.standard_normal((batch, h, lk, e)).astype(dtype)
    hidden = int(rng.integers(1, 12))
    w_q = (rng.standard_normal((e, hidden)) / np.sqrt(e)).astype(dtype)
    w_k = (rng.standard_normal((e, hidden)) / np.sqrt(e)).astype(dtype)
    w_v = rng.standard_normal(hidden).astype(dtype)
    mask = draw_mask(rng, kind, batch, h, lq, lk)
    kw = composed(rng, compose, batch, h, lq, lk)
    want, want_w = reference.additive_attention(
        q, k, v, w_q, w_k, w_v, attn_mask=mask, return_weights=True, **kw
    )
    out = np.full(want.shape, np.nan, dtype)  # poisoned: every element must be written
    got = fastattn.additive_attention(
        q, k, v, w_q, w_k, w_v, attn_mask=mask, return_weights=True, out=out, **kw
    )
    assert got[0] is out
    eps, f16 = compute_eps(q, k, v, w_q, w_k, w_v)
    out_tol, w_tol = tolerances(
        additive_score_error(q, k, w_q, w_k, w_v), lk, finite_max(v), eps, f16
    )
    assert_close("output", got[0], want, out_tol)
    assert_close("weights", got[1], want_w, w_tol)
    assert (got[1][np.broadcast_to(~mask, got[1].shape)] == 0).all()
    dense = fastattn.additive_attention(
        q, k, v, w_q, w_k, w_v, attn_mask=as_float_mask(mask, dtype), return_weights=True, **kw
    )
    assert_same_bits(got, dense)
    for threads in (1, 2):
        again = fastattn.additive_attention(
            q, k, v, w_q, w_k, w_v, attn_mask=mask, return_weights=True, num_threads=threads, **kw
        )
        assert_same_bits(again, got)


@settings(max_examples=20, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(KINDS),
    shape=SHAPES,
    compose=COMPOSE,
    top_k=st.sampled_from([1, 3]),
)
# A key block hidden from every row of a task while inside a row's window: its weights
# must stay 0 (they once kept the -inf a softmax's weights row holds there).
@example(
    seed=47968,
    dtype=np.float32,
    kind="per_head_tiles",
    shape=(1, 2, 145, 404, 3),
    compose="window",
    top_k=1,
)
def test_select_sparse_masks(isa, seed, dtype, kind, shape, compose, top_k):
    rng = np.random.default_rng(seed)
    batch, h, lq, lk, e = shape
    q = rng.standard_normal((batch, h, lq, e)).astype(dtype)
    k = rng.standard_normal((batch, h, lk, e)).astype(dtype)
    v = rng.standard_normal((batch, h, lk, e)).astype(dtype)
    mask = draw_mask(rng, kind, batch, h, lq, lk)
    kw = composed(rng, compose, batch, h, lq, lk)
    opts = {"normalize": "hardmax"} if top_k == 1 else {"normalize": "topk", "top_k": top_k}
    want, want_w = reference.attention(q, k, v, attn_mask=mask, return_weights=True, **opts, **kw)
    soft_w = reference.attention(q, k, v, attn_mask=mask, return_weights=True, **kw)[1]
    got = fastattn.attention(q, k, v, attn_mask=mask, return_weights=True, **opts, **kw)
    # Rows whose selection a rounding of the scores cannot flip.
    eps = float(np.finfo(dtype).eps)
    rows = unambiguous_rows(soft_w, top_k, 64 * eps * e * (1 + finite_max(q) * finite_max(k)))
    tol = 64 * eps * (1 + top_k) * finite_max(v)
    assert_close("output", got[0], want, tol, rows=rows)
    assert_close("weights", got[1], want_w, 64 * eps * top_k, rows=rows)
    assert (got[1][np.broadcast_to(~mask, got[1].shape)] == 0).all()
    dense = fastattn.attention(
        q, k, v, attn_mask=as_float_mask(mask, dtype), return_weights=True, **opts, **kw
    )
    assert_same_bits(got, dense)
    for threads in (1, 2):
        again = fastattn.attention(
            q, k, v, attn_mask=mask, return_weights=True, num_threads=threads, **opts, **kw
        )
        assert_same_bits(again, got)

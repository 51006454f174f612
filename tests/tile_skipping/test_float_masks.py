"""Float masks whose -inf entries hide keys, tiles and rows (docs/semantics.md#float-mask):
a -inf entry removes its key exactly as a False bool entry does, so the kernels skip tiles
that are -inf everywhere, a NaN or +inf score under -inf never reaches the output, and the
result is the reference's on every ISA, for any thread count, composed with valid_lens,
causal and window."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close_attention, unpack
from tile_skipping.test_tile_skipping import DTYPES, FIXTURE_OK, composed, tile_pattern


def float_mask(rng, kept, dtype):
    """-inf where ``kept`` is False, random finite values (some exactly 0) elsewhere."""
    values = np.where(rng.random(kept.shape) < 0.3, 0.0, rng.standard_normal(kept.shape))
    return np.where(kept, values, -np.inf).astype(dtype)


def kept_pattern(rng, kind, lq, lk):
    """Which entries a float mask keeps: whole 64x64 tiles (some with exactly one kept
    entry), tiles straddling the 64-key chunks, a band, or sparse single entries."""
    if kind == "tiles":
        return tile_pattern(rng, lq, lk, 64, 64, 0.25, 0.3)
    if kind == "small_tiles":
        tq, tk = (int(x) for x in rng.integers(1, 48, 2))
        return tile_pattern(rng, lq, lk, tq, tk, 0.3, 0.3)
    if kind == "band":
        i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
        return np.abs(i - j) <= int(rng.integers(0, 70))
    if kind == "scattered":
        return rng.random((lq, lk)) < 0.02
    raise AssertionError(kind)


@settings(max_examples=25, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(["tiles", "small_tiles", "band", "scattered"]),
    shape=st.tuples(
        st.integers(1, 2),  # batch
        st.sampled_from([1, 2]),  # query heads
        st.integers(1, 200),  # Lq
        st.integers(1, 700),  # Lk
        st.sampled_from([8, 40]),  # E
    ),
    compose=st.sampled_from(["none", "valid_lens", "causal", "window"]),
    poison=st.sampled_from([np.nan, np.inf, -np.inf]),
)
def test_sparse_float_masks_match_reference(isa, seed, dtype, kind, shape, compose, poison):
    """Random sparse float masks; keys and values under -inf hold NaN or inf in rows'
    hidden entries: removed, never read into the output."""
    rng = np.random.default_rng(seed)
    batch, hq, lq, lk, e = shape
    kept = kept_pattern(rng, kind, lq, lk)
    fmask = float_mask(rng, kept, dtype)
    q = rng.standard_normal((batch, hq, lq, e)).astype(dtype)
    k = rng.standard_normal((batch, hq, lk, e)).astype(dtype)
    v = rng.standard_normal((batch, hq, lk, e)).astype(dtype)
    # Keys no row keeps: poisoned key and value (their scores are never formed, so the
    # NaN/inf never meets the -inf; test_nonfinite_score_under_neginf_is_removed poisons
    # keys some rows keep).
    nobody = ~kept.any(axis=0)
    k[..., nobody, :] = poison
    v[..., nobody, :] = poison
    kw = composed(rng, compose, batch, hq, lq, lk)
    clean_k, clean_v = k.copy(), v.copy()
    clean_k[..., nobody, :] = 0
    clean_v[..., nobody, :] = 0
    want = unpack(
        reference.scaled_dot_product_attention(
            q, clean_k, clean_v, attn_mask=fmask, return_lse=True, return_weights=True, **kw
        ),
        True,
        True,
    )
    # The twin follows the same rule: the poisoned keys give it the clean result.
    twin = unpack(
        reference.scaled_dot_product_attention(
            q, k, v, attn_mask=fmask, return_lse=True, return_weights=True, **kw
        ),
        True,
        True,
    )
    # Both in float64; only the order of the P V sum differs (the twin's non-finite path).
    for a, b in zip(twin, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    out = np.full((batch, hq, lq, e), np.nan, dtype)  # poisoned: every element is written
    got = unpack(
        fastattn.scaled_dot_product_attention(
            q, k, v, attn_mask=fmask, return_lse=True, return_weights=True, out=out, **kw
        ),
        True,
        True,
    )
    assert got[0] is out
    assert np.isfinite(got[0]).all()
    assert_close_attention(got, want, q, clean_k, clean_v, attn_mask=fmask)
    again = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=fmask, num_threads=1, **kw)
    np.testing.assert_array_equal(again, got[0])


@settings(max_examples=15, suppress_health_check=FIXTURE_OK)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    poison=st.sampled_from([np.nan, np.inf]),
)
def test_nonfinite_score_under_neginf_is_removed(isa, seed, dtype, poison):
    """A key whose score is NaN or +inf (NaN/inf in its key row) is removed from the rows
    whose float mask is -inf there, exactly as a False bool entry removes it; the rows
    that keep it are NaN (a NaN/+inf score among the visible keys)."""
    rng = np.random.default_rng(seed)
    lq, lk = int(rng.integers(2, 150)), int(rng.integers(2, 300))
    q = rng.standard_normal((2, lq, 16)).astype(dtype)
    k = rng.standard_normal((2, lk, 16)).astype(dtype)
    v = rng.standard_normal((2, lk, 16)).astype(dtype)
    bad = int(rng.integers(lk))
    k[:, bad, int(rng.integers(16))] = poison
    kept = rng.random((lq, lk)) < 0.7
    hiders = rng.random(lq) < 0.5  # rows hiding the bad key (the others keep it)
    hiders[0], hiders[-1] = True, False
    kept[:, bad] = ~hiders
    fmask = np.where(kept, np.float32(0.0), -np.inf).astype(dtype)
    got = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=fmask)
    as_bool = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=kept)
    np.testing.assert_array_equal(got, as_bool)  # score + 0.0 is the score: same bits
    want = reference.scaled_dot_product_attention(q, k, v, attn_mask=fmask)
    np.testing.assert_array_equal(np.isnan(want), np.isnan(got))
    rows_keep = ~hiders
    assert np.isfinite(got[:, hiders]).all()
    clean = k.copy()
    clean[:, bad] = 0
    if poison != poison:  # NaN: every row keeping the bad key is NaN
        assert np.isnan(got[:, rows_keep]).any(axis=-1).all()
    want_clean = reference.scaled_dot_product_attention(q, clean, v, attn_mask=fmask)
    assert_close_attention(
        (got[:, hiders], None, None), (want_clean[:, hiders], None, None), q, clean, v
    )


def test_all_neginf_rows_and_tiles(isa):
    """Rows that keep nothing return 0 (lse -inf); a tile with exactly one finite entry
    attends that key alone."""
    rng = np.random.default_rng(3)
    lq, lk = 130, 260
    fmask = np.full((lq, lk), -np.inf, np.float32)
    fmask[70, 200] = 1.5  # one finite entry in its tile, row 70 sees key 200 alone
    fmask[:64, :64] = rng.standard_normal((64, 64))
    q, k, v = (rng.standard_normal((1, 2, n, 32)).astype(np.float32) for n in (lq, lk, lk))
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=fmask, return_lse=True)
    np.testing.assert_array_equal(out[..., 64:70, :], 0)
    np.testing.assert_array_equal(out[..., 71:, :], 0)
    np.testing.assert_array_equal(lse[..., 71:], -np.inf)
    np.testing.assert_array_equal(out[..., 70, :], v[..., 200, :])
    want = reference.scaled_dot_product_attention(q, k, v, attn_mask=fmask, return_lse=True)
    assert_close_attention((out, lse, None), (*want, None), q, k, v, attn_mask=fmask)

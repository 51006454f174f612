"""Numeric edges of issue #30: a softcap whose inverse overflows the compute dtype, and a
float64 mask holding finfo(float64).min on float32 inputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastattn
from fastattn import reference


@pytest.mark.parametrize(("dtype", "softcap"), [(np.float32, 1e-40), (np.float64, 5e-324)])
@pytest.mark.parametrize("lk", [7, 40])
def test_tiny_softcap_is_finite_and_matches_reference(isa, dtype, softcap, lk):
    """Before: softcap=1e-40 on float32 gave NaN (1 / softcap is inf in float32, and a
    score of 0, padding included, times inf is NaN); the float64 reference is finite."""
    rng = np.random.default_rng(lk)
    q = rng.standard_normal((2, 3, 5, 16)).astype(dtype)
    k, v = (rng.standard_normal((2, 3, lk, 16)).astype(dtype) for _ in range(2))
    q[0, 0, 0] = 0  # scores of exactly 0
    want = reference.scaled_dot_product_attention(
        *(a.astype(np.float64) for a in (q, k, v)), softcap=softcap
    )
    for num_threads in (1, 2):
        got = fastattn.scaled_dot_product_attention(
            q, k, v, softcap=softcap, num_threads=num_threads
        )
        assert np.isfinite(got).all()
        # Scores within the cap of 0: the weights are uniform to the dtype's rounding.
        np.testing.assert_allclose(got, want, rtol=0, atol=50 * np.finfo(dtype).eps)


def test_float64_mask_at_float64_min_on_float32_is_silent(isa):
    """Before: NumPy's 'overflow encountered in cast' RuntimeWarning leaked from narrowing
    the mask to float32 (finfo(float64).min becomes -inf there: the key stays hidden)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 6, 8), dtype=np.float32) for _ in range(3))
    mask = rng.standard_normal((6, 6))
    mask[:, ::2] = np.finfo(np.float64).min
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = reference.scaled_dot_product_attention(
        *(a.astype(np.float64) for a in (q, k, v)), attn_mask=mask
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

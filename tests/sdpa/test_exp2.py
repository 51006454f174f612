"""The softmax's polynomial exp2 (every ISA) against float64 np.exp2: a few ulp."""

from __future__ import annotations

import numpy as np
import pytest

from fastattn import _core


def ulp_error(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    exact = np.exp2(x.astype(np.float64))
    return np.abs(got.astype(np.float64) - exact) / np.spacing(exact.astype(got.dtype)).astype(
        np.float64
    )


@pytest.mark.parametrize("dtype, low", [(np.float32, -126.0), (np.float64, -1022.0)])
def test_exp2_within_a_few_ulp(isa, dtype, low):
    rng = np.random.default_rng(7)
    # The softmax calls exp2 on s - max <= 0; alpha, weights and merges likewise.
    x = np.concatenate(
        [
            rng.uniform(low, 0.0, 20000),
            rng.uniform(-1.0, 0.0, 20000),
            -rng.exponential(3.0, 20000),
            [0.0, -0.5, -1.0, low],
        ]
    ).astype(dtype)
    got = _core.exp2(x)
    assert got.dtype == dtype
    assert ulp_error(got, x).max() <= 3.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp2_special_values(isa, dtype):
    x = np.array([-np.inf, np.nan, -2000.0, -1e30, 0.0, 1.0, 10.0], dtype=dtype)
    got = _core.exp2(x)
    assert got[0] == 0.0 and got[2] == 0.0 and got[3] == 0.0
    assert np.isnan(got[1])
    np.testing.assert_allclose(got[4:], [1.0, 2.0, 1024.0], rtol=4 * np.finfo(dtype).eps)

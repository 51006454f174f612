"""The C API page's examples (docs/capi.md) run as written: the Cython one compiled and called
against the Python API, the Numba one executed (when Numba is installed; a plain install lacks
it)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fastattn

from helpers import REPO
from helpers.capi_build import build_cython_module

PAGE = (REPO / "docs" / "capi.md").read_text()


def _block(after: str, language: str) -> str:
    """The first fenced block in `language` after the text `after`."""
    start = PAGE.index(after)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(PAGE, start)
    return match.group(1)


def test_cython_example(tmp_path):
    pytest.importorskip("Cython")
    module = build_cython_module("readme_decode", _block("**Cython**", "cython"), tmp_path)
    rng = np.random.default_rng(0)
    batch, heads, dim, steps = 3, 2, 64, 10
    k_cache = rng.standard_normal((batch, heads, steps, dim), dtype=np.float32)
    v_cache = rng.standard_normal((batch, heads, steps, dim), dtype=np.float32)
    q = rng.standard_normal((batch, heads, 1, dim), dtype=np.float32)
    expected = q.copy()
    out = np.full_like(q, np.nan)
    module.decode(k_cache, v_cache, q, out, steps)
    for t in range(steps):
        expected = fastattn.scaled_dot_product_attention(
            expected, k_cache[:, :, : t + 1], v_cache[:, :, : t + 1], scale=0.125
        )
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(q, expected)


def test_numba_example():
    pytest.importorskip("numba")
    namespace: dict = {}
    exec(compile(_block("the C API's Numba example", "python"), "docs/capi.md", "exec"), namespace)
    q0 = np.random.default_rng(0).standard_normal((1, 1, 1, 64), dtype=np.float32)
    expected = q0
    for t in range(namespace["steps"]):
        expected = fastattn.scaled_dot_product_attention(
            expected,
            namespace["k_cache"][:, :, : t + 1],
            namespace["v_cache"][:, :, : t + 1],
            scale=0.125,
        )
    np.testing.assert_array_equal(namespace["out"], expected)

"""pytest-benchmark suite: what attention sinks and ALiBi cost (issue #14's target: at most
3 % over the same call without them). Each group is one shape; its rows are the plain call,
with ``sinks``, with ``alibi_slopes`` and with both, so the summary's same-run ratios are
the options' cost. Every row checks its answer against the float64 twin on the first
query head (the whole reference would dominate the run).

Run: python -m pytest bench/test_bench_sinks_alibi.py   (see docs/development.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import attention_flops  # bench/conftest.py

import fastattn
from fastattn import reference

# (batch, query heads, kv heads, Lq, Lk, E, causal)
SHAPES = {
    "sinks/alibi B1 H8 2048x2048 E64": (1, 8, 8, 2048, 2048, 64, False),
    "sinks/alibi B1 H8 2048x2048 E64 causal": (1, 8, 8, 2048, 2048, 64, True),
    "sinks/alibi B4 H12 512x512 E64": (4, 12, 12, 512, 512, 64, False),
    "sinks/alibi B1 H32/8 1x16384 E128 (GQA decode)": (1, 32, 8, 1, 16384, 128, False),
}
VARIANTS = ("plain", "sinks", "alibi", "sinks+alibi")


def _inputs(shape, dtype=np.float32, seed=0):
    b, hq, hkv, lq, lk, e, _ = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, lq, e)).astype(dtype)
    k = rng.standard_normal((b, hkv, lk, e)).astype(dtype)
    v = rng.standard_normal((b, hkv, lk, e)).astype(dtype)
    sinks = rng.standard_normal(hq).astype(dtype)
    slopes = (2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)).astype(dtype)  # ALiBi's geometric
    return q, k, v, sinks, slopes


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_sinks_alibi(record, benchmark, name, variant):
    shape = SHAPES[name]
    causal = shape[-1]
    benchmark.group = name
    q, k, v, sinks, slopes = _inputs(shape)
    kwargs = {
        "is_causal": causal,
        "causal_alignment": "bottom_right" if shape[3] == 1 else "top_left",
    }
    if "sinks" in variant:
        kwargs["sinks"] = sinks
    if "alibi" in variant:
        kwargs["alibi_slopes"] = slopes
    flops = attention_flops(q.shape, k.shape, v.shape, causal)
    out = record(variant, flops, fastattn.scaled_dot_product_attention, q, k, v, **kwargs)
    head = {n: a[:1] for n, a in (("sinks", sinks), ("alibi_slopes", slopes)) if n in kwargs}
    other = {n: a for n, a in kwargs.items() if n not in head}
    expected = reference.scaled_dot_product_attention(q[:, :1], k[:, :1], v[:, :1], **head, **other)
    np.testing.assert_allclose(out[:, :1], expected, rtol=0, atol=2e-4)

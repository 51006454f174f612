"""pytest-benchmark: the per-call cost of small SDPA calls (issue #21), fastattn vs the NumPy
formula and torch CPU SDPA (if installed): one decode step ``(1, 8, 1, 64)`` against a
cache of Lk keys, and a single ``(1, 1, 1, 64)`` head against 16 keys. At these sizes the
time is argument handling and thread start-up, not arithmetic.

Run: python -m pytest bench/test_bench_small_calls.py (see docs/development.md). Every
benchmark also checks its answer. torch runs in inference mode entered outside the timed call.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import attention_flops, numpy_sdpa  # bench/conftest.py

import fastattn

try:
    import torch
except ImportError:  # torch is optional: the groups then hold fastattn and numpy
    torch = None

# name -> (query shape, key/value shape)
SHAPES = {
    **{
        f"small call B1 H8 1x{lk} E64 (decode)": ((1, 8, 1, 64), (1, 8, lk, 64))
        for lk in (16, 128, 512, 2048)
    },
    "small call B1 H1 1x16 E64": ((1, 1, 1, 64), (1, 1, 16, 64)),
}


@pytest.mark.parametrize("impl", ["fastattn", "numpy", "torch"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_small_call(record, benchmark, name, impl):
    benchmark.group = name
    q_shape, kv_shape = SHAPES[name]
    rng = np.random.default_rng(0)
    q = rng.standard_normal(q_shape, dtype=np.float32)
    k, v = (rng.standard_normal(kv_shape, dtype=np.float32) for _ in range(2))
    flops = attention_flops(q.shape, k.shape, v.shape)
    if impl == "fastattn":
        out = record(impl, flops, fastattn.scaled_dot_product_attention, q, k, v)
    elif impl == "numpy":
        out = record(impl, flops, numpy_sdpa, q, k, v)
    else:
        if torch is None:
            pytest.skip("torch is not installed (pip install torch==2.13.0)")
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        with torch.inference_mode():
            out = record(
                impl, flops, torch.nn.functional.scaled_dot_product_attention, tq, tk, tv
            ).numpy()
    expected = fastattn.reference.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)

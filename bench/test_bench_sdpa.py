"""pytest-benchmark suite: fastattn vs the NumPy formula (and torch CPU SDPA, ONNX Runtime and
OpenVINO if installed).

Run: python -m pytest bench   (see docs/development.md). Every benchmark also checks its answer.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import attention_flops, engine_runner, numpy_sdpa  # bench/conftest.py

import fastattn
from fastattn.bench import numpy_merge_states

try:
    import torch
except ImportError:  # torch is optional: the groups then hold fastattn and numpy
    torch = None

# (batch, query heads, kv heads, Lq, Lk, E, causal): the shapes of the speed targets
SHAPES = {
    "B1 H8 2048x2048 E64": (1, 8, 8, 2048, 2048, 64, False),
    "B1 H8 2048x2048 E64 causal": (1, 8, 8, 2048, 2048, 64, True),
    "B4 H12 512x512 E64 (BERT-base)": (4, 12, 12, 512, 512, 64, False),
    "B4 H12 512x512 E64 (BERT-base) causal": (4, 12, 12, 512, 512, 64, True),
    "B1 H32/8 1024x1024 E128 (GQA prefill)": (1, 32, 8, 1024, 1024, 128, False),
    "B1 H32/8 1024x1024 E128 (GQA prefill) causal": (1, 32, 8, 1024, 1024, 128, True),
    "B32 H8 128x128 E64 (short seqs)": (32, 8, 8, 128, 128, 64, False),
    "B32 H8 128x128 E64 (short seqs) causal": (32, 8, 8, 128, 128, 64, True),
    "B1 H32/8 1x4096 E128 (GQA decode)": (1, 32, 8, 1, 4096, 128, False),
    "B1 H32/8 1x16384 E128 (GQA decode)": (1, 32, 8, 1, 16384, 128, False),
}
IMPLS = ["fastattn", "numpy", "torch", "ort", "openvino"]


def make_inputs(shape, dtype=np.float32, seed=0):
    b, hq, hkv, lq, lk, e, _ = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, lq, e), dtype=np.float64).astype(dtype)
    k = rng.standard_normal((b, hkv, lk, e), dtype=np.float64).astype(dtype)
    v = rng.standard_normal((b, hkv, lk, e), dtype=np.float64).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_sdpa(record, benchmark, name, impl):
    shape = SHAPES[name]
    causal = shape[-1]
    benchmark.group = name
    q, k, v = make_inputs(shape)
    flops = attention_flops(q.shape, k.shape, v.shape, causal)
    group = q.shape[1] // k.shape[1]
    if impl == "fastattn":
        out = record(impl, flops, fastattn.scaled_dot_product_attention, q, k, v, is_causal=causal)
    elif impl == "numpy":
        kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        out = record(impl, flops, numpy_sdpa, q, kk, vv, is_causal=causal)
    elif impl in ("ort", "openvino"):
        runner = engine_runner(impl, q, k, v, causal)  # built outside the timing
        benchmark.extra_info["op"] = runner.op
        out = runner.to_numpy(record(impl, flops, runner.call))
    else:
        if torch is None:
            pytest.skip("torch is not installed (pip install torch==2.13.0)")
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        kw = {"enable_gqa": True} if group > 1 else {}

        def run():
            with torch.no_grad():
                return torch.nn.functional.scaled_dot_product_attention(
                    tq, tk, tv, is_causal=causal, **kw
                )

        out = record(impl, flops, run).numpy()
    expected = fastattn.reference.scaled_dot_product_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("impl", ["fastattn", "numpy", "torch"])
def test_sdpa_float64(record, benchmark, impl):
    shape = (1, 8, 8, 2048, 2048, 64, False)
    benchmark.group = "B1 H8 2048x2048 E64 float64"
    q, k, v = make_inputs(shape, np.float64)
    flops = attention_flops(q.shape, k.shape, v.shape)
    if impl == "fastattn":
        out = record(impl, flops, fastattn.scaled_dot_product_attention, q, k, v)
    elif impl == "numpy":
        out = record(impl, flops, numpy_sdpa, q, k, v)
    else:
        if torch is None:
            pytest.skip("torch is not installed (pip install torch==2.13.0)")
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        out = record(
            impl, flops, lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
        ).numpy()
    np.testing.assert_allclose(out, numpy_sdpa(q, k, v), rtol=1e-9, atol=1e-11)


def test_matmul_rate(record, benchmark):
    """The machine's float32 matmul rate, the ceiling attention is measured against."""
    benchmark.group = "matmul float32"
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    b = rng.standard_normal((2048, 2048), dtype=np.float32)
    out = record("numpy", 2.0 * 2048**3, np.matmul, a, b)
    assert out.shape == (2048, 2048)


@pytest.mark.parametrize("impl", ["fastattn", "numpy"])
def test_merge_attention_states(record, benchmark, impl):
    """8 partial results of (B4, H32, Lq 512, Ev 128) float32: a memory-bound pass."""
    benchmark.group = "merge_attention_states 8 parts of 4x32x512x128"
    rng = np.random.default_rng(0)
    outputs = [rng.standard_normal((4, 32, 512, 128), dtype=np.float32) for _ in range(8)]
    lses = [rng.normal(0.0, 3.0, (4, 32, 512)).astype(np.float32) for _ in range(8)]
    flops = 2.0 * sum(o.size for o in outputs)  # one multiply-add per part entry
    fn = fastattn.merge_attention_states if impl == "fastattn" else numpy_merge_states
    out, lse = record(impl, flops, fn, outputs, lses)
    expected, expected_lse = fastattn.reference.merge_attention_states(outputs, lses)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)

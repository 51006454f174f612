"""pytest-benchmark: the attention family vs the NumPy formulas a user would write (float32).

Run: python -m pytest bench/test_bench_family.py --benchmark-columns=median,iqr,rounds
Each group is one shape and holds fastattn and the NumPy formula (in the same run); every
benchmark also checks its answer. "GFLOP/s" in the summary counts nominal operations (one
per elementwise step, tanh and exp included), so compare the "vs numpy" column.

Issue targets: masked_softmax >= 3x the NumPy formula at (64, 512, 512) float32;
additive_attention >= 20x the NumPy broadcast formula at B=2, Lq=256, Lk=512, D=64, H=128.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn

IMPLS = ["fastattn", "numpy"]


def numpy_softmax(x):
    """Softmax over the last axis as a NumPy user writes it."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def numpy_masked_softmax(x, valid_lens):
    """d2l's masked_softmax: entries past the valid length set to -1e6, then softmax."""
    keep = np.arange(x.shape[-1]) < valid_lens[:, None, None]
    return numpy_softmax(np.where(keep, x, np.float32(-1e6)))


def numpy_additive(q, k, v, w_q, w_k, w_v):
    """d2l's AdditiveAttention: the (B, Lq, Lk, H) broadcast, tanh, w_v, softmax, @ v."""
    features = np.tanh((q @ w_q)[:, :, None, :] + (k @ w_k)[:, None, :, :])
    return numpy_softmax(features @ w_v) @ v


def numpy_topk(q, k, v, top_k):
    """Top-k attention: scaled scores, the k largest per row by argpartition, softmax."""
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(1 / np.sqrt(q.shape[-1]))
    kth = -np.partition(-s, top_k - 1, axis=-1)[..., top_k - 1 : top_k]
    return numpy_softmax(np.where(s >= kth, s, -np.inf)) @ v


def numpy_gaussian(q, k, v, h):
    """Gaussian-score attention from the differences: (B, H, Lq, Lk, E) once."""
    d2 = ((q[..., :, None, :] - k[..., None, :, :]) ** 2).sum(-1)
    return numpy_softmax(-d2 / np.float32(2 * h * h)) @ v


def numpy_nadaraya_watson(xq, xk, y, h):
    """d2l's Nadaraya-Watson: softmax(-(x_q - x_k)^2 / (2 h^2)) @ y, scalar features."""
    d = xq[:, None] - xk[None, :]
    return numpy_softmax(-d * d / np.float32(2 * h * h)) @ y


@pytest.mark.parametrize("impl", IMPLS)
def test_masked_softmax(record, benchmark, impl):
    benchmark.group = "masked_softmax (64, 512, 512) float32"
    x = np.random.default_rng(0).standard_normal((64, 512, 512), dtype=np.float32)
    fn = fastattn.masked_softmax if impl == "fastattn" else numpy_softmax
    out = record(impl, 5.0 * x.size, fn, x)
    assert out.shape == x.shape and out.dtype == np.float32
    np.testing.assert_allclose(out[:4], fastattn.reference.masked_softmax(x[:4]), atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_masked_softmax_valid_lens(record, benchmark, impl):
    benchmark.group = "masked_softmax (64, 512, 512) float32 valid_lens"
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 512, 512), dtype=np.float32)
    vl = rng.integers(1, 513, size=64)
    if impl == "fastattn":
        out = record(impl, 5.0 * x.size, fastattn.masked_softmax, x, vl)
    else:
        out = record(impl, 5.0 * x.size, numpy_masked_softmax, x, vl)
    np.testing.assert_allclose(out[:4], fastattn.reference.masked_softmax(x[:4], vl[:4]), atol=1e-6)


def _additive_inputs(b=2, lq=256, lk=512, d=64, hidden=128):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((b, lq, d), dtype=np.float32)
    k = rng.standard_normal((b, lk, d), dtype=np.float32)
    v = rng.standard_normal((b, lk, d), dtype=np.float32)
    w_q = rng.standard_normal((d, hidden), dtype=np.float32) / np.float32(np.sqrt(d))
    w_k = rng.standard_normal((d, hidden), dtype=np.float32) / np.float32(np.sqrt(d))
    w_v = rng.standard_normal(hidden, dtype=np.float32)
    return q, k, v, w_q, w_k, w_v


@pytest.mark.parametrize("impl", IMPLS)
def test_additive(record, benchmark, impl):
    benchmark.group = "additive B2 Lq256 Lk512 D64 H128 float32"
    q, k, v, w_q, w_k, w_v = args = _additive_inputs()
    b, lq, lk, hidden, dv = q.shape[0], q.shape[1], k.shape[1], w_v.shape[0], v.shape[-1]
    flops = b * lq * lk * (3.0 * hidden + 2.0 * dv)  # add, tanh, multiply-add; P V
    fn = fastattn.additive_attention if impl == "fastattn" else numpy_additive
    out = record(impl, flops, fn, *args)
    expected = fastattn.reference.additive_attention(q[:, :16], k, v, w_q, w_k, w_v)
    np.testing.assert_allclose(out[:, :16], expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_topk(record, benchmark, impl):
    benchmark.group = "attention topk=8 B1 H8 1024x1024 E64 float32"
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 8, 1024, 64), dtype=np.float32) for _ in range(3))
    flops = 4.0 * 8 * 1024 * 1024 * 64
    if impl == "fastattn":
        out = record(impl, flops, fastattn.attention, q, k, v, normalize="topk", top_k=8)
    else:
        out = record(impl, flops, numpy_topk, q, k, v, 8)
    expected = fastattn.reference.attention(
        q[:, :1, :64], k[:, :1], v[:, :1], normalize="topk", top_k=8
    )
    np.testing.assert_allclose(out[:, :1, :64], expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_gaussian(record, benchmark, impl):
    benchmark.group = "attention gaussian B1 H4 512x512 E32 float32"
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 4, 512, 32), dtype=np.float32) for _ in range(3))
    flops = 4.0 * 4 * 512 * 512 * 32
    if impl == "fastattn":
        out = record(impl, flops, fastattn.attention, q, k, v, score="gaussian", bandwidth=4.0)
    else:
        out = record(impl, flops, numpy_gaussian, q, k, v, 4.0)
    expected = fastattn.reference.attention(
        q[:, :1], k[:, :1], v[:, :1], score="gaussian", bandwidth=4.0
    )
    np.testing.assert_allclose(out[:, :1], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_nadaraya_watson(record, benchmark, impl):
    benchmark.group = "nadaraya_watson gaussian 4096 queries x 4096 keys"
    rng = np.random.default_rng(5)
    xk = rng.uniform(0, 5, 4096).astype(np.float32)
    y = (np.sin(xk) + rng.normal(0, 0.1, 4096)).astype(np.float32)
    xq = np.linspace(0, 5, 4096, dtype=np.float32)
    flops = 6.0 * 4096 * 4096
    if impl == "fastattn":
        out = record(impl, flops, fastattn.nadaraya_watson, xq, xk, y, bandwidth=0.1)
    else:
        out = record(impl, flops, numpy_nadaraya_watson, xq, xk, y, 0.1)
    expected = fastattn.reference.nadaraya_watson(xq[:64], xk, y, bandwidth=0.1)
    np.testing.assert_allclose(out[:64], expected, rtol=0, atol=1e-5)

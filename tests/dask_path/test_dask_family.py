"""masked_softmax, attention, additive_attention and nadaraya_watson on Dask arrays:
lazy Dask arrays out, equal to the NumPy call on the computed inputs and to the float64
reference, for random chunkings (keys are one chunk for these functions; rows, batch and
heads are chunked as given, causal/window applied at each block's offset).

Tolerance: each block runs the same kernel on a slice of the rows over all the keys, so
only the kernels' row blocking can differ from the one-shot call: ``16 * eps``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from dask_path.test_dask_sdpa import _chunking

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

EPS = {np.float32: 2.0**-24, np.float64: 2.0**-53}
few = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _close(got, want, dtype, factor=16):
    tol = factor * EPS[np.dtype(dtype).type]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@few
@given(data=st.data())
def test_masked_softmax(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    shape = (
        data.draw(st.integers(1, 4)),
        data.draw(st.integers(1, 9)),
        data.draw(st.integers(1, 12)),
    )
    axis = data.draw(st.sampled_from([-1, 1]))
    x = rng.standard_normal(shape).astype(dtype)
    rows = tuple(n for i, n in enumerate(shape) if i != axis % 3)
    lens = rng.integers(0, shape[axis] + 1, rows[:1]) if data.draw(st.booleans()) else None
    mask = rng.random(shape[1:]) < 0.6 if data.draw(st.booleans()) else None
    chunks = tuple(_chunking(data.draw, n) for n in shape)
    dx = da.from_array(x, chunks=chunks)
    dlens = None if lens is None else da.from_array(lens, chunks=1)
    got = fastattn.masked_softmax(dx, dlens, mask=mask, axis=axis)
    assert isinstance(got, da.Array)
    want = fastattn.masked_softmax(x, lens, mask=mask, axis=axis)
    _close(got.compute(scheduler="threads"), want, dtype)
    ref = reference.masked_softmax(x.astype(np.float64), lens, mask=mask, axis=axis)
    np.testing.assert_allclose(got.compute(), ref, atol=1e-5 if dtype == np.float32 else 1e-12)


@few
@given(data=st.data())
def test_attention_and_additive(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    b, lq, lk, e = 2, data.draw(st.integers(1, 16)), data.draw(st.integers(1, 20)), 4
    q = rng.standard_normal((b, lq, e)).astype(dtype)
    k = rng.standard_normal((b, lk, e)).astype(dtype)
    v = rng.standard_normal((b, lk, 3)).astype(dtype)
    kw = {"is_causal": data.draw(st.booleans())}
    if data.draw(st.booleans()):
        kw["window"] = (2, data.draw(st.sampled_from([None, 1])))
    if data.draw(st.booleans()):
        kw["valid_lens"] = rng.integers(0, lk + 1, (b,))
    kind = data.draw(st.sampled_from([None, "bool", "float"]))
    if kind == "bool":
        kw["attn_mask"] = rng.random((lq, lk)) < 0.7
    elif kind == "float":
        kw["attn_mask"] = rng.standard_normal((lq, lk)).astype(dtype)
    dq = da.from_array(q, chunks=(1, _chunking(data.draw, lq), e))
    dk, dv = da.from_array(k, chunks=(1, 5, e)), da.from_array(v, chunks=(2, lk, 3))
    score = data.draw(st.sampled_from(["dot", "cosine", "scaled_dot"]))
    got, got_w = fastattn.attention(dq, dk, dv, score=score, return_weights=True, **kw)
    want, want_w = fastattn.attention(q, k, v, score=score, return_weights=True, **kw)
    _close(got.compute(), want, dtype)
    _close(got_w.compute(), want_w, dtype)
    ref = reference.attention(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), score=score, **kw
    )
    np.testing.assert_allclose(got.compute(), ref, atol=1e-4 if dtype == np.float32 else 1e-10)
    w = [rng.standard_normal(s).astype(dtype) for s in ((e, 6), (e, 6), (6,))]
    got = fastattn.additive_attention(dq, dk, dv, *w, **kw)
    want = fastattn.additive_attention(q, k, v, *w, **kw)
    _close(got.compute(scheduler="threads"), want, dtype)


def test_nadaraya_watson():
    rng = np.random.default_rng(2)
    xq, xk = rng.uniform(0, 5, 50), rng.uniform(0, 5, 80)
    y = np.sin(xk)
    got = fastattn.nadaraya_watson(
        da.from_array(xq, chunks=13),
        da.from_array(xk, chunks=30),
        da.from_array(y, chunks=80),
        kernel="epanechnikov",
        bandwidth="silverman",
    )
    want = fastattn.nadaraya_watson(xq, xk, y, kernel="epanechnikov", bandwidth="silverman")
    assert got.shape == want.shape
    _close(got.compute(), want, np.float64)
    xq2 = rng.standard_normal((3, 20, 2))
    xk2, y2 = rng.standard_normal((3, 30, 2)), rng.standard_normal((3, 30, 4))
    got = fastattn.nadaraya_watson(
        *(da.from_array(a, chunks=(1, 7, 2)) for a in (xq2, xk2)),
        da.from_array(y2, chunks=(2, 9, 4)),
        bandwidth=0.7,
    )
    want = fastattn.nadaraya_watson(xq2, xk2, y2, bandwidth=0.7)
    ref = reference.nadaraya_watson(xq2, xk2, y2, bandwidth=0.7)
    _close(got.compute(), want, np.float64)
    np.testing.assert_allclose(got.compute(), ref, atol=1e-10)


def test_mixed_kinds_are_type_errors():
    x = da.ones((2, 3, 4), chunks=2)
    with pytest.raises(TypeError, match="w_q must be a NumPy array"):
        fastattn.additive_attention(x, x, x, x[0, :, :2], np.ones((4, 2)), np.ones(2))
    with pytest.raises(TypeError, match="out= is not supported"):
        fastattn.masked_softmax(x, out=np.empty((2, 3, 4)))


@pytest.mark.parametrize("batched", [True, False])
def test_multihead_attention_forward(batched, client):
    """The layer's forward pass on Dask arrays (keys chunked, GQA, causal, valid_lens) on
    worker processes: the NumPy forward pass (projections row-block by row-block: BLAS may
    round a block differently, hence 64 eps of float32 on O(1) values)."""
    rng = np.random.default_rng(4)
    layer = fastattn.MultiHeadAttention(16, 4, num_kv_heads=2, seed=3)
    x = rng.standard_normal((3, 40, 16)).astype(np.float32)
    lens = np.array([40, 17, 3])
    if not batched:
        x, lens = x[0], None
    dx = da.from_array(x, chunks=(1, 15, 16) if batched else (15, 16))
    got = layer(dx, is_causal=True, valid_lens=lens)
    assert isinstance(got, da.Array)
    want = layer(x, is_causal=True, valid_lens=lens)
    got = client.compute(got).result()
    assert got.shape == want.shape and got.dtype == want.dtype
    _close(got, want, np.float32, factor=64)


def test_one_dispatch_point(monkeypatch):
    """_dispatch.backend: NumPy -> None, Dask -> "dask" (list arguments included), CuPy ->
    "cupy"; a CuPy array beside a Dask array is a TypeError from every public function."""
    import sys

    from fastattn import _dispatch

    from cuda_path.test_dispatch import FakeDeviceArray, _stub_cupy

    x = da.ones((2, 3, 4), chunks=2)
    assert _dispatch.backend(np.ones(3), None) is None
    assert _dispatch.backend(np.ones(3), [np.ones(3), x]) == "dask"
    monkeypatch.setitem(sys.modules, "cupy", _stub_cupy())
    gpu = FakeDeviceArray(np.ones((2, 3, 4)))
    assert _dispatch.backend(gpu, None) == "cupy"
    with pytest.raises(TypeError, match="a CuPy array was passed beside a Dask array"):
        fastattn.scaled_dot_product_attention(x, x, gpu)
    with pytest.raises(TypeError, match="a CuPy array was passed beside a Dask array"):
        fastattn.masked_softmax(x, mask=gpu)

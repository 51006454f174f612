"""int8 key/value (a quantised KV cache): fastattn.quantize_kv against its NumPy twin, and
scaled_dot_product_attention with key_scale/value_scale against the float64 reference on
the dequantised K/V, within float32 rounding, on every ISA; the errors; the layer's int8
cache."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn

from helpers.attention_checks import assert_close_attention, unpack
from helpers.lowp_checks import attention_calls, poisoned

sdpa = fastattn.scaled_dot_product_attention
fixture_ok = settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=60)
@given(
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    zero_rows=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_quantize_kv_matches_its_twin(shape, dtype, zero_rows, seed, data):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 1e3])).astype(dtype)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    if zero_rows and x.size:  # a vector of zeros: the first one along the other axes
        moved = np.moveaxis(x, axis, -1)
        moved[(0,) * (moved.ndim - 1)] = 0
    q, s = fastattn.quantize_kv(x, axis=axis)
    tq, ts = fastattn.reference.quantize_kv(x, axis=axis)
    assert q.dtype == np.int8 and s.dtype == np.float32
    assert q.shape == x.shape and s.shape == x.shape[: axis % x.ndim] + x.shape[axis % x.ndim + 1 :]
    np.testing.assert_array_equal(s, ts)
    # The division may round differently (float32 here, float64 in the twin) right at a
    # half-way point: one step at most.
    assert np.abs(q.astype(int) - tq.astype(int)).max(initial=0) <= 1
    assert np.abs(q.astype(int)).max(initial=0) <= 127
    # What q stands for is within half a step (plus that one-step slack) of x.
    back = q.astype(np.float64) * np.expand_dims(s, axis).astype(np.float64)
    step = np.expand_dims(s, axis).astype(np.float64)
    assert (np.abs(back - x.astype(np.float64)) <= 1.5 * step + 1e-30).all()
    assert (q[np.broadcast_to(step == 0, q.shape)] == 0).all()


def test_quantize_kv_rounds_half_to_even_and_refuses_bad_input():
    q, s = fastattn.quantize_kv(np.array([[127.0, 0.5, 1.5, 2.5, -0.5]]))
    assert s.tolist() == [1.0] and q.tolist() == [[127, 0, 2, 2, 0]]
    with pytest.raises(ValueError, match="finite"):
        fastattn.quantize_kv(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        fastattn.quantize_kv(np.ones((2, 3)), axis=2)
    with pytest.raises(TypeError, match="x must be a floating-point array"):
        fastattn.quantize_kv(np.ones(3, np.int32))


def _quantized(k, v):
    kq, ks = fastattn.quantize_kv(k.astype(np.float32))
    vq, vs = fastattn.quantize_kv(v.astype(np.float32))
    return kq, ks, vq, vs


@fixture_ok
@given(call=attention_calls(), qdtype=st.sampled_from([np.float32, np.float16]))
def test_int8_kv_matches_reference_on_dequantised(isa, call, qdtype):
    q, k, v, kwargs = call
    q = q.astype(qdtype)
    kq, ks, vq, vs = _quantized(k, v)
    scales = {"key_scale": ks, "value_scale": vs}
    out = poisoned(
        np.broadcast_shapes(q.shape[:-3], k.shape[:-3]) + q.shape[-3:-1] + v.shape[-1:], qdtype
    )
    got = sdpa(q, kq, vq, **kwargs, **scales, out=out, return_lse=True, return_weights=True)
    assert got[0] is out
    expected = fastattn.reference.scaled_dot_product_attention(
        q, kq, vq, **kwargs, **scales, return_lse=True, return_weights=True
    )
    # The tolerance of a float32 computation (plus a float16 result's own rounding when
    # the query is float16) on the dequantised K/V.
    kd = (kq * ks[..., None]).astype(qdtype)
    vd = (vq * vs[..., None]).astype(qdtype)
    tol_kwargs = {n: kwargs[n] for n in ("attn_mask", "softcap") if n in kwargs}
    assert_close_attention(
        unpack(got, True, True), unpack(expected, True, True), q, kd, vd, **tol_kwargs
    )
    # The plain call (no extras) gives the same output.
    np.testing.assert_array_equal(sdpa(q, kq, vq, **kwargs, **scales), got[0])


def test_int8_kv_errors():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    kq, ks, vq, vs = _quantized(k, k)
    with pytest.raises(TypeError, match="key is int8: key_scale .* is required"):
        sdpa(q, kq, vq, value_scale=vs)
    with pytest.raises(TypeError, match="value is int8: value_scale .* is required"):
        sdpa(q, kq, vq, key_scale=ks)
    with pytest.raises(ValueError, match=r"key_scale must have shape \(1, 2, 5\)"):
        sdpa(q, kq, vq, key_scale=ks[..., :4], value_scale=vs)
    with pytest.raises(TypeError, match="key_scale is only for an int8 key"):
        sdpa(q, k, k, key_scale=ks)
    with pytest.raises(TypeError, match="key and value must both be int8"):
        sdpa(q, kq, k, key_scale=ks)
    with pytest.raises(TypeError, match="query must be float16, bfloat16 or float32"):
        sdpa(q.astype(np.float64), kq, vq, key_scale=ks, value_scale=vs)
    with pytest.raises(TypeError, match="key_scale must be a floating-point array"):
        sdpa(q, kq, vq, key_scale=ks.astype(np.int32), value_scale=vs)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layer_int8_cache(dtype):
    """The int8 cache holds quantize_kv of what the float cache holds, and decoding from it
    stays within the quantisation's error of decoding from the float cache."""
    mha = fastattn.MultiHeadAttention(32, 4, num_kv_heads=2, seed=3, dtype=dtype)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 9, 32)).astype(dtype)
    exact, quant = mha.new_kv_cache(2, 16), mha.new_kv_cache(2, 16, dtype="int8")
    assert quant.quantized and quant.key.dtype == np.int8 and "int8" in repr(quant)
    outs = {}
    for cache in (exact, quant):
        steps = [mha(x[:, :5], kv_cache=cache, is_causal=True)]
        steps += [mha(x[:, i : i + 1], kv_cache=cache) for i in range(5, 9)]
        outs[id(cache)] = np.concatenate(steps, axis=1)
    assert len(quant) == 9 and quant.key_scale.shape == (2, 2, 9)
    for mine, scale, ref in (
        (quant.key, quant.key_scale, exact.key),
        (quant.value, quant.value_scale, exact.value),
    ):
        rq, rs = fastattn.quantize_kv(ref)
        np.testing.assert_array_equal(mine, rq)
        np.testing.assert_array_equal(scale, rs)
    a, b = (outs[id(c)].astype(np.float64) for c in (exact, quant))
    assert np.abs(a - b).max() <= 0.05 * np.abs(a).max()
    with pytest.raises(TypeError, match="dtype must be None"):
        mha.new_kv_cache(1, 4, dtype="int4")
    with pytest.raises(ValueError, match="float64"):
        fastattn.MultiHeadAttention(8, 2, dtype=np.float64).new_kv_cache(1, 4, dtype="int8")


def test_int8_kv_on_cupy_arrays_is_not_implemented(monkeypatch):
    from cuda_path.test_dispatch import FakeDeviceArray, _stub_cupy

    monkeypatch.setitem(sys.modules, "cupy", _stub_cupy())
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 3, 8)).astype(np.float32)
    kq, ks, vq, vs = _quantized(*(rng.standard_normal((2, 5, 8)) for _ in range(2)))
    args = [FakeDeviceArray(a) for a in (q, kq, vq)]
    with pytest.raises(NotImplementedError, match="int8 key/value"):
        sdpa(*args, key_scale=FakeDeviceArray(ks), value_scale=FakeDeviceArray(vs))

"""float16 and bfloat16 in masked_softmax and the family kernels (additive_attention,
nadaraya_watson, attention's hardmax/top-k): the arrays are read as they are and widened
inside the kernel (float32 compute), the result rounded to the input dtype as it is written
(round to nearest even). The arithmetic is the float32 kernel's on the widened values, so the
result must be bit-identical to the float32 call on the same values, rounded -- on every ISA,
for any layout, thread count and out= -- and no float32 copy of the inputs is made."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn

from helpers.attention_checks import assert_same_bits
from helpers.lowp_checks import (
    BF16_DOT_ISAS,
    assert_peak_below_f32_query,
    lowp_dtype,
    peak_traced_bytes,
    poisoned,
)

pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(1, 300)),
    axis=st.sampled_from([-1, 1]),
    masks=st.sampled_from(["none", "valid_lens", "mask", "both"]),
    layout=st.sampled_from(["contiguous", "strided", "out"]),
    scale=st.sampled_from([1.0, 30.0]),
)
def test_widened_in_kernel_equals_float32_call_rounded(
    isa, name, seed, shape, axis, masks, layout, scale
):
    rng = np.random.default_rng(seed)
    dtype = lowp_dtype(name)
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    if layout == "strided":  # every other element along the last axis
        x = np.repeat(x, 2, axis=-1)[..., ::2]
    rows = tuple(np.delete(np.array(shape), axis))
    kw = {}
    if masks in ("valid_lens", "both"):
        kw["valid_lens"] = rng.integers(0, shape[axis] + 1, rows)
    if masks in ("mask", "both"):
        kw["mask"] = rng.random(shape) < 0.7
    want = fastattn.masked_softmax(x.astype(np.float32), axis=axis, **kw).astype(dtype)
    if layout == "out":
        out = poisoned(shape, dtype)
        got = fastattn.masked_softmax(x, axis=axis, out=out, **kw)
        assert got is out
    else:
        got = fastattn.masked_softmax(x, axis=axis, **kw)
    assert got.dtype == dtype
    assert_same_bits(got, want)
    for threads in (1, 3):
        assert_same_bits(fastattn.masked_softmax(x, axis=axis, num_threads=threads, **kw), want)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_no_float32_copy(name):
    """Peak traced memory (NumPy's allocations) stays below one float32 copy of x: the
    kernel reads the 16-bit array itself and writes the 16-bit result."""
    dtype = lowp_dtype(name)
    x = np.random.default_rng(2).standard_normal((64, 8, 1024)).astype(dtype)
    lens = np.random.default_rng(3).integers(0, 1025, (64, 8))
    fastattn.masked_softmax(x)  # warm up (thread pool, first-call allocations)
    for call in (lambda: fastattn.masked_softmax(x), lambda: fastattn.masked_softmax(x, lens)):
        peak = peak_traced_bytes(call)
        assert peak < x.size * 4, peak


# ---------------------------------------------------------------------------------------
# additive_attention, nadaraya_watson and attention's hardmax/top-k: q/k/v read as stored
# and widened in the kernel (float32 compute), the output rounded as it is written. Same
# arithmetic as the float32 call on the same values, so bit-identical to it, rounded.


def _check_all(call, want, dtype, out_shape, weights_dtype):
    """call(**extra) on every thread count and with a poisoned out=, against want
    (output, weights or None) from the float32 call."""
    want_out, want_w = want
    want_out = want_out.astype(dtype)
    for threads in (1, 3):
        got = call(num_threads=threads)
        got_out, got_w = got if isinstance(got, tuple) else (got, None)
        assert got_out.dtype == dtype
        assert_same_bits(got_out, want_out)
        if want_w is not None:
            assert_same_bits(got_w, want_w.astype(weights_dtype))
    out = poisoned(out_shape, dtype)
    got = call(out=out)
    got_out = got[0] if isinstance(got, tuple) else got
    assert got_out is out
    assert_same_bits(out, want_out)


def _weights_dtype(dtype):
    return np.dtype(np.float32) if dtype != np.float16 else dtype


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    batch=st.sampled_from([(), (2,)]),
    heads=st.sampled_from([(1, 1), (2, 1), (2, 2)]),
    lq=st.integers(1, 20),
    lk=st.integers(1, 70),
    dims=st.tuples(
        st.sampled_from([1, 3, 8]), st.sampled_from([2, 5]), st.sampled_from([1, 7, 20])
    ),
    hidden=st.sampled_from([1, 4, 9]),
    masks=st.sampled_from(["none", "valid_lens", "bool", "float", "causal"]),
    normalize=st.sampled_from(["softmax", "hardmax", "topk"]),
    weights=st.booleans(),
    scale=st.sampled_from([1.0, 30.0]),
)
def test_additive_widened_equals_float32_call_rounded(
    isa, name, seed, batch, heads, lq, lk, dims, hidden, masks, normalize, weights, scale
):
    rng = np.random.default_rng(seed)
    dtype = lowp_dtype(name)
    hq, hkv = heads
    dq, dk, dv = dims
    q = (rng.standard_normal(batch + (hq, lq, dq)) * scale).astype(dtype)
    k = rng.standard_normal(batch + (hkv, lk, dk)).astype(dtype)
    v = rng.standard_normal(batch + (hkv, lk, dv)).astype(dtype)
    w_q, w_k = (rng.standard_normal((d, hidden)).astype(dtype) for d in (dq, dk))
    w_v = rng.standard_normal(hidden).astype(dtype)
    kw = {}
    if masks == "valid_lens":
        kw["valid_lens"] = rng.integers(0, lk + 1, batch + (hq,))
    elif masks == "bool":
        kw["attn_mask"] = rng.random((lq, lk)) < 0.7
    elif masks == "float":
        kw["attn_mask"] = rng.standard_normal((hq, 1, lk)).astype(dtype)
    elif masks == "causal":
        kw["is_causal"] = True
    if weights:
        kw["return_weights"] = True
    ws = (w_q, w_k, w_v)

    def call(arrays, weights_in, kw, **extra):
        if normalize == "softmax":
            return fastattn.additive_attention(*arrays, *weights_in, **kw, **extra)
        top = {"top_k": 3} if normalize == "topk" else {}
        return fastattn.attention(
            *arrays,
            score="additive",
            normalize=normalize,
            w_q=weights_in[0],
            w_k=weights_in[1],
            w_v=weights_in[2],
            **top,
            **kw,
            **extra,
        )

    f32 = [a.astype(np.float32) for a in (q, k, v)]
    wf32 = [w.astype(np.float32) for w in ws]
    kw32 = dict(kw)
    if masks == "float":  # the float32 call gets the same mask values
        kw32["attn_mask"] = kw["attn_mask"].astype(np.float32)
    want = call(f32, wf32, kw32)
    want = want if isinstance(want, tuple) else (want, None)
    _check_all(
        lambda **extra: call((q, k, v), ws, kw, **extra),
        want,
        dtype,
        batch + (hq, lq, dv),
        _weights_dtype(dtype),
    )
    if normalize == "softmax" and masks == "none":  # and near the float64 twin
        ref = fastattn.reference.additive_attention(*[a.astype(np.float64) for a in (q, k, v, *ws)])
        got = call((q, k, v), ws, kw)
        got = got[0] if isinstance(got, tuple) else got
        eps = np.finfo(np.float16).eps if name == "float16" else 2.0**-7
        scale_v = np.abs(v.astype(np.float64)).max()
        np.testing.assert_allclose(got.astype(np.float64), ref, atol=4 * eps * scale_v, rtol=0)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_additive_no_float32_copy(name):
    dtype = lowp_dtype(name)
    rng = np.random.default_rng(4)
    q = rng.standard_normal((8, 4, 2048, 32)).astype(dtype)
    k = rng.standard_normal((8, 4, 64, 32)).astype(dtype)
    v = rng.standard_normal((8, 4, 64, 32)).astype(dtype)
    ws = [rng.standard_normal(s).astype(dtype) for s in ((32, 8), (32, 8), (8,))]
    assert_peak_below_f32_query(lambda: fastattn.additive_attention(q, k, v, *ws), q)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    batch=st.sampled_from([(), (3,)]),
    lq=st.integers(1, 20),
    lk=st.integers(2, 150),  # silverman needs two keys
    dx=st.sampled_from([1, 2, 5]),
    dy=st.sampled_from([1, 3, 20]),
    kernel=st.sampled_from(["gaussian", "boxcar", "triangular", "epanechnikov"]),
    bandwidth=st.sampled_from([0.5, 2.0, "silverman"]),
    weights=st.booleans(),
)
def test_nadaraya_watson_widened_equals_float32_call_rounded(
    isa, name, seed, batch, lq, lk, dx, dy, kernel, bandwidth, weights
):
    rng = np.random.default_rng(seed)
    dtype = lowp_dtype(name)
    xq = rng.standard_normal(batch + (lq, dx)).astype(dtype)
    xk = rng.standard_normal(batch + (lk, dx)).astype(dtype)
    y = rng.standard_normal(batch + (lk, dy)).astype(dtype)
    kw = {"kernel": kernel, "bandwidth": bandwidth, "return_weights": weights}
    want = fastattn.nadaraya_watson(*(a.astype(np.float32) for a in (xq, xk, y)), **kw)
    want = want if isinstance(want, tuple) else (want, None)
    _check_all(
        lambda **extra: fastattn.nadaraya_watson(xq, xk, y, **kw, **extra),
        want,
        dtype,
        batch + (lq, dy),
        _weights_dtype(dtype),
    )
    if kernel == "gaussian":  # and near the float64 twin
        ref = fastattn.reference.nadaraya_watson(
            *(a.astype(np.float64) for a in (xq, xk, y)), kernel=kernel, bandwidth=bandwidth
        )
        got = fastattn.nadaraya_watson(xq, xk, y, kernel=kernel, bandwidth=bandwidth)
        eps = np.finfo(np.float16).eps if name == "float16" else 2.0**-7
        scale_y = np.abs(y.astype(np.float64)).max()
        np.testing.assert_allclose(got.astype(np.float64), ref, atol=4 * eps * scale_y, rtol=0)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_nadaraya_watson_no_float32_copy(name):
    dtype = lowp_dtype(name)
    rng = np.random.default_rng(5)
    xq = rng.standard_normal((64, 4096, 16)).astype(dtype)
    xk = rng.standard_normal((64, 64, 16)).astype(dtype)
    y = rng.standard_normal((64, 64, 16)).astype(dtype)
    assert_peak_below_f32_query(lambda: fastattn.nadaraya_watson(xq, xk, y), xq)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    batch=st.sampled_from([(), (2,)]),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    lq=st.integers(1, 20),
    lk=st.integers(1, 300),
    dims=st.tuples(st.sampled_from([1, 8, 33]), st.sampled_from([1, 7, 40])),
    score=st.sampled_from(["dot", "scaled_dot"]),
    normalize=st.sampled_from(["hardmax", "topk"]),
    top_k=st.sampled_from([1, 4, 50]),
    masks=st.sampled_from(["none", "valid_lens", "bool", "float", "causal", "window"]),
    weights=st.booleans(),
)
def test_select_widened_equals_float32_call_rounded(
    isa, name, seed, batch, heads, lq, lk, dims, score, normalize, top_k, masks, weights
):
    rng = np.random.default_rng(seed)
    dtype = lowp_dtype(name)
    hq, hkv = heads
    e, ev = dims
    q = rng.standard_normal(batch + (hq, lq, e)).astype(dtype)
    k = rng.standard_normal(batch + (hkv, lk, e)).astype(dtype)
    v = rng.standard_normal(batch + (hkv, lk, ev)).astype(dtype)
    kw = {"score": score, "normalize": normalize, "return_weights": weights}
    if normalize == "topk":
        kw["top_k"] = top_k
    kw32 = dict(kw)
    if masks == "valid_lens":
        kw["valid_lens"] = kw32["valid_lens"] = rng.integers(0, lk + 1, batch + (hq,))
    elif masks == "bool":
        kw["attn_mask"] = kw32["attn_mask"] = rng.random((lq, lk)) < 0.7
    elif masks == "float":
        kw["attn_mask"] = rng.standard_normal((hq, 1, lk)).astype(dtype)
        kw32["attn_mask"] = kw["attn_mask"].astype(np.float32)
    elif masks == "causal":
        kw["is_causal"] = kw32["is_causal"] = True
    elif masks == "window":
        kw["window"] = kw32["window"] = (3, 0)
    if normalize == "topk" and top_k >= lk and name == "bfloat16" and isa in BF16_DOT_ISAS:
        # Top-k keeping every key is the softmax, and on avx512bf16 (neon_bf16) a bfloat16 softmax
        # is the dot-product SDPA kernel (P rounded to bfloat16: test_family_softmax_lowp.py), not
        # the float32 arithmetic: held to the softmax call's bits instead.
        soft = {opt: value for opt, value in kw.items() if opt != "top_k"}
        want = fastattn.attention(q, k, v, **{**soft, "normalize": "softmax"})
    else:
        want = fastattn.attention(*(a.astype(np.float32) for a in (q, k, v)), **kw32)
    want = want if isinstance(want, tuple) else (want, None)
    _check_all(
        lambda **extra: fastattn.attention(q, k, v, **kw, **extra),
        want,
        dtype,
        batch + (hq, lq, ev),
        _weights_dtype(dtype),
    )
    # And the float64 twin's choice of keys (hardmax: the output is a stored value row
    # of a best key; the kernel's float32 score ties are the twin's up to rounding).
    if normalize == "hardmax" and masks == "none" and score == "dot" and e == 1:
        ref = fastattn.reference.attention(
            *(a.astype(np.float64) for a in (q, k, v)), score="dot", normalize="hardmax"
        )
        got = fastattn.attention(q, k, v, score="dot", normalize="hardmax")
        np.testing.assert_array_equal(got.astype(np.float64), ref)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("normalize", ["hardmax", "topk"])
def test_select_no_float32_copy(name, normalize):
    dtype = lowp_dtype(name)
    rng = np.random.default_rng(6)
    q = rng.standard_normal((8, 4, 2048, 64)).astype(dtype)
    k = rng.standard_normal((8, 4, 128, 64)).astype(dtype)
    v = rng.standard_normal((8, 4, 128, 64)).astype(dtype)
    top = {"top_k": 4} if normalize == "topk" else {}
    assert_peak_below_f32_query(lambda: fastattn.attention(q, k, v, normalize=normalize, **top), q)

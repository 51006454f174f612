"""attention(score="dot"/"scaled_dot"/"gaussian") on float16/bfloat16 read as stored, on
every ISA the machine has (the ``isa`` fixture):

* dot/scaled_dot with the softmax is scaled_dot_product_attention on the same arrays, bit
  for bit (float16: the float32 arithmetic, so also the float32 call rounded; bfloat16: the
  SDPA bfloat16 rule, vdpbf16ps on avx512bf16, BFDOT on neon_bf16);
* gaussian reads float16 (and bfloat16 under hardmax/top-k) as stored, widened exactly: the
  float32 call rounded; a bfloat16 gaussian softmax keeps its float32 copy, with the same
  result;
* no float32 copy of the query is made where the arrays are read as stored.
(docs/semantics.md#attention-on-16-bit-arrays)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn

from helpers.attention_checks import assert_same_bits
from helpers.lowp_checks import (
    assert_peak_below_f32_query,
    lowp_dtype,
    poisoned,
)

pytest.importorskip("ml_dtypes")


@st.composite
def calls(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    batch = draw(st.sampled_from([(), (2,)]))
    hq, hkv = draw(st.sampled_from([(1, 1), (2, 1), (4, 2)]))
    lq = draw(st.sampled_from([1, 3, 20, 70]))
    lk = draw(st.integers(1, 400))
    e, ev = draw(st.sampled_from([1, 8, 33, 64])), draw(st.sampled_from([1, 7, 40]))
    q = rng.standard_normal(batch + (hq, lq, e))
    k = rng.standard_normal(batch + (hkv, lk, e))
    v = rng.standard_normal(batch + (hkv, lk, ev))
    kw = {}
    masks = draw(st.sampled_from(["none", "valid_lens", "bool", "float", "causal", "window"]))
    if masks == "valid_lens":
        kw["valid_lens"] = rng.integers(0, lk + 1, batch + (hq,))
    elif masks == "bool":
        kw["attn_mask"] = rng.random((lq, lk)) < 0.7
    elif masks == "float":
        kw["attn_mask"] = rng.standard_normal((hq, 1, lk)).astype(np.float32)
    elif masks == "causal":
        kw["is_causal"] = True
        kw["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    elif masks == "window":
        kw["window"] = (draw(st.integers(0, 30)), draw(st.sampled_from([None, 0, 5])))
    return q, k, v, kw, draw(st.booleans())


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=calls(), score=st.sampled_from(["dot", "scaled_dot"]), sinks=st.booleans())
def test_dot_softmax_is_sdpa_on_the_stored_arrays(isa, name, call, score, sinks):
    q, k, v, kw, weights = call
    dt = lowp_dtype(name)
    q, k, v = (a.astype(dt) for a in (q, k, v))
    if sinks:
        kw["sinks"] = np.linspace(-1, 1, q.shape[-3]).astype(np.float32)
    scale = 1.0 if score == "dot" else None
    out = poisoned(q.shape[:-1] + v.shape[-1:], dt)
    got = fastattn.attention(q, k, v, score=score, return_weights=weights, out=out, **kw)
    assert (got[0] if weights else got) is out
    want = fastattn.scaled_dot_product_attention(q, k, v, scale=scale, return_weights=weights, **kw)
    assert_same_bits(got, want)
    if name == "float16":  # the float32 arithmetic: the float32 call, rounded
        wide = fastattn.attention(
            *(a.astype(np.float32) for a in (q, k, v)), score=score, return_weights=weights, **kw
        )
        wide = wide if weights else (wide,)
        assert_same_bits(got, tuple(a.astype(np.float16) for a in wide))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=calls(), normalize=st.sampled_from(["softmax", "hardmax", "topk"]))
def test_gaussian_is_the_float32_call_rounded(isa, name, call, normalize):
    q, k, v, kw, weights = call
    dt = lowp_dtype(name)
    q, k, v = (a.astype(dt) for a in (q, k, v))
    q[..., :1, :1] = np.inf  # an infinitely far query row (and key row): zeroed operands
    k[..., :1, :1] = np.inf
    kw = dict(kw, score="gaussian", bandwidth=1.5, normalize=normalize, return_weights=weights)
    if normalize == "topk":
        kw["top_k"] = 3
    got = fastattn.attention(q, k, v, **kw)
    want = fastattn.attention(*(a.astype(np.float32) for a in (q, k, v)), **kw)
    want = want if weights else (want,)
    w_dt = np.float32 if name == "bfloat16" else np.float16
    rounded = (want[0].astype(dt),) + tuple(a.astype(w_dt) for a in want[1:])
    assert_same_bits(got, rounded)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("score", ["dot", "scaled_dot"])
def test_dot_softmax_no_float32_copy(name, score):
    dt = lowp_dtype(name)
    rng = np.random.default_rng(41)
    q, k, v = (rng.standard_normal((4, 4, 1024, 64)).astype(dt) for _ in range(3))
    assert_peak_below_f32_query(lambda: fastattn.attention(q, k, v, score=score, is_causal=True), q)


@pytest.mark.parametrize(
    "name, normalize", [("float16", "softmax"), ("float16", "hardmax"), ("bfloat16", "topk")]
)
def test_gaussian_no_float32_copy(name, normalize):
    """The query and values are read as stored; the per-key bias (from float64 norms of the
    keys, a transient of the key's size) is the only other array."""
    dt = lowp_dtype(name)
    rng = np.random.default_rng(42)
    q = rng.standard_normal((8, 4, 2048, 64)).astype(dt)
    k, v = (rng.standard_normal((8, 4, 128, 64)).astype(dt) for _ in range(2))
    top = {"top_k": 4} if normalize == "topk" else {}
    assert_peak_below_f32_query(
        lambda: fastattn.attention(q, k, v, score="gaussian", normalize=normalize, **top), q
    )

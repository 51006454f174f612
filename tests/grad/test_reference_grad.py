"""The float64 twins of the attention backwards against central finite differences of
their forwards (fastattn.reference), for every option the forward has.

The check is directional: for a random direction d of an input x, the twin's
<grad_x, d> must equal (L(x + h d) - L(x - h d)) / 2h, L = sum(grad_out * forward(x)).
Central differences have error O(h^2 |L'''|) + O(eps |L| / h): with h = 1e-5 and inputs
of order 1 that is ~1e-10 + ~1e-11, so 1e-7 of the scale of the terms is a tight bound
that still any wrong term (a missing softcap factor, a sink or group not summed) fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastattn import reference

H = 1e-5
RTOL = 1e-7


def _directional_check(loss, grads, inputs, rng):
    """For each (name, array) of ``inputs``, <grad, d> vs the central difference of
    ``loss`` (a function of the dict of inputs) along a random direction d."""
    for (name, x), g in zip(inputs.items(), grads):
        assert g.shape == x.shape, name
        assert g.dtype == x.dtype, name
        d = rng.standard_normal(x.shape)
        plus = dict(inputs, **{name: x + H * d})
        minus = dict(inputs, **{name: x - H * d})
        fd = (loss(plus) - loss(minus)) / (2 * H)
        analytic = float(np.sum(g * d))
        scale = float(np.sum(np.abs(g * d))) + 1e-3
        assert abs(fd - analytic) <= RTOL * scale + 1e-9, (name, fd, analytic)


@st.composite
def sdpa_cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    hkv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2]))
    lq, lk = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    e, ev = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    batch_q = draw(st.sampled_from([(), (2,), (1,)]))
    batch_kv = draw(st.sampled_from([(), (2,), (1,)]))
    mask_kind = draw(st.sampled_from([None, "bool", "float", "float_bcast"]))
    return {
        "seed": seed,
        "shapes": (batch_q, batch_kv, hkv * group, hkv, lq, lk, e, ev),
        "mask": mask_kind,
        "valid_lens": draw(st.booleans()),
        "causal": draw(st.booleans()),
        "alignment": draw(st.sampled_from(["top_left", "bottom_right"])),
        "window": draw(st.sampled_from([None, (1, None), (None, 0), (2, 1)])),
        "scale": draw(st.sampled_from([None, 0.7])),
        "softcap": draw(st.sampled_from([None, 1.5])),
        "sinks": draw(st.sampled_from([None, "head", "full"])),
        "alibi": draw(st.booleans()),
    }


def _build(case):
    rng = np.random.default_rng(case["seed"])
    batch_q, batch_kv, hq, hkv, lq, lk, e, ev = case["shapes"]
    q = rng.standard_normal(batch_q + (hq, lq, e))
    k = rng.standard_normal(batch_kv + (hkv, lk, e))
    v = rng.standard_normal(batch_kv + (hkv, lk, ev))
    batch = np.broadcast_shapes(batch_q, batch_kv)
    rows = batch + (hq, lq)
    kw = {
        "is_causal": case["causal"],
        "causal_alignment": case["alignment"],
        "window": case["window"],
        "scale": case["scale"],
        "softcap": case["softcap"],
    }
    if case["mask"] == "bool":
        kw["attn_mask"] = rng.random(rows + (lk,)) < 0.7
    elif case["mask"] == "float":
        m = rng.standard_normal(rows + (lk,))
        m[rng.random(m.shape) < 0.2] = -np.inf
        kw["attn_mask"] = m
    elif case["mask"] == "float_bcast":
        kw["attn_mask"] = rng.standard_normal((lq, lk))
    if case["valid_lens"]:
        kw["valid_lens"] = rng.integers(0, lk + 1, size=rows[:-1])  # 0: fully masked rows
    if case["alibi"]:
        kw["alibi_slopes"] = rng.uniform(0.1, 1.0, size=hq)
    sinks = None
    if case["sinks"] == "head":
        sinks = rng.standard_normal(hq)
    elif case["sinks"] == "full":
        sinks = rng.standard_normal(rows[:-1])
    return rng, q, k, v, sinks, kw


@settings(max_examples=60)
@given(case=sdpa_cases())
def test_sdpa_backward_twin_matches_finite_differences(case):
    rng, q, k, v, sinks, kw = _build(case)
    inputs = {"query": q, "key": k, "value": v}
    if sinks is not None:
        inputs["sinks"] = sinks
    out, lse = reference.scaled_dot_product_attention(**inputs, **kw, return_lse=True)
    grad_out = rng.standard_normal(out.shape)
    grads = reference.scaled_dot_product_attention_backward(
        grad_out, **inputs, out=out, lse=lse, **kw
    )
    assert len(grads) == len(inputs)

    def loss(x):
        return float(np.sum(grad_out * reference.scaled_dot_product_attention(**x, **kw)))

    _directional_check(loss, grads, inputs, rng)


def test_fully_masked_rows_get_zero_gradients():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    sinks = rng.standard_normal(2)
    lens = np.array([[0, 2, 0], [3, 0, 1]])
    out, lse = reference.scaled_dot_product_attention(
        q, k, v, valid_lens=lens, sinks=sinks, return_lse=True
    )
    g = rng.standard_normal(out.shape)
    dq, dk, dv, ds = reference.scaled_dot_product_attention_backward(
        g, q, k, v, out, lse, valid_lens=lens, sinks=sinks
    )
    assert np.all(dq[lens == 0] == 0)
    assert np.any(dq[lens > 0] != 0)
    # key 2 is visible to row (1, 0) only: its value gradient is that row's weight * g
    assert np.all(dv[0, 2] == 0) and np.all(dv[1, 2] != 0)
    assert ds.shape == (2,) and np.all(ds != 0)


def test_2d_and_float32_inputs_keep_shape_and_dtype():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 4)).astype(np.float32)
    k = rng.standard_normal((5, 4))
    v = rng.standard_normal((5, 2)).astype(np.float32)
    out, lse = reference.scaled_dot_product_attention(q, k, v, return_lse=True)
    grads = reference.scaled_dot_product_attention_backward(np.ones_like(out), q, k, v, out, lse)
    assert [(g.shape, g.dtype) for g in grads] == [(a.shape, a.dtype) for a in (q, k, v)]


@st.composite
def varlen_cases(draw):
    lens_q = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    lens_k = [draw(st.integers(0 if n == 0 else 1, 5)) for n in lens_q]
    return {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "lens": (lens_q, lens_k),
        "hkv": draw(st.sampled_from([1, 2])),
        "group": draw(st.sampled_from([1, 2])),
        "causal": draw(st.booleans()),
        "alignment": draw(st.sampled_from(["top_left", "bottom_right"])),
        "window": draw(st.sampled_from([None, (1, None), (1, 1)])),
        "softcap": draw(st.sampled_from([None, 2.0])),
        "sinks": draw(st.booleans()),
        "alibi": draw(st.booleans()),
    }


@settings(max_examples=30)
@given(case=varlen_cases())
def test_varlen_backward_twin_matches_finite_differences(case):
    rng = np.random.default_rng(case["seed"])
    lens_q, lens_k = case["lens"]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)])
    cu_k = np.concatenate([[0], np.cumsum(lens_k)])
    hkv, hq = case["hkv"], case["hkv"] * case["group"]
    inputs = {
        "query": rng.standard_normal((cu_q[-1], hq, 3)),
        "key": rng.standard_normal((cu_k[-1], hkv, 3)),
        "value": rng.standard_normal((cu_k[-1], hkv, 2)),
    }
    if case["sinks"]:
        inputs["sinks"] = rng.standard_normal(hq)
    kw = {
        "is_causal": case["causal"],
        "causal_alignment": case["alignment"],
        "window": case["window"],
        "softcap": case["softcap"],
        "alibi_slopes": rng.uniform(0.1, 1.0, hq) if case["alibi"] else None,
    }
    out, lse = reference.varlen_attention(
        **inputs, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw, return_lse=True
    )
    grad_out = rng.standard_normal(out.shape)
    grads = reference.varlen_attention_backward(
        grad_out, **inputs, out=out, lse=lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw
    )

    def loss(x):
        o = reference.varlen_attention(**x, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)
        return float(np.sum(grad_out * o))

    _directional_check(loss, grads, inputs, rng)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"grad_out": np.ones((2, 3, 5))}, "grad_out must have the shape"),
        ({"lse": np.ones((2, 4))}, "lse must have the shape"),
        ({"out": np.ones((2, 3, 4), dtype=np.int64)}, "out must be a floating-point array"),
        ({"key": np.ones((2, 5, 4), dtype=np.int8)}, "key is int8"),
    ],
)
def test_backward_errors_name_the_argument(change, match):
    rng = np.random.default_rng(2)
    call = {
        "grad_out": rng.standard_normal((2, 3, 4)),
        "query": rng.standard_normal((2, 3, 4)),
        "key": rng.standard_normal((2, 5, 4)),
        "value": rng.standard_normal((2, 5, 4)),
        "out": rng.standard_normal((2, 3, 4)),
        "lse": rng.standard_normal((2, 3)),
    }
    call.update(change)
    with pytest.raises((TypeError, ValueError), match=match):
        reference.scaled_dot_product_attention_backward(**call)

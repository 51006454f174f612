"""attention(..., normalize="softmax", sinks=): every score the softmax takes (dot,
scaled_dot, general, cosine through the SDPA kernel; additive through the family's online
softmax) against the NumPy twin on every ISA, with masks and weights; the normalisers and
score that cannot take a sink refuse it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from sdpa.test_properties import fixture_ok


def _case(rng, dtype, hq, hkv, lq, lk, e, ev):
    q = rng.standard_normal((2, hq, lq, e)).astype(dtype)
    k = rng.standard_normal((2, hkv, lk, e)).astype(dtype)
    v = rng.standard_normal((2, hkv, lk, ev)).astype(dtype)
    return q, k, v


@fixture_ok()
@given(
    seed=st.integers(0, 2**32 - 1),
    score=st.sampled_from(["dot", "scaled_dot", "general", "cosine", "additive"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    group=st.integers(1, 2),
    lq=st.integers(1, 40),
    lk=st.integers(1, 300),
    e=st.integers(1, 20),
    ev=st.integers(1, 40),
    masked=st.booleans(),
    sink_scale=st.sampled_from([0.1, 1.0, 10.0]),
    per_batch=st.booleans(),
)
def test_matches_reference(
    isa, seed, score, dtype, group, lq, lk, e, ev, masked, sink_scale, per_batch
):
    rng = np.random.default_rng(seed)
    hkv = 2
    hq = hkv * group
    q, k, v = _case(rng, dtype, hq, hkv, lq, lk, e, ev)
    kwargs = {"score": score, "normalize": "softmax"}
    if score == "general":
        kwargs["weight"] = rng.standard_normal((e, e)).astype(dtype) / np.sqrt(e)
    if score == "additive":
        hidden = 8
        kwargs["w_q"] = rng.standard_normal((e, hidden)).astype(dtype)
        kwargs["w_k"] = rng.standard_normal((e, hidden)).astype(dtype)
        kwargs["w_v"] = rng.standard_normal(hidden).astype(dtype)
    if masked:
        kwargs["valid_lens"] = rng.integers(0, lk + 1, size=(2,))
        kwargs["is_causal"] = True
        kwargs["causal_alignment"] = "bottom_right"
    shape = (2, hq) if per_batch else (hq,)
    kwargs["sinks"] = (rng.standard_normal(shape) * sink_scale).astype(dtype)
    out, w = fastattn.attention(q, k, v, return_weights=True, **kwargs)
    exp_out, exp_w = reference.attention(q, k, v, return_weights=True, **kwargs)
    # Scores are bounded by |q||k| (dot, general: by the projected norms; cosine by 1;
    # additive by ||w_v||_1); the exponent's rounding error scales with them and the sink.
    eps = np.finfo(dtype).eps
    bound = 10.0 + float(np.abs(kwargs["sinks"]).max())
    qn = np.linalg.norm(q, axis=-1).max() * np.linalg.norm(k, axis=-1).max()
    if score in ("dot", "scaled_dot", "general"):
        bound += 3 * qn
    if score == "additive":
        bound += float(np.abs(kwargs["w_v"]).sum())
    tol = eps * (32 + 8 * bound + lk)
    np.testing.assert_allclose(w, exp_w, rtol=0, atol=tol)
    np.testing.assert_allclose(out, exp_out, rtol=0, atol=tol * float(np.abs(v).max()))
    assert (w.sum(-1) <= 1 + tol).all()


@pytest.mark.parametrize("normalize,extra", [("hardmax", {}), ("topk", {"top_k": 2})])
def test_selection_normalisers_refuse_sinks(normalize, extra):
    q = k = v = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match='sinks need normalize="softmax"'):
        fastattn.attention(q, k, v, normalize=normalize, sinks=np.zeros(2), **extra)
    with pytest.raises(ValueError, match='sinks need normalize="softmax"'):
        reference.attention(q, k, v, normalize=normalize, sinks=np.zeros(2), **extra)


def test_gaussian_refuses_sinks():
    q = k = v = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match='score="gaussian"'):
        fastattn.attention(q, k, v, score="gaussian", sinks=np.zeros(2))


def test_bit_identical_across_thread_counts(isa):
    rng = np.random.default_rng(5)
    q, k, v = _case(rng, np.float32, 4, 2, 33, 200, 12, 20)
    kwargs = dict(
        score="additive",
        w_q=rng.standard_normal((12, 8)).astype(np.float32),
        w_k=rng.standard_normal((12, 8)).astype(np.float32),
        w_v=rng.standard_normal(8).astype(np.float32),
        sinks=rng.standard_normal(4).astype(np.float32),
        is_causal=True,
        return_weights=True,
    )
    runs = [fastattn.attention(q, k, v, num_threads=t, **kwargs) for t in (1, 2, 3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


def test_out_sharing_memory_with_sinks_is_refused():
    """The sinks are read while out is written: the overlap check covers them (it left them
    out before: the call computed with sinks it was overwriting)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 4, 3, 4), dtype=np.float32) for _ in range(3))
    out = np.zeros((1, 4, 3, 4), np.float32)
    with pytest.raises(ValueError, match="out shares memory with sinks"):
        fastattn.attention(q, k, v, sinks=out[0, :, 0, 0], out=out)

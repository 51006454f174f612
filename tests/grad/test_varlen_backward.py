"""fastattn.varlen_attention_backward against its float64 twin (itself checked against
finite differences in test_reference_grad.py), on every ISA; tolerances as in
test_sdpa_backward.py (float64 1e-10, float32 1e-4 of the largest entry, with a floor)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from .test_sdpa_backward import _check


@st.composite
def cases(draw):
    lens_q = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    lens_k = [draw(st.integers(0 if n == 0 else 1, 45)) for n in lens_q]
    hkv = draw(st.sampled_from([1, 2]))
    return {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "dtype": draw(st.sampled_from([np.float32, np.float64])),
        "lens": (lens_q, lens_k),
        "hkv": hkv,
        "hq": hkv * draw(st.sampled_from([1, 2])),
        "e": draw(st.sampled_from([4, 16])),
        "causal": draw(st.booleans()),
        "alignment": draw(st.sampled_from(["top_left", "bottom_right"])),
        "window": draw(st.sampled_from([None, (4, 2)])),
        "softcap": draw(st.sampled_from([None, 3.0])),
        "sinks": draw(st.booleans()),
        "alibi": draw(st.booleans()),
    }


def _call(case):
    rng = np.random.default_rng(case["seed"])
    dt = case["dtype"]
    lens_q, lens_k = case["lens"]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)
    hq, hkv, e = case["hq"], case["hkv"], case["e"]
    q = rng.standard_normal((cu_q[-1], hq, e)).astype(dt)
    k = rng.standard_normal((cu_k[-1], hkv, e)).astype(dt)
    v = rng.standard_normal((cu_k[-1], hkv, 8)).astype(dt)
    kw = {
        "is_causal": case["causal"],
        "causal_alignment": case["alignment"],
        "window": case["window"],
        "softcap": case["softcap"],
        "sinks": rng.standard_normal(hq).astype(dt) if case["sinks"] else None,
        "alibi_slopes": rng.uniform(0.05, 0.5, hq).astype(dt) if case["alibi"] else None,
    }
    out, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, **kw, return_lse=True)
    g = rng.standard_normal(out.shape).astype(dt)
    return (g, q, k, v, out, lse, cu_q, cu_k), kw


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_varlen_backward_matches_reference(isa, case):
    call, kw = _call(case)
    got = fastattn.varlen_attention_backward(*call, **kw)
    want = reference.varlen_attention_backward(*call, **kw)
    _check(got, want, case["dtype"])


def test_varlen_backward_bit_identical_for_any_thread_count():
    rng = np.random.default_rng(1)
    cu = np.array([0, 5, 600, 610, 900])
    q, k, v = (rng.standard_normal((900, 4, 32)).astype(np.float32) for _ in range(3))
    out, lse = fastattn.varlen_attention(q, k, v, cu, cu, is_causal=True, return_lse=True)
    g = rng.standard_normal(out.shape).astype(np.float32)
    runs = [
        fastattn.varlen_attention_backward(
            g, q, k, v, out, lse, cu, cu, is_causal=True, num_threads=n
        )
        for n in (1, 2, 3)
    ]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert a.tobytes() == b.tobytes()


def test_varlen_backward_empty_shapes_match_reference():
    """No query token, no key token, or no value feature (with sinks, ALiBi, causal): the
    twin's gradients (zeros; the sinks' from D = 0), by the fast path without the
    reference (made unreachable while it runs). The twin failed on Ev = 0 before."""
    from unittest import mock

    rng = np.random.default_rng(2)
    for lq, lk, ev in ((0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 3)):
        cu_q, cu_k = np.array([0, lq]), np.array([0, lk])
        q, k = rng.standard_normal((lq, 2, 4)), rng.standard_normal((lk, 2, 4))
        v = rng.standard_normal((lk, 2, ev))
        kw = {"sinks": rng.standard_normal(2), "alibi_slopes": np.array([0.1, 0.2])}
        out, lse = fastattn.varlen_attention(
            q, k, v, cu_q, cu_k, is_causal=True, **kw, return_lse=True
        )
        call = (rng.standard_normal(out.shape), q, k, v, out, lse, cu_q, cu_k)
        want = reference.varlen_attention_backward(*call, is_causal=True, **kw)
        unreachable = mock.Mock(side_effect=AssertionError("the fast path called the reference"))
        with mock.patch.object(reference, "varlen_attention_backward", unreachable):
            got = fastattn.varlen_attention_backward(*call, is_causal=True, **kw)
        _check(got, want, np.float64)

"""varlen_attention with attention sinks and ALiBi slopes (one value per query head): each
sequence gets both exactly as scaled_dot_product_attention gives them to it alone (its own
positions and causal alignment for ALiBi), bit for bit, and the float64 twin agrees within
the tolerance of docs/semantics.md#attention-sinks and #alibi."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close_attention, same_bits
from sdpa.test_sinks_alibi import bias_bound
from varlen.test_varlen import build, fixture_ok, kwargs_of, per_sequence, specs


@st.composite
def with_head_options(draw):
    spec = draw(specs())
    hq = spec.heads[0]
    dt = np.float64 if spec.dtype == "f8" else np.float32
    kw = kwargs_of(spec)
    which = draw(st.sampled_from(["sinks", "alibi_slopes", "both"]))
    if which in ("sinks", "both"):
        kw["sinks"] = np.array(draw(st.lists(st.floats(-4, 4), min_size=hq, max_size=hq)), dt)
    if which in ("alibi_slopes", "both"):
        kw["alibi_slopes"] = np.array(draw(st.lists(st.floats(0, 1), min_size=hq, max_size=hq)), dt)
    return spec, kw


@fixture_ok()
@given(case=with_head_options())
def test_sinks_and_alibi_per_sequence(isa, case):
    spec, kw = case
    q, k, v, cu_q, cu_k = build(spec)
    got, got_lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    one_out, one_lse = per_sequence(q, k, v, cu_q, cu_k, **kw)
    assert same_bits(got, one_out)
    assert same_bits(got_lse, one_lse)
    exp, exp_lse = reference.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    longest = max([*spec.lens_q, *spec.lens_k, 1])
    assert_close_attention(
        (got, got_lse, None),
        (exp, exp_lse, None),
        q,
        k.transpose(1, 0, 2),
        v,
        attn_mask=bias_bound(kw, longest, longest),
        scale=kw.get("scale"),
        softcap=kw.get("softcap"),
    )


@pytest.mark.parametrize("name", ["sinks", "alibi_slopes"])
@pytest.mark.parametrize("fn", [fastattn.varlen_attention, reference.varlen_attention])
def test_one_value_per_query_head(fn, name):
    x = np.ones((5, 4, 8), np.float32)
    cu = np.array([0, 2, 5])
    with pytest.raises(ValueError, match=f"{name} must have one value per query head"):
        fn(x, x, x, cu, cu, **{name: np.zeros(3, np.float32)})

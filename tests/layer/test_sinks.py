"""MultiHeadAttention with attention sinks (``use_sinks=True``, ``mha.sinks``): against
the NumPy twin, loaded by from_torch, kept by state_dict, through the KV cache."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import reference

from helpers.attention_checks import attention_tolerances


def _twin(mha, x, **kwargs):
    return reference.multi_head_attention(
        x,
        num_heads=mha.num_heads,
        q_weight=mha.q_proj.weight,
        k_weight=mha.k_proj.weight,
        v_weight=mha.v_proj.weight,
        out_weight=mha.out_proj.weight,
        q_bias=mha.q_proj.bias,
        k_bias=mha.k_proj.bias,
        v_bias=mha.v_proj.bias,
        out_bias=mha.out_proj.bias,
        sinks=mha.sinks,
        **kwargs,
    )


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_matches_reference_and_sinks_matter(isa, num_kv_heads):
    mha = fastattn.MultiHeadAttention(
        32, 4, num_kv_heads=num_kv_heads, dtype=np.float64, seed=0, use_sinks=True
    )
    assert mha.sinks.shape == (4,) and (mha.sinks == 0).all()  # zero-initialised
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 32))
    mha.sinks = rng.standard_normal(4) * 2
    out, w = mha(x, is_causal=True, need_weights=True, average_attn_weights=False)
    exp_out, exp_w = _twin(mha, x, is_causal=True, need_weights=True, average_attn_weights=False)
    np.testing.assert_allclose(out, exp_out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(w, exp_w, rtol=0, atol=1e-12)
    assert (w.sum(-1) < 1).all()
    plain = fastattn.MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads, dtype=np.float64, seed=0)
    assert not np.allclose(plain(x, is_causal=True), out)


def test_decode_with_sinks_equals_one_causal_pass():
    mha = fastattn.MultiHeadAttention(16, 2, seed=1, use_sinks=True)
    mha.sinks = np.array([1.5, -0.5])
    x = np.random.default_rng(1).standard_normal((1, 6, 16)).astype(np.float32)
    full = mha(x, is_causal=True)
    cache = mha.new_kv_cache(batch=1, max_len=8)
    steps = np.concatenate(
        [mha(x[:, i : i + 1], kv_cache=cache, is_causal=True) for i in range(6)], 1
    )
    tol = attention_tolerances(x, x, x)[0] * 10
    np.testing.assert_allclose(steps, full, rtol=0, atol=max(tol, 1e-5))


def test_from_torch_and_state_dict_with_sinks():
    rng = np.random.default_rng(2)
    sd = {
        "in_proj_weight": rng.standard_normal((24, 8)),
        "out_proj.weight": rng.standard_normal((8, 8)),
        "sinks": rng.standard_normal(2),
    }
    mha = fastattn.MultiHeadAttention.from_torch(sd, num_heads=2)
    np.testing.assert_array_equal(mha.sinks, sd["sinks"])
    assert "use_sinks=True" in repr(mha)
    np.testing.assert_array_equal(mha.state_dict()["sinks"], sd["sinks"])
    again = fastattn.MultiHeadAttention.from_torch(mha.state_dict(), num_heads=2)
    x = rng.standard_normal((1, 3, 8))
    np.testing.assert_array_equal(again(x), mha(x))
    # Without a sinks entry: none, or zero-initialised with use_sinks=True.
    del sd["sinks"]
    assert fastattn.MultiHeadAttention.from_torch(sd, num_heads=2).sinks is None
    zeroed = fastattn.MultiHeadAttention.from_torch(sd, num_heads=2, use_sinks=True)
    np.testing.assert_array_equal(zeroed.sinks, np.zeros(2))
    assert "sinks" not in fastattn.MultiHeadAttention.from_torch(sd, num_heads=2).state_dict()


def test_sinks_attribute_errors():
    mha = fastattn.MultiHeadAttention(8, 2, seed=0, use_sinks=True)
    with pytest.raises(ValueError, match="sinks must have shape"):
        mha.sinks = np.zeros(3)
    with pytest.raises(TypeError, match="sinks must be a floating-point array"):
        mha.sinks = np.zeros(2, np.int64)
    plain = fastattn.MultiHeadAttention(8, 2, seed=0)
    assert plain.sinks is None
    with pytest.raises(ValueError, match="use_sinks=True"):
        plain.sinks = np.zeros(2)
    with pytest.raises(ValueError, match="state_dict\\['sinks'\\]|sinks must have shape"):
        fastattn.MultiHeadAttention.from_torch(
            {
                "in_proj_weight": np.ones((24, 8)),
                "out_proj.weight": np.ones((8, 8)),
                "sinks": np.ones(3),
            },
            num_heads=2,
        )

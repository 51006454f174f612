"""MultiHeadAttention(dtype=bfloat16): parameters, projections, KV cache and output in
bfloat16; projections computed in float32 and rounded once; attention by the bfloat16
SDPA kernel; weights float32. Held to the accuracy rule of helpers.lowp_checks against the
float64 twin (reference.multi_head_attention on the same bfloat16 parameters and inputs):
the error is at most twice that of a plain NumPy float32 formula with the same bfloat16
roundings (projections, P, merged heads, output), on every ISA the machine has.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.lowp_checks import assert_within_rule, bf16

ml_dtypes = pytest.importorskip("ml_dtypes")
MHA = fastattn.MultiHeadAttention
F32 = np.float32


def _weights(layer):
    return {
        f"{n}_{part}": getattr(getattr(layer, f"{n}_proj"), part)
        for n in ("q", "k", "v", "out")
        for part in ("weight", "bias")
    }


def _round(a):
    return a.astype(bf16()).astype(F32)


def _project(x, proj):
    """The layer's rule: float32 matmul of the widened operands, bias added, rounded."""
    y = x.astype(F32) @ proj.weight.astype(F32).T
    if proj.bias is not None:
        y = y + proj.bias.astype(F32)
    return _round(y)


def _heads(x, n):
    return np.moveaxis(x.reshape(x.shape[:-1] + (n, -1)), -2, -3)


def _twin(layer, x, mask, causal, lens=None):
    """(output, weights) of the plain float32 formula with the layer's bfloat16 roundings:
    q/k/v projections, P before P V (FlashAttention's), the merged heads, the output.
    ``mask``: bool (True = may attend) or float (added to the scaled scores); ``lens``:
    one valid length per batch entry."""
    q = _heads(_project(x, layer.q_proj), layer.num_heads)
    k = _heads(_project(x, layer.k_proj), layer.num_kv_heads)
    v = _heads(_project(x, layer.v_proj), layer.num_kv_heads)
    g = layer.num_heads // layer.num_kv_heads
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    s = (q @ np.swapaxes(k, -1, -2)) * F32(1.0 / np.sqrt(layer.head_dim))
    lq, lk = s.shape[-2:]
    seen = np.ones(s.shape, bool)
    if mask is not None and mask.dtype == bool:
        seen = seen & mask
    elif mask is not None:
        s = s + mask.astype(F32)
    if causal:
        seen = seen & np.tri(lq, lk, dtype=bool)
    if lens is not None:
        seen = seen & (np.arange(lk) < lens[:, None, None, None])
    s = np.where(seen, s, -np.inf).astype(F32)
    mx = np.where(seen.any(-1, keepdims=True), s.max(-1, keepdims=True), 0).astype(F32)
    p = np.where(seen, np.exp(s - mx), 0).astype(F32)
    total = p.sum(-1, keepdims=True, dtype=F32)
    with np.errstate(invalid="ignore", divide="ignore"):
        heads = np.where(total > 0, (_round(p) @ v) / total, 0).astype(F32)
        w = np.where(total > 0, p / total, 0).astype(F32)
    merged = _round(np.moveaxis(heads, -3, -2).reshape(x.shape[:-1] + (-1,)))
    return _project(merged, layer.out_proj).astype(np.float64), w.mean(-3)


@st.composite
def layers(draw):
    hkv = draw(st.integers(1, 2))
    h = hkv * draw(st.sampled_from([1, 2]))
    d = draw(st.sampled_from([4, 16, 32]))
    seed = draw(st.integers(0, 2**32 - 1))
    layer = MHA(h * d, h, num_kv_heads=hkv, bias=draw(st.booleans()), dtype=bf16(), seed=seed)
    rng = np.random.default_rng(seed)
    for p in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
        if p.bias is not None:  # non-zero biases, so that they count
            p.bias = 0.1 * rng.standard_normal(p.bias.shape)
    b = draw(st.sampled_from([1, 2]))
    lq = draw(st.sampled_from([1, 5, 40, 90]))
    x = rng.standard_normal((b, lq, h * d))
    kind = draw(st.sampled_from([None, "bool", "float", "lens"]))
    mask = lens = None
    if kind == "bool":
        mask = rng.random((lq, lq)) < 0.8
    elif kind == "float":
        mask = rng.standard_normal((b, h, lq, lq)).astype(F32)
    elif kind == "lens":
        lens = rng.integers(0, lq + 1, size=b)
    return layer, x, mask, lens, draw(st.booleans())


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=layers())
def test_accuracyassert_within_rule(isa, case):
    layer, x, mask, lens, causal = case
    assert layer.q_proj.weight.dtype == bf16() and layer.out_proj.weight.dtype == bf16()
    out, w = layer(x, attn_mask=mask, valid_lens=lens, is_causal=causal, need_weights=True)
    assert out.dtype == bf16() and w.dtype == F32 and out.shape == x.shape
    xb = x.astype(bf16())
    ref, ref_w = reference.multi_head_attention(
        xb, num_heads=layer.num_heads, **_weights(layer), attn_mask=mask, valid_lens=lens,
        is_causal=causal, need_weights=True,
    )  # fmt: skip
    assert ref.dtype == bf16() and ref_w.dtype == F32
    exact, exact_w = reference.multi_head_attention(
        xb.astype(np.float64),
        num_heads=layer.num_heads,
        **{n: None if a is None else a.astype(np.float64) for n, a in _weights(layer).items()},
        attn_mask=mask,
        valid_lens=lens,
        is_causal=causal,
        need_weights=True,
    )
    twin, twin_w = _twin(layer, xb, mask, causal, lens)
    assert_within_rule(out, twin, exact, "output")
    assert_within_rule(w, twin_w, exact_w, "weights")
    # The twin rounded to bfloat16 as the layer returns it is within the same bound.
    assert_within_rule(ref, twin, exact, "reference")


def test_decode_with_a_bfloat16_cache(isa):
    """Decoding one position at a time over a bfloat16 cache: the cache holds the keys and
    values in bfloat16, and each step is within the rule of the full causal pass."""
    layer = MHA(64, 4, num_kv_heads=2, dtype=bf16(), seed=3)
    x = np.random.default_rng(4).standard_normal((2, 12, 64))
    cache = layer.new_kv_cache(batch=2, max_len=16)
    assert cache.dtype == bf16() and cache.key.dtype == bf16()
    steps = [layer(x[:, :5], kv_cache=cache, is_causal=True)]
    steps += [layer(x[:, i : i + 1], kv_cache=cache, is_causal=True) for i in range(5, 12)]
    got = np.concatenate(steps, axis=1)
    assert got.dtype == bf16() and len(cache) == 12
    xb = x.astype(bf16())
    exact = reference.multi_head_attention(
        xb.astype(np.float64),
        num_heads=4,
        **{n: None if a is None else a.astype(np.float64) for n, a in _weights(layer).items()},
        is_causal=True,
    )
    assert_within_rule(got, _twin(layer, xb, None, True)[0], exact, "decode")
    k = _heads(_project(xb, layer.k_proj), 2)  # the cache: the projections, rounded once
    np.testing.assert_allclose(cache.key.astype(F32), k, rtol=2.0**-7, atol=1e-6)


def test_int8_cache_from_a_bfloat16_layer(isa):
    """new_kv_cache(dtype="int8") on a bfloat16 layer: the bfloat16 projections quantised
    (quantize_kv), and each step is the layer's composition over the int8 cache."""
    layer = MHA(64, 4, num_kv_heads=2, dtype=bf16(), seed=5)
    x = np.random.default_rng(6).standard_normal((1, 6, 64)).astype(bf16())
    cache = layer.new_kv_cache(batch=1, max_len=8, dtype="int8")
    layer(x[:, :5], kv_cache=cache, is_causal=True)
    out = layer(x[:, 5:], kv_cache=cache, is_causal=True)
    assert cache.key.dtype == np.int8 and cache.key_scale.dtype == F32
    q = layer.q_proj(x[:, 5:]).reshape(1, 1, 4, 16).swapaxes(1, 2)
    heads = fastattn.scaled_dot_product_attention(
        q,
        cache.key,
        cache.value,
        key_scale=cache.key_scale,
        value_scale=cache.value_scale,
        is_causal=True,
        causal_alignment="bottom_right",
    )
    want = layer.out_proj(heads.swapaxes(1, 2).reshape(1, 1, 64))
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    # The scales are those of the bfloat16 keys (max |k| / 127 per vector).
    k = _heads(_project(x, layer.k_proj), 2)
    np.testing.assert_allclose(cache.key_scale, np.abs(k).max(-1) / 127, rtol=2.0**-7, atol=1e-8)


def test_parameters_and_errors():
    layer = MHA(16, 2, dtype=bf16(), use_sinks=True, seed=0)
    assert layer.dtype == bf16() and "dtype=bfloat16" in repr(layer)
    layer.q_proj.weight = np.ones((16, 16))
    assert layer.q_proj.weight.dtype == bf16()
    layer.sinks = [0.5, -1.0]
    assert layer.sinks.dtype == F32  # one logit per head, read in float32
    assert layer(np.ones((3, 16))).dtype == bf16()
    sd = layer.state_dict()
    assert sd["in_proj_weight"].dtype == bf16()
    with pytest.raises(TypeError, match=r"dtype must be float16, bfloat16, float32 or float64"):
        MHA(16, 2, dtype=np.int16)
    with pytest.raises(ValueError, match="kv_cache holds"):
        layer(np.ones((1, 1, 16)), kv_cache=MHA(16, 2, seed=0).new_kv_cache(1, 4))
    with pytest.raises(TypeError, match="dtype must be None"):
        layer.new_kv_cache(1, 4, dtype=bf16())

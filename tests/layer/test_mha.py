"""fastattn.MultiHeadAttention: against the reference composition (hypothesis), PyTorch's
module (when torch is installed), KV-cache decoding, GQA, cross attention, weights, errors.

Tolerances: :func:`mha_tolerances` bounds the error of the layer's float32 (or float64)
arithmetic against the float64 reference, step by step (projections, attention, output
projection); it reuses ``attention_checks.attention_tolerances`` for the attention core.
"""

from __future__ import annotations

import doctest
import math
import re
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import attention_tolerances

MHA = fastattn.MultiHeadAttention


# --------------------------------------------------------------------------------------
# Helpers


def randn(rng, shape, dtype=np.float32, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def random_biases(layer, rng):
    """Non-zero biases (the default is zeros, which would hide a missing bias term)."""
    if layer.bias:
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
            proj.bias = randn(rng, proj.bias.shape, scale=0.5)
    return layer


def layer_weights(layer) -> dict:
    """The layer's weights as reference.multi_head_attention keyword arguments."""
    return {
        "num_heads": layer.num_heads,
        "q_weight": layer.q_proj.weight,
        "k_weight": layer.k_proj.weight,
        "v_weight": layer.v_proj.weight,
        "out_weight": layer.out_proj.weight,
        "q_bias": layer.q_proj.bias,
        "k_bias": layer.k_proj.bias,
        "v_bias": layer.v_proj.bias,
        "out_bias": layer.out_proj.bias,
    }


def reference_call(layer, query, key=None, value=None, **kwargs):
    return reference.multi_head_attention(query, key, value, **layer_weights(layer), **kwargs)


def _projection_bound(x, proj) -> tuple[np.ndarray, float]:
    """(float64 result of x @ W.T + b, bound on the rounding error of computing it in the
    layer's dtype): |error| <= (n + 1) eps (|x| @ |W|.T + |b|), the classical gamma_n bound
    for a length-n dot product plus the bias add."""
    x = np.asarray(x, np.float64)
    w = proj.weight.astype(np.float64)
    b = 0.0 if proj.bias is None else proj.bias.astype(np.float64)
    eps = float(np.finfo(np.promote_types(proj.weight.dtype, np.float32)).eps)
    magnitude = np.abs(x) @ np.abs(w).T + np.abs(b)
    bound = (w.shape[1] + 1) * eps * float(magnitude.max(initial=0.0))
    return x @ w.T + b, bound


def mha_tolerances(layer, query, key=None, value=None, attn_mask=None):
    """(output tolerance, weights tolerance) for ``layer(query, key, value)`` against the
    float64 reference.

    * each projection is off by at most ``eq``/``ek``/``ev`` (:func:`_projection_bound`);
    * a score ``scale * q.k`` then moves by at most
      ``ds = scale * D * (eq max|k| + ek max|q| + eq ek)``, which changes every softmax weight
      by a factor within ``exp(+-2 ds)``: weights move by ``exp(2 ds) - 1`` at most, the
      attention output by that times ``max|v|``, plus ``ev`` (the weights sum to 1);
    * the kernel's own error on the exact projections is ``attention_tolerances``;
    * the output projection multiplies that error by at most the largest absolute row sum
      of ``out_proj.weight`` and adds its own rounding.
    A factor 2 covers the first-order approximations.
    """
    query = np.asarray(query)
    key = query if key is None else np.asarray(key)
    value = key if value is None else np.asarray(value)
    dt = layer.dtype
    q, eq = _projection_bound(query.astype(dt), layer.q_proj)
    k, ek = _projection_bound(key.astype(dt), layer.k_proj)
    v, ev = _projection_bound(value.astype(dt), layer.v_proj)
    d = layer.head_dim
    scale = 1.0 / math.sqrt(d)
    qmax = float(np.abs(q).max(initial=0.0))
    kmax = float(np.abs(k).max(initial=0.0))
    vmax = float(np.abs(v).max(initial=0.0))
    ds = scale * d * (eq * kmax + ek * qmax + eq * ek)
    shift = math.expm1(2 * ds)

    def heads(x, n):  # (..., L, n * D) -> (..., n, L, D), for the attention bound
        x = x.reshape(x.shape[:-1] + (n, d))
        return np.moveaxis(x, -2, -3)

    kh = heads(k, layer.num_kv_heads)
    kh = np.repeat(kh, layer.num_heads // layer.num_kv_heads, axis=-3)
    out_attn, _, w_attn = attention_tolerances(
        heads(q, layer.num_heads).astype(dt),
        kh.astype(dt),
        heads(v, layer.num_kv_heads).astype(dt),
        attn_mask=attn_mask,
    )
    attn_err = out_attn + shift * vmax + ev
    wo = layer.out_proj.weight.astype(np.float64)
    row_sum = float(np.abs(wo).sum(axis=1).max())
    attended_max = vmax + attn_err
    eps = float(np.finfo(np.promote_types(dt, np.float32)).eps)
    out_round = (
        (wo.shape[1] + 1)
        * eps
        * (
            row_sum * attended_max
            + (0.0 if layer.out_proj.bias is None else float(np.abs(layer.out_proj.bias).max()))
        )
    )
    out_tol = 2 * (row_sum * attn_err + out_round)
    if dt == np.float16:  # the result is rounded to float16
        out_tol += 2 * float(np.finfo(np.float16).eps) * (row_sum * attended_max + 1)
    return out_tol, 2 * (w_attn + shift)


def assert_close(got, expected, tol, what="output"):
    assert isinstance(got, np.ndarray), type(got)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    assert got.dtype == expected.dtype, (what, got.dtype, expected.dtype)
    assert np.isfinite(got).all(), what
    err = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    worst = float(err.max(initial=0.0))
    assert worst <= tol, f"{what}: max abs error {worst:.3g} > tolerance {tol:.3g}"


# --------------------------------------------------------------------------------------
# Against the reference composition, on drawn cases


@dataclass
class Case:
    seed: int
    batch: int | None  # None: unbatched (L, E)
    num_q: int
    num_k: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    kdim: int | None
    vdim: int | None
    cross: bool  # separate key/value inputs
    bias: bool
    dtype: str
    mask: str | None  # None, "bool-full", "bool-keys", "float"
    valid_lens: str | None  # None, "batch", "query"
    causal: bool
    need_weights: bool
    average: bool


@st.composite
def cases(draw) -> Case:
    kv_heads = draw(st.integers(1, 3))
    cross = draw(st.booleans())
    num_q = draw(st.integers(1, 9))
    return Case(
        seed=draw(st.integers(0, 2**32 - 1)),
        batch=draw(st.one_of(st.none(), st.integers(1, 3))),
        num_q=num_q,
        num_k=draw(st.integers(1, 11)) if cross else num_q,
        num_heads=kv_heads * draw(st.integers(1, 3)),
        num_kv_heads=kv_heads,
        head_dim=draw(st.integers(1, 9)),
        kdim=draw(st.one_of(st.none(), st.integers(1, 20))) if cross else None,
        vdim=draw(st.one_of(st.none(), st.integers(1, 20))) if cross else None,
        cross=cross,
        bias=draw(st.booleans()),
        dtype=draw(st.sampled_from(["float32", "float32", "float64"])),
        mask=draw(st.sampled_from([None, None, "bool-full", "bool-keys", "float"])),
        valid_lens=draw(st.sampled_from([None, None, "batch", "query"])),
        causal=draw(st.booleans()),
        need_weights=draw(st.booleans()),
        average=draw(st.booleans()),
    )


def build(case: Case):
    """(layer, args, kwargs) for a drawn case; every array drawn fresh (never zeros)."""
    rng = np.random.default_rng(case.seed)
    e = case.num_heads * case.head_dim
    layer = MHA(
        e,
        case.num_heads,
        num_kv_heads=case.num_kv_heads,
        kdim=case.kdim,
        vdim=case.vdim,
        bias=case.bias,
        dtype=case.dtype,
        seed=rng,
    )
    random_biases(layer, rng)
    lead = () if case.batch is None else (case.batch,)
    query = randn(rng, lead + (case.num_q, e), case.dtype)
    args = [query]
    if case.cross:
        args.append(randn(rng, lead + (case.num_k, layer.kdim), case.dtype))
        args.append(randn(rng, lead + (case.num_k, layer.vdim), case.dtype))
    kwargs = {
        "is_causal": case.causal,
        "need_weights": case.need_weights,
        "average_attn_weights": case.average,
    }
    scores = lead + (case.num_heads, case.num_q, case.num_k)
    if case.mask == "bool-full":
        kwargs["attn_mask"] = rng.random(scores) < 0.7
    elif case.mask == "bool-keys":  # a key padding mask, broadcast over heads and queries
        kwargs["attn_mask"] = rng.random(lead + (1, 1, case.num_k)) < 0.7
    elif case.mask == "float":
        kwargs["attn_mask"] = randn(rng, scores[-2:], case.dtype)
    if case.valid_lens == "batch":
        kwargs["valid_lens"] = rng.integers(0, case.num_k + 1, size=lead)
    elif case.valid_lens == "query":
        kwargs["valid_lens"] = rng.integers(0, case.num_k + 1, size=lead + (case.num_q,))
    return layer, args, kwargs


@given(cases())
def test_matches_reference(case):
    layer, args, kwargs = build(case)
    got = layer(*args, **kwargs)
    expected = reference_call(layer, *args, **kwargs)
    out_tol, w_tol = mha_tolerances(layer, *args, attn_mask=kwargs.get("attn_mask"))
    if case.need_weights:
        assert isinstance(got, tuple) and len(got) == 2
        assert_close(got[0], expected[0], out_tol)
        assert_close(got[1], expected[1], w_tol, "weights")
        lead = () if case.batch is None else (case.batch,)
        heads = () if case.average else (case.num_heads,)
        assert got[1].shape == lead + heads + (case.num_q, case.num_k)
    else:
        assert_close(got, expected, out_tol)
        assert got.shape == args[0].shape


@given(cases())
def test_decode_step_by_step_equals_one_causal_pass(case):
    """Any split of a sequence into chunks, fed through a KV cache, gives the outputs of one
    causal pass over the whole sequence (same keys, bottom-right aligned per chunk)."""
    case.cross, case.kdim, case.vdim, case.num_k = False, None, None, case.num_q
    case.mask = case.valid_lens = None
    layer, (x,), _ = build(case)
    full = layer(x, is_causal=True)
    out_tol, _ = mha_tolerances(layer, x)
    rng = np.random.default_rng(case.seed + 1)
    batch = 1 if case.batch is None else case.batch
    cache = layer.new_kv_cache(batch, case.num_q + int(rng.integers(0, 3)))
    steps, start = [], 0
    while start < case.num_q:
        stop = min(case.num_q, start + int(rng.integers(1, 4)))
        steps.append(layer(x[..., start:stop, :], kv_cache=cache, is_causal=True))
        start = stop
        assert len(cache) == stop
    got = np.concatenate(steps, axis=-2)
    # Both are within out_tol of the float64 reference.
    assert_close(got, full, 2 * out_tol)


# --------------------------------------------------------------------------------------
# Against PyTorch's module


def torch_module(torch, embed_dim, num_heads, *, kdim=None, vdim=None, bias=True, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(
        embed_dim, num_heads, batch_first=True, kdim=kdim, vdim=vdim, bias=bias
    )
    if bias:  # torch initialises biases to zero: make them count
        with torch.no_grad():
            m.in_proj_bias.normal_()
            m.out_proj.bias.normal_()
    return m.eval()


TORCH_FORMS = {
    "packed": (None, None, True),
    "packed-nobias": (None, None, False),
    "separate": (6, 10, True),
    "separate-nobias": (6, 10, False),
}


@pytest.mark.parametrize("form", sorted(TORCH_FORMS))
@pytest.mark.parametrize(
    "masking, batched",
    [
        (m, b)
        for m in ("none", "bool", "float", "causal", "key_padding")
        for b in (True, False)
        if b or m != "key_padding"
    ],
)  # key_padding_mask: batched inputs
def test_matches_torch(form, masking, batched):
    torch = pytest.importorskip("torch")
    kdim, vdim, bias = TORCH_FORMS[form]
    e, h = 16, 4
    m = torch_module(torch, e, h, kdim=kdim, vdim=vdim, bias=bias)
    state = m.state_dict()
    assert ("in_proj_weight" in state) == (kdim is None)
    layer = MHA.from_torch(state, h)
    assert (layer.kdim, layer.vdim, layer.bias) == (kdim or e, vdim or e, bias)
    rng = np.random.default_rng(7)
    lead = (2,) if batched else ()
    lq, lk = 5, (7 if kdim else 5)
    q = randn(rng, lead + (lq, e))
    k = randn(rng, lead + (lk, layer.kdim)) if kdim else q
    v = randn(rng, lead + (lk, layer.vdim)) if kdim else q

    ours, theirs = {}, {}
    if masking == "bool":
        allowed = rng.random((lq, lk)) < 0.7
        allowed[:, 0] = True  # torch returns NaN for fully masked rows
        ours["attn_mask"], theirs["attn_mask"] = allowed, torch.from_numpy(~allowed)
    elif masking == "float":
        f = randn(rng, (lq, lk))
        ours["attn_mask"], theirs["attn_mask"] = f, torch.from_numpy(f)
    elif masking == "causal":
        ours["is_causal"] = True
        theirs["attn_mask"] = torch.from_numpy(~np.tri(lq, lk, dtype=bool))
        theirs["is_causal"] = True
    elif masking == "key_padding":
        padding = np.zeros((2, lk), bool)
        padding[0, -2:] = padding[1, -1] = True  # torch: True = ignore
        ours["attn_mask"] = ~padding[:, None, None, :]  # the documented conversion
        theirs["key_padding_mask"] = torch.from_numpy(padding)

    for average in (True, False):
        out, w = layer(q, k, v, need_weights=True, average_attn_weights=average, **ours)
        with torch.no_grad():
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            t_out, t_w = m(tq, tk, tv, need_weights=True, average_attn_weights=average, **theirs)
        out_tol, w_tol = mha_tolerances(layer, q, k, v, attn_mask=ours.get("attn_mask"))
        # Both float32 results lie within the tolerance of the float64 answer.
        assert_close(out, t_out.numpy(), 2 * out_tol)
        assert_close(w, t_w.numpy(), 2 * w_tol, "weights")
        assert_close(layer(q, k, v, **ours), t_out.numpy(), 2 * out_tol)

    # In float64 both compute the same math: agreement to float64 rounding.
    m64 = m.double()
    layer64 = MHA.from_torch(m64.state_dict(), h)
    assert layer64.dtype == np.float64
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    theirs64 = {
        name: (t.double() if t.is_floating_point() else t)
        for name, t in theirs.items()
        if name != "is_causal"
    }
    if "is_causal" in theirs:
        theirs64["is_causal"] = True
    with torch.no_grad():
        t64, _ = m64(*(torch.from_numpy(a) for a in (q64, k64, v64)), **theirs64)
    np.testing.assert_allclose(layer64(q64, k64, v64, **ours), t64.numpy(), rtol=1e-10, atol=1e-12)


def test_torch_self_attention_fast_path_and_state_dict_round_trip():
    """torch's fused self-attention path agrees too, and our weights load into torch."""
    torch = pytest.importorskip("torch")
    layer = MHA(32, 8, seed=3)
    random_biases(layer, np.random.default_rng(0))
    m = torch.nn.MultiheadAttention(32, 8, batch_first=True).eval()
    m.load_state_dict({k: torch.from_numpy(v) for k, v in layer.state_dict().items()})
    x = randn(np.random.default_rng(1), (3, 6, 32))
    with torch.no_grad():
        t_out, _ = m(*(torch.from_numpy(x),) * 3, need_weights=False)
    out_tol, _ = mha_tolerances(layer, x)
    assert_close(layer(x), t_out.numpy(), 2 * out_tol)
    back = MHA.from_torch(m.state_dict(), 8)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        np.testing.assert_array_equal(getattr(back, name).weight, getattr(layer, name).weight)
        np.testing.assert_array_equal(getattr(back, name).bias, getattr(layer, name).bias)


def test_initialisation_matches_torch_distribution():
    """Same bounds as torch: Xavier-uniform in-projections (packed (3E, E) when torch packs
    them), U(-1/sqrt(E), 1/sqrt(E)) out-projection, zero biases; seeded."""
    e = 64
    layer = MHA(e, 8, seed=0)
    packed = math.sqrt(6 / (e + 3 * e))
    for proj in (layer.q_proj, layer.k_proj, layer.v_proj):
        assert np.abs(proj.weight).max() <= packed
        assert np.abs(proj.weight).max() > 0.95 * packed  # uniform up to the bound
        assert (proj.bias == 0).all()
    assert np.abs(layer.out_proj.weight).max() <= 1 / math.sqrt(e)
    assert (layer.out_proj.bias == 0).all()
    cross = MHA(e, 8, kdim=20, vdim=30, seed=0)
    assert np.abs(cross.k_proj.weight).max() <= math.sqrt(6 / (e + 20))
    assert np.abs(cross.v_proj.weight).max() <= math.sqrt(6 / (e + 30))
    same = MHA(e, 8, seed=0)
    np.testing.assert_array_equal(same.q_proj.weight, layer.q_proj.weight)
    assert not np.array_equal(MHA(e, 8, seed=1).q_proj.weight, layer.q_proj.weight)
    assert layer.q_proj.weight.dtype == np.float32
    assert MHA(e, 8, dtype=np.float64).out_proj.weight.dtype == np.float64
    assert MHA(e, 8, bias=False).q_proj.bias is None


# --------------------------------------------------------------------------------------
# from_torch without torch


class FakeTensor:
    """Duck-types a torch tensor: from_torch must only use detach/cpu/numpy."""

    def __init__(self, array):
        self.array = array

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.array


def test_from_torch_accepts_plain_arrays_and_tensor_likes():
    rng = np.random.default_rng(0)
    e = 12
    sd = {
        "q_proj_weight": randn(rng, (e, e)),
        "k_proj_weight": randn(rng, (e, 5)),
        "v_proj_weight": randn(rng, (e, 7)),
        "in_proj_bias": randn(rng, (3 * e,)),
        "out_proj.weight": randn(rng, (e, e)),
        "out_proj.bias": randn(rng, (e,)),
    }
    layer = MHA.from_torch({k: FakeTensor(v) for k, v in sd.items()}, 3)
    assert (layer.embed_dim, layer.num_heads, layer.kdim, layer.vdim) == (e, 3, 5, 7)
    np.testing.assert_array_equal(layer.k_proj.weight, sd["k_proj_weight"])
    np.testing.assert_array_equal(layer.v_proj.bias, sd["in_proj_bias"][2 * e :])
    sd["k_proj_weight"][0, 0] = 99.0  # the layer holds copies
    assert layer.k_proj.weight[0, 0] != 99.0
    assert MHA.from_torch(sd, 3, dtype=np.float64).dtype == np.float64
    again = MHA.from_torch(layer.state_dict(), 3)
    np.testing.assert_array_equal(again.out_proj.bias, layer.out_proj.bias)


# --------------------------------------------------------------------------------------
# GQA / MQA, cross attention, weights, layouts


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_gqa_equals_mha_with_repeated_kv_weights(num_kv_heads):
    """Query head h reads kv head h // (H / Hkv): the same as full multi-head attention whose
    k/v projections repeat each kv head's rows for its group."""
    rng = np.random.default_rng(num_kv_heads)
    h, d = 4, 3
    gqa = random_biases(MHA(h * d, h, num_kv_heads=num_kv_heads, dtype=np.float64, seed=0), rng)
    assert gqa.k_proj.weight.shape == (num_kv_heads * d, h * d)
    full = MHA(h * d, h, dtype=np.float64, seed=1)
    group = h // num_kv_heads
    for name in ("k_proj", "v_proj"):
        src, dst = getattr(gqa, name), getattr(full, name)
        dst.weight = np.repeat(src.weight.reshape(num_kv_heads, d, -1), group, axis=0).reshape(
            h * d, -1
        )
        dst.bias = np.repeat(src.bias.reshape(num_kv_heads, d), group, axis=0).ravel()
    for name in ("q_proj", "out_proj"):
        getattr(full, name).weight = getattr(gqa, name).weight
        getattr(full, name).bias = getattr(gqa, name).bias
    x = randn(rng, (2, 7, h * d), np.float64)
    got, got_w = gqa(x, is_causal=True, need_weights=True, average_attn_weights=False)
    want, want_w = full(x, is_causal=True, need_weights=True, average_attn_weights=False)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-12, atol=1e-14)


def test_cross_attention_with_kdim_vdim():
    rng = np.random.default_rng(2)
    layer = random_biases(MHA(16, 4, kdim=10, vdim=6, seed=0), rng)
    assert layer.k_proj.weight.shape == (16, 10) and layer.v_proj.weight.shape == (16, 6)
    q, k, v = randn(rng, (3, 5, 16)), randn(rng, (3, 9, 10)), randn(rng, (3, 9, 6))
    out, w = layer(q, k, v, need_weights=True)
    assert out.shape == (3, 5, 16) and w.shape == (3, 5, 9)
    assert_close(out, reference_call(layer, q, k, v), mha_tolerances(layer, q, k, v)[0])
    # value defaults to key when their sizes agree
    same = MHA(16, 4, kdim=10, vdim=10, seed=0)
    np.testing.assert_array_equal(same(q, k), same(q, k, k))


def test_need_weights_averaging_and_shapes():
    rng = np.random.default_rng(3)
    layer = MHA(12, 3, seed=0)
    x = randn(rng, (2, 4, 12))
    out, per_head = layer(x, need_weights=True, average_attn_weights=False)
    out2, averaged = layer(x, need_weights=True)
    assert per_head.shape == (2, 3, 4, 4) and averaged.shape == (2, 4, 4)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(out, layer(x))
    np.testing.assert_allclose(averaged, per_head.mean(axis=1), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(averaged.sum(-1), 1.0, rtol=1e-6)
    out_u, w_u = layer(x[1], need_weights=True, average_attn_weights=False)
    assert out_u.shape == (4, 12) and w_u.shape == (3, 4, 4)
    np.testing.assert_array_equal(out_u, out[1])
    np.testing.assert_array_equal(w_u, per_head[1])
    _, w_avg_u = layer(x[1], need_weights=True)
    assert w_avg_u.shape == (4, 4)


def test_unbatched_equals_batched_and_masks_per_query():
    rng = np.random.default_rng(4)
    layer = random_biases(MHA(8, 2, seed=0), rng)
    x = randn(rng, (3, 6, 8))
    vl = np.array([[1, 2, 3, 4, 5, 6], [6, 6, 6, 6, 6, 6], [0, 1, 0, 1, 0, 1]])
    batched = layer(x, valid_lens=vl)
    for i in range(3):
        np.testing.assert_array_equal(layer(x[i], valid_lens=vl[i]), batched[i])
        np.testing.assert_array_equal(
            layer(x[i], valid_lens=int(vl[i, 0])), layer(x[i : i + 1], valid_lens=vl[i, :1])[0]
        )
    # a row with nothing to attend gives out_proj(0) = the output bias
    np.testing.assert_array_equal(batched[2, 0], layer.out_proj.bias)


def test_dtypes():
    rng = np.random.default_rng(5)
    x64 = randn(rng, (2, 3, 8), np.float64)
    layer32 = MHA(8, 2, seed=0)
    assert layer32(x64).dtype == np.float32  # inputs take the layer's dtype
    np.testing.assert_array_equal(layer32(x64), layer32(x64.astype(np.float32)))
    layer64 = MHA(8, 2, dtype=np.float64, seed=0)
    assert layer64(x64).dtype == np.float64
    layer16 = MHA(8, 2, dtype=np.float16, seed=0)
    out16, w16 = layer16(x64.astype(np.float16), need_weights=True)
    assert out16.dtype == np.float16 and w16.dtype == np.float16
    tol, _ = mha_tolerances(layer16, x64.astype(np.float16))
    assert_close(out16, reference_call(layer16, x64.astype(np.float16)), tol)
    big_endian = x64.astype(">f8")
    np.testing.assert_array_equal(layer64(big_endian), layer64(x64))


def test_decode_steps_the_fast_path_declines(monkeypatch):
    """A decode step that the core's fast path is offered but declines (it takes sinks in
    the compute dtype only, and a float16 layer keeps them in float16) is computed from the
    record checked before projecting, and num_threads=0 there gets the full path's error
    with the cache unchanged."""
    offered = []

    def spy(*args):
        offered.append(fast_path(*args))
        return offered[-1]

    fast_path = fastattn._core.sdpa_fast
    monkeypatch.setattr(fastattn._core, "sdpa_fast", spy)
    monkeypatch.setattr(fastattn._sdpa, "_fast_path", True)  # (FASTATTN_FAST_PATH=0 runs)
    rng = np.random.default_rng()
    layer = random_biases(MHA(16, 4, num_kv_heads=2, dtype=np.float16, use_sinks=True), rng)
    layer.sinks = randn(rng, (4,))
    x = randn(rng, (2, 5, 16), np.float16)
    cache = layer.new_kv_cache(batch=2, max_len=8)
    layer(x[:, :4], kv_cache=cache, is_causal=True)
    step = layer(x[:, 4:], kv_cache=cache)
    assert offered == [None]  # offered, declined
    want = reference_call(layer, x, is_causal=True, sinks=layer.sinks)[:, 4:]
    assert_close(step, want, mha_tolerances(layer, x)[0])
    with pytest.raises(ValueError, match="num_threads must be >= 1, got 0"):
        layer(x[:, 4:], kv_cache=cache, num_threads=0)
    assert len(cache) == 5 and offered == [None, None]


def test_empty_sequences():
    layer = random_biases(MHA(8, 2, seed=0), np.random.default_rng(0))
    assert layer(np.ones((2, 0, 8), np.float32)).shape == (2, 0, 8)
    out = layer(np.ones((2, 3, 8), np.float32), np.ones((2, 0, 8), np.float32))
    np.testing.assert_array_equal(out, np.broadcast_to(layer.out_proj.bias, (2, 3, 8)))


def test_heads_reach_the_kernel_as_views(monkeypatch):
    """The head split costs no copy: the kernel gets strided views of the projections (and
    of the cache), and writes its result straight into the merged (B, L, H, D) buffer."""
    import fastattn._cpu as cpu_backend

    seen = []
    real = cpu_backend.sdpa

    def spy(args, out, *rest):
        seen.append((args.query, args.key, args.value, out))
        return real(args, out, *rest)

    monkeypatch.setattr(cpu_backend, "sdpa", spy)
    layer = MHA(16, 4, seed=0)
    x = randn(np.random.default_rng(0), (2, 5, 16))
    expected = reference_call(layer, x)
    assert_close(layer(x), expected, mha_tolerances(layer, x)[0])
    q, k, v, out = seen[-1]
    for a in (q, k, v, out):
        assert a.shape == (2, 4, 5, 4)
        assert not a.flags.c_contiguous and a.strides[-1] == a.itemsize
        assert a.base is not None  # a view
    cache = layer.new_kv_cache(2, 8)
    layer(x, kv_cache=cache, is_causal=True)
    _, k, v, _ = seen[-1]
    assert np.shares_memory(k, cache._key) and np.shares_memory(v, cache._value)


def test_weight_attributes_are_numpy_and_assignable():
    layer = MHA(8, 2, num_kv_heads=1, kdim=3, seed=0)
    assert isinstance(layer.q_proj.weight, np.ndarray)
    assert layer.k_proj.weight.shape == (4, 3) and layer.v_proj.weight.shape == (4, 8)
    layer.q_proj.weight = np.eye(8)  # any float array of the right shape, converted
    assert layer.q_proj.weight.dtype == np.float32
    layer.q_proj.weight[0, 0] = 2.0  # or edit in place
    assert layer.q_proj.weight[0, 0] == 2.0
    assert "embed_dim=8" in repr(layer) and "k_proj" in repr(layer.k_proj)


# --------------------------------------------------------------------------------------
# KV cache


def test_kv_cache_prefill_then_decode_gqa_with_masks():
    rng = np.random.default_rng(6)
    layer = random_biases(MHA(24, 6, num_kv_heads=2, seed=0), rng)
    x = randn(rng, (2, 10, 24))
    cache = layer.new_kv_cache(2, 12)
    assert repr(cache).startswith("KVCache(batch=2, length=0, max_len=12")
    full, full_w = layer(x, is_causal=True, need_weights=True)
    tol, w_tol = mha_tolerances(layer, x)
    pre, pre_w = layer(x[:, :6], kv_cache=cache, is_causal=True, need_weights=True)
    assert_close(pre, full[:, :6], 2 * tol)
    assert pre_w.shape == (2, 6, 6)
    for i in range(6, 10):
        step, w = layer(x[:, i : i + 1], kv_cache=cache, is_causal=True, need_weights=True)
        assert w.shape == (2, 1, i + 1)
        assert_close(step, full[:, i : i + 1], 2 * tol)
        assert_close(w, full_w[:, i : i + 1, : i + 1], 2 * w_tol, "weights")
    assert len(cache) == 10 and cache.key.shape == (2, 2, 10, 4)
    # the cache holds the projected keys/values
    k_ref = (
        (x.astype(np.float64) @ layer.k_proj.weight.T.astype(np.float64) + layer.k_proj.bias)
        .reshape(2, 10, 2, 4)
        .swapaxes(1, 2)
    )
    np.testing.assert_allclose(cache.key, k_ref, rtol=1e-5, atol=1e-5)

    # masks and valid_lens see every cached key: compare with the reference
    cache.reset()
    layer(x[:, :9], kv_cache=cache, is_causal=True)
    mask = rng.random((2, 1, 1, 10)) < 0.8
    step = layer(x[:, 9:], kv_cache=cache, attn_mask=mask, valid_lens=np.array([10, 4]))
    cache.reset()
    ref = reference_call(layer, x, attn_mask=mask, valid_lens=np.array([10, 4]))[:, 9:]
    assert_close(step, ref, 2 * tol)


def test_kv_cache_cross_inputs_and_unbatched():
    rng = np.random.default_rng(8)
    layer = MHA(8, 2, kdim=5, vdim=5, seed=0)
    memory = randn(rng, (7, 5))
    q = randn(rng, (3, 8))
    cache = layer.new_kv_cache(1, 7)
    layer(q[:1], memory[:4], kv_cache=cache)  # append 4 memory positions
    out = layer(q, memory[4:], kv_cache=cache)  # 3 more; attend all 7
    tol, _ = mha_tolerances(layer, q, memory)
    assert_close(out, reference_call(layer, q, memory), 2 * tol)


def test_kv_cache_full_is_an_error_and_leaves_the_cache_intact():
    layer = MHA(8, 2, seed=0)
    rng = np.random.default_rng(9)
    x = randn(rng, (1, 5, 8))
    cache = layer.new_kv_cache(1, 4)
    layer(x[:, :3], kv_cache=cache, is_causal=True)
    before = cache.key.copy()
    with pytest.raises(
        ValueError,
        match=r"kv_cache is full: appending 2 positions to the 3 "
        r"cached would exceed its max_len=4",
    ):
        layer(x[:, 3:5], kv_cache=cache, is_causal=True)
    assert len(cache) == 3
    np.testing.assert_array_equal(cache.key, before)
    # a call that fails in the kernel's checks leaves the length alone too
    with pytest.raises(ValueError, match="attn_mask"):
        layer(x[:, 3:4], kv_cache=cache, attn_mask=np.ones((3, 3), bool))
    assert len(cache) == 3
    layer(x[:, 3:4], kv_cache=cache, is_causal=True)
    assert len(cache) == 4
    with pytest.raises(ValueError, match="kv_cache is full"):
        layer(x[:, 4:5], kv_cache=cache, is_causal=True)


@pytest.mark.parametrize(
    "bad, error, message",
    [
        ("not a cache", TypeError, "kv_cache must be a KVCache"),
        ("batch", ValueError, "kv_cache was made for batch=3 but the inputs have batch size 1"),
        ("heads", ValueError, "kv_cache holds num_kv_heads=1, head_dim=4"),
        ("dtype", ValueError, "dtype=float64"),
    ],
)
def test_kv_cache_mismatch_errors(bad, error, message):
    layer = MHA(8, 2, seed=0)
    cache = {
        "not a cache": object(),
        "batch": layer.new_kv_cache(3, 4),
        "heads": MHA(8, 2, num_kv_heads=1).new_kv_cache(1, 4),
        "dtype": MHA(8, 2, dtype=np.float64).new_kv_cache(1, 4),
    }[bad]
    with pytest.raises(error, match=re.escape(message)):
        layer(np.ones((1, 1, 8), np.float32), kv_cache=cache)


# --------------------------------------------------------------------------------------
# Bad input: errors name the argument


def _layer():
    return MHA(8, 2, seed=0)


X = np.ones((2, 3, 8), np.float32)

BAD_CALLS = {
    "embed_dim": (lambda: MHA(0, 1), ValueError, "embed_dim must be >= 1"),
    "embed_dim type": (lambda: MHA(8.0, 2), TypeError, "embed_dim must be an int"),
    "num_heads bool": (lambda: MHA(8, True), TypeError, "num_heads must be an int"),
    "heads divide": (lambda: MHA(8, 3), ValueError, "num_heads=3 does not divide embed_dim=8"),
    "kv heads divide": (
        lambda: MHA(8, 4, num_kv_heads=3),
        ValueError,
        "num_kv_heads=3 does not divide num_heads=4",
    ),
    "kdim": (lambda: MHA(8, 2, kdim=-1), ValueError, "kdim must be >= 1"),
    "bias": (lambda: MHA(8, 2, bias=1), TypeError, "bias must be True or False"),
    "dtype": (lambda: MHA(8, 2, dtype=np.int32), TypeError, "dtype must be float16"),
    "seed": (lambda: MHA(8, 2, seed="x"), TypeError, "seed must be None"),
    "query features": (
        lambda: _layer()(np.ones((2, 3, 7))),
        ValueError,
        "query must have shape (B, L, 8) or (L, 8) (embed_dim=8), got shape (2, 3, 7)",
    ),
    "query ndim": (lambda: _layer()(np.ones((1, 2, 3, 8))), ValueError, "query must have"),
    "query 1-D": (lambda: _layer()(np.ones(8)), ValueError, "query must have at least 2"),
    "query dtype": (
        lambda: _layer()(np.ones((3, 8), int)),
        TypeError,
        "query must be a floating-point array",
    ),
    "key features": (
        lambda: _layer()(X, np.ones((2, 3, 5))),
        ValueError,
        "key must have shape (B, L, 8)",
    ),
    "key batch": (
        lambda: _layer()(X, np.ones((1, 3, 8))),
        ValueError,
        "key has batch size 1 but query has 2",
    ),
    "key ndim": (
        lambda: _layer()(X, np.ones((3, 8))),
        ValueError,
        "key has shape (3, 8) but query has shape (2, 3, 8)",
    ),
    "value length": (
        lambda: _layer()(X, X, np.ones((2, 4, 8))),
        ValueError,
        "value has 4 positions but key has 3",
    ),
    "key default": (
        lambda: MHA(8, 2, kdim=4)(X),
        ValueError,
        "key defaults to query, whose feature size 8 is not kdim=4",
    ),
    "value default": (
        lambda: MHA(8, 2, kdim=4, vdim=6)(X, np.ones((2, 3, 4))),
        ValueError,
        "value defaults to key, whose feature size 4 is not vdim=6",
    ),
    "attn_mask shape": (
        lambda: _layer()(X, attn_mask=np.ones((4, 3), bool)),
        ValueError,
        "attn_mask of shape (4, 3) does not broadcast",
    ),
    "attn_mask dtype": (
        lambda: _layer()(X, attn_mask=np.ones((3, 3), int)),
        TypeError,
        "attn_mask must be a bool array",
    ),
    "attn_mask unbatched": (
        lambda: _layer()(X[0], attn_mask=np.ones((1, 2, 3, 3), bool)),
        ValueError,
        "attn_mask of shape (1, 2, 3, 3) has more dims",
    ),
    "valid_lens shape": (
        lambda: _layer()(X, valid_lens=np.ones((2, 4), int)),
        ValueError,
        "valid_lens of shape (2, 4) does not fit the queries' shape (2, 3)",
    ),
    "valid_lens dtype": (
        lambda: _layer()(X, valid_lens=np.ones(2)),
        TypeError,
        "valid_lens must be an integer array",
    ),
    "valid_lens range": (
        lambda: _layer()(X, valid_lens=np.array([1, 4])),
        ValueError,
        "valid_lens must lie in [0, 3]",
    ),
    "is_causal": (lambda: _layer()(X, is_causal=1), TypeError, "is_causal must be True"),
    "need_weights": (
        lambda: _layer()(X, need_weights="yes"),
        TypeError,
        "need_weights must be True",
    ),
    "average": (
        lambda: _layer()(X, average_attn_weights=None),
        TypeError,
        "average_attn_weights must be True",
    ),
    "num_threads": (lambda: _layer()(X, num_threads=0), ValueError, "num_threads must be >="),
    "weight shape": (
        lambda: setattr(_layer().q_proj, "weight", np.ones((8, 7))),
        ValueError,
        "q_proj.weight must have shape (8, 8)",
    ),
    "bias shape": (
        lambda: setattr(_layer().v_proj, "bias", np.ones(3)),
        ValueError,
        "v_proj.bias must have shape (8,)",
    ),
    "no bias": (
        lambda: setattr(MHA(8, 2, bias=False).out_proj, "bias", np.ones(8)),
        ValueError,
        "out_proj has no bias",
    ),
    "cache batch": (lambda: _layer().new_kv_cache(0, 4), ValueError, "batch must be >= 1"),
    "cache max_len": (lambda: _layer().new_kv_cache(1, 2.5), TypeError, "max_len must be an int"),
}

E8 = np.ones((8, 8), np.float32)
PACKED = {"in_proj_weight": np.ones((24, 8), np.float32), "out_proj.weight": E8}
BAD_STATE_DICTS = {
    "not a mapping": ([1, 2], TypeError, "state_dict must be a mapping"),
    "bias_kv": ({**PACKED, "bias_k": np.ones((1, 1, 8))}, ValueError, "add_bias_kv=True"),
    "prefix": (
        {"attn.in_proj_weight": PACKED["in_proj_weight"]},
        ValueError,
        "unexpected keys ['attn.in_proj_weight']",
    ),
    "no out_proj": (
        {"in_proj_weight": PACKED["in_proj_weight"]},
        ValueError,
        "state_dict has no 'out_proj.weight'",
    ),
    "no in_proj": ({"out_proj.weight": E8}, ValueError, "neither 'in_proj_weight'"),
    "in_proj shape": (
        {**PACKED, "in_proj_weight": np.ones((16, 8))},
        ValueError,
        "state_dict['in_proj_weight'] must have shape (3E, E) = (24, 8)",
    ),
    "k_proj shape": (
        {
            "q_proj_weight": E8,
            "k_proj_weight": np.ones((4, 3)),
            "v_proj_weight": E8,
            "out_proj.weight": E8,
        },
        ValueError,
        "state_dict['k_proj_weight'] must have shape (E, kdim) with E=8",
    ),
    "one bias": (
        {**PACKED, "out_proj.bias": np.ones(8)},
        ValueError,
        "both 'in_proj_bias' and 'out_proj.bias' or neither",
    ),
    "bias shape": (
        {**PACKED, "out_proj.bias": np.ones(8), "in_proj_bias": np.ones(8)},
        ValueError,
        "state_dict['in_proj_bias'] must have shape (24,)",
    ),
    "int weights": (
        {**PACKED, "out_proj.weight": np.ones((8, 8), int)},
        TypeError,
        "state_dict['out_proj.weight'] must be a floating-point array",
    ),
    "heads": (PACKED, ValueError, "num_heads=3 does not divide embed_dim=8"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_names_the_argument(case):
    fn, error, message = BAD_CALLS[case]
    with pytest.raises(error, match=re.escape(message)):
        fn()


@pytest.mark.parametrize("case", sorted(BAD_STATE_DICTS))
def test_from_torch_bad_state_dict(case):
    sd, error, message = BAD_STATE_DICTS[case]
    with pytest.raises(error, match=re.escape(message)):
        MHA.from_torch(sd, 3 if case == "heads" else 2)


def test_state_dict_of_a_gqa_layer_is_refused():
    with pytest.raises(ValueError, match="num_kv_heads=1 != num_heads=2"):
        MHA(8, 2, num_kv_heads=1).state_dict()


@pytest.mark.parametrize(
    "case",
    [
        "query features",
        "key batch",
        "value length",
        "valid_lens shape",
        "attn_mask unbatched",
        "is_causal",
    ],
)
def test_reference_raises_the_same_errors(case):
    """The reference twin goes through the same checks."""
    fn, error, message = BAD_CALLS[case]
    layer = _layer()
    calls = {
        "query features": lambda: reference_call(layer, np.ones((2, 3, 7))),
        "key batch": lambda: reference_call(layer, X, np.ones((1, 3, 8))),
        "value length": lambda: reference_call(layer, X, X, np.ones((2, 4, 8))),
        "valid_lens shape": lambda: reference_call(layer, X, valid_lens=np.ones((2, 4), int)),
        "attn_mask unbatched": lambda: reference_call(
            layer, X[0], attn_mask=np.ones((1, 2, 3, 3), bool)
        ),
        "is_causal": lambda: reference_call(layer, X, is_causal=1),
    }
    with pytest.raises(error, match=re.escape(message)):
        calls[case]()


@pytest.mark.parametrize(
    "weights, message",
    [
        ({"q_weight": np.ones((8, 6))}, "q_weight must have shape (E, E) = (6, 6)"),
        ({"out_weight": np.ones((8, 4))}, "out_weight must have shape (E, E) = (8, 8)"),
        ({"k_weight": np.ones((6, 8))}, "k_weight has 6 out_features, not a positive multiple"),
        ({"v_weight": np.ones((4, 8))}, "v_weight has 4 out_features but k_weight has 8"),
        ({"q_bias": np.ones(3)}, "q_bias must have shape (8,)"),
        ({"k_weight": np.ones(8)}, "k_weight must have at least 2 dimensions"),
    ],
)
def test_reference_weight_errors(weights, message):
    kw = {**layer_weights(_layer()), "k_bias": None, "v_bias": None, **weights}
    with pytest.raises(ValueError, match=re.escape(message)):
        reference.multi_head_attention(X, **kw)


# --------------------------------------------------------------------------------------
# plot_attention and doctests


@pytest.fixture
def agg():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def test_plot_attention_draws_a_labelled_heatmap(agg):
    layer = MHA(8, 2, seed=0)
    x = randn(np.random.default_rng(0), (4, 8))
    _, w = layer(x, need_weights=True)
    fig, ax = agg.subplots()
    image = fastattn.plot_attention(w, x_labels="abcd", y_labels=["A", "B", "C", "D"], ax=ax)
    np.testing.assert_array_equal(image.get_array(), w.astype(np.float64))
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcd")
    assert [t.get_text() for t in ax.get_yticklabels()] == list("ABCD")
    assert len(fig.axes) == 2  # the heatmap and its colour bar
    image = fastattn.plot_attention(w[:, :3], colorbar=False)  # on pyplot's current axes
    assert image.axes is agg.gca()


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((np.ones((2, 2, 2)),), ValueError, "weights must be 2-D (Lq, Lk), got shape (2, 2, 2)"),
        ((np.ones((2, 3)), ["a", "b"]), ValueError, "x_labels has 2 labels but weights has 3"),
        ((np.ones((2, 3)), None, ["a"]), ValueError, "y_labels has 1 labels but weights has 2"),
        ((np.ones((2, 3), complex),), TypeError, "weights must be a real-valued array"),
    ],
)
def test_plot_attention_errors(args, error, message):
    with pytest.raises(error, match=re.escape(message)):
        fastattn.plot_attention(*args)


def test_plot_attention_without_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=re.escape('pip install "fastattn[plot]"')):
        fastattn.plot_attention(np.ones((2, 2)))


@pytest.mark.parametrize("module", ["fastattn._mha", "fastattn._plot", "fastattn.reference"])
def test_doctests(module):
    if module == "fastattn._plot":
        pytest.importorskip("matplotlib")
    mod = sys.modules[module]
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, report=True)
    assert result.attempted > 0 and result.failed == 0


def test_public_names():
    for name in ("MultiHeadAttention", "KVCache", "plot_attention"):
        assert name in fastattn.__all__ and hasattr(fastattn, name)
    assert "multi_head_attention" in reference.__all__

"""fastattn.scaled_dot_product_attention_backward against its float64 twin
(fastattn.reference, itself checked against finite differences in test_reference_grad.py),
on every ISA, every forward option, and the properties the kernel promises.

Tolerances. float64: within 1e-10 of the largest entry of the reference gradient (the
kernel recomputes the weights with a polynomial exp2 accurate to a few ulp, and sums each
entry over at most Lq or Lk terms). float32: each gradient entry is a sum over at most
max(Lq, Lk) <= 40 terms, each a product of a few factors carrying a relative rounding of
a few float32 ulp (the recomputed weights, D = rowsum(grad_out * out) from the float32
forward output, tanh for a softcap); the worst case ~ 40 * 8 * 6e-8 ~ 2e-5 of the largest
term, bounded here by 1e-4 of the largest reference entry (plus that much absolute, for
gradients near zero).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

TOL = {np.float64: 1e-10, np.float32: 1e-4}


def _check(got, want, dtype):
    assert len(got) == len(want)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        # inputs are standard normal, so each gradient's terms are of order 0.01 to 1: a
        # gradient that cancels to ~0 (one visible key: dq = 0) is judged by that floor
        scale = max(float(np.abs(w).max(initial=0.0)), 1.0 if dtype == np.float32 else 1e-2)
        err = float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max(initial=0.0))
        assert err <= TOL[dtype] * scale, (name, err, scale)


@st.composite
def cases(draw):
    hkv = draw(st.sampled_from([1, 2]))
    return {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "dtype": draw(st.sampled_from([np.float32, np.float64])),
        "batch_q": draw(st.sampled_from([(), (2,), (1,)])),
        "batch_kv": draw(st.sampled_from([(), (2,)])),
        "hkv": hkv,
        "hq": hkv * draw(st.sampled_from([1, 3])),
        "lq": draw(st.sampled_from([1, 2, 7, 33])),
        "lk": draw(st.sampled_from([1, 5, 40])),
        "e": draw(st.sampled_from([1, 8, 19])),
        "ev": draw(st.sampled_from([3, 16])),
        "mask": draw(st.sampled_from([None, "bool", "float"])),
        "valid_lens": draw(st.booleans()),
        "causal": draw(st.booleans()),
        "alignment": draw(st.sampled_from(["top_left", "bottom_right"])),
        "window": draw(st.sampled_from([None, (3, None), (2, 1)])),
        "softcap": draw(st.sampled_from([None, 2.0])),
        "sinks": draw(st.booleans()),
        "alibi": draw(st.booleans()),
    }


def _call(case):
    rng = np.random.default_rng(case["seed"])
    dt = case["dtype"]
    bq, bkv = case["batch_q"], case["batch_kv"]
    hq, hkv, lq, lk = case["hq"], case["hkv"], case["lq"], case["lk"]
    q = rng.standard_normal(bq + (hq, lq, case["e"])).astype(dt)
    k = rng.standard_normal(bkv + (hkv, lk, case["e"])).astype(dt)
    v = rng.standard_normal(bkv + (hkv, lk, case["ev"])).astype(dt)
    rows = np.broadcast_shapes(bq, bkv) + (hq, lq)
    kw = {
        "is_causal": case["causal"],
        "causal_alignment": case["alignment"],
        "window": case["window"],
        "softcap": case["softcap"],
    }
    if case["mask"] == "bool":
        kw["attn_mask"] = rng.random(rows + (lk,)) < 0.8
    elif case["mask"] == "float":
        m = rng.standard_normal((lq, lk)).astype(dt)
        m[rng.random(m.shape) < 0.2] = -np.inf
        kw["attn_mask"] = m
    if case["valid_lens"]:
        kw["valid_lens"] = rng.integers(0, lk + 1, size=rows[:-2] + (hq,))
    if case["sinks"]:
        kw["sinks"] = rng.standard_normal(hq).astype(dt)
    if case["alibi"]:
        kw["alibi_slopes"] = rng.uniform(0.05, 0.5, hq).astype(dt)
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, **kw, return_lse=True)
    g = rng.standard_normal(out.shape).astype(dt)
    return (g, q, k, v, out, lse), kw


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_backward_matches_reference(isa, case):
    call, kw = _call(case)
    got = fastattn.scaled_dot_product_attention_backward(*call, **kw)
    want = reference.scaled_dot_product_attention_backward(*call, **kw)
    _check(got, want, case["dtype"])


def test_bit_identical_for_any_thread_count():
    """A long head (its keys cut into several chunks, each with its own dQ accumulator)
    and a GQA call (tasks per kv head): the same bits on 1, 2 and 3 threads."""
    rng = np.random.default_rng(3)
    for shape_q, shape_kv in (((1, 1, 700, 24), (1, 1, 900, 24)), ((2, 6, 90, 16), (2, 2, 90, 16))):
        q = rng.standard_normal(shape_q).astype(np.float32)
        k, v = (rng.standard_normal(shape_kv).astype(np.float32) for _ in range(2))
        out, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
        g = rng.standard_normal(out.shape).astype(np.float32)
        runs = [
            fastattn.scaled_dot_product_attention_backward(
                g, q, k, v, out, lse, is_causal=True, num_threads=n
            )
            for n in (1, 2, 3)
        ]
        for other in runs[1:]:
            for a, b in zip(runs[0], other):
                assert a.tobytes() == b.tobytes()


def test_rows_read_in_place_match_rows_copied(isa):
    """Whole 64-row blocks of one head whose q and grad_out rows lie packed are read in
    place and their dQ accumulated in place; the same arrays as strided views (rows not
    packed) go through the copies: the same bits, and the reference's gradients. E = 64
    (dQ accumulated in dq itself) and E = 40 (in a padded accumulator), float32 and
    float64, full and causal, 2 heads, Lq = 192, Lk = 300 (a partial key block)."""
    rng = np.random.default_rng(6)
    for dt, e, causal in ((np.float32, 64, False), (np.float32, 40, True), (np.float64, 64, True)):
        wide = [rng.standard_normal((2, n, 2 * e)).astype(dt) for n in (192, 300, 300, 192)]
        strided = [a[..., :e] for a in wide]
        packed = [np.ascontiguousarray(a) for a in strided]
        q, k, v, _ = packed
        out, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True)
        g, gs = packed[3], strided[3]
        got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, is_causal=causal)
        via_copies = fastattn.scaled_dot_product_attention_backward(
            gs, strided[0], k, v, out, lse, is_causal=causal
        )
        for a, b in zip(got, via_copies):
            assert a.tobytes() == b.tobytes()
        want = reference.scaled_dot_product_attention_backward(
            g, q, k, v, out, lse, is_causal=causal
        )
        _check(got, want, dt)


def test_causal_diagonal_tiles_match_reference(isa):
    """Pairs on a causal diagonal compute each register tile of rows only up to the last
    key its rows see, and dK/dV skip the tiles before a key's first row: both alignments,
    Lq above and below Lk, a window, float32 and float64 (one batch of 2 heads; rows past
    the first key block's diagonal read the scratch a previous pair left)."""
    rng = np.random.default_rng(7)
    for dt, lq, lk, kw in (
        (np.float64, 200, 300, {"is_causal": True}),
        (np.float32, 300, 200, {"is_causal": True, "causal_alignment": "bottom_right"}),
        (np.float64, 260, 260, {"window": (70, 0)}),
    ):
        q = rng.standard_normal((2, lq, 24)).astype(dt)
        k, v = (rng.standard_normal((2, lk, 24)).astype(dt) for _ in range(2))
        out, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        g = rng.standard_normal(out.shape).astype(dt)
        got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
        want = reference.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
        _check(got, want, dt)


def test_long_head_matches_reference(isa):
    """Several key chunks (their dQ accumulators summed at the end) and blocks of both
    sizes' remainders: 1 head, Lq = 150, Lk = 333, float64."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 150, 8))
    k, v = rng.standard_normal((1, 333, 8)), rng.standard_normal((1, 333, 8))
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, window=(100, 20), return_lse=True)
    g = rng.standard_normal(out.shape)
    got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, window=(100, 20))
    want = reference.scaled_dot_product_attention_backward(g, q, k, v, out, lse, window=(100, 20))
    _check(got, want, np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_key_gradients_match_reference(isa, dtype):
    """dK and dV of 4 MiB or more are written out with non-temporal stores: 1 head,
    Lk = 8200 (a last key block of 8), E = 64, bottom-right aligned; float64 causal, float32
    a window of 21 keys (each dQ entry a sum of at most 40 terms, as the tolerance assumes)."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 24, 64)).astype(dtype)
    k, v = (rng.standard_normal((1, 8200, 64)).astype(dtype) for _ in range(2))
    kw = {"causal_alignment": "bottom_right"}
    kw.update({"is_causal": True} if dtype == np.float64 else {"window": (20, 0)})
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    g = rng.standard_normal(out.shape).astype(dtype)
    got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
    want = reference.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
    assert np.abs(got[1][0, -40:]).min() > 0  # keys the rows see: written, not left zero
    _check(got, want, dtype)


def test_block_mask_gives_the_plain_masks_gradients():
    rng = np.random.default_rng(5)
    lq = lk = 256
    blocks = rng.random((lq // 64, lk // 64)) < 0.5
    mask = np.repeat(np.repeat(blocks, 64, 0), 64, 1) & (rng.random((lq, lk)) < 0.9)
    q, k, v = (rng.standard_normal((2, lq, 16)) for _ in range(3))
    bm = fastattn.block_mask(mask)
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, bm, return_lse=True)
    g = rng.standard_normal(out.shape)
    got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, bm)
    plain = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, mask)
    for a, b in zip(got, plain):
        assert a.tobytes() == b.tobytes()  # skipping a hidden tile changes no bit
    want = reference.scaled_dot_product_attention_backward(g, q, k, v, out, lse, mask)
    _check(got, want, np.float64)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_inputs_computed_in_float32(isa, dtype):
    """float16/bfloat16 storage: read as stored, computed in float32, returned in the input's
    dtype; against the float64 twin on the same (16-bit) values. Two roundings to the
    16-bit type separate them: each result's own (half an ulp, u = 2^-11 float16, 2^-8
    bfloat16, either side of a rounding boundary: up to 2u apart), and the forward output
    ``out`` the kernel reads for D = rowsum(grad_out * out), rounded by u, which moves
    every dS term by about u of the gradient's scale: 2u relative plus 2u of the largest
    entry."""
    ml_dtypes = pytest.importorskip("ml_dtypes") if dtype == "bfloat16" else None
    dt = np.dtype(ml_dtypes.bfloat16) if ml_dtypes else np.dtype(np.float16)
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 2, 37, 16)).astype(dt) for _ in range(3))
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    g = rng.standard_normal(out.shape).astype(dt)
    got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, is_causal=True)
    want = reference.scaled_dot_product_attention_backward(g, q, k, v, out, lse, is_causal=True)
    rel = 2.0**-8 if ml_dtypes else 2.0**-11
    for a, w in zip(got, want):
        assert a.dtype == dt
        a64, w64 = a.astype(np.float64), w.astype(np.float32).astype(np.float64)
        assert np.all(np.abs(a64 - w64) <= 2 * rel * (np.abs(w64) + np.abs(w64).max()))


def test_decode_shape_gqa(isa):
    """One query row (decoding) with a GQA group, bottom-right causal, float32."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 8, 1, 32)).astype(np.float32)
    k, v = (rng.standard_normal((3, 2, 50, 32)).astype(np.float32) for _ in range(2))
    kw = {"is_causal": True, "causal_alignment": "bottom_right"}
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, **kw, return_lse=True)
    g = rng.standard_normal(out.shape).astype(np.float32)
    got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
    _check(
        got, reference.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw), np.float32
    )


@pytest.mark.parametrize(
    "fn",
    [
        fastattn.scaled_dot_product_attention_backward,
        reference.scaled_dot_product_attention_backward,
    ],
)
def test_errors_name_the_argument(fn):
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"grad_out must have the shape of the forward's output"):
        fn(out[:, :2], q, k, v, out, lse)
    with pytest.raises(ValueError, match=r"lse must have the shape"):
        fn(out, q, k, v, out, lse[0])
    with pytest.raises(
        TypeError, match=r"key is int8 \(a quantised cache\), which has no gradient"
    ):
        fn(out, q, k.astype(np.int8), v.astype(np.int8), out, lse)
    with pytest.raises(ValueError, match="is_causal|causal_alignment"):
        fn(out, q, k, v, out, lse, causal_alignment="middle")


def test_against_torch_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    q = rng.standard_normal((2, 4, 20, 16))
    k, v = rng.standard_normal((2, 2, 30, 16)), rng.standard_normal((2, 2, 30, 16))
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    g = rng.standard_normal(out.shape)
    got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, is_causal=True)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    to = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, is_causal=True, enable_gqa=True
    )
    to.backward(torch.tensor(g))
    for a, t in zip(got, (tq, tk, tv)):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("module", [fastattn, reference])
def test_no_features_refused_as_the_forward_does(module):
    """E = 0 is outside the contract (docs/semantics.md: E >= 1): every backward refuses it
    with its forward's message, the fast functions and their twins alike."""
    q, k, v = np.ones((3, 2, 0)), np.ones((3, 2, 0)), np.ones((3, 2, 4))
    out, lse, cu = np.zeros((3, 2, 4)), np.zeros((3, 2)), np.array([0, 3])
    calls = (
        (module.scaled_dot_product_attention, (q, k, v)),
        (module.scaled_dot_product_attention_backward, (out, q, k, v, out, lse)),
        (module.varlen_attention, (q, k, v, cu, cu)),
        (module.varlen_attention_backward, (out, q, k, v, out, lse, cu, cu)),
    )
    for fn, call in calls:
        with pytest.raises(ValueError, match=r"feature size E >= 1"):
            fn(*call)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    empty=st.sampled_from(["batch", "lq", "lk", "ev"]),
    mask=st.sampled_from([None, "bool", "float"]),
    causal=st.booleans(),
    sinks=st.booleans(),
    alibi=st.booleans(),
)
def test_empty_shapes_computed_without_the_reference(seed, empty, mask, causal, sinks, alibi):
    """A call with nothing to compute (no batch entry, query row, key or value feature)
    gives the twin's gradients -- zeros, and the sinks' (0: D = 0 without values or keys)
    in their shapes -- by the fast path alone: the float64 reference is made unreachable
    while it runs."""
    from unittest import mock

    rng = np.random.default_rng(seed)
    b, lq, lk, ev = (
        0 if empty == x else n for x, n in (("batch", 2), ("lq", 5), ("lk", 6), ("ev", 3))
    )
    q = rng.standard_normal((b, 2, lq, 4))
    k = rng.standard_normal((b, 2, lk, 4))
    v = rng.standard_normal((b, 2, lk, ev))
    kw = {"is_causal": causal}
    if mask == "bool":
        kw["attn_mask"] = rng.random((lq, lk)) < 0.7
    elif mask == "float":
        kw["attn_mask"] = rng.standard_normal((lq, lk))
    if sinks:
        kw["sinks"] = rng.standard_normal(2)
    if alibi:
        kw["alibi_slopes"] = rng.uniform(0.1, 0.5, 2)
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, **kw, return_lse=True)
    g = rng.standard_normal(out.shape)
    want = reference.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
    unreachable = mock.Mock(side_effect=AssertionError("the fast path called the reference"))
    with mock.patch.multiple(
        reference,
        scaled_dot_product_attention_backward=unreachable,
        varlen_attention_backward=unreachable,
    ):
        got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
    _check(got, want, np.float64)


def test_every_gradient_entry_written(isa, monkeypatch):
    """The gradients are allocated uninitialised (np.empty) and the kernel writes every
    entry, zeros included: with np.empty handing out NaN-filled arrays, still the
    reference's gradients. Rows with no visible key (valid_lens 0), keys no row sees
    (top-left causal, Lk > Lq), a padded dQ accumulator (E = 40), a long head's key chunks,
    GQA, and varlen sequences without queries or keys."""
    real_empty = np.empty

    def nan_empty(shape, dtype=float, **kw):
        a = real_empty(shape, dtype, **kw)
        a.fill(np.nan)
        return a

    rng = np.random.default_rng(9)
    for dt, hq, hkv, lq, lk, e, kw in (
        (
            np.float64,
            4,
            2,
            70,
            150,
            40,
            {"is_causal": True, "valid_lens": np.array([0, 3, 150, 9])},
        ),
        (np.float32, 1, 1, 40, 700, 64, {"window": (30, 0), "causal_alignment": "bottom_right"}),
    ):
        q = rng.standard_normal((hq, lq, e)).astype(dt)
        k, v = (rng.standard_normal((hkv, lk, e)).astype(dt) for _ in range(2))
        out, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        g = rng.standard_normal(out.shape).astype(dt)
        with monkeypatch.context() as m:
            m.setattr(np, "empty", nan_empty)
            got = fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
        want = reference.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **kw)
        _check(got, want, dt)
    cu_q, cu_k = np.array([0, 0, 30, 30, 75]), np.array([0, 20, 60, 60, 120])
    q = rng.standard_normal((75, 2, 16))
    k, v = (rng.standard_normal((120, 1, 16)) for _ in range(2))
    out, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, return_lse=True)
    g = rng.standard_normal(out.shape)
    with monkeypatch.context() as m:
        m.setattr(np, "empty", nan_empty)
        got = fastattn.varlen_attention_backward(g, q, k, v, out, lse, cu_q, cu_k, is_causal=True)
    want = reference.varlen_attention_backward(g, q, k, v, out, lse, cu_q, cu_k, is_causal=True)
    _check(got, want, np.float64)

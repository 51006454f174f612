"""Edge inputs at every public function: empty and tiny shapes, huge head dims, fully masked
rows, NaN/inf where they are attended and where they must never be read, logits near the
float limits, read-only / byte-swapped / Fortran-ordered / unaligned inputs, out= aliasing an
input, and inputs of too few dimensions.

Every function is reached through one adapter (:data:`OPS`) that takes attention-shaped
``q (B, H, Lq, E)``, ``k (B, H, Lk, E)``, ``v (B, H, Lk, Ev)``: masked_softmax sees the
scores ``q k^T`` (formed in float64), nadaraya_watson reads ``q``/``k``/``v`` as query
points, key points and values, the MultiHeadAttention layer reads head 0 as ``(B, L, E)``.

Tolerance (:func:`tolerance`): the inputs have unit-norm rows (and the score parameters
norm <= 1), so every score is a sum of at most ``E + 8`` terms of magnitude <= 1 and is off
by at most ``(E + 8) eps`` in the compute dtype (the gamma_n bound); a softmax weight then
moves by at most 4 times that plus the rounding of the ``Lk``-term sums, and the output is
a convex combination of value rows. The layer's projections are bounded by
``layer.test_mha.mha_tolerances``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import fastattn
from fastattn import reference

from helpers.reliability_checks import active_isa, assert_close

HIDDEN = 8


def unit_rows(rng, shape, dtype=np.float64):
    x = rng.standard_normal(shape)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.where(norm > 0, norm, 1.0)).astype(dtype)


@functools.cache
def _score_params(e: int) -> dict:
    rng = np.random.default_rng(e)
    w = rng.standard_normal((e, e))
    w_q = rng.standard_normal((e, HIDDEN))
    w_k = rng.standard_normal((e, HIDDEN))
    w_v = rng.standard_normal(HIDDEN)
    # The Frobenius norm bounds the spectral norm: every matrix has norm <= 1.
    return {
        "weight": w / np.linalg.norm(w),
        "w_q": w_q / np.linalg.norm(w_q),
        "w_k": w_k / np.linalg.norm(w_k),
        "w_v": w_v / np.abs(w_v).sum(),
    }


def score_params(e: int, dtype) -> dict:
    """Weights of the general and additive scores with norms <= 1, fixed by ``e``."""
    return {name: w.astype(dtype) for name, w in _score_params(e).items()}


def scores_of(q, k):
    q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
    with np.errstate(all="ignore"):
        return (q64 @ np.swapaxes(k64, -1, -2)).astype(np.result_type(q, k))


@dataclass
class Op:
    """One public function seen through attention-shaped inputs."""

    name: str
    call: Callable  # (module, q, k, v, mask, valid_lens, **kw) -> result
    masks: bool = True  # takes attn_mask / valid_lens
    has_out: bool = True
    empty: float = 0.0  # the output of a row that attends nothing (0, or NaN)
    exact_reference: bool = True  # compare with the reference (else: only shapes/errors)

    def fast(self, *args, **kwargs):
        return self.call(fastattn, *args, **kwargs)

    def ref(self, *args, **kwargs):
        return self.call(reference, *args, **kwargs)


def _attention(score, normalize, **fixed):
    def call(mod, q, k, v, mask=None, valid_lens=None, **kw):
        extra = dict(fixed)
        params = score_params(np.shape(q)[-1] if np.ndim(q) else 1, np.result_type(q))
        if score == "general":
            extra["weight"] = params["weight"]
        if score == "additive":
            extra.update(w_q=params["w_q"], w_k=params["w_k"], w_v=params["w_v"])
        return mod.attention(
            q, k, v, mask, score=score, normalize=normalize, valid_lens=valid_lens, **extra, **kw
        )

    return call


def _sdpa(mod, q, k, v, mask=None, valid_lens=None, **kw):
    return mod.scaled_dot_product_attention(q, k, v, mask, valid_lens=valid_lens, **kw)


def _additive(mod, q, k, v, mask=None, valid_lens=None, **kw):
    p = score_params(np.shape(q)[-1] if np.ndim(q) else 1, np.result_type(q))
    return mod.additive_attention(
        q, k, v, p["w_q"], p["w_k"], p["w_v"], mask, valid_lens=valid_lens, **kw
    )


def _softmax(mod, q, k, v, mask=None, valid_lens=None, out=None, **kw):
    x = scores_of(q, k) if np.ndim(q) >= 2 and np.ndim(k) >= 2 else q
    if mask is not None:
        mask = np.broadcast_to(mask, np.shape(x))
    return mod.masked_softmax(x, valid_lens, mask=mask, out=out, **kw)


def _regression(kernel):
    def call(mod, q, k, v, mask=None, valid_lens=None, **kw):
        return mod.nadaraya_watson(q, k, v, kernel=kernel, bandwidth=2.5, **kw)

    return call


def _layer(mod, q, k, v, mask=None, valid_lens=None, out=None, **kw):
    q, k, v = (np.asarray(a) for a in (q, k, v))
    if q.ndim != 4:
        return fastattn.MultiHeadAttention(4, 1)(q)  # the layer's own error
    e, ev = q.shape[-1], v.shape[-1]
    layer = fastattn.MultiHeadAttention(
        e,
        1,
        kdim=e,
        vdim=ev,
        bias=False,
        dtype=np.result_type(q.dtype.newbyteorder("="), np.float32),
        seed=1,
    )
    if mod is fastattn:
        return layer(q[:, 0], k[:, 0], v[:, 0], attn_mask=mask, valid_lens=valid_lens, **kw)
    from layer.test_mha import layer_weights

    kw.pop("num_threads", None)
    return reference.multi_head_attention(
        q[:, 0],
        k[:, 0],
        v[:, 0],
        attn_mask=mask,
        valid_lens=valid_lens,
        **layer_weights(layer),
        **kw,
    )


OPS = [
    Op("sdpa", _sdpa),
    Op("attention-dot-softmax", _attention("dot", "softmax")),
    Op("attention-general-hardmax", _attention("general", "hardmax")),
    Op("attention-cosine-topk", _attention("cosine", "topk", top_k=2)),
    Op("attention-gaussian-softmax", _attention("gaussian", "softmax")),
    Op("attention-additive-topk", _attention("additive", "topk", top_k=3)),
    Op("additive_attention", _additive),
    Op("masked_softmax", _softmax),
    Op("nadaraya_watson-gaussian", _regression("gaussian"), masks=False, empty=math.nan),
    Op("nadaraya_watson-epanechnikov", _regression("epanechnikov"), masks=False, empty=math.nan),
    Op("MultiHeadAttention", _layer, has_out=False),
]
IDS = [op.name for op in OPS]
ALL = pytest.mark.parametrize("op", OPS, ids=IDS)
WITH_MASKS = pytest.mark.parametrize(
    "op", [op for op in OPS if op.masks], ids=[op.name for op in OPS if op.masks]
)
WITH_OUT = pytest.mark.parametrize(
    "op", [op for op in OPS if op.has_out], ids=[op.name for op in OPS if op.has_out]
)


def inputs(b=2, h=1, lq=5, lk=7, e=4, ev=3, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (
        unit_rows(rng, (b, h, lq, e), dtype),
        unit_rows(rng, (b, h, lk, e), dtype),
        rng.standard_normal((b, h, lk, ev)).astype(dtype),
    )


def tolerance(q, k, v, op: Op):
    """See the module docstring."""
    result = np.result_type(*(np.asarray(a).dtype.newbyteorder("=") for a in (q, k, v)))
    compute = np.dtype(np.float32) if result == np.float16 else result
    eps = float(np.finfo(compute).eps)
    e, lk = np.shape(q)[-1], np.shape(k)[-2]
    bound = 2.0 if "gaussian" in op.name else 1.0  # |q - k|^2 / 2 <= 2 for unit rows
    tol = eps * (4 * (e + 8) * bound + 32 + lk)
    v_max = float(np.abs(np.where(np.isfinite(v), v, 0)).max(initial=1.0))
    if op.name == "masked_softmax":
        v_max = 1.0
    tol *= max(v_max, 1.0)
    if result == np.float16:
        tol += 2 * float(np.finfo(np.float16).eps) * max(v_max, 1.0)
    return tol


def compare(op: Op, got, expected, q, k, v, **kwargs):
    """``got`` equals the reference within :func:`tolerance` (the layer: its own bound)."""
    if op.name == "MultiHeadAttention":
        from layer.test_mha import mha_tolerances

        # The bound from the finite entries (non-finite ones give non-finite outputs,
        # compared by position).
        q, k, v = (np.where(np.isfinite(a), a, 0).astype(np.asarray(a).dtype) for a in (q, k, v))
        layer = fastattn.MultiHeadAttention(
            q.shape[-1],
            1,
            kdim=q.shape[-1],
            vdim=v.shape[-1],
            bias=False,
            dtype=np.result_type(q.dtype, np.float32),
            seed=1,
        )
        tol, _ = mha_tolerances(layer, q[:, 0], k[:, 0], v[:, 0], attn_mask=kwargs.get("mask"))
    else:
        tol = tolerance(q, k, v, op)
    assert_close(op.name, got, expected, tol)


def run(op: Op, q, k, v, **kwargs):
    got = op.fast(q, k, v, **kwargs)
    expected = op.ref(q, k, v, **kwargs)
    compare(op, got, expected, q, k, v, **kwargs)
    return got, expected


# --------------------------------------------------------------------------------------
# Shapes


@ALL
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_queries(op, dtype):
    q, k, v = inputs(lq=0, dtype=dtype)
    got, _ = run(op, q, k, v)
    assert got.size == 0


@ALL
def test_no_keys(op):
    q, k, v = inputs(lk=0)
    got, expected = run(op, q, k, v)
    if op.name == "masked_softmax":
        assert got.size == 0
    elif math.isnan(op.empty):
        assert np.isnan(got).all()
    else:
        assert (got == 0).all()


@ALL
@pytest.mark.parametrize(
    "e, dtype", [(1, np.float32), (1, np.float64), (512, np.float64), (1024, np.float32)]
)
def test_head_dims(op, e, dtype):
    q, k, v = inputs(lq=9, lk=40, e=e, ev=5, dtype=dtype, seed=e)
    run(op, q, k, v)


@ALL
def test_single_element_everything(op):
    q, k, v = inputs(b=1, h=1, lq=1, lk=1, e=1, ev=1)
    got, _ = run(op, q, k, v)
    if op.name not in ("masked_softmax", "MultiHeadAttention") and np.isfinite(got).all():
        np.testing.assert_allclose(got.reshape(-1), v.reshape(-1), rtol=1e-6)


@ALL
@pytest.mark.parametrize("bad", ["0-d", "1-d"])
def test_too_few_dimensions(op, bad):
    q, k, v = inputs()
    small = np.float32(0.5) if bad == "0-d" else np.ones(4, np.float32)
    if op.name.startswith("nadaraya") and bad == "1-d":
        small = np.ones((4, 2), np.float32)  # 1-D points are scalar features: use 2-D
        with pytest.raises(ValueError, match="x_query"):  # features (2) != keys' (4)
            op.fast(small, k[0, 0], v[0, 0])
        return
    if op.name == "masked_softmax" and bad == "1-d":
        got = op.fast(small, k, v)  # a 1-D x is one row: fine
        assert got.shape == (4,)
        return
    with pytest.raises((ValueError, TypeError)) as fast:
        op.fast(small, k, v)
    assert str(fast.value)
    assert "fastattn._core" not in str(fast.value)
    name = {"masked_softmax": "x", "MultiHeadAttention": "query"}.get(op.name, "query")
    if op.name.startswith("nadaraya"):
        name = "x_query"
    assert name in str(fast.value), str(fast.value)


# --------------------------------------------------------------------------------------
# Masks


@WITH_MASKS
def test_all_masked(op):
    q, k, v = inputs()
    mask = np.zeros((2, 1, 5, 7), bool)
    got, _ = run(op, q, k, v, mask=mask)
    assert (got == 0).all()
    got, _ = run(op, q, k, v, valid_lens=np.zeros(2, np.int64))
    assert (got == 0).all()


@WITH_MASKS
@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_special_values_past_valid_lens_are_never_read(op, special):
    """Keys past a row's valid length may hold anything: the result is that of clean keys."""
    q, k, v = inputs()
    valid = np.array([3, 5])
    clean = op.fast(q, k, v, valid_lens=valid)
    k2, v2 = k.copy(), v.copy()
    for b, n in enumerate(valid):
        k2[b, :, n:] = special
        v2[b, :, n:] = special
    got = op.fast(q, k2, v2, valid_lens=valid)
    np.testing.assert_array_equal(got, clean)
    run(op, q, k2, v2, valid_lens=valid)


@WITH_MASKS
@pytest.mark.parametrize("special", [np.nan, np.inf])
def test_special_values_of_masked_keys_never_reach_the_output(op, special):
    q, k, v = inputs()
    mask = np.ones((1, 1, 1, 7), bool)
    mask[..., 2] = False
    v2 = v.copy()
    v2[:, :, 2] = special
    got, _ = run(op, q, k, v2, mask=mask)
    if op.name != "masked_softmax":
        assert np.isfinite(got).all()


@ALL
@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_nan_in_attended_positions(op, where):
    """NaN where a row reads it: the reference's answer (a NaN score makes its row NaN; a
    NaN value reaches every row that gives its key a weight; a compact kernel leaves a key
    at a NaN distance outside its support; hardmax/top-k read only the kept keys' values)."""
    q, k, v = inputs()
    arrays = {"query": q, "key": k, "value": v}
    arrays[where] = arrays[where].copy()
    arrays[where][0, 0, 1, 0] = np.nan
    got, _ = run(op, arrays["query"], arrays["key"], arrays["value"])
    row_nan = where in ("query", "key") and "epanechnikov" not in op.name
    weighs_all = not any(s in op.name for s in ("hardmax", "topk", "masked_softmax"))
    if row_nan or (where == "value" and weighs_all):
        assert np.isnan(got).any()


@ALL
def test_infinite_values_attended(op):
    q, k, v = inputs()
    v2 = v.copy()
    v2[0, 0, 3, 1] = np.inf
    run(op, q, k, v2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masked_softmax_logits_at_the_float_limits(dtype):
    big = float(np.finfo(dtype).max)
    x = np.array(
        [
            [big, big / 2, -big, -big / 2, 0.0],
            [-big, -big, -big, -big, -big],
            [big, big, 0.0, -big, -np.inf],
        ],
        dtype,
    )
    for isa in fastattn._core.available_isas():
        with active_isa(isa):
            got = fastattn.masked_softmax(x)
        expected = reference.masked_softmax(x)
        assert_close("masked_softmax", got, expected, 64 * float(np.finfo(dtype).eps))
    np.testing.assert_array_equal(got[1], np.full(5, 0.2, dtype))
    np.testing.assert_array_equal(got[2], [0.5, 0.5, 0, 0, 0])


# Functions whose softmax runs in the SDPA kernel (csrc/kernels/sdpa-inl.h).
SDPA_KERNEL = ("sdpa", "attention-dot-softmax", "attention-gaussian-softmax", "MultiHeadAttention")
FLOAT_MASK_OPS = [op for op in OPS if op.masks and op.name != "masked_softmax"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", FLOAT_MASK_OPS, ids=[op.name for op in FLOAT_MASK_OPS])
def test_huge_float_mask_entries(op, dtype):
    """A float mask of finfo.min on some keys (PyTorch's and Hugging Face's way to mask),
    of finfo.min / 4 on a whole row: the reference's answer (the mask is added to the
    scores, so a row masked alike everywhere is the softmax of its scores)."""
    q, k, v = inputs(dtype=dtype)
    mask = np.zeros((5, 7), dtype)
    mask[1, 2:] = np.finfo(dtype).min
    mask[2, :] = np.finfo(dtype).min / 4
    run(op, q, k, v, mask=mask)


# --------------------------------------------------------------------------------------
# Memory layouts and byte order


@ALL
def test_read_only_inputs(op):
    q, k, v = inputs()
    for a in (q, k, v):
        a.flags.writeable = False
    run(op, q, k, v)


@ALL
@pytest.mark.parametrize("dtype", ["f4", "f8", "f2"])
def test_non_native_byte_order(op, dtype):
    q, k, v = inputs(dtype=np.dtype(dtype))
    swapped = [a.astype(a.dtype.newbyteorder()) for a in (q, k, v)]
    got = op.fast(*swapped)
    np.testing.assert_array_equal(got, op.fast(q, k, v))
    assert got.dtype.isnative


@ALL
def test_fortran_ordered(op):
    q, k, v = inputs()
    got, _ = run(op, *(np.asfortranarray(a) for a in (q, k, v)))
    np.testing.assert_array_equal(got, op.fast(q, k, v))


@ALL
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unaligned_and_odd_strides(op, dtype):
    """Data not aligned to the item size, and strides that are not a multiple of it."""
    q, k, v = inputs(dtype=dtype)

    def unaligned(a):
        raw = np.zeros(a.nbytes + 1, np.uint8)
        u = raw[1:].view(a.dtype).reshape(a.shape)
        u[...] = a
        return u

    def packed(a):
        rec = np.zeros(a.shape, np.dtype([("pad", "u1"), ("x", a.dtype)]))
        rec["x"] = a
        return rec["x"]

    expected = op.fast(q, k, v)
    for make in (unaligned, packed):
        got = op.fast(*(make(a) for a in (q, k, v)))
        np.testing.assert_array_equal(got, expected)
    # one-element arrays are contiguous whatever their strides
    small = [make(a[:1, :1, :1]) for a, make in zip((q, k, v), (unaligned, packed, unaligned))]
    run(op, *small)


@WITH_OUT
def test_out_aliasing_an_input_is_refused(op):
    q, k, v = inputs(e=3, ev=3)
    if op.name == "masked_softmax":
        x = scores_of(q, k)
        with pytest.raises(ValueError, match="out shares memory with x"):
            fastattn.masked_softmax(x, out=x)
        with pytest.raises(ValueError, match="out shares memory with x"):
            fastattn.masked_softmax(x, out=x[::-1])
        return
    out = q.copy()
    name = "x_query" if op.name.startswith("nadaraya") else "query"
    with pytest.raises(ValueError, match=f"out shares memory with {name}"):
        op.fast(out, k, v, out=out)
    before = v.copy()
    with pytest.raises(ValueError, match="out shares memory with"):
        op.fast(q, k, v, out=v[:, :, :5])
    np.testing.assert_array_equal(v, before)


@WITH_OUT
def test_out_with_overlapping_elements_is_refused(op):
    """A writeable out= whose elements overlap (stride 0) would make threads race."""
    q, k, v = inputs()
    shape = np.shape(op.fast(q, k, v))
    base = np.zeros(int(np.prod(shape[1:])), np.float32)
    out = np.lib.stride_tricks.as_strided(
        base, shape, (0,) + tuple(np.zeros(shape[1:], np.float32).strides)
    )
    with pytest.raises(ValueError, match="out has overlapping elements"):
        op.fast(q, k, v, out=out)


# --------------------------------------------------------------------------------------
# Extreme inputs that the SDPA kernel (csrc/kernels/sdpa-inl.h) once got wrong: a score of
# -inf next to an infinite value (0 * inf in the tiled P V), float masks of finfo.min and
# scores near finfo.max (overflow when scores were kept in log2 units), and the weights of
# huge scores (e^(s - lse) lost log(l)).


def test_sdpa_minus_inf_score_keeps_a_non_finite_value_out(isa):
    q = np.full((4, 1), -1.0, np.float32)  # 4 rows: the register-tiled P V path
    k = np.array([[1.0], [np.inf]], np.float32)  # key 1 scores -inf for every row
    v = np.array([[2.0], [np.inf]], np.float32)
    expected = reference.scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(expected, np.full((4, 1), 2.0, np.float32))
    np.testing.assert_array_equal(fastattn.scaled_dot_product_attention(q, k, v), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_row_masked_with_finfo_min(isa, dtype):
    q, k, v = inputs(b=1, lq=2, lk=3, dtype=dtype)
    mask = np.zeros((2, 3), dtype)
    mask[0] = np.finfo(dtype).min
    expected = reference.scaled_dot_product_attention(q, k, v, mask)
    got = fastattn.scaled_dot_product_attention(q, k, v, mask)
    assert_close("sdpa", got, expected, tolerance(q, k, v, OPS[0]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_scores_near_the_float_limit(isa, dtype):
    big = math.sqrt(float(np.finfo(dtype).max)) * 0.9  # scores up to 0.81 finfo.max
    q = np.array([[big], [-big]], dtype)
    k = np.array([[big], [big / 2], [-big]], dtype)
    v = np.arange(6, dtype=dtype).reshape(3, 2)
    expected = reference.scaled_dot_product_attention(q, k, v, scale=1.0)
    np.testing.assert_array_equal(expected, v[[0, 2]])
    got = fastattn.scaled_dot_product_attention(q, k, v, scale=1.0)
    np.testing.assert_array_equal(got, expected)


def test_sdpa_weights_of_large_scores_sum_to_one(isa):
    q = np.array([[1e4]], np.float32)
    k = np.array([[1e4], [1e4], [1.0]], np.float32)  # scores 1e8, 1e8, 1e4
    v = np.eye(3, dtype=np.float32)
    out, w = fastattn.scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
    np.testing.assert_array_equal(out, [[0.5, 0.5, 0.0]])
    np.testing.assert_array_equal(w, [[0.5, 0.5, 0.0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_family_weights_of_large_scores_sum_to_one(isa, dtype):
    """The family kernels' weights are e^(s - max) / sum, right for scores of any size."""
    big = np.sqrt(np.finfo(dtype).max) / 4  # additive scores of w_v = 1e8 (f32) or 3e153
    q = np.ones((1, 1), dtype)
    k = np.ones((3, 1), dtype)
    v = np.eye(3, dtype=dtype)
    one = np.ones((1, 1), dtype)
    out, w = fastattn.additive_attention(
        q, k, v, one, one, np.array([big], dtype), return_weights=True
    )
    np.testing.assert_allclose(w, np.full((1, 3), 1 / 3), rtol=4 * np.finfo(dtype).eps)
    np.testing.assert_allclose(out, w, rtol=4 * np.finfo(dtype).eps)
    xk = np.array([0.0, 1.0, -1.0], dtype)  # distances 1e4 / h apart: u^2 / 2 ~ 1e8 (f32)
    h = 1e-4 if dtype == np.float32 else 1e-100
    y, w = fastattn.nadaraya_watson(
        np.array([0.5], dtype), xk, np.arange(3, dtype=dtype), bandwidth=h, return_weights=True
    )
    np.testing.assert_array_equal(w, [[0.5, 0.5, 0.0]])
    np.testing.assert_array_equal(y, [0.5])


def test_scratch_that_cannot_be_had_raises_memory_error():
    """Additive attention projects every query row: 2**23 rows x 2**22 hidden units is
    2**47 bytes of scratch, more than any address space. A clear MemoryError, nothing
    half-written, and the next call works."""
    q = np.ones((2**23, 1, 1), np.float32)
    one = np.ones((1, 1, 1), np.float32)
    w = np.ones((1, 2**22), np.float32)
    with pytest.raises(
        MemoryError, match="could not allocate the scratch memory of the additive kernel"
    ):
        fastattn.additive_attention(q, one, one, w, w, np.ones(2**22, np.float32))
    q, k, v = inputs()
    run(OPS[6], q, k, v)  # additive_attention


@pytest.mark.parametrize("heads", [(0, 0), (4, 2)])
def test_sdpa_zero_heads_or_rows_match_the_reference(heads):
    """Zero query and kv heads (the reference once divided by zero) and zero query rows."""
    hq, hkv = heads
    rng = np.random.default_rng(5)
    lq = 0 if hq else 3
    q = rng.standard_normal((2, hq, lq, 4)).astype(np.float32)
    k = rng.standard_normal((2, hkv, 5, 4)).astype(np.float32)
    v = rng.standard_normal((2, hkv, 5, 3)).astype(np.float32)
    got = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    expected = reference.scaled_dot_product_attention(q, k, v, return_lse=True)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
    assert got[0].shape == (2, hq, lq, 3)

"""The oracle itself: fastattn.reference checked by hand and against plain Python loops,
independently of the C++ kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastattn import reference

ref_sdpa = reference.scaled_dot_product_attention
masked_softmax = reference.masked_softmax


# --------------------------------------------------------------------------------------
# A loop-by-loop implementation of docs/semantics.md (SDPA's rules), in Python floats


def naive_sdpa(
    q,
    k,
    v,
    attn_mask=None,
    valid_lens=None,
    is_causal=False,
    causal_alignment="top_left",
    window=None,
    scale=None,
    softcap=None,
):
    """(output, lse, weights) by explicit loops over every score row and key."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    nd = max(q.ndim, k.ndim, v.ndim)
    q3, k3, v3 = (a.reshape((1,) * (max(3, nd) - a.ndim) + a.shape) for a in (q, k, v))
    batch = np.broadcast_shapes(q3.shape[:-3], k3.shape[:-3], v3.shape[:-3])
    hq, lq, e = q3.shape[-3:]
    hkv, lk, _ = k3.shape[-3:]
    ev = v3.shape[-1]
    group = hq // hkv
    q4, k4, v4 = (np.broadcast_to(a, batch + a.shape[-3:]) for a in (q3, k3, v3))
    user_scores = (batch + (hq, lq, lk))[-nd:] if nd >= 3 else (lq, lk)
    full_scores = batch + (hq, lq, lk)
    mask = None
    if attn_mask is not None:
        mask = np.broadcast_to(np.asarray(attn_mask), user_scores).reshape(full_scores)
    vl = None
    if valid_lens is not None:
        vl = np.asarray(valid_lens)
        rows = user_scores[:-1]
        vl = np.broadcast_to(vl.reshape(vl.shape + (1,) * (len(rows) - vl.ndim)), rows)
        vl = vl.reshape(full_scores[:-1])
    s = 1.0 / math.sqrt(e) if scale is None else float(scale)
    offset = lk - lq if causal_alignment == "bottom_right" else 0
    left, right = window if window is not None else (None, None)

    out = np.zeros(batch + (hq, lq, ev))
    lse = np.full(batch + (hq, lq), -np.inf)
    weights = np.zeros(full_scores)
    for idx in np.ndindex(*batch, hq, lq):
        b, h, i = idx[:-2], idx[-2], idx[-1]
        kh = h // group
        d = i + offset
        scores = {}
        for j in range(lk):
            if vl is not None and not j < vl[idx]:
                continue
            if is_causal and not j <= d:
                continue
            if left is not None and not j >= d - left:
                continue
            if right is not None and not j <= d + right:
                continue
            if mask is not None and mask.dtype == bool and not mask[idx + (j,)]:
                continue
            x = sum(float(q4[b + (h, i, t)]) * float(k4[b + (kh, j, t)]) for t in range(e)) * s
            if softcap is not None:
                x = softcap * math.tanh(x / softcap)
            if mask is not None and mask.dtype != bool:
                x += float(mask[idx + (j,)])
            scores[j] = x
        finite = [x for x in scores.values() if x != -math.inf]
        if not finite:
            continue
        m = max(finite)
        total = sum(math.exp(x - m) for x in scores.values())
        lse[idx] = m + math.log(total)
        for j, x in scores.items():
            w = math.exp(x - m) / total
            weights[idx + (j,)] = w
            for t in range(ev):
                out[idx + (t,)] += w * float(v4[b + (kh, j, t)])
    out_shape = (batch + (hq, lq, ev))[-nd:] if nd >= 3 else (lq, ev)
    return out.reshape(out_shape), lse.reshape(out_shape[:-1]), weights.reshape(user_scores)


def assert_matches_naive(q, k, v, **kwargs):
    got = ref_sdpa(q, k, v, return_lse=True, return_weights=True, **kwargs)
    want = naive_sdpa(q, k, v, **kwargs)
    for name, a, b in zip(("output", "lse", "weights"), got, want):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
    return got


# --------------------------------------------------------------------------------------
# Hand-computed cases


def test_one_query_two_keys():
    q = np.array([[1.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0]])  # scores (scale 1): [1, 0]
    v = np.array([[10.0, 1.0], [20.0, -1.0]])
    out, lse, w = ref_sdpa(q, k, v, scale=1.0, return_lse=True, return_weights=True)
    e = math.e
    np.testing.assert_allclose(w, [[e / (e + 1), 1 / (e + 1)]], rtol=1e-15)
    np.testing.assert_allclose(lse, [math.log(e + 1)], rtol=1e-15)
    np.testing.assert_allclose(out, [[(10 * e + 20) / (e + 1), (e - 1) / (e + 1)]], rtol=1e-15)


def test_default_scale_and_equal_scores():
    q = np.array([[2.0, 2.0, 2.0, 2.0]])  # E = 4: scale 1/2
    k = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 0, 0.5]])  # scores 1, 1, 0.5
    v = np.array([[1.0], [3.0], [5.0]])
    out, w = ref_sdpa(q, k, v, return_weights=True)
    z = 2 * math.e + math.exp(0.5)
    np.testing.assert_allclose(w, [[math.e / z, math.e / z, math.exp(0.5) / z]], rtol=1e-15)
    np.testing.assert_allclose(out, [[(4 * math.e + 5 * math.exp(0.5)) / z]], rtol=1e-15)


def test_float_mask_adds_and_bool_mask_excludes():
    q = np.array([[1.0]])
    k = np.array([[0.0], [0.0], [0.0]])  # all scores 0
    v = np.array([[1.0], [2.0], [4.0]])
    out, w = ref_sdpa(q, k, v, np.array([math.log(2.0), 0.0, -np.inf]), return_weights=True)
    np.testing.assert_allclose(w, [[2 / 3, 1 / 3, 0.0]], rtol=1e-15)
    np.testing.assert_allclose(out, [[4 / 3]], rtol=1e-15)
    out, w = ref_sdpa(q, k, v, np.array([True, False, True]), return_weights=True)
    np.testing.assert_allclose(w, [[0.5, 0.0, 0.5]], rtol=1e-15)
    np.testing.assert_allclose(out, [[2.5]], rtol=1e-15)


def test_softcap_before_mask():
    q = np.array([[3.0]])
    k = np.array([[1.0], [-1.0]])  # scaled scores (scale 1): 3, -3
    v = np.array([[1.0], [0.0]])
    c = 2.0
    s0, s1 = c * math.tanh(3 / c) + 0.5, c * math.tanh(-3 / c)
    _, lse, w = ref_sdpa(
        q, k, v, np.array([0.5, 0.0]), scale=1.0, softcap=c, return_lse=True, return_weights=True
    )
    np.testing.assert_allclose(lse, [math.log(math.exp(s0) + math.exp(s1))], rtol=1e-14)
    np.testing.assert_allclose(w[0, 0], math.exp(s0) / (math.exp(s0) + math.exp(s1)), rtol=1e-14)


def test_causal_alignments_and_window_by_hand():
    q = np.zeros((3, 1))
    k = np.zeros((5, 1))  # all scores 0: weights are 1 / (number of visible keys)
    v = np.arange(5.0)[:, None]
    _, w = ref_sdpa(q, k, v, is_causal=True, return_weights=True)
    np.testing.assert_array_equal(w > 0, [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    _, w = ref_sdpa(q, k, v, is_causal=True, causal_alignment="bottom_right", return_weights=True)
    np.testing.assert_array_equal(w > 0, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    out, w = ref_sdpa(q, k, v, window=(1, 0), return_weights=True)
    np.testing.assert_array_equal(w > 0, [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0]])
    np.testing.assert_allclose(out[:, 0], [0.0, 0.5, 1.5], rtol=1e-15)
    _, w = ref_sdpa(q, k, v, window=(None, 1), causal_alignment="bottom_right", return_weights=True)
    np.testing.assert_array_equal(w > 0, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])


def test_docstring_case():
    q = k = v = np.eye(2)
    out = ref_sdpa(q, k, v, is_causal=True)
    np.testing.assert_array_equal(out[0], [1.0, 0.0])
    w = math.exp(1 / math.sqrt(2))
    np.testing.assert_allclose(out[1], [1 / (1 + w), w / (1 + w)], rtol=1e-15)


def test_fully_masked_row_and_huge_logits():
    q = np.array([[1e4], [1.0]])
    k = np.array([[1e4], [-1e4], [1.0]])
    v = np.array([[1.0], [2.0], [3.0]])
    mask = np.array([[True, True, True], [False, False, False]])
    out, lse, w = ref_sdpa(q, k, v, mask, scale=1.0, return_lse=True, return_weights=True)
    np.testing.assert_array_equal(out[1], [0.0])
    assert np.isneginf(lse[1])
    np.testing.assert_array_equal(w[1], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(out[0], [1.0], rtol=1e-15)  # score 1e8 dominates
    np.testing.assert_allclose(lse[0], 1e8, rtol=1e-15)
    assert np.isfinite(w).all()


def test_dtypes_follow_result_type():
    rng = np.random.default_rng(1)
    q16 = rng.standard_normal((3, 4)).astype(np.float16)
    k32 = rng.standard_normal((5, 4)).astype(np.float32)
    v16 = rng.standard_normal((5, 2)).astype(np.float16)
    out, lse, w = ref_sdpa(q16, k32.astype(np.float16), v16, return_lse=True, return_weights=True)
    assert (out.dtype, lse.dtype, w.dtype) == (np.float16, np.float32, np.float16)
    out, lse = ref_sdpa(q16, k32, v16, return_lse=True)
    assert (out.dtype, lse.dtype) == (np.float32, np.float32)
    out = ref_sdpa(q16, k32, v16.astype(np.float64))
    assert out.dtype == np.float64


# --------------------------------------------------------------------------------------
# Against the loops


def _r(rng, *shape):
    return rng.standard_normal(shape)


LOOP_CASES = {
    "plain-2d": lambda rng: ((_r(rng, 4, 3), _r(rng, 5, 3), _r(rng, 5, 2)), {}),
    "gqa-4d": lambda rng: (
        (_r(rng, 2, 4, 3, 2), _r(rng, 2, 2, 5, 2), _r(rng, 2, 2, 5, 3)),
        {"is_causal": True},
    ),
    "broadcast-batch": lambda rng: (
        (_r(rng, 1, 2, 3, 2), _r(rng, 3, 1, 4, 2), _r(rng, 1, 4, 3)),
        {},
    ),
    "bool-mask": lambda rng: (
        (_r(rng, 2, 3, 4, 2), _r(rng, 2, 3, 6, 2), _r(rng, 2, 3, 6, 2)),
        {"attn_mask": rng.random((3, 1, 6)) < 0.5},
    ),
    "float-mask": lambda rng: (
        (_r(rng, 2, 4, 3), _r(rng, 2, 5, 3), _r(rng, 2, 5, 3)),
        {"attn_mask": _r(rng, 4, 5), "softcap": 1.5, "scale": 2.0},
    ),
    "valid-lens-per-batch-4d": lambda rng: (
        (_r(rng, 3, 2, 4, 2), _r(rng, 3, 2, 6, 2), _r(rng, 3, 2, 6, 1)),
        {"valid_lens": np.array([6, 0, 2])},
    ),
    "valid-lens-per-head": lambda rng: (
        (_r(rng, 2, 3, 4, 2), _r(rng, 2, 3, 6, 2), _r(rng, 2, 3, 6, 2)),
        {"valid_lens": np.array([[1, 6, 3], [0, 2, 5]])},
    ),
    "valid-lens-per-query": lambda rng: (
        (_r(rng, 2, 2, 4, 2), _r(rng, 2, 2, 6, 2), _r(rng, 2, 2, 6, 2)),
        {"valid_lens": rng.integers(0, 7, size=(2, 1, 4))},
    ),
    "d2l-3d-per-batch": lambda rng: (
        (_r(rng, 2, 4, 3), _r(rng, 2, 6, 3), _r(rng, 2, 6, 2)),
        {"valid_lens": np.array([2, 5])},
    ),
    "d2l-3d-per-query": lambda rng: (
        (_r(rng, 2, 4, 3), _r(rng, 2, 6, 3), _r(rng, 2, 6, 2)),
        {"valid_lens": rng.integers(0, 7, size=(2, 4))},
    ),
    "window-bottom-right": lambda rng: (
        (_r(rng, 2, 5, 2), _r(rng, 2, 8, 2), _r(rng, 2, 8, 2)),
        {"window": (2, 1), "causal_alignment": "bottom_right", "is_causal": True},
    ),
    "everything": lambda rng: (
        (_r(rng, 2, 4, 5, 3), _r(rng, 2, 2, 7, 3), _r(rng, 2, 2, 7, 2)),
        {
            "attn_mask": rng.random((5, 7)) < 0.8,
            "valid_lens": np.array([[7], [4]]),
            "is_causal": True,
            "window": (None, 3),
            "softcap": 4.0,
        },
    ),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", sorted(LOOP_CASES))
def test_reference_matches_loops(case, seed):
    (q, k, v), kwargs = LOOP_CASES[case](np.random.default_rng(seed))
    assert_matches_naive(q, k, v, **kwargs)


def test_d2l_per_batch_is_per_batch():
    """d2l: for (B, L, E) inputs, valid_lens (B,) gives every query of batch b the same keys."""
    rng = np.random.default_rng(3)
    q, k, v = _r(rng, 2, 3, 4), _r(rng, 2, 6, 4), _r(rng, 2, 6, 2)
    _, w = ref_sdpa(q, k, v, valid_lens=np.array([2, 5]), return_weights=True)
    assert (w[0, :, 2:] == 0).all() and (w[0, :, :2] > 0).all()
    assert (w[1, :, 5:] == 0).all() and (w[1, :, :5] > 0).all()
    _, w = ref_sdpa(q, k, v, valid_lens=np.array([[1, 2, 3], [6, 0, 4]]), return_weights=True)
    for b, row, n in [(0, 0, 1), (0, 1, 2), (0, 2, 3), (1, 0, 6), (1, 1, 0), (1, 2, 4)]:
        assert (w[b, row, n:] == 0).all() and (w[b, row, :n] > 0).all()


@st.composite
def small_cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    b, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lq, lk, e, ev = (draw(st.integers(1, 5)) for _ in range(4))
    hq = hkv * group
    q, k, v = _r(rng, b, hq, lq, e), _r(rng, b, hkv, lk, e), _r(rng, b, hkv, lk, ev)
    kwargs = {}
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(lq, lk), (hq, 1, lk), (b, 1, lq, 1), (b, hq, lq, lk)]))
        kwargs["attn_mask"] = rng.random(shape) < 0.6 if draw(st.booleans()) else _r(rng, *shape)
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(), (b,), (b, hq), (b, 1, lq), (b, hq, lq)]))
        kwargs["valid_lens"] = rng.integers(0, lk + 1, size=shape)
    if draw(st.booleans()):
        kwargs["is_causal"] = True
    if draw(st.booleans()):
        side = st.one_of(st.none(), st.integers(0, 4))
        kwargs["window"] = (draw(side), draw(side))
    if kwargs.get("is_causal") or "window" in kwargs:
        kwargs["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.floats(-2, 2))
    if draw(st.booleans()):
        kwargs["softcap"] = draw(st.floats(0.1, 10))
    return q, k, v, kwargs


@given(small_cases())
def test_reference_matches_loops_random(case):
    q, k, v, kwargs = case
    assert_matches_naive(q, k, v, **kwargs)


# --------------------------------------------------------------------------------------
# masked_softmax


def naive_masked_softmax(x, valid_lens=None, mask=None, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    moved = np.moveaxis(x, axis, -1)
    rows = moved.shape[:-1]
    keep_mask = None if mask is None else np.moveaxis(np.broadcast_to(mask, x.shape), axis, -1)
    vl = None
    if valid_lens is not None:
        vl = np.asarray(valid_lens)
        vl = np.broadcast_to(vl.reshape(vl.shape + (1,) * (len(rows) - vl.ndim)), rows)
    out = np.zeros(moved.shape)
    for idx in np.ndindex(*rows):
        kept = [
            j
            for j in range(moved.shape[-1])
            if (vl is None or j < vl[idx]) and (keep_mask is None or keep_mask[idx + (j,)])
        ]
        if not kept:
            continue
        m = max(moved[idx + (j,)] for j in kept)
        total = sum(math.exp(moved[idx + (j,)] - m) for j in kept)
        for j in kept:
            out[idx + (j,)] = math.exp(moved[idx + (j,)] - m) / total
    return np.moveaxis(out, -1, axis)


def test_masked_softmax_d2l_example():
    x = np.random.default_rng(4).random((2, 2, 4))
    w = masked_softmax(x, np.array([2, 3]))
    assert w.shape == (2, 2, 4)
    np.testing.assert_array_equal((w > 0).sum(axis=-1), [[2, 2], [3, 3]])
    assert (w[0, :, 2:] == 0).all() and (w[1, :, 3:] == 0).all()
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-15)
    np.testing.assert_allclose(w, naive_masked_softmax(x, np.array([2, 3])), rtol=1e-14)
    # d2l's second form: one length per row.
    vl = np.array([[1, 3], [2, 4]])
    w = masked_softmax(x, vl)
    np.testing.assert_array_equal((w > 0).sum(axis=-1), vl)
    np.testing.assert_allclose(w, naive_masked_softmax(x, vl), rtol=1e-14)


def test_masked_softmax_hand_values():
    w = masked_softmax(np.array([[0.0, math.log(3.0), 5.0]]), np.array([2]))
    np.testing.assert_allclose(w, [[0.25, 0.75, 0.0]], rtol=1e-15)
    doc = masked_softmax(np.zeros((1, 4)), np.array([2]))
    np.testing.assert_array_equal(doc, [[0.5, 0.5, 0.0, 0.0]])


@pytest.mark.parametrize("axis", [0, 1, -1, -2, 2])
def test_masked_softmax_axis(axis):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 5))
    rows = np.moveaxis(x, axis, -1).shape[:-1]
    n = x.shape[axis]
    vl = rng.integers(0, n + 1, size=rows[:1])
    mask = rng.random(x.shape) < 0.7
    got = masked_softmax(x, vl, mask=mask, axis=axis)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, naive_masked_softmax(x, vl, mask, axis), rtol=1e-13, atol=1e-15)
    sums = got.sum(axis=axis)
    assert np.all(np.isclose(sums, 1.0, rtol=1e-13) | (sums == 0))


def test_masked_softmax_fully_masked_rows_are_zero():
    x = np.random.default_rng(6).standard_normal((3, 5))
    w = masked_softmax(x, np.array([0, 5, 2]), mask=np.array([True, True, False, True, True]))
    np.testing.assert_array_equal(w[0], 0.0)
    assert (w[1, 2] == 0) and np.isclose(w[1].sum(), 1.0)
    np.testing.assert_allclose(
        w[2], naive_masked_softmax(x[2:], [2])[0] * [1, 1, 0, 0, 0], rtol=1e-14
    )
    assert not np.isnan(w).any()
    w = masked_softmax(x, mask=np.zeros(5, bool))
    np.testing.assert_array_equal(w, 0.0)


def test_masked_softmax_huge_logits_stable():
    x = np.array([[1e4, 1e4 - math.log(3.0), -1e4], [-1e300, -1e300, 1e300]])
    w = masked_softmax(x)
    assert np.isfinite(w).all()
    np.testing.assert_allclose(w[0], [0.75, 0.25, 0.0], rtol=1e-12, atol=1e-300)
    np.testing.assert_array_equal(w[1], [0.0, 0.0, 1.0])
    w16 = masked_softmax(np.array([60000.0, 59968.0], np.float16))  # 32 apart
    assert w16.dtype == np.float16 and np.isfinite(w16).all()
    np.testing.assert_allclose(w16, [1.0, math.exp(-32)], rtol=1e-3, atol=1e-7)


def test_masked_softmax_out_and_inputs_untouched():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    vl = np.array([[1, 2, 3], [4, 0, 2]])
    x0, vl0 = x.copy(), vl.copy()
    out = np.full(x.shape, np.nan, np.float32)
    assert masked_softmax(x, vl, out=out) is out
    assert out.dtype == np.float32 and not np.isnan(out).any()
    np.testing.assert_allclose(out, naive_masked_softmax(x, vl), rtol=1e-6)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(vl, vl0)


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"axis": 3}, ValueError, "axis 3 is out of bounds"),
        ({"axis": 1.0}, TypeError, "axis must be an int"),
        ({"axis": True}, TypeError, "axis must be an int"),
        ({"mask": np.ones(4, np.int8)}, TypeError, "mask must be a bool array"),
        ({"mask": np.ones(5, bool)}, ValueError, r"mask of shape \(5,\) does not broadcast"),
        ({"valid_lens": np.array([1.0])}, TypeError, "valid_lens must be an integer array"),
        ({"valid_lens": np.array([5, 1])}, ValueError, r"valid_lens must lie in \[0, 4\]"),
        ({"valid_lens": np.ones((3,), int)}, ValueError, "not a leading prefix"),
        ({"out": np.empty((2, 3, 4))}, ValueError, "out must have shape"),
    ],
)
def test_masked_softmax_errors(kwargs, exc, pattern):
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(exc, match=pattern):
        masked_softmax(x, **kwargs)


@pytest.mark.parametrize("bad", [np.arange(4), np.zeros(4, complex), 1.5])
def test_masked_softmax_bad_x(bad):
    with pytest.raises((TypeError, ValueError), match=r"\bx\b"):
        masked_softmax(bad)

"""Gradients of the family (docs/semantics.md#gradients-of-the-family):
masked_softmax_backward, additive_attention_backward, nadaraya_watson_backward.

Two checks, both on fresh random inputs (hypothesis), never zeros:

* the float64 twins in ``fastattn.reference`` against central finite differences of the
  float64 forward twins, along a random direction per input (``<grad, d>`` against
  ``(L(x + e d) - L(x - e d)) / 2e``, ``L = sum(grad_out * forward)``). With ``e = 1e-5``
  and O(1) inputs the difference carries ``e^2 |L'''| ~ 1e-10`` of truncation and
  ``eps64 |L| / e ~ 1e-11`` of rounding per unit of scale: ``1e-6`` relative to the
  magnitudes involved leaves four orders of margin and still fails on any wrong term;
* the fast functions on every ISA against the twins. float64: ``1e-10`` relative to the
  gradient's magnitude (sums of at most a few hundred O(1) terms, each rounded once).
  float32: ``eps32 * 16 * n`` of the magnitude, ``n`` the longest sum in the chain rule
  (keys + queries + hidden or features, plus 32 for the exp/tanh ulps and the forward's
  weights). float16 (computed in float32): the forward's output is stored in float16
  before it enters ``rowsum(grad_out * out)`` (half an ulp, ``eps16 / 2`` relative) and
  the gradients are rounded to float16 once more: ``4 * eps16`` of the magnitude on top.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import same_bits, with_layout
from helpers.family_checks import fixture_ok

KERNELS = ("gaussian", "boxcar", "triangular", "epanechnikov")
STEP = 1e-5


def _fd_check(loss, args: list, grads, names) -> None:
    """Directional central differences of ``loss`` (a function of the list ``args``)
    against the analytic gradients, one random direction per argument."""
    rng = np.random.default_rng(len(args))
    for n, (a, g, name) in enumerate(zip(args, grads, names, strict=True)):
        if g is None:
            continue
        d = rng.standard_normal(np.shape(a))
        plus, minus = list(args), list(args)
        plus[n] = np.asarray(a, np.float64) + STEP * d
        minus[n] = np.asarray(a, np.float64) - STEP * d
        fd = (loss(plus) - loss(minus)) / (2 * STEP)
        analytic = float(np.sum(np.asarray(g, np.float64) * d))
        scale = float(np.sum(np.abs(np.asarray(g, np.float64) * d))) + abs(loss(args)) + 1.0
        assert abs(fd - analytic) <= 1e-6 * scale, (name, fd, analytic)


def _tol(ref, dtype, terms: int) -> float:
    mag = 1.0 + max(float(np.nanmax(np.abs(np.asarray(r, np.float64)), initial=0)) for r in ref)
    if dtype == np.float64:
        return 1e-10 * mag * max(1, terms / 100)
    tol = float(np.finfo(np.float32).eps) * 16 * (terms + 32) * mag
    if dtype == np.float16:
        tol += 4 * float(np.finfo(np.float16).eps) * mag
    return tol


def _assert_grads(got, want, dtype, terms: int) -> None:
    tol = _tol([w for w in want if w is not None], dtype, terms)
    for n, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None, n
            continue
        if isinstance(w, float):
            assert isinstance(g, float) and abs(g - w) <= tol * 4, (n, g, w)
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, (n, g.shape, w.shape, g.dtype, w.dtype)
        gg, ww = g.astype(np.float64), w.astype(np.float64)
        assert (np.isnan(gg) == np.isnan(ww)).all(), n
        err = np.abs(np.where(np.isnan(ww), 0, gg - ww)).max(initial=0)
        assert err <= tol, (n, err, tol)


# --------------------------------------------------------------------------------------
# masked_softmax_backward


@st.composite
def softmax_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 40)))
    axis = draw(st.sampled_from([-1, 1, 0]))
    x = rng.standard_normal(shape) * draw(st.sampled_from([1.0, 4.0]))
    rows = tuple(s for i, s in enumerate(shape) if i != axis % 3)
    lens = None
    if draw(st.booleans()):
        lens = rng.integers(0, shape[axis] + 1, size=rows[: draw(st.integers(1, 2))])
    mask = rng.random(shape) > 0.3 if draw(st.booleans()) else None
    return x, lens, mask, axis


@given(softmax_cases())
def test_masked_softmax_backward_reference_matches_finite_differences(case):
    x, lens, mask, axis = case
    go = np.random.default_rng(7).standard_normal(x.shape)
    w = reference.masked_softmax(x, lens, mask=mask, axis=axis)
    grad = reference.masked_softmax_backward(go, w, lens, mask=mask, axis=axis)
    _fd_check(
        lambda a: float(np.sum(go * reference.masked_softmax(a[0], lens, mask=mask, axis=axis))),
        [x],
        [grad],
        ["x"],
    )


@fixture_ok(0.5)
@given(softmax_cases(), st.sampled_from([np.float64, np.float32, np.float16]))
def test_masked_softmax_backward_matches_reference(isa, case, dtype):
    x, lens, mask, axis = case
    go = np.random.default_rng(3).standard_normal(x.shape).astype(dtype)
    w = fastattn.masked_softmax(x.astype(dtype), lens, mask=mask, axis=axis)
    got = fastattn.masked_softmax_backward(
        with_layout(go, "fortran"), w, lens, mask=mask, axis=axis
    )
    want = reference.masked_softmax_backward(go, w, lens, mask=mask, axis=axis)
    _assert_grads([got], [want], dtype, x.shape[axis])
    # entries not kept are exactly 0, even where grad holds NaN there
    if mask is not None:
        bad = np.where(mask, go, np.nan)
        again = fastattn.masked_softmax_backward(bad, w, lens, mask=mask, axis=axis)
        assert (again[~mask] == 0).all()
        assert same_bits(again[mask], got[mask])


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_masked_softmax_backward_rows_split_over_threads(isa, dtype):
    """Rows enough for many chunks (the kernel's 16K-entry chunks over threads), a
    strided axis (gathered rows) and both masks: the same bits on 1, 2 and 3 threads, and
    within the tolerance of the float64 twin (16-bit storage: widened, computed in float32,
    rounded once to the 16-bit type: 2 ulps of it on top)."""
    if dtype == "bfloat16":
        dt = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    else:
        dt = np.dtype(dtype)
    rng = np.random.default_rng(11)
    shape, axis = (6, 300, 70), 1
    x = (rng.standard_normal(shape) * 3).astype(dt)
    lens = rng.integers(0, 301, size=(6, 70))
    mask = rng.random(shape) > 0.2
    w = fastattn.masked_softmax(x, lens, mask=mask, axis=axis)
    go = rng.standard_normal(shape).astype(dt)
    runs = [
        fastattn.masked_softmax_backward(go, w, lens, mask=mask, axis=axis, num_threads=n)
        for n in (1, 2, 3)
    ]
    assert all(same_bits(r, runs[0]) for r in runs[1:])
    want = reference.masked_softmax_backward(go, w, lens, mask=mask, axis=axis)
    got = runs[0]
    assert got.dtype == dt and want.dtype == dt
    tol = _tol([want], np.float32 if dt.itemsize == 2 else dt.type, shape[axis])
    if dt.itemsize == 2:  # the result's own rounding, relative to each entry
        eps16 = 2.0**-7 if dtype == "bfloat16" else 2.0**-10
        tol = tol + 2 * eps16 * np.abs(want.astype(np.float64))
    assert (np.abs(got.astype(np.float64) - want.astype(np.float64)) <= tol).all()


def test_masked_softmax_backward_fully_masked_rows_are_zero():
    x = np.array([[1.0, 2.0, 3.0], [-np.inf, -np.inf, 0.5], [4.0, 5.0, 6.0]])
    w = fastattn.masked_softmax(x, np.array([3, 2, 0]))
    g = np.array([[1.0, -2.0, 3.0], [5.0, 6.0, 7.0], [8.0, 9.0, 1.0]])
    for fn in (fastattn.masked_softmax_backward, reference.masked_softmax_backward):
        got = fn(g, w, np.array([3, 2, 0]))
        assert (got[1:] == 0).all()  # only -inf kept / nothing kept
        assert abs(got[0].sum()) < 1e-15 and (got[0] != 0).all()


# --------------------------------------------------------------------------------------
# additive_attention_backward


@st.composite
def additive_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b, hkv, grp = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lq, lk = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    dq, dk, dv, hidden = (draw(st.integers(1, 4)) for _ in range(4))
    q = rng.standard_normal((b, hkv * grp, lq, dq))
    kshape = (draw(st.sampled_from([1, b])), hkv, lk, dk)  # 1: broadcast along the batch
    k = rng.standard_normal(kshape)
    v = rng.standard_normal(kshape[:-1] + (dv,))
    ws = [rng.standard_normal((dq, hidden)), rng.standard_normal((dk, hidden))]
    ws.append(rng.standard_normal(hidden))
    kw = {}
    if draw(st.booleans()):
        kw["is_causal"] = True
        kw["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    if draw(st.booleans()):
        kw["window"] = (draw(st.sampled_from([None, 0, 2])), draw(st.sampled_from([None, 1])))
    if draw(st.booleans()):
        kw["valid_lens"] = rng.integers(0, lk + 1, size=(b,))
    mask = None
    kind = draw(st.sampled_from(["none", "bool", "float"]))
    if kind == "bool":
        mask = rng.random((lq, lk)) > 0.3
    elif kind == "float":
        mask = np.where(rng.random((lq, lk)) > 0.3, rng.standard_normal((lq, lk)), -np.inf)
    return [q, k, v, *ws], mask, kw


@given(additive_cases())
def test_additive_backward_reference_matches_finite_differences(case):
    arrays, mask, kw = case
    out = reference.additive_attention(*arrays, mask, **kw)
    go = np.random.default_rng(5).standard_normal(out.shape)
    grads = reference.additive_attention_backward(go, *arrays, mask, **kw)
    _fd_check(
        lambda a: float(np.sum(go * reference.additive_attention(*a, mask, **kw))),
        arrays,
        grads,
        ["query", "key", "value", "w_q", "w_k", "w_v"],
    )


@fixture_ok(0.5)
@given(additive_cases(), st.sampled_from([np.float64, np.float32, np.float16]))
def test_additive_backward_matches_reference(isa, case, dtype):
    arrays, mask, kw = case
    arrays = [a.astype(dtype) for a in arrays]
    out = fastattn.additive_attention(*arrays, mask, **kw)
    go = np.random.default_rng(5).standard_normal(out.shape).astype(dtype)
    got = fastattn.additive_attention_backward(go, *arrays, mask, **kw)
    want = reference.additive_attention_backward(go, *arrays, mask, **kw)
    q, k, _, w_q = arrays[:4]
    _assert_grads(got, want, dtype, q.shape[-2] + k.shape[-2] + w_q.shape[1] + q.shape[-3])
    again = fastattn.additive_attention_backward(go, *arrays, mask, **kw, num_threads=3)
    assert all(same_bits(a, b) for a, b in zip(got, again, strict=True))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_additive_backward_kernel_sizes(isa, dtype):
    """The C++ tanh chain beyond hypothesis's small shapes: hidden not a multiple of any
    vector width (zero-padded), many rows and keys, GQA, causal; any thread count."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 4, 40, 6)).astype(dtype)
    k = rng.standard_normal((2, 2, 50, 5)).astype(dtype)
    v = rng.standard_normal((2, 2, 50, 3)).astype(dtype)
    ws = [rng.standard_normal((6, 37)) / 2, rng.standard_normal((5, 37)) / 2]
    ws = [w.astype(dtype) for w in ws] + [rng.standard_normal(37).astype(dtype)]
    kw = {"is_causal": True, "causal_alignment": "bottom_right"}
    go = rng.standard_normal((2, 4, 40, 3)).astype(dtype)
    got = fastattn.additive_attention_backward(go, q, k, v, *ws, **kw, num_threads=1)
    want = reference.additive_attention_backward(go, q, k, v, *ws, **kw)
    _assert_grads(got, want, dtype, 40 + 50 + 37 + 4)
    again = fastattn.additive_attention_backward(go, q, k, v, *ws, **kw, num_threads=4)
    assert all(same_bits(a, b) for a, b in zip(got, again, strict=True))


@pytest.mark.parametrize(
    "fn", [fastattn.additive_attention_backward, reference.additive_attention_backward]
)
def test_additive_backward_hidden_keys_are_not_read(fn):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    ws = rng.standard_normal((2, 5)), rng.standard_normal((2, 5)), rng.standard_normal(5)
    go = rng.standard_normal((3, 2))
    lens = np.array([0, 2, 2])  # row 0 sees no key; keys 2, 3 are seen by no row
    clean = fn(go, q, k, v, *ws, valid_lens=lens)
    q[0], k[2], k[3], v[2:] = np.nan, np.inf, np.nan, np.inf
    dirty = fn(go, q, k, v, *ws, valid_lens=lens)
    # (the forward kernel may take another path for blocks holding inf/NaN: rounding only)
    assert all(np.allclose(a, b, rtol=1e-12, atol=1e-15) for a, b in zip(clean, dirty))
    assert (dirty[0][0] == 0).all()  # a row that sees no key: gradient 0
    assert (dirty[1][2:] == 0).all() and (dirty[2][2:] == 0).all()
    assert all(np.isfinite(g).all() for g in dirty)


# --------------------------------------------------------------------------------------
# nadaraya_watson_backward


@st.composite
def regression_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kernel = draw(st.sampled_from(KERNELS))
    scalar = draw(st.booleans())
    lq, lk = draw(st.integers(1, 5)), draw(st.integers(2, 8))
    if scalar:
        xq, xk, y = rng.uniform(-2, 2, lq), rng.uniform(-2, 2, lk), rng.standard_normal(lk)
        batch = ()
    else:
        b, d = draw(st.integers(1, 2)), draw(st.integers(1, 3))
        batch = (b,)
        xq = rng.uniform(-1, 1, (b, lq, d))
        xk = rng.uniform(-1, 1, (draw(st.sampled_from([1, b])), lk, d))
        y = rng.standard_normal((lk, draw(st.integers(1, 2))))
    h = draw(st.sampled_from(["scalar", "array", "silverman"]))
    wide = 1.0 if kernel == "gaussian" else 3.0
    if h == "scalar":
        bandwidth = float(rng.uniform(0.5, 1.5)) * wide
    elif h == "array" and batch:
        bandwidth = rng.uniform(0.5, 1.5, batch) * wide
    else:
        bandwidth = "silverman"
    return kernel, [xq, xk, y], bandwidth


def _scaled_distances(kernel, xq, xk, bandwidth):
    """(r, u = r / h) of every query-key pair, float64."""
    from fastattn._validation import regression_args

    ys = np.zeros(np.shape(xk)[-2:-1] if np.ndim(xk) > 1 else np.shape(xk))
    ra = regression_args(xq, xk, ys, kernel, bandwidth)
    diff = ra.x_query[..., :, None, :].astype(np.float64) - ra.x_keys[..., None, :, :]
    r = np.sqrt((diff * diff).sum(-1))
    return r, r / np.asarray(ra.bandwidth)[..., None, None]


def _away_from_edges(kernel, xq, xk, bandwidth) -> bool:
    """Whether every distance is clear of the compact kernels' non-smooth points."""
    if kernel == "gaussian":
        return True
    r, u = _scaled_distances(kernel, xq, xk, bandwidth)
    # nor is a row's kernel mass S tiny: f = sum K y / S has derivatives ~ 1 / S^k, so
    # the finite differences' truncation error (e^2 times the third derivative) grows
    # like 1 / S^3
    mass = np.where(u <= 1, 1 - u, 0).sum(-1)
    tiny = (mass > 0) & (mass < 0.05)
    return bool(np.abs(u - 1).min() > 1e-3 and r.min() > 1e-3 and not tiny.any())


@given(regression_cases())
def test_nadaraya_watson_backward_reference_matches_finite_differences(case):
    kernel, arrays, bandwidth = case
    assume(_away_from_edges(kernel, arrays[0], arrays[1], bandwidth))
    out = reference.nadaraya_watson(*arrays, kernel=kernel, bandwidth=bandwidth)
    assume(np.isfinite(out).all())  # a query with no key in the support: tested below
    go = np.random.default_rng(2).standard_normal(out.shape)
    grads = reference.nadaraya_watson_backward(go, *arrays, kernel=kernel, bandwidth=bandwidth)
    if isinstance(bandwidth, str):
        assert grads[3] is None
    else:
        assert isinstance(grads[3], float) == isinstance(bandwidth, float)

    def loss(a):
        h = bandwidth if isinstance(bandwidth, str) else a[3]
        if isinstance(bandwidth, float):
            h = float(h)
        return float(np.nansum(go * reference.nadaraya_watson(*a[:3], kernel=kernel, bandwidth=h)))

    args = [*arrays, None if isinstance(bandwidth, str) else bandwidth]
    _fd_check(loss, args, grads, ["x_query", "x_keys", "y_values", "bandwidth"])


@fixture_ok(0.5)
@given(regression_cases(), st.sampled_from([np.float64, np.float32]))
def test_nadaraya_watson_backward_matches_reference(isa, case, dtype):
    kernel, arrays, bandwidth = case
    assume(_away_from_edges(kernel, arrays[0], arrays[1], bandwidth))
    arrays = [a.astype(dtype) for a in arrays]
    out = fastattn.nadaraya_watson(*arrays, kernel=kernel, bandwidth=bandwidth)
    go = np.random.default_rng(2).standard_normal(out.shape).astype(dtype)
    got = fastattn.nadaraya_watson_backward(go, *arrays, kernel=kernel, bandwidth=bandwidth)
    want = reference.nadaraya_watson_backward(go, *arrays, kernel=kernel, bandwidth=bandwidth)
    # float32 scores -u^2 / 2 carry eps * u^2 of absolute error, which the exponentials
    # turn into relative errors of the weights (a small silverman h makes u large)
    u_max = float(_scaled_distances(kernel, arrays[0], arrays[1], bandwidth)[1].max())
    terms = 2 * (np.shape(arrays[0])[-1] + np.shape(arrays[1])[0]) + 8
    _assert_grads(got, want, dtype, round(terms * (1 + u_max**2)))
    again = fastattn.nadaraya_watson_backward(
        go, *arrays, kernel=kernel, bandwidth=bandwidth, num_threads=3
    )
    assert all(
        a is None or isinstance(a, float) and a == b or same_bits(a, b)
        for a, b in zip(got, again, strict=True)
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_nadaraya_watson_backward_kernel_sizes(isa, kernel):
    """The C++ distance chain beyond hypothesis's small shapes: lengths that are not a
    multiple of any vector width (NaN-padded), 3 features, a batch with an array bandwidth;
    float32 and float64; any thread count."""
    rng = np.random.default_rng(12)
    for dtype in (np.float64, np.float32):
        xq = rng.uniform(-1, 1, (2, 37, 3)).astype(dtype)
        xk = rng.uniform(-1, 1, (2, 45, 3)).astype(dtype)
        y = rng.standard_normal((45, 2)).astype(dtype)
        h = np.array([0.4, 0.7]) * (1 if kernel == "gaussian" else 2.5)
        go = rng.standard_normal((2, 37, 2)).astype(dtype)
        got = fastattn.nadaraya_watson_backward(
            go, xq, xk, y, kernel=kernel, bandwidth=h, num_threads=1
        )
        want = reference.nadaraya_watson_backward(go, xq, xk, y, kernel=kernel, bandwidth=h)
        u_max = float(_scaled_distances(kernel, xq, xk, h)[1].max())
        _assert_grads(got, want, dtype, round((2 * (3 + 45) + 8) * (1 + u_max**2)))
        again = fastattn.nadaraya_watson_backward(
            go, xq, xk, y, kernel=kernel, bandwidth=h, num_threads=4
        )
        assert all(same_bits(a, b) for a, b in zip(got[:3], again[:3], strict=True))
        assert np.array_equal(got[3], again[3])


@pytest.mark.parametrize(
    "fn", [fastattn.nadaraya_watson_backward, reference.nadaraya_watson_backward]
)
def test_nadaraya_watson_backward_edges(fn):
    x = np.array([0.0, 1.0, 2.0])
    y = np.array([1.0, 3.0, 2.0])
    # a query outside every support: NaN for that query, nothing passed to the others
    gq, gk, gy, gh = fn(np.ones(2), np.array([0.5, 9.0]), x, y, kernel="triangular")
    assert np.isnan(gq[1]) and np.isfinite(gq[0]) and np.isfinite(gk).all()
    assert np.isfinite(gy).all() and np.isfinite(gh)
    # boxcar: only y_values has a gradient
    gq, gk, gy, gh = fn(np.ones(1), np.array([0.5]), x, y, kernel="boxcar", bandwidth=1.2)
    assert (gq == 0).all() and (gk == 0).all() and gh == 0 and gy.tolist() == [0.5, 0.5, 0.0]
    # a query exactly at the triangular edge (u = 1): the derivative from inside
    gq, *_ = fn(
        np.ones(1),
        np.array([2.0]),
        np.array([1.0, 3.0]),
        np.array([0.0, 1.0]),
        kernel="triangular",
        bandwidth=1.0,
    )
    assert np.isnan(gq).all()  # both keys at u = 1: weights 0/0, the estimator is undefined
    gq, *_ = fn(
        np.ones(1),
        np.array([1.5]),
        np.array([1.0, 2.5]),
        np.array([0.0, 1.0]),
        kernel="triangular",
        bandwidth=1.0,
    )
    # K = (0.5, 0) with key 2 at u = 1: f = 0; from inside, dK2/dx = +1 moves f to 1/0.5
    assert gq[0] == pytest.approx(2.0 + 0.0)


def test_backward_errors_name_the_argument():
    w = fastattn.masked_softmax(np.ones((2, 3)))
    with pytest.raises(ValueError, match="grad must have the shape of weights"):
        fastattn.masked_softmax_backward(np.ones((2, 4)), w)
    with pytest.raises(TypeError, match="weights must be a floating-point"):
        fastattn.masked_softmax_backward(np.ones((2, 3)), np.ones((2, 3), int))
    with pytest.raises(ValueError, match="axis 2 is out of bounds for weights"):
        fastattn.masked_softmax_backward(w, w, axis=2)
    q = np.ones((2, 3))
    ws = np.ones((3, 4)), np.ones((3, 4)), np.ones(4)
    with pytest.raises(ValueError, match="grad_out must have the shape"):
        fastattn.additive_attention_backward(np.ones((2, 2)), q, q, q, *ws)
    with pytest.raises(ValueError, match="w_v must have shape"):
        fastattn.additive_attention_backward(np.ones((2, 3)), q, q, q, *ws[:2], np.ones(3))
    with pytest.raises(ValueError, match="grad_out must have the shape"):
        fastattn.nadaraya_watson_backward(np.ones(3), np.ones(2), np.ones(4), np.ones(4))
    with pytest.raises(ValueError, match="kernel must be one of"):
        fastattn.nadaraya_watson_backward(
            np.ones(2), np.ones(2), np.ones(4), np.ones(4), kernel="x"
        )


def test_family_backwards_memory_stays_within_the_documented_arrays():
    """docs/semantics.md (how they are computed): at Lq = Lk = 512, float32, the peak of
    the arrays NumPy allocates (tracemalloc) is at most 3 score-sized arrays for
    additive_attention_backward (dS and its transpose, briefly P and dP) and 4.5 for
    nadaraya_watson_backward (weights, grad_out . y and their transposes)."""
    import tracemalloc

    rng = np.random.default_rng(12)
    n, dt = 512, np.float32
    q, k = rng.standard_normal((n, 8)).astype(dt), rng.standard_normal((n, 8)).astype(dt)
    v = rng.standard_normal((n, 16)).astype(dt)
    w_q, w_k = (rng.standard_normal((8, 16)).astype(dt) / 3 for _ in range(2))
    w_v = rng.standard_normal(16).astype(dt)
    g = rng.standard_normal((n, 16)).astype(dt)
    x_q, x_k = rng.standard_normal((n, 2)).astype(dt), rng.standard_normal((n, 2)).astype(dt)
    y, g_y = rng.standard_normal((n, 3)).astype(dt), rng.standard_normal((n, 3)).astype(dt)
    scores = n * n * 4
    for limit, call in (
        (3.0, lambda: fastattn.additive_attention_backward(g, q, k, v, w_q, w_k, w_v)),
        (4.5, lambda: fastattn.nadaraya_watson_backward(g_y, x_q, x_k, y, bandwidth=0.5)),
    ):
        tracemalloc.start()
        try:
            call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak <= limit * scores, (peak / scores, limit)

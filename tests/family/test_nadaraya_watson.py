"""fastattn.nadaraya_watson against its NumPy twin on every ISA, and its definitions.

Tolerances: gaussian weights are a softmax of ``-d2 / (2 h^2)``, whose scores carry
``(8 + D) eps * max d2 / h^2``; compact kernels' weights ``K(u)`` are Lipschitz (slope <= 1.5
in u) except the boxcar's jump. To keep the support decisions exact, the compact-kernel
cases draw features on a grid of 1/8 and bandwidths that are multiples of 1/8 (squared
distances and h^2 are then exact in every dtype, so ``u <= 1`` is decided alike), and the
free-form cases leave out queries with a key within 1e-3 of the support's edge.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import fastattn
from fastattn import reference
from fastattn._compute import silverman_bandwidth

from helpers.attention_checks import assert_close, same_bits
from helpers.family_checks import (
    DTYPES,
    compute_eps,
    finite_max,
    fixture_ok,
)

nw = fastattn.nadaraya_watson
KERNELS = ["gaussian", "boxcar", "triangular", "epanechnikov"]


@st.composite
def cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    kernel = draw(st.sampled_from(KERNELS))
    grid = kernel != "gaussian" and draw(st.integers(0, 3)) > 0
    scalar_x = draw(st.booleans())
    d = 1 if scalar_x else draw(st.integers(1, 5))
    batch = () if scalar_x else tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    lq = draw(st.integers(1, 40))
    lk = draw(st.one_of(st.integers(1, 3), st.integers(1, 80)))
    scalar_y = draw(st.booleans())
    dy = draw(st.one_of(st.integers(1, 4), st.integers(16, 24)))
    dtypes = tuple(draw(st.sampled_from(sorted(DTYPES))) for _ in range(3))
    bw = draw(st.sampled_from(["scalar", "array", "silverman"]))
    if grid:
        bw = draw(st.sampled_from(["scalar", "array"]))
    return dict(
        seed=seed,
        kernel=kernel,
        grid=grid,
        scalar_x=scalar_x,
        d=d,
        batch=batch,
        lq=lq,
        lk=lk,
        scalar_y=scalar_y,
        dy=dy,
        dtypes=dtypes,
        bw=bw,
        threads=draw(st.sampled_from([None, 1, 2, 3])),
        return_weights=draw(st.booleans()),
        out=draw(st.booleans()),
    )


def build(c):
    rng = np.random.default_rng(c["seed"])

    def feats(lead, n):
        shape = (n,) if c["scalar_x"] else lead + (n, c["d"])
        x = rng.standard_normal(shape) * 2
        return np.round(x * 8) / 8 if c["grid"] else x

    lead_q = tuple(1 if rng.random() < 0.3 else b for b in c["batch"])
    lead_k = c["batch"]
    xq, xk = feats(lead_q, c["lq"]), feats(lead_k, c["lk"])
    y_shape = (c["lk"],) if c["scalar_y"] else (c["lk"], c["dy"])
    y = rng.standard_normal(y_shape)
    xq, xk, y = (a.astype(DTYPES[t]) for a, t in zip((xq, xk, y), c["dtypes"]))
    if c["grid"]:
        xq, xk = (
            a.astype(np.float64) if a.dtype == np.float16 and np.abs(a).max(initial=0) > 64 else a
            for a in (xq, xk)
        )
    if c["bw"] == "scalar":
        h = float(rng.choice([0.5, 0.875, 1.25, 2.0, 3.5]))
    elif c["bw"] == "array":
        h = rng.choice([0.5, 1.25, 2.0, 3.5], size=c["batch"])
        h = h if h.ndim else float(h)
    else:
        h = "silverman"
    return xq, xk, y, h


def near_edge(xq, xk, h) -> bool:
    """Some query has a key within 1e-3 (relative) of the support's edge u = 1."""
    xq = np.asarray(xq, np.float64)
    xk = np.asarray(xk, np.float64)
    xq = xq[..., None] if xq.ndim == 1 else xq
    xk = xk[..., None] if xk.ndim == 1 else xk
    lead = np.broadcast_shapes(xq.shape[:-2], xk.shape[:-2])
    xq = np.broadcast_to(xq, lead + xq.shape[-2:])
    xk = np.broadcast_to(xk, lead + xk.shape[-2:])
    u = np.sqrt(((xq[..., :, None, :] - xk[..., None, :, :]) ** 2).sum(-1))
    h = np.asarray(silverman_bandwidth(xk) if isinstance(h, str) else h, np.float64)
    u = u / np.broadcast_to(h, lead)[..., None, None]
    return bool((np.abs(u - 1) < 1e-3).any())


def check(xq, xk, y, h, kernel, *, threads=None, return_weights=False, use_out=False):
    kw = {"kernel": kernel, "bandwidth": h}
    expected, exp_w = reference.nadaraya_watson(xq, xk, y, return_weights=True, **kw)
    out = np.full(expected.shape, np.nan, expected.dtype) if use_out else None
    got = nw(xq, xk, y, return_weights=return_weights, out=out, num_threads=threads, **kw)
    got_w = None
    if return_weights:
        got, got_w = got
    if use_out:
        assert got is out
    eps, f16 = compute_eps(xq, xk, y)
    hmin = float(
        np.min(
            silverman_bandwidth(np.asarray(xk)[..., None] if np.ndim(xk) == 1 else xk)
            if isinstance(h, str)
            else h
        )
    )
    d = 1 if np.ndim(xq) == 1 else np.shape(xq)[-1]
    spread = finite_max(xq) + finite_max(xk)
    d2max = d * spread * spread
    lk = np.shape(xk)[0] if np.ndim(xk) == 1 else np.shape(xk)[-2]
    score_err = (
        (8 + d) * eps * d2max / hmin**2
        if kernel == "gaussian"
        else ((8 + d) * eps * (1 + math.sqrt(d2max) / hmin) * lk)
    )
    w_tol = 4 * score_err + eps * (32 + lk)
    out_tol = w_tol * finite_max(y)
    if f16:
        out_tol += 2 * float(np.finfo(np.float16).eps) * finite_max(y)
        w_tol += float(np.finfo(np.float16).eps)
    assert_close("output", got, expected, out_tol)
    if got_w is not None:
        assert_close("weights", got_w, exp_w, w_tol)
    return got


@fixture_ok(2.0)
@given(c=cases())
def test_matches_reference(isa, c):
    """Kernels, scalar and vector features, batch dims, bandwidths, dtypes, out=, threads."""
    xq, xk, y, h = build(c)
    if isinstance(h, str):
        xk64 = np.asarray(xk, np.float64)
        xk64 = xk64[..., None] if xk64.ndim == 1 else xk64
        assume(c["lk"] >= 2)
        s = silverman_bandwidth(xk64)
        assume(np.all(s > 1e-3))
    if c["kernel"] != "gaussian" and not c["grid"]:
        assume(not near_edge(xq, xk, h))
    check(
        xq,
        xk,
        y,
        h,
        c["kernel"],
        threads=c["threads"],
        return_weights=c["return_weights"],
        use_out=c["out"],
    )


def test_kernel_definitions(isa):
    x = np.array([0.0, 1.0, 2.0, 4.0])
    y = np.array([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0], [8.0, 80.0]])
    q = np.array([1.5])
    for kernel, w in (
        ("boxcar", [0, 1, 1, 0]),
        ("triangular", [0, 0.25, 0.25, 0]),
        ("epanechnikov", [0, 0.75 * (1 - 0.25), 0.75 * (1 - 0.25), 0]),
        ("gaussian", np.exp(-(np.array([1.5, 0.5, 0.5, 2.5]) ** 2) / 2)),
    ):
        w = np.asarray(w, float) / np.sum(w)
        out, got_w = nw(q, x, y, kernel=kernel, bandwidth=1.0, return_weights=True)
        np.testing.assert_allclose(got_w[0], w, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(out[0], w @ y, rtol=1e-13)


def test_undefined_queries_are_nan(isa):
    x = np.array([0.0, 1.0])
    y = np.array([3.0, 5.0])
    for kernel in ("boxcar", "triangular", "epanechnikov"):
        out, w = nw(np.array([0.5, 10.0, 1.0]), x, y, kernel=kernel, return_weights=True)
        assert np.isfinite(out[0]) and np.isnan(out[1])
        assert np.isnan(w[1]).all() and np.isfinite(w[0]).all()
        assert out[2] == 5.0 or kernel == "boxcar"  # triangular/epanechnikov: key 0 at u=1
    # The gaussian is a softmax: defined however far the query is.
    out = nw(np.array([1e3]), x, y, kernel="gaussian", bandwidth=0.1)
    assert out[0] == 5.0
    # No keys at all: undefined for every kernel.
    for kernel in KERNELS:
        assert np.isnan(nw(np.array([0.0]), x[:0], y[:0], kernel=kernel)).all()


def test_nan_keys_are_outside_compact_supports(isa):
    x = np.array([0.0, np.nan, 1.0])
    y = np.array([1.0, 100.0, 3.0])
    out = nw(np.array([0.5]), x, y, kernel="triangular")
    assert out[0] == 2.0
    assert np.isnan(nw(np.array([0.5]), x, y, kernel="gaussian")).all()


def test_silverman_rule():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(200) * 3
    q75, q25 = np.percentile(x, [75, 25])
    expected = 0.9 * min(x.std(ddof=1), (q75 - q25) / 1.34) * 200**-0.2
    assert math.isclose(float(silverman_bandwidth(x[:, None])), expected, rel_tol=1e-14)
    x3 = rng.standard_normal((50, 3))
    expected3 = (4 / 5) ** (1 / 7) * 50 ** (-1 / 7) * x3.std(axis=0, ddof=1).mean()
    assert math.isclose(float(silverman_bandwidth(x3)), expected3, rel_tol=1e-14)
    q = np.linspace(-3, 3, 7)
    np.testing.assert_allclose(
        nw(q, x, np.sin(x), bandwidth="silverman"),
        nw(q, x, np.sin(x), bandwidth=expected),
        rtol=0,
        atol=0,
    )
    # per batch entry
    xb = np.stack([x[:100], 10 * x[100:]])[..., None]
    hb = silverman_bandwidth(xb)
    assert hb.shape == (2,) and hb[1] > 5 * hb[0]


def test_regression_recovers_a_smooth_function():
    rng = np.random.default_rng(4)
    x = np.sort(rng.uniform(0, 5, 400))
    y = 2 * np.sin(x) + x**0.8 + rng.normal(0, 0.1, 400)
    q = np.linspace(0.5, 4.5, 50)
    truth = 2 * np.sin(q) + q**0.8
    for kernel in KERNELS:
        est = nw(q, x, y, kernel=kernel, bandwidth=0.25)
        assert np.abs(est - truth).max() < 0.3


@pytest.mark.parametrize("kernel", KERNELS)
def test_thread_count_does_not_change_bits(kernel):
    rng = np.random.default_rng(5)
    xq = rng.standard_normal((3, 200, 2)).astype(np.float32)
    xk = rng.standard_normal((3, 700, 2)).astype(np.float32)
    y = rng.standard_normal((700, 3)).astype(np.float32)
    runs = [
        nw(xq, xk, y, kernel=kernel, bandwidth=0.5, num_threads=n, return_weights=True)
        for n in (1, 2, 3)
    ]
    for out, w in runs[1:]:
        assert same_bits(out, runs[0][0]) and same_bits(w, runs[0][1])


def test_shapes_and_dtypes():
    x16 = np.linspace(0, 1, 5).astype(np.float16)
    assert nw(x16, x16, x16).dtype == np.float16
    assert nw(x16, x16.astype(np.float32), x16).dtype == np.float32
    assert nw(np.zeros((2, 4, 3)), np.ones((6, 3)), np.ones(6)).shape == (2, 4)
    assert nw(np.zeros((4, 3)), np.ones((2, 6, 3)), np.ones((6, 2))).shape == (2, 4, 2)
    assert nw(np.zeros(0), np.ones(3), np.ones(3)).shape == (0,)


# --------------------------------------------------------------------------------------
# Bad input

X = np.linspace(0, 1, 6)
BAD = {
    "kernel": ({"kernel": "cosine"}, ValueError, r"kernel must be one of 'gaussian'"),
    "bandwidth-zero": ({"bandwidth": 0.0}, ValueError, r"bandwidth must be > 0"),
    "bandwidth-nan": ({"bandwidth": float("nan")}, ValueError, r"bandwidth must be finite"),
    "bandwidth-str": ({"bandwidth": "scott"}, ValueError, r"or 'silverman', got 'scott'"),
    "bandwidth-tiny": ({"bandwidth": 1e-200}, ValueError, r"bandwidth must lie in \["),
    "bandwidth-array-neg": (
        {"bandwidth": np.array(-1.0)},
        ValueError,
        r"bandwidth must be finite and > 0",
    ),
    "bandwidth-array-shape": (
        {"bandwidth": np.ones(3)},
        ValueError,
        r"bandwidth of shape \(3,\) does not broadcast",
    ),
    "bandwidth-bool": ({"bandwidth": True}, TypeError, r"bandwidth must be a positive number"),
    "silverman-one-key": (
        {"x_keys": X[:1], "y_values": X[:1], "bandwidth": "silverman"},
        ValueError,
        r"needs at least 2 keys",
    ),
    "silverman-constant": (
        {"x_keys": np.ones(6), "bandwidth": "silverman"},
        ValueError,
        r"positive spread",
    ),
    "features": (
        {"x_query": np.ones((3, 2)), "x_keys": np.ones((6, 3))},
        ValueError,
        r"x_keys has 3 features .* x_query has 2",
    ),
    "zero-features": ({"x_query": np.ones((3, 0))}, ValueError, r"at least one feature"),
    "y-length": (
        {"y_values": np.ones(5)},
        ValueError,
        r"y_values has 5 entries \(axis 0\) but x_keys has 6 keys",
    ),
    "x-int": ({"x_query": np.arange(3)}, TypeError, r"x_query must be a floating-point"),
    "y-complex": ({"y_values": np.ones(6, complex)}, TypeError, r"y_values must be"),
    "batch": (
        {"x_query": np.ones((2, 3, 1)), "x_keys": np.ones((3, 6, 1))},
        ValueError,
        r"do not broadcast together",
    ),
    "out-shape": ({"out": np.empty(4)}, ValueError, r"out must have shape \(3,\)"),
    "return_weights": ({"return_weights": "yes"}, TypeError, r"return_weights must be True"),
}


@pytest.mark.parametrize("fn", [nw, reference.nadaraya_watson], ids=["fastattn", "reference"])
@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input(fn, name):
    kwargs, exc, pattern = BAD[name]
    kwargs = dict(kwargs)
    args = [kwargs.pop("x_query", X[:3]), kwargs.pop("x_keys", X), kwargs.pop("y_values", X)]
    with pytest.raises(exc, match=pattern) as info:
        fn(*args, **kwargs)
    assert type(info.value) is exc

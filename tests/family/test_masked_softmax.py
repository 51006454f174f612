"""fastattn.masked_softmax against its NumPy twin on every ISA, plus its exact properties.

Tolerance: the weights carry the rounding of the exponentials and of the ``n``-term row sum,
``eps * (32 + n)`` in the compute dtype (the shift ``x - max`` costs at most ``eps / e``:
a weight ``e^-t`` is off relatively by ``eps * t``), plus float16's own rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close, same_bits
from helpers.family_checks import DTYPES, compute_eps, fixture_ok

masked_softmax = fastattn.masked_softmax
IMPLS = pytest.mark.parametrize(
    "fn", [masked_softmax, reference.masked_softmax], ids=["fastattn", "reference"]
)


@dataclass
class Case:
    seed: int
    shape: tuple
    axis: int
    dtype: str = "f4"
    layout: str = "c"
    magnitude: float = 1.0
    p_neginf: float = 0.0
    valid_lens: tuple | None = None  # shape (a prefix of the rows' shape)
    mask: tuple | None = None  # shape (broadcastable to x)
    density: float = 0.5
    out: str | None = None  # None, "c" or "strided"
    num_threads: int | None = None


@st.composite
def cases(draw, *, huge: bool = False) -> Case:
    ndim = draw(st.integers(1, 4))
    axis = draw(st.integers(-ndim, ndim - 1))
    shape = [draw(st.integers(1, 4)) for _ in range(ndim)]
    shape[axis] = draw(st.one_of(st.integers(0, 3), st.integers(1, 70), st.integers(100, 300)))
    while math.prod(shape) > 6000:
        big = max(range(ndim), key=lambda d: shape[d] if d != axis % ndim else 0)
        if shape[big] <= 1:
            break
        shape[big] //= 2
    case = Case(draw(st.integers(0, 2**32 - 1)), tuple(shape), axis)
    case.dtype = draw(st.sampled_from(sorted(DTYPES)))
    case.layout = draw(st.sampled_from(["c", "c", "fortran", "strided", "reversed", "bcast"]))
    case.magnitude = draw(st.sampled_from([1e4, 3e4] if huge else [1.0, 1.0, 1e-3, 30.0]))
    case.p_neginf = draw(st.sampled_from([0.0, 0.0, 0.3, 1.0]))
    rows = tuple(np.delete(np.array(shape), axis % ndim))
    if draw(st.booleans()):
        n = draw(st.integers(0, len(rows)))
        case.valid_lens = tuple(1 if draw(st.booleans()) else r for r in rows[:n])
    if draw(st.booleans()):
        drop = draw(st.integers(0, ndim))
        case.mask = tuple(1 if draw(st.booleans()) else s for s in shape[drop:])
        case.density = draw(st.sampled_from([0.0, 0.3, 0.9, 1.0]))
    case.out = draw(st.sampled_from([None, None, "c", "strided"]))
    case.num_threads = draw(st.sampled_from([None, 1, 2, 3]))
    return case


def build(case: Case):
    """(x, kwargs): NaN past every row's valid length (never to be read)."""
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal(case.shape) * case.magnitude
    x[rng.random(case.shape) < case.p_neginf * 0.3] = -np.inf
    kwargs = {"axis": case.axis}
    n = case.shape[case.axis]
    if case.valid_lens is not None:
        vl = rng.integers(0, n + 1, size=case.valid_lens)
        kwargs["valid_lens"] = vl
        rows_shape = np.moveaxis(x, case.axis, -1).shape[:-1]
        full = np.broadcast_to(
            vl.reshape(vl.shape + (1,) * (len(rows_shape) - vl.ndim)), rows_shape
        )
        moved = np.moveaxis(x, case.axis, -1)
        moved[np.arange(n) >= full[..., None]] = np.nan
    if case.mask is not None:
        kwargs["mask"] = rng.random(case.mask) < case.density
    if case.dtype == "f2":  # keep huge logits finite in float16
        x = np.where(np.isfinite(x), np.clip(x, -6e4, 6e4), x)
    x = x.astype(DTYPES[case.dtype])
    if case.layout == "fortran":
        x = np.asfortranarray(x)
    elif case.layout == "strided":
        base = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, x.dtype)
        base[..., ::2] = x
        x = base[..., ::2]
    elif case.layout == "reversed":
        x = np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    elif case.layout == "bcast" and x.ndim > 1 and x.shape[0] > 1 and case.valid_lens is None:
        x = np.broadcast_to(x[:1], x.shape)
    if case.num_threads is not None:
        kwargs["num_threads"] = case.num_threads
    return x, kwargs


def check_case(case: Case) -> None:
    x, kwargs = build(case)
    expected = reference.masked_softmax(x, **kwargs)
    out = None
    if case.out == "c":
        out = np.full(x.shape, np.nan, expected.dtype)
    elif case.out == "strided":
        out = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, expected.dtype)[..., ::2]
    got = masked_softmax(x, out=out, **kwargs)
    if out is not None:
        assert got is out
    eps, f16 = compute_eps(x)
    tol = eps * (32 + x.shape[case.axis]) + (float(np.finfo(np.float16).eps) if f16 else 0.0)
    assert_close("masked_softmax", got, expected, tol)
    # Exactly 0 where not kept; rows sum to 1 (or 0 when nothing is kept).
    assert (got[expected == 0] == 0).all()
    sums = got.astype(np.float64).sum(axis=case.axis)
    finite = ~np.isnan(sums)
    assert np.all(
        (np.abs(sums[finite] - 1) <= 2 * tol * max(1, x.shape[case.axis])) | (sums[finite] == 0)
    )


@fixture_ok(2.0)
@given(case=cases())
def test_matches_reference(isa, case):
    """Shapes, axes, dtypes, layouts, valid_lens (NaN past them), masks, out=, threads."""
    check_case(case)


@fixture_ok(0.5)
@given(case=cases(huge=True))
def test_huge_logits(isa, case):
    """|x| ~ 1e4: the row max is subtracted, nothing overflows."""
    check_case(case)


def test_d2l_example(isa):
    x = np.random.default_rng(4).random((2, 2, 4)).astype(np.float32)
    w = masked_softmax(x, np.array([2, 3]))
    np.testing.assert_array_equal((w > 0).sum(axis=-1), [[2, 2], [3, 3]])
    np.testing.assert_allclose(w, reference.masked_softmax(x, np.array([2, 3])), atol=1e-6)
    w = masked_softmax(x, np.array([[1, 3], [2, 4]]))
    np.testing.assert_array_equal((w > 0).sum(axis=-1), [[1, 3], [2, 4]])


def test_special_rows(isa):
    """Nothing kept -> 0; only -inf kept -> 0; a kept NaN or +inf -> the whole row NaN;
    NaN past the valid length is never read."""
    x = np.array(
        [
            [1.0, 2.0, 3.0, np.nan],
            [-np.inf, -np.inf, 5.0, 6.0],
            [1.0, np.nan, 2.0, 3.0],
            [1.0, np.inf, 2.0, 3.0],
            [1e30, -1e30, 0.0, 1.0],
        ],
        np.float32,
    )
    vl = np.array([3, 2, 4, 4, 4])
    got = masked_softmax(x, vl)
    expected = reference.masked_softmax(x, vl)
    assert_close("rows", got, expected, 1e-6)
    assert np.isfinite(got[0]).all() and got[0, 3] == 0
    np.testing.assert_array_equal(got[1], 0.0)
    assert np.isnan(got[2]).all() and np.isnan(got[3]).all()
    np.testing.assert_array_equal(got[4], [1.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(masked_softmax(x, mask=np.zeros(4, bool)), 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_thread_count_does_not_change_bits(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 33, 65)).astype(dtype)
    vl = rng.integers(0, 66, size=(7, 33))
    mask = rng.random((33, 65)) < 0.8
    runs = [masked_softmax(x, vl, mask=mask, num_threads=n) for n in (1, 2, 3, 8)]
    assert all(same_bits(runs[0], r) for r in runs[1:])
    cols = [masked_softmax(x, mask=mask, axis=1, num_threads=n) for n in (1, 3)]
    assert same_bits(cols[0], cols[1])


def test_axis_equals_moved_last_axis(isa):
    """The gathered (strided) path and the contiguous path give the same bits."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 40, 6)).astype(np.float32)
    a = masked_softmax(x, axis=1)
    b = np.moveaxis(masked_softmax(np.ascontiguousarray(np.moveaxis(x, 1, -1))), -1, 1)
    assert same_bits(np.ascontiguousarray(a), np.ascontiguousarray(b))


def test_float16_and_inputs_untouched():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 9)).astype(np.float16)
    x0 = x.copy()
    w = masked_softmax(x, np.array([2, 9, 0]))
    assert w.dtype == np.float16
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_allclose(w, reference.masked_softmax(x, np.array([2, 9, 0])), atol=1e-3)
    out = np.full((3, 9), np.nan, np.float16)
    assert masked_softmax(x, np.array([2, 9, 0]), out=out) is out
    np.testing.assert_array_equal(out, w)


def test_empty():
    assert masked_softmax(np.zeros((3, 0), np.float32)).shape == (3, 0)
    assert masked_softmax(np.zeros((0, 5)), np.zeros(0, int)).shape == (0, 5)


# --------------------------------------------------------------------------------------
# Bad input: the same errors from fastattn and the reference (one validation layer).

BAD = [
    ({"axis": 3}, ValueError, "axis 3 is out of bounds"),
    ({"axis": 1.0}, TypeError, "axis must be an int"),
    ({"axis": True}, TypeError, "axis must be an int"),
    ({"mask": np.ones(4, np.int8)}, TypeError, "mask must be a bool array"),
    ({"mask": np.ones(5, bool)}, ValueError, r"mask of shape \(5,\) does not broadcast"),
    ({"valid_lens": np.array([1.0])}, TypeError, "valid_lens must be an integer array"),
    ({"valid_lens": np.array([5, 1])}, ValueError, r"valid_lens must lie in \[0, 4\]"),
    ({"valid_lens": np.ones((3,), int)}, ValueError, "not a leading prefix"),
    ({"out": np.empty((2, 3, 4))}, ValueError, "out must have shape"),
    ({"out": [0.0]}, TypeError, "out must be a numpy.ndarray"),
    ({"num_threads": 0}, ValueError, "num_threads must be >= 1"),
    ({"num_threads": 1.5}, TypeError, "num_threads must be an integer"),
]


@IMPLS
@pytest.mark.parametrize(("kwargs", "exc", "pattern"), BAD)
def test_bad_input(fn, kwargs, exc, pattern):
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(exc, match=pattern):
        fn(x, **kwargs)


@IMPLS
@pytest.mark.parametrize("bad", [np.arange(4), np.zeros(4, complex), 1.5, "x"])
def test_bad_x(fn, bad):
    with pytest.raises((TypeError, ValueError), match=r"\bx\b"):
        fn(bad)


def test_out_aliasing_x_rejected():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="out shares memory with x"):
        masked_softmax(x, out=x)

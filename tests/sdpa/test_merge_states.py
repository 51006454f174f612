"""fastattn.merge_attention_states: against its float64 NumPy twin, as the merge of chunked
scaled_dot_product_attention calls, its special values, determinism and its errors.

Every kernel test runs once per ISA the CPU supports (the ``isa`` fixture).
"""

from __future__ import annotations

import doctest
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from cuda_path.test_dispatch import _stub_cupy
from helpers.attention_checks import assert_close, attention_tolerances, with_layout

DTYPES = {"f2": np.float16, "f4": np.float32, "f8": np.float64}
# Layouts a part may arrive in (broadcast parts included: they are read in place).
PART_LAYOUTS = ("c", "slice", "lastaxis", "fortran", "reversed", "bcast")
EPS = {np.float16: 2.0**-11, np.float32: 2.0**-24, np.float64: 2.0**-53}

fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def _tolerance(dtype, parts: int) -> float:
    """Merged values are convex combinations of O(1) entries: a few rounding errors of the
    compute dtype per part, plus the result's own rounding (float16)."""
    compute = np.float32 if dtype == np.float16 else dtype
    return 8 * parts * EPS[compute] + 2 * EPS[dtype]


@st.composite
def merge_cases(draw):
    """(outputs, lses, result dtype) with -inf lses in some rows and every layout."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    parts = draw(st.integers(1, 6))
    rows = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))) + (
        draw(st.integers(1, 9)),
    )
    ev = draw(st.sampled_from([1, 3, 8, 16, 17, 64, 70]))
    dtypes = [DTYPES[draw(st.sampled_from(sorted(DTYPES)))] for _ in range(2 * parts)]
    outputs, lses = [], []
    for i in range(parts):
        o = rng.standard_normal(rows + (ev,)).astype(dtypes[i])
        outputs.append(with_layout(o, draw(st.sampled_from(PART_LAYOUTS))))
        # lse spread so weights differ by orders of magnitude; some rows saw no key.
        x = rng.normal(0.0, draw(st.sampled_from([0.5, 5.0, 40.0])), rows)
        x = np.where(rng.random(rows) < draw(st.sampled_from([0.0, 0.3, 0.9])), -np.inf, x)
        lses.append(x.astype(dtypes[parts + i]))
    return outputs, lses, np.result_type(*dtypes)


@fixture_ok
@given(case=merge_cases(), use_out=st.booleans(), threads=st.sampled_from([1, 2, 3]))
def test_matches_reference(isa, case, use_out, threads):
    outputs, lses, result_dtype = case
    out = None
    if use_out:
        out = np.full(outputs[0].shape, np.nan, result_dtype)  # poisoned: every entry written
    got, got_lse = fastattn.merge_attention_states(outputs, lses, out=out, num_threads=threads)
    expected, expected_lse = reference.merge_attention_states(outputs, lses)
    if use_out:
        assert got is out
    tol = _tolerance(result_dtype.type, len(outputs))
    assert_close("output", got, expected, tol)
    # lse = m + log(l) with l in [1, parts]: absolute error ~ |m| eps + eps.
    compute = np.float32 if result_dtype == np.float16 else result_dtype.type
    scale = np.nanmax(np.abs(np.where(np.isfinite(expected_lse), expected_lse, 0.0)), initial=1)
    assert_close("lse", got_lse, expected_lse, 8 * EPS[compute] * (1 + scale))
    empty = np.isneginf(expected_lse)
    assert (got[empty] == 0).all()


# --------------------------------------------------------------------------------------
# Chunked attention: merging per-chunk results equals the one-shot call


def _visible(lq: int, lk: int, alignment: str, causal: bool, window) -> np.ndarray:
    """(Lq, Lk) bool: which keys each row may see under causal/window and the alignment."""
    d = lk - lq if alignment == "bottom_right" else 0
    i = np.arange(lq)[:, None] + d
    j = np.arange(lk)[None, :]
    keep = np.ones((lq, lk), bool)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= (j >= i - window[0]) & (j <= i + window[1])
    return keep


@fixture_ok
@given(
    seed=st.integers(0, 2**32 - 1),
    lq=st.integers(1, 12),
    lk=st.integers(1, 40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    causal=st.booleans(),
    alignment=st.sampled_from(["top_left", "bottom_right"]),
    window=st.sampled_from([None, (3, 0), (5, 2)]),
    lens=st.sampled_from(["none", "per_row", "some_empty"]),
    dtype=st.sampled_from(["f4", "f8"]),
)
def test_chunks_merge_to_one_shot(isa, seed, lq, lk, cuts, causal, alignment, window, lens, dtype):
    """Keys split at ``cuts``; each chunk computed on its own with the one-shot call's
    visibility restricted to it (as a bool mask) and its valid_lens shifted, so some rows
    see nothing in some chunks (or in all of them)."""
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]
    q = rng.standard_normal((2, 3, lq, 8)).astype(dt)
    k = rng.standard_normal((2, 3, lk, 8)).astype(dt)
    v = rng.standard_normal((2, 3, lk, 5)).astype(dt)
    valid_lens = None
    if lens != "none":
        valid_lens = rng.integers(0, lk + 1, (2, 3, lq))
        if lens == "some_empty":
            valid_lens[:, 0] = 0  # whole heads with no key at all
    one_shot = fastattn.scaled_dot_product_attention(
        q,
        k,
        v,
        valid_lens=valid_lens,
        is_causal=causal,
        causal_alignment=alignment,
        window=window,
        return_lse=True,
    )
    expected = reference.scaled_dot_product_attention(
        q,
        k,
        v,
        valid_lens=valid_lens,
        is_causal=causal,
        causal_alignment=alignment,
        window=window,
        return_lse=True,
    )

    keep = _visible(lq, lk, alignment, causal, window)
    bounds = sorted({0, lk, *(c for c in cuts if c < lk)})
    outputs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        chunk_lens = None if valid_lens is None else np.clip(valid_lens - a, 0, b - a)
        o, lse = fastattn.scaled_dot_product_attention(
            q, k[..., a:b, :], v[..., a:b, :], keep[:, a:b], valid_lens=chunk_lens, return_lse=True
        )
        outputs.append(o)
        lses.append(lse)
    got, got_lse = fastattn.merge_attention_states(outputs, lses)

    out_tol, lse_tol, _ = attention_tolerances(q, k, v)
    assert_close("output", got, expected[0], 2 * out_tol)
    assert_close("lse", got_lse, expected[1], 2 * lse_tol)
    assert_close("output vs one-shot", got, one_shot[0], 2 * out_tol)
    empty = np.isneginf(expected[1])
    assert (got[empty] == 0).all() and np.isneginf(got_lse[empty]).all()


# --------------------------------------------------------------------------------------
# Special values (docs/semantics.md#merging-partial-attention)

NEG_INF, NAN, INF = -np.inf, np.nan, np.inf


def _merge_rows(lse_rows, out_rows, dtype=np.float32):
    """Merge parts given as one row each: lse_rows[i] a scalar, out_rows[i] a vector."""
    outputs = [np.asarray(o, dtype)[None] for o in out_rows]
    lses = [np.asarray([x], dtype) for x in lse_rows]
    return fastattn.merge_attention_states(outputs, lses)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(isa, dtype):
    # Every part saw nothing: zeros and -inf, whatever the rows hold.
    out, lse = _merge_rows([NEG_INF, NEG_INF], [[NAN, 1.0], [INF, 2.0]], dtype)
    assert (out == 0).all() and np.isneginf(lse).all()
    # A -inf part is never read: its NaN does not leak.
    out, lse = _merge_rows([0.5, NEG_INF], [[1.0, 2.0], [NAN, NAN]], dtype)
    np.testing.assert_array_equal(out, [[1.0, 2.0]])
    assert lse[0] == dtype(0.5)
    # A NaN or +inf lse: the row and its lse are NaN.
    for bad in (NAN, INF):
        out, lse = _merge_rows([0.0, bad, NEG_INF], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype)
        assert np.isnan(out).all() and np.isnan(lse).all()
    # A NaN entry in a part with a finite lse: that entry only (even if its weight is ~0).
    out, lse = _merge_rows([0.0, -1000.0], [[1.0, 2.0], [NAN, 4.0]], dtype)
    assert np.isnan(out[0, 0]) and out[0, 1] == dtype(2.0) and lse[0] == 0
    for fn in (fastattn.merge_attention_states, reference.merge_attention_states):
        o, x = fn([np.array([[NAN, 4.0]], dtype)], [np.array([NEG_INF], dtype)])
        assert (o == 0).all() and np.isneginf(x).all()


def test_one_part_is_the_identity(isa):
    rng = np.random.default_rng(0)
    o = rng.standard_normal((3, 5, 33)).astype(np.float32)
    lse = rng.normal(0, 30, (3, 5)).astype(np.float32)
    got, got_lse = fastattn.merge_attention_states([o], [lse])
    np.testing.assert_array_equal(got, o)
    np.testing.assert_array_equal(got_lse, lse)


def test_equal_lses_average(isa):
    a, b = np.full((4, 16), 1.0), np.full((4, 16), 3.0)
    out, lse = fastattn.merge_attention_states([a, b], [np.zeros(4), np.zeros(4)])
    np.testing.assert_allclose(out, 2.0, rtol=1e-15)
    np.testing.assert_allclose(lse, np.log(2.0), rtol=1e-15)


def test_dtypes():
    rng = np.random.default_rng(1)
    o16 = rng.standard_normal((2, 3, 4)).astype(np.float16)
    l16 = rng.standard_normal((2, 3)).astype(np.float16)
    out, lse = fastattn.merge_attention_states([o16, o16], [l16, l16])
    assert out.dtype == np.float16 and lse.dtype == np.float32
    out, lse = fastattn.merge_attention_states([o16, o16.astype(np.float64)], [l16, l16])
    assert out.dtype == np.float64 and lse.dtype == np.float64
    out, lse = fastattn.merge_attention_states([o16], [l16.astype(np.float32)])
    assert out.dtype == np.float32 and lse.dtype == np.float32
    # Big-endian parts are read like native ones.
    out, lse = fastattn.merge_attention_states([o16.astype(">f8")], [l16.astype(">f4")])
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, o16.astype(np.float64))


def test_empty_shapes():
    out, lse = fastattn.merge_attention_states([np.zeros((2, 0, 4))] * 3, [np.zeros((2, 0))] * 3)
    assert out.shape == (2, 0, 4) and lse.shape == (2, 0)
    # No value columns: the lse is still merged.
    out, lse = fastattn.merge_attention_states([np.zeros((3, 0))] * 2, [np.zeros(3)] * 2)
    assert out.shape == (3, 0)
    np.testing.assert_allclose(lse, np.log(2.0))


def test_out_not_in_place_and_sequences():
    rng = np.random.default_rng(2)
    parts = rng.standard_normal((3, 4, 6, 8))  # an ndarray is the sequence of its parts
    lses = rng.standard_normal((3, 4, 6))
    expected, expected_lse = reference.merge_attention_states(parts, lses)
    out = np.full((8, 6, 4), np.nan).transpose(2, 1, 0)  # no unit-stride last axis
    got, got_lse = fastattn.merge_attention_states(tuple(parts), iter(lses), out=out)
    assert got is out
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(got_lse, expected_lse, rtol=1e-13)


def test_bit_identical_for_any_thread_count(isa):
    rng = np.random.default_rng(3)
    outputs = [rng.standard_normal((2, 4, 300, 40)).astype(np.float32) for _ in range(5)]
    lses = [rng.normal(0, 10, (2, 4, 300)).astype(np.float32) for _ in range(5)]
    first, first_lse = fastattn.merge_attention_states(outputs, lses, num_threads=1)
    for threads in (2, 3, 7):
        got, got_lse = fastattn.merge_attention_states(outputs, lses, num_threads=threads)
        assert got.tobytes() == first.tobytes() and got_lse.tobytes() == first_lse.tobytes()


# --------------------------------------------------------------------------------------
# Errors (fastattn/_validation.py): the same for the fast path and the twin

TWINS = [fastattn.merge_attention_states, reference.merge_attention_states]
PART, LSE = np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float32)


@pytest.mark.parametrize("fn", TWINS)
@pytest.mark.parametrize(
    ("outputs", "lses", "error", "message"),
    [
        (5, [LSE], TypeError, "outputs must be a sequence of arrays, got int"),
        ([PART], "lse", TypeError, "lses must be a sequence of arrays, got str"),
        ([], [], ValueError, "outputs must hold at least one array, got an empty sequence"),
        ([PART], [], ValueError, "lses must hold at least one array, got an empty sequence"),
        (
            [PART, PART],
            [LSE],
            ValueError,
            "lses must hold one array per output: got 2 outputs and 1 lses",
        ),
        (
            [PART, PART[:, :2]],
            [LSE, LSE],
            ValueError,
            "outputs[1] has shape (2, 2, 4) but outputs[0] has shape (2, 3, 4): every part must "
            "have the same shape (parts do not broadcast)",
        ),
        (
            [PART, PART],
            [LSE, LSE[:1]],
            ValueError,
            "lses[1] must have shape (2, 3) (the outputs' shape without the last axis), got (1, 3)",
        ),
        (
            [PART.astype(int)],
            [LSE],
            TypeError,
            "outputs[0] must be a floating-point array (float16, float32 or float64), got dtype "
            "int64",
        ),
        (
            [PART],
            [LSE.astype(bool)],
            TypeError,
            "lses[0] must be a floating-point array (float16, float32 or float64), got dtype bool",
        ),
        (
            [PART[0, 0]],
            [LSE[0]],
            ValueError,
            "outputs[0] must have at least 2 dimensions (..., L, E), got shape (4,)",
        ),
    ],
)
def test_errors(fn, outputs, lses, error, message):
    with pytest.raises(error) as info:
        fn(outputs, lses)
    assert str(info.value) == message


@pytest.mark.parametrize("fn", TWINS)
def test_out_errors(fn):
    with pytest.raises(
        ValueError,
        match=r"^out must have shape \(2, 3, 4\) and dtype float32, "
        r"got shape \(2, 3, 5\) and dtype float32$",
    ):
        fn([PART], [LSE], out=np.zeros((2, 3, 5), np.float32))
    with pytest.raises(ValueError, match=r"dtype float64, got shape \(2, 3, 4\) and dtype float32"):
        fn([PART.astype(np.float64)], [LSE], out=np.zeros((2, 3, 4), np.float32))
    part = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"^out shares memory with outputs\[1\]; pass a separate"):
        fn([PART, part], [LSE, LSE], out=part)
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (2, 3, 4), (0, 0, 4))
    with pytest.raises(ValueError, match=r"^out has overlapping elements"):
        fn([PART], [LSE], out=overlapping)
    with pytest.raises(ValueError, match=r"^num_threads"):
        fn([PART], [LSE], num_threads=0)


def test_cupy_arrays_are_not_supported(monkeypatch):
    module = _stub_cupy()
    monkeypatch.setitem(sys.modules, "cupy", module)
    with pytest.raises(NotImplementedError, match="^merge_attention_states does not run on CuPy"):
        fastattn.merge_attention_states([module.ndarray(PART)], [module.ndarray(LSE)])


def test_docstring_examples(isa):
    """The docstrings' examples (the API reference's doctests) pass."""
    import fastattn._sdpa as mod

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for fn in (mod.merge_attention_states, reference.merge_attention_states):
        for test in finder.find(fn, fn.__qualname__, globs={}):
            runner.run(test)
    assert runner.failures == 0 and runner.tries > 0

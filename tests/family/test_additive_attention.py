"""fastattn.additive_attention against its NumPy twin (the d2l broadcast formula in float64)
on every ISA: layouts, GQA, dtypes, masks, both score paths, degenerate inputs.

Score tolerance: the projections ``a = q w_q``, ``b = k w_k`` carry ``eps * D * (|q| @ |w|)``;
tanh is 1-Lipschitz and evaluated to a few ulp; the hidden sum adds ``H`` roundings; so
``score_err = eps * sum|w_v| * (16 + H + (Dq + 2) * max(|q| @ |w_q|) + (Dk + 2) * max(|k| @
|w_k|))`` (plus the float mask's size); see ``family_checks`` for weights and outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close, same_bits
from helpers.family_checks import (
    DTYPES,
    additive_score_error,
    build,
    compute_eps,
    finite_max,
    fixture_ok,
    out_buffer,
    specs,
    tolerances,
)

additive = fastattn.additive_attention


def make_weights(seed, dq, dk, hidden, dtype=np.float32, scale=1.0):
    rng = np.random.default_rng(seed)
    w_q = (rng.standard_normal((dq, hidden)) * scale / np.sqrt(dq)).astype(dtype)
    w_k = (rng.standard_normal((dk, hidden)) * scale / np.sqrt(dk)).astype(dtype)
    w_v = rng.standard_normal(hidden).astype(dtype)
    return w_q, w_k, w_v


def check(q, k, v, w_q, w_k, w_v, *, return_weights=False, use_out=False, **kwargs):
    expected, exp_w = reference.additive_attention(
        q, k, v, w_q, w_k, w_v, return_weights=True, **kwargs
    )
    out = out_buffer(expected) if use_out else None
    got = additive(q, k, v, w_q, w_k, w_v, return_weights=return_weights, out=out, **kwargs)
    got_w = None
    if return_weights:
        got, got_w = got
    if use_out:
        assert got is out
    eps, f16 = compute_eps(q, k, v, w_q, w_k, w_v)
    err = additive_score_error(q, k, w_q, w_k, w_v, kwargs.get("attn_mask"))
    out_tol, w_tol = tolerances(err, k.shape[-2], finite_max(v), eps, f16)
    assert_close("output", got, expected, out_tol)
    if got_w is not None:
        assert_close("weights", got_w, exp_w, w_tol)
    # Fully masked rows are exactly 0.
    empty = np.all(exp_w == 0, axis=-1)
    assert (got[empty] == 0).all()
    return got


@st.composite
def additive_cases(draw, masks="maybe", huge=False):
    spec = draw(specs(same_features=False, masks=masks, budget=30_000))
    hidden = draw(st.one_of(st.integers(1, 9), st.integers(10, 40)))
    w_dtype = draw(st.sampled_from(sorted(DTYPES)))
    scale = draw(st.sampled_from([40.0, 200.0])) if huge else draw(st.sampled_from([0.3, 1.0, 3.0]))
    return spec, hidden, w_dtype, scale


def run_case(case):
    spec, hidden, w_dtype, scale = case
    q, k, v, kwargs = build(spec)
    w = make_weights(spec.seed, q.shape[-1], k.shape[-1], hidden, DTYPES[w_dtype], scale)
    check(q, k, v, *w, return_weights=spec.return_weights, use_out=spec.out, **kwargs)


@fixture_ok(1.5)
@given(case=additive_cases())
def test_matches_reference(isa, case):
    """Shapes, GQA, Dq != Dk, hidden sizes (odd ones too), dtypes, layouts, masks, out=."""
    run_case(case)


@fixture_ok(0.75)
@given(case=additive_cases(masks="always"))
def test_matches_reference_with_masks(isa, case):
    run_case(case)


@fixture_ok(0.5)
@given(case=additive_cases(huge=True))
def test_huge_projections(isa, case):
    """Projections far beyond +-40 take the direct-tanh path (saturating scores)."""
    run_case(case)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_both_score_paths_agree(isa, dtype):
    """One projection over the exponential path's bound switches the whole call to the
    direct tanh; both match the reference."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 19, 7)).astype(dtype)
    k = rng.standard_normal((2, 23, 5)).astype(dtype)
    v = rng.standard_normal((2, 23, 6)).astype(dtype)
    w = make_weights(6, 7, 5, 33, dtype)
    moderate = check(q, k, v, *w)
    q2 = q.copy()
    q2[1, 3, :] *= 1e3  # only row 3 of batch 1 saturates
    far = check(q2, k, v, *w)
    np.testing.assert_allclose(
        far[0], moderate[0], rtol=0, atol=1e-4 if dtype == np.float32 else 1e-12
    )


def test_large_call_decode_and_long_keys(isa):
    """Several key blocks and query tasks (Lk > 256, Lq > 16), causal bottom-right."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 40, 16)).astype(np.float32)
    k = rng.standard_normal((1, 600, 16)).astype(np.float32)
    v = rng.standard_normal((1, 600, 8)).astype(np.float32)
    w = make_weights(8, 16, 16, 24)
    check(q, k, v, *w, is_causal=True, causal_alignment="bottom_right", return_weights=True)


def test_degenerate(isa):
    rng = np.random.default_rng(9)
    q = rng.standard_normal((3, 4)).astype(np.float32)
    v = rng.standard_normal((5, 2)).astype(np.float32)
    k = rng.standard_normal((5, 6)).astype(np.float32)
    w_q, w_k, w_v = make_weights(1, 4, 6, 8)
    # No keys: zeros.
    out = additive(q, k[:0], v[:0], w_q, w_k, w_v)
    np.testing.assert_array_equal(out, np.zeros((3, 2), np.float32))
    # hidden = 0: every score 0, the mean of the values.
    out = additive(q, k, v, w_q[:, :0], w_k[:, :0], w_v[:0])
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=0), (3, 2)), atol=1e-6)
    # No queries.
    assert additive(q[:0], k, v, w_q, w_k, w_v).shape == (0, 2)
    # Every key masked for row 1, valid_lens 0 for everything else.
    mask = np.ones((3, 5), bool)
    mask[1] = False
    out, wts = additive(q, k, v, w_q, w_k, w_v, mask, return_weights=True)
    assert (out[1] == 0).all() and (wts[1] == 0).all()
    np.testing.assert_allclose(wts.sum(axis=-1)[[0, 2]], 1.0, rtol=1e-6)


def test_nan_query_row_is_nan_and_padding_never_read(isa):
    rng = np.random.default_rng(10)
    q = rng.standard_normal((2, 4, 3)).astype(np.float32)
    k = rng.standard_normal((2, 6, 3)).astype(np.float32)
    v = rng.standard_normal((2, 6, 2)).astype(np.float32)
    w = make_weights(2, 3, 3, 5)
    q[0, 1, 0] = np.nan
    k[1, 4:] = np.nan  # past valid_lens[1] = 4: never matters
    v[1, 4:] = np.nan
    out = additive(q, k, v, *w, valid_lens=np.array([6, 4]))
    assert np.isnan(out[0, 1]).all()
    assert np.isfinite(np.delete(out.reshape(-1, 2), 1, axis=0)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_thread_count_does_not_change_bits(dtype):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 2, 70, 12)).astype(dtype)
    k = rng.standard_normal((2, 1, 300, 10)).astype(dtype)
    v = rng.standard_normal((2, 1, 300, 9)).astype(dtype)
    w = make_weights(3, 12, 10, 17, dtype)
    runs = [
        additive(q, k, v, *w, is_causal=True, return_weights=True, num_threads=n)
        for n in (1, 2, 3, 5)
    ]
    for out, wts in runs[1:]:
        assert same_bits(out, runs[0][0]) and same_bits(wts, runs[0][1])


def test_matches_attention_score_additive():
    rng = np.random.default_rng(12)
    q = rng.standard_normal((3, 9, 4)).astype(np.float32)
    k = rng.standard_normal((3, 11, 5)).astype(np.float32)
    v = rng.standard_normal((3, 11, 2)).astype(np.float32)
    w_q, w_k, w_v = make_weights(4, 4, 5, 6)
    a = additive(q, k, v, w_q, w_k, w_v)
    b = fastattn.attention(q, k, v, score="additive", w_q=w_q, w_k=w_k, w_v=w_v)
    assert same_bits(a, b)


def test_weights_promote_the_dtype():
    q = k = v = np.ones((2, 3), np.float32)
    w_q, w_k, w_v = make_weights(0, 3, 3, 4, np.float64)
    assert additive(q, k, v, w_q, w_k, w_v).dtype == np.float64
    assert (
        additive(
            q.astype(np.float16),
            k.astype(np.float16),
            v.astype(np.float16),
            *make_weights(0, 3, 3, 4, np.float16),
        ).dtype
        == np.float16
    )


def test_memory_stays_linear():
    """Lq = Lk = 2048, hidden 128: the broadcast formula's tensor would take 2 GiB of
    float32; the kernel's projections take 2 MiB (C++ allocations, so NumPy's tracemalloc
    hooks do not see them: the child's peak RSS is checked instead)."""
    import os
    import subprocess
    import sys

    code = (
        "import resource, numpy as np, fastattn\n"
        "rng = np.random.default_rng(0)\n"
        "q = rng.standard_normal((2048, 32), dtype=np.float32)\n"
        "w_q = rng.standard_normal((32, 128), dtype=np.float32) / 6\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out = fastattn.additive_attention(q, q, q, w_q, w_q, w_q[0], num_threads=2)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "assert np.isfinite(out).all()\n"
        "print((after - before) // 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=os.path.dirname(__file__),
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) < 64, f"peak RSS grew by {proc.stdout.strip()} MiB"


@pytest.mark.parametrize("padding", [np.nan, np.inf, 1e30])
def test_keys_past_valid_lens_are_never_read(isa, padding):
    """Whatever the keys past every valid length hold, the result has the same bits (their
    projections are never computed, so they cannot even switch the score path)."""
    rng = np.random.default_rng(13)
    q = rng.standard_normal((2, 2, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 1, 9, 3)).astype(np.float32)
    v = rng.standard_normal((2, 1, 9, 2)).astype(np.float32)
    w = make_weights(5, 4, 3, 7)
    vl = np.array([[4, 6], [9, 2]])
    clean = additive(q, k, v, *w, valid_lens=vl, return_weights=True)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 6:] = padding
    v2[0, :, 6:] = padding
    dirty = additive(q, k2, v2, *w, valid_lens=vl, return_weights=True)
    assert same_bits(clean[0], dirty[0]) and same_bits(clean[1], dirty[1])

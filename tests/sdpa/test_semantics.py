"""Targeted tests of docs/semantics.md, one rule at a time, on random data (fixed seeds).

Equivalences whose two sides read exactly the same numbers in the same order (a strided
view vs its contiguous copy, a stride-0 broadcast vs its materialised copy, any thread
count) are checked bit for bit; equivalences that may take different code paths (causal
vs an explicit mask, GQA vs repeated heads) within the tolerance of
``attention_checks.attention_tolerances``.
"""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import numpy as np
import pytest

import fastattn
from fastattn import reference

from helpers.attention_checks import (
    assert_close_attention,
    attention_tolerances,
    same_bits,
    unpack,
)
from helpers.reliability_checks import longest_pause_beside

sdpa = fastattn.scaled_dot_product_attention


def randn(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def qkv(seed, q_shape, k_shape, v_shape, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return randn(rng, q_shape, dtype), randn(rng, k_shape, dtype), randn(rng, v_shape, dtype)


def ref_triple(q, k, v, **kwargs):
    return reference.scaled_dot_product_attention(
        q, k, v, return_lse=True, return_weights=True, **kwargs
    )


def check_against_reference(q, k, v, **kwargs):
    """fastattn (with lse and weights) vs the reference; returns fastattn's triple."""
    got = sdpa(q, k, v, return_lse=True, return_weights=True, **kwargs)
    assert_close_attention(
        got,
        ref_triple(q, k, v, **kwargs),
        q,
        k,
        v,
        attn_mask=kwargs.get("attn_mask"),
        scale=kwargs.get("scale"),
        softcap=kwargs.get("softcap"),
    )
    return got


# --------------------------------------------------------------------------------------
# out= (docs/semantics.md#outputs)


OUT_CASES = {
    "f32-4d": ((2, 3, 70, 16), (2, 3, 90, 16), (2, 3, 90, 8), np.float32),
    "f64-3d": ((3, 9, 5), (3, 11, 5), (3, 11, 7), np.float64),
    "f16-4d": ((2, 2, 33, 8), (2, 1, 40, 8), (2, 1, 40, 8), np.float16),
    "f32-2d": ((17, 4), (23, 4), (23, 6), np.float32),
    "bcast-batch": ((1, 2, 10, 8), (3, 2, 12, 8), (1, 2, 12, 8), np.float32),
}


@pytest.mark.parametrize("layout", ["c", "fortran", "strided"])
@pytest.mark.parametrize("case", sorted(OUT_CASES))
def test_out_poisoned_buffer_fully_written(isa, case, layout):
    q_shape, k_shape, v_shape, dtype = OUT_CASES[case]
    q, k, v = qkv(7, q_shape, k_shape, v_shape, dtype)
    kwargs = {"is_causal": True, "causal_alignment": "bottom_right"}
    expected = sdpa(q, k, v, **kwargs)
    shape = expected.shape
    if layout == "c":
        base = out = np.full(shape, np.nan, dtype)
    elif layout == "fortran":
        base = out = np.asfortranarray(np.full(shape, np.nan, dtype))
    else:  # every other row of a bigger buffer: the rows in between must stay untouched
        big = list(shape)
        big[-2] *= 2
        base = np.full(big, np.nan, dtype)
        out = base[..., ::2, :]
    got = sdpa(q, k, v, out=out, **kwargs)
    assert got is out
    assert not np.isnan(out).any()
    assert same_bits(out, expected)
    if layout == "strided":
        assert np.isnan(base[..., 1::2, :]).all(), "out= wrote outside the view it was given"


@pytest.mark.parametrize("flags", [(True, False), (False, True), (True, True)])
def test_out_with_lse_and_weights(isa, flags):
    return_lse, return_weights = flags
    q, k, v = qkv(8, (2, 4, 19, 8), (2, 2, 25, 8), (2, 2, 25, 8), np.float16)
    kwargs = {
        "valid_lens": np.array([25, 3]),
        "return_lse": return_lse,
        "return_weights": return_weights,
    }
    out = np.full((2, 4, 19, 8), np.nan, np.float16)
    got = unpack(sdpa(q, k, v, out=out, **kwargs), return_lse, return_weights)
    plain = unpack(sdpa(q, k, v, **kwargs), return_lse, return_weights)
    assert got[0] is out
    assert same_bits(out, plain[0])
    for a, b in zip(got[1:], plain[1:]):
        if a is not None:
            assert same_bits(a, b)


def test_out_float16_result(isa):
    q, k, v = qkv(9, (3, 20, 16), (3, 30, 16), (3, 30, 16), np.float16)
    out = np.full((3, 20, 16), np.nan, np.float16)
    assert sdpa(q, k, v, out=out) is out
    assert out.dtype == np.float16
    assert same_bits(out, sdpa(q, k, v))
    expected = reference.scaled_dot_product_attention(q, k, v)
    assert_close_attention((out, None, None), (expected, None, None), q, k, v)


def test_reference_out_poisoned():
    q, k, v = qkv(10, (2, 5, 6), (2, 7, 6), (2, 7, 3), np.float64)
    out = np.full((2, 5, 3), np.nan)
    assert reference.scaled_dot_product_attention(q, k, v, out=out) is out
    np.testing.assert_array_equal(out, reference.scaled_dot_product_attention(q, k, v))


# --------------------------------------------------------------------------------------
# Inputs are never modified


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_inputs_not_modified(sdpa_impl, dtype):
    fn = sdpa_impl
    rng = np.random.default_rng(11)
    base = randn(rng, (2, 40, 4, 16), dtype)
    q = base.swapaxes(1, 2)  # a strided view
    k = randn(rng, (2, 2, 50, 16), dtype)
    v = np.asfortranarray(randn(rng, (2, 2, 50, 12), dtype))
    float_mask = randn(rng, (4, 40, 50), np.float32)
    bool_mask = rng.random((40, 50)) < 0.7
    valid_lens = np.array([50, 17])
    before = [a.copy() for a in (base, k, v, float_mask, bool_mask, valid_lens)]
    out = np.empty((2, 4, 40, 12), dtype)
    fn(
        q,
        k,
        v,
        float_mask,
        valid_lens=valid_lens,
        is_causal=True,
        window=(30, None),
        softcap=5.0,
        return_lse=True,
        return_weights=True,
        out=out,
    )
    fn(q, k, v, bool_mask, valid_lens=valid_lens)
    for old, new in zip(before, (base, k, v, float_mask, bool_mask, valid_lens)):
        assert same_bits(old, new)


# --------------------------------------------------------------------------------------
# Threads: identical bits for any count (docs/semantics.md#determinism)

THREAD_CASES = {
    "causal-gqa": (((2, 6, 150, 40), (2, 3, 170, 40), (2, 3, 170, 24)), {"is_causal": True}),
    "decode": (((1, 4, 1, 64), (1, 4, 3000, 64), (1, 4, 3000, 64)), {}),
    "decode-few-rows": (
        ((2, 2, 3, 32), (2, 1, 2500, 32), (2, 1, 2500, 32)),
        {
            "is_causal": True,
            "causal_alignment": "bottom_right",
            "valid_lens": np.array([2500, 1700]),
        },
    ),
    "masks": (
        ((3, 2, 100, 16), (3, 2, 260, 16), (3, 2, 260, 16)),
        {"window": (50, 10), "softcap": 3.0},
    ),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(THREAD_CASES))
def test_bit_identical_for_any_thread_count(isa, case, dtype):
    shapes, kwargs = THREAD_CASES[case]
    q, k, v = qkv(12, *shapes, dtype)
    rng = np.random.default_rng(13)
    if case == "masks":
        kwargs = dict(kwargs, attn_mask=randn(rng, shapes[0][:-1] + (shapes[1][-2],), dtype))
    results = {}
    for n in (1, 2, 3, 7):
        results[n] = sdpa(q, k, v, num_threads=n, return_lse=True, return_weights=True, **kwargs)
    for n in (2, 3, 7):
        for a, b in zip(results[1], results[n]):
            assert same_bits(a, b), f"num_threads={n} differs from num_threads=1"
    for n in (2, 7):
        with fastattn.set_num_threads(n):
            assert fastattn.get_num_threads() == n
            got = sdpa(q, k, v, **kwargs)
        assert same_bits(got, results[1][0])
    assert_close_attention(
        results[1],
        ref_triple(q, k, v, **kwargs),
        q,
        k,
        v,
        attn_mask=kwargs.get("attn_mask"),
        softcap=kwargs.get("softcap"),
    )


@pytest.mark.parametrize("is_causal", [False, True])
def test_read_ahead_calls(isa, is_causal):
    """A call whose q/k/v outgrow the caches (16 MiB) reads each thread's next task ahead
    and hands tasks out as it goes: same bits for any thread count, within the tolerances."""
    q, k, v = qkv(15, (32, 8, 128, 64), (32, 4, 128, 64), (32, 4, 128, 64))
    assert q.nbytes + k.nbytes + v.nbytes >= 16 << 20
    ones = sdpa(q, k, v, is_causal=is_causal, num_threads=1, return_lse=True)
    for n in (2, 3):
        for a, b in zip(ones, sdpa(q, k, v, is_causal=is_causal, num_threads=n, return_lse=True)):
            assert same_bits(a, b), f"num_threads={n} differs from num_threads=1"
    expected = reference.scaled_dot_product_attention(
        q[:6], k[:6], v[:6], is_causal=is_causal, return_lse=True, return_weights=True
    )
    assert_close_attention((ones[0][:6], ones[1][:6], None), expected, q[:6], k[:6], v[:6])


def test_concurrent_python_threads(isa):
    """Calls from several Python threads at once give the same results as serial calls."""
    rng = np.random.default_rng(14)
    cases = [
        tuple(randn(rng, s) for s in ((2, 64, 16), (2, 80, 16), (2, 80, 16))) for _ in range(4)
    ]
    expected = [sdpa(*c, is_causal=True, num_threads=1) for c in cases]
    results = [None] * len(cases)
    errors = []

    def work(i):
        try:
            for _ in range(10):
                results[i] = sdpa(*cases[i], is_causal=True, num_threads=2)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for got, exp in zip(results, expected):
        assert same_bits(got, exp)


def test_gil_released_during_kernel():
    """While one thread computes, another keeps running Python: the GIL is released."""
    rng = np.random.default_rng(15)
    k, v = (randn(rng, (1, 2048, 64)) for _ in range(2))
    rows = 256
    while True:  # a call long enough (>= 0.1 s) that holding the GIL would show
        q = randn(rng, (1, rows, 64))
        start = time.perf_counter()
        sdpa(q, k, v, num_threads=1)
        duration = time.perf_counter() - start
        if duration >= 0.1 or rows >= 2**16:
            break
        rows *= 2
    pause, turns = longest_pause_beside(lambda: sdpa(q, k, v, num_threads=1))
    # Holding the GIL would stall this thread's loop for a whole kernel call (>= `duration`).
    assert turns > 10
    assert pause < 0.5 * duration, (pause, duration)


# --------------------------------------------------------------------------------------
# Excluded keys are never used (valid_lens: never read): docs/semantics.md#valid-lens,
# #nan-and-inf


@pytest.mark.parametrize("poison", [np.nan, np.inf])
@pytest.mark.parametrize(
    "form", ["per-batch", "per-head", "per-query", "d2l-3d-per-batch", "d2l-3d-per-query"]
)
def test_valid_lens_padding_is_never_read(isa, form, poison):
    rng = np.random.default_rng(16)
    b, h, lq, lk, e = 3, 2, 70, 150, 24
    if form.startswith("d2l"):
        q, k, v = randn(rng, (b, lq, e)), randn(rng, (b, lk, e)), randn(rng, (b, lk, 8))
        if form == "d2l-3d-per-batch":
            vl = np.array([150, 0, 77])
        else:
            vl = rng.integers(0, 100, size=(b, lq))
        reach = vl.reshape(b, -1).max(axis=1)  # keys each batch entry may read
    else:
        q, k, v = (randn(rng, (b, h, lq, e)), randn(rng, (b, h, lk, e)), randn(rng, (b, h, lk, 8)))
        if form == "per-batch":
            vl = np.array([150, 0, 77])
            reach = np.broadcast_to(vl[:, None], (b, h))
        elif form == "per-head":
            vl = rng.integers(0, lk + 1, size=(b, h))
            reach = vl
        else:
            vl = rng.integers(0, lk + 1, size=(b, 1, lq))
            reach = np.broadcast_to(vl.max(axis=-1), (b, h))
    clean_k, clean_v = k.copy(), v.copy()
    for idx in np.ndindex(*reach.shape):
        k[idx][reach[idx] :] = poison
        v[idx][reach[idx] :] = poison
    out, lse, w = sdpa(q, k, v, valid_lens=vl, return_lse=True, return_weights=True)
    assert np.isfinite(out).all()
    assert not np.isnan(lse).any() and not np.isnan(w).any()
    expected = ref_triple(q, clean_k, clean_v, valid_lens=vl)
    assert_close_attention((out, lse, w), expected, q, clean_k, clean_v)
    plain = sdpa(q, k, v, valid_lens=vl)  # without lse/weights: the same
    assert same_bits(plain, out)


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_reference_ignores_padding_past_valid_lens(poison):
    """The oracle keeps the same promise (padding may hold garbage), quietly."""
    rng = np.random.default_rng(16)
    q, k, v = randn(rng, (3, 2, 9, 4)), randn(rng, (3, 2, 12, 4)), randn(rng, (3, 2, 12, 3))
    vl = np.array([12, 0, 5])
    clean_k, clean_v = k.copy(), v.copy()
    for b, n in enumerate(vl):
        k[b, :, n:] = poison
        v[b, :, n:] = poison
    expected = ref_triple(q, clean_k, clean_v, valid_lens=vl)
    got = ref_triple(q, k, v, valid_lens=vl)  # must not warn (warnings are errors here)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def _rows_attending(visible: np.ndarray, bad_keys) -> np.ndarray:
    """Rows of an (Lq, Lk) visibility matrix that see any of ``bad_keys``."""
    return visible[:, bad_keys].any(axis=1)


EXCLUSION_CASES = {
    # name: (Lq, Lk, kwargs, poisoned keys)
    "causal-top-left": (140, 140, {"is_causal": True}, [70, 139]),
    "causal-bottom-right-decode": (
        5,
        300,
        {"is_causal": True, "causal_alignment": "bottom_right"},
        [299, 298],
    ),
    "causal-bottom-right-short": (
        90,
        40,
        {"is_causal": True, "causal_alignment": "bottom_right"},
        [39],
    ),
    "window": (130, 130, {"window": (3, 0)}, [0, 64, 100]),
    "window-right": (130, 160, {"window": (None, 2)}, [100, 159]),
    "window-bottom-right": (
        50,
        200,
        {"window": (10, 5), "causal_alignment": "bottom_right"},
        [0, 120, 199],
    ),
    "causal-and-window": (100, 100, {"is_causal": True, "window": (7, None)}, [3, 50, 99]),
}


@pytest.mark.parametrize("poison", ["key-and-value", "value"])
@pytest.mark.parametrize("case", sorted(EXCLUSION_CASES))
def test_causal_and_window_exclude_poisoned_keys(isa, case, poison):
    """NaN in excluded keys: rows that do not attend them are finite and exact."""
    lq, lk, kwargs, bad = EXCLUSION_CASES[case]
    q, k, v = qkv(17, (2, lq, 32), (2, lk, 32), (2, lk, 16))
    clean_k, clean_v = k.copy(), v.copy()
    if poison == "key-and-value":
        k[:, bad] = np.nan
    v[:, bad] = np.nan
    out, lse, w = sdpa(q, k, v, return_lse=True, return_weights=True, **kwargs)
    expected = ref_triple(q, clean_k, clean_v, **kwargs)
    visible = expected[2][0] > 0  # (Lq, Lk): which keys each row attends
    assert visible.any(), "degenerate case: nothing visible"
    safe = ~_rows_attending(visible, bad)
    assert safe.any() and (~safe).any(), "the case must have rows on both sides"
    assert np.isfinite(out[:, safe]).all()
    sub = (out[:, safe], lse[:, safe], w[:, safe])
    exp_sub = tuple(a[:, safe] for a in expected)
    assert_close_attention(sub, exp_sub, q, clean_k, clean_v)
    plain = sdpa(q, k, v, **kwargs)  # without lse/weights: the same on the safe rows
    assert same_bits(plain[:, safe], out[:, safe])


@pytest.mark.parametrize("poison", ["key", "value", "key-and-value"])
def test_nan_in_an_attended_key_gives_nan(sdpa_impl, poison):
    """Garbage in an attended key/value is not hidden: that row's output holds NaN
    ("never a silent wrong answer"); rows that do not attend it stay finite."""
    q, k, v = qkv(33, (2, 8, 6), (2, 8, 6), (2, 8, 3), np.float64)
    if "key" in poison:
        k[:, 3] = np.nan
    if "value" in poison:
        v[:, 3] = np.nan
    out = sdpa_impl(q, k, v, is_causal=True)
    assert np.isfinite(out[:, :3]).all()
    assert np.isnan(out[:, 3:]).any(axis=-1).all(), out[:, 3:]


@pytest.mark.parametrize("kind", ["bool", "float-neginf"])
def test_masked_out_values_may_be_nan(isa, kind):
    """A key excluded by attn_mask contributes nothing even if its value is NaN."""
    q, k, v = qkv(18, (2, 3, 90, 16), (2, 3, 200, 16), (2, 3, 200, 8))
    bad = [0, 33, 150, 199]
    clean_v = v.copy()
    v[..., bad, :] = np.nan
    if kind == "bool":
        mask = np.ones(200, bool)
        mask[bad] = False
    else:
        mask = np.random.default_rng(19).standard_normal(200).astype(np.float32)
        mask[bad] = -np.inf
    got = sdpa(q, k, v, mask, return_lse=True, return_weights=True)
    assert np.isfinite(got[0]).all()
    expected = ref_triple(q, k, clean_v, attn_mask=mask)
    assert_close_attention(got, expected, q, k, clean_v, attn_mask=mask)
    assert (got[2][..., bad] == 0).all()


@pytest.mark.parametrize("excluded_row", [0, 1, 2, 3, 5])
def test_nan_value_excluded_for_one_row_of_a_tile(isa, excluded_row):
    """A row that excludes a NaN-valued key stays finite even when its neighbours (which
    share a register tile with it) attend that key and so become NaN themselves."""
    q, k, v = qkv(31, (1, 1, 8, 8), (1, 1, 16, 8), (1, 1, 16, 8))
    v[..., 5, :] = np.nan
    mask = np.ones((8, 16), bool)
    mask[excluded_row, 5] = False
    out = sdpa(q, k, v, mask)
    assert np.isfinite(out[0, 0, excluded_row]).all(), out[0, 0, excluded_row]
    others = [r for r in range(8) if r != excluded_row]
    assert np.isnan(out[0, 0, others]).all(axis=-1).all()
    clean_v = v.copy()
    clean_v[..., 5, :] = 0.0
    expected = reference.scaled_dot_product_attention(q, k, clean_v, mask)
    np.testing.assert_allclose(
        out[0, 0, excluded_row], expected[0, 0, excluded_row], rtol=1e-5, atol=1e-6
    )


# --------------------------------------------------------------------------------------
# GQA, broadcasting, strides (docs/semantics.md#gqa-and-mqa, #layout, #strides)


@pytest.mark.parametrize("hkv", [1, 2, 3, 6])
def test_gqa_equals_repeated_heads(isa, hkv):
    rng = np.random.default_rng(20)
    q = randn(rng, (2, 6, 75, 32))
    k = randn(rng, (2, hkv, 90, 32))
    v = randn(rng, (2, hkv, 90, 20))
    mask = rng.random((6, 75, 90)) < 0.8  # differs per query head
    kwargs = {"attn_mask": mask, "is_causal": True, "causal_alignment": "bottom_right"}
    group = 6 // hkv
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    got = sdpa(q, k, v, return_lse=True, return_weights=True, **kwargs)
    rep = sdpa(q, k_rep, v_rep, return_lse=True, return_weights=True, **kwargs)
    assert_close_attention(got, rep, q, k, v, attn_mask=mask)
    assert_close_attention(got, ref_triple(q, k_rep, v_rep, **kwargs), q, k, v, attn_mask=mask)
    # Query head h reads kv head h // group: changing kv head 0 changes only heads < group.
    k2 = k.copy()
    k2[:, 0] = randn(rng, k2[:, 0].shape)
    changed = sdpa(q, k2, v, **kwargs) != got[0]
    assert changed[:, :group].any()
    assert not changed[:, group:].any()


def test_broadcast_inputs_equal_materialised(isa):
    rng = np.random.default_rng(21)
    q = randn(rng, (3, 4, 50, 16))
    k1 = randn(rng, (1, 2, 70, 16))  # batch 1, two kv heads (GQA groups of 2)
    v1 = randn(rng, (3, 2, 70, 8))
    mask1 = rng.random((1, 4, 1, 70)) < 0.7
    vl1 = np.array([[60], [70], [5]])  # (3, 1): per batch entry, broadcast over heads
    kb = np.broadcast_to(k1, (3, 2, 70, 16))  # stride 0 on the batch axis
    v_rows = np.broadcast_to(v1[:, :, :1], v1.shape)  # stride 0 along the keys
    for kk, vv in ((kb, v1), (kb, v_rows)):
        a = sdpa(q, kk, vv, mask1, valid_lens=vl1, return_lse=True, return_weights=True)
        b = sdpa(
            q,
            kk.copy(),
            vv.copy(),
            np.broadcast_to(mask1, (3, 4, 50, 70)).copy(),
            valid_lens=np.broadcast_to(vl1, (3, 4)).copy(),
            return_lse=True,
            return_weights=True,
        )
        for x, y in zip(a, b):
            assert same_bits(x, y)
        assert_close_attention(a, ref_triple(q, kk, vv, attn_mask=mask1, valid_lens=vl1), q, kk, vv)
    # Leading dims of size 1 (or missing) broadcast like NumPy.
    c = sdpa(q, k1, v1, mask1, valid_lens=vl1)
    assert same_bits(c, sdpa(q, kb.copy(), v1, mask1, valid_lens=vl1))
    d = sdpa(q[:1], k1[0], v1)  # q batch 1, k 3-D (no batch), v batch 3
    assert d.shape == (3, 4, 50, 8)
    assert same_bits(d, sdpa(np.repeat(q[:1], 3, axis=0), kb.copy(), v1))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_blhe_swapaxes_view_equals_contiguous_copy(isa, dtype):
    rng = np.random.default_rng(22)
    q_blhe = randn(rng, (2, 65, 4, 24), dtype)  # (B, L, H, E) as from a projection
    k_blhe = randn(rng, (2, 80, 2, 24), dtype)
    v_blhe = randn(rng, (2, 80, 2, 16), dtype)
    q, k, v = (a.swapaxes(-2, -3) for a in (q_blhe, k_blhe, v_blhe))
    assert not q.flags.c_contiguous
    kwargs = {"is_causal": True, "return_lse": True}
    a = sdpa(q, k, v, **kwargs)
    b = sdpa(*(np.ascontiguousarray(x) for x in (q, k, v)), **kwargs)
    for x, y in zip(a, b):
        assert same_bits(x, y)
    assert_close_attention((a[0], a[1], None), ref_triple(q, k, v, is_causal=True), q, k, v)


@pytest.mark.parametrize(
    "layout", ["fortran", "slice-rows", "slice-last", "reversed", "big-endian"]
)
def test_other_layouts_equal_contiguous(isa, layout):
    rng = np.random.default_rng(23)
    arrays = [randn(rng, (3, 40, 12)), randn(rng, (3, 55, 12)), randn(rng, (3, 55, 7))]
    views = []
    for a in arrays:
        if layout == "fortran":
            views.append(np.asfortranarray(a))
        elif layout == "slice-rows":
            big = np.repeat(a, 2, axis=-2)
            big[..., 1::2, :] = np.nan
            views.append(big[..., ::2, :])
        elif layout == "slice-last":
            big = np.repeat(a, 3, axis=-1)
            big[..., 1::3] = np.nan
            big[..., 2::3] = np.nan
            views.append(big[..., ::3])
        elif layout == "reversed":
            views.append(np.ascontiguousarray(a[:, ::-1])[:, ::-1])
        else:
            views.append(a.astype(">f4"))
    for v, a in zip(views, arrays):
        np.testing.assert_array_equal(v, a)
    got = sdpa(*views, window=(5, 5))
    assert got.dtype == np.float32
    assert same_bits(got, sdpa(*arrays, window=(5, 5)))


def test_list_inputs(isa):
    q = [[1.0, 0.5], [0.25, -1.0]]
    k = [[0.5, 2.0], [-1.0, 1.0], [0.3, 0.3]]
    v = [[1.0], [2.0], [3.0]]
    got = sdpa(q, k, v)
    assert got.dtype == np.float64 and got.shape == (2, 1)
    np.testing.assert_allclose(
        got, reference.scaled_dot_product_attention(q, k, v), rtol=1e-13, atol=1e-13
    )


EMPTY_CASES = {
    "Lk=0": ((2, 5, 4), (2, 0, 4), (2, 0, 3)),  # every row fully masked
    "Lq=0": ((2, 0, 4), (2, 6, 4), (2, 6, 3)),
    "Ev=0": ((2, 5, 4), (2, 6, 4), (2, 6, 0)),
    "batch=0": ((0, 2, 5, 4), (0, 2, 6, 4), (0, 2, 6, 3)),
    "Hq=0": ((0, 5, 4), (1, 6, 4), (1, 6, 3)),
}


@pytest.mark.parametrize("case", sorted(EMPTY_CASES))
def test_empty_dimensions(isa, case):
    q, k, v = qkv(34, *EMPTY_CASES[case])
    got = check_against_reference(q, k, v, is_causal=True)
    assert got[0].shape == q.shape[:-1] + v.shape[-1:]
    if case == "Lk=0":
        assert np.isneginf(got[1]).all() and (got[0] == 0).all()


# --------------------------------------------------------------------------------------
# Documented results


def test_docstring_example(isa):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 16, 8), dtype=np.float32) for _ in range(3))
    out = sdpa(q, k, v, is_causal=True)
    assert out.shape == (2, 4, 16, 8) and out.dtype == np.float32
    assert np.allclose(out[..., 0, :], v[..., 0, :])
    # ... and the docstring's own doctest passes.
    import fastattn._sdpa as mod

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(mod.scaled_dot_product_attention, "sdpa", globs={}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0


def test_readme_example_shapes(isa):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 100, 64), dtype=np.float32) for _ in range(3))
    out, lse = sdpa(q, k, v, is_causal=True, return_lse=True)
    assert out.shape == (1, 2, 100, 64) and out.dtype == np.float32 and lse.shape == (1, 2, 100)


def _explicit_scores(q, k, scale=None, softcap=None, float_mask=None):
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    s = (q @ np.swapaxes(k, -1, -2)) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if float_mask is not None:
        s = s + float_mask
    return s


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lse_is_log_sum_exp_of_scores(isa, dtype):
    rng = np.random.default_rng(24)
    q, k, v = (
        randn(rng, (2, 3, 40, 16), dtype),
        randn(rng, (2, 3, 60, 16), dtype),
        randn(rng, (2, 3, 60, 4), dtype),
    )
    fmask = randn(rng, (40, 60), dtype)
    for kwargs in ({}, {"scale": 0.7}, {"softcap": 2.0, "attn_mask": fmask}):
        s = _explicit_scores(
            q, k, kwargs.get("scale"), kwargs.get("softcap"), kwargs.get("attn_mask")
        )
        m = s.max(axis=-1, keepdims=True)
        expected = (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]
        _, lse = sdpa(q, k, v, return_lse=True, **kwargs)
        _, ref_lse = reference.scaled_dot_product_attention(q, k, v, return_lse=True, **kwargs)
        assert lse.dtype == dtype and lse.shape == (2, 3, 40)
        _, tol, _ = attention_tolerances(
            q,
            k,
            v,
            scale=kwargs.get("scale"),
            softcap=kwargs.get("softcap"),
            attn_mask=kwargs.get("attn_mask"),
        )
        np.testing.assert_allclose(lse, expected, rtol=0, atol=tol)
        np.testing.assert_allclose(
            ref_lse, expected, rtol=0, atol=64 * np.finfo(dtype).eps * (1 + np.abs(expected).max())
        )


def test_weights_rows_sum_to_one_or_zero(isa):
    rng = np.random.default_rng(25)
    q, k, v = randn(rng, (3, 2, 70, 16)), randn(rng, (3, 2, 130, 16)), randn(rng, (3, 2, 130, 8))
    vl = np.array([[130, 0], [1, 64], [0, 0]])
    mask = rng.random((70, 130)) < 0.9
    mask[5] = False
    out, lse, w = sdpa(
        q,
        k,
        v,
        mask,
        valid_lens=vl,
        is_causal=True,
        causal_alignment="bottom_right",
        return_lse=True,
        return_weights=True,
    )
    sums = w.astype(np.float64).sum(axis=-1)
    empty = np.isneginf(lse)
    assert empty[..., 5].all() and empty[2].all() and empty[0, 1].all()
    assert (~empty).any()
    _, lse_tol, w_tol = attention_tolerances(q, k, v)
    np.testing.assert_allclose(sums[~empty], 1.0, rtol=0, atol=lse_tol + w_tol)
    assert (sums[empty] == 0).all()
    assert (w >= 0).all() and (w <= 1).all()
    assert (out[empty] == 0).all()
    # The output is the weights times the values.
    np.testing.assert_allclose(out, w.astype(np.float64) @ v, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------------------
# Masks: causal, window and composition vs explicit masks (docs/semantics.md#causal,
# #window, #composition, #softcap, #scale)

SHAPES_LQ_LK = [(37, 37), (20, 75), (75, 20), (130, 200), (200, 130), (1, 50), (50, 1), (1, 1)]


def _band(lq, lk, offset, causal=False, left=None, right=None):
    i = np.arange(lq)[:, None] + offset
    j = np.arange(lk)[None, :]
    keep = np.ones((lq, lk), bool)
    if causal:
        keep &= j <= i
    if left is not None:
        keep &= j >= i - left
    if right is not None:
        keep &= j <= i + right
    return keep


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("lq_lk", SHAPES_LQ_LK, ids=lambda t: f"{t[0]}x{t[1]}")
def test_causal_equals_explicit_mask(isa, lq_lk, alignment):
    lq, lk = lq_lk
    q, k, v = qkv(26, (2, 2, lq, 16), (2, 2, lk, 16), (2, 2, lk, 8))
    offset = 0 if alignment == "top_left" else lk - lq
    mask = np.tril(np.ones((lq, lk), bool), k=offset)  # keep j <= i + offset
    np.testing.assert_array_equal(mask, _band(lq, lk, offset, causal=True))
    got = check_against_reference(q, k, v, is_causal=True, causal_alignment=alignment)
    explicit = check_against_reference(q, k, v, attn_mask=mask)
    assert_close_attention(got, explicit, q, k, v)
    if alignment == "top_left" and lq >= 1:  # row 0 sees key 0 only
        np.testing.assert_allclose(got[0][..., 0, :], v[..., 0, :], rtol=1e-6)


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize(
    "window",
    [(0, 0), (3, None), (None, 4), (10, 2), (0, None), (None, 0), (None, None), (500, 500)],
)
@pytest.mark.parametrize("lq_lk", [(37, 37), (20, 75), (130, 70)], ids=lambda t: f"{t[0]}x{t[1]}")
def test_window_equals_explicit_band(isa, lq_lk, window, alignment):
    lq, lk = lq_lk
    q, k, v = qkv(27, (3, lq, 8), (3, lk, 8), (3, lk, 5))
    offset = 0 if alignment == "top_left" else lk - lq
    band = _band(lq, lk, offset, left=window[0], right=window[1])
    got = check_against_reference(q, k, v, window=window, causal_alignment=alignment)
    explicit = check_against_reference(q, k, v, attn_mask=band)
    assert_close_attention(got, explicit, q, k, v)
    # Rows with an empty band are zero.
    assert (got[0][:, ~band.any(axis=1)] == 0).all()


def test_masks_combine_by_and(sdpa_impl):
    fn = sdpa_impl
    rng = np.random.default_rng(28)
    b, h, lq, lk = 2, 3, 90, 140
    q, k, v = randn(rng, (b, h, lq, 16)), randn(rng, (b, h, lk, 16)), randn(rng, (b, h, lk, 8))
    bool_mask = rng.random((h, 1, lk)) < 0.8
    vl = np.stack([rng.integers(0, lk + 1, size=lq), rng.integers(60, lk + 1, size=lq)])[:, None]
    window = (40, 3)
    kwargs = {
        "valid_lens": vl,
        "is_causal": True,
        "causal_alignment": "bottom_right",
        "window": window,
    }
    explicit = (
        bool_mask
        & (np.arange(lk) < vl[..., None])
        & _band(lq, lk, lk - lq, causal=True, left=40, right=3)
    )
    assert explicit.shape == (b, h, lq, lk)
    got = unpack(fn(q, k, v, bool_mask, return_lse=True, return_weights=True, **kwargs), True, True)
    want = unpack(fn(q, k, v, explicit, return_lse=True, return_weights=True), True, True)
    assert_close_attention(got, want, q, k, v)
    assert np.isneginf(want[1]).any() and np.isfinite(want[1]).any()
    # A float mask composes with the others too: it adds, they exclude.
    fmask = randn(rng, (lq, lk))
    got_f = fn(q, k, v, fmask, **kwargs)
    kept = (np.arange(lk) < vl[..., None]) & _band(
        lq, lk, lk - lq, causal=True, left=40, right=3
    )  # valid_lens & causal & window
    want_f = fn(q, k, v, np.where(kept, fmask, -np.inf).astype(np.float32))
    out_tol, _, _ = attention_tolerances(q, k, v, attn_mask=fmask)
    np.testing.assert_allclose(got_f, want_f, rtol=0, atol=out_tol)


def test_softcap_applies_before_masks(isa):
    q, k, v = qkv(29, (2, 30, 8), (2, 45, 8), (2, 45, 8), np.float64)
    q *= 10
    fmask = np.random.default_rng(30).standard_normal((30, 45)) * 5
    got = sdpa(q, k, v, fmask, softcap=2.0, scale=0.5, return_weights=True)
    s = _explicit_scores(q, k, 0.5, 2.0, fmask)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(got[1], w, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[0], w @ v, rtol=0, atol=1e-12)


def test_default_scale_is_inverse_sqrt_e(isa):
    q, k, v = qkv(31, (2, 20, 25), (2, 30, 25), (2, 30, 3), np.float64)
    a = sdpa(q, k, v)
    b = sdpa(q, k, v, scale=1 / 5)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
    c = sdpa(q, k, v, scale=1.0)
    assert not np.allclose(a, c)


# --------------------------------------------------------------------------------------
# Memory: no Lq x Lk score matrix


def test_python_side_allocations_are_tiny():
    rng = np.random.default_rng(32)
    q, k, v = (randn(rng, (1, 8192, 64)) for _ in range(3))
    sdpa(q[:, :64], k, v)  # warm up (thread pool, scratch)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = sdpa(q, k, v, is_causal=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.shape == (1, 8192, 64)
    # The output (2 MiB) plus small change; a score matrix would be 256 MiB.
    assert peak < out.nbytes + (1 << 20), f"peak Python-side allocation {peak} bytes"
    np.testing.assert_allclose(out[0, 0], v[0, 0], rtol=1e-6)


MEMORY_SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import fastattn
    L, E = 32768, 64
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((L, E), dtype=np.float32) for _ in range(3))
    out = np.empty((L, E), np.float32)
    out.fill(0.0)
    fastattn.scaled_dot_product_attention(q[:128], k, v)  # warm up: threads, scratch
    fastattn.scaled_dot_product_attention(q[:128], k, v, is_causal=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fastattn.scaled_dot_product_attention(q, k, v, out=out)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert np.isfinite(out).all()
    print((after - before) * 1024)  # ru_maxrss is in KiB on Linux
""")


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss units are Linux's")
def test_peak_memory_single_head_32k_keys():
    """L = 32768, E = 64, one head: far less than the 4 GiB a score matrix would take."""
    # cwd: a tests/ folder, so the child imports the installed fastattn, not the source tree
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=os.path.dirname(__file__),
    )
    assert proc.returncode == 0, proc.stderr
    extra = int(proc.stdout.strip().splitlines()[-1])
    assert extra < 64 * 2**20, f"peak RSS grew by {extra / 2**20:.1f} MiB during the call"

"""The bfloat16 dot-product kernel (ISA avx512bf16: Q K^T and P V with vdpbf16ps; ISA
neon_bf16: with BFDOT; P rounded to bfloat16, the softmax in float32). It runs only where the
CPU has AVX512-BF16 (Arm: FEAT_BF16); the tests below are parametrised over every ISA the
machine has (the ``isa`` fixture), so they hold the widening kernels to the same rules, and
the ones about the dot-product ISA itself say so.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn

from helpers.attention_checks import assert_same_bits
from helpers.lowp_checks import (
    DOT_ISA,
    WIDE_ISA,
    assert_bf16_rule,
    attention_calls,
    bf16,
    cast,
    poisoned,
)

ml_dtypes = pytest.importorskip("ml_dtypes")
sdpa = fastattn.scaled_dot_product_attention


@st.composite
def long_calls(draw):
    """Tiled calls over several key blocks (the online softmax across blocks), odd and
    even head dims and key counts, with and without masks."""
    e = draw(st.sampled_from([3, 32, 64, 65, 128]))
    ev = draw(st.sampled_from([5, 32, 64, 100, 128]))
    lq = draw(st.sampled_from([4, 33, 130]))
    lk = draw(st.integers(200, 1300))
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.sampled_from([1, 2]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((hq, lq, e)) * draw(st.sampled_from([0.5, 1.0, 3.0]))
    k = rng.standard_normal((hkv, lk, e))
    v = rng.standard_normal((hkv, lk, ev))
    kwargs = {}
    kind = draw(st.sampled_from([None, "causal", "bool", "float", "window"]))
    if kind == "causal":
        kwargs = {"is_causal": True, "causal_alignment": "bottom_right"}
    elif kind == "bool":
        kwargs = {"attn_mask": rng.random((lq, lk)) < 0.7}
    elif kind == "float":
        kwargs = {"attn_mask": rng.standard_normal((lq, lk)).astype(np.float32)}
    elif kind == "window":
        kwargs = {"window": (draw(st.integers(0, 300)), draw(st.sampled_from([None, 0, 40])))}
    return q, k, v, kwargs


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=long_calls())
def test_accuracy_rule_over_key_blocks(isa, call):
    q, k, v, kwargs = call
    qb, kb, vb = cast((q, k, v), bf16())
    out = poisoned(q.shape[:-1] + v.shape[-1:], bf16())
    got = sdpa(qb, kb, vb, **kwargs, out=out)
    assert got is out and got.dtype == bf16()
    assert_bf16_rule(got, q, k, v, kwargs)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=attention_calls(max_len=70))
def test_accuracy_rule_with_every_option(isa, call):
    q, k, v, kwargs = call
    assert_bf16_rule(sdpa(*cast((q, k, v), bf16()), **kwargs), q, k, v, kwargs)


@pytest.mark.parametrize(
    "shapes, kwargs",
    [
        (((2, 4, 300, 64), (2, 2, 700, 64), (2, 2, 700, 64)), {"is_causal": True}),
        (((1, 3, 257, 33), (1, 3, 513, 33), (1, 3, 513, 40)), {"window": (100, 7)}),
        (((1, 2, 1, 128), (1, 2, 3000, 128), (1, 2, 3000, 128)), {}),  # decode (thin)
    ],
)
def test_bit_identical_for_any_thread_count(isa, shapes, kwargs):
    rng = np.random.default_rng(21)
    q, k, v = cast((rng.standard_normal(s) for s in shapes), bf16())
    first = sdpa(q, k, v, num_threads=1, return_lse=True, **kwargs)
    for n in (2, 3, 7):
        got = sdpa(q, k, v, num_threads=n, return_lse=True, **kwargs)
        for a, b in zip(first, got):
            assert_same_bits(a, b)
    assert_bf16_rule(first[0], *(a.astype(np.float32) for a in (q, k, v)), kwargs)


def test_non_finite_values_of_unseen_keys_stay_out(isa):
    """A value row of inf/NaN that no query sees (masked) must not reach the output: the
    block falls back to the row-by-row product that skips zero probabilities."""
    rng = np.random.default_rng(22)
    q, k, v = (rng.standard_normal((2, 64, 32)) for _ in range(3))
    v = np.concatenate([v, rng.standard_normal((2, 300, 32))], axis=1)
    k = np.concatenate([k, rng.standard_normal((2, 300, 32))], axis=1)
    v[:, 5] = np.inf
    v[:, 200] = np.nan
    mask = np.ones((64, 364), bool)
    mask[:, [5, 200]] = False
    got = sdpa(*cast((q, k, v), bf16()), attn_mask=mask)
    assert np.isfinite(got.astype(np.float32)).all()
    v[:, [5, 200]] = 0.0  # what the masked rows contribute: nothing
    assert_bf16_rule(got, q, k, v, {"attn_mask": mask})


@pytest.mark.skipif(DOT_ISA is None, reason="this CPU has no bfloat16 dot product ISA")
def test_dot_isa_changes_only_bfloat16():
    """avx512bf16 (neon_bf16) is avx512 (neon) but for bfloat16 SDPA: float32/float16/float64
    give the widening ISA's bits, and bfloat16 gives different ones (the dot-product kernel
    is in use)."""
    rng = np.random.default_rng(23)
    shapes = ((1, 4, 200, 64), (1, 4, 300, 64), (1, 4, 300, 64))
    arrays = [rng.standard_normal(s) for s in shapes]
    previous = fastattn._core.active_isa()
    try:
        results = {}
        for name in (WIDE_ISA, DOT_ISA):
            fastattn._core.set_isa(name)
            results[name] = [
                sdpa(*(a.astype(dt) for a in arrays), is_causal=True)
                for dt in (np.float32, np.float16, np.float64, bf16())
            ]
    finally:
        fastattn._core.set_isa(previous)
    wide, dot = results[WIDE_ISA], results[DOT_ISA]
    for a, b in zip(wide[:3], dot[:3]):
        assert_same_bits(a, b)
    assert not np.array_equal(wide[3].view(np.uint16), dot[3].view(np.uint16))
    assert_bf16_rule(dot[3], *arrays, {"is_causal": True})


@pytest.mark.skipif(DOT_ISA is None, reason="this CPU has no bfloat16 dot product ISA")
def test_show_config_says_the_dot_kernel_is_used():
    # x86-64 says it on its AVX512-BF16 line, aarch64 on its Arm features line.
    key = "avx512_bf16" if DOT_ISA == "avx512bf16" else "arm_features"
    previous = fastattn._core.active_isa()
    try:
        fastattn._core.set_isa(DOT_ISA)
        assert "used" in fastattn._config.config()[key]
        assert "not used" not in fastattn._config.config()[key]
        fastattn._core.set_isa(WIDE_ISA)
        assert "not used" in fastattn._config.config()[key]
    finally:
        fastattn._core.set_isa(previous)

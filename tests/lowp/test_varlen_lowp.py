"""varlen_attention on float16/bfloat16 read as stored: each sequence bit-identical to
scaled_dot_product_attention on that sequence alone in the same dtype (so bfloat16 takes
the dot-product kernel on avx512bf16 and neon_bf16, as SDPA does), across thread counts,
on every ISA the machine has (the ``isa`` fixture); bfloat16 within the accuracy rule of
helpers.lowp_checks, float16 equal to the float32 call on the same values, rounded.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn

from helpers.attention_checks import assert_same_bits, bits
from helpers.lowp_checks import (
    DOT_ISA,
    WIDE_ISA,
    assert_bf16_rule,
    bf16,
    lowp_dtype,
    poisoned,
)

ml_dtypes = pytest.importorskip("ml_dtypes")
varlen = fastattn.varlen_attention
sdpa = fastattn.scaled_dot_product_attention


@st.composite
def packed_calls(draw):
    """(q, k, v float64 token-major arrays, cu_q, cu_k, kwargs): a few sequences, some
    long enough for the tiled (and bfloat16 dot) kernel over several key blocks, some thin,
    some empty; GQA heads; causal (either alignment), window, softcap."""
    n = draw(st.integers(1, 4))
    lq = [draw(st.sampled_from([0, 1, 3, 20, 70])) for _ in range(n)]
    lk = [draw(st.sampled_from([0, 5, 90, 600])) for _ in range(n)]
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.sampled_from([1, 2]))
    e = draw(st.sampled_from([8, 33, 64]))
    ev = draw(st.sampled_from([7, 32]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int64)
    q = rng.standard_normal((cu_q[-1], hq, e))
    k = rng.standard_normal((cu_k[-1], hkv, e))
    v = rng.standard_normal((cu_k[-1], hkv, ev))
    kwargs = {}
    if draw(st.booleans()):
        kwargs["is_causal"] = True
        kwargs["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    if draw(st.integers(0, 3)) == 0:
        kwargs["window"] = (draw(st.integers(0, 50)), draw(st.sampled_from([None, 0, 9])))
    if draw(st.integers(0, 3)) == 0:
        kwargs["softcap"] = 3.0
    return q, k, v, cu_q, cu_k, kwargs


def _sequences(q, k, v, cu_q, cu_k):
    """Each sequence as the (H, L, E) arrays of a one-sequence SDPA call."""
    for n in range(len(cu_q) - 1):
        yield (
            n,
            tuple(
                a[c[n] : c[n + 1]].transpose(1, 0, 2) for a, c in ((q, cu_q), (k, cu_k), (v, cu_k))
            ),
        )


def _per_sequence(q, k, v, cu_q, cu_k, kwargs):
    """(output, lse) token-major, each sequence computed alone by SDPA."""
    out = np.empty(q.shape[:-1] + v.shape[-1:], q.dtype)
    lse = np.empty(q.shape[:-1], np.float32)
    for n, (qs, ks, vs) in _sequences(q, k, v, cu_q, cu_k):
        if qs.shape[1] == 0:
            continue
        o, m = sdpa(qs, ks, vs, return_lse=True, **kwargs)
        out[cu_q[n] : cu_q[n + 1]] = o.transpose(1, 0, 2)
        lse[cu_q[n] : cu_q[n + 1]] = m.T
    return out, lse


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=packed_calls(), dtype=st.sampled_from(["float16", "bfloat16"]))
def test_each_sequence_is_sdpa_on_it_alone(isa, call, dtype):
    q, k, v, cu_q, cu_k, kwargs = call
    dt = lowp_dtype(dtype)
    q, k, v = (a.astype(dt) for a in (q, k, v))
    out = poisoned(q.shape[:-1] + v.shape[-1:], dt)
    got, lse = varlen(q, k, v, cu_q, cu_k, return_lse=True, out=out, **kwargs)
    assert got is out and got.dtype == dt and lse.dtype == np.float32
    want, want_lse = _per_sequence(q, k, v, cu_q, cu_k, kwargs)
    assert_same_bits(got, want)
    np.testing.assert_array_equal(lse, want_lse)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=packed_calls())
def test_bfloat16_accuracy_rule(isa, call):
    """Per sequence, FlashAttention's rule against the float64 reference (lowp_checks)."""
    q, k, v, cu_q, cu_k, kwargs = call
    got = varlen(*(a.astype(bf16()) for a in (q, k, v)), cu_q, cu_k, **kwargs)
    for n, (qs, ks, vs) in _sequences(q, k, v, cu_q, cu_k):
        if qs.shape[1] == 0:
            continue
        if ks.shape[1] == 0:  # no keys: zeros (docs/semantics.md)
            assert not got[cu_q[n] : cu_q[n + 1]].astype(np.float32).any()
            continue
        mine = got[cu_q[n] : cu_q[n + 1]].transpose(1, 0, 2)
        assert_bf16_rule(mine, qs, ks, vs, kwargs, f"sequence {n}")


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=packed_calls())
def test_float16_is_the_float32_call_rounded(isa, call):
    """float16 is widened in the kernel: the float32 arithmetic on the same values."""
    q, k, v, cu_q, cu_k, kwargs = call
    h = [a.astype(np.float16) for a in (q, k, v)]
    got, lse = varlen(*h, cu_q, cu_k, return_lse=True, **kwargs)
    want, want_lse = varlen(
        *(a.astype(np.float32) for a in h), cu_q, cu_k, return_lse=True, **kwargs
    )
    assert_same_bits(got, want.astype(np.float16))
    np.testing.assert_array_equal(lse, want_lse)


def test_bit_identical_for_any_thread_count(isa):
    rng = np.random.default_rng(31)
    cu_q = np.array([0, 1, 301, 333], np.int64)  # a thin, a long (key splits) and a short one
    cu_k = np.array([0, 2000, 2700, 2740], np.int64)
    q = rng.standard_normal((333, 4, 64)).astype(bf16())
    k, v = (rng.standard_normal((2740, 2, 64)).astype(bf16()) for _ in range(2))
    first = varlen(q, k, v, cu_q, cu_k, is_causal=True, return_lse=True, num_threads=1)
    for n in (2, 3, 7):
        got = varlen(q, k, v, cu_q, cu_k, is_causal=True, return_lse=True, num_threads=n)
        for a, b in zip(first, got):
            assert_same_bits(a, b)


@pytest.mark.skipif(DOT_ISA is None, reason="this CPU has no bfloat16 dot product ISA")
def test_dot_isa_runs_bfloat16_varlen():
    """On avx512bf16 (neon_bf16) bfloat16 varlen takes the dot-product kernel (its bits
    differ from the widening avx512 (neon) kernel's); float16 is unchanged."""
    rng = np.random.default_rng(32)
    cu_q, cu_k = np.array([0, 200, 264], np.int64), np.array([0, 300, 700], np.int64)
    arrays = [rng.standard_normal((n, 4, 64)) for n in (264, 700, 700)]
    previous = fastattn._core.active_isa()
    results = {}
    try:
        for name in (WIDE_ISA, DOT_ISA):
            fastattn._core.set_isa(name)
            results[name] = [
                varlen(*(a.astype(dt) for a in arrays), cu_q, cu_k) for dt in (np.float16, bf16())
            ]
    finally:
        fastattn._core.set_isa(previous)
    assert_same_bits(results[WIDE_ISA][0], results[DOT_ISA][0])
    assert not np.array_equal(bits(results[WIDE_ISA][1]), bits(results[DOT_ISA][1]))


def test_no_float32_copy_of_the_query():
    """16-bit inputs are read as stored: the call's peak allocation stays below one float32
    copy of the query (the output and lse are its only arrays)."""
    from helpers.lowp_checks import peak_traced_bytes

    rng = np.random.default_rng(33)
    cu = np.array([0, 1000, 3000], np.int64)
    q, k, v = (rng.standard_normal((3000, 4, 64)).astype(bf16()) for _ in range(3))
    varlen(q, k, v, cu, cu)  # warm up
    peak = peak_traced_bytes(lambda: varlen(q, k, v, cu, cu))
    assert peak < q.size * 4, (peak, q.size * 4)

"""float16 and bfloat16 arrays in scaled_dot_product_attention: read as they are and
widened block by block inside the kernel (float32 compute), the output rounded to the
storage type as it is stored (round to nearest even).

On an ISA that widens (every ISA but the bfloat16 dot-product ones, avx512bf16 and neon_bf16, and
float16 on every ISA) the arithmetic is the float32 kernel's on the widened values, so the result
must be bit-identical to the float32 call on the same values, rounded: that is asserted exactly. The
bfloat16 accuracy rule (helpers.lowp_checks) is asserted on every ISA; the dot-product kernel's own
tests are in test_bf16_dot.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import fastattn

from helpers.attention_checks import assert_same_bits
from helpers.lowp_checks import (
    BF16_DOT_ISAS,
    assert_bf16_rule,
    attention_calls,
    bf16,
    cast,
    lowp_dtype,
    peak_traced_bytes,
    poisoned,
)

ml_dtypes = pytest.importorskip("ml_dtypes")
sdpa = fastattn.scaled_dot_product_attention


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=attention_calls())
def test_widened_in_kernel_equals_float32_call_rounded(isa, name, call):
    q, k, v, kwargs = call
    dtype = lowp_dtype(name)
    q16, k16, v16 = cast((q, k, v), dtype)
    out = poisoned(
        np.broadcast_shapes(q.shape[:-3], k.shape[:-3]) + q.shape[-3:-1] + v.shape[-1:], dtype
    )
    got, lse, w = sdpa(q16, k16, v16, **kwargs, out=out, return_lse=True, return_weights=True)
    assert got is out
    want, lse32, w32 = sdpa(
        *cast((q16, k16, v16), np.float32), **kwargs, return_lse=True, return_weights=True
    )
    if name == "bfloat16" and isa in BF16_DOT_ISAS:
        # Its tiled kernel rounds P to bfloat16 and sums in vdpbf16ps's (BFDOT's) order (not the
        # float32 kernel's): held to the accuracy rule instead (test_bf16_dot.py). Its two
        # entries (with extras, and the plain fast path) still agree bit for bit.
        assert_same_bits(sdpa(q16, k16, v16, **kwargs), got)
        return
    assert_same_bits(got, want.astype(dtype))
    assert lse.dtype == np.float32
    assert_same_bits(lse, lse32)
    # Weights: the result dtype for float16 (as before), float32 for bfloat16.
    assert_same_bits(w, w32 if name == "bfloat16" else w32.astype(np.float16))
    # Without out= and extras (the fast path for plain calls) the same output.
    assert_same_bits(sdpa(q16, k16, v16, **kwargs), want.astype(dtype))


def _adjacent_above(x: np.ndarray) -> np.ndarray:
    """The next representable value above each (finite, positive) 16-bit float."""
    return (x.view(np.uint16) + np.uint16(1)).view(x.dtype)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("dv", [37, 64])
def test_output_rounding_edges_equal_float32_call_rounded(isa, name, dv):
    """Outputs that land exactly halfway between two 16-bit values (ties: to even), on
    16-bit subnormals, beyond float16's range, inf and NaN are rounded as NumPy rounds the
    float32 call's: two keys with equal scores average their values exactly, so value rows
    v and the next value above v make every output a tie. dv 37: whole vectors and a tail."""
    dtype = lowp_dtype(name)
    rng = np.random.default_rng(dv)
    q = rng.standard_normal((1, 2, 3, 8)).astype(dtype)
    k = np.repeat(rng.standard_normal((1, 2, 1, 8)), 2, axis=2).astype(dtype)  # equal scores
    lo = np.abs(rng.standard_normal((1, 2, 1, dv)) * 4).astype(dtype)
    info = ml_dtypes.finfo(dtype)
    lo[..., 0:3] = np.array(
        [info.smallest_subnormal, 3 * info.smallest_subnormal, info.smallest_normal], dtype=dtype
    )
    hi = _adjacent_above(lo)
    lo[..., 3], hi[..., 3] = np.inf, np.inf
    lo[..., 4], hi[..., 4] = np.inf, -np.inf  # inf - inf: NaN
    lo[..., 5] = np.nan
    lo[..., 6] = hi[..., 6] = info.max
    v = np.concatenate([lo, hi], axis=2)
    got = sdpa(q, k, v, out=poisoned((1, 2, 3, dv), dtype))
    want = sdpa(*cast((q, k, v), np.float32)).astype(dtype)
    if name == "bfloat16" and isa in BF16_DOT_ISAS:  # P rounded: not ties (test_bf16_dot.py)
        assert np.isnan(got[..., 4:6]).all() and np.isinf(got[..., 3]).all()
        return
    assert_same_bits(got, want)


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=attention_calls())
def test_bfloat16_accuracy_rule(isa, call):
    """max |fast - ref64| <= 2 * max |twin - ref64|, the twin's output rounded to bfloat16
    as ours is (lowp_checks.assert_within_rule, with its floor)."""
    q, k, v, kwargs = call
    t = bf16()
    got = sdpa(*cast((q, k, v), t), **kwargs)
    assert got.dtype == t
    assert_bf16_rule(got, q, k, v, kwargs)


def test_dtype_rules():
    rng = np.random.default_rng(0)
    t = bf16()
    q, k, v = (rng.standard_normal((2, 3, 5, 8)).astype(np.float32) for _ in range(3))
    qb, kb, vb = cast((q, k, v), t)
    out, lse, w = sdpa(qb, kb, vb, return_lse=True, return_weights=True)
    assert (out.dtype, lse.dtype, w.dtype) == (t, np.float32, np.float32)
    # Mixed bfloat16 / float32 promote to float32; with float64 to float64; bfloat16 with
    # float16 to float32 (NumPy has no common type of its own for them).
    assert sdpa(qb, k, v).dtype == np.float32
    np.testing.assert_array_equal(sdpa(qb, k, v), sdpa(qb.astype(np.float32), k, v))
    assert sdpa(qb, kb, v.astype(np.float64)).dtype == np.float64
    assert sdpa(qb, k.astype(np.float16), vb).dtype == np.float32
    # A bfloat16 float mask is added in float32 (converted once).
    m = rng.standard_normal((5, 5)).astype(t)
    np.testing.assert_array_equal(
        sdpa(qb, kb, vb, attn_mask=m), sdpa(qb, kb, vb, attn_mask=m.astype(np.float32))
    )
    # out= of the wrong dtype names the expected one.
    with pytest.raises(ValueError, match="bfloat16"):
        sdpa(qb, kb, vb, out=np.empty((2, 3, 5, 8), np.float32))
    # The reference twin follows the same dtype rules.
    ro, rl, rw = fastattn.reference.scaled_dot_product_attention(
        qb, kb, vb, return_lse=True, return_weights=True
    )
    assert (ro.dtype, rl.dtype, rw.dtype) == (t, np.float32, np.float32)


def test_float16_makes_no_float32_copy():
    """Peak traced memory (NumPy's allocations) of a float16 call stays below one float32
    copy of Q: the kernel reads the float16 arrays themselves."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 4, 1024, 64)).astype(np.float16) for _ in range(3))
    sdpa(q, k, v)  # warm up (thread pool, first-call allocations)
    for call in (lambda: sdpa(q, k, v), lambda: sdpa(q, k, v, is_causal=True, return_lse=True)):
        peak = peak_traced_bytes(call)
        assert peak < q.size * 4, peak


def test_family_takes_bfloat16():
    """The family computes bfloat16 in float32 (converted in Python) and returns bfloat16
    (weights float32), as its reference twins do."""
    rng = np.random.default_rng(5)
    t = bf16()
    q, k, v = (rng.standard_normal((2, 6, 8)).astype(t) for _ in range(3))
    w_q, w_k = (rng.standard_normal((8, 4)).astype(t) for _ in range(2))
    w_v = rng.standard_normal(4).astype(t)
    calls = [
        ("attention", (q, k, v), {"score": "cosine"}),
        ("additive_attention", (q, k, v, w_q, w_k, w_v), {}),
        ("nadaraya_watson", (q, k, v), {"bandwidth": 2.0}),
    ]
    for name, args, kwargs in calls:
        got, w = getattr(fastattn, name)(*args, **kwargs, return_weights=True)
        want, tw = getattr(fastattn.reference, name)(*args, **kwargs, return_weights=True)
        assert got.dtype == want.dtype == t and w.dtype == tw.dtype == np.float32, name
        # Both round a float32/float64 result to bfloat16: one bfloat16 ulp apart at most.
        np.testing.assert_allclose(
            got.astype(np.float32), want.astype(np.float32), atol=2**-7, rtol=2**-7
        )
    x = rng.standard_normal((3, 7)).astype(t)
    out = fastattn.masked_softmax(x)
    assert out.dtype == t
    np.testing.assert_allclose(
        out.astype(np.float32),
        fastattn.reference.masked_softmax(x).astype(np.float32),
        atol=2**-8,
        rtol=2**-7,
    )


def test_show_config_says_whether_avx512_bf16_is_there():
    line = fastattn._config.config()["avx512_bf16"]
    assert line.startswith("supported" if fastattn._core.cpu_has_avx512_bf16() else "not")

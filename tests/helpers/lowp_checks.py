"""Helpers of the low-precision tests (tests/lowp): random attention calls and the accuracy
rule for bfloat16. Not a test module; imported as ``helpers.lowp_checks``.

The bfloat16 rule (FlashAttention's): the max error against the float64 reference is at
most twice the error of the same computation done by a plain NumPy formula with
bfloat16-rounded inputs and bfloat16-rounded probabilities P, accumulated in float32.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
from hypothesis import strategies as st

import fastattn

# The bfloat16 dot-product ISAs (bfloat16 SDPA's Q K^T and P V on bfloat16 operands:
# vdpbf16ps on x86-64, BFDOT on aarch64), each with the widening ISA it otherwise is.
BF16_DOT_ISAS = {"avx512bf16": "avx512", "neon_bf16": "neon"}
# This machine's (None: it has neither) and its widening twin.
DOT_ISA = next((i for i in BF16_DOT_ISAS if i in fastattn._core.available_isas()), None)
WIDE_ISA = BF16_DOT_ISAS.get(DOT_ISA)


def bf16():
    """ml_dtypes.bfloat16 (the caller has importorskip'ed ml_dtypes)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def lowp_dtype(name: str) -> np.dtype:
    """The 16-bit float dtype named ``"float16"`` or ``"bfloat16"``."""
    return bf16() if name == "bfloat16" else np.dtype(np.float16)


def cast(arrays, dtype) -> list:
    """Each of ``arrays`` converted to ``dtype``."""
    return [np.asarray(a).astype(dtype) for a in arrays]


@st.composite
def attention_calls(draw, max_len: int = 40):
    """(q, k, v float64 arrays, kwargs) of a random call: batch, GQA heads, lengths that
    take both the tiled and the decode (thin) kernels, masks, causal, window, softcap."""
    batch = draw(st.sampled_from([(), (2,), (1, 2)]))
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.sampled_from([1, 2, 4]))
    lq = draw(st.sampled_from([1, 2, 3, 7, 17, max_len]))
    lk = draw(st.integers(1, max_len * 2))
    e = draw(st.sampled_from([1, 5, 8, 16, 33, 64]))
    ev = draw(st.sampled_from([1, 7, 16, 40]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(batch + (hq, lq, e))
    k = rng.standard_normal(batch + (hkv, lk, e))
    v = rng.standard_normal(batch + (hkv, lk, ev))
    kwargs = {}
    mask = draw(st.sampled_from([None, "bool", "float", "lens"]))
    if mask == "bool":
        kwargs["attn_mask"] = rng.random((lq, lk)) < 0.8
    elif mask == "float":
        kwargs["attn_mask"] = rng.standard_normal((hq, 1, lk)).astype(np.float32)
    elif mask == "lens":
        kwargs["valid_lens"] = rng.integers(0, lk + 1, size=batch + (hq,))
    if draw(st.booleans()):
        kwargs["is_causal"] = True
        kwargs["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    if draw(st.integers(0, 3)) == 0:
        kwargs["window"] = (draw(st.integers(0, 8)), draw(st.sampled_from([None, 0, 3])))
    if draw(st.integers(0, 3)) == 0:
        kwargs["softcap"] = draw(st.sampled_from([0.5, 3.0]))
    return q, k, v, kwargs


def poisoned(shape, dtype) -> np.ndarray:
    """An output buffer full of NaN, so any element the kernel leaves unwritten shows."""
    return np.full(shape, np.nan, dtype=np.float32).astype(dtype)


def bf16_twin(q, k, v, kwargs) -> np.ndarray:
    """The plain NumPy formula of the accuracy rule, returned in float64 before the output's
    own rounding: q, k, v rounded to bfloat16, scores and softmax in float32, P rounded to
    bfloat16, P V accumulated in float32. Masks, causal, window and softcap as the reference
    applies them (its weights give which keys a row sees)."""
    t = bf16()
    r = [np.asarray(a).astype(t).astype(np.float32) for a in (q, k, v)]
    # The reference's weights on the rounded inputs say which keys each row sees; the
    # scores themselves are formed again here in float32.
    _, w = fastattn.reference.scaled_dot_product_attention(*r, return_weights=True, **kwargs)
    qf, kf, vf = r
    group = qf.shape[-3] // kf.shape[-3]
    kf, vf = np.repeat(kf, group, axis=-3), np.repeat(vf, group, axis=-3)
    scale = np.float32(kwargs.get("scale") or 1.0 / np.sqrt(qf.shape[-1]))
    s = np.matmul(qf, np.swapaxes(kf, -1, -2)) * scale
    cap = kwargs.get("softcap")
    if cap is not None:
        s = np.float32(cap) * np.tanh(s / np.float32(cap))
    m = kwargs.get("attn_mask")
    if m is not None and m.dtype != np.bool_:
        s = s + m.astype(np.float32)
    seen = w > 0
    s = np.where(seen, s, -np.inf).astype(np.float32)
    mx = np.where(seen.any(-1, keepdims=True), s.max(-1, keepdims=True), 0).astype(np.float32)
    p = np.where(seen, np.exp(s - mx), 0).astype(np.float32)
    total = p.sum(-1, keepdims=True, dtype=np.float32)
    p16 = p.astype(t).astype(np.float32)
    acc = np.matmul(p16, vf)  # float32 accumulation
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(total > 0, acc / total, 0).astype(np.float32)
    return out.astype(np.float64)


def assert_within_rule(got, twin, ref, what="output") -> None:
    """The bfloat16 accuracy rule: max |got - ref| <= 2 * max |twin - ref| (``twin`` rounded
    as ``got`` is, both against the float64 ``ref``). The twin's error is floored at a
    quarter of a bfloat16 ulp of the largest entry (2^-9 relative): with few elements its
    own rounding alone may happen to be near 0, while ours is that rounding plus float32
    error."""
    err = np.abs(np.asarray(got).astype(np.float64) - ref).max(initial=0.0)
    twin_err = np.abs(twin - ref).max(initial=0.0)
    floor = 2.0**-9 * np.abs(ref).max(initial=0.0)
    assert err <= 2 * max(twin_err, floor), (what, err, twin_err, floor)


def assert_bf16_rule(got, q, k, v, kwargs, what="output") -> None:
    """``got``, the bfloat16 SDPA of (q, k, v) rounded to bfloat16, against the float64
    reference on those rounded inputs, within :func:`assert_within_rule` of
    :func:`bf16_twin`."""
    t = bf16()
    ref = fastattn.reference.scaled_dot_product_attention(
        *cast(cast((q, k, v), t), np.float64), **kwargs
    )
    twin = bf16_twin(q, k, v, kwargs).astype(t).astype(np.float64)
    assert_within_rule(got, twin, ref, what)


def peak_traced_bytes(call) -> int:
    """The peak of NumPy's (traced) allocations while ``call()`` runs."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def assert_peak_below_f32_query(call, q) -> None:
    """``call()``, once warmed up (thread pool, first-call allocations), allocates less than
    one float32 copy of ``q`` at its peak: the kernel reads the 16-bit arrays themselves."""
    call()
    peak = peak_traced_bytes(call)
    assert peak < q.size * 4, peak

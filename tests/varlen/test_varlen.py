"""fastattn.varlen_attention: against its float64 NumPy twin (within the attention
tolerance), bit-identical to scaled_dot_product_attention on each sequence alone and across
thread counts, on every ISA the CPU has (the ``isa`` fixture); empty sequences, skewed
batches (the key-split and thin plans inside one call), ``out=``, and the errors of bad
sequence boundaries (docs/semantics.md#packed-variable-length-batches).
"""

from __future__ import annotations

import sys
import time
import types
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close_attention, same_bits
from helpers.reliability_checks import longest_pause_beside

DTYPES = {"f2": np.float16, "f4": np.float32, "f8": np.float64}
# Total multiply-adds of one case (sum over sequences of Hq * Lq * Lk * (E + Ev)): a few
# milliseconds per example on the scalar ISA and in the float64 twin.
WORK_BUDGET = 1_000_000


def fixture_ok(factor: float = 1.0):
    """Settings for a test using the function-scoped ``isa`` fixture (it only switches the
    ISA, so sharing it across examples is fine)."""
    return settings(
        suppress_health_check=[HealthCheck.function_scoped_fixture],
        max_examples=max(1, round(settings.default.max_examples * factor)),
    )


@dataclass
class Spec:
    seed: int
    lens_q: tuple
    lens_k: tuple
    heads: tuple  # (Hq, Hkv)
    dims: tuple  # (E, Ev)
    dtype: str = "f4"
    layout: str = "c"  # c | heads_major (a (H, T, E) buffer seen token-major) | strided
    kwargs: dict = field(default_factory=dict)  # is_causal, alignment, window, scale, softcap
    return_lse: bool = False


@st.composite
def specs(draw, max_seqs: int = 6, max_len: int = 40):
    n = draw(st.integers(0, max_seqs))
    lens_q = tuple(draw(st.lists(st.integers(0, max_len), min_size=n, max_size=n)))
    same = draw(st.booleans())  # self-attention (the common case) or separate key lengths
    lens_k = (
        lens_q if same else tuple(draw(st.lists(st.integers(0, max_len), min_size=n, max_size=n)))
    )
    hkv = draw(st.integers(1, 3))
    hq = hkv * draw(st.integers(1, 3))
    e = draw(st.sampled_from([1, 3, 8, 16, 33]))
    ev = draw(st.sampled_from([e, 1, 5, 16]))
    work = hq * sum(a * b for a, b in zip(lens_q, lens_k)) * (e + ev)
    if work > WORK_BUDGET:
        e = ev = 4
    kwargs = {}
    if draw(st.booleans()):
        kwargs["is_causal"] = True
    if draw(st.booleans()):
        kwargs["causal_alignment"] = "bottom_right"
    if draw(st.integers(0, 3)) == 0:
        side = st.none() | st.integers(0, max_len + 2)
        kwargs["window"] = (draw(side), draw(side))
    if draw(st.integers(0, 3)) == 0:
        kwargs["scale"] = draw(st.floats(-2.0, 2.0, allow_nan=False))
    if draw(st.integers(0, 3)) == 0:
        kwargs["softcap"] = draw(st.floats(0.5, 30.0))
    return Spec(
        seed=draw(st.integers(0, 2**32 - 1)),
        lens_q=lens_q,
        lens_k=lens_k,
        heads=(hq, hkv),
        dims=(e, ev),
        dtype=draw(st.sampled_from(sorted(DTYPES))),
        layout=draw(st.sampled_from(["c", "heads_major", "strided"])),
        kwargs=kwargs,
        return_lse=draw(st.booleans()),
    )


def _laid_out(x: np.ndarray, layout: str) -> np.ndarray:
    """``x`` (tokens, H, D) with its values, laid out as the spec says."""
    if layout == "heads_major":  # as from a (H, T, D) projection
        return np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
    if layout == "strided":  # every other token of a buffer twice as long; NaN between
        base = np.full((2 * x.shape[0],) + x.shape[1:], np.nan, x.dtype)
        base[::2] = x
        return base[::2]
    return np.ascontiguousarray(x)


def cumulative(lens) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(lens, dtype=np.int64))]).astype(np.int64)


def build(spec: Spec):
    """(q, k, v, cu_q, cu_k) of a spec: fresh standard-normal values."""
    rng = np.random.default_rng(spec.seed)
    (hq, hkv), (e, ev) = spec.heads, spec.dims
    cu_q, cu_k = cumulative(spec.lens_q), cumulative(spec.lens_k)
    dt = DTYPES[spec.dtype]
    q = rng.standard_normal((int(cu_q[-1]), hq, e)).astype(dt)
    k = rng.standard_normal((int(cu_k[-1]), hkv, e)).astype(dt)
    v = rng.standard_normal((int(cu_k[-1]), hkv, ev)).astype(dt)
    return (*(_laid_out(a, spec.layout) for a in (q, k, v)), cu_q, cu_k)


def per_sequence(q, k, v, cu_q, cu_k, **kwargs):
    """(output, lse) of scaled_dot_product_attention run on each sequence alone, packed."""
    hq, ev = q.shape[1], v.shape[2]
    result = np.result_type(q.dtype, k.dtype, v.dtype)
    out = np.zeros((q.shape[0], hq, ev), result)
    lse = np.full((q.shape[0], hq), -np.inf, np.float64 if result == np.float64 else np.float32)
    for n in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        if rows.start == rows.stop:
            continue
        o, l_ = fastattn.scaled_dot_product_attention(
            *(a[s].transpose(1, 0, 2) for a, s in ((q, rows), (k, keys), (v, keys))),
            return_lse=True,
            **kwargs,
        )
        out[rows] = o.transpose(1, 0, 2)
        lse[rows] = l_.T
    return out, lse


def kwargs_of(spec: Spec) -> dict:
    return dict(spec.kwargs)


@fixture_ok()
@given(spec=specs())
def test_matches_reference_and_per_sequence_sdpa(isa, spec):
    q, k, v, cu_q, cu_k = build(spec)
    kw = kwargs_of(spec)
    got, got_lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    exp, exp_lse = reference.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    assert_close_attention(
        (got, got_lse, None),
        (exp, exp_lse, None),
        q,
        k.transpose(1, 0, 2),  # the tolerance reads the key count on axis -2
        v,
        scale=kw.get("scale"),
        softcap=kw.get("softcap"),
    )
    one_out, one_lse = per_sequence(q, k, v, cu_q, cu_k, **kw)
    assert same_bits(got, one_out)
    assert same_bits(got_lse, one_lse)


@fixture_ok(0.5)
@given(spec=specs(), threads=st.sampled_from([1, 2, 3, 7]))
def test_bit_identical_across_thread_counts(isa, spec, threads):
    q, k, v, cu_q, cu_k = build(spec)
    kw = kwargs_of(spec)
    one = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, num_threads=1, **kw)
    many = fastattn.varlen_attention(
        q, k, v, cu_q, cu_k, return_lse=True, num_threads=threads, **kw
    )
    assert same_bits(one[0], many[0]) and same_bits(one[1], many[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("is_causal", [False, True])
def test_skewed_batch(isa, dtype, is_causal):
    """One long sequence beside many short ones, decode-like rows over long caches (thin
    tasks, key splits) and empty sequences, in one call: bit-identical to the per-sequence
    calls and for 1 or 2 threads, close to the twin."""
    rng = np.random.default_rng(3)
    lens_q = [700] + [0, 3] + [16] * 40 + [1, 1, 2, 0]
    lens_k = [700] + [5, 0] + [16] * 40 + [5000, 1, 4500, 0]
    cu_q, cu_k = cumulative(lens_q), cumulative(lens_k)
    q = rng.standard_normal((int(cu_q[-1]), 4, 32)).astype(dtype)
    k = rng.standard_normal((int(cu_k[-1]), 2, 32)).astype(dtype)
    v = rng.standard_normal((int(cu_k[-1]), 2, 24)).astype(dtype)
    kw = {"is_causal": is_causal, "causal_alignment": "bottom_right"}
    got = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, num_threads=2, **kw)
    one = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, num_threads=1, **kw)
    exp = per_sequence(q, k, v, cu_q, cu_k, **kw)
    for a, b, c in zip(got, one, exp):
        assert same_bits(a, b) and same_bits(a, c)
    ref_out, ref_lse = reference.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    assert_close_attention(
        (got[0], got[1], None), (ref_out, ref_lse, None), q, k.transpose(1, 0, 2), v
    )


@pytest.mark.parametrize(
    ("lens_q", "lens_k"),
    [((), ()), ((0, 0), (0, 0)), ((0, 4), (3, 0)), ((2,), (0,)), ((0,), (5,))],
)
def test_empty_sequences(isa, lens_q, lens_k):
    """No sequences, empty ones, queries without keys (output 0, lse -inf)."""
    rng = np.random.default_rng(5)
    cu_q, cu_k = cumulative(lens_q), cumulative(lens_k)
    q = rng.standard_normal((int(cu_q[-1]), 2, 8))
    k = rng.standard_normal((int(cu_k[-1]), 1, 8))
    v = rng.standard_normal((int(cu_k[-1]), 1, 4))
    out, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True)
    exp, exp_lse = reference.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True)
    assert out.shape == (q.shape[0], 2, 4) and lse.shape == (q.shape[0], 2)
    assert_close_attention((out, lse, None), (exp, exp_lse, None), q, k.transpose(1, 0, 2), v)
    starts = cu_q[:-1][np.asarray(lens_k, dtype=np.int64) == 0]
    for n, start in enumerate(starts):
        rows = slice(start, start + (lens_q[n] if len(lens_q) else 0))
        assert (out[rows] == 0).all() and np.isneginf(lse[rows]).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("layout", ["c", "heads_major"])
def test_out(isa, dtype, layout):
    """out= is written (every element: it starts as NaN) and returned."""
    spec = Spec(seed=9, lens_q=(5, 0, 17), lens_k=(9, 4, 17), heads=(4, 2), dims=(8, 8))
    q, k, v, cu_q, cu_k = build(spec)
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    out = _laid_out(np.full((q.shape[0], 4, 8), np.nan, dtype), layout)
    got = fastattn.varlen_attention(q, k, v, cu_q, cu_k, out=out, is_causal=True)
    assert got is out
    exp = fastattn.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True)
    assert same_bits(np.ascontiguousarray(out), exp)
    assert exp.dtype == dtype


def test_float16_matches_reference(isa):
    spec = Spec(seed=4, lens_q=(7, 30), lens_k=(12, 30), heads=(2, 1), dims=(16, 8), dtype="f2")
    q, k, v, cu_q, cu_k = build(spec)
    got, got_lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True)
    exp, exp_lse = reference.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True)
    assert got.dtype == np.float16 and got_lse.dtype == np.float32
    assert_close_attention((got, got_lse, None), (exp, exp_lse, None), q, k.transpose(1, 0, 2), v)


# --------------------------------------------------------------------------------------
# Errors: the same words from fastattn and the twin


def _inputs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 2, 4))
    k = rng.standard_normal((5, 1, 4))
    v = rng.standard_normal((5, 1, 3))
    return q, k, v


BAD_BOUNDARIES = [
    ([0, 4, 3, 6], [0, 2, 3, 5], ValueError, "cu_seqlens_q must be non-decreasing"),
    ([0, 3, 6], [0, 2, 4], ValueError, "cu_seqlens_k must start at 0 and end at total_k"),
    ([1, 3, 6], [0, 2, 5], ValueError, "cu_seqlens_q must start at 0"),
    ([0, 3, 6], [0, 2, 3, 5], ValueError, "must have the same length"),
    ([0.0, 3.0, 6.0], [0, 2, 5], TypeError, "cu_seqlens_q must be an array of integers"),
    ([0, 3, 6], [False, True, True], TypeError, "cu_seqlens_k must be an array of integers"),
    ([[0, 3, 6]], [0, 2, 5], ValueError, "cu_seqlens_q must be 1-D"),
    ([], [], TypeError, "cu_seqlens_q must be an array of integers"),  # float64 when empty
    (np.array([], np.int64), [0, 5], ValueError, r"cu_seqlens_q must be 1-D with N \+ 1 >= 1"),
    (5, [0, 5], ValueError, "cu_seqlens_q must be 1-D"),
]


@pytest.mark.parametrize(("cu_q", "cu_k", "exc", "words"), BAD_BOUNDARIES)
@pytest.mark.parametrize("fn", [fastattn.varlen_attention, reference.varlen_attention])
def test_bad_boundaries(fn, cu_q, cu_k, exc, words):
    q, k, v = _inputs()
    with pytest.raises(exc, match=words):
        fn(q, k, v, cu_q, cu_k)


def test_boundaries_of_any_integer_dtype():
    q, k, v = _inputs()
    a = fastattn.varlen_attention(q, k, v, np.array([0, 3, 6], np.uint8), [0, 2, 5])
    b = fastattn.varlen_attention(q, k, v, [0, 3, 6], np.array([0, 2, 5], np.int32))
    assert same_bits(a, b)


@pytest.mark.parametrize(
    ("change", "exc", "words"),
    [
        ({"query": np.zeros((6, 4))}, ValueError, "query must have 3 dimensions"),
        ({"key": np.zeros((5, 1, 3))}, ValueError, "key has feature size 3"),
        ({"value": np.zeros((4, 1, 3))}, ValueError, "value has 4 tokens"),
        ({"key": np.zeros((5, 3, 4)), "value": np.zeros((5, 3, 3))}, ValueError, "does not divide"),
        ({"query": np.zeros((6, 2, 4), np.int64)}, TypeError, "query must be a floating-point"),
        ({"is_causal": 1}, TypeError, "is_causal must be True or False"),
        ({"causal_alignment": "left"}, ValueError, "causal_alignment must be"),
        ({"window": (1,)}, ValueError, "window must be None or a pair"),
        ({"softcap": -1.0}, ValueError, "softcap must be > 0"),
        ({"scale": float("nan")}, ValueError, "scale must be finite"),
        ({"return_lse": None}, TypeError, "return_lse must be True or False"),
        ({"out": np.zeros((6, 2, 4))}, ValueError, "out must have shape"),
        ({"num_threads": 0}, ValueError, "num_threads"),
    ],
)
@pytest.mark.parametrize("fn", [fastattn.varlen_attention, reference.varlen_attention])
def test_bad_arguments(fn, change, exc, words):
    q, k, v = _inputs()
    args = {"query": q, "key": k, "value": v, "cu_seqlens_q": [0, 3, 6], "cu_seqlens_k": [0, 2, 5]}
    args.update(change)
    with pytest.raises(exc, match=words):
        fn(**args)


def test_out_sharing_memory_with_query():
    q = np.zeros((6, 2, 4))
    k, v = np.zeros((5, 2, 4)), np.zeros((5, 2, 4))
    with pytest.raises(ValueError, match="out shares memory with query"):
        fastattn.varlen_attention(q, k, v, [0, 3, 6], [0, 2, 5], out=q)


def test_cupy_arrays_raise(monkeypatch):
    """A CuPy array (here a stand-in from a module named cupy) is refused by name."""
    fake = types.ModuleType("cupy")
    array_type = type("ndarray", (), {"__module__": "cupy"})
    monkeypatch.setitem(sys.modules, "cupy", fake)
    q, k, v = _inputs()
    with pytest.raises(NotImplementedError, match="varlen_attention"):
        fastattn.varlen_attention(array_type(), k, v, [0, 3, 6], [0, 2, 5])


def test_gil_released_during_kernel():
    """While one thread computes, another keeps running Python: the GIL is released."""
    rng = np.random.default_rng(15)
    tokens = 512
    while True:  # a call long enough (>= 0.1 s) that holding the GIL would show
        q, k, v = (rng.standard_normal((tokens, 1, 64)).astype(np.float32) for _ in range(3))
        cu = np.array([0, tokens // 2, tokens])
        start = time.perf_counter()
        fastattn.varlen_attention(q, k, v, cu, cu, num_threads=1)
        duration = time.perf_counter() - start
        if duration >= 0.1 or tokens >= 2**17:
            break
        tokens *= 2
    pause, turns = longest_pause_beside(
        lambda: fastattn.varlen_attention(q, k, v, cu, cu, num_threads=1)
    )
    assert turns > 10
    assert pause < 0.5 * duration, (pause, duration)


def test_benchmark_workload():
    """fastattn-bench's varlen rows: every candidate (varlen_attention, the NumPy formula per
    sequence, the per-sequence loop, padding with valid_lens) agrees with the twin."""
    from fastattn.bench import _cases

    case = _cases.varlen_case("varlen", (21, 0, 3, 9), hq=2, hkv=1, e=8)
    libs = _cases.Libraries(threads=2, wanted=("fastattn", "numpy"))
    work = _cases.build(case, "float32", libs, _cases.IMPLS)
    assert set(work.candidates) == {"fastattn", "numpy", "fastattn-loop", "fastattn-padded"}
    errors, _ = work.first_calls()
    assert all(err < 1e-5 for err in errors.values()), errors
    assert case.flops() > 0 and case.seq_len == 21

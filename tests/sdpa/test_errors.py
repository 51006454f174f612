"""Bad input raises ValueError/TypeError naming the argument, from fastattn and the reference
alike (they share the validation layer), and never crashes or returns a wrong answer."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fastattn
from fastattn import reference

sdpa = fastattn.scaled_dot_product_attention
IMPLS = pytest.mark.parametrize(
    "fn", [sdpa, reference.scaled_dot_product_attention], ids=["fastattn", "reference"]
)

_rng = np.random.default_rng(0)


def r(*shape, dtype=np.float32):
    return _rng.standard_normal(shape).astype(dtype)


Q, K, V = r(2, 4, 6, 8), r(2, 4, 7, 8), r(2, 4, 7, 5)  # scores (2, 4, 6, 7), out (2, 4, 6, 5)


def case(q=None, k=None, v=None, mask=None, **kwargs):
    return (Q if q is None else q, K if k is None else k, V if v is None else v, mask, kwargs)


# id: ((query, key, value, attn_mask, kwargs), exception, regex the message must match)
BAD = {
    # ranks
    "query-1d": (case(q=r(8)), ValueError, r"query must have at least 2 dimensions"),
    "key-0d": (case(k=np.float32(1.0)), ValueError, r"key must have at least 2 dimensions"),
    "value-1d": (case(v=r(7)), ValueError, r"value must have at least 2 dimensions"),
    # dtypes
    "query-int": (
        case(q=np.ones((2, 4, 6, 8), np.int32)),
        TypeError,
        r"query must be a floating-point array.*int32",
    ),
    "key-int64": (
        case(k=np.ones((2, 4, 7, 8), np.int64)),
        TypeError,
        r"key must be a floating-point array",
    ),
    "value-complex": (
        case(v=V.astype(np.complex64)),
        TypeError,
        r"value must be a floating-point array.*complex64",
    ),
    "query-object": (case(q=Q.astype(object)), TypeError, r"query must be a floating-point"),
    "key-bool": (case(k=K > 0), TypeError, r"key must be a floating-point array.*bool"),
    "value-longdouble": (
        case(v=V.astype(np.longdouble)),
        TypeError,
        r"value must be a floating-point array",
    ),
    "query-str": (case(q=np.full((2, 3), "a")), TypeError, r"query must be a floating-point"),
    # shapes
    "E-mismatch": (case(k=r(2, 4, 7, 9)), ValueError, r"key has feature size 9 .* query has 8"),
    "E-zero": (case(q=r(2, 4, 6, 0), k=r(2, 4, 7, 0)), ValueError, r"feature size E >= 1"),
    "Lk-mismatch": (case(v=r(2, 4, 8, 5)), ValueError, r"value has 8 positions .* key has 7"),
    "value-heads": (case(v=r(2, 2, 7, 5)), ValueError, r"value has 2 heads but key has 4"),
    "heads-not-dividing": (
        case(q=r(2, 12, 6, 8), k=r(2, 5, 7, 8), v=r(2, 5, 7, 5)),
        ValueError,
        re.escape("key has 5 heads, which does not divide query's 12 heads"),
    ),
    "more-kv-heads": (
        case(q=r(2, 2, 6, 8)),
        ValueError,
        re.escape("key has 4 heads, which does not divide query's 2 heads"),
    ),
    "batch-not-broadcasting": (
        case(k=r(3, 4, 7, 8), v=r(3, 4, 7, 5)),
        ValueError,
        r"leading \(batch\) dims of query .* do not broadcast",
    ),
    # masks
    "mask-not-broadcasting": (
        case(mask=np.ones((6, 8), bool)),
        ValueError,
        r"attn_mask of shape \(6, 8\) does not broadcast.*\(2, 4, 6, 7\)",
    ),
    "mask-too-many-dims": (
        case(mask=np.ones((1, 2, 4, 6, 7), bool)),
        ValueError,
        r"attn_mask of shape \(1, 2, 4, 6, 7\) does not broadcast",
    ),
    "mask-int": (
        case(mask=np.ones((6, 7), np.int8)),
        TypeError,
        r"attn_mask must be a bool array .* got dtype int8",
    ),
    "mask-complex": (case(mask=np.ones((6, 7), complex)), TypeError, r"attn_mask must be"),
    # valid_lens
    "valid_lens-negative": (
        case(valid_lens=np.array([3, -1])),
        ValueError,
        r"valid_lens must lie in \[0, 7\].*-1",
    ),
    "valid_lens-too-long": (
        case(valid_lens=np.array([3, 8])),
        ValueError,
        r"valid_lens must lie in \[0, 7\].*8",
    ),
    "valid_lens-float": (
        case(valid_lens=np.array([3.0, 2.0])),
        TypeError,
        r"valid_lens must be an integer array.*float64",
    ),
    "valid_lens-bool": (
        case(valid_lens=np.array([True, False])),
        TypeError,
        r"valid_lens must be an integer array",
    ),
    "valid_lens-trailing": (
        case(valid_lens=np.ones((4, 6), int)),
        ValueError,
        r"valid_lens of shape \(4, 6\) is not a leading prefix",
    ),
    "valid_lens-wrong-size": (
        case(valid_lens=np.ones(3, int)),
        ValueError,
        r"valid_lens of shape \(3,\) is not a leading prefix",
    ),
    "valid_lens-too-many-dims": (
        case(valid_lens=np.ones((2, 4, 6, 7), int)),
        ValueError,
        r"valid_lens .* is not a leading prefix",
    ),
    # window
    "window-negative": (case(window=(-1, 2)), ValueError, r"window left must be >= 0"),
    "window-negative-right": (case(window=(None, -3)), ValueError, r"window right must be >= 0"),
    "window-length": (case(window=(1, 2, 3)), ValueError, r"window must be None or a pair"),
    "window-int": (case(window=3), ValueError, r"window must be None or a pair"),
    "window-float": (case(window=(1.5, 2)), TypeError, r"window left must be an int"),
    "window-bool": (case(window=(1, True)), TypeError, r"window right must be an int"),
    "window-str": (case(window="ab"), ValueError, r"window must be None or a pair"),
    # flags and scalars
    "causal_alignment": (
        case(causal_alignment="bottom-right"),
        ValueError,
        r"causal_alignment must be 'top_left' or 'bottom_right'",
    ),
    "is_causal-int": (case(is_causal=1), TypeError, r"is_causal must be True or False"),
    "is_causal-str": (case(is_causal="yes"), TypeError, r"is_causal must be True or False"),
    "scale-nan": (case(scale=float("nan")), ValueError, r"scale must be finite"),
    "scale-inf": (case(scale=float("inf")), ValueError, r"scale must be finite"),
    "scale-str": (case(scale="0.5"), TypeError, r"scale must be a real number"),
    "scale-bool": (case(scale=True), TypeError, r"scale must be a real number"),
    "softcap-zero": (case(softcap=0.0), ValueError, r"softcap must be > 0"),
    "softcap-negative": (case(softcap=-2), ValueError, r"softcap must be > 0"),
    "softcap-nan": (case(softcap=float("nan")), ValueError, r"softcap must be finite"),
    "return_lse-int": (case(return_lse=1), TypeError, r"return_lse must be True or False"),
    "return_weights-none": (
        case(return_weights=None),
        TypeError,
        r"return_weights must be True or False",
    ),
    # threads
    "num_threads-0": (case(num_threads=0), ValueError, r"num_threads must be >= 1"),
    "num_threads-negative": (case(num_threads=-1), ValueError, r"num_threads must be >= 1"),
    "num_threads-float": (case(num_threads=1.5), TypeError, r"num_threads must be an integer"),
    "num_threads-bool": (case(num_threads=True), TypeError, r"num_threads must be an integer"),
    "num_threads-str": (case(num_threads="2"), TypeError, r"num_threads must be an integer"),
    # out
    "out-shape": (
        case(out=np.empty((2, 4, 6, 8), np.float32)),
        ValueError,
        r"out must have shape \(2, 4, 6, 5\) and dtype float32",
    ),
    "out-dtype": (
        case(out=np.empty((2, 4, 6, 5), np.float64)),
        ValueError,
        r"out must have shape .* got shape \(2, 4, 6, 5\) and dtype float64",
    ),
    "out-list": (case(out=[[0.0]]), TypeError, r"out must be a numpy.ndarray, got list"),
    "out-readonly": (
        case(out=np.broadcast_to(np.empty(5, np.float32), (2, 4, 6, 5))),
        ValueError,
        r"out must be writeable",
    ),
}


def _call(fn, spec):
    q, k, v, mask, kwargs = spec
    return fn(q, k, v, mask, **kwargs)


@IMPLS
@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_raises(fn, name):
    spec, exc, pattern = BAD[name]
    with pytest.raises(exc, match=pattern) as info:
        _call(fn, spec)
    assert type(info.value) is exc  # not a subclass surprise (e.g. an ImportError)


@pytest.mark.parametrize("name", sorted(BAD))
def test_fastattn_and_reference_raise_alike(name):
    spec, _, _ = BAD[name]
    with pytest.raises((TypeError, ValueError)) as fast:
        _call(sdpa, spec)
    with pytest.raises((TypeError, ValueError)) as ref:
        _call(reference.scaled_dot_product_attention, spec)
    assert type(fast.value) is type(ref.value)
    assert str(fast.value) == str(ref.value)


def test_readonly_out_left_untouched():
    out = np.zeros((2, 4, 6, 5), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        sdpa(Q, K, V, out=out)
    assert (out == 0).all()


@IMPLS
@pytest.mark.parametrize("which", ["query", "key", "value", "attn_mask", "valid_lens"])
def test_out_aliasing_an_input(fn, which):
    q, k, v = (a.copy() for a in (Q, K, V))
    kwargs = {}
    if which == "query":
        out = q[..., :5]  # the first five features of each query row
    elif which == "key":
        k = r(2, 4, 7, 8)
        out = k[:, :, :6, :5]
    elif which == "value":
        v = r(2, 4, 7, 5)
        out = v[:, :, :6]
    elif which == "attn_mask":
        buf = r(2, 4, 6, 7)
        kwargs["attn_mask"] = buf
        out = buf[..., :5]
    else:
        buf = np.zeros((2, 4, 6, 5), np.float32)
        kwargs["valid_lens"] = buf.view(np.int32)[:, 0, 0, 0]  # shares out's memory
        out = buf
    with pytest.raises(ValueError, match=f"out shares memory with {which}"):
        fn(q, k, v, out=out, **kwargs)


def test_out_same_array_as_value_rejected():
    v = r(2, 4, 6, 5)
    k = r(2, 4, 6, 8)
    with pytest.raises(ValueError, match="out shares memory with value"):
        sdpa(Q, k, v, out=v)


def test_bad_environment_thread_count(monkeypatch):
    monkeypatch.setenv("FASTATTN_NUM_THREADS", "abc")
    with fastattn.set_num_threads(None):  # follow the environment
        for fn in (sdpa, reference.scaled_dot_product_attention):
            with pytest.raises(ValueError, match=r"FASTATTN_NUM_THREADS='abc'"):
                fn(Q, K, V)
        # An explicit count does not consult the environment.
        assert sdpa(Q, K, V, num_threads=1).shape == (2, 4, 6, 5)


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "two"])
def test_bad_omp_num_threads(monkeypatch, value):
    monkeypatch.delenv("FASTATTN_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with fastattn.set_num_threads(None):
        with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
            sdpa(Q, K, V)


def test_errors_leave_no_partial_state():
    """After a failed call the next good call is right (no stale ISA/thread/setting)."""
    before = fastattn.get_num_threads()
    with pytest.raises(ValueError):
        sdpa(Q, K, V, num_threads=0)
    assert fastattn.get_num_threads() == before
    got = sdpa(Q, K, V)
    want = reference.scaled_dot_product_attention(Q, K, V)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3"])
def test_set_num_threads_rejects(n):
    before = fastattn.get_num_threads()
    with pytest.raises((TypeError, ValueError), match=r"\bn\b"):
        fastattn.set_num_threads(n)
    assert fastattn.get_num_threads() == before


@pytest.mark.parametrize("name", ["bogus", "", "AVX2 "])
def test_set_isa_rejects_unknown(name):
    before = fastattn._core.active_isa()
    with pytest.raises(ValueError, match="FASTATTN_ISA"):
        fastattn._core.set_isa(name)
    assert fastattn._core.active_isa() == before

"""The shape of the Python layer: checks that read metadata only, and keyword calls into the
compiled core."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest

import fastattn
from fastattn import _core, _cuda
from fastattn._validation import masked_softmax_args, sdpa_args


def test_checks_convert_nothing():
    """Masks and lengths come back as given: converting them is the preparation's job."""
    q = np.ones((2, 3, 5, 4), np.float32)
    mask = np.zeros((5, 6), np.float16)  # a float mask in another dtype than the compute one
    lens = np.array([6, 2], np.int32)
    k = np.ones((2, 3, 6, 4), np.float32)
    args = sdpa_args(q, k, k, mask, lens, False, "top_left", None, None, None)
    assert args.attn_mask is mask and args.valid_lens is lens
    row_lens = np.array([4, 2], np.uint8)
    soft = masked_softmax_args(q, row_lens, None, -1, None)
    assert soft.valid_lens is row_lens and soft.x is q


def test_checks_run_on_stand_ins_without_allocating():
    """The CUDA path checks NumPy stand-ins of device arrays (shape and dtype, no data): a
    float64 mask that a float32 call computes in is not converted by the checks (that would
    take 16 GiB here)."""
    n = 65536
    q = _cuda.standin(SimpleNamespace(shape=(1, 1, n, 8), dtype=np.float32))
    mask = _cuda.standin(SimpleNamespace(shape=(1, 1, n, n), dtype=np.float64))
    args = sdpa_args(q, q, q, mask, None, False, "top_left", None, None, None)
    assert args.attn_mask is mask and args.compute_dtype == np.float32


def _keyword_spy(name, monkeypatch, seen):
    real = getattr(_core, name)

    def spy(*args, **kwargs):
        assert not args, f"_core.{name} called with {len(args)} positional arguments"
        seen.append((name, sorted(kwargs)))
        return real(**kwargs)

    monkeypatch.setattr(_core, name, spy)


CALLS = {
    "sdpa": lambda q, k, v: fastattn.scaled_dot_product_attention(q, k, v, return_lse=True),
    "attention-softmax": lambda q, k, v: fastattn.attention(q, k, v, score="cosine"),
    "attention-select": lambda q, k, v: fastattn.attention(q, k, v, normalize="topk", top_k=2),
    "attention-general": lambda q, k, v: fastattn.attention(
        q, k, v, score="general", weight=np.eye(4, dtype=q.dtype)
    ),
    "additive": lambda q, k, v: fastattn.additive_attention(
        q, k, v, np.ones((4, 3), q.dtype), np.ones((4, 3), q.dtype), np.ones(3, q.dtype)
    ),
    "masked_softmax": lambda q, k, v: fastattn.masked_softmax(q, np.array([2, 3])),
    "nadaraya_watson": lambda q, k, v: fastattn.nadaraya_watson(q[0], k[0], v[0]),
}


@pytest.mark.parametrize("case", sorted(CALLS))
def test_core_is_called_by_keyword(case, monkeypatch):
    """Every call into the compiled core names its arguments, so two of them swapped cannot
    go unnoticed; the names are the bindings' own (the real function accepts them)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 4), dtype=np.float32) for _ in range(3))
    expected = CALLS[case](q, k, v)
    seen = []
    for name in ("sdpa", "select", "additive", "masked_softmax", "nadaraya_watson", "project"):
        _keyword_spy(name, monkeypatch, seen)
    got = CALLS[case](q, k, v)
    assert seen, "no call reached the core"
    for a, b in zip(
        got if isinstance(got, tuple) else (got,),
        expected if isinstance(expected, tuple) else (expected,),
    ):
        np.testing.assert_array_equal(a, b)


def test_public_signatures_are_annotated():
    for fn in (
        fastattn.scaled_dot_product_attention,
        fastattn.attention,
        fastattn.additive_attention,
        fastattn.masked_softmax,
        fastattn.nadaraya_watson,
        fastattn.MultiHeadAttention.__call__,
        fastattn.reference.multi_head_attention,
    ):
        sig = inspect.signature(fn)
        assert sig.return_annotation is not inspect.Signature.empty, fn.__qualname__
        for p in sig.parameters.values():
            assert p.name == "self" or p.annotation is not inspect.Parameter.empty, (
                fn.__qualname__,
                p.name,
            )

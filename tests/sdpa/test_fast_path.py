"""The fast path of scaled_dot_product_attention (the core checks and computes the common
call; fastattn/_sdpa.py) against the full path: bit-identical results, the same errors,
and a fallback for everything it does not take. docs/semantics.md holds for both."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import _core, _sdpa

from sdpa import test_errors
from sdpa.test_errors import BAD, _call

# Existing semantic tests, collected here again and run on each path (the `path` fixture
# below is autouse in this module).
from sdpa.test_semantics import (  # noqa: F401
    test_bit_identical_for_any_thread_count,
    test_broadcast_inputs_equal_materialised,
    test_default_scale_is_inverse_sqrt_e,
    test_empty_dimensions,
    test_gqa_equals_repeated_heads,
    test_inputs_not_modified,
    test_other_layouts_equal_contiguous,
)

sdpa = fastattn.scaled_dot_product_attention


@pytest.fixture(autouse=True, params=["fast", "full"])
def path(request, monkeypatch):
    """Run with the fast path on (the default) or off (FASTATTN_FAST_PATH=0)."""
    monkeypatch.setattr(_sdpa, "_fast_path", request.param == "fast")
    return request.param


def both_paths(monkeypatch, call):
    """call() with the fast path on, then off."""
    results = []
    for on in (True, False):
        monkeypatch.setattr(_sdpa, "_fast_path", on)
        results.append(call())
    return results


def _rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# (query, key, value shapes, kwargs): calls the fast path takes, and some it declines.
CASES = {
    "decode": ((1, 8, 1, 64), (1, 8, 128, 64), (1, 8, 128, 64), {}),
    "tiny": ((1, 1, 1, 64), (1, 1, 16, 64), (1, 1, 16, 64), {}),
    "3d": ((4, 5, 8), (4, 7, 8), (4, 7, 3), {}),
    "5d-broadcast": ((2, 1, 2, 3, 8), (1, 3, 1, 6, 8), (2, 3, 1, 6, 4), {}),
    "gqa": ((2, 8, 5, 16), (2, 2, 9, 16), (2, 2, 9, 16), {"is_causal": True}),
    "bottom-right": (
        (1, 2, 3, 8),
        (1, 2, 11, 8),
        (1, 2, 11, 8),
        {"is_causal": True, "causal_alignment": "bottom_right"},
    ),
    "scale": ((2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8), {"scale": -0.7}),
    "threads": ((1, 4, 33, 32), (1, 4, 300, 32), (1, 4, 300, 32), {"num_threads": 2}),
    "float64": ((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"dtype": np.float64}),
    "empty-rows": ((1, 2, 0, 8), (1, 2, 5, 8), (1, 2, 5, 8), {}),
    "no-keys": ((1, 2, 3, 8), (1, 2, 0, 8), (1, 2, 0, 8), {}),
    # declined: float16, 2-D, mixed dtypes, extras, masks, int scale
    "float16": ((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"dtype": np.float16}),
    "2d": ((3, 8), (5, 8), (5, 8), {}),
    "lse": ((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"return_lse": True}),
    "window": ((1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8), {"window": (1, 0)}),
    "softcap": ((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"softcap": 2.0}),
    "int-scale": ((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"scale": 1}),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_fast_and_full_paths_agree(isa, monkeypatch, name, layout):
    qs, ks, vs, kwargs = CASES[name]
    kwargs = dict(kwargs)
    dtype = kwargs.pop("dtype", np.float32)
    rng = np.random.default_rng(sum(map(ord, name)))
    arrays = []
    for shape in (qs, ks, vs):
        a = _rand(rng, shape, dtype)
        if layout == "transposed" and a.ndim >= 3:  # (..., L, H, E) memory, a view
            a = np.ascontiguousarray(a.swapaxes(-3, -2)).swapaxes(-3, -2)
        elif layout == "strided":  # every other feature: not a unit-stride last axis
            a = np.repeat(a, 2, axis=-1)[..., ::2]
        arrays.append(a)
    fast, full = both_paths(monkeypatch, lambda: sdpa(*arrays, **kwargs))
    for a, b in zip(
        fast if isinstance(fast, tuple) else (fast,), full if isinstance(full, tuple) else (full,)
    ):
        assert type(a) is type(b) is np.ndarray
        assert a.shape == b.shape and a.dtype == b.dtype
        assert a.flags.c_contiguous and a.flags.writeable
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_common_call_skips_the_full_path(monkeypatch):
    """The common call never reaches the full path's core entry; any other call does."""
    seen = []
    real = _core.sdpa

    def spy(**kwargs):
        seen.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(_core, "sdpa", spy)
    monkeypatch.setattr(_sdpa, "_fast_path", True)
    rng = np.random.default_rng(3)
    q, k, v = (_rand(rng, (1, 8, 1, 64)), _rand(rng, (1, 8, 16, 64)), _rand(rng, (1, 8, 16, 64)))
    sdpa(q, k, v, is_causal=True, causal_alignment="bottom_right", scale=0.5, num_threads=1)
    assert not seen
    sdpa(q, k, v, return_lse=True)
    assert len(seen) == 1


@pytest.mark.parametrize("name", sorted(BAD))
def test_errors_are_the_full_paths(monkeypatch, name):
    """Every bad call raises the same exception and message on both paths."""
    spec, exc, pattern = BAD[name]
    raised = []
    for on in (True, False):
        monkeypatch.setattr(_sdpa, "_fast_path", on)
        with pytest.raises(exc, match=pattern) as info:
            _call(test_errors.sdpa, spec)
        raised.append((type(info.value), str(info.value)))
    assert raised[0] == raised[1]


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("FASTATTN_NUM_THREADS", "abc", "FASTATTN_NUM_THREADS='abc'"),
        ("OMP_NUM_THREADS", "0", "OMP_NUM_THREADS"),
        ("OMP_NUM_THREADS", "1.5", "OMP_NUM_THREADS"),
        ("OMP_NUM_THREADS", " 2, 1", None),
        ("FASTATTN_NUM_THREADS", "", None),
    ],
)
def test_thread_environment_read_like_the_full_path(monkeypatch, var, value, message):
    """The fast path resolves the thread count itself (cached): a bad environment still
    raises the full path's error, a good one is honoured, and a change is seen."""
    monkeypatch.delenv("FASTATTN_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    q = k = v = test_errors.Q
    with fastattn.set_num_threads(None):
        expected = sdpa(q, k, v)
        monkeypatch.setenv(var, value)
        if message is None:
            np.testing.assert_array_equal(sdpa(q, k, v), expected)
        else:
            with pytest.raises(ValueError, match=message):
                sdpa(q, k, v)
        monkeypatch.setenv(var, "1")
        np.testing.assert_array_equal(sdpa(q, k, v), expected)


def test_bad_num_threads_argument_raises_as_before():
    q = test_errors.Q
    for n, exc in (
        (0, ValueError),
        (True, TypeError),
        (1.0, TypeError),
        (np.int64(-1), ValueError),
    ):
        with pytest.raises(exc, match="num_threads"):
            sdpa(q, q, q, num_threads=n)

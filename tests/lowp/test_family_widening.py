"""float16 and bfloat16 in masked_softmax: x is read as it is and widened row by row inside
the kernel (float32 compute), the result rounded to x's dtype as it is written (round to
nearest even). The arithmetic is the float32 kernel's on the widened values, so the result
must be bit-identical to the float32 call on the same values, rounded -- on every ISA, for
any layout of x and out -- and no float32 copy of x is made."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn

from helpers.lowp_checks import bf16, peak_traced_bytes, poisoned

pytest.importorskip("ml_dtypes")


def _same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(1, 300)),
    axis=st.sampled_from([-1, 1]),
    masks=st.sampled_from(["none", "valid_lens", "mask", "both"]),
    layout=st.sampled_from(["contiguous", "strided", "out"]),
    scale=st.sampled_from([1.0, 30.0]),
)
def test_widened_in_kernel_equals_float32_call_rounded(
    isa, name, seed, shape, axis, masks, layout, scale
):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(np.float16) if name == "float16" else bf16()
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    if layout == "strided":  # every other element along the last axis
        x = np.repeat(x, 2, axis=-1)[..., ::2]
    rows = tuple(np.delete(np.array(shape), axis))
    kw = {}
    if masks in ("valid_lens", "both"):
        kw["valid_lens"] = rng.integers(0, shape[axis] + 1, rows)
    if masks in ("mask", "both"):
        kw["mask"] = rng.random(shape) < 0.7
    want = fastattn.masked_softmax(x.astype(np.float32), axis=axis, **kw).astype(dtype)
    if layout == "out":
        out = poisoned(shape, dtype)
        got = fastattn.masked_softmax(x, axis=axis, out=out, **kw)
        assert got is out
    else:
        got = fastattn.masked_softmax(x, axis=axis, **kw)
    assert got.dtype == dtype
    _same_bits(got, want)
    for threads in (1, 3):
        _same_bits(fastattn.masked_softmax(x, axis=axis, num_threads=threads, **kw), want)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_no_float32_copy(name):
    """Peak traced memory (NumPy's allocations) stays below one float32 copy of x: the
    kernel reads the 16-bit array itself and writes the 16-bit result."""
    dtype = np.dtype(np.float16) if name == "float16" else bf16()
    x = np.random.default_rng(2).standard_normal((64, 8, 1024)).astype(dtype)
    lens = np.random.default_rng(3).integers(0, 1025, (64, 8))
    fastattn.masked_softmax(x)  # warm up (thread pool, first-call allocations)
    for call in (lambda: fastattn.masked_softmax(x), lambda: fastattn.masked_softmax(x, lens)):
        peak = peak_traced_bytes(call)
        assert peak < x.size * 4, peak

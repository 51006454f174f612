"""Checks shared by the CUDA-path tests: on a GPU (CuPy) and on the host emulation.

Not a test module. A :class:`DeviceRunner` moves NumPy inputs to the device keeping their
exact memory layout (strides, offsets, broadcasting, the NaN-filled gaps of sliced
buffers), calls the CUDA path, checks the results live on the device (and that ``out=`` is
returned as given), and brings them back as NumPy arrays; the ``check_*`` functions then
compare with ``fastattn.reference`` on the same hypothesis-drawn cases as the CPU suite,
with the CPU suite's tolerances (the error of the same math in the compute dtype).
The emulated tests run the very same runner with NumPy as the "device" module, so this
harness is exercised even where no GPU is.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastattn import reference

from .attention_checks import assert_close, assert_close_attention, unpack
from .family_checks import additive_score_error, compute_eps, finite_max, tolerances


def to_device(xp, to_host, a):
    """``a`` on the device of ``xp`` with the same shape, dtype, strides and values: the
    whole memory extent is copied, so gaps between strided elements come along too."""
    a = np.asarray(a)
    if a.ndim == 0 or a.size == 0:
        return xp.asarray(a)
    zero = [ax for ax in range(a.ndim) if a.strides[ax] == 0 and a.shape[ax] > 1]
    if zero:  # a broadcast view: copy the distinct entries, broadcast on the device
        compact = a[tuple(slice(0, 1) if ax in zero else slice(None) for ax in range(a.ndim))]
        return xp.broadcast_to(to_device(xp, to_host, compact), a.shape)
    low = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s > 0) + a.itemsize
    start = a.__array_interface__["data"][0] + low
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * (high - low)).from_address(start)).copy()
    flat = xp.asarray(raw).view(a.dtype)
    # Positive strides from the lowest address, then the negative axes reversed by slicing.
    dev = xp.lib.stride_tricks.as_strided(
        flat, shape=a.shape, strides=tuple(abs(s) for s in a.strides)
    )
    dev = dev[tuple(slice(None, None, -1) if s < 0 else slice(None) for s in a.strides)]
    assert dev.strides == a.strides
    np.testing.assert_array_equal(to_host(dev), a)  # NaN == NaN here
    return dev


@dataclass
class DeviceRunner:
    """Calls the CUDA path's three functions with device copies of NumPy arguments and
    returns NumPy results. ``sdpa``/``softmax``/``additive`` take the public functions'
    arguments (device arrays in, device arrays out)."""

    xp: Any
    to_host: Callable
    sdpa_fn: Callable
    softmax_fn: Callable
    additive_fn: Callable

    def _dev(self, a):
        if isinstance(a, np.ndarray):
            return to_device(self.xp, self.to_host, a)
        return a

    def _call(self, fn, args, kwargs):
        args = [self._dev(a) for a in args]
        kwargs = {name: self._dev(a) for name, a in kwargs.items()}
        out = kwargs.get("out")
        result = fn(*args, **kwargs)
        parts = result if isinstance(result, tuple) else (result,)
        for part in parts:
            assert isinstance(part, self.xp.ndarray), type(part)
        if out is not None:
            assert parts[0] is out, "out= was not returned as given"
        host = tuple(self.to_host(p) for p in parts)
        return host if isinstance(result, tuple) else host[0]

    def sdpa(self, *args, **kwargs):
        return self._call(self.sdpa_fn, args, kwargs)

    def softmax(self, *args, **kwargs):
        return self._call(self.softmax_fn, args, kwargs)

    def additive(self, *args, **kwargs):
        return self._call(self.additive_fn, args, kwargs)


# --------------------------------------------------------------------------------------
# scaled_dot_product_attention


def check_sdpa(run: DeviceRunner, q, k, v, kwargs, return_lse=False, return_weights=False):
    expected = reference.scaled_dot_product_attention(
        q, k, v, return_lse=True, return_weights=True, **kwargs
    )
    got = unpack(
        run.sdpa(q, k, v, return_lse=return_lse, return_weights=return_weights, **kwargs),
        return_lse,
        return_weights,
    )
    assert_close_attention(
        got,
        expected,
        q,
        k,
        v,
        attn_mask=kwargs.get("attn_mask"),
        scale=kwargs.get("scale"),
        softcap=kwargs.get("softcap"),
    )
    return got, expected


def check_sdpa_spec(run: DeviceRunner, spec, build) -> None:
    q, k, v, kwargs = build(spec)
    check_sdpa(run, q, k, v, kwargs, spec.return_lse, spec.return_weights)


def check_sdpa_empty_rows(run: DeviceRunner, spec, build_with_empty_rows) -> None:
    q, k, v, kwargs = build_with_empty_rows(spec)
    got, expected = check_sdpa(run, q, k, v, kwargs, True, True)
    empty = np.isneginf(expected[1])
    assert empty.any(), "the case has no fully masked row"
    assert (got[0][empty] == 0).all() and (got[2][empty] == 0).all()
    assert np.isneginf(got[1][empty]).all()


def check_sdpa_out(run: DeviceRunner, q, k, v, kwargs, layout: str = "c") -> None:
    """out= (NaN-poisoned, C-ordered or every other element of a wider buffer) is fully
    written and returned."""
    expected = reference.scaled_dot_product_attention(q, k, v, **kwargs)
    if layout == "c":
        out = np.full(expected.shape, np.nan, expected.dtype)
    else:
        out = np.full(expected.shape[:-1] + (2 * expected.shape[-1],), np.nan, expected.dtype)[
            ..., ::2
        ]
    got = run.sdpa(q, k, v, out=out, **kwargs)
    assert_close_attention(
        (got, None, None),
        (expected, None, None),
        q,
        k,
        v,
        attn_mask=kwargs.get("attn_mask"),
        scale=kwargs.get("scale"),
        softcap=kwargs.get("softcap"),
    )


# --------------------------------------------------------------------------------------
# masked_softmax (cases and build from family.test_masked_softmax)


def check_softmax_case(run: DeviceRunner, case, build) -> None:
    x, kwargs = build(case)
    expected = reference.masked_softmax(x, **kwargs)
    out = None
    if case.out == "c":
        out = np.full(x.shape, np.nan, expected.dtype)
    elif case.out == "strided":
        out = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, expected.dtype)[..., ::2]
    got = run.softmax(x, out=out, **kwargs)
    eps, f16 = compute_eps(x)
    tol = eps * (32 + x.shape[case.axis]) + (float(np.finfo(np.float16).eps) if f16 else 0.0)
    assert_close("masked_softmax", got, expected, tol)
    # Where the reference has 0 the kernels give 0, or a weight that underflowed to a
    # subnormal (the GPU flushes those with CuPy's -ftz=true; the emulation keeps them).
    assert (np.abs(got[expected == 0]) < np.finfo(got.dtype).tiny).all()
    # Entries not kept (past valid_lens, masked) are exactly 0, unless their row is NaN.
    kept = reference.masked_softmax(np.zeros(x.shape), **kwargs) > 0
    assert ((got[~kept] == 0) | np.isnan(expected[~kept])).all()


# --------------------------------------------------------------------------------------
# additive_attention (additive_cases and make_weights from family.test_additive_attention)


def check_additive(
    run: DeviceRunner, q, k, v, w_q, w_k, w_v, *, return_weights=False, use_out=False, **kwargs
):
    expected, exp_w = reference.additive_attention(
        q, k, v, w_q, w_k, w_v, return_weights=True, **kwargs
    )
    out = np.full(expected.shape, np.nan, expected.dtype) if use_out else None
    got = run.additive(q, k, v, w_q, w_k, w_v, return_weights=return_weights, out=out, **kwargs)
    got_w = None
    if return_weights:
        got, got_w = got
    eps, f16 = compute_eps(q, k, v, w_q, w_k, w_v)
    err = additive_score_error(q, k, w_q, w_k, w_v, kwargs.get("attn_mask"))
    out_tol, w_tol = tolerances(err, k.shape[-2], finite_max(v), eps, f16)
    assert_close("output", got, expected, out_tol)
    if got_w is not None:
        assert_close("weights", got_w, exp_w, w_tol)
    empty = np.all(exp_w == 0, axis=-1)
    assert (got[empty] == 0).all()
    return got


def check_additive_case(run: DeviceRunner, case, build, make_weights, dtypes) -> None:
    spec, hidden, w_dtype, scale = case
    q, k, v, kwargs = build(spec)
    w = make_weights(spec.seed, q.shape[-1], k.shape[-1], hidden, dtypes[w_dtype], scale)
    check_additive(run, q, k, v, *w, return_weights=spec.return_weights, use_out=spec.out, **kwargs)

"""The argument checks every part of fastattn shares: scalars (flags, real numbers, sizes,
choices, windows), float arrays and their result/compute dtypes, masks, valid lengths and
``out=`` buffers.

The checks read what describes an argument -- shape, dtype, strides, flags, and the values
of ``valid_lens`` -- and convert nothing: array_like inputs become ndarrays with
``np.asarray`` (no copy for an ndarray), nothing else is allocated. Each message names the
argument, what it got and what was expected; the semantics they enforce are written down
in ``docs/semantics.md``. The checks of whole calls are in :mod:`fastattn._validation`
(the attention functions) and :mod:`fastattn._layer_checks` (the multi-head layer).
"""

from __future__ import annotations

import math
import numbers
import operator

import numpy as np

from fastattn._dtypes import FLOAT32 as _FLOAT32
from fastattn._dtypes import is_bfloat16

_UNBOUNDED = 2**40  # larger than any sequence length; window sides are clamped to it
_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_FINFO_MAX = {d: float(np.finfo(d).max) for d in _FLOAT_DTYPES}
_NATIVE_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_MAX_BATCH_DIMS = 61  # the kernels index at most 64 dims: batch + (H, L, E)


# --------------------------------------------------------------------------------------
# Scalars


def check_flag(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_real(value: object, name: str, *, positive: bool = False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    if positive and x <= 0:
        raise ValueError(f"{name} must be > 0, got {x}")
    return x


def check_size(value: object, name: str, *, minimum: int = 1, noun: str = "an int") -> int:
    """An int >= ``minimum`` (bools refused); ``noun`` is how the message names an int."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be {noun} >= {minimum}, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {noun} >= {minimum}, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def check_choice(value: object, name: str, choices: tuple) -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_window(window: object) -> tuple[int, int]:
    """``(left, right)`` with None -> -1 (unbounded)."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(
            f"window must be None or a pair (left, right) of ints >= 0 or None, got {window!r}"
        )
    sides = []
    for side, value in zip(("left", "right"), window):
        if value is None:
            sides.append(-1)
            continue
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(f"window {side} must be an int >= 0 or None, got {value!r}")
        try:
            n = operator.index(value)
        except TypeError:
            raise TypeError(f"window {side} must be an int >= 0 or None, got {value!r}") from None
        if n < 0:
            raise ValueError(f"window {side} must be >= 0 or None, got {n}")
        sides.append(min(n, _UNBOUNDED))  # any side >= Lq + Lk is unbounded; keeps int64 safe
    return sides[0], sides[1]


def check_alignment(causal_alignment: object) -> None:
    if not isinstance(causal_alignment, str) or causal_alignment not in (
        "top_left",
        "bottom_right",
    ):
        raise ValueError(
            f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}"
        )


def _inverse_power(x: float, power: int, name: str, dtype: np.dtype, what: str) -> float:
    """``1 / x**power``, which must be finite in ``dtype`` (x > 0 already checked)."""
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        value = float(np.float64(1.0) / np.float64(x) ** power)
    if not value <= float(np.finfo(dtype).max):
        raise ValueError(f"{name} gives {what} = {value:.3g}, which is not finite in {dtype}")
    return value


# --------------------------------------------------------------------------------------
# Arrays: dtype, shape, layout


def float_array(x: object, name: str, min_ndim: int = 2) -> np.ndarray:
    """``x`` as a float16/32/64 ndarray of at least ``min_ndim`` dims (no copy if it is one)."""
    a = np.asarray(x)
    dt = a.dtype  # native float dtypes first: the common case, without newbyteorder's cost
    if (
        dt not in _FLOAT_DTYPES
        and (dt.kind != "f" or dt.newbyteorder("=") not in _FLOAT_DTYPES)
        and not is_bfloat16(dt)
    ):
        raise TypeError(
            f"{name} must be a floating-point array (float16, float32 or float64), "
            f"got dtype {a.dtype}"
        )
    if a.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions (..., L, E), got shape {a.shape}"
        )
    return a


def result_dtypes(*arrays: np.ndarray) -> tuple[np.dtype, np.dtype]:
    """(dtype of the result, dtype computed in): float16 and bfloat16 are computed in
    float32. bfloat16 with other dtypes promotes as float32 would (as ``np.result_type``
    does with ml_dtypes for float32/float64; bfloat16 with float16 gives float32)."""
    first = arrays[0].dtype  # dtype equality includes the byte order
    if first in _NATIVE_KERNEL_DTYPES:  # the common case, without np.result_type's cost
        for a in arrays:
            if a.dtype != first:
                break
        else:
            return first, first
    dtypes = [a.dtype for a in arrays]
    if any(is_bfloat16(d) for d in dtypes):
        others = [d.newbyteorder("=") for d in dtypes if not is_bfloat16(d)]
        if not others:
            return dtypes[0], _FLOAT32
        result = np.result_type(_FLOAT32, *others)
        return result, result
    result = np.result_type(*[d.newbyteorder("=") for d in dtypes])
    compute = _FLOAT32 if result == np.float16 else result
    return result, compute


def _weight(w: object, name: str, shape: tuple, meaning: str) -> np.ndarray:
    """A float weight array of exactly ``shape`` (``meaning`` says what its axes are)."""
    a = float_array(w, name, min_ndim=0)
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {meaning} = {tuple(shape)}, got shape {a.shape}")
    return a


def check_attn_mask(mask: object, name: str, user_shape: tuple) -> np.ndarray:
    """A bool or float mask broadcastable to ``user_shape`` (the scores the caller sees)."""
    m = np.asarray(mask)
    if m.dtype != np.bool_ and m.dtype.kind != "f" and not is_bfloat16(m.dtype):
        raise TypeError(
            f"{name} must be a bool array (True = may attend) or a float array added to the "
            f"scores, got dtype {m.dtype}"
        )
    try:
        if m.ndim > len(user_shape):
            raise ValueError
        if np.broadcast_shapes(m.shape, user_shape) != tuple(user_shape):
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{name} of shape {m.shape} does not broadcast to the attention scores' "
            f"shape {tuple(user_shape)} (..., Hq, Lq, Lk)"
        ) from None
    return m


def check_valid_lens(valid_lens: object, rows_shape: tuple, num_keys: int) -> np.ndarray:
    """Integer lengths whose shape is a leading prefix of ``rows_shape`` (the score rows,
    (..., Hq, Lq)) with size-1 axes broadcasting, each in ``[0, num_keys]``."""
    vl = np.asarray(valid_lens)
    if vl.dtype.kind not in "iu":
        raise TypeError(f"valid_lens must be an integer array, got dtype {vl.dtype}")
    rows_shape = tuple(rows_shape)
    if vl.ndim > len(rows_shape) or any(n not in (1, r) for n, r in zip(vl.shape, rows_shape)):
        raise ValueError(
            f"valid_lens of shape {vl.shape} is not a leading prefix of the score rows' shape "
            f"{rows_shape} (size-1 axes broadcast): e.g. {rows_shape[:1]} for one length per "
            f"leading entry, or {rows_shape} for one per query row"
        )
    if vl.size:
        lo, hi = int(vl.min()), int(vl.max())
        if lo < 0 or hi > num_keys:
            raise ValueError(
                f"valid_lens must lie in [0, {num_keys}] (the number of keys), "
                f"got values from {lo} to {hi}"
            )
    return vl


def may_self_overlap(a: np.ndarray) -> bool:
    """Whether two elements of ``a`` may share memory (a stride-0 axis of size > 1, or any
    axes whose strides interleave: each axis, by increasing stride, must step past the whole
    extent of the smaller ones)."""
    if a.size == 0:
        return False
    extent = a.itemsize
    for stride, n in sorted((abs(s), n) for s, n in zip(a.strides, a.shape) if n > 1):
        if stride < extent:
            return True
        extent += stride * (n - 1)
    return False


def check_out(out: object, shape: tuple, dtype: np.dtype, inputs: dict) -> np.ndarray:
    """A caller-supplied ``out=`` buffer: exact shape and dtype, writeable, no element
    twice, sharing no memory with ``inputs`` (judged from the arrays' bounds)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(
            f"out must have shape {tuple(shape)} and dtype {dtype}, "
            f"got shape {out.shape} and dtype {out.dtype}"
        )
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    if may_self_overlap(out):
        raise ValueError(
            f"out has overlapping elements (shape {out.shape}, strides {out.strides}): pass a "
            "buffer whose elements are distinct"
        )
    for name, arr in inputs.items():
        if arr is not None and np.may_share_memory(out, arr):
            raise ValueError(f"out shares memory with {name}; pass a separate buffer")
    return out

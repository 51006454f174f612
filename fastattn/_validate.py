"""Every user-facing check and conversion, in one place.

Each message names the argument, what it got and what was expected. The functions here
return arrays ready for the kernels (or for ``fastattn.reference``): native byte order,
a supported dtype, and broadcast to full shape as zero-copy views.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass

import numpy as np

_UNBOUNDED = 2**40  # larger than any sequence length; window sides are clamped to it
_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_FINFO_MAX = {d: float(np.finfo(d).max) for d in _FLOAT_DTYPES}


def float_array(x: object, name: str, min_ndim: int = 2) -> np.ndarray:
    """``x`` as a float16/32/64 ndarray of at least ``min_ndim`` dims (no copy if it is one)."""
    a = np.asarray(x)
    if a.dtype.kind != "f" or a.dtype.newbyteorder("=") not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating-point array (float16, float32 or float64), "
            f"got dtype {a.dtype}"
        )
    if a.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions (..., L, E), got shape {a.shape}"
        )
    return a


_NATIVE_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def result_dtypes(*arrays: np.ndarray) -> tuple[np.dtype, np.dtype]:
    """(dtype of the result, dtype computed in): float16 is computed in float32."""
    first = arrays[0].dtype  # dtype equality includes the byte order
    if first in _NATIVE_KERNEL_DTYPES and all(a.dtype == first for a in arrays[1:]):
        return first, first  # the common case, without np.result_type's cost
    result = np.result_type(*[a.dtype.newbyteorder("=") for a in arrays])
    compute = np.dtype(np.float32) if result == np.float16 else result
    return result, compute


def kernel_ready(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` in ``dtype``, native byte order, aligned, unit-stride last axis; copies only if
    needed."""
    if a.dtype != dtype:  # also catches non-native byte order
        a = a.astype(dtype, order="K")
    if a.flags.c_contiguous and a.flags.aligned:
        return a
    if a.ndim and (
        (a.shape[-1] > 1 and a.strides[-1] != a.itemsize)
        or any(s % a.itemsize for s in a.strides)
        or not a.flags.aligned
    ):
        # A copy, not np.ascontiguousarray: that returns a contiguous but unaligned array
        # as it is, and the kernels read whole elements through typed pointers.
        a = a.copy(order="C")
    return a


def aligned_contiguous(a, dtype: np.dtype) -> np.ndarray:
    """``a`` as a C-contiguous, aligned array of ``dtype`` (copies only if needed)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return a if a.flags.aligned else a.copy()


def with_leading_axes(a: np.ndarray, ndim: int) -> np.ndarray:
    """A view of ``a`` with size-1 axes prepended up to ``ndim`` dims."""
    return a[(None,) * (ndim - a.ndim)] if a.ndim < ndim else a


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


def broadcast_mask(mask: object, name: str, user_shape: tuple, full_shape: tuple,
                   float_dtype: np.dtype) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(bool mask, float mask) broadcast to ``full_shape``; one of them is None."""
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        kind = "bool"
    elif m.dtype.kind == "f":
        kind = "float"
        m = m.astype(float_dtype, copy=False)
    else:
        raise TypeError(
            f"{name} must be a bool array (True = may attend) or a float array added to the "
            f"scores, got dtype {m.dtype}"
        )
    if any(st % m.itemsize for st in m.strides) or not m.flags.aligned:
        m = m.copy()
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
    full = np.broadcast_to(m, full_shape)
    return (full, None) if kind == "bool" else (None, full)


def broadcast_valid_lens(valid_lens: object, rows_shape: tuple, full_rows_shape: tuple,
                         num_keys: int) -> np.ndarray:
    """int64 valid_lens broadcast to ``full_rows_shape``; its shape must be a leading
    prefix of ``rows_shape`` (the score rows, (..., Hq, Lq)) with size-1 axes broadcasting."""
    vl = np.asarray(valid_lens)
    if vl.dtype.kind not in "iu":
        raise TypeError(f"valid_lens must be an integer array, got dtype {vl.dtype}")
    rows_shape = tuple(rows_shape)
    if vl.ndim > len(rows_shape) or any(
        n not in (1, r) for n, r in zip(vl.shape, rows_shape)
    ):
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
    vl = vl.astype(np.int64, copy=False)
    if any(s % vl.itemsize for s in vl.strides) or not vl.flags.aligned:
        vl = vl.copy()
    vl = vl.reshape(vl.shape + (1,) * (len(rows_shape) - vl.ndim))
    return np.broadcast_to(vl, full_rows_shape)


@dataclass
class SdpaArgs:
    """A validated scaled_dot_product_attention call. q/k/v are at least 3-D
    ``(..., H, L, E)``, not yet broadcast (see :meth:`full`); masks are broadcast to
    ``batch + (Hq, Lq, Lk)`` and valid_lens to ``batch + (Hq, Lq)`` (zero-copy views);
    ``out_shape``/``scores_shape`` are the shapes the caller sees."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    batch: tuple
    bool_mask: np.ndarray | None
    float_mask: np.ndarray | None
    valid_lens: np.ndarray | None
    result_dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple
    full_out_shape: tuple
    scale: float
    softcap: float | None
    is_causal: bool
    diag_offset: int
    window: tuple[int, int]  # -1 = unbounded

    def full(self, a: np.ndarray) -> np.ndarray:
        """``a`` (query, key or value, maybe converted) broadcast to the batch: a view."""
        if a.shape[:-3] == self.batch:
            return a
        return np.broadcast_to(a, self.batch + a.shape[-3:])

    @property
    def full_scores_shape(self) -> tuple:
        return self.full_out_shape[:-1] + (self.key.shape[-2],)

    @property
    def scores_shape(self) -> tuple:
        return self.out_shape[:-1] + (self.key.shape[-2],)


def sdpa_args(query, key, value, attn_mask, valid_lens, is_causal, causal_alignment, window,
              scale, softcap) -> SdpaArgs:
    q = float_array(query, "query")
    k = float_array(key, "key")
    v = float_array(value, "value")
    result, compute = result_dtypes(q, k, v)
    out_ndim = max(q.ndim, k.ndim, v.ndim)
    q3, k3, v3 = (with_leading_axes(a, 3) for a in (q, k, v))
    try:
        batch = q3.shape[:-3]
        if not batch == k3.shape[:-3] == v3.shape[:-3]:
            batch = np.broadcast_shapes(batch, k3.shape[:-3], v3.shape[:-3])
    except ValueError:
        raise ValueError(
            f"the leading (batch) dims of query {q.shape}, key {k.shape} and value {v.shape} "
            "do not broadcast together"
        ) from None
    hq, lq, e = q3.shape[-3:]
    hkv, lk, ek = k3.shape[-3:]
    hv, lv, ev = v3.shape[-3:]
    if ek != e:
        raise ValueError(
            f"key has feature size {ek} (last axis) but query has {e}: they must match "
            f"(query {q.shape}, key {k.shape})"
        )
    if e == 0:
        raise ValueError(f"query and key must have a feature size E >= 1, got shape {q.shape}")
    if lv != lk:
        raise ValueError(
            f"value has {lv} positions (axis -2) but key has {lk} (key {k.shape}, value {v.shape})"
        )
    if hv != hkv:
        raise ValueError(
            f"value has {hv} heads but key has {hkv} (key {k.shape}, value {v.shape})"
        )
    if (hkv == 0 and hq != 0) or (hkv and hq % hkv):
        raise ValueError(f"key has {hkv} heads, which does not divide query's {hq} heads")
    if len(batch) > 61:
        raise ValueError(f"at most 61 leading (batch) dims are supported, got {len(batch)}")

    full_out = batch + (hq, lq, ev)
    out_shape = full_out[len(full_out) - out_ndim:]
    full_scores = batch + (hq, lq, lk)
    scores = full_scores[len(full_scores) - out_ndim:]

    bool_mask = float_mask = None
    if attn_mask is not None:
        bool_mask, float_mask = broadcast_mask(attn_mask, "attn_mask", scores, full_scores,
                                               compute)
    vl = None
    if valid_lens is not None:
        vl = broadcast_valid_lens(valid_lens, scores[:-1], full_scores[:-1], lk)

    causal = check_flag(is_causal, "is_causal")
    if not isinstance(causal_alignment, str) or causal_alignment not in (
        "top_left", "bottom_right"):
        raise ValueError(
            f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}"
        )
    win = check_window(window)
    scale_value = 1.0 / math.sqrt(e) if scale is None else check_real(scale, "scale")
    limit = _FINFO_MAX[compute]
    if abs(scale_value) > limit:
        raise ValueError(f"scale must be finite in {compute} (|scale| <= {limit:.3g}), got {scale}")
    cap = None if softcap is None else check_real(softcap, "softcap", positive=True)
    if cap is not None and cap > limit:
        cap = None  # c * tanh(s / c) == s to the last bit for any c this large

    return SdpaArgs(
        query=q3,
        key=k3,
        value=v3,
        batch=batch,
        bool_mask=bool_mask,
        float_mask=float_mask,
        valid_lens=vl,
        result_dtype=result,
        compute_dtype=compute,
        out_shape=out_shape,
        full_out_shape=full_out,
        scale=scale_value,
        softcap=cap,
        is_causal=causal,
        diag_offset=(lk - lq) if causal_alignment == "bottom_right" else 0,
        window=win,
    )


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
    """A caller-supplied ``out=`` buffer: exact shape and dtype, writeable, no aliasing."""
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

"""fastattn.quantize_kv: symmetric per-vector int8 quantisation of a K/V cache, the form
scaled_dot_product_attention reads with key_scale/value_scale (dequantised inside the
kernel as it reads the int8 bytes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fastattn._validation import quantize_args

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray


def quantize_kv(x: ArrayLike, *, axis: int = -1) -> tuple[NDArray[np.int8], NDArray[np.float32]]:
    """Symmetric int8 quantisation, one scale per vector along ``axis``.

    ``scale = max|x| / 127`` over ``axis`` (float32) and ``q = round(x / scale)``, rounded
    half to even, in ``[-127, 127]``; a vector of zeros gets scale 0 and zeros. ``q *
    scale[..., None]`` (for ``axis=-1``) is what ``q`` stands for.

    Parameters
    ----------
    x : array_like of float16, bfloat16, float32 or float64, finite
        The keys or values, e.g. ``(..., H, L, E)`` quantised per key (``axis=-1``).
    axis : int, default -1
        The axis each scale covers.

    Returns
    -------
    (q, scale) : ``q`` int8 of ``x``'s shape; ``scale`` float32 of ``x``'s shape without
    ``axis``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> q, s = fastattn.quantize_kv(np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]]))
    >>> q.tolist(), s.tolist()
    ([[64, -127, 32], [0, 0, 0]], [0.015748031437397003, 0.0])
    """
    a, ax = quantize_args(x, axis)
    # float32 throughout (float64 input: its scale still float32, the division in float64).
    work = np.float64 if a.dtype == np.float64 else np.float32
    values = a.astype(work, copy=False)
    peak = np.abs(values).max(axis=ax, keepdims=True, initial=0.0)
    scale = (peak / work(127.0)).astype(np.float32)
    if not np.isfinite(scale).all():
        raise ValueError("x must be finite (an inf or NaN has no int8 form)")
    divisor = np.where(scale > 0, scale, np.float32(1.0)).astype(work)
    q = np.rint(values / divisor)
    return np.clip(q, -127, 127).astype(np.int8), np.squeeze(scale, axis=ax)

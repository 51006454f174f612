"""Computations shared by the fast functions and the NumPy twins beside the kernels:
Silverman's bandwidth, and the head split and head average of the layer. (The scores
rewritten as dot products, for the kernels, are in :mod:`fastattn._prepare`.)"""

from __future__ import annotations

import numpy as np


def silverman_bandwidth(x_keys: np.ndarray) -> np.ndarray:
    """Silverman's rule of thumb per batch entry of ``x_keys`` (..., Lk, D), in float64.

    D == 1: ``0.9 * min(std, IQR / 1.34) * n**(-1/5)`` (std when the IQR is 0);
    D > 1: ``(4 / (D + 2))**(1 / (D + 4)) * n**(-1 / (D + 4)) * mean(std per feature)``,
    with the sample standard deviation (ddof=1) and n = Lk.
    """
    x = np.asarray(x_keys, dtype=np.float64)
    n, d = x.shape[-2], x.shape[-1]
    if n < 2:
        raise ValueError(f"bandwidth='silverman' needs at least 2 keys, got {n}")
    with np.errstate(over="ignore", invalid="ignore"):
        std = x.std(axis=-2, ddof=1)  # (..., D)
        if d == 1:
            q75, q25 = np.percentile(x[..., 0], [75, 25], axis=-1)
            iqr = (q75 - q25) / 1.34
            s = std[..., 0]
            spread = np.where(iqr > 0, np.minimum(s, iqr), s)
            h = 0.9 * spread * n ** (-0.2)
        else:
            h = (4.0 / (d + 2)) ** (1.0 / (d + 4)) * n ** (-1.0 / (d + 4)) * std.mean(axis=-1)
    if not (np.isfinite(h) & (h > 0)).all():
        raise ValueError(
            "bandwidth='silverman' needs x_keys with finite values and a positive spread "
            "(all keys of a batch entry coincide, or one is inf/NaN)"
        )
    return h


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(B, L, H * D)`` -> ``(B, H, L, D)`` as a strided view (last axis stays unit-stride)."""
    b, length, features = x.shape
    return x.reshape(b, length, num_heads, features // num_heads).swapaxes(1, 2)


def average_heads(weights: np.ndarray) -> np.ndarray:
    """Mean over the head axis (-3), accumulated in at least float32."""
    acc = np.promote_types(weights.dtype, np.float32)
    return weights.mean(axis=-3, dtype=acc).astype(weights.dtype, copy=False)

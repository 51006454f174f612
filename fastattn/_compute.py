"""Computations around the kernels, shared by the fast functions and the NumPy twins:
scores rewritten as dot products (cosine rows, the gaussian key bias, infinitely far
rows), Silverman's bandwidth, the core's projection, and the head split of the layer."""

from __future__ import annotations

import math

import numpy as np

from fastattn import _core
from fastattn._prepare import contiguous


def unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows of ``a`` (last axis) scaled to unit length, in float64; zero rows stay zero.
    Scaled by the row's largest entry first, so huge or tiny rows neither overflow nor
    underflow."""
    x = np.asarray(a, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        big = (
            np.abs(x).max(axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,))
        )
        y = np.where(big > 0, x / np.where(big > 0, big, 1.0), x)
        norm = np.sqrt((y * y).sum(axis=-1, keepdims=True))
        return np.where(norm > 0, y / np.where(norm > 0, norm, 1.0), y)


def gaussian_key_bias(k: np.ndarray, bandwidth: float) -> np.ndarray:
    """-||k_j||^2 / (2 h^2) per key, in float64: shape (..., Hkv, Lk)."""
    x = np.asarray(k, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return -(x * x).sum(axis=-1) / (2.0 * bandwidth * bandwidth)


def infinitely_far(x: np.ndarray) -> np.ndarray:
    """Rows (last axis) holding an infinity and no NaN."""
    return np.isinf(x).any(axis=-1) & ~np.isnan(x).any(axis=-1)


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


def project(x: np.ndarray, w: np.ndarray, dtype: np.dtype, threads: int) -> np.ndarray:
    """``x @ w`` over the last axis, computed by the core (bit-identical for any thread
    count, unlike a threaded BLAS)."""
    rows = contiguous(x, dtype).reshape(math.prod(x.shape[:-1]), x.shape[-1])
    wc = contiguous(w, dtype)
    out = np.empty((rows.shape[0], wc.shape[1]), dtype)
    _core.project(x=rows, w=wc, out=out, num_threads=threads)
    return out.reshape(x.shape[:-1] + (wc.shape[1],))


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(B, L, H * D)`` -> ``(B, H, L, D)`` as a strided view (last axis stays unit-stride)."""
    b, length, features = x.shape
    return x.reshape(b, length, num_heads, features // num_heads).swapaxes(1, 2)


def average_heads(weights: np.ndarray) -> np.ndarray:
    """Mean over the head axis (-3), accumulated in at least float32."""
    acc = np.promote_types(weights.dtype, np.float32)
    return weights.mean(axis=-3, dtype=acc).astype(weights.dtype, copy=False)

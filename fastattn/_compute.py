"""Computations shared by the fast functions and the NumPy twins beside the kernels:
Silverman's bandwidth (and its derivative), and the head average of the layer's weights.
(The scores
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


def silverman_bandwidth_grad(x_keys: np.ndarray, grad_h: np.ndarray) -> np.ndarray:
    """The gradient with respect to ``x_keys`` (..., Lk, D) of ``sum(grad_h * h)``, ``h``
    the :func:`silverman_bandwidth` of ``x_keys`` and ``grad_h`` of its batch shape; float64.

    The rule is piecewise smooth: the branch of ``min(std, IQR / 1.34)`` that is taken is
    differentiated (std on a tie), and each quartile (NumPy's linear interpolation between
    two order statistics) passes its derivative to the two keys it interpolates (on tied
    keys, to the ones ``argsort`` puts at those places)."""
    x = np.asarray(x_keys, dtype=np.float64)
    n, d = x.shape[-2], x.shape[-1]
    centred = x - x.mean(axis=-2, keepdims=True)
    std = x.std(axis=-2, ddof=1)  # (..., D), > 0: silverman_bandwidth checked it
    dstd = centred / ((n - 1) * std[..., None, :])  # d std_f / d x_jf
    if d > 1:
        c = (4.0 / (d + 2)) ** (1.0 / (d + 4)) * n ** (-1.0 / (d + 4))
        return grad_h[..., None, None] * (c / d) * dstd
    c = 0.9 * n ** (-0.2)
    x1 = x[..., 0]
    q75, q25 = np.percentile(x1, [75, 25], axis=-1)
    iqr = (q75 - q25) / 1.34
    s = std[..., 0]
    use_iqr = (iqr > 0) & (iqr < s)
    grad = np.where(use_iqr[..., None, None], 0.0, grad_h[..., None, None] * c * dstd)
    order = np.argsort(x1, axis=-1, kind="stable")
    dq = np.zeros(x1.shape)
    for q, sign in ((75.0, 1.0), (25.0, -1.0)):  # d IQR / d x_j
        pos = (n - 1) * q / 100.0
        lo = int(np.floor(pos))
        frac = pos - lo
        for place, coeff in ((lo, 1.0 - frac), (min(lo + 1, n - 1), frac)):
            at = order[..., place : place + 1]
            np.put_along_axis(dq, at, np.take_along_axis(dq, at, -1) + sign * coeff, axis=-1)
    return grad + np.where(use_iqr, grad_h * c / 1.34, 0.0)[..., None, None] * dq[..., None]


def average_heads(weights: np.ndarray) -> np.ndarray:
    """Mean over the head axis (-3), accumulated in at least float32."""
    acc = np.promote_types(weights.dtype, np.float32)
    return weights.mean(axis=-3, dtype=acc).astype(weights.dtype, copy=False)

"""The baselines: attention as a NumPy user writes it, and the flop counts of each case."""

from __future__ import annotations

import numpy as np


def numpy_sdpa(q, k, v, is_causal=False, additive_mask=None):
    """Attention as a NumPy user writes it: the whole score matrix, in the inputs' dtype,
    plus ``additive_mask`` (0 / -inf, broadcasting) when given.

    Grouped-query inputs (fewer key/value heads on axis -3) are expanded with ``np.repeat``
    first, as a user without a GQA kernel would.
    """
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 and k.ndim >= 3 else 1
    if group > 1:
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    s = q @ np.swapaxes(k, -1, -2)
    s *= s.dtype.type(1.0 / np.sqrt(q.shape[-1]))
    if is_causal:
        s[..., ~np.tri(*s.shape[-2:], dtype=bool)] = -np.inf
    if additive_mask is not None:
        s += additive_mask
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s @ v


def numpy_sdpa_grads(q, k, v, grad_out, is_causal=False):
    """Attention's forward and backward as a NumPy user writes them (the whole score
    matrix, in the inputs' dtype): the gradients ``(dq, dk, dv)`` of ``sum(grad_out * o)``.
    Grouped-query inputs are expanded with ``np.repeat`` and their gradients summed back."""
    group = q.shape[-3] // k.shape[-3] if q.ndim >= 3 and k.ndim >= 3 else 1
    kk, vv = (np.repeat(a, group, axis=-3) for a in (k, v)) if group > 1 else (k, v)
    scale = q.dtype.type(1.0 / np.sqrt(q.shape[-1]))
    s = q @ np.swapaxes(kk, -1, -2)
    s *= scale
    if is_causal:
        s[..., ~np.tri(*s.shape[-2:], dtype=bool)] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)
    dv = np.swapaxes(p, -1, -2) @ grad_out
    dp = grad_out @ np.swapaxes(vv, -1, -2)
    dp -= np.sum(dp * p, axis=-1, keepdims=True)  # dS = P * (dP - rowsum(P * dP))
    ds = np.multiply(p, dp, out=dp)
    ds *= scale
    dq = ds @ kk
    dk = np.swapaxes(ds, -1, -2) @ q
    if group > 1:
        dk, dv = (a.reshape(*a.shape[:-3], -1, group, *a.shape[-2:]).sum(-3) for a in (dk, dv))
    return dq, dk, dv


def numpy_softmax(x):
    """Softmax over the last axis as a NumPy user writes it."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def numpy_masked_softmax(x, valid_lens):
    """d2l's masked_softmax: entries past the valid length set to -1e6, then softmax."""
    keep = np.arange(x.shape[-1]) < valid_lens[:, None, None]
    return numpy_softmax(np.where(keep, x, x.dtype.type(-1e6)))


def numpy_additive(q, k, v, w_q, w_k, w_v):
    """d2l's AdditiveAttention: the (B, Lq, Lk, H) broadcast, tanh, w_v, softmax, @ v."""
    features = np.tanh((q @ w_q)[:, :, None, :] + (k @ w_k)[:, None, :, :])
    return numpy_softmax(features @ w_v) @ v


def numpy_merge_states(outputs, lses):
    """Merging partial attention as a NumPy user writes it: the log-sum-exp over the parts,
    then the parts weighted by exp(lse_i - lse) and summed."""
    parts, part_lses = np.stack(outputs), np.stack(lses)
    lse = np.logaddexp.reduce(part_lses, axis=0)
    weights = np.exp(part_lses - lse)
    return (weights[..., None] * parts).sum(axis=0), lse


def causal_fraction(lq: int, lk: int) -> float:
    """The fraction of the Lq x Lk scores a top-left causal mask keeps."""
    i = np.arange(lq)
    return float(np.minimum(i + 1, lk).sum()) / (lq * lk)


def attention_flops(q_shape, k_shape, v_shape, is_causal=False) -> float:
    """2 * B * Hq * Lq * Lk * (E + Ev) (QK^T and PV), times the kept fraction under causal."""
    *batch, hq, lq, e = q_shape
    lk = k_shape[-2]
    flops = 2.0 * np.prod(batch, dtype=float) * hq * lq * lk * (e + v_shape[-1])
    return flops * causal_fraction(lq, lk) if is_causal else flops

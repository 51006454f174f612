"""The workloads of varlen_attention's benchmark (``fastattn-bench`` and ``bench/``): skewed
batches of packed sequences, and the two ways to compute them without it -- a Python loop of
per-sequence calls, and padding to the longest sequence with ``valid_lens``."""

from __future__ import annotations

import numpy as np

import fastattn


def lognormal_lengths(count: int, median: int, sigma: float, longest: int, seed: int = 0):
    """``count`` sequence lengths from a long-tailed (lognormal) distribution, in [1, longest]."""
    rng = np.random.default_rng(seed)
    lens = np.exp(rng.normal(np.log(median), sigma, count)).round().astype(np.int64)
    return tuple(int(x) for x in np.clip(lens, 1, longest))


def one_long_many_short(long: int, short: int, count: int):
    """One sequence of ``long`` tokens beside ``count`` of ``short``."""
    return (long,) + (short,) * count


def packed_inputs(lens, hq: int, hkv: int, e: int, dtype, seed: int = 0):
    """(q, k, v, cu_seqlens) for self-attention over sequences of ``lens``, token-major."""
    rng = np.random.default_rng(seed)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    total = int(cu[-1])
    q = rng.standard_normal((total, hq, e)).astype(dtype)
    k = rng.standard_normal((total, hkv, e)).astype(dtype)
    v = rng.standard_normal((total, hkv, e)).astype(dtype)
    return q, k, v, cu


def per_sequence_loop(q, k, v, cu, is_causal=False):
    """varlen attention as a Python loop of scaled_dot_product_attention calls (each on
    (H, L, E) views: no copies), written into one packed output."""
    out = np.empty(q.shape[:2] + v.shape[2:], q.dtype)
    for a, b in zip(cu[:-1], cu[1:]):
        if a == b:
            continue
        o = fastattn.scaled_dot_product_attention(
            q[a:b].transpose(1, 0, 2),
            k[a:b].transpose(1, 0, 2),
            v[a:b].transpose(1, 0, 2),
            is_causal=is_causal,
        )
        out[a:b] = o.transpose(1, 0, 2)
    return out


def padded_bytes(lens, hq: int, hkv: int, e: int, itemsize: int) -> int:
    """Memory the padded batch takes: q, k, v and the output at the longest length."""
    return len(lens) * max(lens, default=0) * (2 * hq + 2 * hkv) * e * itemsize


def padded(q, k, v, cu, is_causal=False):
    """varlen attention by padding: every sequence copied into (N, H, Lmax, E) buffers, one
    batched call with ``valid_lens`` (top-left causal is unchanged by padding at the end),
    the valid rows copied back out."""
    lens = np.diff(cu)
    n, longest = len(lens), int(lens.max(initial=0))
    shape = lambda a: (n, a.shape[1], longest, a.shape[2])  # noqa: E731
    qp, kp, vp = (np.zeros(shape(a), a.dtype) for a in (q, k, v))
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        for src, dst in ((q, qp), (k, kp), (v, vp)):
            dst[i, :, : b - a] = src[a:b].transpose(1, 0, 2)
    op = fastattn.scaled_dot_product_attention(qp, kp, vp, valid_lens=lens, is_causal=is_causal)
    out = np.empty(q.shape[:2] + v.shape[2:], q.dtype)
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        out[a:b] = op[i, :, : b - a].transpose(1, 0, 2)
    return out

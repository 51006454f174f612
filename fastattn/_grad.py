"""fastattn.scaled_dot_product_attention_backward and varlen_attention_backward: the
gradients of the attention forwards, checked by :mod:`fastattn._grad_args` (the forward's
own checks plus the gradient's arrays) and computed by the blocked backward kernel
(csrc/kernels/sdpa_backward-inl.h) with the GIL released."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from fastattn import _core, _dispatch, _threads
from fastattn._cpu import varlen_per_head
from fastattn._grad_args import input_grad, sdpa_backward_args, sinks_grad, varlen_backward_args
from fastattn._prepare import (
    batched_qkv,
    head_values,
    kernel_ready,
    sdpa_storage_dtype,
    shared_options,
    storage_dtype,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray


def _numpy_only(fn: str, *arrays: object) -> None:
    kind = _dispatch.backend(*arrays)
    if kind is not None:
        raise NotImplementedError(
            f"{fn} runs on NumPy arrays only, got {'CuPy' if kind == 'cupy' else 'Dask'} arrays"
        )


def _sinks_grad(sink_view, lse: np.ndarray, delta: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """d loss / d sinks: the sink is one more key of value 0, so dS_sink = -P_sink * D per
    row (D = rowsum(grad_out * out), which is 0 on a row that sees no key), summed over the
    rows of each head and reduced to the shape ``sinks`` was passed in."""
    s = sink_view.astype(np.float64)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p_sink = np.exp(np.where(s == -np.inf, -np.inf, s - lse))
    return sinks_grad(-(p_sink * delta).sum(axis=-1), sinks)


def scaled_dot_product_attention_backward(
    grad_out: ArrayLike,
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    out: ArrayLike,
    lse: ArrayLike,
    attn_mask: ArrayLike | None = None,
    *,
    valid_lens: ArrayLike | None = None,
    is_causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: ArrayLike | None = None,
    alibi_slopes: ArrayLike | None = None,
    num_threads: int | None = None,
) -> tuple[NDArray[np.floating], ...]:
    """Gradients of :func:`fastattn.scaled_dot_product_attention`, computed in blocks.

    Given ``out, lse = scaled_dot_product_attention(query, key, value, ..., return_lse=True)``
    and ``grad_out``, the gradient of a loss with respect to ``out``, returns the gradients
    of that loss with respect to ``query``, ``key`` and ``value`` (and ``sinks`` when given).
    No ``Lq x Lk`` matrix is formed: each block of weights is recomputed from ``lse``
    (FlashAttention-2's backward), so the extra memory grows with ``Lq + Lk``, not their
    product.

    Parameters
    ----------
    grad_out : array_like, shape of ``out``
        The gradient with respect to the forward's output.
    query, key, value, attn_mask, valid_lens, is_causal, causal_alignment, window, scale, \
softcap, sinks, alibi_slopes
        Exactly as given to the forward (see :func:`fastattn.scaled_dot_product_attention`).
        A ``BlockMask`` skips the tiles it hides, as in the forward. Masks, ``valid_lens``,
        windows and ALiBi slopes are constants: they get no gradient. int8 key/value (a
        quantised cache) have none either: a ``TypeError``.
    out, lse : array_like
        The forward's output and log-sum-exp (``return_lse=True``), read, not changed.
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).

    Returns
    -------
    (grad_query, grad_key, grad_value) or (grad_query, grad_key, grad_value, grad_sinks)
        Each in the shape and dtype of its input as passed: summed over the leading dims the
        input was broadcast along, and for key/value over the query heads of each GQA/MQA
        group. float16/bfloat16 inputs are computed in float32 and returned in their dtype.
        A row that may attend no key contributes nothing. The result is bit-identical for
        any thread count; the GIL is released while computing. NumPy arrays only.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((2, 16, 8)) for _ in range(3))
    >>> out, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    >>> dq, dk, dv = fastattn.scaled_dot_product_attention_backward(
    ...     np.ones_like(out), q, k, v, out, lse, is_causal=True)
    >>> ref = fastattn.reference.scaled_dot_product_attention_backward(
    ...     np.ones_like(out), q, k, v, out, lse, is_causal=True)
    >>> all(np.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip((dq, dk, dv), ref))
    True
    >>> round(float(dv.sum()), 9)  # each row's weights sum to 1: 2 heads x 16 rows x 8 features
    256.0
    """
    _numpy_only(
        "scaled_dot_product_attention_backward",
        grad_out,
        query,
        key,
        value,
        out,
        lse,
        attn_mask,
        valid_lens,
        sinks,
        alibi_slopes,
    )
    args, grad, fwd_out, fwd_lse = sdpa_backward_args(
        grad_out,
        out,
        lse,
        query,
        key,
        value,
        attn_mask,
        valid_lens,
        is_causal,
        causal_alignment,
        window,
        scale,
        softcap,
        sinks,
        alibi_slopes,
    )
    threads = _threads.resolve(num_threads)
    compute, storage = args.compute_dtype, sdpa_storage_dtype(args)
    full_out = args.full_out_shape
    q, k, v = batched_qkv(args, storage)
    batch = args.batch
    hq, lq, e = q.shape[-3:]
    hkv, lk, ev = v.shape[-3:]
    if e == 0 or ev == 0 or 0 in full_out or lk == 0:
        d_q = np.zeros(batch + (hq, lq, e), compute)
        d_k = np.zeros(batch + (hkv, lk, e), compute)
        d_v = np.zeros(batch + (hkv, lk, ev), compute)
        delta = np.zeros(full_out[:-1], compute)
        if e == 0 and ev and lk and 0 not in full_out:  # no features: uniform weights
            from fastattn import reference

            return reference.scaled_dot_product_attention_backward(
                grad_out,
                query,
                key,
                value,
                out,
                lse,
                attn_mask,
                valid_lens=valid_lens,
                is_causal=is_causal,
                causal_alignment=causal_alignment,
                window=window,
                scale=scale,
                softcap=softcap,
                sinks=sinks,
                alibi_slopes=alibi_slopes,
            )
    else:
        g = kernel_ready(grad.reshape(full_out), storage)
        o = kernel_ready(fwd_out.reshape(full_out), storage)
        lse_c = np.ascontiguousarray(fwd_lse.reshape(full_out[:-1]), dtype=compute)
        d_q = np.empty(batch + (hq, lq, e), compute)
        d_k = np.empty(batch + (hkv, lk, e), compute)
        d_v = np.empty(batch + (hkv, lk, ev), compute)
        delta = np.empty(full_out[:-1], compute)
        _, alibi_view = head_values(args)
        _core.sdpa_backward(
            query=q,
            key=k,
            value=v,
            out=o,
            lse=lse_c,
            alibi_slopes=alibi_view,
            scale=args.scale,
            softcap=args.softcap or 0.0,
            **shared_options(args, threads),
            grad_out=g,
            grad_query=d_q,
            grad_key=d_k,
            grad_value=d_v,
            delta=delta,
        )
    grads = [
        input_grad(d, np.shape(a), src.dtype)
        for d, a, src in ((d_q, query, args.query), (d_k, key, args.key), (d_v, value, args.value))
    ]
    if args.sinks is not None:
        sink_view, _ = head_values(args)
        lse64 = fwd_lse.reshape(full_out[:-1]).astype(np.float64)
        grads.append(_sinks_grad(sink_view, lse64, delta.astype(np.float64), args.sinks))
    return tuple(grads)


def varlen_attention_backward(
    grad_out: ArrayLike,
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    out: ArrayLike,
    lse: ArrayLike,
    cu_seqlens_q: ArrayLike,
    cu_seqlens_k: ArrayLike,
    *,
    is_causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: ArrayLike | None = None,
    alibi_slopes: ArrayLike | None = None,
    num_threads: int | None = None,
) -> tuple[NDArray[np.floating], ...]:
    """Gradients of :func:`fastattn.varlen_attention`: what
    :func:`scaled_dot_product_attention_backward` gives on each sequence alone, in the
    packed layout.

    Parameters
    ----------
    grad_out : array_like, shape ``(total_q, Hq, Ev)``
        The gradient with respect to the forward's output.
    query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, causal_alignment, window, \
scale, softcap, sinks, alibi_slopes
        Exactly as given to the forward (see :func:`fastattn.varlen_attention`).
    out, lse : array_like
        The forward's output ``(total_q, Hq, Ev)`` and log-sum-exp ``(total_q, Hq)``
        (``return_lse=True``), read, not changed.
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).

    Returns
    -------
    (grad_query, grad_key, grad_value) or (grad_query, grad_key, grad_value, grad_sinks)
        Each in the shape and dtype of its input (key/value summed over each GQA group, the
        sinks' over every sequence); float16/bfloat16 computed in float32. Bit-identical for
        any thread count; the GIL is released while computing. NumPy arrays only.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((10, 2, 8)) for _ in range(3))  # 10 tokens, 2 heads
    >>> cu = np.array([0, 3, 10])  # two sequences: 3 and 7 tokens
    >>> out, lse = fastattn.varlen_attention(q, k, v, cu, cu, is_causal=True, return_lse=True)
    >>> dq, dk, dv = fastattn.varlen_attention_backward(
    ...     np.ones_like(out), q, k, v, out, lse, cu, cu, is_causal=True)
    >>> dq3, dk3, dv3 = fastattn.scaled_dot_product_attention_backward(  # the first alone
    ...     np.ones((2, 3, 8)), q[:3].swapaxes(0, 1), k[:3].swapaxes(0, 1), v[:3].swapaxes(0, 1),
    ...     out[:3].swapaxes(0, 1), lse[:3].T, is_causal=True)
    >>> bool(np.allclose(dv[:3], dv3.swapaxes(0, 1), rtol=1e-12))
    True
    """
    _numpy_only(
        "varlen_attention_backward", grad_out, query, key, value, out, lse, sinks, alibi_slopes
    )
    args, grad, fwd_out, fwd_lse = varlen_backward_args(
        grad_out,
        out,
        lse,
        query,
        key,
        value,
        cu_seqlens_q,
        cu_seqlens_k,
        is_causal,
        causal_alignment,
        window,
        scale,
        softcap,
        sinks,
        alibi_slopes,
    )
    threads = _threads.resolve(num_threads)
    compute = args.compute_dtype
    storage = storage_dtype(args.result_dtype, compute)
    (tq, hq, e), (tk, hkv, _), ev = args.query.shape, args.key.shape, args.value.shape[-1]
    d_q = np.zeros((hq, tq, e), compute)
    d_k = np.zeros((hkv, tk, e), compute)
    d_v = np.zeros((hkv, tk, ev), compute)
    delta = np.zeros((hq, tq), compute)
    if e and ev and tq and tk and hq:
        left, right = args.window
        _core.sdpa_varlen_backward(
            query=kernel_ready(args.query, storage).transpose(1, 0, 2),
            key=kernel_ready(args.key, storage).transpose(1, 0, 2),
            value=kernel_ready(args.value, storage).transpose(1, 0, 2),
            out=kernel_ready(fwd_out, storage).transpose(1, 0, 2),
            lse=np.ascontiguousarray(fwd_lse.T, dtype=compute),
            alibi_slopes=varlen_per_head(args.alibi_slopes, compute, hq),
            scale=args.scale,
            softcap=args.softcap or 0.0,
            causal=args.is_causal,
            window_left=left,
            window_right=right,
            num_threads=threads,
            grad_out=kernel_ready(grad, storage).transpose(1, 0, 2),
            grad_query=d_q,
            grad_key=d_k,
            grad_value=d_v,
            delta=delta,
            cu_seqlens_q=np.ascontiguousarray(args.cu_seqlens_q),
            cu_seqlens_k=np.ascontiguousarray(args.cu_seqlens_k),
            bottom_right=args.bottom_right,
        )
    elif e == 0 and ev and tq and tk and hq:  # no features: uniform weights, the twin's way
        from fastattn import reference

        return reference.varlen_attention_backward(
            grad_out,
            query,
            key,
            value,
            out,
            lse,
            cu_seqlens_q,
            cu_seqlens_k,
            is_causal=is_causal,
            causal_alignment=causal_alignment,
            window=window,
            scale=scale,
            softcap=softcap,
            sinks=sinks,
            alibi_slopes=alibi_slopes,
        )
    grads = [
        np.swapaxes(d, 0, 1).astype(a.dtype)
        for d, a in ((d_q, args.query), (d_k, args.key), (d_v, args.value))
    ]
    if args.sinks is not None:
        sink_view = np.broadcast_to(args.sinks.astype(compute), (hq,))
        grads.append(
            _sinks_grad(
                sink_view, fwd_lse.T.astype(np.float64), delta.astype(np.float64), args.sinks
            )
        )
    return tuple(grads)

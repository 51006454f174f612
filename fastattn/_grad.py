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


def _numpy_only(fn: str, arguments: dict) -> None:
    """A ``NotImplementedError`` if any of a call's ``arguments`` is a Dask or CuPy array."""
    kind = _dispatch.backend(*arguments.values())
    if kind is not None:
        raise NotImplementedError(
            f"{fn} runs on NumPy arrays only, got {'CuPy' if kind == 'cupy' else 'Dask'} arrays"
        )


def _gradients(kernel, args, arrays, sink_view, **options) -> tuple:
    """(dq, dk, dv, d sinks per head or None) of one backward call in the compute dtype:
    ``kernel`` (``_core.sdpa_backward`` or ``sdpa_varlen_backward``) run on ``arrays`` =
    (q, k, v, out, grad_out) as it reads them, ``(..., H, L, features)`` views, and the
    forward's ``lse`` ``(..., Hq, Lq)``, with its own ``options``; dq per query head, dk/dv
    per key/value head. ``sink_view``: the sinks per head as ``lse`` is laid out (None:
    no sinks). With no query row, key or value feature there is nothing to compute:
    zeros (E >= 1 is the forward's rule, checked before)."""
    compute = args.compute_dtype
    *qkv, out, grad_out, lse = arrays
    lse = np.ascontiguousarray(lse, dtype=compute)
    # The kernel writes every element of the three gradients (zeros where no key or query
    # reaches them): np.empty, not np.zeros, whose calloc memsets a reused heap block (a
    # tenth of a 32x8 128^2 E64 backward's time, causal or not).
    run = qkv[0].size > 0 and qkv[2].size > 0
    grad_q, grad_k, grad_v = ((np.empty if run else np.zeros)(a.shape, compute) for a in qkv)
    delta = np.zeros(lse.shape, compute)  # D = rowsum(grad_out * out), 0 where not computed
    if run:
        kernel(
            query=qkv[0],
            key=qkv[1],
            value=qkv[2],
            out=out,
            lse=lse,
            scale=args.scale,
            softcap=args.softcap or 0.0,
            grad_out=grad_out,
            grad_query=grad_q,
            grad_key=grad_k,
            grad_value=grad_v,
            delta=delta,
            **options,
        )
    if sink_view is None:
        return grad_q, grad_k, grad_v, None
    # The sink is one more key of value 0, so dS_sink = -P_sink * D per row (D is 0 on a
    # row that sees no key), summed over the rows of each head.
    s = sink_view.astype(np.float64)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p_sink = np.exp(np.where(s == -np.inf, -np.inf, s - lse.astype(np.float64)))
    return grad_q, grad_k, grad_v, -(p_sink * delta.astype(np.float64)).sum(axis=-1)


def _result(grads: list, grad_sinks, sinks) -> tuple:
    """The public result: ``grads`` (query, key, value), then the gradient of ``sinks`` in
    the shape and dtype they were passed in, when given."""
    return tuple(grads) if sinks is None else (*grads, sinks_grad(grad_sinks, sinks))


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
    call = _dispatch.forwarded(scaled_dot_product_attention_backward, locals())
    _numpy_only("scaled_dot_product_attention_backward", call)
    args, grad, fwd_out, fwd_lse = sdpa_backward_args(call)
    full_out = args.full_out_shape
    sink_view, alibi_view = head_values(args)
    storage = sdpa_storage_dtype(args)
    *per_head, grad_sinks = _gradients(
        _core.sdpa_backward,
        args,
        (
            *batched_qkv(args, storage),
            kernel_ready(fwd_out.reshape(full_out), storage),
            kernel_ready(grad.reshape(full_out), storage),
            fwd_lse.reshape(full_out[:-1]),
        ),
        sink_view,
        alibi_slopes=alibi_view,
        mask_summary=args.mask_summary,  # a BlockMask's own, as in the forward
        **shared_options(args, _threads.resolve(num_threads)),
    )
    grads = [
        input_grad(d, np.shape(a), src.dtype)
        for d, a, src in zip(per_head, (query, key, value), (args.query, args.key, args.value))
    ]
    return _result(grads, grad_sinks, args.sinks)


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
    call = _dispatch.forwarded(varlen_attention_backward, locals())
    _numpy_only("varlen_attention_backward", call)
    args, grad, fwd_out, fwd_lse = varlen_backward_args(call)
    storage = storage_dtype(args.result_dtype, args.compute_dtype)
    # The packed call as one SDPA without a batch: (heads, tokens, features) views.
    qkv_out_grad = [
        kernel_ready(a, storage).transpose(1, 0, 2)
        for a in (args.query, args.key, args.value, fwd_out, grad)
    ]
    left, right = args.window
    hq = args.out_shape[1]
    *per_head, grad_sinks = _gradients(
        _core.sdpa_varlen_backward,
        args,
        (*qkv_out_grad, fwd_lse.T),
        varlen_per_head(args.sinks, args.compute_dtype, hq),
        alibi_slopes=varlen_per_head(args.alibi_slopes, args.compute_dtype, hq),
        num_threads=_threads.resolve(num_threads),
        causal=args.is_causal,
        window_left=left,
        window_right=right,
        cu_seqlens_q=np.ascontiguousarray(args.cu_seqlens_q),
        cu_seqlens_k=np.ascontiguousarray(args.cu_seqlens_k),
        bottom_right=args.bottom_right,
    )
    grads = [
        np.swapaxes(d, 0, 1).astype(a.dtype)
        for d, a in zip(per_head, (args.query, args.key, args.value))
    ]
    return _result(grads, grad_sinks, args.sinks)

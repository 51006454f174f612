"""Plain-NumPy twins of fastattn's functions: the oracle for the tests.

Same signatures as the fast functions, computed in float64 with whole score matrices,
written for clarity rather than speed. They define the semantics written down in
``docs/semantics.md``: the fast path must match them. Arguments are checked by the same
validation layer (:mod:`fastattn._validation`), so bad input raises the same errors here,
and masks reach the twins through the same preparation (:mod:`fastattn._prepare`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from fastattn import _threads
from fastattn._checks import check_flag
from fastattn._compute import average_heads
from fastattn._dispatch import forwarded
from fastattn._dtypes import is_bfloat16
from fastattn._grad_args import (
    grad_like,
    grad_out_array,
    input_grad,
    regression_grads,
    sdpa_backward_args,
    sinks_grad,
    softmax_backward_args,
    unread_zeroed,
    varlen_backward_args,
)
from fastattn._layer_checks import projection_weights
from fastattn._prepare import (
    attention_masks,
    head_values,
    softmax_masks,
    to_batch,
    unit_rows,
    weights_dtype,
)
from fastattn._projection import split_heads
from fastattn._validation import (
    additive_args,
    attention_spec,
    check_out,
    check_unbatched_mask,
    head_valid_lens,
    layer_inputs,
    masked_softmax_args,
    merge_states_args,
    quantize_args,
    regression_args,
    result_dtypes,
    sdpa_args,
    set_family_sinks,
    varlen_args,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import ArrayLike, NDArray

__all__ = [
    "additive_attention",
    "additive_attention_backward",
    "attention",
    "masked_softmax",
    "masked_softmax_backward",
    "merge_attention_states",
    "multi_head_attention",
    "nadaraya_watson",
    "nadaraya_watson_backward",
    "quantize_kv",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "varlen_attention",
    "varlen_attention_backward",
]


def _visible_keys(
    num_q: int, num_k: int, diag_offset: int, is_causal: bool, window: tuple[int, int]
) -> np.ndarray:
    """(Lq, Lk) bool: key j visible to row i under causal/window (alignment applied)."""
    i = np.arange(num_q)[:, None] + diag_offset
    j = np.arange(num_k)[None, :]
    visible = np.ones((num_q, num_k), dtype=bool)
    if is_causal:
        visible &= j <= i
    left, right = window
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    return visible


def _softmax_rows(scores: np.ndarray, allowed: np.ndarray):
    """Masked softmax over the last axis in float64: (weights, lse); empty rows -> 0, -inf."""
    s = np.where(allowed, scores, -np.inf)
    row_max = (
        s.max(axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf)
    )
    empty = row_max == -np.inf
    # a +inf score: inf - inf = NaN, the row is NaN; -max - max may overflow to -inf (e^-inf = 0)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = s - np.where(empty, 0.0, row_max)
    p = np.exp(shifted)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        weights = np.where(empty, 0.0, p / total)
        lse = np.where(empty, -np.inf, row_max + np.log(total))[..., 0]
    return weights, lse


def _softmax_rows_sink(scores: np.ndarray, allowed: np.ndarray, sinks: np.ndarray):
    """The masked softmax with a sink logit per row (``sinks`` broadcast to the rows' shape)
    as one more key of value 0: (weights over the keys, lse over keys and sink). A row with
    no visible key gets weights 0 and lse = sink (-inf: no sink)."""
    s = np.where(allowed, scores, -np.inf)
    sink = np.broadcast_to(sinks, s.shape[:-1])[..., None].astype(np.float64)
    key_max = (
        s.max(axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf)
    )
    row_max = np.fmax(key_max, sink)  # fmax: a NaN score or sink still gives NaN below
    nothing = row_max == -np.inf
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        shift = np.where(nothing, 0.0, row_max)
        nan = np.isnan(key_max) | np.isnan(sink)
        p = np.exp(s - shift)
        total = p.sum(axis=-1, keepdims=True) + np.exp(sink - shift)
        weights = np.where(nothing, 0.0, p / total)
        lse = np.where(nothing, -np.inf, shift + np.log(total))
        weights = np.where(nan, np.nan, weights)
        lse = np.where(nan, np.nan, lse)
    return weights, lse[..., 0]


def _alibi_bias(slopes: np.ndarray, num_q: int, num_k: int, diag_offset: int) -> np.ndarray:
    """-slope * |j - (i + diag_offset)| for (..., Hq) slopes: shape (..., Hq, Lq, Lk)."""
    i = np.arange(num_q)[:, None] + diag_offset
    j = np.arange(num_k)[None, :]
    return -slopes.astype(np.float64)[..., None, None] * np.abs(j - i)


def _sdpa_scores(args, q: np.ndarray, k: np.ndarray):
    """(q k^T * scale, the scores the softmax reads: softcapped, plus the float mask and
    the ALiBi bias), float64, full shape."""
    _, float_mask, _ = attention_masks(args)
    with np.errstate(invalid="ignore", over="ignore"):
        raw = (q @ np.swapaxes(k, -1, -2)) * args.scale
        scores = raw
        if args.softcap is not None:
            scores = args.softcap * np.tanh(raw / args.softcap)
        if float_mask is not None:
            scores = scores + float_mask.astype(np.float64)
        _, slopes = head_values(args)
        if slopes is not None:
            scores = scores + _alibi_bias(slopes, q.shape[-2], k.shape[-2], args.diag_offset)
    return raw, scores


def scaled_dot_product_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
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
    return_lse: bool = False,
    return_weights: bool = False,
    out: NDArray[np.floating] | None = None,
    num_threads: int | None = None,
    key_scale: ArrayLike | None = None,
    value_scale: ArrayLike | None = None,
) -> NDArray[np.floating] | tuple[NDArray[np.floating], ...]:
    """NumPy twin of :func:`fastattn.scaled_dot_product_attention` (float64 inside).

    Keys that a row may not attend contribute nothing, even if their values are NaN.
    int8 key/value are dequantised first (``key * key_scale[..., None]`` in float64).

    >>> import numpy as np
    >>> from fastattn import reference
    >>> q = k = v = np.eye(2)
    >>> reference.scaled_dot_product_attention(q, k, v, is_causal=True)[0]
    array([1., 0.])
    """
    args = sdpa_args(
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
        key_scale,
        value_scale,
    )
    want_lse = check_flag(return_lse, "return_lse")
    want_weights = check_flag(return_weights, "return_weights")
    _threads.resolve(num_threads)
    if args.int8_kv:
        args.key = args.key.astype(np.float64) * args.key_scale.astype(np.float64)[..., None]
        args.value = args.value.astype(np.float64) * args.value_scale.astype(np.float64)[..., None]
    if out is not None:
        check_out(
            out,
            args.out_shape,
            args.result_dtype,
            {
                "query": query,
                "key": key,
                "value": value,
                "attn_mask": attn_mask,
                "valid_lens": valid_lens,
            },
        )

    q, k, v = _full_qkv(args)
    _, scores = _sdpa_scores(args, q, k)
    sink_view, _ = head_values(args)
    allowed = _allowed(args, q.shape[-2], k.shape[-2])
    weights, lse = _sink_softmax(scores, allowed, sink_view)
    output = _weighted_values(weights, v)  # keys a row does not attend never reach it
    if sink_view is not None:  # a row with no visible key returns 0, whatever its sink
        output = np.where(allowed.any(axis=-1)[..., None], output, 0.0)

    output = output.reshape(args.out_shape).astype(args.result_dtype)
    if out is not None:
        np.copyto(out, output)
        output = out
    extras = []
    if want_lse:
        extras.append(lse.reshape(args.out_shape[:-1]).astype(args.compute_dtype))
    if want_weights:
        extras.append(weights.reshape(args.scores_shape).astype(weights_dtype(args)))
    return (output, *extras) if extras else output


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
    """NumPy twin of :func:`fastattn.scaled_dot_product_attention_backward` (float64
    inside, whole score matrices): the gradients of ``sum(grad_out * o)``, ``o`` the
    output of :func:`scaled_dot_product_attention` with the same arguments, with respect
    to query, key, value (and sinks when given), each in its input's shape and dtype.

    ``out`` and ``lse`` are checked (their shapes) but not read: the twin recomputes the
    weights from the inputs, so it gives the exact gradient whatever they hold.

    >>> import numpy as np
    >>> from fastattn import reference
    >>> q = k = v = np.eye(2)
    >>> o, lse = reference.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    >>> dq, dk, dv = reference.scaled_dot_product_attention_backward(
    ...     np.ones((2, 2)), q, k, v, o, lse, is_causal=True)
    >>> dv  # key 0 carries row 0's whole weight and part of row 1's
    array([[1.33023845, 1.33023845],
           [0.66976155, 0.66976155]])
    """
    args, grad, _, _ = sdpa_backward_args(
        forwarded(scaled_dot_product_attention_backward, locals())
    )
    _threads.resolve(num_threads)
    q, k, v = _full_qkv(args)
    raw, scores = _sdpa_scores(args, q, k)
    sink_view, _ = head_values(args)
    allowed = _allowed(args, q.shape[-2], k.shape[-2])
    weights, row_lse = _sink_softmax(scores, allowed, sink_view)
    d_out = grad.astype(np.float64).reshape(args.full_out_shape)
    with np.errstate(invalid="ignore", over="ignore"):
        # D_i = sum_j P_ij dP_ij = grad_out_i . o_i; dS = P * (dP - D), 0 off the mask
        row_dot = np.sum(d_out * _weighted_values(weights, v), axis=-1, keepdims=True)
        d_weights = d_out @ np.swapaxes(v, -1, -2)
        d_scores = np.where(allowed, weights * (d_weights - row_dot), 0.0)
        if args.softcap is not None:  # d/ds c tanh(s / c) = 1 - tanh(s / c)^2
            d_scores = d_scores * (1.0 - np.tanh(raw / args.softcap) ** 2)
        d_q = (d_scores @ k) * args.scale
        d_k = (np.swapaxes(d_scores, -1, -2) @ q) * args.scale
        d_v = np.swapaxes(weights, -1, -2) @ d_out
    grads = [
        input_grad(d, np.shape(a), src.dtype)
        for d, a, src in ((d_q, query, args.query), (d_k, key, args.key), (d_v, value, args.value))
    ]
    if sink_view is not None:  # the sink is one more key, of value 0: dS_sink = -P_sink D
        with np.errstate(invalid="ignore", over="ignore"):
            p_sink = np.exp(sink_view.astype(np.float64)[..., None] - row_lse)
        p_sink = np.where(allowed.any(axis=-1), p_sink, 0.0)  # such rows return 0
        grads.append(sinks_grad(-(p_sink * row_dot[..., 0]).sum(axis=-1), args.sinks))
    return tuple(grads)


def varlen_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
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
    return_lse: bool = False,
    out: NDArray[np.floating] | None = None,
    num_threads: int | None = None,
) -> NDArray[np.floating] | tuple[NDArray[np.floating], NDArray[np.floating]]:
    """NumPy twin of :func:`fastattn.varlen_attention`: the float64 twin of
    :func:`scaled_dot_product_attention` on each sequence, one at a time.

    >>> import numpy as np
    >>> from fastattn import reference
    >>> q = k = v = np.eye(2)[:, None, :]  # two tokens, one head
    >>> reference.varlen_attention(q, k, v, [0, 1, 2], [0, 1, 2])[:, 0]
    array([[1., 0.],
           [0., 1.]])
    """
    args = varlen_args(
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
    want_lse = check_flag(return_lse, "return_lse")
    _threads.resolve(num_threads)
    if out is not None:
        check_out(out, args.out_shape, args.result_dtype, args.named_inputs())
    q, k, v = (np.swapaxes(a.astype(np.float64), 0, 1) for a in (args.query, args.key, args.value))
    output = np.zeros(args.out_shape, np.float64)
    lse = np.full(args.out_shape[:-1], -np.inf)
    left, right = args.window
    window_arg = (
        None if window is None else (left if left >= 0 else None, right if right >= 0 else None)
    )
    cu_q, cu_k = args.cu_seqlens_q, args.cu_seqlens_k
    for n in range(cu_q.shape[0] - 1):
        rows, keys = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        if rows.stop == rows.start:
            continue
        o, l_ = scaled_dot_product_attention(
            q[:, rows],
            k[:, keys],
            v[:, keys],
            is_causal=args.is_causal,
            causal_alignment=causal_alignment,
            window=window_arg,
            scale=args.scale,
            softcap=args.softcap,
            sinks=args.sinks,
            alibi_slopes=args.alibi_slopes,
            return_lse=True,
        )
        output[rows] = np.swapaxes(o, 0, 1)
        lse[rows] = l_.T
    output = output.astype(args.result_dtype)
    if out is not None:
        np.copyto(out, output)
        output = out
    if want_lse:
        return output, lse.astype(args.compute_dtype)
    return output


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
    """NumPy twin of :func:`fastattn.varlen_attention_backward`: the float64 twin of
    :func:`scaled_dot_product_attention_backward` on each sequence, one at a time (the
    gradient of ``sinks`` summed over the sequences).

    >>> import numpy as np
    >>> from fastattn import reference
    >>> q = k = v = np.eye(2)[:, None, :]  # two tokens, one head
    >>> o, lse = reference.varlen_attention(q, k, v, [0, 2], [0, 2], return_lse=True)
    >>> dq, dk, dv = reference.varlen_attention_backward(
    ...     np.ones_like(o), q, k, v, o, lse, [0, 2], [0, 2])
    >>> dv[:, 0]  # each token's value reaches both rows
    array([[1., 1.],
           [1., 1.]])
    """
    args, grad, _, _ = varlen_backward_args(forwarded(varlen_attention_backward, locals()))
    _threads.resolve(num_threads)
    q, k, v, g = (
        np.swapaxes(a.astype(np.float64), 0, 1) for a in (args.query, args.key, args.value, grad)
    )
    d_q, d_k, d_v = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    sink_values = None if args.sinks is None else args.sinks.astype(np.float64)
    d_sinks = None if args.sinks is None else np.zeros(args.sinks.shape)
    left, right = args.window
    window_arg = (
        None if window is None else (left if left >= 0 else None, right if right >= 0 else None)
    )
    cu_q, cu_k = args.cu_seqlens_q, args.cu_seqlens_k
    for n in range(cu_q.shape[0] - 1):
        rows, keys = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        if rows.stop == rows.start:
            continue
        o_n = np.zeros(g[:, rows].shape)  # not read by the twin: its shape only
        parts = scaled_dot_product_attention_backward(
            g[:, rows],
            q[:, rows],
            k[:, keys],
            v[:, keys],
            o_n,
            np.zeros(o_n.shape[:-1]),  # (also with Ev = 0)
            is_causal=args.is_causal,
            causal_alignment=causal_alignment,
            window=window_arg,
            scale=args.scale,
            softcap=args.softcap,
            sinks=sink_values,
            alibi_slopes=args.alibi_slopes,
        )
        d_q[:, rows] += parts[0]
        d_k[:, keys] += parts[1]
        d_v[:, keys] += parts[2]
        if d_sinks is not None:
            d_sinks += parts[3]
    grads = [
        np.swapaxes(d, 0, 1).astype(a.dtype)
        for d, a in ((d_q, args.query), (d_k, args.key), (d_v, args.value))
    ]
    if d_sinks is not None:
        grads.append(d_sinks.astype(args.sinks.dtype))
    return tuple(grads)


def merge_attention_states(
    outputs: Sequence[ArrayLike],
    lses: Sequence[ArrayLike],
    *,
    out: NDArray[np.floating] | None = None,
    num_threads: int | None = None,
) -> tuple[NDArray[np.floating], NDArray[np.floating]]:
    """NumPy twin of :func:`fastattn.merge_attention_states` (float64 inside).

    Parts whose lse is -inf are left out of the sum (a NaN in their rows does not reach
    the result); a NaN or +inf lse makes the row NaN (``e^(inf - inf)``).

    >>> import numpy as np
    >>> from fastattn import reference
    >>> out, lse = reference.merge_attention_states(
    ...     [np.ones((1, 2)), np.zeros((1, 2))], [np.zeros(1), np.zeros(1)])
    >>> out, lse.round(4)
    (array([[0.5, 0.5]]), array([0.6931]))
    """
    args = merge_states_args(outputs, lses)
    _threads.resolve(num_threads)
    if out is not None:
        check_out(out, args.out_shape, args.result_dtype, args.named_inputs())
    parts = np.stack([o.astype(np.float64) for o in args.outputs])  # (P, ..., Lq, Ev)
    part_lses = np.stack([x.astype(np.float64) for x in args.lses])  # (P, ..., Lq)
    row_max = part_lses.max(axis=0)  # NaN wins
    saw_keys = part_lses != -np.inf
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        w = np.where(saw_keys, np.exp(part_lses - row_max), 0.0)
        total = w.sum(axis=0)
        empty = row_max == -np.inf
        lse = np.where(empty, -np.inf, row_max + np.log(total))
        terms = np.where(saw_keys[..., None], (w / total)[..., None] * parts, 0.0)
    output = np.where(empty[..., None], 0.0, terms.sum(axis=0)).astype(args.result_dtype)
    if out is not None:
        np.copyto(out, output)
        output = out
    return output, lse.astype(args.compute_dtype)


def masked_softmax(
    x: ArrayLike,
    valid_lens: ArrayLike | None = None,
    *,
    mask: ArrayLike | None = None,
    axis: int = -1,
    out: NDArray[np.floating] | None = None,
    num_threads: int | None = None,
) -> NDArray[np.floating]:
    """Softmax of ``x`` along ``axis`` over the entries kept by ``valid_lens`` and ``mask``.

    ``valid_lens`` (int) keeps entries ``j < valid_len``; its shape is a leading prefix of
    the rows' shape (``x``'s shape without ``axis``), size-1 axes broadcasting: for ``x``
    of shape ``(B, Lq, Lk)``, ``(B,)`` is per batch entry and ``(B, Lq)`` per row (d2l).
    ``mask`` is bool, broadcastable to ``x``, True = keep. A row with nothing kept is all
    zeros. float16 is computed in float32 and returned as float16.

    >>> import numpy as np
    >>> from fastattn import reference
    >>> reference.masked_softmax(np.zeros((1, 4)), np.array([2]))
    array([[0.5, 0.5, 0. , 0. ]])
    """
    args = masked_softmax_args(x, valid_lens, mask, axis, out)
    _threads.resolve(num_threads)
    ax = args.axis
    moved = np.moveaxis(args.x, ax, -1).astype(np.float64)
    keep, lens = softmax_masks(args)
    allowed = np.ones(moved.shape, dtype=bool)
    if lens is not None:
        allowed &= np.arange(moved.shape[-1]) < lens[..., None]
    if keep is not None:
        allowed &= np.moveaxis(keep, ax, -1)
    weights, _ = _softmax_rows(moved, allowed)
    weights = np.moveaxis(weights, -1, ax).astype(args.result_dtype)
    if out is not None:
        np.copyto(out, weights)
        return out
    return weights


def multi_head_attention(
    query: ArrayLike,
    key: ArrayLike | None = None,
    value: ArrayLike | None = None,
    *,
    num_heads: int,
    q_weight: ArrayLike,
    k_weight: ArrayLike,
    v_weight: ArrayLike,
    out_weight: ArrayLike,
    q_bias: ArrayLike | None = None,
    k_bias: ArrayLike | None = None,
    v_bias: ArrayLike | None = None,
    out_bias: ArrayLike | None = None,
    attn_mask: ArrayLike | None = None,
    valid_lens: ArrayLike | None = None,
    is_causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    need_weights: bool = False,
    average_attn_weights: bool = True,
    sinks: ArrayLike | None = None,
) -> NDArray[np.floating] | tuple[NDArray[np.floating], NDArray[np.floating]]:
    """NumPy twin of :class:`fastattn.MultiHeadAttention`, as a function (float64 inside).

    Projections ``x @ weight.T + bias``, heads split, :func:`scaled_dot_product_attention`
    of this module, heads merged, output projection. Shapes and arguments as for the
    layer (``key`` defaults to ``query``, ``value`` to ``key``; ``attn_mask`` and
    ``valid_lens`` as in :meth:`fastattn.MultiHeadAttention.__call__`). Weights in
    ``torch.nn.Linear`` layout: ``q_weight (E, E)``, ``k_weight (Hkv * D, kdim)``,
    ``v_weight (Hkv * D, vdim)``, ``out_weight (E, E)`` with ``D = E // num_heads``
    (``Hkv < num_heads`` is grouped-query attention). ``causal_alignment="bottom_right"``
    is what the layer does with a KV cache. ``sinks`` ``(num_heads,)``: the layer's sink
    logits (``use_sinks=True``). The result has the inputs' and weights' promoted dtype
    (weights float32 when that is bfloat16).

    >>> import numpy as np
    >>> from fastattn import reference
    >>> eye = np.eye(4)
    >>> x = np.arange(8.0).reshape(2, 4)
    >>> reference.multi_head_attention(x, num_heads=2, q_weight=0 * eye, k_weight=0 * eye,
    ...                                v_weight=eye, out_weight=eye)  # uniform weights
    array([[2., 3., 4., 5.],
           [2., 3., 4., 5.]])
    """
    num_kv, pairs = projection_weights(
        num_heads, q_weight, k_weight, v_weight, out_weight, q_bias, k_bias, v_bias, out_bias
    )
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = pairs
    e = wq.shape[1]
    q_in, k_in, v_in, batched = layer_inputs(query, key, value, e, wk.shape[1], wv.shape[1])
    want_weights = check_flag(need_weights, "need_weights")
    average = check_flag(average_attn_weights, "average_attn_weights")
    check_unbatched_mask(attn_mask, batched)
    b, num_q = q_in.shape[:2]
    vl = head_valid_lens(valid_lens, b, num_q, batched)
    result, _ = result_dtypes(
        q_in, k_in, v_in, *[a for pair in pairs for a in pair if a is not None]
    )

    def project(x, w, bias):
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf inputs propagate
            y = x.astype(np.float64) @ w.astype(np.float64).T
            return y if bias is None else y + bias.astype(np.float64)

    q = split_heads(project(q_in, wq, bq), num_heads)
    k = split_heads(project(k_in, wk, bk), num_kv)
    v = split_heads(project(v_in, wv, bv), num_kv)
    attended = scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask,
        valid_lens=vl,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        sinks=sinks,
        return_weights=want_weights,
    )
    heads, weights = attended if want_weights else (attended, None)
    out = project(heads.swapaxes(1, 2).reshape(b, num_q, e), wo, bo).astype(result)
    if not batched:
        out = out[0]
    if not want_weights:
        return out
    if average:
        weights = average_heads(weights)
    weights = weights.astype(np.float32 if is_bfloat16(result) else result)  # as the layer's
    return out, (weights if batched else weights[0])


# --------------------------------------------------------------------------------------
# The attention family


def _sink_softmax(scores: np.ndarray, allowed: np.ndarray, sinks: np.ndarray | None):
    """The row softmax (weights, lse), with the rows' sink logits when ``sinks`` (batch...,
    Hq) is given."""
    if sinks is None:
        return _softmax_rows(scores, allowed)
    return _softmax_rows_sink(scores, allowed, sinks[..., None])


def _allowed(args, num_q: int, num_k: int) -> np.ndarray:
    """Full-shape bool: causal/window, valid_lens, the bool mask and the float mask's
    entries other than -inf (a -inf entry removes its key as False does), ANDed."""
    bool_mask, float_mask, lens = attention_masks(args)
    allowed = np.broadcast_to(
        _visible_keys(num_q, num_k, args.diag_offset, args.is_causal, args.window),
        args.full_scores_shape,
    )
    if lens is not None:
        allowed = allowed & (np.arange(num_k) < lens[..., None])
    if bool_mask is not None:
        allowed = allowed & bool_mask
    if float_mask is not None:
        allowed = allowed & (float_mask != -np.inf)
    return allowed


def _weighted_values(weights: np.ndarray, v: np.ndarray) -> np.ndarray:
    """weights @ v, where keys of weight 0 contribute nothing even if their values are NaN."""
    if np.isfinite(v).all():
        return weights @ v
    with np.errstate(invalid="ignore", over="ignore"):
        w = weights[..., None]
        terms = np.where(w != 0, w * v[..., None, :, :], 0.0)  # NaN weights stay NaN
        return terms.sum(axis=-2)  # inf + -inf = NaN


def _normalize_rows(
    scores: np.ndarray, allowed: np.ndarray, normalize: str, top_k: int | None
) -> np.ndarray:
    """Weights over the last axis. softmax: the masked softmax. hardmax: weight 1 on the
    first highest visible score. topk: a softmax over the top_k highest visible scores
    (ties keep the first keys). Scores of -inf count as masked; a NaN among the visible
    scores makes the whole row NaN; a row with nothing visible is 0."""
    if normalize == "softmax":
        return _softmax_rows(scores, allowed)[0]
    s = np.where(allowed, scores, -np.inf)
    nan_rows = np.isnan(s).any(axis=-1, keepdims=True)
    s = np.where(np.isnan(s), -np.inf, s)
    num_k = s.shape[-1]
    keep = np.zeros(s.shape, dtype=bool)
    if num_k:
        k = 1 if normalize == "hardmax" else min(top_k, num_k)
        order = np.argsort(-s, axis=-1, kind="stable")[..., :k]  # stable: first keys on ties
        np.put_along_axis(keep, order, True, axis=-1)
    keep &= s > -np.inf
    if normalize == "hardmax":
        weights = keep.astype(np.float64)
    else:
        weights = _softmax_rows(s, keep)[0]
    return np.where(nan_rows, np.nan, weights)


def _additive_scores(q: np.ndarray, k: np.ndarray, ws) -> np.ndarray:
    """w_v . tanh(q w_q + k w_k) for every (query, key) pair, through the full
    (..., Lq, Lk, hidden) tensor, in float64."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN inputs give NaN scores
        qp = q @ ws.w_q.astype(np.float64)
        kp = k @ ws.w_k.astype(np.float64)
        return np.tanh(qp[..., :, None, :] + kp[..., None, :, :]) @ ws.w_v.astype(np.float64)


def _family_result(args, scores, normalize, top_k, v, want_weights, out):
    """Masks, normaliser, weighted values, dtype and out= handling shared by the twins."""
    num_q, num_k = scores.shape[-2], scores.shape[-1]
    _, float_mask, _ = attention_masks(args)
    if float_mask is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            scores = scores + float_mask.astype(np.float64)
    allowed = _allowed(args, num_q, num_k)
    sink_view, _ = head_values(args)
    if sink_view is None:
        weights = _normalize_rows(scores, allowed, normalize, top_k)
        output = _weighted_values(weights, v)
    else:  # softmax only (checked)
        weights = _softmax_rows_sink(scores, allowed, sink_view[..., None])[0]
        output = np.where(allowed.any(axis=-1)[..., None], _weighted_values(weights, v), 0.0)
    output = output.reshape(args.out_shape).astype(args.result_dtype)
    if out is not None:
        np.copyto(out, output)
        output = out
    if want_weights:
        return output, weights.reshape(args.scores_shape).astype(weights_dtype(args))
    return output


def _full_qkv(args):
    """q, k, v in float64, broadcast to the batch, kv heads repeated for each query head."""
    q, k, v = (
        to_batch(a, args.batch).astype(np.float64) for a in (args.query, args.key, args.value)
    )
    group = q.shape[-3] // max(k.shape[-3], 1)  # zero heads: nothing to repeat
    return q, np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)


def additive_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    w_q: ArrayLike,
    w_k: ArrayLike,
    w_v: ArrayLike,
    attn_mask: ArrayLike | None = None,
    *,
    valid_lens: ArrayLike | None = None,
    is_causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    window: tuple[int | None, int | None] | None = None,
    return_weights: bool = False,
    out: NDArray[np.floating] | None = None,
    num_threads: int | None = None,
) -> NDArray[np.floating] | tuple[NDArray[np.floating], ...]:
    """NumPy twin of :func:`fastattn.additive_attention`: the d2l broadcast formula in
    float64, forming the whole ``(..., Lq, Lk, hidden)`` tensor.

    >>> import numpy as np
    >>> from fastattn import reference
    >>> q, k, v = np.ones((1, 2)), np.ones((3, 2)), np.arange(3.0)[:, None]
    >>> reference.additive_attention(q, k, v, np.eye(2), np.eye(2), np.ones(2))
    array([[1.]])
    """
    args, ws = additive_args(
        query, key, value, w_q, w_k, w_v, attn_mask, valid_lens, is_causal, causal_alignment, window
    )
    want_weights = check_flag(return_weights, "return_weights")
    _threads.resolve(num_threads)
    if out is not None:
        check_out(
            out,
            args.out_shape,
            args.result_dtype,
            {
                "query": query,
                "key": key,
                "value": value,
                "w_q": w_q,
                "w_k": w_k,
                "w_v": w_v,
                "attn_mask": attn_mask,
                "valid_lens": valid_lens,
            },
        )
    q, k, v = _full_qkv(args)
    scores = _additive_scores(q, k, ws)
    return _family_result(args, scores, "softmax", None, v, want_weights, out)


def attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    attn_mask: ArrayLike | None = None,
    *,
    score: Literal["dot", "scaled_dot", "general", "cosine", "gaussian", "additive"] = "scaled_dot",
    normalize: Literal["softmax", "hardmax", "topk"] = "softmax",
    scale: float | None = None,
    weight: ArrayLike | None = None,
    temperature: float | None = None,
    bandwidth: float | None = None,
    w_q: ArrayLike | None = None,
    w_k: ArrayLike | None = None,
    w_v: ArrayLike | None = None,
    top_k: int | None = None,
    valid_lens: ArrayLike | None = None,
    is_causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    window: tuple[int | None, int | None] | None = None,
    sinks: ArrayLike | None = None,
    return_weights: bool = False,
    out: NDArray[np.floating] | None = None,
    num_threads: int | None = None,
) -> NDArray[np.floating] | tuple[NDArray[np.floating], ...]:
    """NumPy twin of :func:`fastattn.attention`: each score from its definition (gaussian
    from the differences ``q - k``, cosine from normalised rows), whole score matrices,
    float64.

    >>> import numpy as np
    >>> from fastattn import reference
    >>> q, k = np.array([[0.0], [2.0]]), np.array([[0.0], [1.0], [2.0]])
    >>> reference.attention(q, k, np.eye(3), score="gaussian", normalize="hardmax")
    array([[1., 0., 0.],
           [0., 0., 1.]])
    """
    spec = attention_spec(
        query,
        key,
        value,
        attn_mask,
        score=score,
        normalize=normalize,
        scale=scale,
        weight=weight,
        temperature=temperature,
        bandwidth=bandwidth,
        w_q=w_q,
        w_k=w_k,
        w_v=w_v,
        top_k=top_k,
        valid_lens=valid_lens,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        window=window,
    )
    set_family_sinks(spec, sinks)
    args = spec.args
    want_weights = check_flag(return_weights, "return_weights")
    _threads.resolve(num_threads)
    if out is not None:
        check_out(
            out,
            args.out_shape,
            args.result_dtype,
            {
                "query": query,
                "key": key,
                "value": value,
                "attn_mask": attn_mask,
                "valid_lens": valid_lens,
                "weight": weight,
                "w_q": w_q,
                "w_k": w_k,
                "w_v": w_v,
            },
        )
    q, k, v = _full_qkv(args)
    kt = np.swapaxes(k, -1, -2)
    with np.errstate(invalid="ignore", over="ignore"):
        if spec.score == "dot":
            scores = q @ kt
        elif spec.score == "scaled_dot":
            scores = (q @ kt) * spec.scale
        elif spec.score == "general":
            scores = (q @ spec.weight.astype(np.float64)) @ kt
        elif spec.score == "cosine":
            scores = (unit_rows(q) @ np.swapaxes(unit_rows(k), -1, -2)) * spec.scale
        elif spec.score == "gaussian":
            diff = q[..., :, None, :] - k[..., None, :, :]
            scores = -(diff * diff).sum(axis=-1) / (2.0 * spec.bandwidth**2)
        else:
            scores = _additive_scores(q, k, spec.additive)
    return _family_result(args, scores, spec.normalize, spec.top_k, v, want_weights, out)


def nadaraya_watson(
    x_query: ArrayLike,
    x_keys: ArrayLike,
    y_values: ArrayLike,
    *,
    kernel: Literal["gaussian", "boxcar", "triangular", "epanechnikov"] = "gaussian",
    bandwidth: float | ArrayLike | Literal["silverman"] = 1.0,
    return_weights: bool = False,
    out: NDArray[np.floating] | None = None,
    num_threads: int | None = None,
) -> NDArray[np.floating] | tuple[NDArray[np.floating], ...]:
    """NumPy twin of :func:`fastattn.nadaraya_watson` (float64, whole weight matrix).

    >>> import numpy as np
    >>> from fastattn import reference
    >>> x = np.array([0.0, 1.0, 2.0])
    >>> reference.nadaraya_watson(np.array([0.5, 5.0]), x, x, kernel="triangular")
    array([0.5, nan])
    """
    ra = regression_args(x_query, x_keys, y_values, kernel, bandwidth)
    want_weights = check_flag(return_weights, "return_weights")
    _threads.resolve(num_threads)
    if out is not None:
        check_out(
            out,
            ra.out_shape,
            ra.result_dtype,
            {"x_query": x_query, "x_keys": x_keys, "y_values": y_values},
        )
    xq, xk, y = (
        to_batch(a, ra.batch, 2).astype(np.float64) for a in (ra.x_query, ra.x_keys, ra.y_values)
    )
    h = ra.bandwidth[..., None, None]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = xq[..., :, None, :] - xk[..., None, :, :]
        u = np.sqrt((diff * diff).sum(axis=-1)) / h  # (batch..., Lq, Lk)
        if xk.shape[-2] == 0:  # no keys: 0/0
            weights = np.zeros(u.shape)
            undefined = np.ones(u.shape[:-1] + (1,), dtype=bool)
        elif ra.kernel == "gaussian":
            scores = -u * u / 2.0
            weights = _softmax_rows(scores, np.ones(u.shape, dtype=bool))[0]
            # every key infinitely far (an infinite query): 0/0, as for the compact kernels
            undefined = np.isnan(weights).any(axis=-1, keepdims=True) | np.isneginf(scores).all(
                axis=-1, keepdims=True
            )
        else:
            inside = u <= 1.0  # NaN distances are outside
            if ra.kernel == "boxcar":
                k = np.where(inside, 1.0, 0.0)
            elif ra.kernel == "triangular":
                k = np.where(inside, 1.0 - u, 0.0)
            else:
                k = np.where(inside, 0.75 * (1.0 - u * u), 0.0)
            total = k.sum(axis=-1, keepdims=True)
            undefined = total == 0
            weights = k / np.where(undefined, 1.0, total)
        weights = np.where(undefined, np.nan, weights)
        output = np.where(undefined, np.nan, _weighted_values(weights, y))
    output = output.reshape(ra.out_shape).astype(ra.result_dtype)
    if out is not None:
        np.copyto(out, output)
        output = out
    if want_weights:
        return output, weights.reshape(ra.weights_shape).astype(weights_dtype(ra))
    return output


def quantize_kv(x: ArrayLike, *, axis: int = -1) -> tuple[NDArray[np.int8], NDArray[np.float32]]:
    """NumPy twin of :func:`fastattn.quantize_kv`, in float64: ``scale = max|x| / 127``
    rounded to float32, ``q = rint(x / scale)`` (half to even), zeros where the scale is 0.

    >>> import numpy as np
    >>> from fastattn import reference
    >>> reference.quantize_kv(np.array([1.0, -2.0, 0.5]))[0].tolist()
    [64, -127, 32]
    """
    a, ax = quantize_args(x, axis)
    values = a.astype(np.float64)
    peak = np.abs(values).max(axis=ax, keepdims=True, initial=0.0)
    scale = (peak / 127.0).astype(np.float32)
    if not np.isfinite(scale).all():
        raise ValueError("x must be finite (an inf or NaN has no int8 form)")
    divisor = np.where(scale > 0, scale, 1.0).astype(np.float64)
    q = np.clip(np.rint(values / divisor), -127, 127).astype(np.int8)
    return q, np.squeeze(scale, axis=ax)


# --------------------------------------------------------------------------------------
# Gradients of the family (docs/semantics.md#gradients-of-the-family)


def masked_softmax_backward(
    grad: ArrayLike,
    weights: ArrayLike,
    valid_lens: ArrayLike | None = None,
    *,
    mask: ArrayLike | None = None,
    axis: int = -1,
    num_threads: int | None = None,
) -> NDArray[np.floating]:
    """NumPy twin of :func:`fastattn.masked_softmax_backward` (float64 inside):
    ``w * (grad - sum(w * grad))`` over each row's kept entries, 0 elsewhere.

    >>> import numpy as np
    >>> from fastattn import reference
    >>> w = reference.masked_softmax(np.zeros((1, 3)), np.array([2]))
    >>> reference.masked_softmax_backward(np.array([[1.0, 0.0, 5.0]]), w, np.array([2]))
    array([[ 0.25, -0.25,  0.  ]])
    """
    args, g_in = softmax_backward_args(grad, weights, valid_lens, mask, axis)
    _threads.resolve(num_threads)
    ax = args.axis
    w = np.moveaxis(args.x, ax, -1).astype(np.float64)
    g = np.moveaxis(g_in, ax, -1).astype(np.float64)
    keep, lens = softmax_masks(args)
    allowed = np.ones(w.shape, dtype=bool)
    if lens is not None:
        allowed &= np.arange(w.shape[-1]) < lens[..., None]
    if keep is not None:
        allowed &= np.moveaxis(keep, ax, -1)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(allowed, w, 0.0)  # entries not kept are never read
        gk = np.where(allowed, g, 0.0)
        dot = (p * gk).sum(axis=-1, keepdims=True)
        dx = np.where(allowed, p * (gk - dot), 0.0)
    return np.moveaxis(dx, -1, ax).astype(args.result_dtype)


def additive_attention_backward(
    grad_out: ArrayLike,
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    w_q: ArrayLike,
    w_k: ArrayLike,
    w_v: ArrayLike,
    attn_mask: ArrayLike | None = None,
    *,
    valid_lens: ArrayLike | None = None,
    is_causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    window: tuple[int | None, int | None] | None = None,
    num_threads: int | None = None,
) -> tuple[NDArray[np.floating], ...]:
    """NumPy twin of :func:`fastattn.additive_attention_backward`: the chain rule through
    the whole ``(..., Lq, Lk, hidden)`` tensor of :func:`additive_attention`, float64.

    >>> import numpy as np
    >>> from fastattn import reference
    >>> q, k, v = np.ones((1, 2)), np.ones((3, 2)), np.arange(3.0)[:, None]
    >>> grads = reference.additive_attention_backward(
    ...     np.ones((1, 1)), q, k, v, np.eye(2), np.eye(2), np.ones(2))
    >>> [g.shape for g in grads]
    [(1, 2), (3, 2), (3, 1), (2, 2), (2, 2), (2,)]
    >>> grads[2].ravel()  # equal scores: each value row gets a third of the gradient
    array([0.33333333, 0.33333333, 0.33333333])
    """
    args, ws = additive_args(
        query, key, value, w_q, w_k, w_v, attn_mask, valid_lens, is_causal, causal_alignment, window
    )
    go = grad_out_array(grad_out, args.out_shape)
    _threads.resolve(num_threads)
    q, k, v = _full_qkv(args)
    wq, wk, wv = (w.astype(np.float64) for w in (ws.w_q, ws.w_k, ws.w_v))
    num_q, num_k = q.shape[-2], k.shape[-2]
    allowed = _allowed(args, num_q, num_k)
    _, float_mask, _ = attention_masks(args)
    go = go.reshape(args.full_out_shape).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        qp, kp = q @ wq, k @ wk
        t = np.tanh(qp[..., :, None, :] + kp[..., None, :, :])  # (..., Lq, Lk, hidden)
        scores = t @ wv
        if float_mask is not None:
            scores = scores + float_mask.astype(np.float64)
        p, _ = _softmax_rows(scores, allowed)
        # keys a row does not attend are never read (their k, v may hold NaN)
        dv = _weighted_values(np.swapaxes(p, -1, -2), go)
        dp = np.where(allowed, go @ np.swapaxes(v, -1, -2), 0.0)
        ds = np.where(allowed, p * (dp - (p * dp).sum(axis=-1, keepdims=True)), 0.0)
        dt = np.where(allowed[..., None], ds[..., None] * (1.0 - t * t) * wv, 0.0)
        dqp, dkp = dt.sum(axis=-2), dt.sum(axis=-3)
        dwv = np.where(allowed[..., None], ds[..., None] * t, 0.0).reshape(-1, wv.shape[0])
        grads = (
            input_grad(dqp @ wq.T, np.shape(query), np.float64),
            input_grad(dkp @ wk.T, np.shape(key), np.float64),
            input_grad(dv, np.shape(value), np.float64),
            unread_zeroed(q, dqp).reshape(-1, q.shape[-1]).T @ dqp.reshape(-1, wv.shape[0]),
            unread_zeroed(k, dkp).reshape(-1, k.shape[-1]).T @ dkp.reshape(-1, wv.shape[0]),
            dwv.sum(axis=0),
        )
    return tuple(
        grad_like(g, a) for g, a in zip(grads, (query, key, value, w_q, w_k, w_v), strict=True)
    )


def _kernel_and_slope(kernel: str, u: np.ndarray):
    """(K(u), dK/du) of a compact kernel inside its support ``u <= 1``, 0 outside; at
    ``u = 1`` the derivative from inside."""
    inside = u <= 1.0  # NaN distances are outside
    if kernel == "boxcar":
        return np.where(inside, 1.0, 0.0), np.zeros(u.shape)
    if kernel == "triangular":
        return np.where(inside, 1.0 - u, 0.0), np.where(inside, -1.0, 0.0)
    return np.where(inside, 0.75 * (1.0 - u * u), 0.0), np.where(inside, -1.5 * u, 0.0)


def nadaraya_watson_backward(
    grad_out: ArrayLike,
    x_query: ArrayLike,
    x_keys: ArrayLike,
    y_values: ArrayLike,
    *,
    kernel: Literal["gaussian", "boxcar", "triangular", "epanechnikov"] = "gaussian",
    bandwidth: float | ArrayLike | Literal["silverman"] = 1.0,
    num_threads: int | None = None,
) -> tuple:
    """NumPy twin of :func:`fastattn.nadaraya_watson_backward` (float64, whole weight and
    distance matrices).

    >>> import numpy as np
    >>> from fastattn import reference
    >>> x = np.array([0.0, 1.0, 2.0])
    >>> gq, gk, gy, gh = reference.nadaraya_watson_backward(
    ...     np.ones(1), np.array([0.5]), x, x, kernel="triangular")
    >>> gq, gy, gh
    (array([1.]), array([0.5, 0.5, 0. ]), 0.0)
    """
    ra = regression_args(x_query, x_keys, y_values, kernel, bandwidth)
    go = grad_out_array(grad_out, ra.out_shape)
    _threads.resolve(num_threads)
    xq, xk, y = (
        to_batch(a, ra.batch, 2).astype(np.float64) for a in (ra.x_query, ra.x_keys, ra.y_values)
    )
    lq, lk = xq.shape[-2], xk.shape[-2]
    g = go.astype(np.float64).reshape(ra.batch + (lq, y.shape[-1]))
    h = ra.bandwidth[..., None, None]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = xq[..., :, None, :] - xk[..., None, :, :]  # (batch..., Lq, Lk, D)
        r = np.sqrt((diff * diff).sum(axis=-1))
        u = r / h
        if lk == 0:
            w = np.zeros(u.shape)
            undefined = np.ones(u.shape[:-1] + (1,), dtype=bool)
        elif ra.kernel == "gaussian":
            scores = -u * u / 2.0
            w = _softmax_rows(scores, np.ones(u.shape, dtype=bool))[0]
            undefined = np.isnan(w).any(axis=-1, keepdims=True) | np.isneginf(scores).all(
                axis=-1, keepdims=True
            )
        else:
            kern, slope = _kernel_and_slope(ra.kernel, u)
            reach = u <= 1.0
            total = kern.sum(axis=-1, keepdims=True)
            undefined = total == 0
            w = kern / np.where(undefined, 1.0, total)
        w = np.where(undefined, 0.0, w)  # an undefined row passes no gradient on
        if ra.kernel == "gaussian" or lk == 0:
            reach = w != 0  # keys of weight 0 are never read
        f = _weighted_values(w, y)
        # dL/dw_ij = g_i . y_j; through the normalisation: g_i . (y_j - f_i) / sum_j K_ij
        gy_dot = np.where(reach, g @ np.swapaxes(y, -1, -2), 0.0)
        dw = gy_dot - (g * f).sum(-1, keepdims=True)
        if lk == 0:
            coef = np.zeros(u.shape)  # dL/dr_ij
        elif ra.kernel == "gaussian":  # w = softmax(-r^2 / (2 h^2))
            coef = -(w * dw) * r / (h * h)
        else:  # w = K(r / h) / sum: dL/dK_ij = dw_ij / sum, dK/dr = K'(u) / h
            coef = np.where(undefined, 0.0, dw / np.where(undefined, 1.0, total) * slope / h)
        unit = np.where(r[..., None] > 0, diff / np.where(r > 0, r, 1.0)[..., None], 0.0)
        along = coef[..., None] * unit  # dL/dx_query_i's term of key j
        gxq = np.where(undefined, np.nan, along.sum(axis=-2))
        gxk = -along.sum(axis=-3)
        gy = np.swapaxes(w, -1, -2) @ g
        gh = -(coef * r).sum(axis=(-1, -2)) / ra.bandwidth  # dr/dh of u fixed: r / h
    return regression_grads(ra, gxq, gxk, gy, gh, (x_query, x_keys, y_values), bandwidth)

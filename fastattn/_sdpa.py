"""fastattn.scaled_dot_product_attention: validation here, compute in fastattn._core."""

from __future__ import annotations

import numpy as np

from fastattn import _core, _cuda, _threads
from fastattn._validate import check_flag, check_out, kernel_ready, sdpa_args, with_leading_axes


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    *,
    valid_lens=None,
    is_causal=False,
    causal_alignment="top_left",
    window=None,
    scale=None,
    softcap=None,
    return_lse=False,
    return_weights=False,
    out=None,
    num_threads=None,
):
    """Scaled dot-product attention, ``softmax(q k^T * scale + mask) v``, computed in blocks.

    No ``Lq x Lk`` score matrix is formed unless ``return_weights=True``.

    Parameters
    ----------
    query : array_like, shape ``(..., Hq, Lq, E)`` (or ``(Lq, E)``)
    key : array_like, shape ``(..., Hkv, Lk, E)``
    value : array_like, shape ``(..., Hkv, Lk, Ev)``
        float16, float32 or float64; mixed dtypes promote with ``np.result_type``;
        float16 is computed in float32 and returned as float16. Leading dims broadcast.
        ``Hq % Hkv == 0``: query head ``h`` reads key/value head ``h // (Hq // Hkv)``
        (grouped-query / multi-query attention). Any strides; arrays whose last axis has
        unit stride are read in place.
    attn_mask : array_like, optional
        Broadcastable to ``(..., Hq, Lq, Lk)``. bool: True = may attend. float: added to
        the scaled (and soft-capped) scores.
    valid_lens : array_like of int, optional
        Key ``j`` is attended iff ``j < valid_len``. Its shape is a leading prefix of the
        score rows' shape ``(..., Hq, Lq)`` (size-1 axes broadcast): for 4-D inputs
        ``(B,)`` is one length per batch entry, ``(B, Hq)`` per head, ``(B, 1, Lq)`` per
        query. Values lie in ``[0, Lk]``. Keys past the length are never read.
    is_causal : bool, default False
        Keep keys ``j <= i`` (``causal_alignment="top_left"``) or ``j <= i + Lk - Lq``
        (``"bottom_right"``, as in KV-cache decoding).
    window : (left, right), optional
        Keep ``i - left <= j <= i + right`` (same alignment as causal); either side may be
        None (unbounded).
    scale : float, default ``1 / sqrt(E)``
    softcap : float > 0, optional
        Scores become ``softcap * tanh(score / softcap)`` after scaling, before masks.
    return_lse, return_weights : bool
        Also return the log-sum-exp of each score row, shape ``(..., Hq, Lq)`` (in the
        compute dtype: float32 for float16 inputs), and/or the attention weights, shape
        ``(..., Hq, Lq, Lk)``.
    out : ndarray, optional
        Written with the result and returned; exact output shape and dtype required.
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).

    All masks combine by AND. A row that may attend no key returns zeros (lse ``-inf``,
    weights 0). The result is bit-identical for any thread count. The GIL is released
    while computing.

    CuPy arrays are computed on the GPU (a flash-style CUDA kernel, same semantics) and
    give CuPy arrays; every array argument must then be a CuPy array.

    Returns
    -------
    output, or a tuple ``(output, lse)``, ``(output, weights)``, ``(output, lse, weights)``.
    ``output`` has shape ``(..., Hq, Lq, Ev)``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((2, 4, 16, 8), dtype=np.float32) for _ in range(3))
    >>> out = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> out.shape, out.dtype
    ((2, 4, 16, 8), dtype('float32'))
    >>> bool(np.allclose(out[..., 0, :], v[..., 0, :]))  # row 0 sees only key 0
    True
    """
    if _cuda.uses_gpu(query, key, value, attn_mask, valid_lens, out):
        return _cuda.scaled_dot_product_attention(
            query, key, value, attn_mask, valid_lens=valid_lens, is_causal=is_causal,
            causal_alignment=causal_alignment, window=window, scale=scale, softcap=softcap,
            return_lse=return_lse, return_weights=return_weights, out=out,
            num_threads=num_threads)
    args = sdpa_args(query, key, value, attn_mask, valid_lens, is_causal, causal_alignment,
                     window, scale, softcap)
    want_lse = check_flag(return_lse, "return_lse")
    want_weights = check_flag(return_weights, "return_weights")
    threads = _threads.resolve(num_threads)
    if out is not None:
        out = check_out(out, args.out_shape, args.result_dtype,
                        {"query": query, "key": key, "value": value, "attn_mask": attn_mask,
                         "valid_lens": valid_lens})

    dtype = args.compute_dtype
    # Convert before broadcasting so a broadcast input is never materialised.
    q, k, v = (args.full(kernel_ready(a, dtype)) for a in (args.query, args.key, args.value))
    in_place = out is not None and out.dtype == dtype and out is kernel_ready(out, dtype)
    if in_place:  # write straight into the caller's buffer
        result = with_leading_axes(out, len(args.full_out_shape))
    else:
        result = np.empty(args.full_out_shape, dtype)
    lse = np.empty(args.full_out_shape[:-1], dtype) if want_lse else None
    weights = np.empty(args.full_scores_shape, dtype) if want_weights else None
    left, right = args.window

    _core.sdpa(q, k, v, result, args.bool_mask, args.float_mask, args.valid_lens, lse, weights,
               args.scale, args.softcap or 0.0, args.is_causal, args.diag_offset, left, right,
               threads)

    output = result.reshape(args.out_shape)
    if out is not None:
        if not in_place:
            np.copyto(out, output, casting="unsafe")
        output = out
    elif output.dtype != args.result_dtype:
        output = output.astype(args.result_dtype)
    extras = []
    if want_lse:
        extras.append(lse.reshape(args.out_shape[:-1]))
    if want_weights:
        extras.append(weights.reshape(args.scores_shape).astype(args.result_dtype, copy=False))
    return (output, *extras) if extras else output

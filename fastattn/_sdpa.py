"""fastattn.scaled_dot_product_attention and merge_attention_states: the common call taken
whole by the core's fast path; otherwise the backend picked once (:mod:`fastattn._dispatch`):
Dask and CuPy calls handed on as they were made, NumPy calls checked by
:mod:`fastattn._validation` and computed by :mod:`fastattn._cpu`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

import numpy as np

from fastattn import _core, _cpu, _dispatch, _threads
from fastattn._checks import check_flag
from fastattn._validation import check_out, merge_states_args, sdpa_args

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import ArrayLike, NDArray

# The fast path (csrc/bindings/register_sdpa.cpp: sdpa_fast) takes the common call:
# NumPy arrays of one float dtype, no masks, out= or extra results; sinks / ALiBi slopes
# of shape (Hq,) in that dtype. It shares the core's
# entry check with the full path below and declines (returns None) anything that check
# or its argument forms do not accept, so every error comes from the full path.
# FASTATTN_FAST_PATH=0 turns it off (the tests run both paths).
_fast_path = os.environ.get("FASTATTN_FAST_PATH", "1") != "0"


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
    """Scaled dot-product attention, ``softmax(q k^T * scale + mask) v``, computed in blocks.

    No ``Lq x Lk`` score matrix is formed unless ``return_weights=True``.

    Parameters
    ----------
    query : array_like, shape ``(..., Hq, Lq, E)`` (or ``(Lq, E)``)
    key : array_like, shape ``(..., Hkv, Lk, E)``
    value : array_like, shape ``(..., Hkv, Lk, Ev)``
        float16, bfloat16 (``ml_dtypes``), float32 or float64; mixed dtypes promote with
        ``np.result_type``; float16 and bfloat16 are read as they are, computed in float32
        and returned in their dtype. key and value may instead be int8 (a quantised cache,
        see :func:`fastattn.quantize_kv`) with ``key_scale``/``value_scale``. Leading dims
        broadcast.
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
    sinks : array_like of float, optional
        Attention sinks: one logit per query head, shape ``(Hq,)`` or broadcastable to the
        score rows' leading shape ``(..., Hq)``. It joins the softmax denominator of every
        row of its head as an extra key whose value is zero, used as given (not scaled,
        soft-capped or masked): the weights sum to less than 1, ``lse`` includes it, and a
        row that may attend no key returns zeros with ``lse = sink``.
    alibi_slopes : array_like of float, optional
        ALiBi: one slope per query head, shapes as ``sinks``. Adds
        ``-slope * |j - (i + d)|`` to the scaled, soft-capped scores (with the float
        mask), ``d`` the causal alignment's diagonal offset (0 top-left, ``Lk - Lq``
        bottom-right). No bias matrix is formed.
    return_lse, return_weights : bool
        Also return the log-sum-exp of each score row, shape ``(..., Hq, Lq)`` (in the
        compute dtype: float32 for float16 inputs), and/or the attention weights, shape
        ``(..., Hq, Lq, Lk)``.
    out : ndarray, optional
        Written with the result and returned; exact output shape and dtype required.
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).
    key_scale, value_scale : array_like, shape ``key.shape[:-1]``, optional
        Required with int8 key/value, and only then: key ``j`` stands for
        ``key[..., j, :] * key_scale[..., j]`` (value likewise). Dequantised inside the
        kernel as the int8 bytes are read; computed in float32 (the query may be float16,
        bfloat16 or float32; the result has its dtype).

    All masks combine by AND. A row that may attend no key returns zeros (lse ``-inf``,
    weights 0). The result is bit-identical for any thread count. The GIL is released
    while computing.

    CuPy arrays are computed on the GPU (a flash-style CUDA kernel, same semantics) and
    give CuPy arrays; every array argument must then be a CuPy array. ``sinks`` and
    ``alibi_slopes`` are CPU-only: on CuPy arrays they raise ``NotImplementedError``.

    Dask arrays give lazy Dask arrays (``out=`` excepted): one task per chunk, the key
    length may be chunked too (partial states merged exactly); see the "Dask arrays"
    section of docs/semantics.md.

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
    if _fast_path and key_scale is None and value_scale is None:
        # The common call, checked and computed by the core; None: take the full path.
        # Positional, in sdpa_fast's order: CPython compiles a call of 16 keywords into
        # one through a new dict (and a new names tuple) every time.
        result = _core.sdpa_fast(
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
            return_lse,
            return_weights,
            out,
            num_threads,
            sinks,
            alibi_slopes,
        )
        if result is not None:
            return result
    kind = _dispatch.backend(
        query, key, value, attn_mask, valid_lens, out, sinks, alibi_slopes, key_scale, value_scale
    )
    if kind is not None:  # CuPy: the CUDA kernel; Dask: a lazy graph of CPU (or CUDA) blocks
        call = _dispatch.forwarded(scaled_dot_product_attention, locals())
        arrays = "CuPy" if kind == "cupy" else "Dask"
        for name in ("sinks", "alibi_slopes"):
            if call.pop(name) is not None:
                path = "the CUDA kernel" if kind == "cupy" else "the Dask path"
                raise NotImplementedError(
                    f"{name} is not supported on {arrays} arrays ({path} has no {name}): pass "
                    "NumPy arrays"
                )
        if call.pop("key_scale") is not None or call.pop("value_scale") is not None:
            raise NotImplementedError(
                f"int8 key/value (key_scale/value_scale) do not run on {arrays} arrays: pass "
                "NumPy arrays, or float key/value"
            )
        return _dispatch.engine(kind).scaled_dot_product_attention(**call)
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
    threads = _threads.resolve(num_threads)
    if out is not None:
        check_out(out, args.out_shape, args.result_dtype, args.named_inputs())
    return _cpu.sdpa(args, out, want_lse, want_weights, threads)


def merge_attention_states(
    outputs: Sequence[ArrayLike],
    lses: Sequence[ArrayLike],
    *,
    out: NDArray[np.floating] | None = None,
    num_threads: int | None = None,
) -> tuple[NDArray[np.floating], NDArray[np.floating]]:
    """Merge attention results over disjoint key sets into the attention over their union.

    Part ``i`` is the attention of the same queries over the ``i``-th set of keys, with
    its log-sum-exp ``lse_i`` (``scaled_dot_product_attention(..., return_lse=True)``).
    Per row, ``lse = log(sum_i exp(lse_i))`` and ``out = sum_i exp(lse_i - lse) * out_i``:
    exactly what one call over all the keys gives (up to rounding), so a long K/V can be
    processed in chunks (a cache too big for memory, a Dask array, several machines).

    Parameters
    ----------
    outputs : sequence of array_like, each of shape ``(..., Lq, Ev)``
        The partial results, all of one shape (parts do not broadcast). float16, float32
        or float64; mixed dtypes (lses included) promote with ``np.result_type``; float16
        is computed in float32 and returned as float16. Any strides.
    lses : sequence of array_like, each of shape ``(..., Lq)``
        One log-sum-exp per part, in the same order.
    out : ndarray, optional
        Written with the merged output and returned; exact output shape and result dtype
        required.
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).

    A part whose ``lse`` is ``-inf`` (it saw no key of that row) contributes nothing and
    its row is never read; a row where every part is ``-inf`` gives zeros and ``-inf``. A
    NaN or ``+inf`` lse makes the row and its lse NaN; a NaN in the output row of a part
    with a finite lse makes those entries NaN. Parts are summed in the order given, so the
    result is bit-identical for any thread count. The GIL is released while computing.
    CuPy arrays raise ``NotImplementedError``; Dask arrays give lazy Dask arrays.

    Returns
    -------
    (output, lse) : output of shape ``(..., Lq, Ev)`` in the result dtype, lse of shape
    ``(..., Lq)`` in the compute dtype (float32 for float16 inputs).

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((4, 16, 8))
    >>> k, v = rng.standard_normal((4, 100, 8)), rng.standard_normal((4, 100, 8))
    >>> parts = [fastattn.scaled_dot_product_attention(q, k[:, s], v[:, s], return_lse=True)
    ...          for s in (slice(0, 60), slice(60, 100))]
    >>> out, lse = fastattn.merge_attention_states([o for o, _ in parts], [l for _, l in parts])
    >>> full, full_lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    >>> bool(np.allclose(out, full)), bool(np.allclose(lse, full_lse))
    (True, True)
    """
    kind = _dispatch.backend(out, outputs, lses)
    if kind is not None:  # Dask: a lazy graph; CuPy: refused by the CUDA path
        return _dispatch.engine(kind).merge_attention_states(
            **_dispatch.forwarded(merge_attention_states, locals())
        )
    args = merge_states_args(outputs, lses)
    threads = _threads.resolve(num_threads)
    if out is not None:
        check_out(out, args.out_shape, args.result_dtype, args.named_inputs())
    return _cpu.merge_attention_states(args, out, threads)

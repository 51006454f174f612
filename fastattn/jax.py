"""fastattn for JAX: ``jax.nn.dot_product_attention`` computed by fastattn on the CPU, with
gradients.

:func:`dot_product_attention` takes the arguments of ``jax.nn.dot_product_attention``
(JAX's ``(B, T, N, H)`` layout, ``bias``, ``mask``, ``scale``, ``is_causal``,
``query_seq_lengths``, ``key_value_seq_lengths``, ``local_window_size``) plus fastattn's
own options as keywords. It is a ``jax.custom_vjp`` whose forward and backward are
``jax.pure_callback`` calls of :func:`fastattn.scaled_dot_product_attention` (with
``return_lse=True``) and :func:`fastattn.scaled_dot_product_attention_backward`: it works
under ``jax.jit``, ``jax.grad`` and ``jax.vmap`` (one call per mapped element). Importing
this module imports JAX; ``import fastattn`` does not.

    >>> import jax, jax.numpy as jnp
    >>> import fastattn.jax
    >>> q, k, v = (jax.random.normal(jax.random.key(i), (2, 16, 4, 8)) for i in range(3))
    >>> loss = lambda q: fastattn.jax.dot_product_attention(q, k, v, is_causal=True).sum()
    >>> jax.grad(loss)(q).shape
    (2, 16, 4, 8)
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

import fastattn

if TYPE_CHECKING:
    from jax.typing import ArrayLike

__all__ = ["dot_product_attention"]


def _heads_first(a: np.ndarray) -> np.ndarray:
    """JAX's (..., T, N, H) as fastattn's (..., N, T, H): a view (the last axis keeps its
    unit stride, so fastattn reads it in place)."""
    return np.swapaxes(np.asarray(a), -3, -2)


def _compute_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def _forward_callback(static, q, k, v, sinks, mask, valid_lens, slopes):
    out, lse = fastattn.scaled_dot_product_attention(
        _heads_first(q),
        _heads_first(k),
        _heads_first(v),
        mask,
        valid_lens=valid_lens,
        sinks=sinks,
        alibi_slopes=slopes,
        return_lse=True,
        **dict(static),
    )
    return np.swapaxes(out, -3, -2), lse


def _backward_callback(static, q, k, v, sinks, mask, valid_lens, slopes, out, lse, grad_out):
    grads = fastattn.scaled_dot_product_attention_backward(
        _heads_first(grad_out),
        _heads_first(q),
        _heads_first(k),
        _heads_first(v),
        _heads_first(out),
        lse,
        mask,
        valid_lens=valid_lens,
        sinks=sinks,
        alibi_slopes=slopes,
        **dict(static),
    )
    return tuple(np.swapaxes(g, -3, -2) for g in grads[:3]) + tuple(grads[3:])


def _forward(static, q, k, v, sinks, mask, valid_lens, slopes):
    lead = jnp.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    dtype = jnp.result_type(q, k, v)
    t, n = q.shape[-3], q.shape[-2]
    shapes = (
        jax.ShapeDtypeStruct((*lead, t, n, v.shape[-1]), dtype),
        jax.ShapeDtypeStruct((*lead, n, t), _compute_dtype(dtype)),
    )
    return jax.pure_callback(
        functools.partial(_forward_callback, static),
        shapes,
        q,
        k,
        v,
        sinks,
        mask,
        valid_lens,
        slopes,
        vmap_method="sequential",
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static, q, k, v, sinks, mask, valid_lens, slopes):
    return _forward(static, q, k, v, sinks, mask, valid_lens, slopes)[0]


def _attention_fwd(static, q, k, v, sinks, mask, valid_lens, slopes):
    out, lse = _forward(static, q, k, v, sinks, mask, valid_lens, slopes)
    return out, (q, k, v, sinks, mask, valid_lens, slopes, out, lse)


def _attention_bwd(static, residuals, grad_out):
    q, k, v, sinks, mask, valid_lens, slopes, out, lse = residuals
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, k, v))
    if sinks is not None:
        shapes += (jax.ShapeDtypeStruct(sinks.shape, sinks.dtype),)
    grads = jax.pure_callback(
        functools.partial(_backward_callback, static),
        shapes,
        q,
        k,
        v,
        sinks,
        mask,
        valid_lens,
        slopes,
        out,
        lse,
        grad_out,
        vmap_method="sequential",
    )
    grad_sinks = grads[3] if sinks is not None else None
    return (*grads[:3], grad_sinks, None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _float_or_none(x: Any, name: str) -> float | None:
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(f"fastattn.jax: {name} must be a Python number, got {x!r}") from None


def dot_product_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    bias: ArrayLike | None = None,
    mask: ArrayLike | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths: ArrayLike | None = None,
    key_value_seq_lengths: ArrayLike | None = None,
    local_window_size: int | tuple[int, int] | None = None,
    implementation: None = None,
    valid_lens: ArrayLike | None = None,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    sinks: ArrayLike | None = None,
    alibi_slopes: ArrayLike | None = None,
) -> jax.Array:
    """``jax.nn.dot_product_attention`` computed by fastattn on the CPU, differentiable.

    Parameters
    ----------
    query : array, shape ``(B, T, N, H)`` or ``(T, N, H)``
    key, value : arrays, shape ``(B, S, K, H)`` (value: ``(..., S, K, Hv)``)
        JAX's layout (length before heads). ``N % K == 0``: grouped-query and multi-query
        attention. float16, bfloat16, float32 or float64 (with ``jax_enable_x64``).
        Gradients flow to each.
    bias, mask : arrays broadcastable to ``(B, N, T, S)``, optional
        Constants (their cotangent is zero: no gradient flows into them). ``bias`` is added
        to the scaled scores; ``mask`` is bool, True = may attend.
    scale, is_causal, local_window_size
        As in JAX (``local_window_size=(left, right)`` keeps keys ``i - left <= j <= i +
        right``; an int is both sides). Causal is top-left aligned.
    query_seq_lengths, key_value_seq_lengths : int arrays of shape ``(B,)``, optional
        Query rows past their length give zeros; keys past their length are not attended
        (``key_value_seq_lengths`` is fastattn's ``valid_lens``).
    implementation : None
        Only None (fastattn is the implementation).
    valid_lens, causal_alignment, window, softcap, alibi_slopes
        fastattn's options (:func:`fastattn.scaled_dot_product_attention`); constants.
        ``window`` and ``local_window_size`` are the same option (give one).
    sinks : array, optional
        Attention-sink logits, one per query head (``(N,)`` or broadcastable to
        ``(B, N)``); differentiable.

    Returns
    -------
    jax.Array of shape ``(B, T, N, Hv)``.

    Notes
    -----
    Unlike JAX's ``xla`` implementation, which gives a row that may attend no key the mean
    of the values (its masked scores are a large finite negative), fastattn gives zeros,
    with zero gradients. Threads: :func:`fastattn.set_num_threads`. The computation runs on
    the host in a ``jax.pure_callback``: arrays on another device are copied to the host.
    """
    if implementation is not None:
        raise ValueError(
            f"fastattn.jax: implementation must be None (fastattn computes it), got "
            f"{implementation!r}"
        )
    q, k, v = (jnp.asarray(a) for a in (query, key, value))
    for name, a in (("query", q), ("key", k), ("value", v)):
        if a.ndim not in (3, 4):
            raise ValueError(
                f"fastattn.jax: {name} must be 3-D (T, N, H) or 4-D (B, T, N, H), got shape "
                f"{a.shape}"
            )
        if not jnp.issubdtype(a.dtype, jnp.floating):
            raise TypeError(f"fastattn.jax: {name} must be a float array, got {a.dtype}")
    if local_window_size is not None:
        if window is not None:
            raise ValueError("fastattn.jax: give local_window_size or window, not both")
        if isinstance(local_window_size, int):
            local_window_size = (local_window_size, local_window_size)
        window = tuple(int(w) for w in local_window_size)
    if key_value_seq_lengths is not None:
        if valid_lens is not None:
            raise ValueError("fastattn.jax: give key_value_seq_lengths or valid_lens, not both")
        valid_lens = key_value_seq_lengths
    if bias is not None:
        bias = jnp.asarray(bias)
        if mask is not None:  # one float mask: the bias where allowed, -inf elsewhere
            bias = jnp.where(jnp.asarray(mask, bool), bias, -jnp.inf)
        mask = bias
    elif mask is not None:
        mask = jnp.asarray(mask, bool)
    if query_seq_lengths is not None:  # rows past their length attend nothing: zeros
        rows = jnp.arange(q.shape[-3]) < jnp.asarray(query_seq_lengths)[:, None]
        rows = rows[:, None, :, None]
        if mask is None:
            mask = rows
        elif mask.dtype == bool:
            mask = mask & rows
        else:
            mask = jnp.where(rows, mask, -jnp.inf)
    static = (
        ("is_causal", bool(is_causal)),
        ("causal_alignment", causal_alignment),
        ("window", None if window is None else tuple(window)),
        ("scale", _float_or_none(scale, "scale")),
        ("softcap", _float_or_none(softcap, "softcap")),
    )
    arrays = [
        None if a is None else jnp.asarray(a) for a in (sinks, mask, valid_lens, alibi_slopes)
    ]
    return _attention(static, q, k, v, *arrays)

"""fastattn for PyTorch: scaled dot-product attention on CPU tensors, with gradients.

:func:`scaled_dot_product_attention` takes the arguments of
``torch.nn.functional.scaled_dot_product_attention`` (``attn_mask``, ``dropout_p`` = 0,
``is_causal``, ``scale``, ``enable_gqa``) plus fastattn's own options as keywords, and is
differentiable: its backward is :func:`fastattn.scaled_dot_product_attention_backward`.
Tensors reach fastattn as NumPy views of their memory (no copy) and the results come back
the same way. Importing this module imports PyTorch; ``import fastattn`` does not.

    >>> import torch
    >>> import fastattn.torch
    >>> q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    >>> out = fastattn.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> out.sum().backward()
    >>> q.grad.shape
    torch.Size([2, 4, 16, 8])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

import fastattn

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

__all__ = ["scaled_dot_product_attention"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _bfloat16() -> np.dtype:
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(
            "fastattn.torch: bfloat16 tensors need the ml_dtypes package (pip install ml_dtypes)"
        ) from None
    return np.dtype(ml_dtypes.bfloat16)


def _to_numpy(t: torch.Tensor, name: str) -> np.ndarray:
    """A NumPy view of a CPU tensor's memory (no copy; strides as they are)."""
    if t.device.type != "cpu":
        raise ValueError(
            f"fastattn.torch: {name} is on device {t.device}; fastattn computes on the CPU "
            f"(move it with {name}.cpu())"
        )
    t = t.detach()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: ml_dtypes' one, same bits
        return t.view(torch.int16).numpy().view(_bfloat16())
    return t.resolve_neg().resolve_conj().numpy()


def _to_torch(a: np.ndarray) -> torch.Tensor:
    """The tensor over a NumPy array's memory (no copy)."""
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _tensor_arg(x: Any, name: str) -> Any:
    """A tensor argument as NumPy (None and non-tensors as given: fastattn checks them)."""
    if isinstance(x, torch.Tensor):
        return _to_numpy(x, name)
    return x


def _check_query_key_value(query, key, value, enable_gqa: bool) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"fastattn.torch: {name} must be a torch.Tensor, got {type(t).__name__}"
            )
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(
                f"fastattn.torch: {name} must be float16, bfloat16, float32 or float64, got "
                f"{t.dtype}"
            )
    if query.dim() >= 3 and key.dim() >= 3 and query.shape[-3] != key.shape[-3] and not enable_gqa:
        raise ValueError(
            f"fastattn.torch: query has {query.shape[-3]} heads and key {key.shape[-3]}; pass "
            "enable_gqa=True for grouped-query attention (as torch's "
            "scaled_dot_product_attention requires)"
        )


def _constant(x: Any, name: str) -> None:
    if isinstance(x, torch.Tensor) and x.requires_grad:
        raise ValueError(
            f"fastattn.torch: {name} requires grad, but fastattn treats it as a constant (no "
            f"gradient flows into it); pass {name}.detach()"
        )


def _mask_arg(mask: Any) -> Any:
    """attn_mask as fastattn takes it: a BlockMask as it is, a tensor as a NumPy view."""
    return mask if isinstance(mask, fastattn.BlockMask) else _tensor_arg(mask, "attn_mask")


_SAVED = object()  # stands for a tensor kept by save_for_backward


class _Attention(torch.autograd.Function):
    """out = attention(query, key, value[, sinks]); backward through fastattn's backward.
    The tensors the backward reads (attn_mask included) are saved with save_for_backward,
    so changing one in place before the backward is an error, not a wrong gradient."""

    @staticmethod
    def forward(ctx, query, key, value, sinks, attn_mask, options):
        arrays = [_to_numpy(t, n) for t, n in ((query, "query"), (key, "key"), (value, "value"))]
        sinks_np = None if sinks is None else _to_numpy(sinks, "sinks")
        out, lse = fastattn.scaled_dot_product_attention(
            *arrays, _mask_arg(attn_mask), sinks=sinks_np, return_lse=True, **options
        )
        out_t = _to_torch(out)
        ctx.options, ctx.lse = options, lse
        # the optional tensors: saved when they are tensors, kept as they are otherwise
        ctx.optional = [_SAVED if isinstance(x, torch.Tensor) else x for x in (sinks, attn_mask)]
        tensors = [x for x in (sinks, attn_mask) if isinstance(x, torch.Tensor)]
        ctx.save_for_backward(query, key, value, out_t, *tensors)
        return out_t

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        query, key, value, out, *tensors = ctx.saved_tensors
        sinks, attn_mask = (tensors.pop(0) if x is _SAVED else x for x in ctx.optional)
        grads = fastattn.scaled_dot_product_attention_backward(
            _to_numpy(grad_out, "grad_out"),
            _to_numpy(query, "query"),
            _to_numpy(key, "key"),
            _to_numpy(value, "value"),
            _to_numpy(out, "out"),
            ctx.lse,
            _mask_arg(attn_mask),
            sinks=None if sinks is None else _to_numpy(sinks, "sinks"),
            **ctx.options,
        )
        grad_q, grad_k, grad_v = (_to_torch(g) for g in grads[:3])
        grad_sinks = _to_torch(grads[3]) if sinks is not None else None
        return grad_q, grad_k, grad_v, grad_sinks, None, None


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | fastattn.BlockMask | ArrayLike | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    valid_lens: torch.Tensor | ArrayLike | None = None,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | ArrayLike | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` computed by fastattn, with
    gradients.

    A drop-in for PyTorch's function on CPU tensors: the same positional arguments and
    meanings (``attn_mask`` bool = may attend, float = added to the scores; ``is_causal``
    top-left aligned; ``scale`` default ``1 / sqrt(E)``; ``enable_gqa`` required when query
    and key have different head counts), plus fastattn's own options as keywords, with the
    meanings of :func:`fastattn.scaled_dot_product_attention`.

    Parameters
    ----------
    query, key, value : torch.Tensor
        CPU tensors, shape ``(..., Hq, Lq, E)``, ``(..., Hkv, Lk, E)``, ``(..., Hkv, Lk, Ev)``;
        float16, bfloat16 (needs ``ml_dtypes``), float32 or float64; any strides (read in
        place, no copy). Gradients flow to each.
    attn_mask : torch.Tensor, fastattn.BlockMask or array_like, optional
        A constant: a mask that requires grad is refused (no gradient is computed for it).
        A :class:`fastattn.BlockMask` skips the tiles it empties, forward and backward.
    dropout_p : float
        Only 0.0: fastattn has no dropout (``ValueError`` otherwise).
    is_causal, scale, enable_gqa
        As in PyTorch. Unlike PyTorch, ``is_causal`` may be combined with ``attn_mask``
        (the masks combine by AND).
    valid_lens, causal_alignment, window, softcap, alibi_slopes
        fastattn's options (constants; tensors or arrays).
    sinks : torch.Tensor, optional
        Attention-sink logits, one per query head (``(Hq,)`` or broadcastable to
        ``(..., Hq)``); a tensor that requires grad gets its gradient.

    Returns
    -------
    torch.Tensor
        Shape ``(..., Hq, Lq, Ev)``, the inputs' dtype, sharing memory with the NumPy array
        fastattn wrote. A row that may attend no key is zeros (PyTorch's CPU kernel may give
        NaN there), and so are its gradients.

    Notes
    -----
    The forward keeps the output and the log-sum-exp of each row; the backward recomputes
    the attention weights from them, block by block
    (:func:`fastattn.scaled_dot_product_attention_backward`). Threads:
    :func:`fastattn.set_num_threads` (not ``torch.set_num_threads``). The backward is not
    itself differentiable (no double backward). ``torch.compile`` treats the call as opaque
    (a graph break).
    """
    if dropout_p != 0.0:
        raise ValueError(
            f"fastattn.torch: dropout_p must be 0.0 (fastattn has no attention dropout), got "
            f"{dropout_p!r}"
        )
    _check_query_key_value(query, key, value, bool(enable_gqa))
    for name, x in (
        ("attn_mask", attn_mask),
        ("valid_lens", valid_lens),
        ("alibi_slopes", alibi_slopes),
    ):
        _constant(x, name)
    options = {
        "valid_lens": _tensor_arg(valid_lens, "valid_lens"),
        "is_causal": is_causal,
        "causal_alignment": causal_alignment,
        "window": window,
        "scale": scale,
        "softcap": softcap,
        "alibi_slopes": _tensor_arg(alibi_slopes, "alibi_slopes"),
    }
    differentiable = [query, key, value] + ([sinks] if isinstance(sinks, torch.Tensor) else [])
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in differentiable)):
        # inference: no gradient wanted, nothing to save (no lse)
        out = fastattn.scaled_dot_product_attention(
            *(_to_numpy(t, n) for t, n in ((query, "query"), (key, "key"), (value, "value"))),
            _mask_arg(attn_mask),
            sinks=_tensor_arg(sinks, "sinks"),
            **options,
        )
        return _to_torch(out)
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(np.asarray(sinks))
    return _Attention.apply(query, key, value, sinks, attn_mask, options)

"""Argument checks and gradient reductions shared by the attention backwards (the fast
functions in :mod:`fastattn._grad` and :mod:`fastattn._family_grad`, and their twins in
:mod:`fastattn.reference`).

A backward call is the forward's call plus three arrays: ``grad_out`` (the gradient of the
loss with respect to the forward's output), ``out`` and ``lse`` (what the forward returned
with ``return_lse=True``). The forward's own arguments go through the forward's checks
(:func:`fastattn._validation.sdpa_args` / ``varlen_args``), so a backward rejects exactly
what its forward rejects, with the same messages.
"""

from __future__ import annotations

import numpy as np

from fastattn._compute import silverman_bandwidth_grad
from fastattn._validation import float_array, masked_softmax_args, sdpa_args, varlen_args


def _no_int8(key: object, value: object, fn: str) -> None:
    for name, a in (("key", key), ("value", value)):
        if isinstance(a, np.ndarray) and a.dtype == np.int8:
            raise TypeError(
                f"{fn}: {name} is int8 (a quantised cache), which has no gradient; pass "
                f"{name} as float16, bfloat16, float32 or float64"
            )


def _state(x: object, name: str, shape: tuple, ref: str) -> np.ndarray:
    """grad_out / out / lse: a float array of exactly the forward's ``shape``."""
    a = float_array(x, name, min_ndim=0)
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have the shape of {ref}, {tuple(shape)}, got {a.shape}")
    return a


def backward_states(grad_out, out, lse, out_shape: tuple):
    """(grad_out, out, lse), checked against the forward's output shape ``out_shape``."""
    g = _state(grad_out, "grad_out", out_shape, "the forward's output")
    o = _state(out, "out", out_shape, "the forward's output")
    lse_ = _state(lse, "lse", out_shape[:-1], "the forward's output without its last axis")
    return g, o, lse_


def _split(call: dict) -> tuple:
    """A backward's ``call`` (its arguments by name, :func:`fastattn._dispatch.forwarded`)
    split into (grad_out, out, lse) and the forward's arguments (the same dict, less those
    and num_threads)."""
    states = call.pop("grad_out"), call.pop("out"), call.pop("lse")
    del call["num_threads"]
    return states, call


def sdpa_backward_args(call: dict):
    """(SdpaArgs, grad_out, out, lse) of a checked scaled_dot_product_attention_backward
    call; ``call``: its arguments by name (:func:`fastattn._dispatch.forwarded`)."""
    _no_int8(call["key"], call["value"], "scaled_dot_product_attention_backward")
    states, forward = _split(dict(call))
    args = sdpa_args(**forward)
    return (args, *backward_states(*states, args.out_shape))


def varlen_backward_args(call: dict):
    """(VarlenArgs, grad_out, out, lse) of a checked varlen_attention_backward call;
    ``call``: its arguments by name."""
    _no_int8(call["key"], call["value"], "varlen_attention_backward")
    states, forward = _split(dict(call))
    args = varlen_args(**forward)
    return (args, *backward_states(*states, args.out_shape))


def sum_to_shape(g: np.ndarray, shape: tuple) -> np.ndarray:
    """``g`` summed over the axes that broadcasting added to an array of ``shape``: its
    extra leading axes, and the axes where ``shape`` has size 1 and ``g`` does not."""
    if g.shape == shape:  # nothing was broadcast (the common call)
        return g
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    elif lead < 0:  # ``shape`` has leading size-1 axes that g lacks
        g = g.reshape((1,) * -lead + g.shape)
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a == 1 and b != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def input_grad(g: np.ndarray, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The gradient of one attention input from its per-query-head gradient ``g`` (batch +
    (Hq, L, E)): summed over each GQA/MQA group of query heads (Hq -> the input's heads)
    and over the batch dims the input was broadcast along, in the input's ``shape`` (as
    the caller passed it) and ``dtype``."""
    shape = tuple(shape)
    shape3 = shape if len(shape) >= 3 else (1,) + shape
    hq, heads = g.shape[-3], shape3[-3]
    if heads != hq and heads:
        g = g.reshape(g.shape[:-3] + (heads, hq // heads) + g.shape[-2:]).sum(axis=-3)
    return sum_to_shape(g, shape3).reshape(shape).astype(dtype, copy=False)


def sinks_grad(per_head: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """The gradient of ``sinks`` (as the caller passed them) from its per-head gradient
    (batch..., Hq)."""
    return sum_to_shape(per_head, sinks.shape).astype(sinks.dtype, copy=False)


# --------------------------------------------------------------------------------------
# The family's backwards (fastattn._family_grad and their twins)


def grad_out_array(grad_out, shape: tuple) -> np.ndarray:
    """The incoming gradient of a family backward: a float array of the forward's output
    ``shape``."""
    return _state(grad_out, "grad_out", shape, "the forward's output")


def softmax_backward_args(grad, weights, valid_lens, mask, axis):
    """(SoftmaxArgs of ``weights``, grad) of a masked_softmax_backward call: ``weights`` is
    the forward's result, checked as the forward checks ``x`` (and named ``weights``)."""
    w = float_array(weights, "weights", min_ndim=1)
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -w.ndim <= axis < w.ndim:
        raise ValueError(f"axis {axis} is out of bounds for weights with {w.ndim} dimensions")
    g = _state(grad, "grad", w.shape, "weights")
    return masked_softmax_args(w, valid_lens, mask, axis, None), g


def grad_like(g: np.ndarray, like: object) -> np.ndarray:
    """A gradient in the dtype of the input ``like`` as the caller passed it."""
    return g.astype(np.asarray(like).dtype, copy=False)


def unread_zeroed(x: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """``x`` (rows of features) with the rows whose projection gradient ``grad`` is all 0
    set to 0: rows no weight reaches (hidden keys, rows that see no key) are not read, so
    a NaN or inf there stays out of the weights' gradients."""
    return np.where((grad == 0).all(axis=-1, keepdims=True), x.dtype.type(0), x)


def regression_grads(ra, gxq, gxk, gy, gh, inputs: tuple, bandwidth) -> tuple:
    """nadaraya_watson_backward's result from the per-batch-entry gradients (``gh``: of
    each entry's bandwidth, ``ra.batch``): x_query, x_keys, y_values (``inputs``, as the
    caller passed them) in their shapes and dtypes, then the bandwidth's -- a float for a
    scalar, an array of its shape for an array, None for "silverman", whose ``h`` is a
    function of ``x_keys``: its gradient goes to ``x_keys`` through the rule."""
    gxk = sum_to_shape(gxk, ra.x_keys.shape)
    grad_h = None
    gh = gh.astype(np.float64)
    if isinstance(bandwidth, str):
        gxk = gxk + silverman_bandwidth_grad(ra.x_keys, sum_to_shape(gh, ra.x_keys.shape[:-2]))
    elif np.ndim(bandwidth) == 0:
        grad_h = float(gh.sum())
    else:
        grad_h = sum_to_shape(gh, np.shape(bandwidth))
    shaped = (
        sum_to_shape(gxq, ra.x_query.shape),
        gxk,
        sum_to_shape(gy, ra.y_values.shape),
    )
    return (
        *(grad_like(g.reshape(np.shape(a)), a) for g, a in zip(shaped, inputs, strict=True)),
        grad_h,
    )

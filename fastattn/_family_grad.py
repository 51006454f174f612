"""Gradients of the attention family: ``masked_softmax_backward``,
``additive_attention_backward`` and ``nadaraya_watson_backward``.

Each checks its call with the forward's own validation (so a backward refuses what its
forward refuses, with the same messages) plus its incoming gradient, and is computed by
:mod:`fastattn._cpu`. NumPy arrays only: a Dask or CuPy array is a ``TypeError``. The rules
are docs/semantics.md#gradients-of-the-family; the float64 twins are in
:mod:`fastattn.reference`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from fastattn import _cpu, _dispatch, _threads
from fastattn._grad_args import grad_out_array, softmax_backward_args
from fastattn._validation import additive_args, regression_args

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray


def _numpy_only(fn: str, arguments: dict) -> None:
    """A ``TypeError`` if any of a call's ``arguments`` (``locals()`` on entry) is a Dask or
    CuPy array."""
    kind = _dispatch.backend(*arguments.values())
    if kind is not None:
        raise TypeError(
            f"{fn} takes NumPy arrays only (got a {'Dask' if kind == 'dask' else 'CuPy'} "
            "array): compute the forward's inputs first"
        )


def masked_softmax_backward(
    grad: ArrayLike,
    weights: ArrayLike,
    valid_lens: ArrayLike | None = None,
    *,
    mask: ArrayLike | None = None,
    axis: int = -1,
    num_threads: int | None = None,
) -> NDArray[np.floating]:
    """Gradient of :func:`fastattn.masked_softmax` with respect to its ``x``.

    ``grad_x = w * (grad - sum(w * grad))`` over each row's kept entries (the sum along
    ``axis``), and exactly 0 at the entries that ``valid_lens`` and ``mask`` do not keep
    (they are constants of the forward, which never reads them: neither does this). A
    fully masked row -- and a row that keeps only ``-inf`` entries -- has weights 0 and
    gets gradient 0; a NaN among a row's kept weights or gradients makes its kept entries
    NaN.

    Parameters
    ----------
    grad : array_like, float, ``weights``' shape
        The gradient of the loss with respect to masked_softmax's result.
    weights : array_like, float16/32/64, at least 1-D
        masked_softmax's result (``fastattn.masked_softmax(x, valid_lens, mask=mask,
        axis=axis)``).
    valid_lens, mask, axis
        As given to the forward.
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).

    Returns
    -------
    ndarray of ``weights``' shape and dtype (``x``'s): float16 is computed in float32.
    Bit-identical for any thread count.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> x = np.array([[1.0, 2.0, 3.0, 4.0]])
    >>> w = fastattn.masked_softmax(x, np.array([2]))
    >>> g = fastattn.masked_softmax_backward(np.array([[1.0, 0.0, 0.0, 9.0]]), w, np.array([2]))
    >>> g.round(4)  # the last two entries are not kept: 0
    array([[ 0.1966, -0.1966,  0.    ,  0.    ]])
    >>> abs(float(g.sum())) < 1e-15  # the weights sum to 1 whatever x is: so does nothing
    True
    """
    _numpy_only("masked_softmax_backward", locals())
    args, g = softmax_backward_args(grad, weights, valid_lens, mask, axis)
    return _cpu.masked_softmax_backward(args, g, _threads.resolve(num_threads))


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
    """Gradients of :func:`fastattn.additive_attention` with respect to its six inputs.

    With ``t[i, j] = tanh(query[i] @ w_q + key[j] @ w_k)``, ``s = t @ w_v`` (+ a float
    mask), ``P`` the masked softmax of ``s`` and ``out = P @ value``::

        dP = grad_out @ value^T,  dS = P * (dP - rowsum(grad_out * out))
        dt[i, j] = dS[i, j] * (1 - t[i, j]^2) * w_v
        grad_query = (sum_j dt[i, j]) @ w_q^T,  grad_w_q = query^T @ sum_j dt[i, j]
        grad_key   = (sum_i dt[i, j]) @ w_k^T,  grad_w_k = key^T @ sum_i dt[i, j]
        grad_value = P^T @ grad_out,            grad_w_v = sum_ij dS[i, j] t[i, j]

    Masks, ``valid_lens``, causal and window are constants; keys a row does not attend
    pass it no gradient (and are not read for it), and a row that attends no key gets
    gradient 0. Each gradient has the shape and dtype of its input as passed: summed over
    the leading dims that input was broadcast along and, for key and value, over the
    query heads of a GQA/MQA group; float16 is computed in float32.

    Parameters
    ----------
    grad_out : array_like, float, the forward output's shape
    query, key, value, w_q, w_k, w_v, attn_mask, valid_lens, is_causal, causal_alignment,
    window
        Exactly as given to :func:`fastattn.additive_attention`.
    num_threads : int, optional

    How it is computed: the forward kernel (which returns the weights ``P``), NumPy's
    matrix products for ``dP``, ``grad_value`` and the projections, and a C++ kernel for
    the tanh chain (the ``O(Lq * Lk * hidden)`` part; pairs with ``dS = 0`` are skipped).
    Extra memory is ``O(Lq * Lk)`` (``P`` and ``dS``). Deterministic: bit-identical for any
    thread count; the GIL is released in the kernels.

    Returns
    -------
    ``(grad_query, grad_key, grad_value, grad_w_q, grad_w_k, grad_w_v)``

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q, k = rng.standard_normal((3, 4)), rng.standard_normal((5, 2))
    >>> v = rng.standard_normal((5, 2))
    >>> w_q, w_k, w_v = rng.standard_normal((4, 8)), rng.standard_normal((2, 8)), np.ones(8)
    >>> out = fastattn.additive_attention(q, k, v, w_q, w_k, w_v, is_causal=True)
    >>> grads = fastattn.additive_attention_backward(
    ...     np.ones_like(out), q, k, v, w_q, w_k, w_v, is_causal=True)
    >>> [g.shape for g in grads]
    [(3, 4), (5, 2), (5, 2), (4, 8), (2, 8), (8,)]
    >>> grads[2][3:]  # keys 3 and 4 are seen by no row (causal, 3 queries)
    array([[0., 0.],
           [0., 0.]])
    >>> ref = fastattn.reference.additive_attention_backward(
    ...     np.ones_like(out), q, k, v, w_q, w_k, w_v, is_causal=True)
    >>> all(np.allclose(a, b) for a, b in zip(grads, ref))
    True
    """
    _numpy_only("additive_attention_backward", locals())
    args, ws = additive_args(
        query, key, value, w_q, w_k, w_v, attn_mask, valid_lens, is_causal, causal_alignment, window
    )
    go = grad_out_array(grad_out, args.out_shape)
    return _cpu.additive_backward(
        args, ws, go, (query, key, value, w_q, w_k, w_v), _threads.resolve(num_threads)
    )


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
    """Gradients of :func:`fastattn.nadaraya_watson` with respect to ``x_query``,
    ``x_keys``, ``y_values`` and the bandwidth.

    With ``d = x_i - x_j``, ``r = ||d||``, ``u = r / h``, ``K_ij = K(u)``,
    ``S_i = sum_j K_ij`` and ``f_i = sum_j K_ij y_j / S_i``::

        dL/dK_ij = grad_out_i . (y_j - f_i) / S_i
        dK/dx_i = K'(u) / h * d / r = -dK/dx_j,   dK/dh = -K'(u) * r / h^2
        grad_y_values = W^T grad_out             (W the weights)

    The gaussian runs through its softmax form (no underflow).

    Parameters
    ----------
    grad_out : array_like, float, the forward output's shape
    x_query, x_keys, y_values, kernel, bandwidth
        Exactly as given to :func:`fastattn.nadaraya_watson`.
    num_threads : int, optional

    Returns
    -------
    ``(grad_x_query, grad_x_keys, grad_y_values, grad_bandwidth)``: the first three in
    their inputs' shapes and dtypes (summed over broadcast leading dims). ``grad_bandwidth``
    is a float for a scalar bandwidth, an array of the bandwidth's shape (float64) for an
    array bandwidth (summed over the batch dims it was broadcast along), and None for
    ``bandwidth="silverman"``: there ``h`` is a function of ``x_keys``, and its derivative
    (through the branch of ``min(std, IQR / 1.34)`` taken, the quartiles' interpolated
    order statistics) is part of ``grad_x_keys``.

    How it is computed: the forward kernel (weights and output), NumPy's matrix products
    for ``grad_out_i . y_j`` and ``grad_y_values``, and a C++ kernel for the distance chain
    (one pass owns each query row, one each key row). Extra memory ``O(Lq * Lk)``;
    bit-identical for any thread count; the GIL is released in the kernels.

    Where the kernel is not differentiable (docs/semantics.md#gradients-of-the-family):
    at the edge of a compact support (``r = h``) the derivative from inside is used
    (triangular ``-1 / h``, epanechnikov ``-1.5 / h`` per unit of ``r``); the boxcar's
    jump there is ignored, so its gradients for ``x_query``, ``x_keys`` and the bandwidth
    are 0 (the true derivative is 0 everywhere else); the triangular kernel's tip
    (``r = 0``, a query on a key) contributes 0. A query where the estimator is undefined
    (NaN: no key in the support) gets a NaN ``grad_x_query`` row and passes no gradient to
    the keys, values or bandwidth.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> x = np.linspace(0.0, 3.0, 7)
    >>> y = np.sin(x)
    >>> gq, gk, gy, gh = fastattn.nadaraya_watson_backward(
    ...     np.ones(2), np.array([1.0, 2.0]), x, y, bandwidth=0.5)
    >>> gq.shape, gk.shape, gy.shape, type(gh).__name__
    ((2,), (7,), (7,), 'float')
    >>> ref = fastattn.reference.nadaraya_watson_backward(
    ...     np.ones(2), np.array([1.0, 2.0]), x, y, bandwidth=0.5)
    >>> bool(np.allclose(gq, ref[0]) and np.isclose(gh, ref[3]))
    True
    """
    _numpy_only("nadaraya_watson_backward", locals())
    ra = regression_args(x_query, x_keys, y_values, kernel, bandwidth)
    go = grad_out_array(grad_out, ra.out_shape)
    return _cpu.nadaraya_watson_backward(
        ra, go, (x_query, x_keys, y_values), bandwidth, _threads.resolve(num_threads)
    )

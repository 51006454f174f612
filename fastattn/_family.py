"""The attention family: masked softmax, additive attention, the general
``Normalize(F(q, K)) V`` form, and Nadaraya-Watson kernel regression.

Each function picks its backend once (:mod:`fastattn._dispatch`): Dask and CuPy calls are
handed on as they were made; a NumPy call is checked with :mod:`fastattn._validation` (as
are the NumPy twins in :mod:`fastattn.reference`) and computed by :mod:`fastattn._cpu`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from fastattn import _cpu, _dispatch, _threads
from fastattn._checks import check_flag
from fastattn._validation import (
    additive_args,
    attention_spec,
    check_out,
    masked_softmax_args,
    regression_args,
    set_family_sinks,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray


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

    d2l's ``masked_softmax``, generalised, computed by one vectorised pass per row (read
    ``x`` once, write the result once).

    Parameters
    ----------
    x : array_like, float16/32/64, at least 1-D
        float16 is computed in float32 and returned as float16. Any strides.
    valid_lens : array_like of int, optional
        Entry ``j`` (along ``axis``) is kept iff ``j < valid_len``. Its shape is a leading
        prefix of the rows' shape (``x``'s shape without ``axis``), size-1 axes
        broadcasting: for ``x`` of shape ``(B, Lq, Lk)``, ``(B,)`` is one length per batch
        entry and ``(B, Lq)`` one per row (d2l's two forms). Values in ``[0, x.shape[axis]]``.
        Entries past the length are never read (they may hold NaN).
    mask : array_like of bool, optional
        Broadcastable to ``x``; True = keep. Combines with ``valid_lens`` by AND.
    axis : int, default -1
    out : ndarray, optional
        Written with the result and returned; ``x``'s shape and result dtype.
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).

    A row with nothing kept (or only ``-inf`` kept) is all zeros; huge logits are safe (the
    row max is subtracted); a NaN or ``+inf`` among the kept entries makes the row NaN.
    Bit-identical for any thread count. The GIL is released while computing.

    Returns
    -------
    ndarray of ``x``'s shape and dtype (float16 stays float16).

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> x = np.zeros((2, 2, 4), np.float32)
    >>> fastattn.masked_softmax(x, np.array([2, 3]))[:, 0]
    array([[0.5       , 0.5       , 0.        , 0.        ],
           [0.33333334, 0.33333334, 0.33333334, 0.        ]], dtype=float32)
    >>> fastattn.masked_softmax(x, mask=np.array([True, False, True, False]))[0, 0]
    array([0.5, 0. , 0.5, 0. ], dtype=float32)
    """
    kind = _dispatch.backend(x, valid_lens, mask, out)
    if kind is not None:  # Dask: a lazy graph; CuPy: computed on the GPU
        return _dispatch.engine(kind).masked_softmax(
            **_dispatch.forwarded(masked_softmax, locals())
        )
    args = masked_softmax_args(x, valid_lens, mask, axis, out)
    return _cpu.masked_softmax(args, out, _threads.resolve(num_threads))


# --------------------------------------------------------------------------------------
# Attention


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
    """Additive (Bahdanau) attention: ``softmax(w_v . tanh(q W_q + k W_k) + mask) v``.

    ``score[i, j] = w_v . tanh(query[i] @ w_q + key[j] @ w_k)``, no scaling (d2l's
    ``AdditiveAttention``, without dropout). Every query and key row is projected once;
    the kernel then streams over key blocks with a vectorised tanh and an online softmax,
    so memory is ``O((Lq + Lk) * hidden)`` -- the ``Lq x Lk x hidden`` tensor of the
    NumPy formula is never formed (nor ``Lq x Lk``, unless ``return_weights=True``).

    Parameters
    ----------
    query : array_like, shape ``(..., Lq, Dq)`` (or ``(..., H, Lq, Dq)``)
    key : array_like, shape ``(..., Lk, Dk)``
    value : array_like, shape ``(..., Lk, Dv)``
        Same layout rules as :func:`fastattn.scaled_dot_product_attention` (leading dims
        broadcast; axis -3 may be grouped-query heads), except that ``Dq`` and ``Dk``
        may differ.
    w_q : array_like, shape ``(Dq, hidden)``
    w_k : array_like, shape ``(Dk, hidden)``
    w_v : array_like, shape ``(hidden,)``
        float16/32/64; all six arrays promote together with ``np.result_type``; float16 is
        computed in float32.
    attn_mask, valid_lens, is_causal, causal_alignment, window
        Masks exactly as in :func:`fastattn.scaled_dot_product_attention` (a float mask is
        added to the scores); they combine by AND.
    return_weights : bool, default False
        Also return the attention weights, shape ``(..., Lq, Lk)``.
    out : ndarray, optional
    num_threads : int, optional

    float32 evaluates tanh with a rational approximation (at most 3.3 ulp), float64 with
    an expm1-based one (a few ulp). A row that may attend no key returns zeros.
    Bit-identical for any thread count; the GIL is released while computing.

    Returns
    -------
    output ``(..., Lq, Dv)``, or ``(output, weights)``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 5, 8), dtype=np.float32)
    >>> k = rng.standard_normal((2, 7, 6), dtype=np.float32)
    >>> v = rng.standard_normal((2, 7, 4), dtype=np.float32)
    >>> w_q, w_k = rng.standard_normal((8, 16)), rng.standard_normal((6, 16))
    >>> w_v = rng.standard_normal(16)
    >>> out, w = fastattn.additive_attention(q, k, v, w_q.astype(np.float32),
    ...     w_k.astype(np.float32), w_v.astype(np.float32), valid_lens=np.array([3, 7]),
    ...     return_weights=True)
    >>> out.shape, w.shape, bool(np.allclose(w.sum(-1), 1)), bool((w[0, :, 3:] == 0).all())
    ((2, 5, 4), (2, 5, 7), True, True)
    """
    kind = _dispatch.backend(query, key, value, w_q, w_k, w_v, attn_mask, valid_lens, out)
    if kind is not None:  # Dask: a lazy graph; CuPy: computed on the GPU
        return _dispatch.engine(kind).additive_attention(
            **_dispatch.forwarded(additive_attention, locals())
        )
    args, ws = additive_args(
        query, key, value, w_q, w_k, w_v, attn_mask, valid_lens, is_causal, causal_alignment, window
    )
    want_weights = check_flag(return_weights, "return_weights")
    threads = _threads.resolve(num_threads)
    if out is not None:
        check_out(
            out, args.out_shape, args.result_dtype, {**args.named_inputs(), **ws.named_inputs()}
        )
    return _cpu.additive(args, ws, "softmax", None, want_weights, out, threads)


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
    """Attention in its general form, ``Normalize(F(q, K)) V``, with a choice of F and
    Normalize.

    Parameters
    ----------
    query, key, value : array_like
        Layout as in :func:`fastattn.scaled_dot_product_attention`: ``(..., Hq, Lq, E)``,
        ``(..., Hkv, Lk, E)``, ``(..., Hkv, Lk, Ev)``, leading dims broadcast, GQA heads.
        Query and key features may differ for ``"general"`` and ``"additive"``.
    attn_mask, valid_lens, is_causal, causal_alignment, window
        Masks as in SDPA (a float mask is added to the scores F); they combine by AND.
    score : str, default "scaled_dot"
        ``"dot"``: ``q . k``. ``"scaled_dot"``: ``scale * q . k`` (``scale=``, default
        ``1/sqrt(E)``). ``"general"`` (Luong): ``q W k^T`` (``weight=`` of shape
        ``(Eq, Ek)``). ``"cosine"``: ``cos(q, k) / temperature`` (``temperature=``,
        default 1; a zero vector has cosine 0 with everything). ``"gaussian"``:
        ``-||q - k||^2 / (2 h^2)`` (``bandwidth=`` h, default 1). ``"additive"``
        (Bahdanau): ``w_v . tanh(q w_q + k w_k)`` (``w_q=, w_k=, w_v=`` as in
        :func:`additive_attention`). A parameter of another score is an error.
    normalize : str, default "softmax"
        ``"softmax"``; ``"hardmax"``: all weight on the highest-scoring visible key (the
        first one on ties); ``"topk"``: a softmax over the ``top_k`` highest visible scores
        (ties at the k-th place keep the first keys), the rest weight 0.
    top_k : int >= 1
        Keys kept per row by ``normalize="topk"`` (required there, refused elsewhere).
    sinks : array_like of float, optional
        With ``normalize="softmax"``: one sink logit per query head, as in
        :func:`fastattn.scaled_dot_product_attention` (an extra key of value zero in each
        row's denominator). Not with ``score="gaussian"``.
    return_weights : bool, default False
        Also return the weights, shape ``(..., Hq, Lq, Lk)``.
    out : ndarray, optional
    num_threads : int, optional

    What runs where: dot, scaled_dot, general, cosine and gaussian are all dot products
    for the kernels -- general projects q by W first (in the core), cosine normalises the
    rows of q and k (NumPy, float64) and scales by ``1 / temperature``, gaussian is
    ``q . k / h^2`` plus the per-key bias ``-||k||^2 / (2 h^2)`` passed as a float mask
    broadcast along the rows (zero-copy; the ``-||q||^2 / (2 h^2)`` term is constant
    along a row and cancels in every normaliser). With softmax (or top-k keeping every
    key) they run in the blocked SDPA kernel; hardmax and top-k run in a blocked C++
    kernel that keeps each row's k best keys in a heap while the key blocks stream past
    and reads only the kept keys' values. additive runs in the additive-attention kernel
    with either normaliser. No ``Lq x Lk`` matrix is formed unless weights are returned.

    Scores of ``-inf`` count as masked; a row with no visible key returns zeros; a NaN
    score makes its row NaN. Gaussian scores through the expansion carry an absolute
    error of about ``eps * (||q||^2 + ||k||^2) / h^2``. Bit-identical for any thread
    count; the GIL is released while computing.

    Returns
    -------
    output ``(..., Hq, Lq, Ev)``, or ``(output, weights)``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> q = np.array([[1.0, 0.0], [0.0, 2.0]])
    >>> k = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    >>> v = np.array([[10.0], [20.0], [30.0]])
    >>> fastattn.attention(q, k, v, score="dot", normalize="hardmax")
    array([[10.],
           [30.]])
    >>> out, w = fastattn.attention(q, k, v, score="cosine", normalize="topk", top_k=2,
    ...                             return_weights=True)
    >>> w.round(3)  # cosines (1, 0, 0) and (0, 1, 1): ties at the k-th place keep the first
    array([[0.731, 0.269, 0.   ],
           [0.   , 0.5  , 0.5  ]])
    """
    if _dispatch.backend(query, key, value, attn_mask, valid_lens, out, sinks) == "dask":
        return _dispatch.engine("dask").attention(**_dispatch.forwarded(attention, locals()))
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
    threads = _threads.resolve(num_threads)
    if out is not None:
        check_out(out, args.out_shape, args.result_dtype, spec.named_inputs())
    return _cpu.attention(spec, want_weights, out, threads)


# --------------------------------------------------------------------------------------
# Kernel regression


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
    """Nadaraya-Watson kernel regression, as attention pooling.

    ``f(x) = sum_j K(||x - x_j|| / h) y_j / sum_j K(||x - x_j|| / h)``.

    Parameters
    ----------
    x_query : array_like, shape ``(Lq,)`` (scalar features) or ``(..., Lq, D)``
    x_keys : array_like, shape ``(Lk,)`` or ``(..., Lk, D)``
    y_values : array_like, shape ``(Lk,)`` or ``(..., Lk, Dy)``
        float16/32/64 (promoted together; float16 computed in float32). Leading dims
        broadcast.
    kernel : str, default "gaussian"
        ``"gaussian"`` ``exp(-u^2 / 2)`` (computed as a softmax of ``-u^2 / 2``, so it
        never underflows to 0/0), ``"boxcar"`` ``1 if |u| <= 1``, ``"triangular"``
        ``max(1 - |u|, 0)``, ``"epanechnikov"`` ``3/4 max(1 - u^2, 0)``.
    bandwidth : float > 0, array of them, or "silverman", default 1.0
        ``h``; an array broadcasts over the leading (batch) dims. ``"silverman"``: Silverman's
        rule of thumb from each batch entry's ``x_keys`` (``0.9 min(std, IQR / 1.34)
        n^(-1/5)`` for scalar features; ``(4 / (D + 2))^(1 / (D + 4)) n^(-1 / (D + 4))``
        times the mean per-feature std for ``D > 1``; sample std, ``n = Lk``).
    return_weights : bool, default False
        Also return the weights, shape ``(..., Lq, Lk)``.
    out : ndarray, optional
    num_threads : int, optional

    A query with no key inside a compact kernel's support gets NaN (0/0: the estimator is
    undefined there), as does every query when there are no keys; keys at a NaN distance
    are outside every compact support. Distances are computed from differences (never
    the dot-product expansion). Bit-identical for any thread count; GIL released.

    Returns
    -------
    output ``(..., Lq)`` (scalar ``y_values``) or ``(..., Lq, Dy)``; or ``(output, weights)``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> x = np.array([0.0, 1.0, 2.0, 3.0])
    >>> y = np.array([0.0, 1.0, 4.0, 9.0])
    >>> fastattn.nadaraya_watson(np.array([1.0, 1.5, 10.0]), x, y, kernel="boxcar")
    array([1.66666667, 2.5       ,        nan])
    >>> fastattn.nadaraya_watson(np.array([1.5]), x, y, kernel="gaussian", bandwidth=0.01)
    array([2.5])
    """
    if _dispatch.backend(x_query, x_keys, y_values, out) == "dask":
        return _dispatch.engine("dask").nadaraya_watson(
            **_dispatch.forwarded(nadaraya_watson, locals())
        )
    ra = regression_args(x_query, x_keys, y_values, kernel, bandwidth)
    want_weights = check_flag(return_weights, "return_weights")
    threads = _threads.resolve(num_threads)
    if out is not None:
        check_out(
            out,
            ra.out_shape,
            ra.result_dtype,
            {"x_query": x_query, "x_keys": x_keys, "y_values": y_values},
        )

    return _cpu.nadaraya_watson(ra, want_weights, out, threads)

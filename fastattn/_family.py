"""The attention family: masked softmax, additive attention, the general
``Normalize(F(q, K)) V`` form, and Nadaraya-Watson kernel regression.

Each function checks its arguments with :mod:`fastattn._validation` (as do the NumPy twins
in :mod:`fastattn.reference`), prepares and finishes with :mod:`fastattn._prepare`, and
computes in :mod:`fastattn._core` with the GIL released. The dot-product scores (dot,
scaled_dot, general, cosine, gaussian) run in the SDPA kernel, like
:func:`fastattn.scaled_dot_product_attention`, once :mod:`fastattn._compute` has rewritten
them as dot products.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from fastattn import _core, _cuda, _dispatch, _threads
from fastattn._compute import gaussian_key_bias, infinitely_far, project, unit_rows
from fastattn._dtypes import is_bfloat16
from fastattn._prepare import (
    attention_buffers,
    attention_masks,
    attention_result,
    contiguous,
    extra,
    finish,
    head_values,
    item_aligned,
    kernel_ready,
    pack,
    result_buffer,
    sdpa_storage_dtype,
    shared_options,
    softmax_masks,
    storage_dtype,
    to_batch,
    weights_dtype,
)
from fastattn._validation import (
    KERNELS,
    additive_args,
    attention_spec,
    check_flag,
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
    if kind == "dask":  # a lazy graph whose blocks come back here
        from fastattn import _dask

        return _dask.masked_softmax(
            x, valid_lens, mask=mask, axis=axis, out=out, num_threads=num_threads
        )
    if kind == "cupy":  # CuPy arrays: computed on the GPU
        return _cuda.masked_softmax(
            x, valid_lens, mask=mask, axis=axis, out=out, num_threads=num_threads
        )
    args = masked_softmax_args(x, valid_lens, mask, axis, out)
    threads = _threads.resolve(num_threads)

    # float16/bfloat16 go to the kernel as they are (it widens them row by row).
    dtype = storage_dtype(args.x.dtype, args.compute_dtype)
    ax = args.axis
    xk = item_aligned(args.x, dtype)
    keep, lens = softmax_masks(args)
    result, in_place = result_buffer(out, args.x.shape, dtype, any_layout=True)

    _core.masked_softmax(
        x=np.moveaxis(xk, ax, -1),
        out=np.moveaxis(result, ax, -1),
        mask=None if keep is None else np.moveaxis(keep, ax, -1),
        valid_lens=lens,
        num_threads=threads,
    )

    return finish(result, args.x.shape, args.result_dtype, out, in_place)


# --------------------------------------------------------------------------------------
# Attention


def _selection(normalize: str, top_k: int | None, num_keys: int) -> tuple[int, int, bool]:
    """(kernel normaliser: 0 softmax / 1 select, top_k, hardmax). top-k keeping every key is
    the softmax."""
    if normalize == "softmax" or (normalize == "topk" and top_k >= num_keys):
        return 0, 1, False
    if normalize == "hardmax":
        return 1, 1, True
    return 1, top_k, False


def _additive(args, weights_in, normalize, top_k, want_weights, out, threads):
    """Prepare, run the additive kernel, finish: additive_attention and
    attention(score="additive")."""
    # float16/bfloat16 q/k/v go to the kernel as they are (it widens them as it reads them);
    # the projection weights are in the compute dtype.
    dtype, batch = args.compute_dtype, args.batch
    storage = sdpa_storage_dtype(args)
    q = to_batch(kernel_ready(args.query, storage), batch)
    k = to_batch(kernel_ready(args.key, storage), batch)
    v = to_batch(kernel_ready(args.value, storage), batch)
    wq, wk, wv = (contiguous(w, dtype) for w in (weights_in.w_q, weights_in.w_k, weights_in.w_v))
    result, in_place, _, weights = attention_buffers(args, out, False, want_weights, storage)
    normalizer, k_keep, hardmax = _selection(normalize, top_k, args.key.shape[-2])

    _core.additive(
        query=q,
        key=k,
        value=v,
        out=result,
        weights=weights,
        sinks=head_values(args)[0],
        w_q=wq,
        w_k=wk,
        w_v=wv,
        normalizer=normalizer,
        top_k=k_keep,
        hardmax=hardmax,
        **shared_options(args, threads),
    )

    return attention_result(args, out, result, in_place, None, weights)


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
    if kind == "dask":  # a lazy graph whose blocks come back here
        from fastattn import _dask

        return _dask.additive_attention(
            query,
            key,
            value,
            w_q,
            w_k,
            w_v,
            attn_mask,
            valid_lens=valid_lens,
            is_causal=is_causal,
            causal_alignment=causal_alignment,
            window=window,
            return_weights=return_weights,
            out=out,
            num_threads=num_threads,
        )
    if kind == "cupy":
        return _cuda.additive_attention(  # CuPy arrays: computed on the GPU
            query,
            key,
            value,
            w_q,
            w_k,
            w_v,
            attn_mask,
            valid_lens=valid_lens,
            is_causal=is_causal,
            causal_alignment=causal_alignment,
            window=window,
            return_weights=return_weights,
            out=out,
            num_threads=num_threads,
        )
    args, ws = additive_args(
        query, key, value, w_q, w_k, w_v, attn_mask, valid_lens, is_causal, causal_alignment, window
    )
    want_weights = check_flag(return_weights, "return_weights")
    threads = _threads.resolve(num_threads)
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
    return _additive(args, ws, "softmax", None, want_weights, out, threads)


def _family_storage(spec, normalizer: int, sixteen: np.dtype) -> np.dtype:
    """The dtype q/k/v reach the kernels in for a dot-product score: float16/bfloat16 as
    stored (``sixteen``, sdpa_storage_dtype's) where the kernels read them without changing
    the arithmetic, else the compute dtype (a float32 copy). dot/scaled_dot: as stored,
    so the softmax is scaled_dot_product_attention on those arrays (bfloat16 by its rule,
    vdpbf16ps on AVX512-BF16) and hardmax/top-k widen in the select kernel. gaussian: as
    stored where widening is exact -- float16, or bfloat16 under hardmax/top-k -- but a
    bfloat16 softmax keeps the copy (the SDPA bfloat16 kernel would round P and the
    products, unlike the float32 arithmetic gaussian's bias is formed in). general
    projects q into a new float32 array, which k must match; cosine's unit rows are a new
    array in any dtype."""
    if spec.score in ("dot", "scaled_dot"):
        return sixteen
    if spec.score == "gaussian" and (normalizer == 1 or not is_bfloat16(sixteen)):
        return sixteen
    return spec.args.compute_dtype


def _dot_operands(spec, threads, storage):
    """(q, k, float mask) of a dot-product score, for the SDPA and select kernels: cosine
    normalises the rows of q and k, general projects q by W, gaussian adds the per-key
    bias -||k||^2 / (2 h^2) to the float mask (broadcast along the rows, zero-copy; the
    -||q||^2 term is constant along a row and cancels in every normaliser). ``storage``: the
    dtype of plain dot-product q and k (a 16-bit float the kernel widens, or the compute
    dtype)."""
    args = spec.args
    dtype = args.compute_dtype
    if spec.score == "cosine":
        q = kernel_ready(unit_rows(args.query).astype(dtype), dtype)
        k = kernel_ready(unit_rows(args.key).astype(dtype), dtype)
    else:
        q, k = kernel_ready(args.query, storage), kernel_ready(args.key, storage)
    if spec.score == "general":
        q = project(q, spec.weight, dtype, threads)
    bool_mask, float_mask, lens = attention_masks(args)
    if spec.score == "gaussian":
        bias = gaussian_key_bias(args.key, spec.bandwidth)  # (..., Hkv, Lk)
        group = args.query.shape[-3] // max(args.key.shape[-3], 1)
        if group > 1:
            bias = np.repeat(bias, group, axis=-2)
        bias = bias.astype(dtype)[..., None, :]  # a row of biases per head
        # A row with an infinite entry (and no NaN) is infinitely far from every other: such
        # a key scores -inf (its bias already is), such a query sees no key, as with
        # -||q - k||^2. Zeroed, so the expansion's products stay finite.
        k_far, q_far = infinitely_far(k), infinitely_far(q)
        if k_far.any():  # (k's own zero: a 16-bit k stays 16-bit)
            k = np.where(k_far[..., None], k.dtype.type(0), k)
        if q_far.any():
            q = np.where(q_far[..., None], q.dtype.type(0), q)
            bias = bias + np.where(q_far, -np.inf, 0.0).astype(dtype)[..., None]
        if float_mask is not None:
            bias = float_mask + bias
        float_mask = np.broadcast_to(bias, args.full_scores_shape)
    return to_batch(q, args.batch), to_batch(k, args.batch), bool_mask, float_mask, lens


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
        if sinks is not None:
            raise NotImplementedError(
                "sinks is not supported on Dask arrays (the Dask path has no sinks): "
                "pass NumPy arrays"
            )
        from fastattn import _dask  # a lazy graph whose blocks come back here

        return _dask.attention(
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
            return_weights=return_weights,
            out=out,
            num_threads=num_threads,
        )
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
    if spec.score == "additive":
        return _additive(
            args, spec.additive, spec.normalize, spec.top_k, want_weights, out, threads
        )

    normalizer, k_keep, hardmax = _selection(spec.normalize, spec.top_k, args.key.shape[-2])
    storage = _family_storage(spec, normalizer, sdpa_storage_dtype(args))
    q, k, bool_mask, float_mask, lens = _dot_operands(spec, threads, storage)
    v = to_batch(kernel_ready(args.value, storage), args.batch)
    result, in_place, _, weights = attention_buffers(args, out, False, want_weights, storage)

    shared = shared_options(args, threads, (bool_mask, float_mask, lens))
    if normalizer == 0:  # the softmax: scaled_dot_product_attention's kernel
        _core.sdpa(
            query=q,
            key=k,
            value=v,
            out=result,
            weights=weights,
            sinks=head_values(args)[0],
            scale=spec.scale,
            mask_summary=args.mask_summary,  # a BlockMask's, as in SDPA
            **shared,
        )
    else:  # hardmax / top-k: each row's best keys kept in a heap
        _core.select(
            query=q,
            key=k,
            value=v,
            out=result,
            weights=weights,
            scale=spec.scale,
            top_k=k_keep,
            hardmax=hardmax,
            **shared,
        )

    return attention_result(args, out, result, in_place, None, weights)


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
        from fastattn import _dask  # a lazy graph whose blocks come back here

        return _dask.nadaraya_watson(
            x_query,
            x_keys,
            y_values,
            kernel=kernel,
            bandwidth=bandwidth,
            return_weights=return_weights,
            out=out,
            num_threads=num_threads,
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

    dtype = ra.compute_dtype
    # float16/bfloat16 arrays go to the kernel as they are (it widens them as it reads them).
    storage = storage_dtype(ra.result_dtype, dtype)
    # (batch..., 1, L, D): one head
    xq, xk, y = (
        to_batch(kernel_ready(a, storage), ra.batch, 2)[..., None, :, :]
        for a in (ra.x_query, ra.x_keys, ra.y_values)
    )
    lq, lk, dy = xq.shape[-2], xk.shape[-2], y.shape[-1]
    result = np.empty(ra.batch + (1, lq, dy), storage)
    weights = np.empty(ra.batch + (1, lq, lk), dtype) if want_weights else None

    _core.nadaraya_watson(
        query=xq,
        key=xk,
        value=y,
        out=result,
        weights=weights,
        bandwidth=ra.bandwidth,
        kernel=KERNELS.index(ra.kernel),
        num_threads=threads,
    )

    output = finish(result, ra.out_shape, ra.result_dtype, out, False)
    return pack(output, extra(weights, ra.weights_shape, weights_dtype(ra)))

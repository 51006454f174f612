"""fastattn.varlen_attention: packed variable-length batches, checked by
:mod:`fastattn._validation`, computed by the CPU backend (:mod:`fastattn._cpu`) in one call
of the SDPA kernels over every sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from fastattn import _cpu, _cuda, _threads
from fastattn._checks import check_flag
from fastattn._validation import check_out, varlen_args

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray


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
    """Scaled dot-product attention over a batch of sequences of different lengths, packed.

    Sequence ``n``'s queries ``query[cu_seqlens_q[n]:cu_seqlens_q[n+1]]`` attend only to its
    keys ``key[cu_seqlens_k[n]:cu_seqlens_k[n+1]]`` (and values). The result is
    bit-identical to :func:`scaled_dot_product_attention` on each sequence alone (every
    option means what it means there, per sequence), computed in one call: no padding is
    formed, and the work of all sequences is shared out among the threads, largest tasks
    first, so one long sequence beside many short ones keeps every thread busy.

    Parameters
    ----------
    query : array_like, shape ``(total_q, Hq, E)``
    key : array_like, shape ``(total_k, Hkv, E)``
    value : array_like, shape ``(total_k, Hkv, Ev)``
        Token-major packed sequences (FlashAttention's varlen layout). float16, bfloat16
        (``ml_dtypes``), float32 or float64; mixed dtypes promote with ``np.result_type``;
        float16 and bfloat16 are read as stored, computed in float32 and returned in their
        own dtype, each sequence exactly as :func:`scaled_dot_product_attention` computes
        it (bfloat16 products with ``vdpbf16ps`` on AVX512-BF16). ``Hq % Hkv == 0``
        (grouped-query attention).
        Any strides; arrays whose last axis has unit stride are read in place.
    cu_seqlens_q, cu_seqlens_k : array_like of int, shape ``(N + 1,)``
        Cumulative sequence lengths: non-decreasing, starting at 0 and ending at
        ``total_q`` / ``total_k``. Empty sequences are allowed (a sequence with queries
        but no keys returns zeros, lse ``-inf``).
    is_causal : bool, default False
        Per sequence, keep keys ``j <= i`` (``causal_alignment="top_left"``) or
        ``j <= i + Lk_n - Lq_n`` (``"bottom_right"``), positions counted within the sequence.
    window : (left, right), optional
        Per sequence, keep ``i - left <= j <= i + right`` (same alignment as causal).
    scale : float, default ``1 / sqrt(E)``
    softcap : float > 0, optional
        Scores become ``softcap * tanh(score / softcap)`` after scaling.
    sinks : array_like of float, optional
        One attention-sink logit per query head, shape ``(Hq,)``: as in
        :func:`scaled_dot_product_attention`, in every sequence.
    alibi_slopes : array_like of float, optional
        One ALiBi slope per query head, shape ``(Hq,)``: ``-slope * |j - (i + d)|`` joins the
        scores, with each sequence's own positions and causal alignment ``d``.
    return_lse : bool
        Also return the log-sum-exp of each score row, shape ``(total_q, Hq)``, in the
        compute dtype (float32 for float16/bfloat16 inputs).
    out : ndarray, optional
        Written with the result and returned; exact output shape and dtype required.
    num_threads : int, optional
        Threads for this call (default: :func:`fastattn.get_num_threads`).

    The result is bit-identical for any thread count. The GIL is released while computing.
    CuPy arrays raise ``NotImplementedError``.

    Returns
    -------
    output of shape ``(total_q, Hq, Ev)``, or ``(output, lse)``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> lens = [5, 0, 12]
    >>> cu = np.concatenate([[0], np.cumsum(lens)])
    >>> q, k, v = (rng.standard_normal((cu[-1], 4, 8), dtype=np.float32) for _ in range(3))
    >>> out = fastattn.varlen_attention(q, k, v, cu, cu, is_causal=True)
    >>> one = fastattn.scaled_dot_product_attention(
    ...     q[5:17].transpose(1, 0, 2), k[5:17].transpose(1, 0, 2), v[5:17].transpose(1, 0, 2),
    ...     is_causal=True)
    >>> bool(np.array_equal(out[5:17], one.transpose(1, 0, 2)))
    True
    """
    if _cuda.uses_gpu(query, key, value, cu_seqlens_q, cu_seqlens_k, out):
        raise NotImplementedError(
            "varlen_attention does not run on CuPy arrays: pass NumPy arrays (e.g. "
            "cupy.asnumpy), or call scaled_dot_product_attention per sequence"
        )
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
    threads = _threads.resolve(num_threads)
    if out is not None:
        check_out(out, args.out_shape, args.result_dtype, args.named_inputs())

    return _cpu.varlen_attention(args, want_lse, out, threads)

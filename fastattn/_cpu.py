"""The CPU backend: checked calls (the records of :mod:`fastattn._args`) computed by the
kernels of :mod:`fastattn._core`, with the GIL released.

Each function takes a call checked by :mod:`fastattn._validation`, its ``out=`` buffer
(checked, or None), the extra results asked for and the thread count; it prepares the
arrays with :mod:`fastattn._prepare`, runs one kernel and finishes the result. The public
functions call these for NumPy arrays, and so do the Dask path's blocks (on NumPy chunks):
nothing here calls back into the public layer.
"""

from __future__ import annotations

import numpy as np

from fastattn import _core
from fastattn._prepare import (
    attention_buffers,
    attention_result,
    batched_qkv,
    contiguous,
    dot_operands,
    extra,
    family_storage,
    finish,
    head_values,
    item_aligned,
    kernel_ready,
    pack,
    result_buffer,
    sdpa_storage_dtype,
    selection,
    shared_options,
    softmax_masks,
    storage_dtype,
    to_batch,
    weights_dtype,
)
from fastattn._validation import KERNELS

# --------------------------------------------------------------------------------------
# scaled_dot_product_attention, merge_attention_states, varlen_attention


def sdpa(args, out, want_lse: bool, want_weights: bool, threads: int):
    """A checked SDPA call (also the Dask path's blocks, which set ``args.diag_offset`` to
    the block's absolute offset)."""
    # float16/bfloat16 arrays go to the kernel as they are (it widens them block by block).
    dtype, batch = sdpa_storage_dtype(args), args.batch
    q, k, v = batched_qkv(args, dtype, np.dtype(np.int8) if args.int8_kv else dtype)
    scales = {}
    if args.int8_kv:  # float32, unit stride along the keys
        for name in ("key_scale", "value_scale"):
            scales[name] = to_batch(kernel_ready(getattr(args, name), dtype), batch, 2)
    sink_view, alibi_view = head_values(args)
    result, in_place, lse, weights = attention_buffers(args, out, want_lse, want_weights, dtype)

    _core.sdpa(
        query=q,
        key=k,
        value=v,
        out=result,
        lse=lse,
        weights=weights,
        sinks=sink_view,
        alibi_slopes=alibi_view,
        scale=args.scale,
        softcap=args.softcap or 0.0,
        **shared_options(args, threads),
        **scales,
        # A BlockMask's tile summary (checked by the kernel to be of the mask it gets).
        mask_summary=args.mask_summary,
    )

    return attention_result(args, out, result, in_place, lse, weights)


def merge_attention_states(args, out, threads: int):
    """A checked merge_attention_states call: ``(output, lse)``."""
    dtype = args.compute_dtype
    parts = [kernel_ready(o, dtype) for o in args.outputs]
    part_lses = [item_aligned(x, dtype) for x in args.lses]
    result, in_place = result_buffer(out, args.out_shape, dtype)
    lse = np.empty(args.out_shape[:-1], dtype)
    _core.merge_states(outputs=parts, lses=part_lses, out=result, lse=lse, num_threads=threads)
    return finish(result, args.out_shape, args.result_dtype, out, in_place), lse


def varlen_attention(args, want_lse: bool, out, threads: int):
    """A checked varlen_attention call."""
    dtype = args.compute_dtype
    # float16/bfloat16 are read as stored (widened, or bfloat16 products, in the kernel),
    # as scaled_dot_product_attention reads them; lse stays in the compute dtype.
    storage = storage_dtype(args.result_dtype, dtype)
    # The kernel sees the packed call as one SDPA without a batch: (heads, tokens, features).
    q = kernel_ready(args.query, storage).transpose(1, 0, 2)
    k = kernel_ready(args.key, storage).transpose(1, 0, 2)
    v = kernel_ready(args.value, storage).transpose(1, 0, 2)
    result, in_place = result_buffer(out, args.out_shape, storage)
    lse = np.empty(args.out_shape[:-1], dtype) if want_lse else None
    hq = args.out_shape[1]

    def per_head(a):  # (Hq,) in the compute dtype, as the kernel reads them
        return None if a is None else np.ascontiguousarray(np.broadcast_to(a.astype(dtype), (hq,)))

    left, right = args.window
    _core.sdpa_varlen(
        query=q,
        key=k,
        value=v,
        out=result.transpose(1, 0, 2),
        cu_seqlens_q=np.ascontiguousarray(args.cu_seqlens_q),
        cu_seqlens_k=np.ascontiguousarray(args.cu_seqlens_k),
        lse_tokens=lse,
        scale=args.scale,
        softcap=args.softcap or 0.0,
        causal=args.is_causal,
        bottom_right=args.bottom_right,
        window_left=left,
        window_right=right,
        num_threads=threads,
        sinks=per_head(args.sinks),
        alibi_slopes=per_head(args.alibi_slopes),
    )
    output = finish(result, args.out_shape, args.result_dtype, out, in_place)
    return (output, lse) if want_lse else output


# --------------------------------------------------------------------------------------
# masked_softmax


def masked_softmax(args, out, threads: int):
    """A checked masked_softmax call."""

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
# attention, additive_attention


def additive(args, weights_in, normalize, top_k, want_weights, out, threads):
    """Prepare, run the additive kernel, finish: additive_attention and
    attention(score="additive")."""
    normalizer, k_keep, hardmax = selection(normalize, top_k, args.key.shape[-2])
    # float16/bfloat16 q/k/v go to the kernel as they are (it widens them as it reads them);
    # the projection weights are in the compute dtype.
    dtype, storage = args.compute_dtype, sdpa_storage_dtype(args)
    q, k, v = batched_qkv(args, storage)
    wq, wk, wv = (contiguous(w, dtype) for w in (weights_in.w_q, weights_in.w_k, weights_in.w_v))
    result, in_place, _, weights = attention_buffers(args, out, False, want_weights, storage)

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


def attention(spec, want_weights: bool, out, threads: int):
    """A checked attention() call (``spec``: its AttentionSpec)."""
    args = spec.args
    if spec.score == "additive":
        return additive(args, spec.additive, spec.normalize, spec.top_k, want_weights, out, threads)

    # Everything below is prepared by _prepare (the score's operands included).
    normalizer, k_keep, hardmax = selection(spec.normalize, spec.top_k, args.key.shape[-2])
    storage = family_storage(spec, normalizer)
    q, k, bool_mask, float_mask, lens = dot_operands(spec, threads, storage)
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
# nadaraya_watson


def nadaraya_watson(ra, want_weights: bool, out, threads: int):
    """A checked nadaraya_watson call (``ra``: its RegressionArgs)."""
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

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
from fastattn._args import SdpaArgs
from fastattn._grad_args import grad_like, input_grad, regression_grads, unread_zeroed
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
    softmax_rows,
    storage_dtype,
    to_batch,
    varlen_per_head,
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


def heads_attention(query, key, value, parts: dict, out, want_weights: bool, threads: int):
    """The attention of a :class:`fastattn.MultiHeadAttention` call over its projected
    heads (its arguments checked before they were projected): ``parts`` are the rest of its
    record (:class:`fastattn._args.SdpaArgs`), ``out`` the ``(B, H, Lq, D)`` view its
    result goes to. ``(out, weights)``."""
    args = SdpaArgs(query=query, key=key, value=value, **parts)
    return sdpa(args, out, False, want_weights, threads)


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
        sinks=varlen_per_head(args.sinks, dtype, hq),
        alibi_slopes=varlen_per_head(args.alibi_slopes, dtype, hq),
    )
    output = finish(result, args.out_shape, args.result_dtype, out, in_place)
    return (output, lse) if want_lse else output


# --------------------------------------------------------------------------------------
# masked_softmax


def masked_softmax(args, out, threads: int):
    """A checked masked_softmax call."""

    # float16/bfloat16 go to the kernel as they are (it widens them row by row).
    dtype = storage_dtype(args.x.dtype, args.compute_dtype)
    result, in_place = result_buffer(out, args.x.shape, dtype, any_layout=True)
    rows = softmax_rows(args, result, x=item_aligned(args.x, dtype))
    _core.masked_softmax(**rows, num_threads=threads)
    return finish(result, args.x.shape, args.result_dtype, out, in_place)


# --------------------------------------------------------------------------------------
# attention, additive_attention


def _additive_kernel(args, weights_in, normalize, top_k, want_weights, out, threads):
    """Run the additive kernel on a checked call: (result, in_place, weights, (q, k, v),
    (w_q, w_k, w_v)) as the kernel read and wrote them (result and q/k/v in the storage
    dtype, weights and w_* in the compute dtype)."""
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
    return result, in_place, weights, (q, k, v), (wq, wk, wv)


def additive(args, weights_in, normalize, top_k, want_weights, out, threads):
    """Prepare, run the additive kernel, finish: additive_attention and
    attention(score="additive")."""
    result, in_place, weights, _, _ = _additive_kernel(
        args, weights_in, normalize, top_k, want_weights, out, threads
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

    # The operands by keyword, not from one shared dict: a second ** merge costs more
    # (about 3k instructions, 1.8 % of a tiny call) than the repetition.
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


def _regression_kernel(ra, want_weights: bool, threads: int, storage=None):
    """Run the nadaraya_watson kernel on a checked call with x_query, x_keys, y_values in
    ``storage`` (default: the call's storage dtype, float16/bfloat16 arrays going to the
    kernel as they are, widened as it reads them): (xq, xk, y, output, weights or None) as
    it read and wrote them, each (batch..., 1, L, D) (one head); the weights in the compute
    dtype."""
    if storage is None:
        storage = storage_dtype(ra.result_dtype, ra.compute_dtype)
    xq, xk, y = (
        to_batch(kernel_ready(a, storage), ra.batch, 2)[..., None, :, :]
        for a in (ra.x_query, ra.x_keys, ra.y_values)
    )
    lq, lk, dy = xq.shape[-2], xk.shape[-2], y.shape[-1]
    result = np.empty(ra.batch + (1, lq, dy), storage)
    weights = np.empty(ra.batch + (1, lq, lk), ra.compute_dtype) if want_weights else None
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
    return xq, xk, y, result, weights


def nadaraya_watson(ra, want_weights: bool, out, threads: int):
    """A checked nadaraya_watson call (``ra``: its RegressionArgs)."""
    _, _, _, result, weights = _regression_kernel(ra, want_weights, threads)
    output = finish(result, ra.out_shape, ra.result_dtype, out, False)
    return pack(output, extra(weights, ra.weights_shape, weights_dtype(ra)))


# --------------------------------------------------------------------------------------
# Gradients of the family (fastattn._family_grad)


def masked_softmax_backward(args, grad, threads: int):
    """A checked masked_softmax_backward call (``args``: the SoftmaxArgs of the weights)."""
    # float16/bfloat16 weights and grad of that dtype go to the kernel as they are (it
    # widens them row by row); other pairs are read in the compute dtype.
    dtype = storage_dtype(args.x.dtype, args.compute_dtype)
    if grad.dtype != args.x.dtype:
        dtype = args.compute_dtype
    result = np.empty(args.x.shape, dtype)
    rows = softmax_rows(
        args, result, weights=item_aligned(args.x, dtype), grad=item_aligned(grad, dtype)
    )
    _core.masked_softmax_backward(**rows, num_threads=threads)
    return result.astype(args.result_dtype, copy=False)


def additive_backward(args, ws, grad_out, inputs, threads: int):
    """A checked additive_attention_backward call: the forward kernel for the weights P,
    then the chain rule in NumPy (blocked over rows). ``inputs``: the six arrays as the
    caller passed them (their shapes and dtypes)."""
    dtype = args.compute_dtype
    result, _, p, (q, k, v), (wq, wk, wv) = _additive_kernel(
        args, ws, "softmax", None, True, None, threads
    )
    # Query heads grouped by their key/value head: (batch..., Hkv, group * Lq, ...).
    hq, num_q, num_k = args.full_out_shape[-3], q.shape[-2], k.shape[-2]
    hkv = k.shape[-3]
    grp = hq // max(hkv, 1)
    lead = args.batch + (hkv,)
    hidden = wv.shape[0]

    def grouped(a):
        return a.reshape(lead + (grp * num_q, a.shape[-1]))

    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        o = grouped(result.astype(dtype, copy=False))
        go = grouped(grad_out.reshape(args.full_out_shape).astype(dtype, copy=False))
        pg = grouped(p)
        vv = v.astype(dtype, copy=False)
        kk = k.astype(dtype, copy=False)
        qq = q.astype(dtype, copy=False)
        # Keys of weight 0 (hidden, or underflowed) pass nothing on and are not read.
        dv = np.matmul(np.swapaxes(pg, -1, -2), go)
        dp = np.matmul(go, np.swapaxes(np.where(np.isnan(vv), dtype.type(0), vv), -1, -2))
        delta = np.einsum("...ie,...ie->...i", go, o)[..., None]
        # dS = P * (dP - delta), 0 where P is 0, built in dP's buffer (P is not needed
        # after it: released, so the call holds two Lq x Lk arrays at most, dS and dS^T).
        ds = dp
        ds -= delta
        ds *= pg
        np.copyto(ds, dtype.type(0), where=pg == 0)
        del p, pg, dp
        # The tanh chain. A NaN projection only meets rows whose P is NaN (the key is seen)
        # or 0 (hidden): zeroing it keeps hidden keys out and NaN rows NaN through dS.
        # The C++ kernel reads the projections with hidden zero-padded to 64 bytes (a
        # padded unit has tanh(0) = 0 and weight 0: it adds nothing), as (groups, rows, .).
        padded = -(-hidden * dtype.itemsize // 64) * 64 // dtype.itemsize
        nb, rows = int(np.prod(lead)), grp * num_q
        qp = np.zeros((nb, rows, padded), dtype)
        kp = np.zeros((nb, num_k, padded), dtype)
        qp[..., :hidden] = np.matmul(qq, wq).reshape(nb, rows, hidden)
        kp[..., :hidden] = np.matmul(kk, wk).reshape(nb, num_k, hidden)
        np.copyto(qp, 0, where=np.isnan(qp))
        np.copyto(kp, 0, where=np.isnan(kp))
        wv_pad = np.zeros(padded, dtype)
        wv_pad[:hidden] = wv
        ds3 = np.ascontiguousarray(ds.reshape(nb, rows, num_k))
        dqp = np.empty_like(qp)
        dkp = np.empty_like(kp)
        dwv_rows = np.empty_like(qp)
        _core.additive_backward(
            qp=qp,
            kp=kp,
            ds=ds3,
            ds_t=np.ascontiguousarray(ds3.swapaxes(-1, -2)),
            w_v=wv_pad,
            d_qp=dqp,
            d_kp=dkp,
            d_wv=dwv_rows,
            num_threads=threads,
        )
        dwv = dwv_rows[..., :hidden].sum(axis=(0, 1))
        dqp = dqp[..., :hidden].reshape(lead + (rows, hidden))
        dkp = dkp[..., :hidden].reshape(lead + (num_k, hidden))
        dqp_h = dqp.reshape(args.full_out_shape[:-1] + (hidden,))
        grads = (
            np.matmul(dqp_h, wq.T),
            np.matmul(dkp, wk.T),
            dv,
            unread_zeroed(qq, dqp_h).reshape(-1, qq.shape[-1]).T @ dqp_h.reshape(-1, hidden),
            unread_zeroed(kk, dkp).reshape(-1, kk.shape[-1]).T @ dkp.reshape(-1, hidden),
            dwv,
        )
    shaped = (
        input_grad(grads[0], np.shape(inputs[0]), grads[0].dtype),
        input_grad(grads[1], np.shape(inputs[1]), grads[1].dtype),  # (already per kv head)
        input_grad(grads[2], np.shape(inputs[2]), grads[2].dtype),
        grads[3],
        grads[4],
        grads[5],
    )
    return tuple(grad_like(g, a) for g, a in zip(shaped, inputs, strict=True))


def nadaraya_watson_backward(ra, grad_out, inputs, bandwidth, threads: int):
    """A checked nadaraya_watson_backward call: the forward kernel for the weights and the
    output, then the chain rule in NumPy (blocked over query rows). ``inputs``: x_query,
    x_keys, y_values as the caller passed them; ``bandwidth`` as passed."""
    dtype = ra.compute_dtype
    xq, xk, y, f, w = (a[..., 0, :, :] for a in _regression_kernel(ra, True, threads, dtype))
    lq, lk, dy = xq.shape[-2], xk.shape[-2], y.shape[-1]
    g = grad_out.astype(dtype, copy=False).reshape(ra.batch + (lq, dy))
    zero = dtype.type(0)
    nb, dim = int(np.prod(ra.batch)), xq.shape[-1]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        undefined = np.isnan(w).any(axis=-1) if lk else np.ones(ra.batch + (lq,), dtype=bool)
        # An undefined row (NaN: no key in the support) passes nothing on.
        w = np.where(undefined[..., None], zero, w)
        f = np.where(undefined[..., None], zero, f)
        gy = np.matmul(np.swapaxes(w, -1, -2), g)
        gf = np.einsum("...ie,...ie->...i", g, f)
    gxq = np.zeros((nb, lq, dim), dtype)
    gxk = np.zeros((nb, lk, dim), dtype)
    gh = np.zeros((nb, lq), dtype)
    if ra.kernel != "boxcar" and nb and lq and lk:  # boxcar: 0 wherever defined
        # The C++ kernel's layout: each side's other side transposed (features-major) and
        # padded to 64 bytes with NaN coordinates and weight 0 (pairs it never counts).
        per = 64 // dtype.itemsize
        lqp, lkp = -(-lq // per) * per, -(-lk // per) * per

        def padded(a, length, fill=0):
            if a.shape[-1] == length and a.flags.c_contiguous:  # already padded: no copy
                return a
            shape = a.shape[:-1] + (length,)
            out = np.zeros(shape, dtype) if fill == 0 else np.full(shape, fill, dtype)
            out[..., : a.shape[-1]] = a
            return out

        def products(a, b, length):  # a @ b^T into a zero-padded buffer, (nb, ., length)
            out = np.zeros((nb, a.shape[-2], length), dtype)
            np.matmul(a, np.swapaxes(b, -1, -2), out=out[..., : b.shape[-2]])
            return out

        def flat(a):
            return np.ascontiguousarray(a, dtype=dtype).reshape((nb,) + a.shape[-2:])

        xq3, xk3 = (
            flat(np.broadcast_to(xq, ra.batch + xq.shape[-2:])),
            flat(np.broadcast_to(xk, ra.batch + xk.shape[-2:])),
        )
        w3 = flat(w)
        g3 = flat(g)
        y3 = flat(np.broadcast_to(y, ra.batch + y.shape[-2:]))
        _core.nadaraya_watson_backward(
            xq=xq3,
            xk_t=padded(xk3.swapaxes(1, 2), lkp, np.nan),
            w=padded(w3, lkp),
            gy=products(g3, y3, lkp),  # g_i . y_j
            gf=padded(gf.reshape(nb, lq), lqp),
            xk=xk3,
            xq_t=padded(xq3.swapaxes(1, 2), lqp, np.nan),
            w_t=padded(w3.swapaxes(1, 2), lqp),
            gy_t=products(y3, g3, lqp),
            h=np.ascontiguousarray(ra.bandwidth.reshape(nb), dtype=dtype),
            gxq=gxq,
            gxk=gxk,
            gh=gh,
            inv_s=np.zeros((nb, lqp), dtype),
            kernel=KERNELS.index(ra.kernel),
            num_threads=threads,
        )
    gxq = np.where(undefined[..., None], dtype.type(np.nan), gxq.reshape(ra.batch + (lq, dim)))
    gxk, gh = gxk.reshape(ra.batch + (lk, dim)), gh.sum(axis=1).reshape(ra.batch)
    return regression_grads(ra, gxq, gxk, gy, gh, inputs, bandwidth)

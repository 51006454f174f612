"""From checked arguments to the kernels' arrays, and from the kernels' buffers to what a
call returns; used by every public function on the CPU and by the NumPy twins.

Preparing: conversions to the compute dtype that copy only when needed (native byte
order, aligned, strides in whole items, a unit-stride last axis where the kernel needs
one), broadcast views in place of broadcast copies, masks and valid_lens at full shape
(zero-copy), and the result buffer (the caller's ``out=`` itself when the kernel can
write it). attention()'s scores as dot products for the SDPA and select kernels (cosine's
unit rows, general's projected q, gaussian's key bias) and its normaliser. Finishing: the
caller's shapes, the result dtype, ``out=`` filled, and the
return tuple.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fastattn import _core
from fastattn._dtypes import FLOAT32, is_16bit_float, is_bfloat16

if TYPE_CHECKING:
    from fastattn._args import SdpaArgs, SoftmaxArgs

# --------------------------------------------------------------------------------------
# Arrays for the kernels


def kernel_ready(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` in ``dtype``, native byte order, aligned, unit-stride last axis; copies only if
    needed."""
    if a.dtype != dtype:  # also catches non-native byte order
        a = a.astype(dtype, order="K")
    flags = a.flags
    if flags.c_contiguous and flags.aligned:
        return a
    if a.ndim and (
        (a.shape[-1] > 1 and a.strides[-1] != a.itemsize)
        or any(s % a.itemsize for s in a.strides)
        or not flags.aligned
    ):
        # A copy, not np.ascontiguousarray: that returns a contiguous but unaligned array
        # as it is, and the kernels read whole elements through typed pointers.
        a = a.copy(order="C")
    return a


def item_aligned(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` in ``dtype``, native byte order, aligned, strides in whole items (any layout);
    copies only if needed."""
    if a.dtype != dtype:
        a = a.astype(dtype, order="K")
    flags = a.flags
    if flags.c_contiguous and flags.aligned:  # the common case, without the strides loop
        return a
    if any(s % a.itemsize for s in a.strides) or not flags.aligned:
        a = a.copy(order="C")  # (np.ascontiguousarray may hand back an unaligned array)
    return a


def contiguous(a, dtype: np.dtype) -> np.ndarray:
    """``a`` as a C-contiguous, aligned array of ``dtype`` (copies only if needed)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return a if a.flags.aligned else a.copy()


def with_leading_axes(a, ndim: int):
    """A view of ``a`` with size-1 axes prepended up to ``ndim`` dims."""
    return a[(None,) * (ndim - a.ndim)] if a.ndim < ndim else a


def to_batch(a: np.ndarray, batch: tuple, trailing: int = 3) -> np.ndarray:
    """``a`` broadcast to ``batch`` + its last ``trailing`` axes: a view."""
    if a.shape[:-trailing] == batch:
        return a
    return np.broadcast_to(a, batch + a.shape[-trailing:])


def batched_qkv(args: SdpaArgs, dtype: np.dtype, kv_dtype: np.dtype | None = None):
    """(q, k, v) of a checked attention call as the kernels read them: q in ``dtype``, k and
    v in ``kv_dtype`` (default ``dtype``), each converted before it is broadcast to the
    batch, so a broadcast input is never materialised (views)."""
    kv = dtype if kv_dtype is None else kv_dtype
    return (
        to_batch(kernel_ready(args.query, dtype), args.batch),
        to_batch(kernel_ready(args.key, kv), args.batch),
        to_batch(kernel_ready(args.value, kv), args.batch),
    )


def lens_view(valid_lens: np.ndarray, rows_ndim: int, full_rows: tuple) -> np.ndarray:
    """Checked valid_lens (a prefix of the caller's ``rows_ndim``-D rows) as the kernels
    read them: int64, size-1 axes appended up to the rows' dims, broadcast to
    ``full_rows`` (a view)."""
    vl = item_aligned(valid_lens, np.dtype(np.int64))
    return np.broadcast_to(vl.reshape(vl.shape + (1,) * (rows_ndim - vl.ndim)), full_rows)


def attention_masks(args: SdpaArgs):
    """(bool mask, float mask, valid_lens) of a checked attention call at full shape
    (zero-copy views; the float mask in the compute dtype), None where not given."""
    bool_mask = float_mask = lens = None
    if args.attn_mask is not None:
        m = args.attn_mask
        # A float64 mask narrowed to float32 scores may overflow to -inf (finfo(float64).min
        # hides its key, as it does in float64): nothing for NumPy's RuntimeWarning to say.
        with np.errstate(over="ignore"):
            m = item_aligned(m, m.dtype if m.dtype == np.bool_ else args.compute_dtype)
        full = np.broadcast_to(m, args.full_scores_shape)
        if full.dtype == np.bool_:
            bool_mask = full
        else:
            float_mask = full
    if args.valid_lens is not None:
        lens = lens_view(args.valid_lens, len(args.out_shape) - 1, args.full_out_shape[:-1])
    return bool_mask, float_mask, lens


def shared_options(args: SdpaArgs, threads: int, masks: tuple | None = None) -> dict:
    """The keyword arguments every attention binding shares besides its arrays (see
    csrc/bindings/attention_args.h): the masks as the kernels read them (``masks``, else
    ``attention_masks(args)``), causal, diagonal, window and thread count."""
    bool_mask, float_mask, lens = attention_masks(args) if masks is None else masks
    left, right = args.window
    return {
        "bool_mask": bool_mask,
        "float_mask": float_mask,
        "valid_lens": lens,
        "causal": args.is_causal,
        "diag_offset": args.diag_offset,
        "window_left": left,
        "window_right": right,
        "num_threads": threads,
    }


def head_values(args: SdpaArgs):
    """(sinks, ALiBi slopes) of a checked attention call as the kernels read them: the
    compute dtype, broadcast to ``batch + (Hq,)`` (zero-copy views), None where not given."""
    heads = args.full_out_shape[:-2]

    def view(a):
        if a is None:
            return None
        a = item_aligned(a, args.compute_dtype)
        return np.broadcast_to(with_leading_axes(a, len(heads)), heads)

    return view(args.sinks), view(args.alibi_slopes)


def varlen_per_head(a, dtype, hq: int):
    """A varlen call's sinks or ALiBi slopes as the kernels read them: (Hq,), contiguous,
    in the compute dtype (None stays None)."""
    return None if a is None else np.ascontiguousarray(np.broadcast_to(a.astype(dtype), (hq,)))


def softmax_masks(args: SoftmaxArgs):
    """(mask broadcast to x's shape, valid_lens broadcast to the rows' shape), or None."""
    mask = None if args.mask is None else np.broadcast_to(args.mask, args.x.shape)
    rows = args.rows_shape
    lens = None if args.valid_lens is None else lens_view(args.valid_lens, len(rows), rows)
    return mask, lens


def softmax_rows(args: SoftmaxArgs, result: np.ndarray, **arrays) -> dict:
    """A masked-softmax kernel's arguments (``_core.masked_softmax`` or its backward) along
    ``args.axis``: ``arrays`` (x, or weights and grad), ``result`` (as ``out``) and the
    call's masks as views with that axis last."""
    ax = args.axis
    keep, lens = softmax_masks(args)
    rows = {name: np.moveaxis(a, ax, -1) for name, a in arrays.items()}
    rows["out"] = np.moveaxis(result, ax, -1)
    rows["mask"] = None if keep is None else np.moveaxis(keep, ax, -1)
    rows["valid_lens"] = lens
    return rows


# --------------------------------------------------------------------------------------
# attention(): scores rewritten as dot products, the kernel's normaliser


def unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows of ``a`` (last axis) scaled to unit length, in float64; zero rows stay zero.
    Scaled by the row's largest entry first, so huge or tiny rows neither overflow nor
    underflow."""
    x = np.asarray(a, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        big = (
            np.abs(x).max(axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,))
        )
        y = np.where(big > 0, x / np.where(big > 0, big, 1.0), x)
        norm = np.sqrt((y * y).sum(axis=-1, keepdims=True))
        return np.where(norm > 0, y / np.where(norm > 0, norm, 1.0), y)


def gaussian_key_bias(k: np.ndarray, bandwidth: float) -> np.ndarray:
    """-||k_j||^2 / (2 h^2) per key, in float64: shape (..., Hkv, Lk)."""
    x = np.asarray(k, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return -(x * x).sum(axis=-1) / (2.0 * bandwidth * bandwidth)


def infinitely_far(x: np.ndarray) -> np.ndarray:
    """Rows (last axis) holding an infinity and no NaN."""
    return np.isinf(x).any(axis=-1) & ~np.isnan(x).any(axis=-1)


def project(x: np.ndarray, w: np.ndarray, dtype: np.dtype, threads: int) -> np.ndarray:
    """``x @ w`` over the last axis, computed by the core (bit-identical for any thread
    count, unlike a threaded BLAS)."""
    rows = contiguous(x, dtype).reshape(math.prod(x.shape[:-1]), x.shape[-1])
    wc = contiguous(w, dtype)
    out = np.empty((rows.shape[0], wc.shape[1]), dtype)
    _core.project(x=rows, w=wc, out=out, num_threads=threads)
    return out.reshape(x.shape[:-1] + (wc.shape[1],))


def selection(normalize: str, top_k: int | None, num_keys: int) -> tuple[int, int, bool]:
    """(kernel normaliser: 0 softmax / 1 select, top_k, hardmax). top-k keeping every key is
    the softmax."""
    if normalize == "softmax" or (normalize == "topk" and top_k >= num_keys):
        return 0, 1, False
    if normalize == "hardmax":
        return 1, 1, True
    return 1, top_k, False


def family_storage(spec, normalizer: int) -> np.dtype:
    """The dtype q/k/v reach the kernels in for a dot-product score: float16/bfloat16 as
    stored (sdpa_storage_dtype's) where the kernels read them without changing
    the arithmetic, else the compute dtype (a float32 copy). dot/scaled_dot: as stored,
    so the softmax is scaled_dot_product_attention on those arrays (bfloat16 by its rule,
    vdpbf16ps on AVX512-BF16) and hardmax/top-k widen in the select kernel. gaussian: as
    stored where widening is exact -- float16, or bfloat16 under hardmax/top-k -- but a
    bfloat16 softmax keeps the copy (the SDPA bfloat16 kernel would round P and the
    products, unlike the float32 arithmetic gaussian's bias is formed in). general
    projects q into a new float32 array, which k must match; cosine's unit rows are a new
    array in any dtype."""
    sixteen = sdpa_storage_dtype(spec.args)
    if spec.score in ("dot", "scaled_dot"):
        return sixteen
    if spec.score == "gaussian" and (normalizer == 1 or not is_bfloat16(sixteen)):
        return sixteen
    return spec.args.compute_dtype


def dot_operands(spec, threads, storage):
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


# --------------------------------------------------------------------------------------
# Results


def result_buffer(out, shape: tuple, dtype: np.dtype, any_layout: bool = False):
    """(the array the kernel writes, whether it is the caller's ``out``): ``out`` itself
    when it is in the compute dtype and the kernel can write it where it lies (aligned;
    a unit-stride last axis unless ``any_layout``), else a new array of ``shape``."""
    if out is not None and out.dtype == dtype:
        ready = item_aligned(out, dtype) if any_layout else kernel_ready(out, dtype)
        if ready is out:
            return with_leading_axes(out, len(shape)), True
    return np.empty(shape, dtype), False


def finish(result: np.ndarray, shape: tuple, dtype: np.dtype, out, in_place: bool):
    """The caller's output: ``result`` in ``shape`` and ``dtype``, or ``out`` filled."""
    output = result.reshape(shape)
    if out is not None:
        if not in_place:
            np.copyto(out, output, casting="unsafe")
        return out
    return output if output.dtype == dtype else output.astype(dtype)


def extra(a: np.ndarray | None, shape: tuple, dtype: np.dtype | None = None):
    """An extra result (lse, weights) in the caller's shape (and ``dtype``), or None."""
    if a is None:
        return None
    a = a.reshape(shape)
    return a if dtype is None else a.astype(dtype, copy=False)


def pack(output, *extras):
    """``output``, or ``(output, *extras)`` with the extras that were asked for."""
    found = [x for x in extras if x is not None]
    return (output, *found) if found else output


def storage_dtype(result_dtype: np.dtype, compute_dtype: np.dtype, int8_kv: bool = False):
    """The dtype the kernels read their float inputs and write the output in: a float16 or
    bfloat16 result (every input of that dtype) as it is, widened block by block inside the
    kernel and rounded on store; otherwise (int8 key/value included: a float32 query) the
    compute dtype."""
    if is_16bit_float(result_dtype) and not int8_kv:
        return result_dtype
    return compute_dtype


def sdpa_storage_dtype(args: SdpaArgs) -> np.dtype:
    """The dtype the SDPA kernels read q/k/v and write the output in (:func:`storage_dtype`)."""
    return storage_dtype(args.result_dtype, args.compute_dtype, args.int8_kv)


def weights_dtype(args: SdpaArgs) -> np.dtype:
    """The returned weights' dtype: the result dtype, but float32 for bfloat16 (whose 8-bit
    mantissa would round every weight)."""
    return FLOAT32 if is_bfloat16(args.result_dtype) else args.result_dtype


def attention_buffers(args: SdpaArgs, out, want_lse: bool, want_weights: bool, out_dtype=None):
    """(result, whether it is ``out``, lse or None, weights or None) at full shape: what an
    attention kernel writes. The result in ``out_dtype`` (default the compute dtype), lse
    and weights in the compute dtype."""
    dtype = args.compute_dtype
    result, in_place = result_buffer(out, args.full_out_shape, out_dtype or dtype)
    lse = np.empty(args.full_out_shape[:-1], dtype) if want_lse else None
    weights = np.empty(args.full_scores_shape, dtype) if want_weights else None
    return result, in_place, lse, weights


def attention_result(args: SdpaArgs, out, result, in_place, lse, weights):
    """What an attention call returns: output, then lse and weights if asked for (lse in
    the compute dtype, weights in the result dtype)."""
    output = finish(result, args.out_shape, args.result_dtype, out, in_place)
    if lse is None and weights is None:
        return output
    return pack(
        output,
        extra(lse, args.out_shape[:-1]),
        extra(weights, args.scores_shape, weights_dtype(args)),
    )

"""The argument checks of the attention functions, shared by the CPU path, the CUDA path,
the Dask path and the NumPy twins: the array checks (dtype, shape, layout, masks, valid
lengths, ``out=``), and one ``*_args`` function per public function that checks its call
and returns its record (:mod:`fastattn._args`). The scalar checks are
:mod:`fastattn._checks`'s.

The checks read what describes an argument -- shape, dtype, strides, flags, and the values
of ``valid_lens`` and ``bandwidth`` -- and convert nothing: array_like inputs become
ndarrays with ``np.asarray`` (no copy for an ndarray), nothing else is allocated.
Turning checked arguments into kernel-ready arrays is :mod:`fastattn._prepare`'s job. The
CUDA and Dask paths run the same checks on NumPy stand-ins of their arrays, so errors are
the same word for word; only their own rules (every array on one device; Dask arrays with
known chunks) are checked in :mod:`fastattn._cuda` and :mod:`fastattn._dask`. Each message
names the argument, what it got and what was expected; the semantics they enforce are
written down in ``docs/semantics.md``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from fastattn._args import (
    AdditiveWeights,
    AttentionSpec,
    MergeArgs,
    RegressionArgs,
    SdpaArgs,
    SoftmaxArgs,
    VarlenArgs,
)
from fastattn._checks import (
    _MAX_BATCH_DIMS,
    check_alignment,
    check_choice,
    check_flag,
    check_index,
    check_real,
    check_size,
    check_window,
)
from fastattn._compute import silverman_bandwidth
from fastattn._dtypes import FLOAT32 as _FLOAT32
from fastattn._dtypes import is_bfloat16

_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_FINFO_MAX = {d: float(np.finfo(d).max) for d in _FLOAT_DTYPES}
_NATIVE_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_MAX_BYTES = int(np.iinfo(np.intp).max)  # what one array can hold

SCORES = ("dot", "scaled_dot", "general", "cosine", "gaussian", "additive")
NORMALIZERS = ("softmax", "hardmax", "topk")
KERNELS = ("gaussian", "boxcar", "triangular", "epanechnikov")

# The keyword arguments each score reads (everything else must be left at None).
_SCORE_PARAMS = {
    "dot": (),
    "scaled_dot": ("scale",),
    "general": ("weight",),
    "cosine": ("temperature",),
    "gaussian": ("bandwidth",),
    "additive": ("w_q", "w_k", "w_v"),
}


# --------------------------------------------------------------------------------------
# Shapes


def broadcast_shape(*shapes: tuple) -> tuple | None:
    """The shape NumPy's broadcasting rules give ``shapes``, or None where they do not
    broadcast. Pure Python, so it has no size limit: ``np.broadcast_shapes`` raises its
    bare "iterator is too large" for a result past 2**63 elements, which would otherwise
    reach the user as if the shapes did not broadcast."""
    ndim = max(map(len, shapes), default=0)
    result = []
    for axis in range(ndim, 0, -1):
        size = 1
        for shape in shapes:
            d = shape[-axis] if axis <= len(shape) else 1
            if d != 1:
                if size not in (1, d):
                    return None
                size = d
        result.append(size)
    return tuple(result)


def check_result_size(shape: tuple, itemsize: int, name: str) -> None:
    """A clear error for a result too large for any array (NumPy's own message for it
    names no argument): ``shape`` of ``itemsize``-byte items must fit in a signed
    machine word of bytes."""
    limit = _MAX_BYTES
    if math.prod(shape) * itemsize > limit:
        raise ValueError(
            f"{name} would have shape {tuple(shape)}: {math.prod(shape)} elements of "
            f"{itemsize} bytes, more than one array can hold ({limit} bytes); the inputs' "
            "leading dims broadcast to that shape"
        )


# --------------------------------------------------------------------------------------
# Arrays: dtype, shape, layout


def float_array(x: object, name: str, min_ndim: int = 2) -> np.ndarray:
    """``x`` as a float16/32/64 ndarray of at least ``min_ndim`` dims (no copy if it is one)."""
    a = np.asarray(x)
    dt = a.dtype  # native float dtypes first: the common case, without newbyteorder's cost
    if (
        dt not in _FLOAT_DTYPES
        and (dt.kind != "f" or dt.newbyteorder("=") not in _FLOAT_DTYPES)
        and not is_bfloat16(dt)
    ):
        raise TypeError(
            f"{name} must be a floating-point array (float16, float32 or float64), "
            f"got dtype {a.dtype}"
        )
    if a.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions (..., L, E), got shape {a.shape}"
        )
    return a


def result_dtypes(*arrays: np.ndarray) -> tuple[np.dtype, np.dtype]:
    """(dtype of the result, dtype computed in): float16 and bfloat16 are computed in
    float32. bfloat16 with other dtypes promotes as float32 would (as ``np.result_type``
    does with ml_dtypes for float32/float64; bfloat16 with float16 gives float32)."""
    first = arrays[0].dtype  # dtype equality includes the byte order
    if first in _NATIVE_KERNEL_DTYPES:  # the common case, without np.result_type's cost
        for a in arrays:
            if a.dtype != first:
                break
        else:
            return first, first
    dtypes = [a.dtype for a in arrays]
    if any(is_bfloat16(d) for d in dtypes):
        others = [d.newbyteorder("=") for d in dtypes if not is_bfloat16(d)]
        if not others:
            return dtypes[0], _FLOAT32
        result = np.result_type(_FLOAT32, *others)
        return result, result
    result = np.result_type(*[d.newbyteorder("=") for d in dtypes])
    compute = _FLOAT32 if result == np.float16 else result
    return result, compute


def _weight(w: object, name: str, shape: tuple, meaning: str) -> np.ndarray:
    """A float weight array of exactly ``shape`` (``meaning`` says what its axes are)."""
    a = float_array(w, name, min_ndim=0)
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {meaning} = {tuple(shape)}, got shape {a.shape}")
    return a


def check_attn_mask(mask: object, name: str, user_shape: tuple) -> np.ndarray:
    """A bool or float mask broadcastable to ``user_shape`` (the scores the caller sees)."""
    m = np.asarray(mask)
    if m.dtype != np.bool_ and m.dtype.kind != "f" and not is_bfloat16(m.dtype):
        raise TypeError(
            f"{name} must be a bool array (True = may attend) or a float array added to the "
            f"scores, got dtype {m.dtype}"
        )
    try:
        if m.ndim > len(user_shape):
            raise ValueError
        if broadcast_shape(m.shape, user_shape) != tuple(user_shape):
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{name} of shape {m.shape} does not broadcast to the attention scores' "
            f"shape {tuple(user_shape)} (..., Hq, Lq, Lk)"
        ) from None
    return m


def check_valid_lens(valid_lens: object, rows_shape: tuple, num_keys: int) -> np.ndarray:
    """Integer lengths whose shape is a leading prefix of ``rows_shape`` (the score rows,
    (..., Hq, Lq)) with size-1 axes broadcasting, each in ``[0, num_keys]``."""
    vl = np.asarray(valid_lens)
    if vl.dtype.kind not in "iu":
        raise TypeError(f"valid_lens must be an integer array, got dtype {vl.dtype}")
    rows_shape = tuple(rows_shape)
    if vl.ndim > len(rows_shape) or any(n not in (1, r) for n, r in zip(vl.shape, rows_shape)):
        raise ValueError(
            f"valid_lens of shape {vl.shape} is not a leading prefix of the score rows' shape "
            f"{rows_shape} (size-1 axes broadcast): e.g. {rows_shape[:1]} for one length per "
            f"leading entry, or {rows_shape} for one per query row"
        )
    if vl.size:
        lo, hi = int(vl.min()), int(vl.max())
        if lo < 0 or hi > num_keys:
            raise ValueError(
                f"valid_lens must lie in [0, {num_keys}] (the number of keys), "
                f"got values from {lo} to {hi}"
            )
    return vl


def may_self_overlap(a: np.ndarray) -> bool:
    """Whether two elements of ``a`` may share memory (a stride-0 axis of size > 1, or any
    axes whose strides interleave: each axis, by increasing stride, must step past the whole
    extent of the smaller ones)."""
    if a.size == 0:
        return False
    extent = a.itemsize
    for stride, n in sorted((abs(s), n) for s, n in zip(a.strides, a.shape) if n > 1):
        if stride < extent:
            return True
        extent += stride * (n - 1)
    return False


def check_out(out: object, shape: tuple, dtype: np.dtype, inputs: dict) -> np.ndarray:
    """A caller-supplied ``out=`` buffer: exact shape and dtype, writeable, no element
    twice, sharing no memory with ``inputs`` (judged from the arrays' bounds)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(
            f"out must have shape {tuple(shape)} and dtype {dtype}, "
            f"got shape {out.shape} and dtype {out.dtype}"
        )
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    if may_self_overlap(out):
        raise ValueError(
            f"out has overlapping elements (shape {out.shape}, strides {out.strides}): pass a "
            "buffer whose elements are distinct"
        )
    for name, arr in inputs.items():
        if arr is not None and np.may_share_memory(out, arr):
            raise ValueError(f"out shares memory with {name}; pass a separate buffer")
    return out


def _inverse_power(x: float, power: int, name: str, dtype: np.dtype, what: str) -> float:
    """``1 / x**power``, which must be finite in ``dtype`` (x > 0 already checked)."""
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        value = float(np.float64(1.0) / np.float64(x) ** power)
    if not value <= float(np.finfo(dtype).max):
        raise ValueError(f"{name} gives {what} = {value:.3g}, which is not finite in {dtype}")
    return value


# --------------------------------------------------------------------------------------
# Attention layouts: scaled_dot_product_attention, additive_attention, attention


def _check_features(q, k, e: int, ek: int) -> None:
    """Query and key feature sizes (last axes) match and are >= 1."""
    if ek != e:
        raise ValueError(
            f"key has feature size {ek} (last axis) but query has {e}: they must match "
            f"(query {q.shape}, key {k.shape})"
        )
    if e == 0:
        raise ValueError(f"query and key must have a feature size E >= 1, got shape {q.shape}")


def _check_heads(k, v, hq: int, hkv: int, hv: int) -> None:
    """Value and key heads match, and the key heads divide the query heads (GQA)."""
    if hv != hkv:
        raise ValueError(f"value has {hv} heads but key has {hkv} (key {k.shape}, value {v.shape})")
    if (hkv == 0 and hq != 0) or (hkv and hq % hkv):
        raise ValueError(f"key has {hkv} heads, which does not divide query's {hq} heads")


def _layout(
    query, key, value, attn_mask, masking: tuple, weights=(), same_features=True, int8_kv=False
) -> SdpaArgs:
    """The layout rules shared by every attention function (``scale``/``softcap`` left at
    1 / None); ``masking``: the call's (valid_lens, is_causal, causal_alignment, window),
    checked by :func:`_record`. ``same_features``: query and key must have the same
    feature size E >= 1 (else each is projected on its own). The dtypes of ``weights``
    join the result's. ``int8_kv``: key and value are int8 arrays (checked by the
    caller); the result has the query's dtype."""
    q = float_array(query, "query")
    if int8_kv:
        k, v = key, value
        result, compute = result_dtypes(q)
    else:
        k = float_array(key, "key")
        v = float_array(value, "value")
        result, compute = result_dtypes(q, k, v, *weights)
    out_ndim = max(q.ndim, k.ndim, v.ndim)
    q3 = q if q.ndim >= 3 else q[None]
    k3 = k if k.ndim >= 3 else k[None]
    v3 = v if v.ndim >= 3 else v[None]
    batch = broadcast_shape(q3.shape[:-3], k3.shape[:-3], v3.shape[:-3])
    if batch is None:
        raise ValueError(
            f"the leading (batch) dims of query {q.shape}, key {k.shape} and value {v.shape} "
            "do not broadcast together"
        )
    hq, lq, e = q3.shape[-3:]
    hkv, lk, ek = k3.shape[-3:]
    hv, lv, ev = v3.shape[-3:]
    if same_features:
        _check_features(q, k, e, ek)
    if lv != lk:
        raise ValueError(
            f"value has {lv} positions (axis -2) but key has {lk} (key {k.shape}, value {v.shape})"
        )
    _check_heads(k, v, hq, hkv, hv)
    if len(batch) > _MAX_BATCH_DIMS:
        raise ValueError(f"at most 61 leading (batch) dims are supported, got {len(batch)}")

    return _record(q3, k3, v3, batch, (result, compute), out_ndim, attn_mask, masking)


def _masking(full_out: tuple, lk: int, compute_dtype, out_ndim: int, mask, masking: tuple):
    """The checked ``masking`` of an attention call's :class:`fastattn._args.SdpaArgs`, from
    the shapes alone: the result ``full_out`` (every batch dim; its size in ``compute_dtype``
    checked) over ``lk`` keys, the mask and ``masking`` (valid lengths, causality, causal
    alignment, window) checked against the scores the caller sees (``out_ndim`` dims)."""
    lens, causal, alignment, window = masking
    check_result_size(full_out, np.dtype(compute_dtype).itemsize, "the result")
    scores = full_out[len(full_out) - out_ndim : -1] + (lk,)
    return (
        None if mask is None else check_attn_mask(mask, "attn_mask", scores),
        None if lens is None else check_valid_lens(lens, scores[:-1], lk),
        check_flag(causal, "is_causal"),
        check_alignment(alignment) == "bottom_right",
        check_window(window),
        _block_summary(mask),
    )


def _record(q3, k3, v3, batch, dtypes, out_ndim, mask, masking: tuple) -> SdpaArgs:
    """The record of q/k/v whose shapes are checked (at least 3-D, batch dims ``batch``,
    ``dtypes`` = (result, compute)), with the mask and ``masking`` checked by
    :func:`_masking`."""
    full_out = batch + (q3.shape[-3], q3.shape[-2], v3.shape[-1])
    checked = _masking(full_out, k3.shape[-2], dtypes[1], out_ndim, mask, masking)
    return SdpaArgs(
        query=q3, key=k3, value=v3, batch=batch, dtypes=dtypes, out_ndim=out_ndim, masking=checked
    )


def _block_summary(attn_mask: object):
    """The precomputed tile summary of a BlockMask ``attn_mask``, else None."""
    if attn_mask is None or isinstance(attn_mask, np.ndarray):
        return None
    from fastattn._block_mask import BlockMask  # (it imports this module)

    return attn_mask.summary if isinstance(attn_mask, BlockMask) else None


def quantize_args(x: object, axis: object) -> tuple[np.ndarray, int]:
    """quantize_kv's input (a float array of at least 1 dim) and its axis, normalised."""
    a = float_array(x, "x", min_ndim=1)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if not -a.ndim <= axis < a.ndim:
        raise ValueError(f"axis {axis} is out of range for x of {a.ndim} dimensions")
    return a, int(axis) % a.ndim


def _check_scale(scale: object, head_dim: int, compute_dtype: np.dtype) -> float:
    """``scale`` (default ``1 / sqrt(head_dim)``), finite in the compute dtype."""
    value = 1.0 / math.sqrt(head_dim) if scale is None else check_real(scale, "scale")
    limit = _FINFO_MAX[compute_dtype]
    if abs(value) > limit:
        raise ValueError(
            f"scale must be finite in {compute_dtype} (|scale| <= {limit:.3g}), got {scale}"
        )
    return value


def _int8_kv(key, value, key_scale, value_scale) -> bool:
    """Whether key/value are int8 (a quantised cache), with the scale rules: int8 key and
    value come together and each with its scale; a scale goes with int8 only."""
    k_int8 = isinstance(key, np.ndarray) and key.dtype == np.int8
    v_int8 = isinstance(value, np.ndarray) and value.dtype == np.int8
    for name, is_int8, scale, arr in (
        ("key", k_int8, key_scale, key),
        ("value", v_int8, value_scale, value),
    ):
        if is_int8 and scale is None:
            raise TypeError(
                f"{name} is int8: {name}_scale (float, shape {name}.shape[:-1], one scale per "
                f"{name} vector) is required to say what it stands for"
            )
        if not is_int8 and scale is not None:
            raise TypeError(
                f"{name}_scale is only for an int8 {name} (a quantised cache), got {name} of "
                f"dtype {np.asarray(arr).dtype}"
            )
    if k_int8 != v_int8:
        raise TypeError("key and value must both be int8 (quantised) or both floating point")
    return k_int8


def _kv_scale(scale: object, name: str, kv: np.ndarray) -> np.ndarray:
    """A scale array of an int8 key/value: float, shape ``kv.shape[:-1]``."""
    s = float_array(scale, name, min_ndim=0)
    if s.shape != kv.shape[:-1]:
        raise ValueError(
            f"{name} must have shape {kv.shape[:-1]} (key.shape[:-1], one scale per vector), "
            f"got shape {s.shape}"
        )
    return s


def sdpa_args(
    query,
    key,
    value,
    attn_mask,
    valid_lens=None,
    is_causal=False,
    causal_alignment="top_left",
    window=None,
    scale=None,
    softcap=None,
    sinks=None,
    alibi_slopes=None,
    key_scale=None,
    value_scale=None,
) -> SdpaArgs:
    int8 = _int8_kv(key, value, key_scale, value_scale)
    if int8:
        if key.ndim < 2 or value.ndim < 2:
            raise ValueError(
                f"key and value must have at least 2 dimensions (..., L, E), got shapes "
                f"{key.shape} and {value.shape}"
            )
        ks = _kv_scale(key_scale, "key_scale", key)
        vs = _kv_scale(value_scale, "value_scale", value)
    masking = (valid_lens, is_causal, causal_alignment, window)
    args = _layout(query, key, value, attn_mask, masking, int8_kv=int8)
    if int8:
        if args.compute_dtype != np.float32:
            raise TypeError(
                "int8 key/value are computed in float32: query must be float16, bfloat16 or "
                f"float32, got {args.query.dtype}"
            )
        args.key_scale = ks if ks.ndim >= 2 else ks[None]
        args.value_scale = vs if vs.ndim >= 2 else vs[None]
    args.scale = _check_scale(scale, args.query.shape[-1], args.compute_dtype)
    args.softcap = _check_softcap(softcap, args.compute_dtype)
    heads = args.full_out_shape[:-2]
    if sinks is not None:
        args.sinks = check_head_values(sinks, "sinks", heads)
    if alibi_slopes is not None:
        args.alibi_slopes = check_head_values(alibi_slopes, "alibi_slopes", heads)
    return args


def _check_softcap(softcap: object, compute_dtype: np.dtype) -> float | None:
    """``softcap`` > 0, or None (none, also for a cap too large to change a score)."""
    cap = None if softcap is None else check_real(softcap, "softcap", positive=True)
    if cap is not None and cap > _FINFO_MAX[compute_dtype]:
        cap = None  # c * tanh(s / c) == s to the last bit for any c this large
    return cap


def _packed(x: object, name: str, layout: str) -> np.ndarray:
    a = float_array(x, name, min_ndim=0)
    if a.ndim != 3:
        raise ValueError(
            f"{name} must have 3 dimensions {layout} (packed tokens, heads, features), "
            f"got shape {a.shape}"
        )
    return a


def _boundaries(cu: object, name: str, total: int, total_name: str) -> np.ndarray:
    """Sequence boundaries: 1-D integers, 0 first, ``total`` last, non-decreasing."""
    a = np.asarray(cu)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an array of integers, got dtype {a.dtype}")
    if a.ndim != 1 or a.shape[0] < 1:
        raise ValueError(
            f"{name} must be 1-D with N + 1 >= 1 boundaries (N = the number of sequences), "
            f"got shape {a.shape}"
        )
    if a[0] != 0 or a[-1] != total:
        raise ValueError(
            f"{name} must start at 0 and end at {total_name} = {total}, got {a[0]} ... {a[-1]}"
        )
    steps = np.diff(a.astype(np.int64))
    if steps.size and steps.min() < 0:
        at = int(np.argmax(steps < 0))
        raise ValueError(
            f"{name} must be non-decreasing: {name}[{at + 1}] = {a[at + 1]} < "
            f"{name}[{at}] = {a[at]}"
        )
    return a.astype(np.int64, copy=False)


def varlen_args(
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
    sinks=None,
    alibi_slopes=None,
) -> VarlenArgs:
    q = _packed(query, "query", "(total_q, Hq, E)")
    k = _packed(key, "key", "(total_k, Hkv, E)")
    v = _packed(value, "value", "(total_k, Hkv, Ev)")
    result, compute = result_dtypes(q, k, v)
    (tq, hq, e), (tk, hkv, ek), (tv, hv, ev) = q.shape, k.shape, v.shape
    _check_features(q, k, e, ek)
    if tv != tk:
        raise ValueError(
            f"value has {tv} tokens (axis 0) but key has {tk} (key {k.shape}, value {v.shape})"
        )
    _check_heads(k, v, hq, hkv, hv)
    cu_q = _boundaries(cu_seqlens_q, "cu_seqlens_q", tq, "total_q (query.shape[0])")
    cu_k = _boundaries(cu_seqlens_k, "cu_seqlens_k", tk, "total_k (key.shape[0])")
    if cu_q.shape != cu_k.shape:
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_k must have the same length N + 1 (one boundary per "
            f"sequence, plus one), got {cu_q.shape[0]} and {cu_k.shape[0]}"
        )
    causal = check_flag(is_causal, "is_causal")
    check_alignment(causal_alignment)
    args = VarlenArgs(
        query=q,
        key=k,
        value=v,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        result_dtype=result,
        compute_dtype=compute,
        out_shape=(tq, hq, ev),
        scale=1.0,
        softcap=None,
        is_causal=causal,
        bottom_right=causal_alignment == "bottom_right",
        window=check_window(window),
    )
    args.scale = _check_scale(scale, args.query.shape[-1], args.compute_dtype)
    args.softcap = _check_softcap(softcap, compute)
    if sinks is not None:
        args.sinks = check_head_values(sinks, "sinks", (hq,))
    if alibi_slopes is not None:
        args.alibi_slopes = check_head_values(alibi_slopes, "alibi_slopes", (hq,))
    return args


def set_family_sinks(spec, sinks: object) -> None:
    """attention(..., sinks=): the softmax normaliser only, and not the gaussian score (its
    kernels drop the per-row term ``-||q||^2 / (2 h^2)``, which a sink does not cancel);
    stored on ``spec.args``."""
    if sinks is None:
        return
    if spec.normalize != "softmax":
        raise ValueError(
            'sinks need normalize="softmax" (they join the softmax denominator), '
            f"got normalize={spec.normalize!r}"
        )
    if spec.score == "gaussian":
        raise ValueError(
            'sinks are not supported with score="gaussian" (use another score, or '
            "nadaraya_watson without sinks)"
        )
    args = spec.args
    args.sinks = check_head_values(sinks, "sinks", args.full_out_shape[:-2])


def check_head_values(values: object, name: str, heads_shape: tuple) -> np.ndarray:
    """One float per query head (sinks, ALiBi slopes): shape ``(Hq,)`` or any shape that
    broadcasts to the score rows' leading shape ``heads_shape = (..., Hq)``."""
    a = np.asarray(values)
    if a.dtype.kind != "f" or a.dtype.newbyteorder("=") not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating-point array (float16, float32 or float64), "
            f"got dtype {a.dtype}"
        )
    fits = 1 <= a.ndim <= len(heads_shape) and broadcast_shape(a.shape, heads_shape) == heads_shape
    if not fits:
        raise ValueError(
            f"{name} must have one value per query head: shape ({heads_shape[-1]},) or a shape "
            f"that broadcasts to the score rows' leading shape (..., Hq) = {heads_shape}, "
            f"got shape {a.shape}"
        )
    return a


def _parts(parts: object, name: str) -> list:
    """A non-empty sequence of arrays as a list (an ndarray counts as the sequence of its
    sub-arrays along axis 0)."""
    if isinstance(parts, (str, bytes, dict)) or not hasattr(parts, "__iter__"):
        raise TypeError(f"{name} must be a sequence of arrays, got {type(parts).__name__}")
    items = list(parts)
    if not items:
        raise ValueError(f"{name} must hold at least one array, got an empty sequence")
    return items


def merge_states_args(outputs: object, lses: object) -> MergeArgs:
    """Every part one shape ``(..., Lq, Ev)`` (no broadcasting between parts), one lse of
    shape ``(..., Lq)`` per part, all floating point (mixed dtypes promote)."""
    outs = _parts(outputs, "outputs")
    ls = _parts(lses, "lses")
    if len(ls) != len(outs):
        raise ValueError(
            f"lses must hold one array per output: got {len(outs)} outputs and {len(ls)} lses"
        )
    # float_array (and its message's name) only where the common case does not hold: a
    # call's overhead is per part.
    outs = [
        o
        if type(o) is np.ndarray and o.dtype in _NATIVE_KERNEL_DTYPES and o.ndim >= 2
        else float_array(o, f"outputs[{i}]", min_ndim=2)
        for i, o in enumerate(outs)
    ]
    shape = outs[0].shape
    for i, o in enumerate(outs):
        if o.shape != shape:
            raise ValueError(
                f"outputs[{i}] has shape {o.shape} but outputs[0] has shape {shape}: every "
                "part must have the same shape (parts do not broadcast)"
            )
    ls = [
        x
        if type(x) is np.ndarray and x.dtype in _NATIVE_KERNEL_DTYPES
        else float_array(x, f"lses[{i}]", min_ndim=0)
        for i, x in enumerate(ls)
    ]
    for i, x in enumerate(ls):
        if x.shape != shape[:-1]:
            raise ValueError(
                f"lses[{i}] must have shape {shape[:-1]} (the outputs' shape without the last "
                f"axis), got {x.shape}"
            )
    result, compute = result_dtypes(*outs, *ls)
    return MergeArgs(outs, ls, result, compute)


def additive_weights(w_q, w_k, w_v, dim_q: int, dim_k: int) -> AdditiveWeights:
    if w_q is None or w_k is None or w_v is None:
        missing = [n for n, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)) if w is None]
        raise ValueError(f"additive scores need w_q, w_k and w_v; missing {', '.join(missing)}")
    wq = float_array(w_q, "w_q", min_ndim=0)
    if wq.ndim != 2 or wq.shape[0] != dim_q:
        raise ValueError(
            f"w_q must have shape (query features, hidden) = ({dim_q}, hidden), "
            f"got shape {wq.shape}"
        )
    hidden = wq.shape[1]
    wk = _weight(w_k, "w_k", (dim_k, hidden), "(key features, hidden)")
    wv = _weight(w_v, "w_v", (hidden,), "(hidden,)")
    return AdditiveWeights(wq, wk, wv)


def additive_args(
    query,
    key,
    value,
    w_q,
    w_k,
    w_v,
    attn_mask=None,
    valid_lens=None,
    is_causal=False,
    causal_alignment="top_left",
    window=None,
) -> tuple[SdpaArgs, AdditiveWeights]:
    ws = [
        float_array(w, n, min_ndim=0)
        for n, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v))
        if w is not None
    ]
    masking = (valid_lens, is_causal, causal_alignment, window)
    args = _layout(query, key, value, attn_mask, masking, weights=ws, same_features=False)
    return args, additive_weights(w_q, w_k, w_v, args.query.shape[-1], args.key.shape[-1])


def attention_spec(
    query,
    key,
    value,
    attn_mask,
    *,
    score,
    normalize,
    scale,
    weight,
    temperature,
    bandwidth,
    w_q,
    w_k,
    w_v,
    top_k,
    valid_lens,
    is_causal,
    causal_alignment,
    window,
) -> AttentionSpec:
    score = check_choice(score, "score", SCORES)
    normalize = check_choice(normalize, "normalize", NORMALIZERS)
    given = {
        "scale": scale,
        "weight": weight,
        "temperature": temperature,
        "bandwidth": bandwidth,
        "w_q": w_q,
        "w_k": w_k,
        "w_v": w_v,
    }
    for name, val in given.items():
        if val is not None and name not in _SCORE_PARAMS[score]:
            users = [s for s, ps in _SCORE_PARAMS.items() if name in ps]
            raise ValueError(
                f"{name}= is a parameter of score={users[0]!r}, not of score={score!r}"
            )
    if normalize == "topk":
        if top_k is None:
            raise ValueError("normalize='topk' needs top_k= (the number of keys kept per row)")
        k = check_size(top_k, "top_k")
    elif top_k is not None:
        raise ValueError(
            f"top_k= is a parameter of normalize='topk', not of normalize={normalize!r}"
        )
    else:
        k = None

    # The masking arguments, in the order every attention call's checks take them.
    masking = (valid_lens, is_causal, causal_alignment, window)
    if score == "additive":
        args, aw = additive_args(query, key, value, w_q, w_k, w_v, attn_mask, *masking)
        return AttentionSpec(args, score, normalize, k, 1.0, additive=aw)
    if score == "general":
        if weight is None:
            raise ValueError(
                "score='general' needs weight= of shape (query features, key features)"
            )
        wt = float_array(weight, "weight", min_ndim=0)
        args = _layout(query, key, value, attn_mask, masking, weights=[wt], same_features=False)
        eq, ek = args.query.shape[-1], args.key.shape[-1]
        if wt.shape != (eq, ek):
            raise ValueError(
                f"weight must have shape (query features, key features) = ({eq}, {ek}), "
                f"got shape {wt.shape}"
            )
        if ek == 0:
            raise ValueError(
                f"query and key must have a feature size E >= 1, got key shape {np.shape(key)}"
            )
        return AttentionSpec(args, score, normalize, k, 1.0, weight=wt)

    factor_scale = scale if score == "scaled_dot" else None
    args = sdpa_args(query, key, value, attn_mask, *masking, factor_scale)
    dtype = args.compute_dtype
    if score == "dot":
        factor = 1.0
    elif score == "scaled_dot":
        factor = args.scale
    elif score == "cosine":
        t = 1.0 if temperature is None else check_real(temperature, "temperature", positive=True)
        factor = _inverse_power(t, 1, "temperature", dtype, "1 / temperature")
    else:  # gaussian
        h = 1.0 if bandwidth is None else check_real(bandwidth, "bandwidth", positive=True)
        factor = _inverse_power(h, 2, "bandwidth", dtype, "1 / bandwidth**2")
        return AttentionSpec(args, score, normalize, k, factor, bandwidth=h)
    return AttentionSpec(args, score, normalize, k, factor)


# --------------------------------------------------------------------------------------
# masked_softmax


def masked_softmax_args(x, valid_lens, mask, axis, out) -> SoftmaxArgs:
    a = float_array(x, "x", min_ndim=1)
    result, compute = result_dtypes(a)
    ax = check_index(axis, "axis must be an int")
    if not -a.ndim <= ax < a.ndim:
        raise ValueError(f"axis {axis} is out of bounds for x with {a.ndim} dimensions")
    ax %= a.ndim
    if out is not None:
        check_out(out, a.shape, result, {"x": x, "valid_lens": valid_lens, "mask": mask})
    vl = None
    if valid_lens is not None:
        vl = check_valid_lens(valid_lens, a.shape[:ax] + a.shape[ax + 1 :], a.shape[ax])
    m = None
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"mask must be a bool array (True = keep), got dtype {m.dtype}")
        try:
            if broadcast_shape(m.shape, a.shape) != a.shape:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"mask of shape {m.shape} does not broadcast to x's shape {a.shape}"
            ) from None
    return SoftmaxArgs(a, ax, result, compute, m, vl)


# --------------------------------------------------------------------------------------
# nadaraya_watson


def _features(x: object, name: str) -> np.ndarray:
    a = float_array(x, name, min_ndim=1)
    if a.ndim == 1:  # scalar features
        a = a[:, None]
    if a.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one feature (last axis), got shape {a.shape}")
    return a


def _bandwidth_range(dtype: np.dtype) -> tuple[float, float]:
    """Bandwidths h for which h^2 and 1 / (2 h^2) are normal numbers in ``dtype``."""
    fi = np.finfo(dtype)
    return math.sqrt(float(fi.tiny)) * 2.0, math.sqrt(float(fi.max)) / 2.0


def regression_args(x_query, x_keys, y_values, kernel, bandwidth) -> RegressionArgs:
    xq = _features(x_query, "x_query")
    xk = _features(x_keys, "x_keys")
    y0 = float_array(y_values, "y_values", min_ndim=1)
    scalar_y = y0.ndim == 1
    y = y0[:, None] if scalar_y else y0
    result, compute = result_dtypes(xq, xk, y)
    if xq.shape[-1] != xk.shape[-1]:
        raise ValueError(
            f"x_keys has {xk.shape[-1]} features (last axis) but x_query has {xq.shape[-1]}: "
            f"they must match (x_query {np.shape(x_query)}, x_keys {np.shape(x_keys)})"
        )
    if y.shape[-2] != xk.shape[-2]:
        axis = "axis 0" if scalar_y else "axis -2"
        raise ValueError(
            f"y_values has {y.shape[-2]} entries ({axis}) but x_keys has {xk.shape[-2]} keys "
            f"(x_keys {np.shape(x_keys)}, y_values {np.shape(y_values)})"
        )
    batch = broadcast_shape(xq.shape[:-2], xk.shape[:-2], y.shape[:-2])
    if batch is None:
        raise ValueError(
            f"the leading (batch) dims of x_query {np.shape(x_query)}, x_keys "
            f"{np.shape(x_keys)} and y_values {np.shape(y_values)} do not broadcast together"
        )
    check_result_size(batch + xq.shape[-2:-1] + y.shape[-1:], 8, "the result")
    if len(batch) > _MAX_BATCH_DIMS:
        raise ValueError(f"at most 61 leading (batch) dims are supported, got {len(batch)}")
    kernel = check_choice(kernel, "kernel", KERNELS)
    if isinstance(bandwidth, str):
        if bandwidth != "silverman":
            raise ValueError(
                f"bandwidth must be a positive number, an array of them or 'silverman', "
                f"got {bandwidth!r}"
            )
        h = silverman_bandwidth(xk)
    elif isinstance(bandwidth, numbers.Real) and not isinstance(bandwidth, (bool, np.bool_)):
        h = np.asarray(check_real(bandwidth, "bandwidth", positive=True), dtype=np.float64)
    else:
        b = np.asarray(bandwidth)
        if b.dtype.kind not in "fiu":
            raise TypeError(
                f"bandwidth must be a positive number, an array of them or 'silverman', "
                f"got {type(bandwidth).__name__} of dtype {b.dtype}"
            )
        h = b.astype(np.float64)
        if not (np.isfinite(h) & (h > 0)).all():
            raise ValueError("bandwidth must be finite and > 0 everywhere")
    lo, hi = _bandwidth_range(compute)
    if h.size and (h.min() < lo or h.max() > hi):
        raise ValueError(
            f"bandwidth must lie in [{lo:.3g}, {hi:.3g}] for {compute} inputs (its square "
            f"scales the squared distances), got values from {h.min():.3g} to {h.max():.3g}"
        )
    try:
        if h.ndim > len(batch) or broadcast_shape(h.shape, batch) != batch:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"bandwidth of shape {h.shape} does not broadcast to the batch shape {batch}"
        ) from None
    lq = xq.shape[-2]
    out_shape = batch + ((lq,) if scalar_y else (lq, y.shape[-1]))
    return RegressionArgs(
        xq,
        xk,
        y,
        batch,
        kernel,
        np.broadcast_to(h, batch),
        result,
        compute,
        out_shape,
        batch + (lq, xk.shape[-2]),
    )


# --------------------------------------------------------------------------------------
# MultiHeadAttention's call (its construction and parameters: fastattn._layer_checks)


def sequence_input(x: object, name: str, features: int, feature_name: str) -> np.ndarray:
    """A ``(B, L, features)`` or ``(L, features)`` float array."""
    a = float_array(x, name)
    if a.ndim > 3 or a.shape[-1] != features:
        raise ValueError(
            f"{name} must have shape (B, L, {features}) or (L, {features}) "
            f"({feature_name}={features}), got shape {a.shape}"
        )
    return a


def layer_inputs(query, key, value, embed_dim: int, kdim: int, vdim: int):
    """(query, key, value) checked against the layer's sizes, all 3-D ``(B, L, features)``,
    and whether the inputs were batched. ``key`` defaults to ``query``, ``value`` to ``key``."""
    q = sequence_input(query, "query", embed_dim, "embed_dim")
    k = q if key is None else sequence_input(key, "key", kdim, "kdim")
    if key is None and q.shape[-1] != kdim:
        raise ValueError(
            f"key defaults to query, whose feature size {q.shape[-1]} is not kdim={kdim}; "
            "pass key explicitly"
        )
    if value is None:
        v = k
        if k.shape[-1] != vdim:
            raise ValueError(
                f"value defaults to {'query' if key is None else 'key'}, whose feature size "
                f"{k.shape[-1]} is not vdim={vdim}; pass value explicitly"
            )
    else:
        v = sequence_input(value, "value", vdim, "vdim")
    for name, a in (("key", k), ("value", v)):
        if a.ndim != q.ndim:
            raise ValueError(
                f"{name} has shape {a.shape} but query has shape {q.shape}: both batched "
                "(B, L, features) or both unbatched (L, features)"
            )
        if q.ndim == 3 and a.shape[0] != q.shape[0]:
            raise ValueError(
                f"{name} has batch size {a.shape[0]} but query has {q.shape[0]} "
                f"({name} {a.shape}, query {q.shape})"
            )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"value has {v.shape[-2]} positions but key has {k.shape[-2]} "
            f"(key {k.shape}, value {v.shape})"
        )
    batched = q.ndim == 3
    if not batched:
        q, k, v = q[None], k[None], v[None]
    return q, k, v, batched


def head_valid_lens(valid_lens: object, batch: int, num_q: int, batched: bool):
    """``valid_lens`` of the layer, ``()``/``(B,)``/``(B, Lq)`` (unbatched: ``()``/``(Lq,)``),
    as the kernel's valid_lens for scores ``(B, H, Lq, Lk)``: a head axis goes in before Lq."""
    if valid_lens is None:
        return None
    vl = np.asarray(valid_lens)
    if vl.dtype.kind not in "iu":
        raise TypeError(f"valid_lens must be an integer array, got dtype {vl.dtype}")
    rows = (batch, num_q) if batched else (num_q,)
    if vl.ndim > len(rows) or any(n not in (1, r) for n, r in zip(vl.shape, rows)):
        forms = (
            "(B,) for one length per sequence or (B, Lq) for one per query"
            if batched
            else "() for one length or (Lq,) for one per query"
        )
        raise ValueError(
            f"valid_lens of shape {vl.shape} does not fit the queries' shape {rows}: "
            f"expected {forms} (size-1 axes broadcast)"
        )
    if not batched:
        vl = vl[None] if vl.ndim else vl
    if vl.ndim == 2:  # per query: (B, Lq) -> (B, 1, Lq), broadcast over the heads
        vl = vl[:, None, :]
    return vl


def check_unbatched_mask(attn_mask: object, batched: bool):
    """An unbatched call's mask broadcasts to ``(H, Lq, Lk)``: no batch axis of its own."""
    if attn_mask is not None and not batched and np.ndim(attn_mask) > 3:
        raise ValueError(
            f"attn_mask of shape {np.shape(attn_mask)} has more dims than the scores of an "
            "unbatched call (H, Lq, Lk)"
        )
    return attn_mask


def kv_cache_rows(
    cache: object, cache_type: type, layout: tuple, batch: int, num_new: int
) -> tuple[int, int]:
    """(start, stop) rows of ``cache`` for ``num_new`` new positions, after checking that
    it is a ``cache_type`` (the KVCache class) of the layer's ``layout`` (num_kv_heads,
    head_dim, dtype) and batch, with room for them."""
    if not isinstance(cache, cache_type):
        raise TypeError(
            f"kv_cache must be a KVCache from MultiHeadAttention.new_kv_cache, "
            f"got {type(cache).__name__}"
        )
    theirs = (cache.num_kv_heads, cache.head_dim, cache.dtype)
    if layout != theirs:
        raise ValueError(
            f"kv_cache holds num_kv_heads={theirs[0]}, head_dim={theirs[1]}, "
            f"dtype={theirs[2]}, but this layer has num_kv_heads={layout[0]}, "
            f"head_dim={layout[1]}, dtype={layout[2]}"
        )
    if cache.batch != batch:
        raise ValueError(
            f"kv_cache was made for batch={cache.batch} but the inputs have batch size "
            f"{batch} (an unbatched call counts as batch 1)"
        )
    start = cache.length
    stop = start + num_new
    if stop > cache.max_len:
        raise ValueError(
            f"kv_cache is full: appending {num_new} positions to the {start} cached would "
            f"exceed its max_len={cache.max_len}; make a larger one with "
            "new_kv_cache(batch, max_len)"
        )
    return start, stop


def layer_attention_kind(dtype: np.dtype, head_dim: int) -> tuple[tuple, float]:
    """What every call of a layer of ``dtype`` and ``head_dim`` attends with, checked once
    when the layer is made: the (result, compute) dtypes and the scale ``1 / sqrt(D)``."""
    dtypes = result_dtypes(np.empty(0, dtype))
    return dtypes, _check_scale(None, head_dim, dtypes[1])


def layer_masking(out_shape: tuple, num_keys: int, compute_dtype, attn_mask, masking: tuple):
    """The masking of a layer call's attention (``masking``: valid_lens, is_causal,
    causal_alignment, window), checked before anything is projected against the scores
    ``(B, H, Lq, Lk)`` its heads will have: ``out_shape`` ``(B, H, Lq, D)``, ``Lk =
    num_keys``. The record over the projected heads is made of it."""
    return _masking(out_shape, num_keys, compute_dtype, 4, attn_mask, masking)

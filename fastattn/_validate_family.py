"""Checks and conversions of the attention-family functions, shared by the fast functions
(``fastattn._family``) and their NumPy twins (``fastattn.reference``).

Built on the helpers of :mod:`fastattn._validate`; each message names the argument, what it
got and what was expected.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass

import numpy as np

from fastattn._validate import (
    SdpaArgs,
    broadcast_mask,
    broadcast_valid_lens,
    check_flag,
    check_out,
    check_real,
    check_window,
    float_array,
    result_dtypes,
    sdpa_args,
    with_leading_axes,
)

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
# masked_softmax


@dataclass
class SoftmaxArgs:
    x: np.ndarray  # as given (float16/32/64), not moved
    axis: int  # normalised to [0, ndim)
    result_dtype: np.dtype
    compute_dtype: np.dtype
    mask: np.ndarray | None  # bool, broadcast to x's shape (a view)
    valid_lens: np.ndarray | None  # int64, broadcast to the rows' shape (x without axis)


def masked_softmax_args(x, valid_lens, mask, axis, out) -> SoftmaxArgs:
    a = float_array(x, "x", min_ndim=1)
    result, compute = result_dtypes(a)
    if isinstance(axis, (bool, np.bool_)):
        raise TypeError(f"axis must be an int, got {axis!r}")
    try:
        ax = operator.index(axis)
    except TypeError:
        raise TypeError(f"axis must be an int, got {axis!r}") from None
    if not -a.ndim <= ax < a.ndim:
        raise ValueError(f"axis {axis} is out of bounds for x with {a.ndim} dimensions")
    ax %= a.ndim
    if out is not None:
        check_out(out, a.shape, result, {"x": x, "valid_lens": valid_lens, "mask": mask})
    rows = a.shape[:ax] + a.shape[ax + 1:]
    vl = None
    if valid_lens is not None:
        vl = broadcast_valid_lens(valid_lens, rows, rows, a.shape[ax])
    m = None
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise TypeError(f"mask must be a bool array (True = keep), got dtype {m.dtype}")
        try:
            if np.broadcast_shapes(m.shape, a.shape) != a.shape:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"mask of shape {m.shape} does not broadcast to x's shape {a.shape}"
            ) from None
        m = np.broadcast_to(m, a.shape)
    return SoftmaxArgs(a, ax, result, compute, m, vl)


# --------------------------------------------------------------------------------------
# Attention layouts


def _weight(w: object, name: str, shape: tuple, meaning: str) -> np.ndarray:
    """A float weight array of exactly ``shape`` (``meaning`` says what its axes are)."""
    a = float_array(w, name, min_ndim=0)
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {meaning} = {tuple(shape)}, got shape {a.shape}")
    return a


def layout_args(query, key, value, attn_mask, valid_lens, is_causal, causal_alignment, window,
                *, weights=()) -> SdpaArgs:
    """Like :func:`fastattn._validate.sdpa_args` (same layout rules and messages), but the
    query and key feature sizes may differ (each is projected on its own) and the dtypes of
    ``weights`` join the result dtype. ``scale``/``softcap`` are left at 1 / None."""
    q = float_array(query, "query")
    k = float_array(key, "key")
    v = float_array(value, "value")
    result, compute = result_dtypes(q, k, v, *weights)
    out_ndim = max(q.ndim, k.ndim, v.ndim)
    q3, k3, v3 = (with_leading_axes(a, 3) for a in (q, k, v))
    try:
        batch = np.broadcast_shapes(q3.shape[:-3], k3.shape[:-3], v3.shape[:-3])
    except ValueError:
        raise ValueError(
            f"the leading (batch) dims of query {q.shape}, key {k.shape} and value {v.shape} "
            "do not broadcast together"
        ) from None
    hq, lq, _ = q3.shape[-3:]
    hkv, lk, _ = k3.shape[-3:]
    hv, lv, ev = v3.shape[-3:]
    if lv != lk:
        raise ValueError(
            f"value has {lv} positions (axis -2) but key has {lk} (key {k.shape}, value {v.shape})"
        )
    if hv != hkv:
        raise ValueError(f"value has {hv} heads but key has {hkv} (key {k.shape}, value {v.shape})")
    if (hkv == 0 and hq != 0) or (hkv and hq % hkv):
        raise ValueError(f"key has {hkv} heads, which does not divide query's {hq} heads")
    if len(batch) > 61:
        raise ValueError(f"at most 61 leading (batch) dims are supported, got {len(batch)}")
    full_out = batch + (hq, lq, ev)
    out_shape = full_out[len(full_out) - out_ndim:]
    full_scores = batch + (hq, lq, lk)
    scores = full_scores[len(full_scores) - out_ndim:]
    bool_mask = float_mask = None
    if attn_mask is not None:
        bool_mask, float_mask = broadcast_mask(attn_mask, "attn_mask", scores, full_scores,
                                               compute)
    vl = None
    if valid_lens is not None:
        vl = broadcast_valid_lens(valid_lens, scores[:-1], full_scores[:-1], lk)
    causal = check_flag(is_causal, "is_causal")
    if not isinstance(causal_alignment, str) or causal_alignment not in (
            "top_left", "bottom_right"):
        raise ValueError(
            f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}"
        )
    return SdpaArgs(
        query=q3, key=k3, value=v3, batch=batch, bool_mask=bool_mask, float_mask=float_mask,
        valid_lens=vl, result_dtype=result, compute_dtype=compute, out_shape=out_shape,
        full_out_shape=full_out, scale=1.0, softcap=None, is_causal=causal,
        diag_offset=(lk - lq) if causal_alignment == "bottom_right" else 0,
        window=check_window(window),
    )


@dataclass
class AdditiveWeights:
    w_q: np.ndarray  # (Dq, hidden)
    w_k: np.ndarray  # (Dk, hidden)
    w_v: np.ndarray  # (hidden,)


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


def additive_args(query, key, value, w_q, w_k, w_v, attn_mask, valid_lens, is_causal,
                  causal_alignment, window) -> tuple[SdpaArgs, AdditiveWeights]:
    ws = [float_array(w, n, min_ndim=0) for n, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v))
          if w is not None]
    args = layout_args(query, key, value, attn_mask, valid_lens, is_causal, causal_alignment,
                       window, weights=ws)
    return args, additive_weights(w_q, w_k, w_v, args.query.shape[-1], args.key.shape[-1])


# --------------------------------------------------------------------------------------
# attention(score=..., normalize=...)


@dataclass
class AttentionSpec:
    """A validated attention() call: the layout, the score and its parameters, the
    normaliser. ``scale`` is the factor of the dot product the kernels use (1 for "dot",
    "general" and "additive"; 1 / temperature for "cosine"; 1 / h^2 for "gaussian")."""

    args: SdpaArgs
    score: str
    normalize: str
    top_k: int | None
    scale: float
    weight: np.ndarray | None = None  # general: (Eq, Ek)
    additive: AdditiveWeights | None = None
    bandwidth: float | None = None  # gaussian


def _choice(value: object, name: str, choices: tuple) -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_count(value: object, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int >= 1, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int >= 1, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    return n


def _inverse_power(x: float, power: int, name: str, dtype: np.dtype, what: str) -> float:
    """``1 / x**power``, which must be finite in ``dtype`` (x > 0 already checked)."""
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        value = float(np.float64(1.0) / np.float64(x) ** power)
    if not value <= float(np.finfo(dtype).max):
        raise ValueError(f"{name} gives {what} = {value:.3g}, which is not finite in {dtype}")
    return value


def attention_spec(query, key, value, attn_mask, *, score, normalize, scale, weight,
                   temperature, bandwidth, w_q, w_k, w_v, top_k, valid_lens, is_causal,
                   causal_alignment, window) -> AttentionSpec:
    score = _choice(score, "score", SCORES)
    normalize = _choice(normalize, "normalize", NORMALIZERS)
    given = {"scale": scale, "weight": weight, "temperature": temperature,
             "bandwidth": bandwidth, "w_q": w_q, "w_k": w_k, "w_v": w_v}
    for name, val in given.items():
        if val is not None and name not in _SCORE_PARAMS[score]:
            users = [s for s, ps in _SCORE_PARAMS.items() if name in ps]
            raise ValueError(
                f"{name}= is a parameter of score={users[0]!r}, not of score={score!r}"
            )
    if normalize == "topk":
        if top_k is None:
            raise ValueError("normalize='topk' needs top_k= (the number of keys kept per row)")
        k = check_count(top_k, "top_k")
    elif top_k is not None:
        raise ValueError(f"top_k= is a parameter of normalize='topk', not of "
                         f"normalize={normalize!r}")
    else:
        k = None

    if score == "additive":
        args, aw = additive_args(query, key, value, w_q, w_k, w_v, attn_mask, valid_lens,
                                 is_causal, causal_alignment, window)
        return AttentionSpec(args, score, normalize, k, 1.0, additive=aw)
    if score == "general":
        if weight is None:
            raise ValueError("score='general' needs weight= of shape (query features, "
                             "key features)")
        wt = float_array(weight, "weight", min_ndim=0)
        args = layout_args(query, key, value, attn_mask, valid_lens, is_causal,
                           causal_alignment, window, weights=[wt])
        eq, ek = args.query.shape[-1], args.key.shape[-1]
        if wt.shape != (eq, ek):
            raise ValueError(
                f"weight must have shape (query features, key features) = ({eq}, {ek}), "
                f"got shape {wt.shape}"
            )
        if ek == 0:
            raise ValueError(f"query and key must have a feature size E >= 1, got key shape "
                             f"{np.shape(key)}")
        return AttentionSpec(args, score, normalize, k, 1.0, weight=wt)

    args = sdpa_args(query, key, value, attn_mask, valid_lens, is_causal, causal_alignment,
                     window, scale if score == "scaled_dot" else None, None)
    dtype = args.compute_dtype
    if score == "dot":
        factor = 1.0
    elif score == "scaled_dot":
        factor = args.scale
    elif score == "cosine":
        t = 1.0 if temperature is None else check_real(temperature, "temperature",
                                                        positive=True)
        factor = _inverse_power(t, 1, "temperature", dtype, "1 / temperature")
    else:  # gaussian
        h = 1.0 if bandwidth is None else check_real(bandwidth, "bandwidth", positive=True)
        factor = _inverse_power(h, 2, "bandwidth", dtype, "1 / bandwidth**2")
        return AttentionSpec(args, score, normalize, k, factor, bandwidth=h)
    return AttentionSpec(args, score, normalize, k, factor)


def unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows of ``a`` (last axis) scaled to unit length, in float64; zero rows stay zero.
    Scaled by the row's largest entry first, so huge or tiny rows neither overflow nor
    underflow."""
    x = np.asarray(a, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        big = np.abs(x).max(axis=-1, keepdims=True) if x.shape[-1] else np.zeros(
            x.shape[:-1] + (1,))
        y = np.where(big > 0, x / np.where(big > 0, big, 1.0), x)
        norm = np.sqrt((y * y).sum(axis=-1, keepdims=True))
        return np.where(norm > 0, y / np.where(norm > 0, norm, 1.0), y)


def gaussian_key_bias(k: np.ndarray, bandwidth: float) -> np.ndarray:
    """-||k_j||^2 / (2 h^2) per key, in float64: shape (..., Hkv, Lk)."""
    x = np.asarray(k, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return -(x * x).sum(axis=-1) / (2.0 * bandwidth * bandwidth)


# --------------------------------------------------------------------------------------
# nadaraya_watson


@dataclass
class RegressionArgs:
    """A validated nadaraya_watson call. x_query/x_keys/y_values are 3-D+ ``(..., L, D)``,
    not yet broadcast; ``bandwidth`` is float64 of the batch shape (a broadcast view)."""

    x_query: np.ndarray
    x_keys: np.ndarray
    y_values: np.ndarray
    batch: tuple
    kernel: str
    bandwidth: np.ndarray
    result_dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple  # what the caller sees
    weights_shape: tuple

    def full(self, a: np.ndarray) -> np.ndarray:
        """``a`` broadcast to the batch, with a head axis of 1: (batch..., 1, L, D)."""
        return np.broadcast_to(a, self.batch + a.shape[-2:])[..., None, :, :]


def _features(x: object, name: str) -> np.ndarray:
    a = float_array(x, name, min_ndim=1)
    if a.ndim == 1:  # scalar features
        a = a[:, None]
    if a.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one feature (last axis), got shape "
                         f"{a.shape}")
    return a


def silverman_bandwidth(x_keys: np.ndarray) -> np.ndarray:
    """Silverman's rule of thumb per batch entry of ``x_keys`` (..., Lk, D), in float64.

    D == 1: ``0.9 * min(std, IQR / 1.34) * n**(-1/5)`` (std when the IQR is 0);
    D > 1: ``(4 / (D + 2))**(1 / (D + 4)) * n**(-1 / (D + 4)) * mean(std per feature)``,
    with the sample standard deviation (ddof=1) and n = Lk.
    """
    x = np.asarray(x_keys, dtype=np.float64)
    n, d = x.shape[-2], x.shape[-1]
    if n < 2:
        raise ValueError(f"bandwidth='silverman' needs at least 2 keys, got {n}")
    with np.errstate(over="ignore", invalid="ignore"):
        std = x.std(axis=-2, ddof=1)  # (..., D)
        if d == 1:
            q75, q25 = np.percentile(x[..., 0], [75, 25], axis=-1)
            iqr = (q75 - q25) / 1.34
            s = std[..., 0]
            spread = np.where(iqr > 0, np.minimum(s, iqr), s)
            h = 0.9 * spread * n ** (-0.2)
        else:
            h = (4.0 / (d + 2)) ** (1.0 / (d + 4)) * n ** (-1.0 / (d + 4)) * std.mean(axis=-1)
    if not (np.isfinite(h) & (h > 0)).all():
        raise ValueError(
            "bandwidth='silverman' needs x_keys with finite values and a positive spread "
            "(all keys of a batch entry coincide, or one is inf/NaN)"
        )
    return h


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
    try:
        batch = np.broadcast_shapes(xq.shape[:-2], xk.shape[:-2], y.shape[:-2])
    except ValueError:
        raise ValueError(
            f"the leading (batch) dims of x_query {np.shape(x_query)}, x_keys "
            f"{np.shape(x_keys)} and y_values {np.shape(y_values)} do not broadcast together"
        ) from None
    if len(batch) > 61:
        raise ValueError(f"at most 61 leading (batch) dims are supported, got {len(batch)}")
    kernel = _choice(kernel, "kernel", KERNELS)
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
        if h.ndim > len(batch) or np.broadcast_shapes(h.shape, batch) != batch:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"bandwidth of shape {h.shape} does not broadcast to the batch shape {batch}"
        ) from None
    lq = xq.shape[-2]
    out_shape = batch + ((lq,) if scalar_y else (lq, y.shape[-1]))
    return RegressionArgs(xq, xk, y, batch, kernel, np.broadcast_to(h, batch), result,
                          compute, out_shape, batch + (lq, xk.shape[-2]))

"""The checks of :class:`fastattn.MultiHeadAttention`'s construction and of its NumPy twin's
weights: the layer's dtype, parameters and head split, and a PyTorch ``state_dict``. The
checks of a call (inputs, masks, lengths, KV cache rows) are :mod:`fastattn._validation`'s,
beside those of the other public functions' calls."""

from __future__ import annotations

import numpy as np

from fastattn._checks import check_size
from fastattn._dtypes import is_bfloat16
from fastattn._validation import _FLOAT_DTYPES, float_array

# --------------------------------------------------------------------------------------
# MultiHeadAttention and its functional twin


_LAYER_DTYPES = _FLOAT_DTYPES


def check_layer_dtype(dtype: object) -> np.dtype:
    """A layer's dtype: float16, bfloat16 (ml_dtypes', recognised by name), float32 or
    float64."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"dtype must be float16, bfloat16, float32 or float64, got {dtype!r}"
        ) from None
    if dt not in _LAYER_DTYPES and not is_bfloat16(dt):
        raise TypeError(f"dtype must be float16, bfloat16, float32 or float64, got {dt}")
    return dt


def check_parameter(value: object, name: str, shape: tuple, axes: str = "") -> np.ndarray:
    """A new value for a layer parameter: a float array of exactly ``shape`` (``axes`` says
    what its axes are)."""
    a = float_array(value, name, min_ndim=1)
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}{axes}, got {a.shape}")
    return a


def check_head_split(embed_dim: int, num_heads: int, num_kv_heads: int) -> int:
    """The head size ``embed_dim // num_heads``, after checking that the heads divide."""
    if embed_dim % num_heads:
        raise ValueError(
            f"num_heads={num_heads} does not divide embed_dim={embed_dim}: each head gets "
            "embed_dim // num_heads features"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} does not divide num_heads={num_heads}: query head h "
            "reads key/value head h // (num_heads // num_kv_heads)"
        )
    return embed_dim // num_heads


def projection_weights(
    num_heads, q_weight, k_weight, v_weight, out_weight, q_bias, k_bias, v_bias, out_bias
):
    """The functional form's weights checked: ``(num_kv_heads, [(weight, bias)] * 4)`` with
    ``q_weight (E, E)``, ``k_weight (Hkv * D, kdim)``, ``v_weight (Hkv * D, vdim)``,
    ``out_weight (E, E)``, ``D = E // num_heads``; each bias ``(out_features,)`` or None."""
    heads = check_size(num_heads, "num_heads")
    pairs = []
    for name, w, b in (
        ("q", q_weight, q_bias),
        ("k", k_weight, k_bias),
        ("v", v_weight, v_bias),
        ("out", out_weight, out_bias),
    ):
        w = float_array(w, f"{name}_weight")
        if w.ndim != 2:
            raise ValueError(
                f"{name}_weight must be 2-D (out_features, in_features), got shape {w.shape}"
            )
        if b is not None:
            b = float_array(b, f"{name}_bias", min_ndim=1)
            if b.shape != w.shape[:1]:
                raise ValueError(
                    f"{name}_bias must have shape {w.shape[:1]} (out_features of "
                    f"{name}_weight {w.shape}), got {b.shape}"
                )
        pairs.append((w, b))
    (wq, _), (wk, _), (wv, _), (wo, _) = pairs
    e = wq.shape[1]
    for name, w in (("q_weight", wq), ("out_weight", wo)):
        if w.shape != (e, e):
            raise ValueError(
                f"{name} must have shape (E, E) = {(e, e)} (E from q_weight's in_features), "
                f"got {w.shape}"
            )
    head_dim = check_head_split(e, heads, 1)
    if wk.shape[0] % head_dim or wk.shape[0] == 0:
        raise ValueError(
            f"k_weight has {wk.shape[0]} out_features, not a positive multiple of the head "
            f"size {head_dim} (E={e} // num_heads={heads})"
        )
    if wv.shape[0] != wk.shape[0]:
        raise ValueError(
            f"v_weight has {wv.shape[0]} out_features but k_weight has {wk.shape[0]}: "
            "they must match (num_kv_heads * head_dim)"
        )
    num_kv = wk.shape[0] // head_dim
    check_head_split(e, heads, num_kv)
    return num_kv, pairs


def _to_numpy(value: object, name: str) -> np.ndarray:
    """An array from a NumPy array, a torch tensor (duck-typed: no torch import) or a list."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        t = value.detach()
        if hasattr(t, "cpu"):
            t = t.cpu()
        try:
            value = t.numpy()
        except TypeError:  # e.g. bfloat16, which NumPy lacks
            value = t.float().numpy()
    return float_array(value, f"state_dict[{name!r}]", min_ndim=1)


_TORCH_KEYS = (
    "in_proj_weight",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "in_proj_bias",
    "out_proj.weight",
    "out_proj.bias",
    "sinks",  # attention sinks, one logit per head (not torch's; MultiHeadAttention's)
)


def torch_state_dict(state_dict: object) -> tuple[dict, tuple, bool]:
    """A ``torch.nn.MultiheadAttention`` state_dict checked: (the arrays by name, the
    (q, k, v, out) projection weights, whether it has biases)."""
    if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
        raise TypeError(
            f"state_dict must be a mapping of names to arrays or tensors, "
            f"got {type(state_dict).__name__}"
        )
    names = set(state_dict.keys())
    if {"bias_k", "bias_v"} & names:
        raise ValueError(
            "state_dict has bias_k/bias_v (torch's add_bias_kv=True), which "
            "MultiHeadAttention does not support"
        )
    unexpected = sorted(str(n) for n in names - set(_TORCH_KEYS))
    if unexpected:
        raise ValueError(
            f"state_dict has unexpected keys {unexpected}; expected names from "
            f"{list(_TORCH_KEYS)} (strip any module prefix such as 'self_attn.')"
        )
    sd = {name: _to_numpy(state_dict[name], name) for name in names}
    if "out_proj.weight" not in sd:
        raise ValueError("state_dict has no 'out_proj.weight'")
    wo = sd["out_proj.weight"]
    if wo.ndim != 2 or wo.shape[0] != wo.shape[1]:
        raise ValueError(f"state_dict['out_proj.weight'] must have shape (E, E), got {wo.shape}")
    e = wo.shape[0]
    separate = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
    if "in_proj_weight" in sd:
        if set(separate) & names:
            raise ValueError("state_dict has both 'in_proj_weight' and separate q/k/v_proj_weight")
        w = sd["in_proj_weight"]
        if w.shape != (3 * e, e):
            raise ValueError(
                f"state_dict['in_proj_weight'] must have shape (3E, E) = {(3 * e, e)} "
                f"(E={e} from out_proj.weight), got {w.shape}"
            )
        wq, wk, wv = np.split(w, 3)
    elif set(separate) <= names:
        wq, wk, wv = (sd[n] for n in separate)
        for n, w in zip(separate, (wq, wk, wv)):
            if w.ndim != 2 or w.shape[0] != e or (n == "q_proj_weight" and w.shape[1] != e):
                want = "(E, E)" if n == "q_proj_weight" else f"(E, {n[0]}dim)"
                raise ValueError(
                    f"state_dict[{n!r}] must have shape {want} with E={e} "
                    f"(from out_proj.weight), got {w.shape}"
                )
    else:
        raise ValueError(
            "state_dict has neither 'in_proj_weight' nor all of 'q_proj_weight', "
            f"'k_proj_weight', 'v_proj_weight'; got keys {sorted(map(str, names))}"
        )
    has_in_bias, has_out_bias = "in_proj_bias" in sd, "out_proj.bias" in sd
    if has_in_bias != has_out_bias:
        raise ValueError(
            "state_dict must have both 'in_proj_bias' and 'out_proj.bias' or neither, "
            f"got only {'in_proj_bias' if has_in_bias else 'out_proj.bias'}"
        )
    if has_in_bias:
        for n, want in (("in_proj_bias", (3 * e,)), ("out_proj.bias", (e,))):
            if sd[n].shape != want:
                raise ValueError(
                    f"state_dict[{n!r}] must have shape {want} (E={e}), got {sd[n].shape}"
                )
    return sd, (wq, wk, wv, wo), has_in_bias

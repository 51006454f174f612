"""The records of checked calls: what :mod:`fastattn._validation` hands to a backend (the
CPU kernels, :mod:`fastattn._cuda`, :mod:`fastattn._dask`) and to the NumPy twins."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import numpy as np


@dataclass(kw_only=True)
class AttentionCall:
    """What every checked attention call holds (:class:`SdpaArgs`, :class:`VarlenArgs`):
    q/k/v as given (not converted, not broadcast), the dtypes of the result and of the
    arithmetic, the shape of the result the caller sees, and the score options."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    result_dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple
    scale: float
    softcap: float | None
    is_causal: bool
    window: tuple[int, int]  # -1 = unbounded
    # Per query head (check_head_values): the sink logits and ALiBi slopes, shape (Hq,) or
    # broadcastable to the score rows' leading shape (..., Hq), or None.
    sinks: np.ndarray | None = None
    alibi_slopes: np.ndarray | None = None


@dataclass(kw_only=True)
class SdpaArgs(AttentionCall):
    """A validated attention call. q/k/v are at least 3-D ``(..., H, L, E)``; ``attn_mask``
    (bool or float) broadcasts to the scores the caller sees, ``valid_lens`` (integer) is a
    prefix of their rows; ``out_shape``/``scores_shape`` are the shapes the caller sees,
    ``full_*`` the same with every batch dim.

    Made from q/k/v, their broadcast batch dims ``batch`` and the checked parts of the call:
    ``dtypes`` = (result, compute), ``out_ndim`` = the rank of the result the caller sees,
    ``masking`` = (attn_mask, valid_lens, is_causal, bottom_right, window, mask_summary)
    (:func:`unmasked` for a call with none); the shapes and the causal diagonal's offset
    follow from them. ``scale`` starts at 1: the caller sets the checked one."""

    batch: tuple
    dtypes: InitVar[tuple]
    out_ndim: InitVar[int]
    masking: InitVar[tuple]
    result_dtype: np.dtype = field(init=False)
    compute_dtype: np.dtype = field(init=False)
    out_shape: tuple = field(init=False)
    scale: float = 1.0
    softcap: float | None = None
    is_causal: bool = field(init=False)
    window: tuple[int, int] = field(init=False)
    attn_mask: np.ndarray | None = field(init=False)
    valid_lens: np.ndarray | None = field(init=False)
    full_out_shape: tuple = field(init=False)
    diag_offset: int = field(init=False)
    # int8 key/value (a quantised cache): their float32 scales, shape key.shape[:-1].
    key_scale: np.ndarray | None = None
    value_scale: np.ndarray | None = None
    # The tile summary a BlockMask attn_mask carries (fastattn.block_mask), or None: the
    # SDPA kernel reads it instead of summarising the same mask again on every call.
    mask_summary: object = field(init=False)

    def __post_init__(self, dtypes: tuple, out_ndim: int, masking: tuple) -> None:
        self.result_dtype, self.compute_dtype = dtypes
        self.attn_mask, self.valid_lens, self.is_causal, bottom_right, *rest = masking
        self.window, self.mask_summary = rest
        lq, lk = self.query.shape[-2], self.key.shape[-2]
        full = self.batch + (self.query.shape[-3], lq, self.value.shape[-1])
        self.full_out_shape = full
        self.out_shape = full[len(full) - out_ndim :]
        self.diag_offset = (lk - lq) if bottom_right else 0

    @property
    def int8_kv(self) -> bool:
        return self.key_scale is not None

    def named_inputs(self) -> dict:
        """The arrays by the names the errors use (for ``out=``'s overlap check): the
        inputs as checked, which hold the caller's memory (``np.asarray`` copies nothing
        of an ndarray)."""
        return {
            "query": self.query,
            "key": self.key,
            "value": self.value,
            "attn_mask": self.attn_mask,
            "valid_lens": self.valid_lens,
            "sinks": self.sinks,
            "alibi_slopes": self.alibi_slopes,
            "key_scale": self.key_scale,
            "value_scale": self.value_scale,
        }

    @property
    def full_scores_shape(self) -> tuple:
        return self.full_out_shape[:-1] + (self.key.shape[-2],)

    @property
    def scores_shape(self) -> tuple:
        return self.out_shape[:-1] + (self.key.shape[-2],)


def unmasked(is_causal: bool, bottom_right: bool) -> tuple:
    """The ``masking`` of an :class:`SdpaArgs` with no mask, no valid lengths and no window
    (``-1`` = unbounded)."""
    return None, None, is_causal, bottom_right, (-1, -1), None


@dataclass(kw_only=True)
class VarlenArgs(AttentionCall):
    """A validated varlen_attention call: the packed q/k/v ``(total_q, Hq, E)``,
    ``(total_k, Hkv, E)``, ``(total_k, Hkv, Ev)``, and the sequence boundaries as int64
    arrays of length ``N + 1``."""

    cu_seqlens_q: np.ndarray
    cu_seqlens_k: np.ndarray
    bottom_right: bool

    def named_inputs(self) -> dict:
        """The arrays by the names the errors use (for ``out=``'s overlap check)."""
        return {"query": self.query, "key": self.key, "value": self.value}


@dataclass
class MergeArgs:
    """A validated merge_attention_states call: the parts as given (not converted), all of
    one shape ``(..., Lq, Ev)``, and their lses, each of shape ``(..., Lq)``."""

    outputs: list
    lses: list
    result_dtype: np.dtype
    compute_dtype: np.dtype

    @property
    def out_shape(self) -> tuple:
        return self.outputs[0].shape

    def named_inputs(self) -> dict:
        """The parts by the names the errors use (for ``out=``'s overlap check)."""
        named = {f"outputs[{i}]": o for i, o in enumerate(self.outputs)}
        named.update({f"lses[{i}]": x for i, x in enumerate(self.lses)})
        return named


@dataclass
class AdditiveWeights:
    w_q: np.ndarray  # (Dq, hidden)
    w_k: np.ndarray  # (Dk, hidden)
    w_v: np.ndarray  # (hidden,)

    def named_inputs(self) -> dict:
        return {"w_q": self.w_q, "w_k": self.w_k, "w_v": self.w_v}


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

    def named_inputs(self) -> dict:
        """The call's arrays by the names the errors use (``out=``'s overlap check)."""
        named = self.args.named_inputs()
        named["weight"] = self.weight
        if self.additive is not None:
            named.update(self.additive.named_inputs())
        return named


@dataclass
class SoftmaxArgs:
    x: np.ndarray  # as given (float16/32/64), not moved
    axis: int  # normalised to [0, ndim)
    result_dtype: np.dtype
    compute_dtype: np.dtype
    mask: np.ndarray | None  # bool, broadcastable to x's shape
    valid_lens: np.ndarray | None  # integer, a prefix of the rows' shape (x without axis)

    @property
    def rows_shape(self) -> tuple:
        return self.x.shape[: self.axis] + self.x.shape[self.axis + 1 :]


@dataclass
class RegressionArgs:
    """A validated nadaraya_watson call. x_query/x_keys/y_values are 2-D+ ``(..., L, D)``,
    as given (not converted, not broadcast); ``bandwidth`` is float64 of the batch shape
    (a broadcast view)."""

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

"""fastattn.MultiHeadAttention: project, split heads, attend with the fast kernel, merge, project.

The projections (:mod:`fastattn._projection`) are NumPy matmuls (BLAS); the heads are
strided views of the projected arrays, handed to the CPU backend (:mod:`fastattn._cpu`,
or the core's fast path for a decode step, as :func:`fastattn.scaled_dot_product_attention`
takes it), which writes its result into a ``(B, L, H, D)`` buffer that the output
projection reads as ``(B, L, E)``. So Q/K/V are never copied after they are projected. The
layer's checks are :mod:`fastattn._validation`'s (a call's arguments and its attention's
masking, all checked before anything is projected, against the shapes the heads will have)
and :mod:`fastattn._layer_checks`'s (its construction), shared with
:func:`fastattn.reference.multi_head_attention`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from fastattn import _core, _cpu, _dispatch, _sdpa, _threads
from fastattn._args import unmasked
from fastattn._checks import check_flag, check_size
from fastattn._compute import average_heads
from fastattn._dtypes import is_bfloat16
from fastattn._layer_checks import (
    check_head_split,
    check_layer_dtype,
    check_parameter,
    torch_state_dict,
)
from fastattn._projection import Projection
from fastattn._quantize import quantize_kv
from fastattn._validation import (
    check_unbatched_mask,
    head_valid_lens,
    kv_cache_rows,
    layer_attention_kind,
    layer_inputs,
    layer_masking,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from numpy.typing import ArrayLike, DTypeLike, NDArray

# --------------------------------------------------------------------------------------
# The layer


class KVCache:
    """Keys and values of past positions for one :class:`MultiHeadAttention` layer.

    Made by :meth:`MultiHeadAttention.new_kv_cache`; pass it as ``kv_cache=`` and each
    call appends its new positions in place. Storage is preallocated for ``max_len``
    positions; appending past it raises ``ValueError`` (nothing is overwritten).

    Attributes
    ----------
    batch, max_len, num_kv_heads, head_dim : int
    dtype : numpy.dtype
        The layer's dtype (what the cache holds, unless ``quantized``).
    quantized : bool
        Stored as int8 with one float32 scale per key/value vector
        (``new_kv_cache(..., dtype="int8")``); appending quantises the new positions
        (:func:`fastattn.quantize_kv`) and decoding reads the int8 bytes.
    length : int
        Positions filled so far (``len(cache)``).
    key, value : ndarray, shape ``(batch, num_kv_heads, length, head_dim)``
        Views of the filled part (not copies); int8 when ``quantized``.
    key_scale, value_scale : ndarray, shape ``(batch, num_kv_heads, length)``, or None
        The float32 scales of a quantized cache (views).

    Storage is head-major, ``(batch, num_kv_heads, max_len, head_dim)``: each head's keys
    are contiguous, which the kernel reads fastest when one query row scans them all.
    """

    def __init__(
        self,
        batch: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: np.dtype,
        quantized: bool = False,
    ) -> None:
        self.batch = batch
        self.max_len = max_len
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.quantized = quantized
        self.length = 0
        store = np.int8 if quantized else dtype
        self._key = np.zeros((batch, num_kv_heads, max_len, head_dim), store)
        self._value = np.zeros((batch, num_kv_heads, max_len, head_dim), store)
        self._key_scale = self._value_scale = None
        if quantized:
            self._key_scale = np.zeros((batch, num_kv_heads, max_len), np.float32)
            self._value_scale = np.zeros((batch, num_kv_heads, max_len), np.float32)

    def __len__(self) -> int:
        return self.length

    @property
    def key(self) -> np.ndarray:
        return self._key[:, :, : self.length]

    @property
    def value(self) -> np.ndarray:
        return self._value[:, :, : self.length]

    @property
    def key_scale(self) -> np.ndarray | None:
        return None if self._key_scale is None else self._key_scale[:, :, : self.length]

    @property
    def value_scale(self) -> np.ndarray | None:
        return None if self._value_scale is None else self._value_scale[:, :, : self.length]

    def reset(self) -> None:
        """Forget every position (the storage is kept for reuse)."""
        self.length = 0

    def __repr__(self) -> str:
        return (
            f"KVCache(batch={self.batch}, length={self.length}, max_len={self.max_len}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"dtype={self.dtype}{', int8' if self.quantized else ''})"
        )


def _xavier_uniform(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """torch.nn.init.xavier_uniform_: U(-a, a), a = sqrt(6 / (fan_in + fan_out))."""
    fan_out, fan_in = shape
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape)


class MultiHeadAttention:
    """Multi-head attention layer on NumPy arrays, with PyTorch's weight layout.

    ``out = out_proj(concat_h(attention(q_proj(query)_h, k_proj(key)_g, v_proj(value)_g)))``
    where query head ``h`` reads key/value head ``g = h // (num_heads // num_kv_heads)``.

    Parameters
    ----------
    embed_dim : int
        Feature size of the queries and of the output; split into ``num_heads`` heads of
        ``head_dim = embed_dim // num_heads`` features.
    num_heads : int
        Query heads; must divide ``embed_dim``.
    num_kv_heads : int, default ``num_heads``
        Key/value heads; must divide ``num_heads``. Fewer than ``num_heads`` is
        grouped-query attention, 1 is multi-query attention. ``k_proj``/``v_proj`` then
        map to ``num_kv_heads * head_dim`` features.
    kdim, vdim : int, default ``embed_dim``
        Feature sizes of the key and value inputs (cross-attention from another source).
    bias : bool, default True
        Give all four projections a bias.
    dtype : float16, bfloat16, float32 (default) or float64
        Dtype of the weights; inputs are converted to it and outputs have it. bfloat16
        (``ml_dtypes.bfloat16``): parameters, projected Q/K/V, the KV cache and the output
        are bfloat16; each projection is computed in float32 (operands widened exactly,
        bias added) and rounded once to bfloat16; attention is the bfloat16 kernel of
        :func:`scaled_dot_product_attention`; weights (``need_weights``) are float32.
    use_sinks : bool, default False
        Give the layer attention sinks: a learned logit per query head, ``sinks``
        ``(num_heads,)``, zero-initialised, joining each row's softmax denominator
        (see ``scaled_dot_product_attention(..., sinks=)``).
    seed : int, numpy.random.Generator or None
        Initialisation like ``torch.nn.MultiheadAttention``: in-projections Xavier-uniform
        (one packed ``(3E, E)`` draw when kdim == vdim == embed_dim and there is no GQA, as
        torch does; one draw per matrix otherwise), out-projection weight
        ``U(-1/sqrt(E), 1/sqrt(E))`` (``nn.Linear``'s default), all biases zero.

    Attributes
    ----------
    q_proj, k_proj, v_proj, out_proj : Projection
        ``.weight`` ``(out_features, in_features)`` and ``.bias`` ``(out_features,)`` or
        None, NumPy arrays: ``q_proj`` ``(E, E)``, ``k_proj`` ``(Hkv * D, kdim)``,
        ``v_proj`` ``(Hkv * D, vdim)``, ``out_proj`` ``(E, E)``.
    sinks : ndarray ``(num_heads,)`` or None
        The per-head sink logits when ``use_sinks`` (settable), else None; in the
        layer's dtype (float32 in a bfloat16 layer).

    Calling the layer: see :meth:`__call__`. Loading PyTorch weights: :meth:`from_torch`.
    Incremental decoding: :meth:`new_kv_cache`.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> mha = fastattn.MultiHeadAttention(32, 4, seed=0)
    >>> x = np.random.default_rng(0).standard_normal((2, 10, 32), dtype=np.float32)
    >>> out, weights = mha(x, is_causal=True, need_weights=True)
    >>> out.shape, out.dtype, weights.shape
    ((2, 10, 32), dtype('float32'), (2, 10, 10))
    >>> bool(np.allclose(weights.sum(-1), 1))
    True

    Decoding one position at a time gives the same outputs as one causal pass:

    >>> cache = mha.new_kv_cache(batch=2, max_len=16)
    >>> steps = [mha(x[:, i:i + 1], kv_cache=cache, is_causal=True) for i in range(10)]
    >>> bool(np.allclose(np.concatenate(steps, axis=1), out, atol=1e-5))
    True
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dtype: DTypeLike = np.float32,
        seed: int | np.random.Generator | None = None,
        use_sinks: bool = False,
    ) -> None:
        self.embed_dim = check_size(embed_dim, "embed_dim")
        self.num_heads = check_size(num_heads, "num_heads")
        self.num_kv_heads = (
            self.num_heads if num_kv_heads is None else check_size(num_kv_heads, "num_kv_heads")
        )
        self.kdim = self.embed_dim if kdim is None else check_size(kdim, "kdim")
        self.vdim = self.embed_dim if vdim is None else check_size(vdim, "vdim")
        self.bias = check_flag(bias, "bias")
        self.dtype = check_layer_dtype(dtype)
        self.head_dim = check_head_split(self.embed_dim, self.num_heads, self.num_kv_heads)
        # The attention's (result, compute) dtypes and scale: the same for every call.
        self._attention_dtypes, self._scale = layer_attention_kind(self.dtype, self.head_dim)
        try:
            rng = np.random.default_rng(seed)
        except (TypeError, ValueError):
            raise TypeError(
                f"seed must be None, an int >= 0 or a numpy.random.Generator, got {seed!r}"
            ) from None

        e, kv = self.embed_dim, self.num_kv_heads * self.head_dim
        if self._packs_like_torch:
            wq, wk, wv = np.split(_xavier_uniform(rng, (3 * e, e)), 3)
        else:
            wq = _xavier_uniform(rng, (e, e))
            wk = _xavier_uniform(rng, (kv, self.kdim))
            wv = _xavier_uniform(rng, (kv, self.vdim))
        bound = 1.0 / math.sqrt(e)
        wo = rng.uniform(-bound, bound, size=(e, e))

        def zeros(n):
            return np.zeros(n) if self.bias else None

        dt = self.dtype
        self.q_proj = Projection("q_proj", wq, zeros(e), dt)
        self.k_proj = Projection("k_proj", wk, zeros(kv), dt)
        self.v_proj = Projection("v_proj", wv, zeros(kv), dt)
        self.out_proj = Projection("out_proj", wo, zeros(e), dt)
        # Drawn after the projections, so use_sinks leaves their initialisation unchanged.
        # (float32 in a bfloat16 layer: one logit per head, read by the kernel in float32)
        self._sink_dtype = np.dtype(np.float32) if is_bfloat16(dt) else dt
        use = check_flag(use_sinks, "use_sinks")
        self._sinks = np.zeros(self.num_heads, self._sink_dtype) if use else None

    @property
    def sinks(self) -> np.ndarray | None:
        return self._sinks

    @sinks.setter
    def sinks(self, value: ArrayLike) -> None:
        if self._sinks is None:
            raise ValueError("this layer has no sinks: construct it with use_sinks=True")
        self._sinks = check_parameter(value, "sinks", (self.num_heads,), " (num_heads,)").astype(
            self._sink_dtype
        )

    @property
    def _packs_like_torch(self) -> bool:
        """True when torch would hold the in-projections as one packed in_proj_weight."""
        return self.kdim == self.vdim == self.embed_dim and self.num_kv_heads == self.num_heads

    def __repr__(self) -> str:
        return (
            f"MultiHeadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, kdim={self.kdim}, vdim={self.vdim}, "
            f"bias={self.bias}, dtype={self.dtype}"
            + (", use_sinks=True)" if self._sinks is not None else ")")
        )

    def __call__(
        self,
        query: ArrayLike,
        key: ArrayLike | None = None,
        value: ArrayLike | None = None,
        *,
        attn_mask: ArrayLike | None = None,
        valid_lens: ArrayLike | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_attn_weights: bool = True,
        kv_cache: KVCache | None = None,
        num_threads: int | None = None,
    ) -> NDArray[np.floating] | tuple[NDArray[np.floating], NDArray[np.floating]]:
        """Attend from ``query`` to ``key``/``value``.

        Parameters
        ----------
        query : array_like, shape ``(B, Lq, embed_dim)`` or unbatched ``(Lq, embed_dim)``
        key : array_like, shape ``(B, Lk, kdim)`` or ``(Lk, kdim)``; default ``query``
        value : array_like, shape ``(B, Lk, vdim)`` or ``(Lk, vdim)``; default ``key``
            Floating point; converted to the layer's dtype. With ``kv_cache`` these are the
            new positions, appended to the cache before attending.
        attn_mask : array_like, optional
            Broadcastable to the scores ``(B, num_heads, Lq, Lk)`` (unbatched:
            ``(num_heads, Lq, Lk)``), ``Lk`` counting cached positions. bool: True = may
            attend (the opposite of torch's masks: torch's ``key_padding_mask`` ``(B, Lk)``
            becomes ``attn_mask=~key_padding_mask[:, None, None, :]``). float: added to the
            scaled scores.
        valid_lens : array_like of int, optional
            ``(B,)`` one length per sequence, or ``(B, Lq)`` one per query (unbatched:
            ``()`` or ``(Lq,)``): key ``j`` is attended iff ``j < valid_len``.
        is_causal : bool, default False
            Query ``i`` attends keys ``j <= i`` (top-left aligned, as torch). With
            ``kv_cache`` the alignment is bottom-right: the new positions are the last ones,
            so query ``i`` attends keys ``j <= i + Lk - Lq``.
        need_weights : bool, default False
            Also return the attention weights.
        average_attn_weights : bool, default True
            Average the weights over the heads, ``(B, Lq, Lk)``; else ``(B, num_heads,
            Lq, Lk)`` (unbatched: without ``B``).
        kv_cache : KVCache, optional
            From :meth:`new_kv_cache`. The new keys/values are projected into it in place
            and the queries attend over every cached position. ``ValueError`` if they do
            not fit in ``max_len``; the cache is unchanged if the call fails.
        num_threads : int, optional
            Threads for the attention kernel (the projections use NumPy's BLAS threads).

        Returns
        -------
        out : ndarray, shape ``(B, Lq, embed_dim)`` (unbatched ``(Lq, embed_dim)``), or
        ``(out, weights)`` when ``need_weights``.
        """
        if _dispatch.backend(query, key, value, attn_mask, valid_lens) == "dask":
            # A lazy graph: projections and attention per block; the call handed on whole.
            call = _dispatch.forwarded(MultiHeadAttention.__call__, locals())
            return _dispatch.engine("dask").multihead_attention(call.pop("self"), **call)
        # One errstate for the whole call (NaN/inf inputs propagate quietly through the
        # projections, as through the kernel) rather than one per projection.
        with np.errstate(invalid="ignore", over="ignore"):
            q_in, k_in, v_in, batched = layer_inputs(
                query, key, value, self.embed_dim, self.kdim, self.vdim
            )
            causal = check_flag(is_causal, "is_causal")
            want_weights = check_flag(need_weights, "need_weights")
            average = check_flag(average_attn_weights, "average_attn_weights")
            check_unbatched_mask(attn_mask, batched)
            b, num_q = q_in.shape[0], q_in.shape[1]
            vl = head_valid_lens(valid_lens, b, num_q, batched)
            dt = self.dtype
            q_in, k_in, v_in = (a.astype(dt, copy=False) for a in (q_in, k_in, v_in))

            if kv_cache is not None:  # checked before anything is projected
                start, stop = kv_cache_rows(
                    kv_cache,
                    KVCache,
                    (self.num_kv_heads, self.head_dim, self.dtype),
                    b,
                    k_in.shape[1],
                )
            # A decode step the core's fast path may take, as scaled_dot_product_attention's.
            fast = (
                num_q == 1
                and not want_weights
                and attn_mask is None
                and vl is None
                and (kv_cache is None or not kv_cache.quantized)
                and _sdpa._fast_path
            )
            alignment = "top_left" if kv_cache is None else "bottom_right"
            masking = None
            if not fast:
                # The mask and valid_lens, checked against the scores the projected heads
                # will have, before anything is projected. (A fast-path call has neither:
                # checking nothing there spares every decode step the cost.)
                masking = layer_masking(
                    (b, self.num_heads, num_q, self.head_dim),
                    k_in.shape[1] if kv_cache is None else stop,
                    self._attention_dtypes[1],
                    attn_mask,
                    (vl, causal, alignment, None),
                )
            q = self.q_proj.heads(q_in, self.num_heads)
            scales = None
            if kv_cache is None:
                k = self.k_proj.heads(k_in, self.num_kv_heads)
                v = self.v_proj.heads(v_in, self.num_kv_heads)
            else:
                rows = slice(start, stop)
                if kv_cache.quantized:
                    # The new positions projected, then quantised into the cache's rows.
                    for proj, x, store, scale in (
                        (self.k_proj, k_in, kv_cache._key, kv_cache._key_scale),
                        (self.v_proj, v_in, kv_cache._value, kv_cache._value_scale),
                    ):
                        fresh = np.empty((b, self.num_kv_heads, stop - start, self.head_dim), dt)
                        store[:, :, rows], scale[:, :, rows] = quantize_kv(
                            proj.into_heads(x, self.num_kv_heads, fresh)
                        )
                    scales = (kv_cache._key_scale[:, :, :stop], kv_cache._value_scale[:, :, :stop])
                else:
                    # Project the new positions straight into the cache's rows.
                    self.k_proj.into_heads(k_in, self.num_kv_heads, kv_cache._key[:, :, rows])
                    self.v_proj.into_heads(v_in, self.num_kv_heads, kv_cache._value[:, :, rows])
                k = kv_cache._key[:, :, :stop]
                v = kv_cache._value[:, :, :stop]

            result = None
            if fast:
                # The core's fast path, as scaled_dot_product_attention takes it (None: it
                # declines). Its (B, H, 1, D) result lies as (B, 1, H * D).
                rest = (None, None, None, False, False, None, num_threads, self._sinks, None)
                result = _core.sdpa_fast(q, k, v, None, None, causal, alignment, *rest)
            merged = result
            if result is None:
                # The record over the projected heads, of what was checked above (a declined
                # fast-path call: no mask, no valid_lens, nothing to check).
                parts = {
                    "batch": (b,),
                    "dtypes": self._attention_dtypes,
                    "out_ndim": 4,
                    "masking": (
                        unmasked(causal, kv_cache is not None) if masking is None else masking
                    ),
                    "scale": self._scale,
                    "sinks": self._sinks,
                }
                if scales is not None:
                    parts["key_scale"], parts["value_scale"] = scales
                # The kernel writes (B, H, Lq, D) into a (B, Lq, H, D) buffer: merged heads.
                merged = np.empty((b, num_q, self.num_heads, self.head_dim), dt)
                threads = _threads.resolve(num_threads)
                result = _cpu.heads_attention(
                    q, k, v, parts, merged.swapaxes(1, 2), want_weights, threads
                )
            if kv_cache is not None:
                kv_cache.length = stop  # only once the call has succeeded
            out = self.out_proj._apply(merged.reshape(b, num_q, self.embed_dim))
            if not batched:
                out = out[0]
            if not want_weights:
                return out
            weights = result[1]
            if average:
                weights = average_heads(weights)
            return out, (weights if batched else weights[0])

    def new_kv_cache(self, batch: int, max_len: int, dtype: object = None) -> KVCache:
        """A :class:`KVCache` for ``batch`` sequences of up to ``max_len`` positions.

        It holds ``2 * batch * max_len * num_kv_heads * head_dim`` values of the layer's
        dtype, allocated now (zeroed). ``dtype="int8"`` stores them quantised instead, one
        byte each plus one float32 scale per key/value vector (float16, bfloat16 and
        float32 layers):
        each call quantises its new positions (:func:`fastattn.quantize_kv`) and attends
        over the int8 cache, dequantised inside the kernel.

        >>> import numpy as np, fastattn
        >>> mha = fastattn.MultiHeadAttention(16, 4, num_kv_heads=2, seed=1)
        >>> cache = mha.new_kv_cache(batch=1, max_len=8)
        >>> prompt = np.ones((1, 3, 16), np.float32)
        >>> mha(prompt, kv_cache=cache, is_causal=True).shape
        (1, 3, 16)
        >>> len(cache), cache.key.shape
        (3, (1, 2, 3, 4))
        """
        quantized = dtype is not None
        if quantized:
            try:
                int8 = np.dtype(dtype) == np.int8
            except TypeError:
                int8 = False
            if not int8:
                raise TypeError(f"dtype must be None (the layer's) or 'int8', got {dtype!r}")
        if quantized and self.dtype == np.float64:
            raise ValueError(
                "an int8 KV cache is read in float32: it needs a float16 or float32 layer, "
                "this one is float64"
            )
        return KVCache(
            check_size(batch, "batch"),
            check_size(max_len, "max_len"),
            self.num_kv_heads,
            self.head_dim,
            self.dtype,
            quantized,
        )

    def state_dict(self) -> dict[str, np.ndarray]:
        """The weights under ``torch.nn.MultiheadAttention``'s state_dict names (NumPy
        arrays, copies): packed ``in_proj_weight`` when kdim == vdim == embed_dim, else
        ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``; ``in_proj_bias`` and
        ``out_proj.bias`` when the layer has biases; ``sinks`` ``(num_heads,)`` when it has
        sinks (torch's module has none: drop it before loading). Load it into torch with
        ``module.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})``.
        ``ValueError`` for a GQA/MQA layer, which torch's module cannot express."""
        if self.num_kv_heads != self.num_heads:
            raise ValueError(
                f"a layer with num_kv_heads={self.num_kv_heads} != num_heads={self.num_heads} "
                "has no torch.nn.MultiheadAttention equivalent"
            )
        ws = (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
        sd = {}
        if self._packs_like_torch:
            sd["in_proj_weight"] = np.concatenate(ws)
        else:
            for name, w in zip(("q", "k", "v"), ws):
                sd[f"{name}_proj_weight"] = w.copy()
        if self.bias:
            sd["in_proj_bias"] = np.concatenate(
                [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]
            )
        sd["out_proj.weight"] = self.out_proj.weight.copy()
        if self.bias:
            sd["out_proj.bias"] = self.out_proj.bias.copy()
        if self._sinks is not None:
            sd["sinks"] = self._sinks.copy()
        return sd

    @classmethod
    def from_torch(
        cls,
        state_dict: Mapping[str, Any],
        num_heads: int,
        *,
        dtype: DTypeLike | None = None,
        use_sinks: bool = False,
    ) -> MultiHeadAttention:
        """A layer holding the weights of a ``torch.nn.MultiheadAttention``.

        Parameters
        ----------
        state_dict : mapping of str to array_like
            ``module.state_dict()``, or any mapping of the same names to NumPy arrays or
            tensors (torch itself is not needed; tensors are read with
            ``.detach().cpu().numpy()``). Either the packed ``in_proj_weight`` ``(3E, E)``
            or ``q_proj_weight`` ``(E, E)``, ``k_proj_weight`` ``(E, kdim)`` and
            ``v_proj_weight`` ``(E, vdim)``; ``out_proj.weight`` ``(E, E)``; with bias also
            ``in_proj_bias`` ``(3E,)`` and ``out_proj.bias`` ``(E,)``. ``bias_k``/``bias_v``
            (``add_bias_kv=True``) are not supported.
        num_heads : int
            The module's ``num_heads`` (not recorded in its state_dict).
        dtype : float16, float32 or float64, optional
            Default: the weights' dtype (float32 for a default torch module).
        use_sinks : bool, default False
            Give the layer sinks. A ``sinks`` entry ``(num_heads,)`` in the state dict (as
            models with attention sinks keep them) is loaded and implies it; without one
            the sinks start at zero.

        The layer computes what the module computes with ``batch_first=True`` (dropout
        off). Masks differ in polarity: torch's bool masks mark positions to *ignore*,
        fastattn's mark positions to *attend*: pass ``attn_mask=~torch_attn_mask``, and
        for torch's ``key_padding_mask`` ``(B, Lk)``,
        ``attn_mask=~key_padding_mask[:, None, None, :]``.

        >>> import numpy as np, fastattn
        >>> rng = np.random.default_rng(0)
        >>> sd = {"in_proj_weight": rng.standard_normal((24, 8)),
        ...       "out_proj.weight": rng.standard_normal((8, 8))}
        >>> mha = fastattn.MultiHeadAttention.from_torch(sd, num_heads=2)
        >>> mha
        MultiHeadAttention(embed_dim=8, num_heads=2, num_kv_heads=2, kdim=8, vdim=8, bias=False, dtype=float64)
        """  # noqa: E501 - a doctest output line
        sd, (wq, wk, wv, wo), has_bias = torch_state_dict(state_dict)
        if dtype is None:
            dtype = np.result_type(*sd.values())
        sinks = sd.get("sinks")
        layer = cls(
            wo.shape[0],
            num_heads,
            kdim=wk.shape[1],
            vdim=wv.shape[1],
            bias=has_bias,
            dtype=dtype,
            seed=0,
            use_sinks=check_flag(use_sinks, "use_sinks") or sinks is not None,
        )
        if sinks is not None:
            layer.sinks = sinks
        layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight = wq, wk, wv
        layer.out_proj.weight = wo
        if has_bias:
            layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias = np.split(
                sd["in_proj_bias"], 3
            )
            layer.out_proj.bias = sd["out_proj.bias"]
        return layer

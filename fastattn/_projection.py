"""The layer's linear maps: :class:`Projection` (``y = x @ weight.T + bias``, PyTorch's
``nn.Linear`` layout) and the head split of a projection, below
:class:`fastattn.MultiHeadAttention`, which holds four of them. bfloat16 projections are
computed in float32 and rounded once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fastattn._dtypes import is_bfloat16
from fastattn._layer_checks import check_parameter

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(B, L, H * D)`` -> ``(B, H, L, D)`` as a strided view (last axis stays unit-stride)."""
    b, length, features = x.shape
    return x.reshape(b, length, num_heads, features // num_heads).swapaxes(1, 2)


class Projection:
    """A linear map ``y = x @ weight.T + bias``, laid out like PyTorch's ``nn.Linear``.

    ``weight`` has shape ``(out_features, in_features)`` and ``bias`` ``(out_features,)``
    (or is None). Both are plain NumPy arrays in the layer's dtype: edit them in place, or
    assign arrays of the same shape (they are converted to the layer's dtype).
    """

    __slots__ = ("_bias", "_dtype", "_name", "_weight")

    def __init__(
        self, name: str, weight: np.ndarray, bias: np.ndarray | None, dtype: np.dtype
    ) -> None:
        self._name = name
        self._dtype = dtype
        self._weight = np.array(weight, dtype=dtype)  # own copy
        self._bias = None if bias is None else np.array(bias, dtype=dtype)

    @property
    def weight(self) -> np.ndarray:
        return self._weight

    @weight.setter
    def weight(self, value: ArrayLike) -> None:
        a = check_parameter(
            value, f"{self._name}.weight", self._weight.shape, " (out_features, in_features)"
        )
        self._weight = np.array(a, dtype=self._dtype)

    @property
    def bias(self) -> np.ndarray | None:
        return self._bias

    @bias.setter
    def bias(self, value: ArrayLike) -> None:
        if self._bias is None:
            raise ValueError(f"{self._name} has no bias (the layer was made with bias=False)")
        a = check_parameter(value, f"{self._name}.bias", self._bias.shape)
        self._bias = np.array(a, dtype=self._dtype)

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        # NaN/inf inputs (padding past valid_lens may hold anything) propagate quietly, as
        # in the attention kernel: no RuntimeWarning from NumPy's matmul.
        with np.errstate(invalid="ignore", over="ignore"):
            return self._apply(x, out)

    def _apply(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        # __call__ without its errstate, for a caller that holds one already (the layer
        # enters one for its whole call: a decode step would otherwise pay four).
        if is_bfloat16(self._dtype):
            return _rounded(self._wide(x, self._weight.T, None), out, self._dtype)
        y = np.matmul(x, self._weight.T, out=out)
        if self._bias is not None:
            y += self._bias
        return y

    def _wide(self, x: np.ndarray, w: np.ndarray, bias_shape: tuple | None) -> np.ndarray:
        """bfloat16: ``x @ w + bias`` in float32 (NumPy has no fast bfloat16 matmul, and
        float32 accumulation is the rule): operands widened exactly, one float32 result."""
        y = np.matmul(x.astype(np.float32), w.astype(np.float32))
        if self._bias is not None:
            b = self._bias.astype(np.float32)
            y += b if bias_shape is None else b.reshape(bias_shape)
        return y

    def heads(self, x: np.ndarray, num_heads: int) -> np.ndarray:
        """``x (B, L, in)`` projected and split into ``(B, num_heads, L, out // H)`` (a strided
        view of one ``(B, L, out)`` result; :meth:`_apply`'s errstate rule)."""
        return split_heads(self._apply(x), num_heads)

    def into_heads(self, x: np.ndarray, num_heads: int, out: np.ndarray) -> np.ndarray:
        """``x (B, L, in)`` projected straight into ``out (B, num_heads, L, out // H)``: one
        matmul per head, no intermediate array (for the head-major KV cache). Call it under
        ``np.errstate(invalid="ignore", over="ignore")``, as the layer does."""
        in_f = self._weight.shape[1]
        w = self._weight.reshape(num_heads, -1, in_f).transpose(0, 2, 1)  # (H, in, D) view
        if is_bfloat16(self._dtype):
            return _rounded(self._wide(x[:, None], w, (num_heads, 1, -1)), out, self._dtype)
        y = np.matmul(x[:, None], w, out=out)
        if self._bias is not None:
            y += self._bias.reshape(num_heads, 1, -1)
        return y

    def __repr__(self) -> str:
        out_f, in_f = self._weight.shape
        return (
            f"Projection({self._name}: {in_f} -> {out_f}, bias={self._bias is not None}, "
            f"dtype={self._dtype})"
        )


def _rounded(y: np.ndarray, out: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """A float32 projection rounded once to ``dtype`` (bfloat16), into ``out`` if given."""
    if out is None:
        return y.astype(dtype)
    np.copyto(out, y, casting="unsafe")
    return out

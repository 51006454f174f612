"""fastattn.block_mask: a bool attention mask fixed once, with the tile structure the kernels
skip, for a mask reused across layers or calls (block-sparse, local + global, key padding).

The kernels themselves summarise any bool mask once per call (which keys each mask row
leaves visible, per chunk of 64 keys) and skip what it hides; a BlockMask is that mask
checked and frozen once, read-only, with that summary built once (by the kernels' own
function) and handed to every SDPA-kernel call it is passed to, and its
per-tile counts for inspection. It means
exactly its dense mask (it is an array-like: ``np.asarray`` gives the mask), so
``attn_mask=block_mask(m)`` gives bit for bit the result of ``attn_mask=m`` wherever an
attn_mask is taken."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import numpy as np

from fastattn import _core, _threads
from fastattn._checks import _MAX_BATCH_DIMS

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray


_MAX_MASK_DIMS = _MAX_BATCH_DIMS + 3  # batch dims + (H, Lq, Lk): the most a kernel call takes


class BlockMask:
    """A read-only bool attention mask (``True`` = may attend) and its tile occupancy.

    Build it with :func:`fastattn.block_mask`; pass it as ``attn_mask=`` to
    :func:`fastattn.scaled_dot_product_attention`, where it means exactly ``mask``.

    Attributes
    ----------
    mask : ndarray of bool, shape (..., Lq, Lk)
        The mask (read-only, C-contiguous; broadcasts like any ``attn_mask``).
    block_size : int
        The tile edge of ``tile_counts``.
    tile_counts : ndarray of int64, shape (..., ceil(Lq / block_size), ceil(Lk / block_size))
        Kept entries per ``block_size x block_size`` tile (edge tiles are smaller).
    """

    __slots__ = ("_block_size", "_mask", "_summary", "_tile_counts")

    def __init__(
        self, mask: NDArray[np.bool_], block_size: int, tile_counts: NDArray, summary=None
    ):
        self._mask = mask
        self._block_size = block_size
        self._summary = summary
        self._tile_counts = tile_counts

    mask = property(lambda self: self._mask)
    block_size = property(lambda self: self._block_size)
    tile_counts = property(lambda self: self._tile_counts)
    # The kernels' summary of ``mask`` (opaque; None for an empty mask), which every call
    # of the SDPA kernel with this mask is handed (SdpaArgs.mask_summary).
    summary = property(lambda self: self._summary)

    @property
    def shape(self) -> tuple[int, ...]:
        """The mask's shape."""
        return self._mask.shape

    @property
    def sparsity(self) -> float:
        """The fraction of tiles with no kept entry (the tiles the kernels skip whole)."""
        t = self._tile_counts
        return float((t == 0).sum() / t.size) if t.size else 0.0

    def __array__(self, dtype=None, copy=None):
        # NumPy's array protocol: every attn_mask check (np.asarray) sees the dense mask.
        m = self._mask
        if dtype is not None and np.dtype(dtype) != m.dtype:
            if copy is False:
                raise ValueError(
                    "BlockMask: a bool mask cannot become another dtype without a copy"
                )
            return m.astype(dtype)
        return m.copy() if copy else m

    def __setattr__(self, name, value):
        if hasattr(self, "_tile_counts"):
            raise AttributeError("BlockMask is immutable")
        object.__setattr__(self, name, value)

    def __reduce__(self):
        # Pickled as its mask and block size; the summary (a kernel object) is rebuilt.
        return (_rebuild, (self._mask, self._block_size))

    def __repr__(self) -> str:
        return (
            f"BlockMask(shape={self.shape}, block_size={self.block_size}, "
            f"sparsity={self.sparsity:.3f})"
        )


def block_mask(mask: ArrayLike, *, block_size: int = 64) -> BlockMask:
    """Freeze a bool attention mask for reuse: see :class:`BlockMask`.

    Parameters
    ----------
    mask : array_like of bool, shape (..., Lq, Lk), at least 2-D
        ``True`` where a query may attend a key. Copied (later changes to ``mask`` do not
        reach the BlockMask).
    block_size : int, default 64
        Tile edge for ``BlockMask.tile_counts`` and :attr:`BlockMask.sparsity` (the
        kernels skip hidden keys in chunks of 64 whatever this is).

    Returns
    -------
    BlockMask

    Raises
    ------
    TypeError
        ``mask`` is not bool, or ``block_size`` is not an integer.
    ValueError
        ``mask`` has fewer than 2 dimensions, or ``block_size`` < 1.
    """
    if isinstance(mask, BlockMask):
        mask = mask.mask
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise TypeError(f"block_mask: mask must be a bool array, got dtype {m.dtype}")
    if m.ndim < 2:
        raise ValueError(
            f"block_mask: mask must be at least 2-D (..., Lq, Lk), got shape {m.shape}"
        )
    if isinstance(block_size, (bool, np.bool_)):
        raise TypeError("block_mask: block_size must be an integer, got bool")
    try:
        bs = operator.index(block_size)
    except TypeError:
        raise TypeError(
            f"block_mask: block_size must be an integer, got {type(block_size).__name__}"
        ) from None
    if bs < 1:
        raise ValueError(f"block_mask: block_size must be >= 1, got {bs}")
    owner = np.array(m, dtype=np.bool_, order="C", copy=True)
    owner.flags.writeable = False
    # Handed out as a view of the read-only copy: NumPy refuses to make a view writeable
    # when its base is not, so the mask cannot be edited under its precomputed summary.
    m = owner.view()
    # Built here once, by the function each call would run (kernels/block_mask-inl.h).
    summary = None
    if m.size and m.ndim <= _MAX_MASK_DIMS:
        summary = _core.mask_summary(m, _threads.resolve(None))
    return BlockMask(m, bs, _tile_counts(m, bs), summary)


def _rebuild(mask: np.ndarray, block_size: int) -> BlockMask:
    """Unpickling: the BlockMask of ``mask`` (its summary built again)."""
    return block_mask(mask, block_size=block_size)


def _tile_counts(m: np.ndarray, bs: int) -> np.ndarray:
    """Kept entries per bs x bs tile of the last two axes (edge tiles are smaller)."""
    lq, lk = m.shape[-2:]
    if lq == 0 or lk == 0:
        return np.zeros((*m.shape[:-2], -(-lq // bs), -(-lk // bs)), dtype=np.int64)
    rows = np.add.reduceat(m, np.arange(0, lq, bs), axis=-2, dtype=np.int64)
    return np.add.reduceat(rows, np.arange(0, lk, bs), axis=-1)

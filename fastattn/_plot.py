"""fastattn.plot_attention: an attention-weights heatmap (matplotlib, an optional extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # matplotlib is optional: its Axes/Colormap/AxesImage are typed as Any
    from collections.abc import Sequence

    from numpy.typing import ArrayLike


def _labels(labels, count: int, name: str, axis: str):
    if labels is None:
        return None
    labels = [str(t) for t in labels]
    if len(labels) != count:
        raise ValueError(f"{name} has {len(labels)} labels but weights has {count} {axis}")
    return labels


def plot_attention(
    weights: ArrayLike,
    x_labels: Sequence[object] | None = None,
    y_labels: Sequence[object] | None = None,
    ax: Any = None,
    *,
    cmap: Any = "viridis",
    colorbar: bool = True,
    vmin: float | None = None,
    vmax: float | None = None,
) -> Any:
    """Draw an attention-weights matrix as a heatmap: one row per query, one column per key.

    Parameters
    ----------
    weights : array_like, shape ``(Lq, Lk)``
        Real numbers, e.g. one batch entry and head of the weights returned by
        ``MultiHeadAttention(..., need_weights=True)`` or
        ``scaled_dot_product_attention(..., return_weights=True)`` (pick it with
        ``weights[0]`` or ``weights[0, h]``).
    x_labels : sequence of ``Lk`` labels, optional
        Key (column) labels, e.g. source tokens; drawn rotated below the plot.
    y_labels : sequence of ``Lq`` labels, optional
        Query (row) labels, e.g. target tokens.
    ax : matplotlib Axes, optional
        Where to draw; default ``matplotlib.pyplot.gca()``.
    cmap : str or Colormap, default "viridis"
    colorbar : bool, default True
        Add a colour bar next to ``ax``.
    vmin, vmax : float, optional
        Colour limits; default the data's range.

    Returns
    -------
    The matplotlib ``AxesImage``.

    Needs matplotlib: ``pip install "fastattn[plot]"``; without it, ``ImportError``.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> from matplotlib.figure import Figure
    >>> ax = Figure().subplots()
    >>> w = np.array([[0.9, 0.1], [0.2, 0.8]])
    >>> image = fastattn.plot_attention(w, x_labels=["a", "b"], y_labels=["A", "B"], ax=ax)
    >>> image.get_array().shape, ax.get_xticklabels()[1].get_text()
    ((2, 2), 'b')
    """
    w = np.asarray(weights)
    if w.dtype.kind not in "fiub":
        raise TypeError(f"weights must be a real-valued array, got dtype {w.dtype}")
    if w.ndim != 2:
        raise ValueError(
            f"weights must be 2-D (Lq, Lk), got shape {w.shape}; pick one batch entry and "
            "head first, e.g. weights[0] or weights[0, h]"
        )
    xs = _labels(x_labels, w.shape[1], "x_labels", "columns (keys)")
    ys = _labels(y_labels, w.shape[0], "y_labels", "rows (queries)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(
            "fastattn.plot_attention needs matplotlib, an optional dependency: "
            'pip install "fastattn[plot]" (or pip install matplotlib)'
        ) from None
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.gca()

    image = ax.imshow(
        w.astype(np.float64),
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
    )
    if xs is not None:
        ax.set_xticks(np.arange(len(xs)))
        ax.set_xticklabels(xs, rotation=60, ha="right", rotation_mode="anchor")
    if ys is not None:
        ax.set_yticks(np.arange(len(ys)))
        ax.set_yticklabels(ys)
    ax.set_xlabel("keys")
    ax.set_ylabel("queries")
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    return image

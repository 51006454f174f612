"""
Self-attention over image patches
=================================

An image treated as a set of patch vectors, as a vision transformer does.

A synthetic 96x96 picture (sky, sun, house, grass) is cut into 8x8 patches: 144 vectors of
8 * 8 * 3 = 192 numbers. A ``fastattn.MultiHeadAttention`` with hand-set weights (no
training) attends from every patch to every patch:

* the "patch embedding" centres the patch vectors (minus the mean patch) and scales them to
  unit length; the query and key projections are a scaled identity, so a score is a
  multiple of the cosine similarity of two patches;
* values are the raw patch pixels (``vdim`` is the pixel vector) and the output projection
  is the identity, so each output patch is the attention-weighted average of the patches
  it looks at.

The figure shows the picture, the picture rebuilt from the layer's output (attention as a
content-adaptive smoothing filter: regions flatten, edges stay), and for four query
patches where they attend: to the patches that look alike, wherever they are.

Run: ``python examples/image_patch_attention.py [output.png]``
writes the figure to ``output.png`` (default: ``image_patch_attention.png``).
"""

from __future__ import annotations

import sys

import numpy as np

import fastattn

SIZE, PATCH = 96, 8
GRID = SIZE // PATCH  # 12 x 12 patches
QUERIES = {"sun": (2, 8), "wall": (7, 3), "sky": (1, 2), "grass": (10, 8)}  # (row, col)


def make_image(rng: np.random.Generator) -> np.ndarray:
    """(SIZE, SIZE, 3) floats in [0, 1]: sky, sun, a house with a roof, grass."""
    y, x = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    img = np.empty((SIZE, SIZE, 3))
    img[:] = np.stack([0.35 + 0.3 * y, 0.55 + 0.3 * y, 0.95 - 0.1 * y], axis=-1)  # sky
    grass = y > 0.72
    img[grass] = [0.2, 0.6, 0.15]
    sun = (x - 0.75) ** 2 + (y - 0.25) ** 2 < 0.16**2
    img[sun] = [1.0, 0.8, 0.1]
    wall = (x > 0.17) & (x < 0.5) & (y > 0.5) & (y <= 0.72)
    img[wall] = [0.85, 0.8, 0.7]
    roof = (y > 0.36) & (y <= 0.5) & (np.abs(x - 0.335) < (y - 0.36) * 1.3 + 0.02)
    img[roof] = [0.7, 0.15, 0.1]
    img += 0.04 * rng.standard_normal(img.shape)  # texture, so no two patches are equal
    return np.clip(img, 0.0, 1.0)


def to_patches(img: np.ndarray) -> np.ndarray:
    """(GRID * GRID, 3 * PATCH * PATCH): patches in row-major order, channel by channel."""
    p = img.reshape(GRID, PATCH, GRID, PATCH, 3).transpose(0, 2, 4, 1, 3)
    return p.reshape(GRID * GRID, 3 * PATCH * PATCH)


def from_patches(patches: np.ndarray) -> np.ndarray:
    p = patches.reshape(GRID, GRID, 3, PATCH, PATCH).transpose(0, 3, 1, 4, 2)
    return p.reshape(SIZE, SIZE, 3)


def main(path: str = "image_patch_attention.png") -> None:
    from matplotlib.figure import Figure  # no pyplot: works on any (or no) display
    from matplotlib.patches import Rectangle

    img = make_image(np.random.default_rng(0))
    pixels = to_patches(img).astype(np.float32)  # (144, 192): the values
    centred = pixels - pixels.mean(axis=0)
    keys = centred / np.linalg.norm(centred, axis=1, keepdims=True)  # unit vectors

    e = pixels.shape[1]
    mha = fastattn.MultiHeadAttention(e, num_heads=1, bias=False, seed=0)
    sharp = np.float32(13.0)  # score = sharp**2 * cosine / sqrt(192)
    mha.q_proj.weight = sharp * np.eye(e)
    mha.k_proj.weight = sharp * np.eye(e)
    mha.v_proj.weight = np.eye(e)
    mha.out_proj.weight = np.eye(e)
    out, weights = mha(keys, keys, pixels, need_weights=True)  # (144, 192), (144, 144)
    rebuilt = np.clip(from_patches(out), 0.0, 1.0)

    fig = Figure(figsize=(16, 8), layout="constrained")
    grid = fig.subplots(2, 4)
    grid[0, 0].imshow(img)
    grid[0, 0].set_title(f"input: {GRID * GRID} patches of {PATCH}x{PATCH}x3")
    for r, c in QUERIES.values():
        grid[0, 0].add_patch(
            Rectangle(
                (c * PATCH - 0.5, r * PATCH - 0.5),
                PATCH,
                PATCH,
                fill=False,
                edgecolor="white",
                linewidth=2,
            )
        )
    grid[0, 1].imshow(rebuilt)
    grid[0, 1].set_title("layer output as an image")
    fastattn.plot_attention(weights, ax=grid[0, 2], cmap="magma", vmax=0.1)
    grid[0, 2].set_title(f"all {GRID * GRID} x {GRID * GRID} weights (clipped at 0.1)")
    grid[0, 2].set_xlabel("key patch (row-major)")
    grid[0, 2].set_ylabel("query patch (row-major)")
    grid[0, 3].set_axis_off()
    grid[0, 3].text(
        0.0,
        0.5,
        "Each patch attends to the patches\nthat look like it "
        "(cosine similarity\nof the centred pixel vectors).\n\n"
        "Output = attention-weighted average\nof the patches: regions "
        "flatten,\nedges stay.",
        fontsize=12,
        va="center",
    )
    for ax, (name, (r, c)) in zip(grid[1], QUERIES.items()):
        attn_map = weights[r * GRID + c].reshape(GRID, GRID)
        fastattn.plot_attention(attn_map, ax=ax, cmap="inferno")
        ax.imshow(img, extent=(-0.5, GRID - 0.5, GRID - 0.5, -0.5), alpha=0.25)
        ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="cyan", linewidth=2))
        ax.set_title(f"where the {name} patch attends")
        ax.set_xlabel("patch column")
        ax.set_ylabel("patch row")
    fig.suptitle("Self-attention over an image as a set of patch vectors")
    fig.savefig(path, dpi=80)
    for name, (r, c) in QUERIES.items():
        w = weights[r * GRID + c]
        print(
            f"{name:>5s} patch ({r}, {c}): top weight {w.max():.3f}, "
            f"patches holding 90% of it: {int((np.cumsum(np.sort(w)[::-1]) < 0.9).sum()) + 1}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

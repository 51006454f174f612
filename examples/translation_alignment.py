"""
Cross-attention in a toy translation
====================================

Which English word does each French word look at?

A 2-head cross-attention layer (``fastattn.MultiHeadAttention`` with ``kdim != embed_dim``)
attends from the French target tokens to the English source tokens. Its weights are set by
hand, not trained, so the picture is easy to read:

* every token is embedded as [meaning | position]: words with the same meaning (cat/chat)
  share a random "meaning" vector, and the position part is a sinusoidal code of where the
  word sits in its sentence (scaled to the sentence length, so both sentences span 0..1);
* the source embeddings carry extra "English-only" features (so ``kdim`` > ``embed_dim``),
  which the key projection drops;
* head 0 projects onto the meaning part only (it aligns words by meaning: "le" looks at
  both "the"s), head 1 onto the position part only (a soft diagonal); their average
  resolves the ambiguity, and handles the adjective-noun swap (black cat / chat noir) and
  one word becoming two (sat / s'est assis).

Run: ``python examples/translation_alignment.py [output.png]``
writes the figure to ``output.png`` (default: ``translation_alignment.png``).
"""

from __future__ import annotations

import sys

import numpy as np

import fastattn

SOURCE = ["the", "black", "cat", "sat", "on", "the", "mat", "."]
TARGET = ["le", "chat", "noir", "s'est", "assis", "sur", "le", "tapis", "."]
MEANING = {
    "le": "the",
    "chat": "cat",
    "noir": "black",
    "s'est": "sat",
    "assis": "sat",
    "sur": "on",
    "tapis": "mat",
    ".": ".",
}  # French word -> English concept

HALF = 16  # features per head: meaning, then position
EXTRA = 8  # English-only source features that the key projection ignores


def position_code(n: int) -> np.ndarray:
    """(n, HALF) sinusoidal codes of the relative positions 0..1 of an n-word sentence."""
    pos = np.linspace(0.0, 1.0, n)[:, None]
    freqs = np.pi * np.arange(1, HALF // 2 + 1)[None, :] / 2
    return np.concatenate([np.cos(pos * freqs), np.sin(pos * freqs)], axis=1)


def embed(rng: np.random.Generator):
    concepts = {w: rng.standard_normal(HALF) for w in dict.fromkeys(SOURCE)}
    src = np.concatenate(
        [
            np.stack([concepts[w] for w in SOURCE]),
            position_code(len(SOURCE)),
            rng.standard_normal((len(SOURCE), EXTRA)),
        ],
        axis=1,
    )
    tgt = np.concatenate(
        [np.stack([concepts[MEANING[w]] for w in TARGET]), position_code(len(TARGET))], axis=1
    )
    return src.astype(np.float32), tgt.astype(np.float32)


def build_layer() -> fastattn.MultiHeadAttention:
    e = 2 * HALF
    mha = fastattn.MultiHeadAttention(e, num_heads=2, kdim=e + EXTRA, vdim=e + EXTRA, seed=0)
    sharp = np.float32(2.0)  # scales the scores: sharper attention
    mha.q_proj.weight = sharp * np.eye(e)  # head 0 = meaning, head 1 = position
    mha.k_proj.weight = sharp * np.eye(e, e + EXTRA)  # the English-only features dropped
    return mha


def main(path: str = "translation_alignment.png") -> None:
    from matplotlib.figure import Figure  # no pyplot: works on any (or no) display

    src, tgt = embed(np.random.default_rng(3))
    mha = build_layer()
    _, per_head = mha(tgt, src, need_weights=True, average_attn_weights=False)  # (2, Lt, Ls)
    average = per_head.mean(axis=0)
    best = [SOURCE[j] for j in average.argmax(axis=1)]
    for t, s in zip(TARGET, best):
        print(f"{t:>6s} -> {s}")

    fig = Figure(figsize=(15, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    titles = ["head 0: meaning", "head 1: position", "average over heads"]
    for ax, w, title in zip(axes, [per_head[0], per_head[1], average], titles):
        fastattn.plot_attention(w, x_labels=SOURCE, y_labels=TARGET, ax=ax, vmin=0, vmax=1)
        ax.set_title(title)
        ax.set_xlabel("English source (keys)")
        ax.set_ylabel("French target (queries)")
    fig.suptitle("Cross-attention from a French sentence to its English source")
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

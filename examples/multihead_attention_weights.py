"""
Attention weights of a multi-head layer
=======================================

Each head of a multi-head layer has its own query and key projections, so each can look
for something different. Trained models have heads that attend to the previous token, to
earlier copies of the current word, or to the start of the sequence; here a 4-head causal
self-attention layer (``fastattn.MultiHeadAttention``) gets such heads by hand, not by
training, so the picture is easy to read:

* every token is embedded as [meaning | position]: a random vector per word (both "the"s
  share one), then sinusoidal codes of the token's position;
* head 0 ("previous token") compares the key positions with the query position shifted
  back by one (a rotation of the sinusoidal code);
* head 1 ("same word") compares meanings: a word attends to itself and shares the weight
  with its earlier occurrences ("the", "cat");
* head 2 ("first token") has a constant query (its projection's bias: the code of position
  0), so every row attends to the start;
* head 3 ("local") compares positions without a shift and with a lower gain: a soft window
  over the last few tokens.

``need_weights=True, average_attn_weights=False`` returns the weights per head, the
layout to inspect a trained model's heads in too (load one with
``MultiHeadAttention.from_torch``). The causal mask keeps every row on its own and
earlier tokens (the upper triangle stays 0).

Run: ``python examples/multihead_attention_weights.py [output.png]``
writes the figure to ``output.png`` (default: ``multihead_attention_weights.png``).
"""

from __future__ import annotations

import sys

import numpy as np

import fastattn

TOKENS = "the cat sat on the mat because the cat was tired".split()
HEADS = ["previous token", "same word", "first token", "local"]
D = 8  # features per head; the embedding is E = 32: 16 of meaning, 16 of position
E = 32
FREQS = np.pi * np.arange(1, 9) / (2 * len(TOKENS))  # the slowest first; none wraps around


def position_code(positions: np.ndarray) -> np.ndarray:
    """(n, 16) sinusoidal codes: cos and sin of each frequency, interleaved."""
    angles = np.asarray(positions, dtype=float)[:, None] * FREQS[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1).reshape(len(angles), -1)


def shift_back() -> np.ndarray:
    """(D, D) R with R @ code(i)[:D] = code(i - 1)[:D]: a rotation by -freq per pair."""
    r = np.zeros((D, D))
    for f, w in enumerate(FREQS[: D // 2]):
        c, s = np.cos(w), np.sin(w)
        r[2 * f : 2 * f + 2, 2 * f : 2 * f + 2] = [[c, s], [-s, c]]
    return r


def embed(rng: np.random.Generator) -> np.ndarray:
    """(L, E): a random meaning vector per word (shared by repeats), then the position."""
    meanings = {w: rng.standard_normal(16) / 2 for w in dict.fromkeys(TOKENS)}
    x = np.concatenate(
        [np.stack([meanings[w] for w in TOKENS]), position_code(np.arange(len(TOKENS)))], axis=1
    )
    return x.astype(np.float32)


def build_layer() -> fastattn.MultiHeadAttention:
    """Query and key projections per head; value and output projections stay random."""
    mha = fastattn.MultiHeadAttention(E, num_heads=len(HEADS), seed=0)
    meaning, position = np.eye(E)[:D], np.eye(E)[16 : 16 + D]  # (D, E) selectors
    gain = 4.0
    mha.q_proj.weight = np.concatenate(
        [
            gain * shift_back() @ position,  # head 0: the code of position i - 1
            gain * meaning,  # head 1: the word
            np.zeros((D, E)),  # head 2: nothing from the token; the bias below
            0.5 * gain * position,  # head 3: position i, with a lower gain
        ]
    )
    bias = np.zeros(E)
    bias[2 * D : 3 * D] = gain * position_code([0])[0, :D]  # head 2 asks for position 0
    mha.q_proj.bias = bias
    mha.k_proj.weight = np.concatenate(
        [gain * position, gain * meaning, gain * position, 0.5 * gain * position]
    )
    return mha


def main(path: str = "multihead_attention_weights.png") -> None:
    from matplotlib.figure import Figure  # no pyplot: works on any (or no) display

    x = embed(np.random.default_rng(1))
    _, per_head = build_layer()(
        x, is_causal=True, need_weights=True, average_attn_weights=False
    )  # (4, L, L)
    for name, w in zip(HEADS, per_head):
        picks = [TOKENS[j] for j in w.argmax(axis=1)]
        print(f"{name:>14s}: " + " ".join(f"{t}->{p}" for t, p in zip(TOKENS, picks)))

    fig = Figure(figsize=(16, 4.6), layout="constrained")
    axes = fig.subplots(1, len(HEADS))
    for ax, name, w in zip(axes, HEADS, per_head):
        fastattn.plot_attention(
            w,
            x_labels=TOKENS,
            y_labels=TOKENS,
            ax=ax,
            vmin=0,
            vmax=1,
            cmap="Blues",
            colorbar=ax is axes[-1],
        )
        ax.set_title(f"head {HEADS.index(name)}: {name}")
        ax.set_xlabel("key (earlier token)")
        ax.set_ylabel("query (current token)")
    fig.suptitle("Causal self-attention weights of a 4-head layer, one panel per head")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

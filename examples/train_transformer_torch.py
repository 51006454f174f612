"""
Training a small transformer through fastattn.torch
===================================================

``fastattn.torch.scaled_dot_product_attention`` is a drop-in for PyTorch's
``torch.nn.functional.scaled_dot_product_attention`` with gradients: its backward is
``fastattn.scaled_dot_product_attention_backward``, which recomputes the attention weights
block by block from the forward's log-sum-exp.

A two-layer causal transformer (width 64, 4 heads) learns to reverse a sequence of digits:
it reads ``x_1 ... x_n | `` and must continue with ``x_n ... x_1``, one token at a time.
The same model, from the same initial weights and on the same batches, is trained twice
with Adam, in float64: once with fastattn's attention, once with PyTorch's own. The two loss
curves lie on top of each other (left); the right panel shows how far apart they are, step
by step: the rounding of two different (both exact) kernels, which training amplifies
(Adam at this learning rate is chaotic: in float32 the same two runs agree to 1e-6 for the
first hundred steps, then drift apart as any two float32 runs with different summation
orders do), not a different model.

Run: ``python examples/train_transformer_torch.py [output.png]``
writes the figure to ``output.png`` (default: ``train_transformer_torch.png``).
Needs PyTorch (``pip install torch``) and matplotlib.
"""

from __future__ import annotations

import copy
import sys
import time

import numpy as np
import torch
from torch import nn

import fastattn.torch

DIGITS, LENGTH = 10, 8  # sequences of 8 digits
SEP = DIGITS  # the separator token
STEPS, BATCH = 200, 32


class Block(nn.Module):
    """Pre-norm transformer block; ``attend`` is the SDPA function it calls."""

    def __init__(self, width: int, heads: int, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x):
        b, n, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, -1).unbind(2)
        # (B, L, H, E) viewed as (B, H, L, E): strided views, read in place by fastattn
        out = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(out.transpose(1, 2).reshape(b, n, w))
        return x + self.mlp(self.norm2(x))


class Reverser(nn.Module):
    def __init__(self, attend, width: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(DIGITS + 1, width)
        self.position = nn.Parameter(0.02 * torch.randn(2 * LENGTH + 1, width))
        self.blocks = nn.ModuleList(Block(width, heads, attend) for _ in range(layers))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, DIGITS))

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batches(seed: int = 0):
    """STEPS batches of (inputs, targets): ``x | reversed(x)`` shifted by one token."""
    rng = np.random.default_rng(seed)
    for _ in range(STEPS):
        x = rng.integers(0, DIGITS, size=(BATCH, LENGTH))
        seq = np.concatenate([x, np.full((BATCH, 1), SEP), x[:, ::-1]], axis=1)
        seq = torch.from_numpy(seq)
        yield seq[:, :-1], seq[:, LENGTH + 1 :]  # the reversal, predicted from the separator on


def train(model: nn.Module):
    """Adam on the reversal loss; returns the loss of every step and the last batch's
    token accuracy."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for inputs, targets in batches():
        logits = model(inputs)[:, LENGTH:]  # the positions that predict the reversal
        loss = nn.functional.cross_entropy(logits.reshape(-1, DIGITS), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    accuracy = (logits.argmax(-1) == targets).float().mean().item()
    return np.array(losses), accuracy


def run():
    torch.manual_seed(0)
    # float64: training amplifies any difference exponentially (the loss surface is chaotic
    # at this learning rate), float32's rounding as much as float64's; float64 keeps the two
    # runs' rounding differences tiny enough to stay invisible for the whole run.
    ours = Reverser(fastattn.torch.scaled_dot_product_attention).double()
    theirs = copy.deepcopy(ours)  # the same initial weights
    for block in theirs.blocks:
        block.attend = nn.functional.scaled_dot_product_attention
    results = {}
    for name, model in (("fastattn.torch", ours), ("torch SDPA", theirs)):
        start = time.perf_counter()
        losses, accuracy = train(model)
        results[name] = (losses, accuracy, time.perf_counter() - start)
    return results


def plot(results, path: str) -> None:
    import matplotlib.pyplot as plt

    (a, acc_a, _), (b, acc_b, _) = results.values()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    steps = np.arange(1, len(a) + 1)
    for (name, (losses, acc, _)), style in zip(results.items(), ("-", "--")):
        left.plot(steps, losses, style, lw=1.5, label=f"{name} (final accuracy {acc:.1%})")
    left.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="Training loss")
    left.legend()
    right.semilogy(steps, np.abs(a - b) / b, color="C2", lw=1)
    right.set(
        xlabel="step",
        ylabel="|loss difference| / loss",
        title="fastattn.torch vs torch SDPA, same init and data",
    )
    fig.suptitle("A 2-layer causal transformer learns to reverse 8 digits")
    fig.savefig(path, dpi=100)


def main(path: str = "train_transformer_torch.png") -> None:
    # a tiny model: its small ops gain nothing from more threads (one each, a fair race)
    torch.set_num_threads(1)
    fastattn.set_num_threads(1)
    results = run()
    (a, _, _), (b, _, _) = results.values()
    for name, (losses, acc, seconds) in results.items():
        print(
            f"{name}: loss {losses[0]:.3f} -> {losses[-1]:.4f}, accuracy {acc:.1%}, "
            f"{seconds:.1f} s for {STEPS} steps"
        )
    print(f"max relative loss difference over {STEPS} steps: {np.max(np.abs(a - b) / b):.1e}")
    plot(results, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

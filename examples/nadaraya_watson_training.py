"""
Training the width of Nadaraya-Watson attention pooling by gradient descent
===========================================================================

Nadaraya-Watson regression becomes *parametric* attention pooling once the kernel's width
is a learned parameter: the prediction at ``x`` is ``sum_j softmax_j(-((x - x_j) w)^2 / 2)
y_j``, and the width ``w`` (the inverse bandwidth, ``h = 1 / w``) is fitted to the data by
gradient descent, as in d2l's "attention pooling" section.

Here in plain NumPy with fastattn: ``fastattn.nadaraya_watson`` is the forward pass and
``fastattn.nadaraya_watson_backward`` gives the gradient of the loss with respect to the
bandwidth (the chain rule ``dL/dw = -h^2 dL/dh`` turns it into ``w``'s). Fifty noisy
samples of ``y = 2 sin(x) + x^0.8`` on ``[0, 5]`` are the training set; each training
point is predicted from the *other* 49 (leave-one-out, one batch entry per point), so the
fit cannot drive the width to infinity and memorise the noise. The loss is the mean
squared error of those predictions.

Left: the samples, the truth and the fitted curve on a test grid before (``w = 1``) and
after training. Middle: the training loss at each step: the first steps narrow the kernel
from ``w = 1`` (which flattens the curve) most of the way, the later ones creep on towards
the best leave-one-out width (about 5) along a flat valley of the loss. Right: the trained attention
weights (test points by training points): narrower than at ``w = 1``, so each prediction
follows the samples near it.

Run: ``python examples/nadaraya_watson_training.py [output.png]``
writes the figure to ``output.png`` (default: ``nadaraya_watson_training.png``).
"""

from __future__ import annotations

import sys

import numpy as np

import fastattn

STEPS = 30
LEARNING_RATE = 2.0


def truth(x: np.ndarray) -> np.ndarray:
    return 2 * np.sin(x) + x**0.8


def make_data(rng: np.random.Generator, n: int = 50):
    """Sorted training inputs on [0, 5], their noisy targets, and a grid of test points."""
    x_train = np.sort(rng.uniform(0, 5, n))
    y_train = truth(x_train) + rng.normal(0.0, 0.5, n)
    x_test = np.arange(0, 5, 0.1)
    return x_train, y_train, x_test


def leave_one_out(x_train: np.ndarray, y_train: np.ndarray):
    """Batched keys and values: entry i holds every training point but the i-th, as
    (n, n - 1, 1) arrays; the queries are the training points, (n, 1, 1)."""
    n = len(x_train)
    others = ~np.eye(n, dtype=bool)
    keys = np.broadcast_to(x_train, (n, n))[others].reshape(n, n - 1, 1)
    values = np.broadcast_to(y_train, (n, n))[others].reshape(n, n - 1, 1)
    return x_train.reshape(n, 1, 1), keys, values


def loss_and_grad(w: float, queries, keys, values, targets):
    """Mean squared error of the leave-one-out predictions, and its derivative in w."""
    h = 1.0 / w
    pred = fastattn.nadaraya_watson(queries, keys, values, bandwidth=h)[:, 0, 0]
    residual = pred - targets
    loss = float(np.mean(residual**2))
    grad_out = (2.0 / len(targets) * residual).reshape(-1, 1, 1)
    *_, grad_h = fastattn.nadaraya_watson_backward(grad_out, queries, keys, values, bandwidth=h)
    return loss, -(h**2) * grad_h  # dh/dw = -1 / w^2 = -h^2


def train(x_train, y_train, w: float = 1.0, steps: int = STEPS, lr: float = LEARNING_RATE):
    """Gradient descent on w: the fitted width and the loss before each step (and after)."""
    queries, keys, values = leave_one_out(x_train, y_train)
    losses = []
    for _ in range(steps):
        loss, grad_w = loss_and_grad(w, queries, keys, values, y_train)
        losses.append(loss)
        w -= lr * grad_w
    losses.append(loss_and_grad(w, queries, keys, values, y_train)[0])
    return w, np.array(losses)


def main(path: str = "nadaraya_watson_training.png") -> None:
    from matplotlib.figure import Figure  # no pyplot: works on any (or no) display

    x_train, y_train, x_test = make_data(np.random.default_rng(0))
    w, losses = train(x_train, y_train)
    print(f"w = {w:.3f} (bandwidth {1 / w:.3f}); loss {losses[0]:.4f} -> {losses[-1]:.4f}")

    fig = Figure(figsize=(16, 4.8), layout="constrained")
    ax_fit, ax_loss, ax_w = fig.subplots(1, 3)
    ax_fit.plot(x_test, truth(x_test), color="tab:blue", linewidth=3, alpha=0.35, label="truth")
    ax_fit.plot(x_train, y_train, "o", color="tab:orange", markersize=4, alpha=0.7, label="samples")
    before = fastattn.nadaraya_watson(x_test, x_train, y_train, bandwidth=1.0)
    after, weights = fastattn.nadaraya_watson(
        x_test, x_train, y_train, bandwidth=1 / w, return_weights=True
    )
    ax_fit.plot(x_test, before, color="tab:gray", linestyle="--", label="w = 1 (untrained)")
    ax_fit.plot(x_test, after, color="tab:red", linewidth=2, label=f"w = {w:.2f} (trained)")
    ax_fit.set_xlabel("x")
    ax_fit.set_ylabel("y")
    ax_fit.legend(loc="upper right", fontsize=9)
    ax_fit.set_title("fit before and after training")
    ax_loss.plot(np.arange(len(losses)), losses, color="tab:red")
    ax_loss.set_xlabel("gradient step")
    ax_loss.set_ylabel("leave-one-out mean squared error (log scale)")
    ax_loss.set_yscale("log")
    ax_loss.set_title("training loss")
    fastattn.plot_attention(weights, ax=ax_w, cmap="Reds")
    ax_w.set_title("trained attention weights")
    ax_w.set_xlabel("training point (sorted x)")
    ax_w.set_ylabel("test point (x from 0 to 5)")
    fig.suptitle("Parametric Nadaraya-Watson regression: the width fitted by gradient descent")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

"""The scripts in examples/ run headless (matplotlib's Agg backend) and write their PNGs."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

import fastattn

from helpers import REPO

EXAMPLES = REPO / "examples"
SCRIPTS = {
    "translation_alignment.py": "translation_alignment.png",
    "image_patch_attention.py": "image_patch_attention.png",
}

# The examples written for the documentation's gallery (docs/), checked the same way.
SCRIPTS.update(
    {
        name: name.replace(".py", ".png")
        for name in [
            "nadaraya_watson_kernels.py",
            "nadaraya_watson_training.py",
            "multihead_attention_weights.py",
            "chunked_long_context.py",
            "local_global_attention.py",
        ]
    }
)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_example_writes_png(script, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    env = dict(os.environ, MPLBACKEND="Agg")
    # cwd: a fresh directory, so the child imports the installed fastattn and writes there
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    png = tmp_path / SCRIPTS[script]
    assert f"wrote {SCRIPTS[script]}" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] >= 300 and pixels.shape[1] >= 600
    assert np.asarray(pixels).std() > 0.05  # a picture, not a blank canvas
    assert "Warning" not in proc.stderr, proc.stderr


def load_example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))


def test_translation_example_aligns_every_word():
    """The hand-built cross-attention finds each French word's English source."""
    ex = load_example("translation_alignment")
    src, tgt = ex.embed(np.random.default_rng(3))
    _, w = ex.build_layer()(tgt, src, need_weights=True)
    got = [ex.SOURCE[j] for j in w.argmax(axis=1)]
    assert got == ["the", "cat", "black", "sat", "sat", "on", "the", "mat", "."]
    assert w.argmax(axis=1)[0] == 0 and w.argmax(axis=1)[6] == 5  # each "le" its own "the"


def test_nadaraya_watson_example_bandwidths():
    """The figure's story holds: a moderate bandwidth (and Silverman's) beats both extremes
    with every kernel, and only the compact kernels leave gaps at a tiny bandwidth."""
    ex = load_example("nadaraya_watson_kernels")
    x_train, y_train, x_test = ex.make_data(np.random.default_rng(0))
    for kernel in ex.KERNELS:
        rms = {}
        for h in ex.BANDWIDTHS:
            y_hat, w = ex.fit(x_train, y_train, x_test, kernel, h)
            assert w.shape == (len(x_test), len(x_train))
            rms[h] = np.sqrt(np.nanmean((y_hat - ex.truth(x_test)) ** 2))
            assert np.isnan(y_hat).any() == (kernel != "gaussian" and h == 0.1), (kernel, h)
        assert max(rms[0.5], rms["silverman"]) < min(rms[0.1], rms[2.0]), (kernel, rms)


def test_nadaraya_watson_training_example_trains():
    """Gradient descent on the width lowers the loss at every step, ending well below the
    start, and the gradient it follows is the loss's (central differences in w)."""
    ex = load_example("nadaraya_watson_training")
    x_train, y_train, _ = ex.make_data(np.random.default_rng(0))
    w, losses = ex.train(x_train, y_train, steps=8)
    assert (np.diff(losses) < 0).all(), losses
    assert losses[-1] < 0.6 * losses[0] and w > 2.0, (w, losses)
    batch = ex.leave_one_out(x_train, y_train)
    _, grad_w = ex.loss_and_grad(1.5, *batch, y_train)
    step = 1e-6
    plus, _ = ex.loss_and_grad(1.5 + step, *batch, y_train)
    minus, _ = ex.loss_and_grad(1.5 - step, *batch, y_train)
    assert grad_w < 0 and abs((plus - minus) / (2 * step) - grad_w) < 1e-6 * abs(grad_w)


def test_multihead_example_heads_do_their_jobs():
    """Each hand-built head attends where its name says (argmax of every causal row)."""
    ex = load_example("multihead_attention_weights")
    x = ex.embed(np.random.default_rng(1))
    _, w = ex.build_layer()(x, is_causal=True, need_weights=True, average_attn_weights=False)
    rows = np.arange(len(ex.TOKENS))
    assert w.shape == (4, len(rows), len(rows))
    assert (w.argmax(-1)[0] == np.maximum(rows - 1, 0)).all()  # previous token
    for i, token in enumerate(ex.TOKENS):  # same word: itself and its earlier copies
        copies = [j for j in range(i + 1) if ex.TOKENS[j] == token]
        assert w[1, i].argmax() in copies and w[1, i, copies].sum() > 0.5, token
    assert (w.argmax(-1)[2] == 0).all()  # first token
    assert (w.argmax(-1)[3] == rows).all()  # local
    assert np.allclose(np.triu(w, 1), 0)  # causal


def test_chunked_example_matches_one_shot(tmp_path):
    """Chunk by chunk from the memmaps, merged: the one-shot result, and each query draws
    most of its attention from the chunk holding its needle."""
    ex = load_example("chunked_long_context")
    rng = np.random.default_rng(0)
    queries, needles = ex.make_queries_and_needles(rng)
    keys, values = ex.write_context(tmp_path, ex.context_chunks(rng, queries, needles))
    out, lse, chunk_lses = ex.chunked_attention(queries, keys, values)
    full, full_lse = fastattn.scaled_dot_product_attention(
        queries,
        np.asarray(keys),
        np.asarray(values),
        is_causal=True,
        causal_alignment="bottom_right",
        return_lse=True,
    )
    np.testing.assert_allclose(out, full, atol=2e-5)  # float32, both rounded
    np.testing.assert_allclose(lse, full_lse, rtol=1e-6)
    share = np.exp(chunk_lses - lse)
    assert (share.argmax(axis=0) == needles // ex.CHUNK).all()

"""The scripts in examples/ run headless (matplotlib's Agg backend) and write their PNGs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO

EXAMPLES = REPO / "examples"
SCRIPTS = {
    "translation_alignment.py": "translation_alignment.png",
    "image_patch_attention.py": "image_patch_attention.png",
}


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


def test_translation_example_aligns_every_word():
    """The hand-built cross-attention finds each French word's English source."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import translation_alignment as ex
    finally:
        sys.path.remove(str(EXAMPLES))
    src, tgt = ex.embed(np.random.default_rng(3))
    _, w = ex.build_layer()(tgt, src, need_weights=True)
    got = [ex.SOURCE[j] for j in w.argmax(axis=1)]
    assert got == ["the", "cat", "black", "sat", "sat", "on", "the", "mat", "."]
    assert w.argmax(axis=1)[0] == 0 and w.argmax(axis=1)[6] == 5  # each "le" its own "the"

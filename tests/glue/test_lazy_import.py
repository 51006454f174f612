"""``import fastattn`` imports no framework: fastattn.torch and fastattn.jax are optional
extras, imported only by their users."""

from __future__ import annotations

import subprocess
import sys


def test_import_fastattn_imports_neither_torch_nor_jax(tmp_path):
    # cwd: outside the checkout, whose uncompiled fastattn/ folder Python would import first
    code = (
        "import sys, numpy as np, fastattn;"
        "x = np.ones((2, 3, 4)); fastattn.scaled_dot_product_attention(x, x, x);"
        "bad = [m for m in ('torch', 'jax', 'fastattn.torch', 'fastattn.jax') if m in sys.modules];"
        "assert not bad, bad"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr

"""examples/train_transformer_torch.py: the transformer trained through fastattn.torch and
the same one on PyTorch's SDPA (same init, same batches) follow the same loss curve, and the
figure is written. A shortened run (the gallery runs the whole one)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import REPO  # noqa: E402


def test_training_curves_agree(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    monkeypatch.delitem(sys.modules, "train_transformer_torch", raising=False)
    import train_transformer_torch as ex

    monkeypatch.setattr(ex, "STEPS", 40)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the example's main() does
    try:
        results = ex.run()
    finally:
        torch.set_num_threads(threads)
    (ours, _, _), (theirs, _, _) = results.values()
    assert len(ours) == len(theirs) == 40
    assert ours[-1] < 0.9 * ours[0]  # it learns
    # float64 training, two exact kernels: the curves differ by rounding (1e-16 at the
    # start; training amplifies it, by ~1e4 over the whole 200-step run)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)
    ex.plot(results, str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

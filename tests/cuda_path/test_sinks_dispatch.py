"""SDPA's sinks and alibi_slopes on CuPy arrays: no CUDA kernel has them, so the call raises
NotImplementedError naming the option (CuPy faked as in test_dispatch; no GPU needed)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import fastattn

from cuda_path.test_dispatch import FakeDeviceArray, _stub_cupy


@pytest.fixture
def fake_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _stub_cupy())


@pytest.mark.parametrize("name", ["sinks", "alibi_slopes"])
@pytest.mark.parametrize("device_option", [False, True])
def test_options_raise_on_cupy_arrays(fake_cupy, name, device_option):
    q = FakeDeviceArray(np.ones((2, 4, 8), np.float32))
    values = np.zeros(2, np.float32)
    option = FakeDeviceArray(values) if device_option else values
    with pytest.raises(NotImplementedError, match=name):
        fastattn.scaled_dot_product_attention(q, q, q, **{name: option})


def test_numpy_option_with_numpy_arrays_still_runs(fake_cupy):
    x = np.ones((2, 4, 8), np.float32)
    out = fastattn.scaled_dot_product_attention(x, x, x, sinks=np.zeros(2, np.float32))
    assert isinstance(out, np.ndarray)

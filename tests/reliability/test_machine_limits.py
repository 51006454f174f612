"""The machine-limit probes (_core.fma_peak, _core.read_bandwidth) of the active ISA."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from fastattn import _core


def peak_under(isa: str) -> float:
    """fma_peak (float32) in a fresh interpreter with FASTATTN_ISA=isa, best of three."""
    code = (
        "import fastattn, fastattn._core as c\n"
        "print(max(c.fma_peak('float32', 1, 0.1) for _ in range(3)))\n"
    )
    env = dict(os.environ, FASTATTN_ISA=isa)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
        cwd=os.path.dirname(__file__),
    )
    return float(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fma_peak_positive_and_finite(isa, dtype):
    gflops = _core.fma_peak(dtype, num_threads=1, seconds=0.05)
    assert math.isfinite(gflops) and gflops > 0


def test_read_bandwidth_positive_and_finite(isa):
    gbs = _core.read_bandwidth(1 << 26, num_threads=1, repeats=2)
    assert math.isfinite(gbs) and gbs > 0


@pytest.mark.parametrize("isa_name", _core.available_isas())
def test_fma_peak_runs_under_every_isa(isa_name):
    # Each ISA's probe (its own translation unit) runs and gives a rate. How the rates
    # compare is a measurement (fastattn-bench reports it), not something a test asserts:
    # on a loaded machine any ratio between two timings can come out either way.
    gflops = peak_under(isa_name)
    assert math.isfinite(gflops) and gflops > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="dtype"):
        _core.fma_peak("float16")
    with pytest.raises(ValueError, match="num_threads"):
        _core.fma_peak("float32", num_threads=0)
    with pytest.raises(ValueError, match="nbytes"):
        _core.read_bandwidth(0)

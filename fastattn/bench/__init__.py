"""fastattn's benchmark: ``python -m fastattn.bench`` writes a report comparing fastattn with the
NumPy formulas (and PyTorch's and JAX's CPU attention, ONNX Runtime and OpenVINO when installed)
on this machine, beside the machine's FMA peak and read bandwidth.

    python -m fastattn.bench --quick --out bench-report     # under a minute
    python -m fastattn.bench --help

The measuring method (:func:`measure`: warm-up, interleaved rounds, settle time, best of
rounds, spread) and the baselines (:func:`numpy_sdpa`, ...) are shared with the
pytest-benchmark suite and the scripts in the repository's ``bench/`` folder.
"""

from __future__ import annotations

from fastattn.bench._formulas import (
    attention_flops,
    causal_fraction,
    numpy_additive,
    numpy_masked_softmax,
    numpy_merge_states,
    numpy_sdpa,
    numpy_sdpa_grads,
    numpy_softmax,
)
from fastattn.bench._measure import Method, Timing, best_round, matmul_rate, measure

__all__ = [
    "Method",
    "Timing",
    "attention_flops",
    "best_round",
    "causal_fraction",
    "main",
    "matmul_rate",
    "measure",
    "numpy_additive",
    "numpy_masked_softmax",
    "numpy_merge_states",
    "numpy_sdpa",
    "numpy_sdpa_grads",
    "numpy_softmax",
]


def main(argv=None) -> int:
    """The command line (``python -m fastattn.bench``); returns the exit status."""
    from fastattn.bench._cli import main as cli_main

    return cli_main(argv)

"""Shared pieces of the benchmark suite: implementations, flop counts, the summary table.

Each benchmark group is one shape; every group holds fastattn, the NumPy formula a user
would write (float32), and PyTorch's CPU SDPA, ONNX Runtime and OpenVINO (float32) when they
are installed. A "matmul" group
measures the machine's float32 matrix-multiply rate in the same run, so kernels are
reported as a fraction of it. The summary printed at the end gives medians, GFLOP/s,
% of that matmul rate and same-run speed-ups.
"""

from __future__ import annotations

import pytest

import fastattn
from fastattn.bench import (  # noqa: F401 - the suite's baselines
    Method,
    _anchors,
    attention_flops,
    numpy_sdpa,
)
from fastattn.bench._measure import probe_time

_results: dict[str, dict[str, tuple[float, float]]] = {}  # group -> impl -> (median s, flops)


@pytest.fixture
def record(benchmark):
    """record(group, impl, flops, fn, *args): benchmark fn and keep its median for the summary."""

    def run(impl: str, flops: float, fn, *args, **kwargs):
        benchmark.extra_info["gflops_per_call"] = flops / 1e9
        result = benchmark(fn, *args, **kwargs)
        if benchmark.stats is not None:  # None under --benchmark-disable (a single call)
            median = benchmark.stats.stats.median
            _results.setdefault(benchmark.group, {})[impl] = (median, flops)
        return result

    return run


def engine_runner(name: str, q, k, v, causal: bool) -> _anchors.Runner:
    """ONNX Runtime's (``"ort"``) or OpenVINO's fastest op for these inputs, built as
    ``fastattn-bench`` builds it (outside the timing, fastattn's thread count); skips the
    benchmark when the engine is not installed or the inputs are not float32."""
    try:
        _anchors.load(name)
    except ImportError as exc:
        pytest.skip(f"{exc} (pip install {_anchors.PACKAGES[name]})")
    if q.dtype != "float32":
        pytest.skip(f"{_anchors.NAMES[name]} computes float64 inputs at float32 accuracy")
    runner, _ = _anchors.fastest(
        name, q, k, v, causal, fastattn.get_num_threads(), probe=lambda fn: probe_time(fn, Method())
    )
    return runner


def pytest_terminal_summary(terminalreporter):
    if not _results:
        return
    tr = terminalreporter
    tr.section("fastattn benchmark summary (medians, same run)")
    import io

    buf = io.StringIO()
    fastattn.show_config(file=buf)
    for line in buf.getvalue().splitlines():
        tr.write_line("  " + line)
    matmul = _results.get("matmul float32", {}).get("numpy")
    matmul_rate = matmul[1] / matmul[0] if matmul else None
    if matmul_rate:
        tr.write_line(
            f"  float32 matmul rate (numpy a @ b, same run): {matmul_rate / 1e9:.1f} GFLOP/s"
        )
    tr.write_line("")
    bases = ("numpy", "torch", *_anchors.ANCHORS)
    columns = ("median ms", "GFLOP/s", "% matmul", *(f"vs {b}" for b in bases))
    header = f"{'group':44s} {'impl':10s} " + " ".join(f"{c:>9s}" for c in columns)
    tr.write_line(header)
    tr.write_line("-" * len(header))
    for group in sorted(_results):
        if group == "matmul float32":
            continue
        impls = _results[group]
        for impl, (median, flops) in sorted(impls.items()):
            rate = flops / median
            frac = f"{rate / matmul_rate:9.0%}" if matmul_rate else f"{'-':>9s}"
            vs = []
            for base in bases:
                if base in impls and impl != base:
                    vs.append(f"{impls[base][0] / median:8.2f}x")
                else:
                    vs.append(f"{'-':>9s}")
            tr.write_line(
                f"{group:44s} {impl:10s} {median * 1e3:9.2f} {rate / 1e9:9.1f} {frac} "
                + " ".join(vs)
            )

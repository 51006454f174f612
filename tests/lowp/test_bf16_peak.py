"""The bfloat16 dot-product peak probe (``fastattn._core.bf16_dot_peak``: vdpbf16ps, BFDOT): a
positive GFLOP/s figure on the avx512bf16 and neon_bf16 ISAs only, a RuntimeError saying it is not
available on every other ISA the machine has (the ``isa`` fixture); show_config says which;
fastattn-bench's *% peak* of a compute-bound bfloat16 row divides by it where it was measured, by
the float32 FMA peak where bfloat16 is widened. Only positivity and finiteness of the measurement
are asserted (timings are not compared)."""

from __future__ import annotations

import math

import pytest

import fastattn
from fastattn import _core

from helpers.lowp_checks import BF16_DOT_ISAS


def test_probe_exists_only_where_the_dot_product_runs(isa):
    if isa in BF16_DOT_ISAS:
        gflops = _core.bf16_dot_peak(1, 0.02)
        # A real measurement: positive and finite, below 100 TFLOP/s for one thread.
        assert isinstance(gflops, float) and math.isfinite(gflops) and 0 < gflops < 1e5
        assert _core.bf16_dot_peak(num_threads=2, seconds=0.02) > 0
        assert fastattn._config.config()["bf16_dot_peak"].startswith("available")
    else:
        with pytest.raises(RuntimeError, match=f"not available on ISA '{isa}'.*avx512bf16"):
            _core.bf16_dot_peak(1, 0.02)
        line = fastattn._config.config()["bf16_dot_peak"]
        assert line.startswith(f"not available on ISA {isa}") and "float32 FMA peak" in line


@pytest.mark.parametrize(
    "kwargs, message",
    [({"num_threads": 0}, "num_threads must be >= 1"), ({"seconds": 0.0}, "seconds must be > 0")],
)
def test_probe_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _core.bf16_dot_peak(**kwargs)


def _bf16_doc(monkeypatch, dot_peak):
    """A smoke run over one tiny compute-bound case in float32 and bfloat16, with the
    probes replaced by fixed figures (``dot_peak`` None: the ISA has no vdpbf16ps)."""
    pytest.importorskip("ml_dtypes")
    from fastattn.bench import _cases, _run

    def bf16_dot_peak(num_threads=1, seconds=0.2):
        if dot_peak is None:
            raise RuntimeError("bf16_dot_peak is not available on ISA 'x'")
        return dot_peak

    monkeypatch.setattr(_core, "fma_peak", lambda d="float32", n=1, s=0.2: 400.0, raising=False)
    monkeypatch.setattr(_core, "read_bandwidth", lambda *a, **k: 50.0, raising=False)
    monkeypatch.setattr(_core, "bf16_dot_peak", bf16_dot_peak, raising=False)
    tiny = _cases.sdpa_case(
        "self-attention", 1, 8, 8, 16, 16, 64, dtypes=("float32", "bfloat16"), tags=("x",)
    )
    monkeypatch.setattr(_run, "grid", lambda preset: [tiny])
    settings = _run.Settings(
        preset="smoke", impls=("fastattn",), dtypes=("float32", "bfloat16"), threads=1
    )
    return _run.run(settings, progress=lambda *args, **kwargs: None)


@pytest.mark.parametrize("dot_peak", [1000.0, None])
def test_report_peak_column_uses_the_probe(monkeypatch, dot_peak):
    from fastattn.bench import _report

    doc = _bf16_doc(monkeypatch, dot_peak)
    assert doc["limits"]["bf16_dot_peak_gflops"] == dot_peak
    rows = {row["dtype"]: row for row in doc["rows"]}
    assert set(rows) == {"float32", "bfloat16"}
    for dtype, row in rows.items():
        r = row["results"]["fastattn"]
        rate = row["flops"] / r["best_s"] / 1e9
        peak = dot_peak if dtype == "bfloat16" and dot_peak else 400.0
        assert r["frac_peak"] == pytest.approx(rate / peak)
    doc["elapsed_s"] = 1.0
    md = _report.markdown(doc, [], None)
    if dot_peak:
        assert "bfloat16 dot peak, same run: **1000.0 GFLOP/s**" in md
        assert "bfloat16 rows' *% peak* divides by it" in md
    else:
        assert "bfloat16 rows' *% peak* is against the float32 FMA peak" in md

"""fastattn-bench says when a run was disturbed by other processes (issue #30) instead of
printing impossible ratios as results."""

from __future__ import annotations

from fastattn.bench import _report


def _doc(frac_peak=0.6, frac_bandwidth=None, spread=0.05):
    res = {"frac_peak": frac_peak, "frac_bandwidth": frac_bandwidth, "spread": spread}
    return {
        "limits": {},
        "rows": [{"case": "1x8 1024^2 E64", "dtype": "float32", "results": {"fastattn": res}}],
    }


def test_clean_run_has_no_warning():
    assert _report.contention_lines(_doc()) == []


def test_rate_above_the_measured_peak_is_flagged():
    lines = _report.contention_lines(_doc(frac_peak=1.37))
    assert len(lines) == 1 and "Disturbed run" in lines[0] and "137% peak" in lines[0]
    lines = _report.contention_lines(_doc(frac_peak=None, frac_bandwidth=2.1))
    assert len(lines) == 1 and "210% bw" in lines[0]


def test_rounds_that_disagree_are_flagged():
    lines = _report.contention_lines(_doc(spread=0.9))
    assert len(lines) == 1 and "disagree" in lines[0] and "+90%" in lines[0]


def test_peer_above_a_forced_narrower_isa_peak_is_not_a_disturbance():
    # FASTATTN_ISA=avx2 on an AVX-512 CPU: ONNX Runtime (no such switch) ran AVX-512 and
    # passed the avx2 peak on a quiet machine; the report called the run disturbed.
    doc = _doc()
    doc["rows"][0]["results"]["ort"] = {"frac_peak": 1.02, "spread": 0.01}
    doc["config"] = {"isa": "avx2", "isas_available": "scalar, baseline, avx2, avx512"}
    lines = _report.contention_lines(doc)
    assert len(lines) == 1 and "Peers above the avx2 peak" in lines[0] and "102%" in lines[0]
    # fastattn's own rate above the peak still marks the run, as does any rate at the
    # CPU's widest ISA.
    doc["rows"][0]["results"]["fastattn"]["frac_peak"] = 1.2
    assert any("Disturbed run" in line for line in _report.contention_lines(doc))
    doc["rows"][0]["results"]["fastattn"]["frac_peak"] = 0.6
    doc["config"]["isa"] = "avx512"
    lines = _report.contention_lines(doc)
    assert len(lines) == 1 and "Disturbed run" in lines[0]


def test_report_limits_carry_the_warning():
    assert any("Disturbed run" in line for line in _report.limits_lines(_doc(frac_peak=1.5)))


def test_memory_rows_are_rated_against_a_read_of_their_own_size(monkeypatch):
    # A decode row whose K/V fit in a cache was rated against the DRAM read bandwidth and
    # showed 174-303 % "bw" on a quiet machine; it is rated against the read rate of a
    # buffer of its own size instead (probed once per size, same threads).
    from fastattn import _core
    from fastattn.bench import _measure

    calls = []

    def probe(nbytes, threads, repeats):
        calls.append((nbytes, threads, repeats))
        return 1000.0 if nbytes < (1 << 20) else 20.0

    monkeypatch.setattr(_core, "read_bandwidth", probe)
    limits = _measure.machine_limits([], threads=2, read_nbytes=1 << 28, read_repeats=3)
    assert limits["read_bandwidth_gbs"] == 20.0
    assert _measure.read_rate_at(limits, 64 << 10) == 1000.0
    assert _measure.read_rate_at(limits, 64 << 10) == 1000.0  # probed once per size
    assert _measure.read_rate_at(limits, 4 << 20) == 20.0
    assert _measure.read_rate_at(limits, 1 << 30) == 20.0  # past the big probe: its figure
    assert [c[:2] for c in calls] == [(1 << 28, 2), (64 << 10, 2), (4 << 20, 2)]
    assert limits["read_rate_by_size_gbs"] == {str(64 << 10): 1000.0, str(4 << 20): 20.0}
    lines = "\n".join(_report.limits_lines({"limits": limits, "rows": []}))
    assert "64 KiB 1000" in lines and "4 MiB 20" in lines

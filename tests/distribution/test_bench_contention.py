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


def test_report_limits_carry_the_warning():
    assert any("Disturbed run" in line for line in _report.limits_lines(_doc(frac_peak=1.5)))

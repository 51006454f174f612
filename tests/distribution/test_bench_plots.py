"""The report's plots: what each panel shows (from synthetic reports, no timing)."""

from __future__ import annotations

import pytest

from fastattn.bench import _plots

pytest.importorskip("matplotlib")


def _row(case, dtype, speedup, series=None, seq_len=None, dims=(1, 8, 8, 64, 64, 64)):
    results = {"fastattn": {"best_s": 1e-3}}
    results.update({b: {"best_s": 1e-3 * s} for b, s in speedup.items()})
    return {
        "case": case,
        "dtype": dtype,
        "speedup": speedup,
        "series": series,
        "seq_len": seq_len,
        "dims": list(dims),
        "flops": 1e6,
        "results": results,
    }


def _doc(rows):
    return {"rows": rows, "machine": {"threads": 2, "cpu": "test CPU"}, "matmul": {"gflops": 100}}


def test_speedup_labels_keep_two_significant_digits_below_a_tenth():
    assert _plots.speedup_label(0.0018) == "0.0018x"  # was "0.00x"
    assert _plots.speedup_label(0.69) == "0.69x"
    assert _plots.speedup_label(1.01) == "1.01x"
    assert _plots.speedup_label(71.4) == "71x"


def test_speedup_labels_stay_right_of_the_case_names():
    """A slower case's label starts at the 1x line, not left of its bar's end, where it ran
    into the case names."""
    doc = _doc([_row("slow", "float32", {"numpy": 0.002}), _row("fast", "float32", {"numpy": 4})])
    fig = _plots.speedup_figure(doc)
    (ax,) = fig.axes
    labels = {t.get_text(): t for t in ax.texts}
    assert set(labels) == {"0.002x", "4.00x"}
    for text in labels.values():
        assert text.get_position()[0] >= 1.0 and text.get_horizontalalignment() == "left"
        assert ax.get_xlim()[0] <= 0.002


def test_a_dtype_with_few_cases_gets_a_panel_of_its_own_cases():
    rows = [_row(f"case {i}", "float32", {"numpy": 2.0, "torch": 1.5}) for i in range(6)]
    rows += [_row("case 0", "float64", {"numpy": 3.0}), _row("case 4", "float64", {"numpy": 3.0})]
    fig = _plots.speedup_figure(_doc(rows))
    f32, f64 = fig.axes
    assert [t.get_text() for t in f64.get_yticklabels()] == ["case 4", "case 0"]
    assert len(f32.get_yticklabels()) == 6
    # stacked, the float64 panel a third as tall as the float32 one (2 cases of 6)
    h32, h64 = (ax.get_position().height for ax in (f32, f64))
    assert h64 < 0.6 * h32
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["vs numpy", "vs torch"]


def test_same_cases_in_every_dtype_share_one_row_of_names():
    rows = [_row(f"case {i}", d, {"numpy": 2.0}) for d in ("float32", "float64") for i in range(3)]
    fig = _plots.speedup_figure(_doc(rows))
    f32, f64 = fig.axes
    assert f32.get_position().y0 == pytest.approx(f64.get_position().y0)  # side by side


def test_time_vs_length_has_one_legend_for_every_panel():
    """The legend lists every line of every panel once, below the panels (it was drawn in
    the first panel only, leaving out lines only a later panel had)."""
    rows = [
        _row(
            f"a {n}", "float32", {"numpy": 2.0}, series="self", seq_len=n, dims=(1, 8, 8, n, n, 64)
        )
        for n in (256, 512)
    ]
    rows += [
        _row(
            f"d {n}",
            "float32",
            {"torch": 2.0},
            series="decode",
            seq_len=n,
            dims=(1, 8, 2, 1, n, 64),
        )
        for n in (16, 128)
    ]
    fig = _plots.time_vs_length_figure(_doc(rows))
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert len(fig.legends) == 1
    names = {t.get_text() for t in fig.legends[0].get_texts()}
    assert names == {
        "fastattn float32",
        "numpy float32",
        "torch float32",
        "at the float32 matmul rate",
    }
    assert fig.axes[1].get_title().endswith("H=8/2, E=64, Lq = 1")
    assert fig.axes[1].get_xlabel() == "keys (Lk)"


def test_a_run_where_fastattn_is_slower_everywhere_still_lays_out(tmp_path, recwarn):
    """The 1x line and the labels right of it stay inside the axes (a loaded machine's smoke
    run, every speed-up near 0.001x, had them outside: matplotlib's layout collapsed)."""
    doc = _doc([_row(f"case {i}", "float32", {"numpy": 0.001}) for i in range(4)])
    assert _plots.speedups(doc, tmp_path / "s.png")
    (ax,) = _plots.speedup_figure(doc).axes
    assert ax.get_xlim()[1] > 1.04
    assert not [w for w in recwarn if "constrained_layout" in str(w.message)]

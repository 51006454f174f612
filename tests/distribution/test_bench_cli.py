"""``python -m fastattn.bench``: the measuring method, the command line, report.md, report.json
and the plots, on the hidden ``--smoke`` grid (tiny shapes: a few seconds a run)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fastattn
from fastattn import bench
from fastattn.bench import _cases
from fastattn.bench._cli import main

from helpers import REPO

PNG = b"\x89PNG\r\n\x1a\n"


def run_cli(cwd, *args, block_matplotlib=False):
    """The command line in a fresh interpreter (as a user runs it)."""
    if block_matplotlib:  # as if matplotlib were not installed
        cmd = [
            sys.executable,
            "-c",
            "import sys; sys.modules['matplotlib'] = None; "
            "from fastattn.bench._cli import main; raise SystemExit(main(sys.argv[1:]))",
        ]
    else:
        cmd = [sys.executable, "-m", "fastattn.bench"]
    return subprocess.run(
        [*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_smoke_run_writes_report_and_json(tmp_path):
    proc = run_cli(
        tmp_path, "--smoke", "--impls", "fastattn,numpy", "--out", "out", "--json", "--no-plots"
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    doc = json.loads(proc.stdout)
    assert doc == json.loads((out / "report.json").read_text())
    expected_rows = [(c.name, d) for c in _cases.grid("smoke") for d in c.dtypes]
    assert [(r["case"], r["dtype"]) for r in doc["rows"]] == expected_rows
    assert doc["implementations"] == ["fastattn", "numpy"]
    assert doc["matmul"]["gflops"] > 0 and doc["config"]["isa"] == fastattn._core.active_isa()
    for row in doc["rows"]:
        assert set(row["results"]) == {"fastattn", "numpy"}
        for r in row["results"].values():
            assert 0 < r["best_s"] <= r["median_s"] and r["rounds"] >= 1
            assert r["gflops"] > 0 and r["frac_matmul"] > 0
            assert r["max_abs_err"] < (1e-5 if row["dtype"] == "float32" else 1e-12)
        fast, base = row["results"]["fastattn"]["best_s"], row["results"]["numpy"]["best_s"]
        assert row["speedup"]["numpy"] == pytest.approx(base / fast)
    # progress while it runs, then where the report is
    assert "[1/" in proc.stderr and f"[{len(expected_rows)}/{len(expected_rows)}]" in proc.stderr
    assert "Report written to out/report.md" in proc.stderr

    md = (out / "report.md").read_text()
    for text in (
        "# fastattn benchmark report",
        "## float32",
        "## float64",
        "## Method",
        "GFLOP/s",
        "% matmul",
        "vs numpy",
        "max abs error (fastattn / numpy)",
        "## Configuration (`fastattn.show_config()`)",
        f"isa: {doc['config']['isa']}",
        "float32 matmul rate, same run",
        "## Every measurement",
    ):
        assert text in md, text
    for name, _ in expected_rows:
        assert f"| {name} |" in md
    assert "No plots: --no-plots was given." in md and not list(out.glob("*.png"))


def test_plots(tmp_path):
    proc = run_cli(
        tmp_path,
        "--smoke",
        "--impls",
        "fastattn,numpy",
        "--shapes",
        "self",
        "--dtype",
        "float32",
        "--out",
        "out",
    )
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    if not have_matplotlib():
        assert "No plots: matplotlib is not installed" in md
        return
    image = pytest.importorskip("matplotlib.image")
    for png in ("time_vs_seqlen.png", "speedup.png"):
        path = tmp_path / "out" / png
        assert path.read_bytes()[:8] == PNG
        assert f"]({png})" in md and str(Path("out", png)) in proc.stdout
        pixels = image.imread(path)
        assert pixels.shape[0] >= 250 and pixels.shape[1] >= 500 and pixels.std() > 0.05
    assert "Warning" not in proc.stderr, proc.stderr


def test_without_matplotlib_the_report_says_so(tmp_path):
    proc = run_cli(
        tmp_path,
        "--smoke",
        "--impls",
        "fastattn,numpy",
        "--shapes",
        "decode",
        "--out",
        "out",
        block_matplotlib=True,
    )
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert "No plots: matplotlib is not installed" in md
    assert not list((tmp_path / "out").glob("*.png"))
    assert "GQA decode 1x4/2 1x64 E16" in md and "## float64" not in md
    assert "| GQA decode 1x4/2 1x64 E16 |" in proc.stdout  # the summary table on stdout
    assert "Report written to out/report.md (No plots" in proc.stdout


def test_list_filters_and_bad_arguments(capsys):
    assert main(["--list", "--quick", "--shapes", "gqa", "--dtype", "float32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("GQA ") and "float64" not in line for line in lines)
    assert main(["--list", "--full"]) == 0
    full = capsys.readouterr().out
    for kind in (
        "encoder",
        "self-attention",
        "causal",
        "cross-attention",
        "GQA prefill",
        "GQA decode",
        "short sequences",
        "additive",
        "masked_softmax",
        "8192x8192",
    ):
        assert kind in full, kind
    assert main(["--smoke", "--shapes", "no-such-shape"]) == 2
    assert "no case of the 'smoke' preset matches" in capsys.readouterr().err
    for bad in (
        ["--dtype", "float16"],
        ["--threads", "0"],
        ["--impls", "cupy"],
        ["--quick", "--full"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(bad)
        assert exc.value.code == 2


def test_measure_interleaves_rotates_and_keeps_best_and_spread():
    calls = []

    def candidate(name, seconds=0.0):
        def fn():
            calls.append(name)
            if seconds:
                time.sleep(seconds)

        return fn

    method = bench.Method(rounds=3, round_time=0.003, settle=0.0, budget=1.0, max_calls=2)
    t = bench.measure({"a": candidate("a"), "b": candidate("b")}, method=method)
    assert set(t) == {"a", "b"} and all(len(x.times) == 3 for x in t.values())
    assert all(x.calls == 2 for x in t.values())
    # the rounds: 2 timed calls after one untimed call each, in rotating order
    timed = calls[-18:]
    assert [timed[i] for i in (0, 3, 6, 9, 12, 15)] == ["a", "b", "b", "a", "a", "b"]
    for x in t.values():
        assert x.best == min(x.times) and x.spread >= 0 and x.median >= x.best
        assert x.as_dict()["rounds"] == 3

    # a candidate slower than its share of the budget gets the minimum number of rounds
    slow = bench.Method(rounds=5, round_time=0.001, settle=0.0, budget=0.03, min_rounds=2)
    t = bench.measure({"slow": candidate("slow", 0.02), "fast": candidate("fast")}, method=slow)
    assert len(t["slow"].times) == 2 and len(t["fast"].times) == 5
    assert t["slow"].best >= 0.02


def test_baselines_and_flops():
    import numpy as np

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((1, 4, 5, 8), (1, 2, 7, 8), (1, 2, 7, 3)))
    for causal in (False, True):
        np.testing.assert_allclose(
            bench.numpy_sdpa(q, k, v, causal),
            fastattn.reference.scaled_dot_product_attention(q, k, v, is_causal=causal),
            rtol=1e-12,
            atol=1e-12,
        )
    flops = bench.attention_flops((2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16))
    assert flops == 4 * 2 * 4 * 8 * 8 * 16
    assert bench.causal_fraction(4, 4) == pytest.approx(10 / 16)


def test_console_script_runs_in_the_source_checkout():
    """README's first command runs `fastattn-bench` in the checkout, where `python -m` would
    import the uncompiled fastattn/ folder."""
    script = Path(sys.executable).parent / (
        "fastattn-bench.exe" if sys.platform == "win32" else "fastattn-bench"
    )
    if not script.exists():
        pytest.skip("the fastattn-bench console script is not installed next to this Python")
    checkout = REPO
    proc = subprocess.run(
        [str(script), "--list", "--quick", "--shapes", "encoder"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("encoder 1x12 512x512 E64")

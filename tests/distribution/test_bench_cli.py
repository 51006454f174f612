"""``python -m fastattn.bench``: the measuring method, the command line, report.md, report.json
and the plots, on the hidden ``--smoke`` grid (tiny shapes: a few seconds a run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
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
        # backward rows also time fastattn's forward and backward alone (always measured)
        parts = (
            {"fastattn-forward", "fastattn-backward"} if row["kind"] == "sdpa_backward" else set()
        )
        assert set(row["results"]) == {"fastattn", "numpy", *parts}
        for name, r in row["results"].items():
            assert 0 < r["best_s"] <= r["median_s"] and r["rounds"] >= 1
            assert r["gflops"] > 0 and r["frac_matmul"] > 0
            if name == "fastattn-forward":  # half of the step: no gradients to check
                assert r["max_abs_err"] is None
            else:
                assert r["max_abs_err"] < (1e-5 if row["dtype"] == "float32" else 1e-12)
        fast, base = row["results"]["fastattn"]["best_s"], row["results"]["numpy"]["best_s"]
        assert row["speedup"]["numpy"] == pytest.approx(base / fast)
        assert set(row["speedup"]) == {"numpy"}
        if parts:
            fwd, bwd = (row["results"][p] for p in ("fastattn-forward", "fastattn-backward"))
            assert row["backward"]["ratio"] == pytest.approx(bwd["best_s"] / fwd["best_s"])
            # the backward's rate counts 2.5x the forward's flops
            assert bwd["gflops"] / fwd["gflops"] == pytest.approx(2.5 / row["backward"]["ratio"])
    # progress while it runs, then where the report is
    n = len(expected_rows)
    assert re.search(rf"\[ *1/{n}\]", proc.stderr) and f"[{n}/{n}]" in proc.stderr
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
        "## backward (float32)",
        "bwd / fwd",
        "max grad error (fastattn / numpy)",
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
    assert lines and all(
        line.startswith(("GQA ", "backward GQA ")) and "float64" not in line for line in lines
    )
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
        ["--dtype", "float8"],
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
        # forward + backward as a NumPy user writes it: the float64 twin's gradients
        g = rng.standard_normal((1, 4, 5, 3))
        out, lse = fastattn.reference.scaled_dot_product_attention(
            q, k, v, is_causal=causal, return_lse=True
        )
        want = fastattn.reference.scaled_dot_product_attention_backward(
            g, q, k, v, out, lse, is_causal=causal
        )
        for got, exp in zip(bench.numpy_sdpa_grads(q, k, v, g, causal), want, strict=True):
            np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)
    flops = bench.attention_flops((2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16))
    assert flops == 4 * 2 * 4 * 8 * 8 * 16
    assert bench.causal_fraction(4, 4) == pytest.approx(10 / 16)
    # a backward row counts the forward once and the backward as 2.5 forwards; its parts
    # count their own share
    case = _cases.backward_case("x", 2, 4, 2, 8, 8, 16)
    assert case.flops() == 3.5 * flops
    assert case.candidate_flops("fastattn-forward") == flops
    assert case.candidate_flops("fastattn-backward") == 2.5 * flops
    assert case.candidate_flops("torch") == 3.5 * flops


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


def test_default_grid_holds_the_speed_targets_shapes():
    cases = {(c.dims, c.causal) for c in _cases.grid("default")}
    for dims in (
        (4, 12, 12, 512, 512, 64),
        (1, 8, 8, 2048, 2048, 64),
        (1, 32, 8, 1024, 1024, 128),
        (32, 8, 8, 128, 128, 64),
    ):
        assert (dims, False) in cases and (dims, True) in cases, dims
    assert ((1, 32, 8, 1, 16384, 128), False) in cases
    names = [c.name for c in _cases.grid("default")]
    assert len(names) == len(set(names))
    bounds = {c.name: c.bound for c in _cases.grid("smoke")}
    assert bounds == {
        "self-attention 1x8 16x16 E64": "compute",
        "self-attention 1x8 32x32 E64": "compute",
        "causal 1x8 16x16 E64": "compute",
        "causal 1x8 32x32 E64": "compute",
        "GQA decode 1x4/2 1x64 E16": "memory",
        "additive 2x 8x16 D8 H16": None,
        "masked_softmax 4x8x16 valid_lens": "memory",
        "key padding bool mask 2x2 70x70 E16": "compute",
        "block-sparse 10 % tiles BlockMask 1x2 130x130 E16": "compute",
        "backward self-attention 1x2 32x32 E16": "compute",
        "backward GQA causal 1x4/2 40x40 E16": "compute",
    }
    # the backward rows: every shape of the backward targets, non-causal and causal
    backward = {(c.dims, c.causal) for c in _cases.grid("default") if c.kind == "sdpa_backward"}
    for dims in (
        (4, 12, 12, 512, 512, 64),
        (1, 8, 8, 1024, 1024, 64),
        (1, 8, 8, 2048, 2048, 64),
        (1, 8, 8, 1024, 1024, 128),
        (1, 32, 8, 1024, 1024, 128),
        (32, 8, 8, 128, 128, 64),
    ):
        assert (dims, False) in backward and (dims, True) in backward, dims


def _smoke_doc(**settings):
    from fastattn.bench._run import Settings, run

    return run(
        Settings(preset="smoke", impls=("fastattn", "numpy"), **settings),
        progress=lambda *args, **kwargs: None,
    )


def test_machine_limits_in_the_report(monkeypatch, tmp_path):
    """The report against the probes' interface: fma_peak(dtype, num_threads, seconds) in
    GFLOP/s and read_bandwidth(nbytes, num_threads, repeats) in GB/s."""
    from fastattn.bench import _report

    calls = []

    def fma_peak(dtype="float32", num_threads=1, seconds=0.2):
        calls.append(("fma", dtype, num_threads, seconds))
        return {"float32": 400.0, "float64": 200.0}[dtype]

    def read_bandwidth(nbytes=1 << 30, num_threads=1, repeats=3):
        calls.append(("read", nbytes, num_threads, repeats))
        return 50.0

    monkeypatch.setattr(fastattn._core, "fma_peak", fma_peak, raising=False)
    monkeypatch.setattr(fastattn._core, "read_bandwidth", read_bandwidth, raising=False)
    doc = _smoke_doc(threads=1)
    # The FMA peak is the best of three probes per dtype.
    # The read bandwidth: one probe of the big buffer, then one per memory-bound row size
    # below it (what that row's % bw divides by).
    sizes = sorted({r["bytes"] for r in doc["rows"] if r["bound"] == "memory"})
    assert sorted(calls) == sorted(
        [
            *[("fma", "float32", 1, 0.01)] * 3,
            *[("fma", "float64", 1, 0.01)] * 3,
            ("read", 1 << 24, 1, 1),
            *[("read", n, 1, min(20000, max(5, (1 << 30) // n))) for n in sizes if n < 1 << 24],
        ]
    )
    lim = doc["limits"]
    assert lim["fma_peak_gflops"] == {"float32": 400.0, "float64": 200.0}
    assert lim["read_bandwidth_gbs"] == 50.0 and lim["isa"] == fastattn._core.active_isa()
    for row in doc["rows"]:
        for r in row["results"].values():
            rate, moved = row["flops"] / r["best_s"] / 1e9, row["bytes"] / r["best_s"] / 1e9
            assert r["gbytes_per_s"] == pytest.approx(moved)
            if row["bound"] == "compute":
                peak = lim["fma_peak_gflops"][row["dtype"]]
                assert r["frac_peak"] == pytest.approx(rate / peak)
            else:
                assert r["frac_peak"] is None
            if row["bound"] == "memory":
                assert r["frac_bandwidth"] == pytest.approx(moved / 50.0)
            else:
                assert r["frac_bandwidth"] is None
    decode = next(r for r in doc["rows"] if r["case"].startswith("GQA decode"))
    assert decode["bytes"] == 4 * (2 * 4 * 1 * 16 + 2 * 2 * 64 * 16)
    doc["elapsed_s"] = 1.0
    md = _report.markdown(doc, [], None)
    assert (
        f"FMA peak, same run: float32 **400.0 GFLOP/s**, float64 **200.0 GFLOP/s** "
        f"(`fastattn._core.fma_peak`: the {lim['isa']} FMA-throughput kernel, 1 thread, "
        "the best of 3 probes of 0.01 s per dtype)"
    ) in md
    assert (
        "Read bandwidth, same run: **50.0 GB/s** (`fastattn._core.read_bandwidth`: "
        "1 thread reading a 16 MiB buffer, best of 1)"
    ) in md
    assert f"| % {lim['isa']} peak | % matmul | GB/s (% bw) |" in md and "not measured" not in md
    fast = decode["results"]["fastattn"]
    assert (
        f"| {fast['gbytes_per_s']:.1f} ({fast['frac_bandwidth']:.0%}) |"
        in _report.summary_table(doc, "float32")
    )


def test_without_probes_the_report_says_so(monkeypatch):
    from fastattn.bench import _report

    monkeypatch.delattr(fastattn._core, "fma_peak", raising=False)
    monkeypatch.delattr(fastattn._core, "read_bandwidth", raising=False)
    doc = _smoke_doc(dtypes=("float32",), shapes=["decode", "causal 1x8 16x16"])
    assert doc["limits"]["fma_peak_gflops"] is None
    assert doc["limits"]["read_bandwidth_gbs"] is None
    assert all(
        r["frac_peak"] is None and r["frac_bandwidth"] is None
        for row in doc["rows"]
        for r in row["results"].values()
    )
    doc["elapsed_s"] = 1.0
    md = _report.markdown(doc, [], None)
    assert "- Machine limits: not measured (this build has no probes" in md
    table = _report.summary_table(doc, "float32")
    causal = next(line for line in table.splitlines() if line.startswith("| causal"))
    assert causal.split(" | ")[3] == "-"  # % peak: absent, not a number


def test_without_the_engines_the_report_says_so(tmp_path):
    cmd = [
        sys.executable,
        "-c",
        "import sys; sys.modules['onnxruntime'] = None; "
        "sys.modules['openvino'] = None; "
        "from fastattn.bench._cli import main; raise SystemExit(main(sys.argv[1:]))",
        "--smoke",
        "--impls",
        "fastattn,ort,openvino",
        "--shapes",
        "decode",
        "--out",
        "out",
        "--no-plots",
        "--json",
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["implementations"] == ["fastattn"]
    assert (
        "ONNX Runtime is not installed (pip install onnxruntime onnx): no ort column."
        in doc["notes"]
    )
    assert "OpenVINO is not installed (pip install openvino): no openvino column." in doc["notes"]


@pytest.mark.parametrize("engine", ["ort", "openvino"])
def test_engine_variants_match_the_reference(engine):
    """Every op an engine may be timed with computes the row's attention (the benchmark keeps
    the fastest, so each must be right)."""
    from fastattn.bench import _anchors

    pytest.importorskip({"ort": "onnxruntime", "openvino": "openvino"}[engine])
    if engine == "ort":
        pytest.importorskip("onnx")
    import numpy as np

    rng = np.random.default_rng(1)
    seen = set()
    for hq, hkv, lq, lk, causal in (
        (4, 4, 8, 8, False),
        (4, 4, 8, 8, True),
        (4, 2, 8, 8, False),
        (4, 2, 8, 8, True),
        (4, 2, 1, 40, False),
        (2, 2, 1, 40, False),
        (4, 4, 5, 9, False),
    ):
        q = rng.standard_normal((2, hq, lq, 16)).astype(np.float32)
        k, v = (rng.standard_normal((2, hkv, lk, 16)).astype(np.float32) for _ in range(2))
        expected = fastattn.reference.scaled_dot_product_attention(
            *(a.astype(np.float64) for a in (q, k, v)), is_causal=causal
        )
        for runner in _anchors.runners(engine, q, k, v, causal, 1):
            seen.add(runner.op)
            for _ in range(2):  # a second call too: a decode step reuses its cache
                got = runner.to_numpy(runner.call())
                assert got.shape == expected.shape, runner.op
                np.testing.assert_allclose(got, expected, atol=2e-6, err_msg=runner.op)
    assert seen == (
        {"ONNX Attention", "com.microsoft MultiHeadAttention", "com.microsoft GroupQueryAttention"}
        if engine == "ort"
        else {
            "opset13 SDPA",
            "opset13 SDPA, K/V broadcast over the group",
            "opset13 SDPA, group rows stacked",
        }
    )


@pytest.mark.parametrize("engine", ["ort", "openvino"])
def test_engines_in_the_benchmark(tmp_path, engine):
    pytest.importorskip({"ort": "onnxruntime", "openvino": "openvino"}[engine])
    if engine == "ort":
        pytest.importorskip("onnx")
    proc = run_cli(
        tmp_path,
        "--smoke",
        "--impls",
        f"numpy,{engine}",
        "--shapes",
        "self-attention,decode",
        "--out",
        "out",
        "--json",
        "--no-plots",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["implementations"] == ["fastattn", "numpy", engine] and engine in doc["versions"]
    for row in doc["rows"]:
        # the engines compute float64 at float32 accuracy, and have no backward: those rows
        # time fastattn (and NumPy) only
        if row["dtype"] == "float64" or row["kind"] == "sdpa_backward":
            assert engine not in row["results"]
            continue
        r = row["results"][engine]
        assert r["max_abs_err"] < 1e-5 and r["best_s"] > 0 and r["op"]
        assert row["speedup"][engine] == pytest.approx(
            r["best_s"] / row["results"]["fastattn"]["best_s"]
        )
    md = (tmp_path / "out" / "report.md").read_text()
    assert f"| {engine} ms | vs {engine} |" in md and f"| {engine} (" in md


def test_onnxruntime_without_onnx_says_what_to_install(monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if onnx were not installed
    libs = _cases.Libraries(1, ("fastattn", "ort"))
    assert libs.available() == ["fastattn"]
    assert libs.notes == [
        "ONNX Runtime is installed but the onnx package that builds its "
        "models is not (pip install onnx): no ort column."
    ]


def test_mask_rows_count_the_tiles_they_keep():
    """The masked rows' flops are the attention's times the fraction of 64 x 64 tiles their
    mask keeps anything in (counted here tile by tile), the same for a key-padding mask and
    its valid_lens twin; the block-sparse mask keeps every row's own tile."""
    rng = np.random.default_rng(5)
    for n in (70, 130, 200):
        mask = rng.random((2, 1, n, n)) < 0.002
        want = np.mean(
            [
                mask[b, 0, i : i + 64, j : j + 64].any()
                for b in range(2)
                for i in range(0, n, 64)
                for j in range(0, n, 64)
            ]
        )
        assert _cases.occupied_tiles(mask, n) == pytest.approx(want)
    sparse = _cases.masked_case("block-sparse", "block-mask", 1, 2, 300, 16)
    m = _cases.attention_mask(sparse)[0]
    assert m.shape == (300, 300) and m.diagonal().all() and m.mean() < 0.5
    frac = _cases.occupied_tiles(m, 300)
    assert sparse.flops() == pytest.approx(4.0 * 2 * 300 * 300 * 16 * frac)
    pad, lens = (_cases.masked_case("p", k, 4, 2, 77, 16) for k in ("key-padding", "valid-lens"))
    np.testing.assert_array_equal(_cases.attention_mask(pad)[0], _cases.attention_mask(lens)[0])
    assert pad.flops() == lens.flops() < 4.0 * 4 * 2 * 77 * 77 * 16

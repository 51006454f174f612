"""The benchmark report: report.md (tables, configuration, method) and report.json."""

from __future__ import annotations

import json
from pathlib import Path

from fastattn.bench._anchors import ORT_OPSET
from fastattn.bench._cases import ALL_DTYPES, IMPLS
from fastattn.bench._run import PARTS, format_ms

BASELINES = ("numpy", "torch", "jax", "ort", "openvino", "fastattn-loop", "fastattn-padded")


def _err(x: float | None) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.0e}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _bandwidth(row: dict, r: dict) -> str:
    """GB/s moved and the share of the read bandwidth, on memory-bound rows only."""
    if row.get("bound") != "memory":
        return "-"
    frac = r.get("frac_bandwidth")
    return f"{r['gbytes_per_s']:.1f}" + (f" ({frac:.0%})" if frac is not None else "")


def _impls(doc: dict) -> list[str]:
    seen = {name for row in doc["rows"] for name in row["results"]}
    return [name for name in IMPLS if name in seen and name not in PARTS]


def summary_table(doc: dict, dtype: str) -> str:
    """One line per case: fastattn's time, rate, share of the FMA peak (compute-bound rows)
    and of the matmul rate, bytes per second and share of the read bandwidth (memory-bound
    rows), each baseline's time and fastattn's speed-up over it, and every implementation's
    max error."""
    rows = [r for r in doc["rows"] if r["dtype"] == dtype and r.get("kind") != "sdpa_backward"]
    if not rows:
        return ""
    impls = _impls(doc)
    bases = [b for b in BASELINES if b in impls]
    # % peak is against the FMA peak of the ISA that ran the rows (the active one): say which.
    isa = (doc.get("limits") or {}).get("isa")
    peak = f"% {isa} peak" if isa else "% peak"
    header = ["case", "fastattn ms", "GFLOP/s", peak, "% matmul", "GB/s (% bw)"]
    for b in bases:
        header += [f"{b} ms", f"vs {b}"]
    header.append("max abs error (" + " / ".join(impls) + ")")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        res = row["results"]
        fast = res["fastattn"]
        cells = [
            row["case"],
            f"{format_ms(fast['best_s'])} (+{fast['spread']:.0%})",
            f"{fast['gflops']:.1f}",
            _pct(fast.get("frac_peak")),
            f"{fast['frac_matmul']:.0%}",
            _bandwidth(row, fast),
        ]
        for b in bases:
            if b in res:
                cells += [format_ms(res[b]["best_s"]), f"**{row['speedup'][b]:.2f}x**"]
            else:
                cells += ["-", "-"]
        cells.append(" / ".join(_err(res[i]["max_abs_err"]) if i in res else "-" for i in impls))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def backward_table(doc: dict) -> str:
    """The backward rows (a training step's attention): fastattn's forward + backward, each
    baseline's forward + backward and the speed-up over it, fastattn's forward and backward
    timed alone, their ratio, the backward's rate (2.5x the forward's flops) and its share of
    the FMA peak, and the largest gradient error. Empty without backward rows."""
    rows = [r for r in doc["rows"] if r.get("kind") == "sdpa_backward"]
    if not rows:
        return ""
    bases = [b for b in BASELINES if any(b in r["results"] for r in rows)]
    isa = (doc.get("limits") or {}).get("isa")
    header = ["case", "fastattn fwd+bwd ms"]
    for b in bases:
        header += [f"{b} fwd+bwd ms", f"vs {b}"]
    header += [
        "forward ms",
        "backward ms",
        "bwd / fwd",
        "backward GFLOP/s",
        f"backward % {isa} peak" if isa else "backward % peak",
        "max grad error (" + " / ".join(["fastattn", *bases]) + ")",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        res = row["results"]
        fast = res["fastattn"]
        cells = [row["case"], f"{format_ms(fast['best_s'])} (+{fast['spread']:.0%})"]
        for b in bases:
            if b in res:
                cells += [format_ms(res[b]["best_s"]), f"**{row['speedup'][b]:.2f}x**"]
            else:
                cells += ["-", "-"]
        parts = [res.get(p) for p in ("fastattn-forward", "fastattn-backward")]
        cells += [format_ms(p["best_s"]) if p else "-" for p in parts]
        summary = row.get("backward")
        if summary:
            cells += [
                f"{summary['ratio']:.2f}",
                f"{summary['backward_gflops']:.1f}",
                _pct(summary["backward_frac_peak"]),
            ]
        else:
            cells += ["-", "-", "-"]
        errs = [_err(res[i]["max_abs_err"]) if i in res else "-" for i in ["fastattn", *bases]]
        cells.append(" / ".join(errs))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(doc: dict) -> str:
    """Every implementation of every row: best and median time, spread, rounds x calls, the
    rates, and the op an engine ran (its fastest for the row)."""
    header = [
        "case",
        "dtype",
        "impl",
        "best ms",
        "median ms",
        "spread",
        "rounds x calls",
        "GFLOP/s",
        "% peak",
        "% matmul",
        "GB/s (% bw)",
        "max abs error",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in doc["rows"]:
        for name, r in row["results"].items():
            impl = f"{name} ({r['op']})" if "op" in r else name
            lines.append(
                "| "
                + " | ".join(
                    [
                        row["case"],
                        row["dtype"],
                        impl,
                        format_ms(r["best_s"]),
                        format_ms(r["median_s"]),
                        f"+{r['spread']:.1%}",
                        f"{r['rounds']} x {r['calls_per_round']}",
                        f"{r['gflops']:.1f}",
                        _pct(r.get("frac_peak")),
                        f"{r['frac_matmul']:.0%}",
                        _bandwidth(row, r),
                        _err(r["max_abs_err"]),
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def machine_line(doc: dict) -> str:
    m, cfg = doc["machine"], doc["config"]
    return (
        f"{m['cpu']}, {m['cpus']} CPUs available, {m['threads']} threads used; "
        f"{m['platform']}; fastattn ISA {cfg['isa']}"
    )


def versions_line(doc: dict) -> str:
    v = doc["versions"]
    parts = [f"fastattn {v['fastattn']}", f"NumPy {v['numpy']}"]
    parts += [f"PyTorch {v['torch']}"] if "torch" in v else []
    parts += [f"JAX {v['jax']}"] if "jax" in v else []
    parts += [f"ONNX Runtime {v['ort']}"] if "ort" in v else []
    parts += [f"OpenVINO {v['openvino']}"] if "openvino" in v else []
    return ", ".join(parts)


# Rounds of one row whose spread (worst over best) passes this disagree beyond noise.
DISTURBED_SPREAD = 0.5


def _narrower_isa(doc: dict) -> bool:
    """Whether the run's ISA (forced with FASTATTN_ISA) is not the CPU's widest: the peak
    is then that ISA's, and a peer running the CPU's wider instructions can pass it."""
    cfg = doc.get("config") or {}
    available = [s.strip() for s in str(cfg.get("isas_available", "")).split(",") if s.strip()]
    return bool(available) and cfg.get("isa") in available and cfg["isa"] != available[-1]


def contention_lines(doc: dict) -> list[str]:
    """A warning when the run was disturbed by other processes: a rate above 100 % of the
    FMA peak or the read bandwidth measured in the same run (impossible on a quiet machine:
    the probe lost its cores), or rounds of a row disagreeing by more than DISTURBED_SPREAD.
    A peer's rate above the peak of an ISA narrower than the CPU's widest is no such
    sign (the peer runs the wider instructions): it gets a note of its own. Empty for a
    clean run."""
    over, spread, wider = [], [], []
    narrower = _narrower_isa(doc)
    for row in doc.get("rows", []):
        for name, r in row.get("results", {}).items():
            label = f"{row['case']} ({row.get('dtype', '?')}, {name})"
            for key in ("frac_peak", "frac_bandwidth"):
                frac = r.get(key)
                if frac is not None and frac > 1.0:
                    what = f"{label} {frac:.0%} {'peak' if key == 'frac_peak' else 'bw'}"
                    peer = not name.startswith("fastattn")
                    (wider if narrower and peer and key == "frac_peak" else over).append(what)
            if (r.get("spread") or 0) > DISTURBED_SPREAD:
                spread.append(f"{label} +{r['spread']:.0%}")
    out = []
    if over:
        out.append(
            f"- **Disturbed run**: {len(over)} rate(s) above 100 % of this run's measured "
            f"peak, which a quiet machine cannot give (other processes held the cores during "
            f"the probe): {'; '.join(over[:5])}{' ...' if len(over) > 5 else ''}. Their "
            "*% peak* / *% bw* are not results; rerun on a quiet machine."
        )
    if spread:
        out.append(
            f"- **Disturbed run**: {len(spread)} row(s) whose rounds disagree by more than "
            f"{DISTURBED_SPREAD:.0%} (worst over best): {'; '.join(spread[:5])}"
            f"{' ...' if len(spread) > 5 else ''}. Times are each row's best round; the "
            "ratios between them are less certain."
        )
    if wider:
        isa = doc["config"]["isa"]
        out.append(
            f"- **Peers above the {isa} peak**: {'; '.join(wider[:5])}"
            f"{' ...' if len(wider) > 5 else ''}. fastattn was held to {isa} "
            "(FASTATTN_ISA); these engines run the CPU's wider instructions, so their "
            f"*% peak* compares them with {isa}'s peak, not their own."
        )
    return out


def limits_lines(doc: dict) -> list[str]:
    """What the machine's limits are and how they were measured (or that they were not)."""
    lim = doc.get("limits") or {}
    peak, bw = lim.get("fma_peak_gflops"), lim.get("read_bandwidth_gbs")
    if peak is None and bw is None:
        return [
            "- Machine limits: not measured (this build has no probes: `fastattn._core` "
            "has no `fma_peak` / `read_bandwidth`), so *% peak* and *% bw* are empty."
        ] + contention_lines(doc)
    out = []
    if peak is None:
        out.append(
            "- FMA peak: not measured (this build has no `fastattn._core.fma_peak`), "
            "so *% peak* is empty."
        )
    else:
        rates = ", ".join(f"{d} **{g:.1f} GFLOP/s**" for d, g in peak.items())
        out.append(
            f"- FMA peak, same run: {rates} (`fastattn._core.fma_peak`: the "
            f"{lim['isa']} FMA-throughput kernel, {_threads(lim)}, "
            f"the best of {lim.get('fma_rounds', 1)} probes of {lim['fma_seconds']:g} s per "
            "dtype)."
        )
    out.extend(_bf16_peak_lines(doc, lim))
    if bw is None:
        out.append(
            "- Read bandwidth: not measured (this build has no "
            "`fastattn._core.read_bandwidth`), so *% bw* is empty."
        )
    else:
        out.append(
            f"- Read bandwidth, same run: **{bw:.1f} GB/s** "
            f"(`fastattn._core.read_bandwidth`: {_threads(lim)} reading "
            f"a {_size(lim['read_nbytes'])} buffer, best of {lim['read_repeats']})."
        )
        sizes = lim.get("read_rate_by_size_gbs") or {}
        if sizes:
            rates = ", ".join(
                f"{_size(int(n))} {g:.0f}"
                for n, g in sorted(sizes.items(), key=lambda x: int(x[0]))
            )
            out.append(
                "- Read rate at each smaller memory-bound row's size (GB/s, same probe, "
                f"what that row's *% bw* divides by): {rates}."
            )
    return out + contention_lines(doc)


def _bf16_peak_lines(doc: dict, lim: dict) -> list[str]:
    """What bfloat16 rows' *% peak* is against (nothing when there are none)."""
    if not any(row.get("dtype") == "bfloat16" for row in doc.get("rows", [])):
        return []
    dot = lim.get("bf16_dot_peak_gflops")
    if dot:
        return [
            f"- bfloat16 dot peak, same run: **{dot:.1f} GFLOP/s** "
            f"(`fastattn._core.bf16_dot_peak`: vdpbf16ps or BFDOT chains, 2 bfloat16 multiply-adds "
            f"per float32 lane, {_threads(lim)}, the best of {lim.get('fma_rounds', 1)} "
            f"probes of {lim['fma_seconds']:g} s): bfloat16 rows' *% peak* divides by it."
        ]
    return [
        f"- bfloat16 rows' *% peak* is against the float32 FMA peak: the {lim.get('isa')} "
        "ISA has no bfloat16 dot product and widens bfloat16 to float32 "
        "(`fastattn._core.bf16_dot_peak` is not available there)."
    ]


def _threads(lim: dict) -> str:
    n = lim["threads"]
    return f"{n} thread" + ("s" if n != 1 else "")


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"


BACKWARD_INTRO = (
    "A training step's attention: the forward (fastattn: `return_lse=True`) and the "
    "gradients of query, key and value for a random output gradient "
    "(`fastattn.scaled_dot_product_attention_backward`; torch: "
    "`torch.autograd.grad` through `scaled_dot_product_attention`; numpy: the formula with "
    "its backward written out). *forward* and *backward* time fastattn's two halves alone in "
    "the same rounds (the backward from a saved output and lse); the backward's rate counts "
    "2.5x the forward's flops (5 matrix products to the forward's 2). The error is the "
    "largest absolute difference of the gradients from `fastattn.reference`'s float64 ones."
)

METHOD = """\
- **Timing.** {description}. Before timing, every candidate is called once (its answer is
  checked then), which also pays its one-off costs (thread pools, page faults, JIT).
  Candidates of a row run interleaved and the order rotates each round, so a disturbance from
  another process hits all of them alike. Times are the best round; *spread* is how far the
  median round lies above it (a noisy machine shows a large spread). Speed-ups are ratios of
  best times from the same run: `vs torch 1.5x` means fastattn took 1/1.5 of torch's time.
- **Rate.** GFLOP/s counts 4·B·Hq·Lq·Lk·E for attention (Q·Kᵀ and P·V; times the kept fraction
  under a causal mask), B·Lq·Lk·(3·hidden + 2·D) for additive attention and 5 per element for
  masked softmax (nominal counts: compare the speed-ups there). *% peak* divides it, on the
  compute-bound rows (attention with more than one query row), by the FMA peak of the row's
  dtype measured at the start of this run with the same threads (see above): the machine's
  ceiling (bfloat16 rows: the bfloat16 dot peak on avx512bf16 and neon_bf16, else
  float32's). *% matmul* divides it by the float32 matrix-multiply rate of NumPy's `a @ b`
  ({mm_n}x{mm_n}) measured the same way: a second yardstick, the BLAS a NumPy user has.
- **Bandwidth.** On the memory-bound rows (decode, masked softmax) *GB/s* counts the bytes a
  call must move at least (every input read and the output written once: Q, K, V and the
  output; the scores and the probabilities) per second, and *% bw* divides it by the read
  rate of a buffer of the same size, measured in this run with the same threads (the read
  bandwidth above for rows larger than its buffer). A row whose bytes fit in a cache is so
  rated against that cache's rate, not against DRAM's, which it can pass.
- **Error.** The max absolute difference of each implementation's answer from
  `fastattn.reference` computed in float64, on the first rows of the first key/value head's
  query group of batch entry 0 (at most about 4M scores per check).
- **Baselines.** *numpy*: the formula a NumPy user writes: the whole score matrix in the
  input dtype, softmax, `@ v` (GQA expanded with `np.repeat`; d2l's `masked_softmax` and
  `AdditiveAttention` broadcast formula). *torch*:
  `torch.nn.functional.scaled_dot_product_attention` on 4-D CPU tensors made with
  `torch.from_numpy` (no copy), `enable_gqa=True` for GQA, `torch.set_num_threads` = the
  threads used. *jax*: `jax.nn.dot_product_attention`, jitted, on (B, L, heads, E) arrays
  transposed outside the timing, `block_until_ready()` inside it. *ort*: ONNX Runtime's CPU
  provider on a one-node model built with `onnx.helper`, the fastest of the ops that can
  compute the row (the detail table names it): the standard ONNX `Attention` (opset
  {ort_opset}, (B, H, L, E) inputs, GQA native), `com.microsoft` `MultiHeadAttention` (equal
  head counts) and `GroupQueryAttention` (causal prefill, and decode appending the new token
  to a KV cache bound as both past and present key/value: one shared buffer);
  `intra_op_num_threads` = the threads used, `inter_op_num_threads` = 1. *openvino*:
  `opset13.scaled_dot_product_attention` compiled for `CPU` with
  `INFERENCE_PRECISION_HINT=f32` (else it runs bfloat16 on CPUs that have it) and
  `INFERENCE_NUM_THREADS` = the threads used; GQA with K/V broadcast over a group axis (no
  repeated copies) or, non-causal, the group's query rows stacked, whichever is faster. Both
  engines are built and compiled once per shape and their inputs laid out for the op outside
  the timing, and they run float32 rows only (they compute float64 inputs at float32
  accuracy). torch, JAX and the engines have no additive attention or masked softmax, so
  those rows compare with NumPy only. *varlen rows* (packed sequences, `varlen_attention`):
  *numpy* runs the formula one sequence at a time; *fastattn-loop* is a Python loop of
  `scaled_dot_product_attention` calls, one per sequence; *fastattn-padded* copies the
  sequences into buffers padded to the longest, makes one call with `valid_lens` and copies the
  valid rows back (left out where those buffers would pass 2 GiB).
"""


def markdown(doc: dict, plots: list[str], plot_note: str | None) -> str:
    mm = doc["matmul"]
    out = [
        "# fastattn benchmark report",
        "",
        f"`{doc['command']}` ({doc['preset']} preset) on {doc['date']}, {doc['elapsed_s']:.0f} s.",
        "",
        f"- Machine: {machine_line(doc)}.",
        *limits_lines(doc),
        f"- float32 matmul rate, same run: **{mm['gflops']:.1f} GFLOP/s** "
        f"(NumPy `a @ b`, {mm['n']}x{mm['n']}, spread +{mm['spread']:.0%}).",
        f"- Compared: {versions_line(doc)}.",
        "",
        "Times in milliseconds, best of the rounds (its spread in brackets); "
        "**vs X** = X's time / fastattn's time (higher is better for fastattn).",
    ]
    for dtype in ALL_DTYPES:
        table = summary_table(doc, dtype)
        if table:
            out += ["", f"## {dtype}", "", table]
    table = backward_table(doc)
    if table:
        out += ["", "## backward (float32)", "", BACKWARD_INTRO, "", table]
    out += ["", "## Plots", ""]
    if plot_note:
        out += [plot_note, ""]
    for name, title in plots:
        out += [f"![{title}]({name})", ""]
    if doc["notes"]:
        out += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    out += [
        "## Method",
        "",
        METHOD.format(
            description=doc["method"]["description"], mm_n=mm["n"], ort_opset=ORT_OPSET
        ).rstrip(),
        "",
    ]
    out += ["## Configuration (`fastattn.show_config()`)", "", "```text"]
    out += [f"{k}: {v}" for k, v in doc["config"].items()] + ["```", ""]
    out += ["## Every measurement", "", detail_table(doc), ""]
    return "\n".join(out)


def write(
    doc: dict, out_dir: Path, plots: list[tuple[str, str]], plot_note: str | None
) -> tuple[Path, Path]:
    """Write report.md and report.json into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "plots": [name for name, _ in plots], "plot_note": plot_note}
    md, js = out_dir / "report.md", out_dir / "report.json"
    md.write_text(markdown(doc, plots, plot_note), encoding="utf-8")
    js.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return md, js

"""The benchmark report: report.md (tables, configuration, method) and report.json."""

from __future__ import annotations

import json
from pathlib import Path

from fastattn.bench._cases import IMPLS
from fastattn.bench._run import format_ms

BASELINES = ("numpy", "torch", "jax")


def _err(x: float | None) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.0e}"


def _impls(doc: dict) -> list[str]:
    seen = {name for row in doc["rows"] for name in row["results"]}
    return [name for name in IMPLS if name in seen]


def summary_table(doc: dict, dtype: str) -> str:
    """One line per case: fastattn's time, rate and share of the matmul rate, each
    baseline's time and fastattn's speed-up over it, and every implementation's max error."""
    rows = [r for r in doc["rows"] if r["dtype"] == dtype]
    if not rows:
        return ""
    impls = _impls(doc)
    bases = [b for b in BASELINES if b in impls]
    header = ["case", "fastattn ms", "GFLOP/s", "% matmul"]
    for b in bases:
        header += [f"{b} ms", f"vs {b}"]
    header.append("max abs error (" + " / ".join(impls) + ")")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        res = row["results"]
        fast = res["fastattn"]
        cells = [row["case"], f"{format_ms(fast['best_s'])} (+{fast['spread']:.0%})",
                 f"{fast['gflops']:.1f}", f"{fast['frac_matmul']:.0%}"]
        for b in bases:
            if b in res:
                cells += [format_ms(res[b]["best_s"]), f"**{row['speedup'][b]:.2f}x**"]
            else:
                cells += ["-", "-"]
        cells.append(" / ".join(_err(res[i]["max_abs_err"]) if i in res else "-"
                                for i in impls))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(doc: dict) -> str:
    """Every implementation of every row: best and median time, spread, rounds x calls."""
    header = ["case", "dtype", "impl", "best ms", "median ms", "spread", "rounds x calls",
              "GFLOP/s", "% matmul", "max abs error"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in doc["rows"]:
        for name, r in row["results"].items():
            lines.append("| " + " | ".join([
                row["case"], row["dtype"], name, format_ms(r["best_s"]),
                format_ms(r["median_s"]), f"+{r['spread']:.1%}",
                f"{r['rounds']} x {r['calls_per_round']}", f"{r['gflops']:.1f}",
                f"{r['frac_matmul']:.0%}", _err(r["max_abs_err"])]) + " |")
    return "\n".join(lines)


def machine_line(doc: dict) -> str:
    m, cfg = doc["machine"], doc["config"]
    return (f"{m['cpu']}, {m['cpus']} CPUs available, {m['threads']} threads used; "
            f"{m['platform']}; fastattn ISA {cfg['isa']}")


def versions_line(doc: dict) -> str:
    v = doc["versions"]
    parts = [f"fastattn {v['fastattn']}", f"NumPy {v['numpy']}"]
    parts += [f"PyTorch {v['torch']}"] if "torch" in v else []
    parts += [f"JAX {v['jax']}"] if "jax" in v else []
    return ", ".join(parts)


METHOD = """\
- **Timing.** {description}. Before timing, every candidate is called once (its answer is
  checked then), which also pays its one-off costs (thread pools, page faults, JIT).
  Candidates of a row run interleaved and the order rotates each round, so a disturbance from
  another process hits all of them alike. Times are the best round; *spread* is how far the
  median round lies above it (a noisy machine shows a large spread). Speed-ups are ratios of
  best times from the same run: `vs torch 1.5x` means fastattn took 1/1.5 of torch's time.
- **Rate.** GFLOP/s counts 4·B·Hq·Lq·Lk·E for attention (Q·Kᵀ and P·V; times the kept fraction
  under a causal mask), B·Lq·Lk·(3·hidden + 2·D) for additive attention and 5 per element for
  masked softmax (nominal counts: compare the speed-ups there). *% matmul* divides it by the
  float32 matrix-multiply rate of NumPy's `a @ b` ({mm_n}x{mm_n}) measured at the start of
  this run with the same threads: attention cannot beat that rate by much.
- **Error.** The max absolute difference of each implementation's answer from
  `fastattn.reference` computed in float64, on the first rows of the first key/value head's
  query group of batch entry 0 (at most about 4M scores per check).
- **Baselines.** *numpy*: the formula a NumPy user writes: the whole score matrix in the
  input dtype, softmax, `@ v` (GQA expanded with `np.repeat`; d2l's `masked_softmax` and
  `AdditiveAttention` broadcast formula). *torch*:
  `torch.nn.functional.scaled_dot_product_attention` on 4-D CPU tensors made with
  `torch.from_numpy` (no copy), `enable_gqa=True` for GQA, `torch.set_num_threads` = the
  threads used. *jax*: `jax.nn.dot_product_attention`, jitted, on (B, L, heads, E) arrays
  transposed outside the timing, `block_until_ready()` inside it. torch and JAX have no
  additive attention or masked softmax, so those rows compare with NumPy only.
"""


def markdown(doc: dict, plots: list[str], plot_note: str | None) -> str:
    mm = doc["matmul"]
    out = [
        "# fastattn benchmark report",
        "",
        f"`{doc['command']}` ({doc['preset']} preset) on {doc['date']}, "
        f"{doc['elapsed_s']:.0f} s.",
        "",
        f"- Machine: {machine_line(doc)}.",
        f"- float32 matmul rate, same run: **{mm['gflops']:.1f} GFLOP/s** "
        f"(NumPy `a @ b`, {mm['n']}x{mm['n']}, spread +{mm['spread']:.0%}).",
        f"- Compared: {versions_line(doc)}.",
        "",
        "Times in milliseconds, best of the rounds (its spread in brackets); "
        "**vs X** = X's time / fastattn's time (higher is better for fastattn).",
    ]
    for dtype in ("float32", "float64"):
        table = summary_table(doc, dtype)
        if table:
            out += ["", f"## {dtype}", "", table]
    out += ["", "## Plots", ""]
    if plot_note:
        out += [plot_note, ""]
    for name, title in plots:
        out += [f"![{title}]({name})", ""]
    if doc["notes"]:
        out += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    out += ["## Method", "", METHOD.format(description=doc["method"]["description"],
                                           mm_n=mm["n"]).rstrip(), ""]
    out += ["## Configuration (`fastattn.show_config()`)", "", "```text"]
    out += [f"{k}: {v}" for k, v in doc["config"].items()] + ["```", ""]
    out += ["## Every measurement", "", detail_table(doc), ""]
    return "\n".join(out)


def write(doc: dict, out_dir: Path, plots: list[tuple[str, str]],
          plot_note: str | None) -> tuple[Path, Path]:
    """Write report.md and report.json into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "plots": [name for name, _ in plots], "plot_note": plot_note}
    md, js = out_dir / "report.md", out_dir / "report.json"
    md.write_text(markdown(doc, plots, plot_note), encoding="utf-8")
    js.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return md, js

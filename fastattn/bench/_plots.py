"""The report's PNG plots (matplotlib is optional: without it the report has none)."""

from __future__ import annotations

from pathlib import Path

COLORS = {"fastattn": "#1f77b4", "numpy": "#ff7f0e", "torch": "#2ca02c", "jax": "#9467bd"}
STYLES = {"float32": ("-", "o"), "float64": ("--", "s")}


def matplotlib_missing() -> str | None:
    """None when plots can be drawn, else the sentence the report says instead."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("No plots: matplotlib is not installed (`pip install matplotlib`, or install "
                "fastattn with the `bench` extra) -- the tables above hold every number.")
    return None


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def time_vs_length(doc: dict, path: Path) -> bool:
    """Log-log time vs sequence length, one panel per series, one line per implementation
    (float32 solid, float64 dashed), with the time the same-run matmul rate would take."""
    series = list(dict.fromkeys(r["series"] for r in doc["rows"] if r["series"]))
    if not series:
        return False
    from matplotlib.ticker import FixedLocator, NullLocator

    fig = _figure(5.0 * len(series), 4.2)
    axes = fig.subplots(1, len(series), squeeze=False)[0]
    rate = doc["matmul"]["gflops"] * 1e9
    for ax, name in zip(axes, series):
        rows = sorted((r for r in doc["rows"] if r["series"] == name),
                      key=lambda r: r["seq_len"])
        lengths = sorted({r["seq_len"] for r in rows})
        for impl, color in COLORS.items():
            for dtype, (line, marker) in STYLES.items():
                pts = [(r["seq_len"], r["results"][impl]["best_s"] * 1e3) for r in rows
                       if r["dtype"] == dtype and impl in r["results"]]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, line, marker=marker, color=color, markersize=4,
                            label=f"{impl} {dtype}")
        floor = [(r["seq_len"], r["flops"] / rate * 1e3) for r in rows
                 if r["dtype"] == "float32"]
        if floor:
            xs, ys = zip(*floor)
            ax.plot(xs, ys, ":", color="0.4", label="at the float32 matmul rate")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(FixedLocator(lengths))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(n) for n in lengths])
        dims = rows[0]["dims"]
        ax.set_title(f"{name}: B={dims[0]}, H={dims[1]}, E={dims[5]}, Lq = Lk", fontsize=10)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("time per call (ms, best of rounds)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"fastattn vs baselines, {doc['machine']['threads']} threads: "
                 f"{doc['machine']['cpu']}", fontsize=9)
    fig.savefig(path)
    return True


def speedups(doc: dict, path: Path) -> bool:
    """fastattn's speed-up over each baseline, a group of bars per row (log scale)."""
    rows = [r for r in doc["rows"] if r["speedup"]]
    if not rows:
        return False
    bases = [b for b in ("numpy", "torch", "jax") if any(b in r["speedup"] for r in rows)]
    height = 0.55 + 0.19 * len(bases) * len(rows) + 0.12 * len(rows)
    fig = _figure(8.0, max(2.5, height))
    ax = fig.subplots()
    step = len(bases) + 0.8
    bar = 0.9
    labels, ticks, biggest, labelled = [], [], 1.0, set()
    for i, row in enumerate(reversed(rows)):
        base_y = i * step
        for j, b in enumerate(reversed(bases)):
            if b not in row["speedup"]:
                continue
            s = row["speedup"][b]
            biggest = max(biggest, s)
            y = base_y + j
            # bars grow from 1x: right when fastattn is faster, left when slower
            ax.barh(y, s - 1.0, left=1.0, height=bar, color=COLORS[b],
                    label=None if b in labelled else f"vs {b}")
            labelled.add(b)
            ax.text(s * 1.04 if s >= 1 else s / 1.04, y,
                    f"{s:.2f}x" if s < 10 else f"{s:.0f}x", va="center",
                    ha="left" if s >= 1 else "right", fontsize=7)
        labels.append(f"{row['case']} {row['dtype']}")
        ticks.append(base_y + (len(bases) - 1) / 2)
    ax.set_xscale("log")
    smallest = min(min(r["speedup"].values()) for r in rows)
    ax.set_xlim(min(0.5, smallest / 1.6), biggest * 2.2)
    ax.axvline(1.0, color="0.2", linewidth=1)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("speed-up of fastattn (baseline time / fastattn time, log scale; "
                  "> 1: fastattn is faster)", fontsize=8)
    handles, names = ax.get_legend_handles_labels()
    order = sorted(range(len(names)), key=lambda k: bases.index(names[k][3:]))
    ax.legend([handles[k] for k in order], [names[k] for k in order], fontsize=8,
              loc="lower right")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.set_title(f"fastattn speed-up, same run, {doc['machine']['threads']} threads",
                 fontsize=10)
    fig.savefig(path)
    return True


def draw(doc: dict, out_dir: Path) -> tuple[list[tuple[str, str]], str | None]:
    """Draw the plots into ``out_dir``: ([(file name, title)], a note for the report)."""
    note = matplotlib_missing()
    if note:
        return [], note
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    if time_vs_length(doc, out_dir / "time_vs_seqlen.png"):
        drawn.append(("time_vs_seqlen.png", "Time vs sequence length"))
    if speedups(doc, out_dir / "speedup.png"):
        drawn.append(("speedup.png", "Speed-up of fastattn over each baseline"))
    return drawn, None if drawn else "No plots: no row of this run has a baseline to plot."

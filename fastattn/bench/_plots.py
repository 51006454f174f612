"""The report's PNG plots (matplotlib is optional: without it the report has none)."""

from __future__ import annotations

from pathlib import Path

COLORS = {
    "fastattn": "#1f77b4",
    "numpy": "#ff7f0e",
    "torch": "#2ca02c",
    "jax": "#9467bd",
    "ort": "#d62728",
    "openvino": "#8c564b",
}
STYLES = {
    "float32": ("-", "o"),
    "float64": ("--", "s"),
    "float16": ("-.", "^"),
    "bfloat16": (":", "v"),
    "int8-kv": ("-.", "D"),
}


def matplotlib_missing() -> str | None:
    """None when plots can be drawn, else the sentence the report says instead."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return (
            "No plots: matplotlib is not installed (`pip install matplotlib`, or install "
            "fastattn with the `bench` extra) -- the tables above hold every number."
        )
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
        rows = sorted((r for r in doc["rows"] if r["series"] == name), key=lambda r: r["seq_len"])
        lengths = sorted({r["seq_len"] for r in rows})
        for impl, color in COLORS.items():
            for dtype, (line, marker) in STYLES.items():
                pts = [
                    (r["seq_len"], r["results"][impl]["best_s"] * 1e3)
                    for r in rows
                    if r["dtype"] == dtype and impl in r["results"]
                ]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(
                        xs,
                        ys,
                        line,
                        marker=marker,
                        color=color,
                        markersize=4,
                        label=f"{impl} {dtype}",
                    )
        floor = [(r["seq_len"], r["flops"] / rate * 1e3) for r in rows if r["dtype"] == "float32"]
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
    fig.suptitle(
        f"fastattn vs baselines, {doc['machine']['threads']} threads: {doc['machine']['cpu']}",
        fontsize=9,
    )
    fig.savefig(path)
    return True


def speedups(doc: dict, path: Path) -> bool:
    """fastattn's speed-up over each baseline: a panel per dtype, a group of bars per case
    (log scale, bars grow from 1x: right when fastattn is faster, left when slower)."""
    rows = [r for r in doc["rows"] if r["speedup"]]
    if not rows:
        return False
    bases = [b for b in COLORS if b != "fastattn" and any(b in r["speedup"] for r in rows)]
    dtypes = [d for d in STYLES if any(r["dtype"] == d for r in rows)]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    speed = {(r["case"], r["dtype"]): r["speedup"] for r in rows}
    values = [s for r in rows for s in r["speedup"].values()]
    lo, hi = min(0.5, min(values) / 1.6), max(values) * 2.2
    step = len(bases) + 0.8  # a case's group of bars, then a gap
    fig = _figure(3.0 + 3.6 * len(dtypes), max(2.5, 0.9 + 0.16 * step * len(cases)))
    axes = fig.subplots(1, len(dtypes), squeeze=False, sharey=True)[0]
    for ax, dtype in zip(axes, dtypes):
        labelled = set()
        for i, case in enumerate(reversed(cases)):
            for j, b in enumerate(reversed(bases)):
                s = speed.get((case, dtype), {}).get(b)
                if s is None:
                    continue
                y = i * step + j
                ax.barh(
                    y,
                    s - 1.0,
                    left=1.0,
                    height=0.9,
                    color=COLORS[b],
                    label=None if b in labelled else f"vs {b}",
                )
                labelled.add(b)
                ax.text(
                    s * 1.04 if s >= 1 else s / 1.04,
                    y,
                    f"{s:.2f}x" if s < 10 else f"{s:.0f}x",
                    va="center",
                    ha="left" if s >= 1 else "right",
                    fontsize=6.5,
                )
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.axvline(1.0, color="0.2", linewidth=1)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.set_title(dtype, fontsize=10)
        ax.set_xlabel("baseline time / fastattn time", fontsize=8)
    axes[0].set_yticks([i * step + (len(bases) - 1) / 2 for i in range(len(cases))])
    axes[0].set_yticklabels(list(reversed(cases)), fontsize=7)
    handles, names = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    order = sorted(range(len(names)), key=lambda k: bases.index(names[k][3:]))
    fig.legend(
        [handles[k] for k in order],
        [names[k] for k in order],
        fontsize=8,
        loc="outside lower center",
        ncols=len(bases),
    )
    fig.suptitle(
        f"fastattn's speed-up, same run, {doc['machine']['threads']} threads "
        "(log scale; > 1x: fastattn is faster)",
        fontsize=10,
    )
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

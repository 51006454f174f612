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


def _figure_legend(fig, axes, order: list[str] | None = None, ncols: int | None = None) -> None:
    """One legend for the whole figure, below the panels: every label any panel drew, once
    (a panel whose lines another lacks still gets its entries), in ``order`` if given."""
    handles, names = [], []
    for ax in axes:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    if order is not None:
        ranked = sorted(range(len(names)), key=lambda k: order.index(names[k]))
        handles, names = [handles[k] for k in ranked], [names[k] for k in ranked]
    fig.legend(
        handles, names, fontsize=8, loc="outside lower center", ncols=ncols or min(len(names), 4)
    )


def _save(fig, path: Path) -> bool:
    """Write ``fig`` (None: nothing to draw) to ``path``; whether it was written."""
    if fig is None:
        return False
    fig.savefig(path)
    return True


def time_vs_length(doc: dict, path: Path) -> bool:
    """Draw time_vs_length_figure into ``path``; False when the run has no series."""
    return _save(time_vs_length_figure(doc), path)


def time_vs_length_figure(doc: dict):
    """Log-log time vs sequence length, one panel per series, one line per implementation
    (float32 solid, float64 dashed), with the time the same-run matmul rate would take; one
    legend below the panels. None when the run has no series."""
    series = list(dict.fromkeys(r["series"] for r in doc["rows"] if r["series"]))
    if not series:
        return None
    from matplotlib.ticker import FixedLocator, NullLocator

    fig = _figure(5.0 * len(series), 4.6)
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
        dims = rows[0]["dims"]  # B, Hq, Hkv, Lq, Lk, E
        square = all(r["dims"][3] == r["dims"][4] for r in rows)
        heads = f"H={dims[1]}" if dims[1] == dims[2] else f"H={dims[1]}/{dims[2]}"
        shape = "Lq = Lk" if square else f"Lq = {dims[3]}"
        ax.set_title(f"{name}: B={dims[0]}, {heads}, E={dims[5]}, {shape}", fontsize=10)
        ax.set_xlabel("sequence length" if square else "keys (Lk)")
        ax.set_ylabel("time per call (ms, best of rounds)")
        ax.grid(True, which="both", alpha=0.3)
    _figure_legend(fig, axes)
    fig.suptitle(
        f"fastattn vs baselines, {doc['machine']['threads']} threads: {doc['machine']['cpu']}",
        fontsize=9,
    )
    return fig


def speedup_label(s: float) -> str:
    """A bar's label: two decimals near 1x, whole numbers from 10x, and two significant
    digits below 0.1x (a 500x slower case reads 0.002x, not 0.00x)."""
    if s >= 10:
        return f"{s:.0f}x"
    if s >= 0.1:
        return f"{s:.2f}x"
    return f"{s:.2g}x"


def speedups(doc: dict, path: Path) -> bool:
    """Draw speedup_figure into ``path``; False when no row has a baseline."""
    return _save(speedup_figure(doc), path)


def speedup_figure(doc: dict):
    """fastattn's speed-up over each baseline: a panel per dtype, a group of bars per case
    (log scale, bars grow from 1x: right when fastattn is faster, left when slower). Panels
    sit side by side, sharing the case names, when every dtype has the same cases; else they
    are stacked, each with its own cases (a dtype with 2 rows gets a short panel, not 30
    empty ones). Every label sits right of the 1x line, so none runs into the case names.
    None when no row has a baseline."""
    rows = [r for r in doc["rows"] if r["speedup"]]
    if not rows:
        return None
    bases = [b for b in COLORS if b != "fastattn" and any(b in r["speedup"] for r in rows)]
    dtypes = [d for d in STYLES if any(r["dtype"] == d for r in rows)]
    cases = {d: list(dict.fromkeys(r["case"] for r in rows if r["dtype"] == d)) for d in dtypes}
    speed = {(r["case"], r["dtype"]): r["speedup"] for r in rows}
    values = [s for r in rows for s in r["speedup"].values()]
    # 1x and every label (which starts right of 1x) inside, however fast or slow the run
    lo, hi = min(0.5, min(values) / 1.6), max(2.0, max(values)) * 3.0
    step = len(bases) + 0.8  # a case's group of bars, then a gap
    inch = 0.16 * step  # height of one case's group
    longest = max(len(c) for d in dtypes for c in cases[d])
    names_width = 0.055 * longest
    side_by_side = all(cases[d] == cases[dtypes[0]] for d in dtypes)
    if side_by_side:
        fig = _figure(names_width + 3.6 * len(dtypes), len(cases[dtypes[0]]) * inch + 1.8)
        axes = fig.subplots(1, len(dtypes), squeeze=False, sharey=True)[0]
    else:
        heights = [len(cases[d]) * inch + 0.6 for d in dtypes]  # + title and axis
        fig = _figure(names_width + 4.5, sum(heights) + 1.2)
        axes = fig.subplots(len(dtypes), 1, squeeze=False, sharex=True, height_ratios=heights)
        axes = axes[:, 0]
    for ax, dtype in zip(axes, dtypes):
        labelled = set()
        names = list(reversed(cases[dtype]))
        for i, case in enumerate(names):
            for j, b in enumerate(reversed(bases)):
                s = speed[(case, dtype)].get(b)
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
                    max(s, 1.0) * 1.04,
                    y,
                    speedup_label(s),
                    va="center",
                    ha="left",
                    fontsize=6.5,
                )
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(-0.5 - 0.4, (len(names) - 1) * step + len(bases) - 0.5 + 0.4)
        ax.axvline(1.0, color="0.2", linewidth=1)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.set_title(f"{dtype} ({len(names)} cases)", fontsize=10)
        if ax is axes[0] or not side_by_side:
            ax.set_yticks([i * step + (len(bases) - 1) / 2 for i in range(len(names))])
            ax.set_yticklabels(names, fontsize=7)
        ax.tick_params(axis="x", labelbottom=True)
        if side_by_side or ax is axes[-1]:
            ax.set_xlabel("baseline time / fastattn time", fontsize=8)
    _figure_legend(fig, axes, order=[f"vs {b}" for b in bases], ncols=len(bases))
    fig.suptitle(
        f"fastattn's speed-up, same run, {doc['machine']['threads']} threads "
        "(log scale; > 1x: fastattn is faster)",
        fontsize=10,
    )
    return fig


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

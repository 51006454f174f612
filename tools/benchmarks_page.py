"""Write the "latest report" section of docs/benchmarks.md from the newest committed report.

The benchmark page states what the latest committed `fastattn-bench` report measured: its
date, command, machine and versions, and one line per case (fastattn's time and its
speed-up over each baseline, float32 and float64 side by side). This script writes that
section, between the page's two markers, from the `report.json` under docs/bench/ with the
latest date, so the page cannot drift from the report by hand-copying.

    python tools/benchmarks_page.py           # rewrite the section
    python tools/benchmarks_page.py --check   # exit 1 if the page is not what it would write

It needs an installed fastattn (the report's formatting helpers live in fastattn.bench).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from fastattn.bench._report import BASELINES, machine_line, versions_line
from fastattn.bench._run import format_ms

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = DOCS / "benchmarks.md"
BEGIN = "<!-- latest report: written by tools/benchmarks_page.py from {source}; do not edit -->"
END = "<!-- latest report end -->"
NAMES = {"numpy": "NumPy", "torch": "torch", "jax": "JAX", "ort": "ONNX Runtime"}


def latest_report(docs: Path = DOCS) -> Path:
    """The report.json under docs/bench/ with the latest "date" (ISO 8601, with its offset)."""
    reports = sorted(docs.glob("bench/**/report.json"))
    if not reports:
        raise SystemExit(f"no report.json under {docs / 'bench'}")
    return max(reports, key=lambda p: datetime.fromisoformat(json.loads(p.read_text())["date"]))


def _baselines(doc: dict) -> list[str]:
    seen = {name for row in doc["rows"] for name in row["results"]}
    return [b for b in BASELINES if b in seen]


def case_table(doc: dict) -> str:
    """One line per case: for each dtype of the run, fastattn's best time and its speed-up
    over each baseline (its time over fastattn's; "-" where a baseline lacks the case)."""
    dtypes = list(dict.fromkeys(row["dtype"] for row in doc["rows"]))
    bases = _baselines(doc)
    by_case: dict[str, dict[str, dict]] = {}
    for row in doc["rows"]:
        by_case.setdefault(row["case"], {})[row["dtype"]] = row
    header = ["case"]
    for dtype in dtypes:
        header += [f"{dtype} ms"] + [f"vs {NAMES.get(b, b)}" for b in bases]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "--:|" * (len(header) - 1)]
    for case, rows in by_case.items():
        cells = [case]
        for dtype in dtypes:
            row = rows.get(dtype)
            if row is None:
                cells += ["-"] * (1 + len(bases))
                continue
            cells.append(format_ms(row["results"]["fastattn"]["best_s"]))
            cells += [
                f"{row['speedup'][b]:.2f}x" if b in row.get("speedup", {}) else "-" for b in bases
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(report: Path, docs: Path = DOCS) -> str:
    doc = json.loads(report.read_text())
    source = report.relative_to(docs.parent).as_posix()
    page = report.with_name("report.md").relative_to(docs).as_posix()
    when = datetime.fromisoformat(doc["date"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    matmul = doc.get("matmul") or {}
    lines = [
        BEGIN.format(source=source),
        "",
        f"[The latest committed report]({page}) (`{doc['command']}`, {doc['preset']} preset), "
        f"run on {when} in {doc['elapsed_s']:.0f} s:",
        "",
        f"- Machine: {machine_line(doc)}.",
        f"- Compared: {versions_line(doc)}.",
    ]
    if matmul:
        lines.append(
            f"- {matmul['dtype']} matmul rate, same run: {matmul['gflops']:.1f} GFLOP/s "
            f"(NumPy `a @ b`, {matmul['n']}x{matmul['n']})."
        )
    lines += [
        "",
        "Best time per call; **vs X** is X's time over fastattn's (above 1: fastattn is "
        "faster). The report has each row's spread, rates, errors and the method.",
        "",
        case_table(doc),
        "",
        END,
    ]
    return "\n".join(lines)


def render(text: str, new_section: str) -> str:
    """`text` with everything from the begin marker to the end marker replaced."""
    start = text.find("<!-- latest report: written by tools/benchmarks_page.py")
    end = text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{PAGE}: the latest-report markers are missing")
    return text[:start] + new_section + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is stale")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    wanted = render(text, section(latest_report()))
    if args.check:
        if wanted != text:
            print(f"{PAGE} is stale: run python tools/benchmarks_page.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The command line of ``python -m fastattn.bench``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from fastattn.bench._cases import ALL_DTYPES, DTYPES, IMPLS, grid

DESCRIPTION = """\
Benchmark fastattn against the NumPy formulas (and PyTorch's / JAX's CPU attention, ONNX
Runtime and OpenVINO when they are installed) on this machine, over realistic shapes (encoder,
long-context, cross-attention, GQA prefill and decode, causal, many short sequences, additive
attention, masked softmax) in float32 and float64, beside the machine's FMA peak and read
bandwidth measured in the same run. Writes report.md, report.json and PNG plots into --out."""

EPILOG = """\
presets: --quick (under a minute), default (a few minutes), --full (longer sequences, more
rounds). `fastattn-bench` (the console script) is the same command. Examples:
  python -m fastattn.bench --quick --out bench-report
  python -m fastattn.bench --shapes causal,decode --dtype float32 --threads 1
  python -m fastattn.bench --list          # the cases of the chosen preset
  python -m fastattn.bench --quick --json > results.json"""


def _csv(choices):
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {', '.join(choices)}; got {text!r}"
            )
        return items

    return parse


def _dtypes(text: str) -> tuple[str, ...]:
    return DTYPES if text == "both" else _csv(ALL_DTYPES)(text)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def program() -> str:
    """How this was started: ``fastattn-bench`` (the console script) or ``python -m ...``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return "fastattn-bench" if name.startswith("fastattn-bench") else "python -m fastattn.bench"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=program(),
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    preset = p.add_mutually_exclusive_group()
    preset.add_argument(
        "--quick",
        dest="preset",
        action="store_const",
        const="quick",
        help="smaller shapes, fewer rounds: well under a minute",
    )
    preset.add_argument(
        "--full",
        dest="preset",
        action="store_const",
        const="full",
        help="longer sequences, extra shapes, more rounds",
    )
    preset.add_argument(
        "--smoke", dest="preset", action="store_const", const="smoke", help=argparse.SUPPRESS
    )  # tiny shapes: the test suite's check
    p.set_defaults(preset="default")
    p.add_argument(
        "--shapes",
        default="",
        metavar="WORDS",
        help="comma-separated words; run only the cases whose name or tags "
        "contain one (e.g. 'encoder,decode', 'causal', 'gqa', 'additive')",
    )
    p.add_argument(
        "--dtype",
        type=_dtypes,
        default=DTYPES,
        metavar="DTYPE",
        help="float32, float64 or both (default); or, comma-separated with them, the "
        "low-precision rows float16, bfloat16 (needs ml_dtypes), int8-kv",
    )
    p.add_argument(
        "--threads",
        type=_positive,
        default=None,
        metavar="N",
        help="threads for fastattn, the baselines and NumPy's BLAS (default: "
        "fastattn.get_num_threads())",
    )
    p.add_argument(
        "--impls",
        type=_csv(IMPLS),
        default=IMPLS,
        metavar="NAMES",
        help="implementations to compare, of " + ",".join(IMPLS) + " (ort: ONNX "
        "Runtime, openvino: OpenVINO; default: all that are installed; "
        "fastattn is always measured, and on the backward rows its forward and backward "
        "alone)",
    )
    p.add_argument(
        "--rounds",
        type=_positive,
        default=None,
        metavar="N",
        help="timed rounds per candidate (default: the preset's)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench-report"),
        metavar="DIR",
        help="where report.md, report.json and the plots go (default: bench-report)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON on stdout (it is also in DIR/report.json)",
    )
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    words = [w.strip() for w in args.shapes.split(",") if w.strip()]
    if args.list:
        for case in grid(args.preset):
            if case.matches(words):
                dtypes = [d for d in case.dtypes if d in args.dtype]
                if dtypes:
                    print(f"{case.name:44s} {','.join(dtypes):16s} tags: {', '.join(case.tags)}")
        return 0

    from fastattn.bench import _plots, _report
    from fastattn.bench._run import Settings, run

    argv_used = sys.argv[1:] if argv is None else list(argv)
    settings = Settings(
        preset=args.preset,
        shapes=words,
        dtypes=args.dtype,
        # fastattn and, on backward rows, its two halves are always measured
        impls=tuple(
            dict.fromkeys(("fastattn", "fastattn-forward", "fastattn-backward", *args.impls))
        ),
        threads=args.threads,
        rounds=args.rounds,
        seed=args.seed,
        command=shlex.join([*program().split(), *argv_used]),
    )
    try:
        doc = run(settings)
    except ValueError as exc:
        print(f"{program()}: {exc}", file=sys.stderr)
        return 2
    if args.no_plots:
        plots, note = [], "No plots: --no-plots was given."
    else:
        plots, note = _plots.draw(doc, args.out)
    md, js = _report.write(doc, args.out, plots, note)
    if args.json:
        print(js.read_text(encoding="utf-8"), end="")
    else:
        for dtype in ALL_DTYPES:
            table = _report.summary_table(doc, dtype)
            if table:
                print(f"\n{dtype}\n{table}")
        table = _report.backward_table(doc)
        if table:
            print(f"\nbackward (float32)\n{table}")
        print()
    where = [str(md)] + [str(args.out / name) for name, _ in plots]
    print(
        f"Report written to {where[0]}"
        + (f" (plots: {', '.join(where[1:])})" if plots else f" ({note})"),
        file=sys.stderr if args.json else sys.stdout,
    )
    return 0

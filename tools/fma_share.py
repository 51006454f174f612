"""Fused multiply-adds per instruction in the innermost loops of a built ``_core``.

    python tools/fma_share.py build-arm/_core*.so --isa neon
    python tools/fma_share.py build/_core*.so --isa avx2

Disassembles the extension (objdump; ``aarch64-linux-gnu-objdump`` for an aarch64 one),
finds every innermost loop (a backward branch whose body holds no other backward branch) in
the functions of one ISA's namespace whose names contain a ``--match`` string, and prints
those with at least ``--min-fma`` fused multiply-adds: FMAs / all instructions of one pass
through the body. The defaults name float32 SDPA's tiled block engine (the score tiles,
Q K^T, are inlined there) and the P V tile functions; the loops with the most FMAs are
the register-tile micro-kernels. A count, not a timing: the share says how much of the
instruction stream issues arithmetic, whatever the machine.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

FMA = {
    "aarch64": re.compile(r"^(fmla|fmls|fmadd|fmsub|fnmadd|fnmsub|bfdot|bfmmla|bfmlal[bt])$"),
    "x86_64": re.compile(r"^v?f(n)?m(add|sub)(132|213|231)[ps][sd]$|^vdpbf16ps$"),
}
BRANCH = {
    "aarch64": re.compile(r"^(b|b\.\w+|cbn?z|tbn?z)$"),
    "x86_64": re.compile(r"^j\w+$"),
}
FUNC = re.compile(r"^([0-9a-f]+) <(.*)>:$")
INSN = re.compile(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$")


def functions(lines):
    """(name, [(address, mnemonic, operands)]) for each function of the disassembly."""
    name, body = None, []
    for line in lines:
        m = FUNC.match(line)
        if m:
            if name is not None:
                yield name, body
            name, body = m.group(2), []
            continue
        m = INSN.match(line)
        if m and name is not None:
            body.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if name is not None:
        yield name, body


def innermost_loops(body, branch):
    """(start, end) index ranges of the innermost loops: a branch back to an earlier
    instruction of the function, with no other backward branch inside."""
    index = {addr: i for i, (addr, _, _) in enumerate(body)}
    loops = []
    for i, (addr, mnem, ops) in enumerate(body):
        if not branch.match(mnem):
            continue
        target = re.search(r"\b([0-9a-f]+) <", ops)
        if not target:
            continue
        t = int(target.group(1), 16)
        if t < addr and t in index:
            loops.append((index[t], i))
    return [
        (a, b)
        for a, b in loops
        if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops)
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("so", help="the built extension (_core*.so)")
    ap.add_argument("--isa", required=True, help="the ISA namespace (neon, avx2, ...)")
    ap.add_argument(
        "--match",
        nargs="+",
        default=["attend_block<float, float, float, false>", "pv_rows<float", "pv_tile<float"],
        help="function name substrings (default: float32 SDPA's block engine, P V tiles)",
    )
    ap.add_argument("--min-fma", type=int, default=8, help="loops with fewer are not shown")
    args = ap.parse_args(argv)
    arch = "aarch64" if args.isa.startswith("neon") or "aarch64" in args.so else "x86_64"
    objdump = "aarch64-linux-gnu-objdump" if arch == "aarch64" else "objdump"
    text = subprocess.run(
        [objdump, "-d", "-C", "--no-show-raw-insn", args.so],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    fma, branch = FMA[arch], BRANCH[arch]
    ns = f"fastattn::{args.isa}::"
    found = []
    for name, body in functions(text):
        if ns not in name or not any(m in name for m in args.match):
            continue
        for a, b in innermost_loops(body, branch):
            insns = body[a : b + 1]
            n_fma = sum(1 for _, m, _ in insns if fma.match(m))
            if n_fma >= args.min_fma:
                found.append((n_fma, len(insns), insns[0][0], name))
    if not found:
        print(f"no loop with {args.min_fma}+ multiply-adds in {ns}{args.match}", file=sys.stderr)
        return 1
    print(f"{args.so} ({args.isa}): innermost loops with {args.min_fma}+ FMAs")
    for n_fma, total, addr, name in sorted(found, key=lambda f: (-f[0], f[1], f[2])):
        print(
            f"  {n_fma} FMAs / {total} instructions = {100 * n_fma / total:.0f} % "
            f"(loop at {addr:#x}) in {name[:90]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every ```python block of README.md and of the docs/ pages runs as written.

A page's blocks run in order in one namespace, as a reader running them one after the other
would (a later block may use a name an earlier one defined), in a fresh temporary working
directory. A line ``print(...)  # expected`` states what it prints: the text of its comment,
up to a first ": " (which starts an explanation), must be what the call printed.

A block that imports an optional package (CuPy, Numba, PyTorch, JAX: none of them in the
"test" extra; ml_dtypes, Dask, Zarr: in it, but fastattn runs without them) is skipped, with
the package named, when that package is not installed; the blocks before it have run.
Nothing else is skipped: any other exception fails the test. The ``>>>`` examples
(```{doctest} blocks) are run by the documentation's doctest build, not here.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import REPO

# Optional packages a block may need (fastattn itself depends on NumPy alone). Anything else
# a block imports must be installed or the block fails.
OPTIONAL = {
    "cupy": "CuPy",
    "numba": "Numba",
    "torch": "PyTorch",
    "jax": "JAX",
    "ml_dtypes": "ml_dtypes",
    "dask": "Dask",
    "zarr": "Zarr",
}

FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?:python|py)[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
EXPECT = re.compile(r"^print\(.*\)[ \t]+#[ \t]*(?P<expected>.+)$")


def pages() -> list[Path]:
    generated = {"_build", "auto_examples"}
    found = [REPO / "README.md"]
    for page in sorted((REPO / "docs").rglob("*.md")):
        if not generated & set(page.relative_to(REPO / "docs").parts):
            found.append(page)
    return found


def blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the block's first code line, dedented code) of each python fence."""
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start("body")) + 1
        out.append((line, textwrap.dedent(m.group("body"))))
    return out


def missing_optional(code: str) -> str | None:
    """The display name of an optional package the block imports and this Python lacks."""
    for node in ast.walk(ast.parse(code)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in OPTIONAL and importlib.util.find_spec(top) is None:
                return OPTIONAL[top]
    return None


def expected_prints(code: str) -> dict[int, str]:
    """Line number (within the block) -> the output its print(...) comment states."""
    out = {}
    for n, line in enumerate(code.splitlines(), 1):
        m = EXPECT.match(line)
        if m:
            out[n] = m.group("expected").split(": ")[0].strip()
    return out


PAGES_WITH_CODE = [p for p in pages() if blocks(p.read_text())]


def test_the_pages_hold_python_blocks():
    """The extraction finds the blocks it should (a broken pattern would pass vacuously)."""
    names = {p.relative_to(REPO).as_posix() for p in PAGES_WITH_CODE}
    assert {"README.md", "docs/guide/sdpa.md", "docs/dask.md", "docs/cuda.md"} <= names
    assert len(blocks((REPO / "README.md").read_text())) >= 1


def test_expected_output_comments_are_parsed():
    code = "x = 1\nprint(x + 1)  # 2\nprint(True)  # True: an explanation\nprint(3)\n"
    assert expected_prints(code) == {2: "2", 3: "True"}
    assert missing_optional("import numpy as np\nimport json") is None


@pytest.mark.parametrize(
    "page", PAGES_WITH_CODE, ids=[p.relative_to(REPO).as_posix() for p in PAGES_WITH_CODE]
)
def test_page_code_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = page.relative_to(REPO).as_posix()
    namespace: dict = {"__name__": "__main__"}
    printed: list[tuple[str, int, str]] = []

    def recording_print(*args, sep=" ", end="\n", file=None, flush=False):
        if file is None or file is sys.stdout:
            frame = sys._getframe(1)
            printed.append((frame.f_code.co_filename, frame.f_lineno, sep.join(map(str, args))))
        print(*args, sep=sep, end=end, file=file, flush=flush)

    namespace["print"] = recording_print
    for first_line, code in blocks(page.read_text()):
        lacking = missing_optional(code)
        if lacking is not None:
            pytest.skip(f"the block at {rel}:{first_line} needs {lacking}, which is not installed")
        # Padded so that tracebacks and the print records carry the page's line numbers.
        exec(compile("\n" * (first_line - 1) + code, rel, "exec"), namespace)
        for n, expected in expected_prints(code).items():
            line = first_line + n - 1
            got = [text for name, at, text in printed if name == rel and at == line]
            assert got, f"{rel}:{line}: the print(...) did not run"
            assert got[-1] == expected, (
                f"{rel}:{line} printed {got[-1]!r}; its comment says {expected!r}"
            )

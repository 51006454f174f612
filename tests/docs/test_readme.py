"""The README stays a five-minute read with its two commands up front (issue #33)."""

from __future__ import annotations

import subprocess

from helpers import REPO

README = (REPO / "README.md").read_text()
TEST_COMMAND = 'python3 -m venv .venv && .venv/bin/pip install ".[test]" && .venv/bin/pytest tests'
BENCH_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install ".[bench]" && '
    ".venv/bin/fastattn-bench --quick --out bench-report"
)


def test_readme_is_short_with_both_commands_in_its_first_20_lines():
    lines = README.splitlines()
    assert len(lines) <= 250
    assert TEST_COMMAND in lines[:20] and BENCH_COMMAND in lines[:20]


def test_ci_reads_the_test_command_from_the_readme():
    """.ci/run runs the line after the test-command marker's fence: the same awk program."""
    awk = next(
        line.split("cmd=$(awk ", 1)[1].rsplit(" README.md)", 1)[0]
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.startswith("cmd=$(awk ")
    )
    program = awk.strip("'")
    got = subprocess.run(
        ["awk", program, "README.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert got == TEST_COMMAND

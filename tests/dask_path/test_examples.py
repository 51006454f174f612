"""examples/dask_long_context.py and examples/dask_batch.py run at their small scale (each
starts a LocalCluster of two worker processes) and match the one-shot NumPy call."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import REPO

pytest.importorskip("dask.array")
pytest.importorskip("distributed")


@pytest.mark.parametrize(
    ("script", "needs"), [("dask_long_context.py", "zarr"), ("dask_batch.py", None)]
)
def test_dask_example_runs_and_matches(script, needs, tmp_path):
    if needs:
        pytest.importorskip(needs)
    # cwd: a fresh directory, so the child imports the installed fastattn
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    error = re.search(r"max \|distributed - [^|]+\| = (\S+)", proc.stdout)
    assert error, proc.stdout
    # float32 on O(1) values; the long context merges 8 partial states
    assert float(error.group(1)) < 1e-5, proc.stdout

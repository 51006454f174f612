"""Versioning from one place, and the wheel: built, installed into a fresh venv and smoke-tested
under every FASTATTN_ISA this CPU supports.

The wheel test builds the extension from scratch (minutes), so it runs only when asked:

    FASTATTN_TEST_WHEEL=1 pytest tests/distribution/test_packaging.py   # builds with pip wheel
    FASTATTN_TEST_WHEEL=1 FASTATTN_WHEEL=dist/fastattn-...whl \\
        pytest tests/distribution/test_packaging.py

With qemu-user installed (apt-get install qemu-user), the wheel also runs on an emulated CPU
without AVX.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import fastattn

from helpers import REPO

ROOT = REPO


def pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = text[text.index("[project]") :]
    return re.search(r'^version\s*=\s*"([^"]+)"', project, re.MULTILINE).group(1)


def test_version_has_one_source():
    """pyproject.toml's version reaches the compiled module, the package metadata and the
    CHANGELOG."""
    version = pyproject_version()
    assert fastattn.__version__ == fastattn._core.version == version
    assert importlib.metadata.version("fastattn") == version
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[{re.escape(version)}\]", changelog, re.MULTILINE), (
        f"CHANGELOG.md has no '## [{version}]' section"
    )


@pytest.mark.wheel
@pytest.mark.skipif(
    os.environ.get("FASTATTN_TEST_WHEEL") != "1",
    reason="builds a wheel (minutes): set FASTATTN_TEST_WHEEL=1",
)
def test_wheel_installs_into_a_fresh_venv_and_passes_the_smoke_test(tmp_path):
    wheel = os.environ.get("FASTATTN_WHEEL")
    if wheel:  # e.g. the auditwheel-repaired one
        wheel = Path(wheel).resolve()
    else:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                str(ROOT),
                "--no-deps",
                "-w",
                str(tmp_path / "dist"),
            ],
            check=True,
            timeout=1800,
        )
        (wheel,) = (tmp_path / "dist").glob("fastattn-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(re.fullmatch(r"fastattn/_core\..*(so|pyd)", n) for n in names), names
    for needed in (
        "fastattn/__init__.py",
        "fastattn/reference.py",
        "fastattn/bench/__main__.py",
        "fastattn/_core.pyi",
        "fastattn/include/fastattn/fastattn.h",  # the C API (fastattn.get_include())
        "fastattn/capi.pxd",
    ):
        assert needed in names
    # Sources stay out, but for the C API's header (the only header shipped).
    sources = [n for n in names if n.endswith((".cpp", ".h", ".o"))]
    assert sources == ["fastattn/include/fastattn/fastattn.h"], sources
    assert not [n for n in names if n.startswith("tests/")]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=900)
    # From a directory outside the source tree: the installed package must be the one tested.
    proc = subprocess.run(
        [str(python), str(ROOT / "tools" / "wheel_smoke.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"fastattn {pyproject_version()} from {venv.resolve()}" in proc.stdout
    for isa in fastattn._core.available_isas():
        assert f"ok isa={isa}" in proc.stdout
    assert "wheel smoke test passed" in proc.stdout

    # A CPU without AVX (an emulated Nehalem: SSE4.2, NumPy 2's floor) gets the baseline
    # kernels, refuses FASTATTN_ISA=avx2, and passes the checks: no -march=native anywhere.
    qemu = shutil.which("qemu-x86_64")
    if qemu is None or platform.machine() != "x86_64":
        return
    code = "import fastattn; print(fastattn._core.available_isas(), fastattn._core.active_isa())"
    old_cpu = [qemu, "-cpu", "Nehalem", str(python)]
    proc = subprocess.run(
        [*old_cpu, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert proc.stdout.split() == ["['scalar',", "'baseline']", "baseline"], proc.stdout
    proc = subprocess.run(
        [*old_cpu, str(ROOT / "tools" / "wheel_smoke.py"), "--child"],
        cwd=tmp_path,
        env=dict(os.environ, FASTATTN_ISA="baseline"),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0 and "ok isa=baseline" in proc.stdout, proc.stderr
    proc = subprocess.run(
        [*old_cpu, "-c", "import fastattn"],
        cwd=tmp_path,
        env=dict(os.environ, FASTATTN_ISA="avx2"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode != 0 and "does not support it" in proc.stderr

"""Compiling code against fastattn's C API inside a test: a plain C shared library (loaded
with ctypes) and a Cython extension module, each into a temporary folder with the compiler
Python was built with (sysconfig), so no setuptools run is needed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

import fastattn.capi

# -fopenmp: the Cython module's prange; warnings are errors for the C library (the header
# must compile cleanly as strict C99).
_CC = (sysconfig.get_config_var("CC") or "cc").split()


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:  # the compiler's own words, not just an exit status
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")


def _compile(sources: list[Path], target: Path, extra: list[str]) -> Path:
    cmd = [
        *_CC,
        "-shared",
        "-fPIC",
        "-O2",
        "-I",
        fastattn.capi.get_include(),
        *extra,
        *map(str, sources),
        "-o",
        str(target),
    ]
    _run(cmd)
    return target


def build_c_library(source: str, folder: Path) -> Path:
    """A shared library of C99 source compiled against the header, warnings as errors."""
    path = folder / "capi_client.c"
    path.write_text(source)
    return _compile(
        [path], folder / "capi_client.so", ["-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror"]
    )


def build_cython_module(name: str, source: str, folder: Path):
    """Cythonizes and compiles module `name` (which may cimport fastattn.capi); imports it."""
    pyx = folder / f"{name}.pyx"
    pyx.write_text(source)
    c_file = folder / f"{name}.c"
    _run(
        [
            sys.executable,
            "-m",
            "cython",
            "-3",
            "-I",
            str(Path(fastattn.__file__).parent.parent),
            str(pyx),
            "-o",
            str(c_file),
        ]
    )
    so = folder / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    _compile(
        [c_file], so, ["-I", sysconfig.get_paths()["include"], "-fopenmp", "-Wno-unused-function"]
    )
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

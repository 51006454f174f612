"""Run fastattn's CUDA kernels on the CPU: a test backend for machines without a GPU.

Not a test module. :func:`build` compiles ``fastattn/cuda/attention.cu`` as host C++ with
``cuda_emulation.h`` (fibers for threads, real barriers; see that header) into a shared
library whose one entry point launches any kernel named in ``fastattn._cuda.KERNELS`` by
its name expression. :func:`backend` wraps it in a ``fastattn._cuda.Backend`` over NumPy,
so the whole host side of the CUDA path (validation, layouts, params blocks, pointers)
and the kernels run together, on NumPy arrays in place of CuPy ones. What this cannot
show: NVRTC/CuPy specifics, the real memory model and timing of a GPU.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np

from fastattn import _cuda

HERE = Path(__file__).resolve().parent
# A small grid: every block runs in turn, and the kernels' grid-stride loops get exercised.
MAX_BLOCKS = 3


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def harness_source(source_path: Path) -> str:
    cases = "\n".join(
        f"    case {i}: return fastattn_emulation::launch(&{name}, grid, block, slots, n);"
        for i, name in enumerate(_cuda.KERNELS)
    )
    return f"""#include "cuda_emulation.h"
#include "{source_path}"

extern "C" int fastattn_emulate(int kernel, long long grid, int block,
                                const unsigned long long* slots, int n) {{
  switch (kernel) {{
{cases}
  }}
  fastattn_emulation::error = "unknown kernel index";
  return -3;
}}

extern "C" const char* fastattn_emulation_error() {{ return fastattn_emulation::error; }}
"""


def build(workdir: Path) -> ctypes.CDLL:
    """Compile the emulation library into ``workdir`` and load it."""
    cxx = compiler()
    source = Path(_cuda.__file__).resolve().parent.joinpath(*_cuda.KERNEL_SOURCE)
    harness = workdir / "harness.cpp"
    harness.write_text(harness_source(source))
    lib = workdir / "libfastattn_emulation.so"
    cmd = [
        cxx,
        "-std=c++20",
        "-O1",
        "-fPIC",
        "-shared",
        "-Wall",
        "-Wno-unknown-pragmas",
        f"-I{HERE}",
        str(harness),
        "-o",
        str(lib),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    dll = ctypes.CDLL(str(lib))
    dll.fastattn_emulate.restype = ctypes.c_int
    dll.fastattn_emulate.argtypes = [
        ctypes.c_int,
        ctypes.c_longlong,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_ulonglong),
        ctypes.c_int,
    ]
    dll.fastattn_emulation_error.restype = ctypes.c_char_p
    return dll


def _slot(value) -> int:
    """An argument as CuPy would pass it: a Python int as 8 bytes, a float as a double."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"kernel arguments must be Python ints or floats, got {value!r}")
    if isinstance(value, float):
        return struct.unpack("<Q", struct.pack("<d", value))[0]
    return value & 0xFFFF_FFFF_FFFF_FFFF


def backend(dll: ctypes.CDLL, launches: list | None = None) -> _cuda.Backend:
    """A Backend over NumPy that runs each launch in the emulator (and records it in
    ``launches`` as (name, grid, block, args))."""

    def launch(name, grid, block, args):
        if launches is not None:
            launches.append((name, grid, block, args))
        slots = (ctypes.c_ulonglong * len(args))(*[_slot(a) for a in args])
        rc = dll.fastattn_emulate(
            _cuda.KERNELS.index(name), min(grid, MAX_BLOCKS), block, slots, len(args)
        )
        if rc:
            raise RuntimeError(f"emulated {name}: {dll.fastattn_emulation_error().decode()}")

    return _cuda.Backend(
        xp=np, to_host=np.asarray, pointer=lambda a: a.__array_interface__["data"][0], launch=launch
    )

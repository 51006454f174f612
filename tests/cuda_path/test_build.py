"""The CUDA source compiles, for every template instance the Python side launches.

* ``nvcc`` (when installed): the shipped ``fastattn/cuda/attention.cu`` plus a wrapper that
  takes the address of every kernel named in ``fastattn._cuda.KERNELS``, so each template
  instance is compiled, for sm_80 and sm_90 in one call (ptxas included: shared memory
  and register limits are checked too; device code unoptimised, to keep it quick).
* NVRTC (when its library is found, e.g. ``pip install nvidia-cuda-nvrtc``): the source
  exactly as ``cupy.RawModule`` compiles it -- no host headers, ``-std=c++17``, the name
  expressions resolved to lowered names.
* Without either, the checks that need no compiler: the params blocks of ``_cuda.py``
  match the enums of the source, the source ships as package data and includes nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fastattn import _cuda

SOURCE = Path(_cuda.__file__).resolve().parent.joinpath(*_cuda.KERNEL_SOURCE)
ARCHES = ("80", "90")


def enum_names(source: str, enum: str) -> tuple:
    body = re.search(rf"enum {enum} : int \{{(.*?)\}};", source, re.S)
    assert body, f"enum {enum} not found"
    entries = re.sub(r"//[^\n]*", "", body.group(1)).split(",")
    return tuple(e.split("=")[0].strip() for e in entries if e.strip())


@pytest.mark.parametrize(
    ("enum", "names"),
    [
        ("AttentionParam", _cuda.ATTENTION_PARAMS + ("kAttentionHeader",)),
        ("AttentionSlot", _cuda.ATTENTION_SLOTS + ("kAttentionSlots",)),
        ("SoftmaxParam", _cuda.SOFTMAX_PARAMS + ("kSoftmaxHeader",)),
        ("SoftmaxSlot", _cuda.SOFTMAX_SLOTS + ("kSoftmaxSlots",)),
    ],
)
def test_params_blocks_match_the_source(enum, names):
    assert enum_names(SOURCE.read_text(), enum) == names


def test_tile_constants_match_the_source():
    source = SOURCE.read_text()
    for name, value in (
        ("kThreads", _cuda.BLOCK_THREADS),
        ("kBlockQ", _cuda.BLOCK_Q),
        ("kBlockV", _cuda.BLOCK_V),
    ):
        assert re.search(rf"constexpr int {name} = {value};", source), name


def test_source_ships_as_package_data_and_includes_nothing():
    text = _cuda.kernel_source()  # through importlib.resources, as installed
    assert text == SOURCE.read_text()
    # NVRTC has no host headers; an include would only work where a toolkit happens to be.
    assert not re.search(r"^\s*#\s*include", text, re.M)
    for name in _cuda.KERNELS:
        base = name.split("<")[0].split("::")[-1]
        assert f"{base}(" in text, name


def _wrapper(tmp_path: Path) -> Path:
    instances = ",\n".join(f"    (void*)&{name}" for name in _cuda.KERNELS)
    wrapper = tmp_path / "instances.cu"
    wrapper.write_text(
        f'#include "{SOURCE}"\n\n'
        "// Every instance fastattn._cuda launches (its KERNELS), so each one is compiled.\n"
        "extern void* const fastattn_kernels[];\n"
        f"void* const fastattn_kernels[] = {{\n{instances}\n}};\n"
    )
    return wrapper


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_nvcc_compiles_every_instance(tmp_path):
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHES]
    # Unoptimised device code: a third of the time, and every stage still runs (C++ front
    # end, PTX generation, ptxas with its shared-memory and register checks). NVRTC's test
    # below and CuPy compile optimised.
    cmd = [
        "nvcc",
        "-std=c++17",
        *gencode,
        "--threads",
        str(len(ARCHES)),
        "-Xcicc",
        "-O0",
        "-Xptxas",
        "-O0",
        "-Werror",
        "all-warnings",
        "-c",
        str(_wrapper(tmp_path)),
        "-o",
        str(tmp_path / "instances.o"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"


# --------------------------------------------------------------------------------------
# NVRTC, as CuPy uses it


def _find_nvrtc() -> str | None:
    candidates = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
    for cuda in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if cuda:
            candidates += sorted(glob.glob(os.path.join(cuda, "lib64", "libnvrtc.so*")))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    candidates = [c for c in candidates if "builtins" not in c and ".alt." not in c]
    return candidates[0] if candidates else None


NVRTC = _find_nvrtc()


def _nvrtc_compile(lib, source: str, options: list, names: tuple) -> dict:
    """Compile like cupy.RawModule(code=..., options=..., name_expressions=...): returns
    {name expression: lowered name}; raises with NVRTC's log on failure."""
    prog = ctypes.c_void_p()

    def check(rc, what):
        if rc:
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise AssertionError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}")

    check(
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"attention.cu", 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        for name in names:
            check(lib.nvrtcAddNameExpression(prog, name.encode()), "nvrtcAddNameExpression")
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        assert rc == 0, f"NVRTC {options}:\n{log.value.decode(errors='replace')}"
        lowered = {}
        for name in names:
            out = ctypes.c_char_p()
            check(
                lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out)),
                f"nvrtcGetLoweredName({name})",
            )
            lowered[name] = out.value.decode()
        return lowered
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC library (pip install nvidia-cuda-nvrtc)")
def test_nvrtc_compiles_the_source_as_cupy_does():
    # NVRTC loads its builtins library by name: load it from the same folder first.
    folder = os.path.dirname(NVRTC)
    for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*"))):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(NVRTC)
    options = [*_cuda.COMPILE_OPTIONS, "-ftz=true", "-arch=compute_80"]  # CuPy adds -ftz
    lowered = _nvrtc_compile(lib, _cuda.kernel_source(), options, _cuda.KERNELS)
    assert len(set(lowered.values())) == len(_cuda.KERNELS)
    assert all(name.startswith("_Z") for name in lowered.values())

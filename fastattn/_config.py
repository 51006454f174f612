"""fastattn.show_config: what this build is and what it runs with."""

from __future__ import annotations

import platform
import sys
from typing import TextIO

from fastattn import _core, _cuda, _threads


def config() -> dict[str, str]:
    """The facts :func:`show_config` prints, as a dict."""
    return {
        "fastattn": _core.version,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "compiler": _core.compiler,
        "openmp": str(_core.openmp_version),
        "isa": _core.active_isa(),
        "isas_available": ", ".join(_core.available_isas()),
        "isas_compiled": ", ".join(_core.compiled_isas()),
        # bfloat16 is widened to float32 by every ISA's kernels; vdpbf16ps is not used yet.
        "avx512_bf16": (
            "supported by this CPU (not used: bfloat16 is widened to float32)"
            if _core.cpu_has_avx512_bf16()
            else "not supported by this CPU"
        ),
        "num_threads": str(_threads.get_num_threads()),
        "cuda": _cuda.describe(),  # CuPy's version and the device, when it sees a GPU
    }


def show_config(file: TextIO | None = None) -> None:
    """Print fastattn's version, ISA, threads, OpenMP, compiler and the CUDA path.

    >>> import fastattn
    >>> fastattn.show_config()  # doctest: +ELLIPSIS
    fastattn: ...
    """
    for name, value in config().items():
        print(f"{name}: {value}", file=file or sys.stdout)

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
        # The avx512bf16 ISA runs bfloat16 SDPA with vdpbf16ps; every other ISA widens.
        "avx512_bf16": _avx512_bf16_line(),
        "bf16_dot_peak": _bf16_dot_peak_line(),
        # aarch64: what the CPU reports, and which of it the kernels use (the neon ISA:
        # asimd; neon_bf16: bf16 too; fp16, i8mm, sve are named for reports from Arm machines).
        "arm_features": _arm_features_line(),
        "num_threads": str(_threads.get_num_threads()),
        "cuda": _cuda.describe(),  # CuPy's version and the device, when it sees a GPU
    }


def _avx512_bf16_line() -> str:
    if not _core.cpu_has_avx512_bf16():
        return "not supported by this CPU"
    if "avx512bf16" not in _core.compiled_isas():
        return "supported by this CPU (not compiled into this build: bfloat16 is widened)"
    if _core.active_isa() == "avx512bf16":
        return "supported by this CPU (used: bfloat16 SDPA runs vdpbf16ps)"
    return f"supported by this CPU (not used by ISA {_core.active_isa()}: bfloat16 is widened)"


# The bfloat16 dot-product ISAs and the instruction each runs bfloat16 SDPA's products with.
_BF16_DOT = {"avx512bf16": "vdpbf16ps", "neon_bf16": "BFDOT"}


def _arm_features_line() -> str:
    features = _core.arm_features()
    if not features:
        return "none (not an Arm CPU)"
    isa = _core.active_isa()
    used = ["asimd"] if isa in ("neon", "neon_bf16") else []
    line = ", ".join(features)
    if isa == "neon_bf16":
        used.append("bf16 (bfloat16 SDPA runs BFDOT)")
    line += f"; used by ISA {isa}: " + (", ".join(used) or "none")
    if "bf16" in features and isa != "neon_bf16":
        line += "; bf16 not used (bfloat16 is widened)"
    return line


def _bf16_dot_peak_line() -> str:
    # Not measured here (show_config is instant): fastattn-bench measures and reports it.
    isa = _core.active_isa()
    if isa in _BF16_DOT:
        return (
            f"available (fastattn._core.bf16_dot_peak(): {_BF16_DOT[isa]} GFLOP/s; "
            "fastattn-bench's bfloat16 % peak)"
        )
    return (
        f"not available on ISA {isa} (no bfloat16 dot product: bfloat16 is widened, its "
        "% peak is against the float32 FMA peak)"
    )


def show_config(file: TextIO | None = None) -> None:
    """Print fastattn's version, ISA, threads, OpenMP, compiler and the CUDA path.

    >>> import fastattn
    >>> fastattn.show_config()  # doctest: +ELLIPSIS
    fastattn: ...
    """
    for name, value in config().items():
        print(f"{name}: {value}", file=file or sys.stdout)

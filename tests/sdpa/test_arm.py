"""The ISAs and CPU features an aarch64 build has (run by the ARM job, tools/ci-arm.sh, under
qemu-user), and what an x86 build says about Arm features (nothing)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

import fastattn

ARM = platform.machine().lower() in ("aarch64", "arm64")


@pytest.mark.skipif(not ARM, reason="an aarch64 build's ISAs")
def test_aarch64_build_has_the_neon_isas_and_picks_the_best():
    # neon_bf16 is compiled where the compiler takes -march=armv8.2-a+bf16 (GCC >= 10, clang
    # >= 11, the ARM job's GCC 12 among them).
    assert fastattn._core.compiled_isas() == ["scalar", "baseline", "neon", "neon_bf16"]
    features = fastattn._core.arm_features()
    # Every Armv8-A CPU has Advanced SIMD: neon is available; neon_bf16 where the CPU reports
    # FEAT_BF16 (qemu's default "max" CPU does); the best is the last.
    want = ["scalar", "baseline", "neon"] + (["neon_bf16"] if "bf16" in features else [])
    assert fastattn._core.available_isas() == want
    assert "asimd" in features
    line = fastattn._config.config()["arm_features"]
    assert line.startswith(", ".join(features) + "; used by ISA ")
    isa = fastattn._core.active_isa()
    if isa in ("neon", "neon_bf16"):
        assert f"used by ISA {isa}: asimd" in line
    assert ("bf16 (bfloat16 SDPA runs BFDOT)" in line) == (isa == "neon_bf16")


@pytest.mark.skipif(not ARM, reason="an aarch64 build's ISAs")
@pytest.mark.parametrize("name", ["neon", "neon_bf16"])
def test_neon_isas_can_be_forced_and_named(name):
    if name not in fastattn._core.available_isas():
        with pytest.raises(ValueError, match=f"FASTATTN_ISA='{name}' is compiled in but this CPU"):
            fastattn._core.set_isa(name)
        return
    previous = fastattn._core.active_isa()
    try:
        fastattn._core.set_isa(name)
        assert fastattn._core.active_isa() == name
        assert fastattn._config.config()["isa"] == name
    finally:
        fastattn._core.set_isa(previous)


@pytest.mark.skipif(
    not (ARM and os.environ.get("FASTATTN_ARM_QEMU")), reason="qemu-user's CPU models (ARM job)"
)
def test_a_cpu_without_bf16_gets_neon():
    """The feature detection's other side, on qemu's cortex-a72 (Armv8.0-A: no FEAT_BF16,
    whose BFDOT would be an illegal instruction): no neon_bf16, neon is the default, and
    FASTATTN_ISA=neon_bf16 is a clear error at import."""
    env = {**os.environ, "QEMU_CPU": "cortex-a72"}
    env.pop("FASTATTN_ISA", None)
    code = (
        "import fastattn; c = fastattn._core; "
        "print(' '.join(c.arm_features()), '|', ' '.join(c.available_isas()), '|', "
        "c.active_isa(), '|', fastattn._config.config()['arm_features'])"
    )
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    features, available, active, line = (x.strip() for x in run.stdout.split("|"))
    assert "bf16" not in features.split() and "asimd" in features.split()
    assert available.split() == ["scalar", "baseline", "neon"] and active == "neon"
    assert line.endswith("used by ISA neon: asimd")
    env["FASTATTN_ISA"] = "neon_bf16"
    run = subprocess.run([sys.executable, "-c", "import fastattn"], env=env, capture_output=True)
    assert run.returncode != 0
    assert b"FASTATTN_ISA='neon_bf16' is compiled in but this CPU" in run.stderr


@pytest.mark.skipif(ARM, reason="an x86 build's report")
def test_off_arm_no_arm_features_and_no_neon():
    assert fastattn._core.arm_features() == []
    assert fastattn._config.config()["arm_features"].startswith("none")
    for name in ("neon", "neon_bf16"):
        with pytest.raises(ValueError, match=f"FASTATTN_ISA='{name}' is not one of"):
            fastattn._core.set_isa(name)

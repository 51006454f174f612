"""The ISAs and CPU features an aarch64 build has (run by the ARM job, tools/ci-arm.sh, under
qemu-user), and what an x86 build says about Arm features (nothing)."""

from __future__ import annotations

import platform

import pytest

import fastattn

ARM = platform.machine().lower() in ("aarch64", "arm64")


@pytest.mark.skipif(not ARM, reason="an aarch64 build's ISAs")
def test_aarch64_build_has_the_neon_isa_and_picks_it():
    assert fastattn._core.compiled_isas() == ["scalar", "baseline", "neon"]
    # Every Armv8-A CPU has Advanced SIMD: neon is available and the best (last) one.
    assert fastattn._core.available_isas() == ["scalar", "baseline", "neon"]
    assert "asimd" in fastattn._core.arm_features()
    assert fastattn._config.config()["arm_features"].split(", ") == fastattn._core.arm_features()


@pytest.mark.skipif(not ARM, reason="an aarch64 build's ISAs")
def test_neon_can_be_forced_and_named():
    previous = fastattn._core.active_isa()
    try:
        fastattn._core.set_isa("neon")
        assert fastattn._core.active_isa() == "neon"
        assert fastattn._config.config()["isa"] == "neon"
    finally:
        fastattn._core.set_isa(previous)


@pytest.mark.skipif(ARM, reason="an x86 build's report")
def test_off_arm_no_arm_features_and_no_neon():
    assert fastattn._core.arm_features() == []
    assert fastattn._config.config()["arm_features"].startswith("none")
    with pytest.raises(ValueError, match="FASTATTN_ISA='neon' is not one of"):
        fastattn._core.set_isa("neon")

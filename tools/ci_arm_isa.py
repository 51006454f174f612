"""pytest plugin of the ARM job (tools/ci-arm.sh, loaded with ``-p ci_arm_isa``): which
ISA meets which test under emulation.

Tests that take the ``isa`` fixture (or ``sdpa_impl``: fastattn on each ISA, then the NumPy
reference) run every available ISA in one process; every other test runs under the active
ISA (``FASTATTN_ISA``, or the best one: ``neon`` on aarch64).

Full profile (``FASTATTN_ISA`` set, one pytest run per ISA): each run keeps only its own
ISA's case of the ISA-parametrised tests (and the reference's in every run), and every
other test, which runs under the ISA the run forces. Each test then meets each ISA once.

Quick profile (``FASTATTN_ISA`` unset, one run; ``FASTATTN_ARM_OTHER_ISAS`` names the other
ISAs and ``FASTATTN_ARM_OTHER_ISA_PATHS`` the test paths where they are kept): every test
runs under the default ISA, and the ISA-parametrised cases of the other ISAs are kept only
under those paths (a path written ``ISA=path`` keeps that ISA's cases only: the widening
``neon`` under the bfloat16 tests, where it differs from ``neon_bf16``). A case is judged by
its parametrisation, so a test added later is selected by the same rule, whatever its name.
"""

from __future__ import annotations

import os


def _case_isa(item, isa: str) -> str | None:
    """The ISA an item's parametrisation names, or ``isa`` where it names none."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return isa
    params = callspec.params
    if "isa" in params:
        return params["isa"]
    if "sdpa_impl" in params:
        name = params["sdpa_impl"][1]
        return isa if name is None else name
    return isa


def _under(nodeid: str, isa: str | None, paths: list[str]) -> bool:
    path = nodeid.split("::", 1)[0]
    for entry in paths:
        only, _, p = entry.rpartition("=")
        if only and only != isa:
            continue
        if path == p or path.startswith(p.rstrip("/") + "/"):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    isa = os.environ.get("FASTATTN_ISA", "").strip().lower()
    if isa:
        keep = [item for item in items if _case_isa(item, isa) == isa]
    else:
        others = os.environ.get("FASTATTN_ARM_OTHER_ISAS", "").split()
        paths = os.environ.get("FASTATTN_ARM_OTHER_ISA_PATHS", "").split()
        keep = [
            item
            for item in items
            if (case := _case_isa(item, "")) not in others or _under(item.nodeid, case, paths)
        ]
    if len(keep) < len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
        items[:] = keep

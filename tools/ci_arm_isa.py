"""pytest plugin of the ARM job (tools/ci-arm.sh, loaded with ``-p ci_arm_isa``).

The job runs the tests once per ARM ISA with ``FASTATTN_ISA`` set. The tests that take the
``isa`` fixture (or ``sdpa_impl``, fastattn on each ISA) already run every available ISA in
one process, so each run keeps only the case of its own ISA (and the NumPy reference's in
every run); every other test runs under the ISA the run forces. Each test then meets each
ISA once, without the fixture's cases running three times over under emulation.
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


def pytest_collection_modifyitems(config, items):
    isa = os.environ.get("FASTATTN_ISA", "").strip().lower()
    if not isa:
        return
    keep, drop = [], []
    for item in items:
        (keep if _case_isa(item, isa) == isa else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

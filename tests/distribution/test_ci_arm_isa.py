"""The ARM job's test selection (tools/ci_arm_isa.py, the pytest plugin tools/ci-arm.sh
loads under qemu): which ISA meets which test in its full and quick profiles."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from helpers import REPO

spec = importlib.util.spec_from_file_location("ci_arm_isa", REPO / "tools" / "ci_arm_isa.py")
ci_arm_isa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci_arm_isa)


def _item(nodeid, **params):
    item = SimpleNamespace(nodeid=nodeid)
    if params:
        item.callspec = SimpleNamespace(params=params)
    return item


ITEMS = [
    _item("tests/sdpa/test_a.py::test_plain"),
    _item("tests/sdpa/test_a.py::test_k[isa=scalar]", isa="scalar"),
    _item("tests/sdpa/test_a.py::test_k[isa=neon]", isa="neon"),
    _item("tests/sdpa/test_a.py::test_i[fastattn-baseline]", sdpa_impl=(None, "baseline")),
    _item("tests/sdpa/test_a.py::test_i[reference]", sdpa_impl=(None, None)),
    _item("tests/sdpa/test_a.py::test_n[3]", n=3),
    _item("tests/family/test_b.py::test_k[isa=scalar]", isa="scalar"),
    _item("tests/family/test_b.py::test_k[isa=baseline]", isa="baseline"),
    _item("tests/family/test_b.py::test_k[isa=neon]", isa="neon"),
    _item("tests/sdpa_extra/test_c.py::test_k[isa=scalar]", isa="scalar"),
]


def _select(monkeypatch, env):
    for name in ("FASTATTN_ISA", "FASTATTN_ARM_OTHER_ISAS", "FASTATTN_ARM_OTHER_ISA_PATHS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    deselected = []
    config = SimpleNamespace(
        hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items))
    )
    items = list(ITEMS)
    ci_arm_isa.pytest_collection_modifyitems(config, items)
    assert sorted(map(id, items + deselected)) == sorted(map(id, ITEMS))
    return [i.nodeid.split("::", 1)[1] if "sdpa/" in i.nodeid else i.nodeid for i in items]


def test_full_profile_keeps_its_own_isa_and_every_unparametrised_test(monkeypatch):
    kept = _select(monkeypatch, {"FASTATTN_ISA": "baseline"})
    assert kept == [
        "test_plain",
        "test_i[fastattn-baseline]",
        "test_i[reference]",
        "test_n[3]",
        "tests/family/test_b.py::test_k[isa=baseline]",
    ]


@pytest.mark.parametrize("paths", ["tests/sdpa", "tests/sdpa/"])
def test_quick_profile_keeps_the_other_isas_under_their_paths_only(monkeypatch, paths):
    env = {"FASTATTN_ARM_OTHER_ISAS": "scalar baseline", "FASTATTN_ARM_OTHER_ISA_PATHS": paths}
    kept = _select(monkeypatch, env)
    assert kept == [
        "test_plain",
        "test_k[isa=scalar]",
        "test_k[isa=neon]",
        "test_i[fastattn-baseline]",
        "test_i[reference]",
        "test_n[3]",
        "tests/family/test_b.py::test_k[isa=neon]",
    ]


def test_without_other_isas_every_test_is_kept(monkeypatch):
    assert len(_select(monkeypatch, {})) == len(ITEMS)

"""Shared test configuration: hypothesis profiles and the per-ISA fixture.

Hypothesis profiles: "default" (used unless HYPOTHESIS_PROFILE names another) and "ci";
both run about 40 examples per property with no per-example deadline (the first call on a
fresh thread pool, or a large drawn shape on the scalar ISA, can take a while).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import fastattn

settings.register_profile("default", max_examples=40, deadline=None)
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

ISAS = fastattn._core.available_isas()


@pytest.fixture(params=ISAS, ids=[f"isa={name}" for name in ISAS])
def isa(request):
    """Run the test with each instruction set this CPU supports, then restore the previous."""
    previous = fastattn._core.active_isa()
    fastattn._core.set_isa(request.param)
    assert fastattn._core.active_isa() == request.param
    try:
        yield request.param
    finally:
        fastattn._core.set_isa(previous)


IMPLS = [(fastattn.scaled_dot_product_attention, name) for name in ISAS] + [
    (fastattn.reference.scaled_dot_product_attention, None)
]


@pytest.fixture(
    params=IMPLS, ids=[f"fastattn-{name}" if name else "reference" for _, name in IMPLS]
)
def sdpa_impl(request):
    """fastattn's scaled_dot_product_attention on each ISA, then the NumPy reference: for
    properties both must have."""
    fn, name = request.param
    previous = fastattn._core.active_isa()
    if name is not None:
        fastattn._core.set_isa(name)
    try:
        yield fn
    finally:
        fastattn._core.set_isa(previous)

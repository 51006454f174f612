"""The SDPA fast path is called positionally (CPython turns a call with sixteen keywords into
a fresh dict and names tuple on every call), so nothing but these tests would notice two of
its arguments trading places: they hold the call site in fastattn/_sdpa.py, the stub in
_core.pyi and the binding's own names to one order."""

from __future__ import annotations

import ast
import inspect
import pathlib

import numpy as np
import pytest

import fastattn
from fastattn import _core, _sdpa


def _stub_order() -> list[str]:
    stub = pathlib.Path(fastattn.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "sdpa_fast"]
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def _call_site_order() -> list[str]:
    calls = [
        node
        for node in ast.walk(ast.parse(inspect.getsource(_sdpa)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "sdpa_fast"
    ]
    assert len(calls) == 1, "one call of _core.sdpa_fast expected in fastattn/_sdpa.py"
    (call,) = calls
    assert not call.keywords
    assert all(isinstance(a, ast.Name) for a in call.args), "pass the parameters by name"
    return [a.id for a in call.args]


def test_call_site_passes_the_stub_order():
    assert _call_site_order() == _stub_order()


def test_stub_order_is_the_public_signature():
    # Every argument of the fast path is the public function's parameter of that name.
    public = inspect.signature(fastattn.scaled_dot_product_attention).parameters
    assert set(_stub_order()) <= set(public)


def _args(rng):
    q = rng.standard_normal((1, 4, 5, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 7, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 7, 6)).astype(np.float32)
    # Every option the fast path takes away from its default, so that a slot read for
    # another would change the result or make the core decline the call; the options it
    # declines (masks, window, softcap, out, extra results) at their defaults.
    return {
        "query": q,
        "key": k,
        "value": v,
        "attn_mask": None,
        "valid_lens": None,
        "is_causal": True,
        "causal_alignment": "bottom_right",
        "window": None,
        "scale": 0.37,
        "softcap": None,
        "return_lse": False,
        "return_weights": False,
        "out": None,
        "num_threads": 1,
        "sinks": rng.standard_normal(4).astype(np.float32),
        "alibi_slopes": rng.uniform(0.1, 0.9, 4).astype(np.float32),
    }


def test_binding_reads_the_stub_order():
    rng = np.random.default_rng(7)
    args = _args(rng)
    assert set(args) == set(_stub_order())
    by_name = _core.sdpa_fast(**args)  # the binding maps names to its own slots
    by_position = _core.sdpa_fast(*(args[n] for n in _stub_order()))
    assert by_name is not None and by_position is not None
    np.testing.assert_array_equal(by_name, by_position)
    np.testing.assert_array_equal(by_name, fastattn.scaled_dot_product_attention(**args))


_OTHER = {
    "is_causal": False,
    "causal_alignment": "top_left",
    "scale": 0.11,
    "sinks": np.full(4, -3.0, np.float32),
    "alibi_slopes": np.full(4, 0.05, np.float32),
}


@pytest.mark.parametrize("name", sorted(_OTHER))
def test_each_option_reaches_its_slot(name):
    # Changing one option by name changes the answer: the slot is read, not ignored.
    args = _args(np.random.default_rng(11))
    a, b = _core.sdpa_fast(**args), _core.sdpa_fast(**{**args, name: _OTHER[name]})
    assert a is not None and b is not None
    assert not np.array_equal(a, b)


@pytest.mark.parametrize(
    "name, value",
    [("window", (2, None)), ("softcap", 5.0), ("return_lse", True), ("return_weights", True)],
)
def test_declined_options_decline_by_position_too(name, value):
    # The full path computes these: the core declines the call both ways.
    args = {**_args(np.random.default_rng(3)), name: value}
    assert _core.sdpa_fast(**args) is None
    assert _core.sdpa_fast(*(args[n] for n in _stub_order())) is None

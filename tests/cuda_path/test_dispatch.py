"""How the public functions choose the CUDA path, without a GPU or CuPy.

CuPy is faked: a stub module in ``sys.modules["cupy"]`` whose ``ndarray`` is a small
class living in "cupy" that only carries a shape, a dtype and (for valid_lens, the one
argument whose values are checked) a host copy of its data. Nothing here launches a
kernel: validation refuses the bad calls before any device work.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import fastattn
from fastattn import _cuda


class FakeDeviceArray:
    """Shape and dtype of a device array (plus the data, for valid_lens)."""

    def __init__(self, data):
        self.data_host = np.asarray(data)
        self.shape = self.data_host.shape
        self.dtype = self.data_host.dtype
        self.ndim = self.data_host.ndim
        self.strides = self.data_host.strides
        self.itemsize = self.data_host.itemsize


FakeDeviceArray.__module__ = "cupy"


def _stub_cupy() -> types.ModuleType:
    module = types.ModuleType("cupy")
    module.ndarray = FakeDeviceArray
    module.asarray = FakeDeviceArray
    module.asnumpy = lambda a: a.data_host
    module.may_share_memory = lambda a, b: False
    return module


@pytest.fixture
def stub_cupy(monkeypatch):
    module = _stub_cupy()
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def test_numpy_calls_never_import_cupy(tmp_path):
    """A 'cupy' that fails on import sits first on the path: NumPy calls must not touch it
    (a fresh interpreter, so no other test's import counts)."""
    trap = tmp_path / "cupy"
    trap.mkdir()
    (trap / "__init__.py").write_text("raise ImportError('fastattn imported cupy')\n")
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import fastattn
        rng = np.random.default_rng(0)
        q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
        fastattn.scaled_dot_product_attention(q, q, q, valid_lens=np.array([3, 5]),
                                              return_lse=True)
        fastattn.masked_softmax(q, np.array([1, 2]))
        w = rng.standard_normal((4, 6)).astype(np.float32)
        fastattn.additive_attention(q, q, q, w, w, w[0])
        assert "cupy" not in sys.modules, "cupy was imported"
        print("ok")
    """)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
        cwd=os.path.dirname(__file__),
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_uses_gpu_needs_cupy_imported(monkeypatch):
    fake = FakeDeviceArray(np.zeros((2, 3)))
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    assert not _cuda.uses_gpu(fake, np.zeros(3))  # no cupy imported: no CuPy array exists
    monkeypatch.setitem(sys.modules, "cupy", _stub_cupy())
    assert _cuda.uses_gpu(np.zeros(3), None, fake)
    assert not _cuda.uses_gpu(np.zeros(3), None, [1.0], 2.0)


F32 = np.float32


def _arrays(*shapes, dtype=F32):
    return [np.ones(s, dtype) for s in shapes]


@pytest.mark.parametrize("position", ["query", "key", "value", "attn_mask", "valid_lens"])
def test_mixing_numpy_and_cupy_is_a_type_error(stub_cupy, position):
    args = {
        "query": np.ones((2, 4, 3), F32),
        "key": np.ones((2, 5, 3), F32),
        "value": np.ones((2, 5, 3), F32),
        "attn_mask": np.ones((4, 5), bool),
        "valid_lens": np.array([3, 5]),
    }
    on_device = {n: FakeDeviceArray(a) for n, a in args.items()}
    call = dict(on_device)
    call[position] = args[position]  # the one host array among device arrays
    with pytest.raises(TypeError, match=rf"{position} is a numpy.ndarray but .*CuPy arr"):
        fastattn.scaled_dot_product_attention(
            call["query"],
            call["key"],
            call["value"],
            call["attn_mask"],
            valid_lens=call["valid_lens"],
        )
    # and the other way round: one device array among host arrays
    call = dict(args)
    call[position] = on_device[position]
    with pytest.raises(TypeError, match="numpy.ndarray but"):
        fastattn.scaled_dot_product_attention(
            call["query"],
            call["key"],
            call["value"],
            call["attn_mask"],
            valid_lens=call["valid_lens"],
        )


def test_mixing_in_the_family_and_out(stub_cupy):
    dev = FakeDeviceArray
    x = np.ones((2, 3, 4), F32)
    with pytest.raises(TypeError, match="mask is a numpy.ndarray"):
        fastattn.masked_softmax(dev(x), mask=np.ones(4, bool))
    with pytest.raises(TypeError, match="x is a numpy.ndarray"):
        fastattn.masked_softmax(x, dev(np.array([1, 2])))
    q, k, v = _arrays((3, 4), (5, 2), (5, 2))
    w = _arrays((4, 6), (2, 6), (6,))
    with pytest.raises(TypeError, match="w_k is a numpy.ndarray"):
        fastattn.additive_attention(dev(q), dev(k), dev(v), dev(w[0]), w[1], dev(w[2]))
    with pytest.raises(TypeError, match="out must be a cupy.ndarray"):
        fastattn.scaled_dot_product_attention(dev(q), dev(q), dev(q), out=np.empty((3, 4)))
    with pytest.raises(TypeError, match="out must be a cupy.ndarray"):
        fastattn.masked_softmax(dev(x), out=[0.0])


# The validation layer is the CPU path's: the same calls give the same errors, word for word.
SDPA_BAD = [
    ({"shapes": ((2, 12, 5, 4), (2, 8, 6, 4), (2, 8, 6, 4))}, ValueError),  # GQA heads
    ({"shapes": ((5, 4), (6, 3), (6, 3))}, ValueError),  # features
    ({"shapes": ((5, 4), (6, 4), (7, 4))}, ValueError),  # positions
    ({"shapes": ((3, 5, 4), (2, 6, 4), (2, 6, 4))}, ValueError),  # heads
    ({"shapes": ((5, 0), (6, 0), (6, 3))}, ValueError),  # E = 0
    ({"shapes": ((4,), (6, 4), (6, 4))}, ValueError),  # 1-D query
    ({"dtype": np.int32}, TypeError),
    ({"dtype": np.complex64}, TypeError),
    ({"attn_mask": np.ones((3, 6), bool)}, ValueError),
    ({"attn_mask": np.ones((5, 6), np.int8)}, TypeError),
    ({"attn_mask": np.ones((2, 1, 5, 6), F32)}, ValueError),  # more dims than the scores
    ({"valid_lens": np.array([7])}, ValueError),  # > Lk: values are checked
    ({"valid_lens": np.array([-1])}, ValueError),
    ({"valid_lens": np.array([1.5])}, TypeError),
    ({"valid_lens": np.ones((2, 2), int)}, ValueError),
    ({"is_causal": 1}, TypeError),
    ({"causal_alignment": "bottom"}, ValueError),
    ({"window": (1,)}, ValueError),
    ({"window": (-1, 2)}, ValueError),
    ({"window": (1.5, 2)}, TypeError),
    ({"scale": float("nan")}, ValueError),
    ({"scale": "1"}, TypeError),
    ({"scale": 1e300, "dtype": np.float16}, ValueError),
    ({"softcap": 0.0}, ValueError),
    ({"return_lse": "yes"}, TypeError),
    ({"return_weights": None}, TypeError),
    ({"num_threads": 0}, ValueError),
    ({"out": np.empty((5, 3), F32)}, ValueError),
    ({"out": np.empty((5, 4), np.float64)}, ValueError),
    (
        {"out": np.lib.stride_tricks.as_strided(np.empty(4, F32), (5, 4), (0, 4))},
        ValueError,
    ),  # overlapping elements
]


def _sdpa_call(case, device: bool):
    case = dict(case)
    shapes = case.pop("shapes", ((5, 4), (6, 4), (6, 4)))
    dtype = case.pop("dtype", F32)
    q, k, v = _arrays(*shapes, dtype=dtype)
    wrap = FakeDeviceArray if device else (lambda a: a)
    kwargs = {n: wrap(a) if isinstance(a, np.ndarray) else a for n, a in case.items()}
    return lambda: fastattn.scaled_dot_product_attention(wrap(q), wrap(k), wrap(v), **kwargs)


def _same_error(cpu, gpu, exc):
    with pytest.raises(exc) as expected:
        cpu()
    with pytest.raises(exc) as got:
        gpu()
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize(("case", "exc"), SDPA_BAD, ids=[str(i) for i in range(len(SDPA_BAD))])
def test_sdpa_errors_match_the_cpu_path(stub_cupy, case, exc):
    _same_error(_sdpa_call(case, False), _sdpa_call(case, True), exc)


SOFTMAX_BAD = [
    ({"axis": 3}, ValueError),
    ({"axis": 1.0}, TypeError),
    ({"mask": np.ones(4, np.int8)}, TypeError),
    ({"mask": np.ones(5, bool)}, ValueError),
    ({"valid_lens": np.array([1.0])}, TypeError),
    ({"valid_lens": np.array([5, 1])}, ValueError),
    ({"valid_lens": np.ones((3,), int)}, ValueError),
    ({"out": np.empty((2, 3, 4))}, ValueError),
    ({"num_threads": 1.5}, TypeError),
]


@pytest.mark.parametrize(
    ("case", "exc"), SOFTMAX_BAD, ids=[str(i) for i in range(len(SOFTMAX_BAD))]
)
def test_masked_softmax_errors_match_the_cpu_path(stub_cupy, case, exc):
    x = np.zeros((2, 3, 4), F32)

    def call(wrap):
        kwargs = {n: wrap(a) if isinstance(a, np.ndarray) else a for n, a in case.items()}
        return lambda: fastattn.masked_softmax(wrap(x), **kwargs)

    _same_error(call(lambda a: a), call(FakeDeviceArray), exc)


ADDITIVE_BAD = [
    ({"w_q": np.ones((3, 6), F32)}, ValueError),  # Dq mismatch
    ({"w_k": np.ones((2, 5), F32)}, ValueError),  # hidden mismatch
    ({"w_v": np.ones((6, 1), F32)}, ValueError),
    ({"w_v": np.ones(6, np.int64)}, TypeError),
    ({"attn_mask": np.ones((4, 4), bool)}, ValueError),
    ({"valid_lens": np.array([9])}, ValueError),
    ({"window": "left"}, ValueError),
    ({"out": np.empty((3, 2), np.float64)}, ValueError),
]


@pytest.mark.parametrize(
    ("case", "exc"), ADDITIVE_BAD, ids=[str(i) for i in range(len(ADDITIVE_BAD))]
)
def test_additive_errors_match_the_cpu_path(stub_cupy, case, exc):
    q, k, v = _arrays((3, 4), (5, 2), (5, 2))
    weights = {"w_q": np.ones((4, 6), F32), "w_k": np.ones((2, 6), F32), "w_v": np.ones(6, F32)}
    case = dict(case)
    for name in weights:
        weights[name] = case.pop(name, weights[name])

    def call(wrap):
        kwargs = {n: wrap(a) if isinstance(a, np.ndarray) else a for n, a in case.items()}
        return lambda: fastattn.additive_attention(
            wrap(q), wrap(k), wrap(v), *(wrap(w) for w in weights.values()), **kwargs
        )

    _same_error(call(lambda a: a), call(FakeDeviceArray), exc)


def test_standins_carry_shape_and_dtype_only():
    """What the validation layer sees of a device array: a NumPy array of its shape and
    dtype, with no data of its own (zero strides over one element)."""
    a = FakeDeviceArray(np.ones((2, 3, 4), np.float16))
    s = _cuda.standin(a)
    assert s.shape == (2, 3, 4) and s.dtype == np.float16 and s.strides == (0, 0, 0)
    assert _cuda.standin(a, np.float32).dtype == np.float32


def test_out_standin_has_the_layout_of_out():
    base = np.zeros((4, 6, 8), np.float32)
    for out in (
        base,
        base[:, ::2, ::-1],
        base.transpose(2, 0, 1),
        base[1:2, :0],
        np.broadcast_to(base[:1], (3, 6, 8)),
    ):
        s = _cuda.out_standin(FakeDeviceArray(out) if out.size else out)
        assert (s.shape, s.dtype) == (out.shape, out.dtype)
        if out.size:
            assert s.strides == out.strides and s.flags.writeable
            s[...] = 1  # in bounds of its own buffer


def test_group_offsets():
    """Element offsets of the leading axes of views (reversed, transposed, broadcast)
    relative to the view's first element."""
    base = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    for view in (
        base,
        base[:, ::-1],
        base.transpose(1, 0, 2),
        np.broadcast_to(base[:1], (5, 3, 4)),
        base[1:, 1::2],
    ):
        strides = tuple(s // view.itemsize for s in view.strides)
        off = _cuda.group_offsets(view.shape[:2], strides[:2])
        first = (
            view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        ) // base.itemsize
        np.testing.assert_array_equal(base.ravel()[first + off], view[..., 0])


def test_show_config_reports_the_cuda_path(capsys):
    fastattn.show_config()
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert lines["cuda"] == _cuda.describe()
    if importlib.util.find_spec("cupy") is None:
        assert lines["cuda"].startswith("not available (CuPy is not installed")

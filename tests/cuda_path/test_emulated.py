"""The CUDA path without a GPU: its host side and its kernels, run on the CPU.

``cuda_emulator`` compiles ``fastattn/cuda/attention.cu`` as host C++ (threads as fibers
with real barriers, see ``cuda_emulation.h``) and drives fastattn's CUDA pipeline
(validation, layouts, params blocks, launches) with NumPy arrays in place of CuPy ones.
The cases and tolerances are the CPU suite's (``sdpa.test_properties``,
``family.test_masked_softmax``, ``family.test_additive_attention``), through the same
``cuda_checks.DeviceRunner`` the GPU tests use. This shows the kernels' logic (tiling,
online softmax, masks, strides, float16 conversions, barriers) is right; it says nothing
about NVRTC, CuPy or the GPU's memory model -- those need ``pytest -m gpu`` on a GPU.
"""

from __future__ import annotations

import functools
import sys
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import fastattn
from fastattn import _cuda, reference

from family import test_additive_attention as additive_tests
from family import test_masked_softmax as softmax_tests
from helpers import cuda_emulator
from helpers.cuda_checks import (
    DeviceRunner,
    check_additive,
    check_additive_case,
    check_sdpa,
    check_sdpa_empty_rows,
    check_sdpa_out,
    check_sdpa_spec,
    check_softmax_case,
)
from helpers.family_checks import DTYPES
from helpers.family_checks import build as family_build
from sdpa import test_properties as sdpa_tests

pytestmark = pytest.mark.skipif(
    cuda_emulator.compiler() is None, reason="no C++ compiler to build the kernel emulation"
)


def examples(factor: float = 1.0):
    return settings(
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        max_examples=max(1, round(settings.default.max_examples * factor)),
    )


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    return cuda_emulator.build(tmp_path_factory.mktemp("cuda_emulation"))


@pytest.fixture
def launches():
    return []


@pytest.fixture
def run(emulator, launches):
    be = cuda_emulator.backend(emulator, launches)
    return DeviceRunner(
        xp=np,
        to_host=np.asarray,
        sdpa_fn=functools.partial(_cuda.sdpa_forward, be),
        softmax_fn=functools.partial(_cuda.softmax_forward, be),
        additive_fn=functools.partial(_cuda.additive_forward, be),
    )


# --------------------------------------------------------------------------------------
# scaled_dot_product_attention


@examples(1.0)
@given(spec=sdpa_tests.specs())
def test_sdpa_matches_reference(run, spec):
    """Shapes, broadcasting, GQA, dtypes (float16 too), layouts, masks, lse/weights."""
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(0.5)
@given(spec=sdpa_tests.specs(masks="always"))
def test_sdpa_with_masks(run, spec):
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(0.5)
@given(spec=sdpa_tests.specs(masks="never", big=True))
def test_sdpa_several_tiles(run, spec):
    """Lq, Lk of 60..150: several query tiles, key tiles and value-column chunks."""
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(0.25)
@given(spec=sdpa_tests.specs(decode=True))
def test_sdpa_decode(run, spec):
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(0.5)
@given(spec=sdpa_tests.specs(huge=True))
def test_sdpa_huge_logits(run, spec):
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(0.5)
@given(spec=sdpa_tests.specs_with_empty_rows())
def test_sdpa_fully_masked_rows(run, spec):
    check_sdpa_empty_rows(run, spec, sdpa_tests.build_with_empty_rows)


@pytest.mark.parametrize("layout", ["c", "strided"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sdpa_out(run, layout, dtype):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 21, 9)).astype(dtype)
    k = rng.standard_normal((2, 2, 40, 9)).astype(dtype)
    v = rng.standard_normal((2, 2, 40, 70)).astype(dtype)
    check_sdpa_out(run, q, k, v, {"is_causal": True, "causal_alignment": "bottom_right"}, layout)


def test_sdpa_nan_handling(run):
    """NaN in an attended key: the row is NaN; NaN values of keys a row does not attend
    (masked, past valid_lens, outside the causal band) never reach it."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 6, 4))
    k = rng.standard_normal((2, 9, 4))
    v = rng.standard_normal((2, 9, 3))
    k[0, 2, 1] = np.nan  # batch 0: rows that attend key 2 are NaN
    v[1, 7:] = np.nan  # batch 1: past valid_lens
    v[0, 8] = np.nan  # batch 0: key 8 only visible to nobody (causal, Lq = 6)
    got, expected = check_sdpa(
        run, q, k, v, {"valid_lens": np.array([9, 7]), "is_causal": True}, True, True
    )
    assert np.isnan(got[0][0, 2:]).all() and np.isfinite(got[0][0, :2]).all()
    assert np.isfinite(got[0][1]).all()


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_sdpa_nonfinite_key_under_neginf_is_removed(run, poison):
    """A -inf float-mask entry removes its key as False does (docs/semantics.md#float-mask):
    a NaN/inf key row reaches only the rows whose mask keeps it."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 6, 4))
    k = rng.standard_normal((2, 9, 4))
    v = rng.standard_normal((2, 9, 3))
    k[:, 5, 2] = poison
    fmask = rng.standard_normal((6, 9))
    fmask[:4, 5] = -np.inf  # rows 0-3 hide key 5, rows 4-5 keep it
    got, _ = check_sdpa(run, q, k, v, {"attn_mask": fmask}, True, True)
    assert np.isfinite(got[0][:, :4]).all()


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 0, 4), (2, 5, 4), (2, 5, 3)),  # no queries
        ((2, 6, 4), (2, 0, 4), (2, 0, 3)),  # no keys: zeros, lse -inf
        ((2, 6, 4), (2, 5, 4), (2, 5, 0)),  # no value features
        ((0, 2, 6, 4), (0, 1, 5, 4), (0, 1, 5, 3)),  # no batch
    ],
)
def test_sdpa_empty_dimensions(run, shapes, launches):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    check_sdpa(run, q, k, v, {}, True, True)
    assert len(launches) == (0 if 0 in shapes[0] else 1)  # no launch when no row exists


def test_sdpa_launch_arguments(run, launches):
    """What CuPy would be handed: the kernel's name expression (one of KERNELS), a grid
    that covers every (group, query tile, value chunk), 128 threads, and Python ints and
    floats only (pointers, then scale and softcap)."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((3, 4, 40, 8)).astype(np.float16)
    k = rng.standard_normal((3, 2, 50, 8)).astype(np.float16)
    v = rng.standard_normal((3, 2, 50, 100)).astype(np.float16)
    run.sdpa(q, k, v, softcap=5.0)
    ((name, grid, block, args),) = launches
    assert name == _cuda.attention_kernel(np.float16, False) and name in _cuda.KERNELS
    assert "half_t, fastattn_cuda::half_t, float, false" in name
    assert grid == 3 * 4 * 3 * 2 and block == _cuda.BLOCK_THREADS  # groups, q tiles, v chunks
    assert all(type(a) is int for a in args[:-2]) and args[-2:] == (1 / np.sqrt(8), 5.0)
    assert all(a == 0 for a in args[3:7]) and all(a == 0 for a in args[8:10])  # no masks etc.


def test_sdpa_broadcast_inputs(run):
    """A stride-0 (broadcast) key and a batch of one broadcasting against the query's."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((4, 2, 7, 5))
    k = np.broadcast_to(rng.standard_normal((1, 2, 9, 5)), (4, 2, 9, 5))
    v = rng.standard_normal((1, 2, 9, 3))
    check_sdpa(run, q, k, v, {}, False, False)


# --------------------------------------------------------------------------------------
# masked_softmax and additive_attention


@examples(0.75)
@given(case=softmax_tests.cases())
def test_masked_softmax_matches_reference(run, case):
    check_softmax_case(run, case, softmax_tests.build)


@examples(0.25)
@given(case=softmax_tests.cases(huge=True))
def test_masked_softmax_huge_logits(run, case):
    check_softmax_case(run, case, softmax_tests.build)


def test_masked_softmax_special_rows(run):
    x = np.array(
        [
            [1.0, 2.0, 3.0, np.nan],
            [-np.inf, -np.inf, 5.0, 6.0],
            [1.0, np.nan, 2.0, 3.0],
            [1.0, np.inf, 2.0, 3.0],
            [1e30, -1e30, 0.0, 1.0],
            [-np.inf, -np.inf, -np.inf, -np.inf],
        ],
        np.float32,
    )
    vl = np.array([3, 2, 4, 4, 4, 4])
    got = run.softmax(x, vl)
    np.testing.assert_allclose(got, reference.masked_softmax(x, vl), atol=1e-6)
    np.testing.assert_array_equal(got[1], 0.0)
    np.testing.assert_array_equal(got[5], 0.0)
    assert np.isnan(got[2]).all() and np.isnan(got[3]).all()
    np.testing.assert_array_equal(got[4], [1.0, 0.0, 0.0, 0.0])


@examples(0.75)
@given(case=additive_tests.additive_cases())
def test_additive_matches_reference(run, case):
    check_additive_case(run, case, family_build, additive_tests.make_weights, DTYPES)


@examples(0.5)
@given(case=additive_tests.additive_cases(masks="always"))
def test_additive_with_masks(run, case):
    check_additive_case(run, case, family_build, additive_tests.make_weights, DTYPES)


def test_additive_long_keys(run):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 40, 16)).astype(np.float32)
    k = rng.standard_normal((1, 300, 16)).astype(np.float32)
    v = rng.standard_normal((1, 300, 8)).astype(np.float32)
    w = additive_tests.make_weights(8, 16, 16, 40)
    check_additive(
        run, q, k, v, *w, is_causal=True, causal_alignment="bottom_right", return_weights=True
    )


# --------------------------------------------------------------------------------------
# The public functions route CuPy arrays here (CuPy faked: a NumPy subclass whose type
# lives in "cupy", and the emulator as the backend)


class FakeCupyArray(np.ndarray):
    pass


FakeCupyArray.__module__ = "cupy"


@pytest.fixture
def fake_cupy(monkeypatch, emulator):
    module = types.ModuleType("cupy")
    module.ndarray = FakeCupyArray
    module.asarray = lambda a: np.asarray(a).view(FakeCupyArray)
    monkeypatch.setitem(sys.modules, "cupy", module)
    monkeypatch.setattr(_cuda, "_cupy_backend", lambda: cuda_emulator.backend(emulator))
    return module


def test_public_functions_route_device_arrays(fake_cupy):
    rng = np.random.default_rng(8)
    dev = fake_cupy.asarray
    q = rng.standard_normal((2, 2, 9, 4)).astype(np.float32)
    k = rng.standard_normal((2, 1, 11, 4)).astype(np.float32)
    v = rng.standard_normal((2, 1, 11, 3)).astype(np.float32)
    mask = rng.random((9, 11)) < 0.7
    kwargs = {
        "valid_lens": np.array([11, 6]),
        "is_causal": True,
        "causal_alignment": "bottom_right",
        "window": (4, None),
        "softcap": 3.0,
        "scale": 0.7,
    }
    got = fastattn.scaled_dot_product_attention(
        dev(q),
        dev(k),
        dev(v),
        dev(mask),
        return_lse=True,
        return_weights=True,
        **{n: dev(a) if isinstance(a, np.ndarray) else a for n, a in kwargs.items()},
    )
    expected = reference.scaled_dot_product_attention(
        q, k, v, mask, return_lse=True, return_weights=True, **kwargs
    )
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=1e-5)

    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    got = fastattn.masked_softmax(dev(x), dev(np.array([1, 7, 0])), mask=dev(mask[:5, :7]), axis=-1)
    expected = reference.masked_softmax(x, np.array([1, 7, 0]), mask=mask[:5, :7])
    np.testing.assert_allclose(got, expected, atol=1e-6)

    w = additive_tests.make_weights(9, 4, 4, 6)
    out = dev(np.full((2, 2, 9, 3), np.nan, np.float32))
    got = fastattn.additive_attention(
        dev(q),
        dev(k),
        dev(v),
        *map(dev, w),
        dev(mask),
        valid_lens=dev(np.array([11, 6])),
        window=(2, 3),
        out=out,
    )
    assert got is out
    expected = reference.additive_attention(
        q, k, v, *w, mask, valid_lens=np.array([11, 6]), window=(2, 3)
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)

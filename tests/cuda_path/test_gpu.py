"""The CUDA path on a GPU: CuPy arrays in, CuPy arrays out, against ``fastattn.reference``.

Run with ``pytest -m gpu`` on a machine with CuPy and a CUDA GPU; skipped elsewhere. The
cases and tolerances are the CPU suite's (``sdpa.test_properties``, ``family.test_masked_softmax``,
``family.test_additive_attention``); ``cuda_checks.DeviceRunner`` copies each NumPy input to the
device keeping its exact layout (strided, transposed, reversed, broadcast), calls the
public function, checks the results are CuPy arrays (``out=`` returned as given) and
compares them on the host.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import fastattn
from fastattn import _cuda, reference

from family import test_additive_attention as additive_tests
from family import test_masked_softmax as softmax_tests
from helpers.cuda_checks import (
    DeviceRunner,
    check_additive,
    check_additive_case,
    check_sdpa,
    check_sdpa_empty_rows,
    check_sdpa_out,
    check_sdpa_spec,
    check_softmax_case,
    to_device,
)
from helpers.family_checks import DTYPES
from helpers.family_checks import build as family_build
from sdpa import test_properties as sdpa_tests

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cupy

        HAVE_GPU = bool(cupy.is_available())
except Exception:  # not installed, or its CUDA libraries are missing
    cupy = None
    HAVE_GPU = False

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not HAVE_GPU, reason="needs CuPy and a CUDA GPU (cupy is not importable or sees no GPU)"
    ),
]


def examples(factor: float = 1.0):
    return settings(
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        max_examples=max(1, round(settings.default.max_examples * factor)),
    )


@pytest.fixture(scope="module")
def run():
    return DeviceRunner(
        xp=cupy,
        to_host=cupy.asnumpy,
        sdpa_fn=fastattn.scaled_dot_product_attention,
        softmax_fn=fastattn.masked_softmax,
        additive_fn=fastattn.additive_attention,
    )


def dev(a):
    return to_device(cupy, cupy.asnumpy, a)


# --------------------------------------------------------------------------------------
# scaled_dot_product_attention: the CPU suite's cases


@examples(4.0)
@given(spec=sdpa_tests.specs())
def test_sdpa_matches_reference(run, spec):
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(2.0)
@given(spec=sdpa_tests.specs(masks="always"))
def test_sdpa_with_masks(run, spec):
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(1.0)
@given(spec=sdpa_tests.specs(masks="never", big=True))
def test_sdpa_several_tiles(run, spec):
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(0.5)
@given(spec=sdpa_tests.specs(decode=True))
def test_sdpa_decode(run, spec):
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(1.0)
@given(spec=sdpa_tests.specs(huge=True))
def test_sdpa_huge_logits(run, spec):
    check_sdpa_spec(run, spec, sdpa_tests.build)


@examples(1.0)
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


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sdpa_long_sequences(run, dtype):
    """Many key tiles, several query tiles and value chunks, GQA, head dim 128."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 4, 300, 128)).astype(dtype)
    k = rng.standard_normal((2, 2, 1000, 128)).astype(dtype)
    v = rng.standard_normal((2, 2, 1000, 96)).astype(dtype)
    check_sdpa(
        run,
        q,
        k,
        v,
        {"is_causal": True, "causal_alignment": "bottom_right", "window": (500, None)},
        True,
        False,
    )


def test_sdpa_no_score_matrix():
    """L = 8192, one head: the Lq x Lk float32 scores would take 256 MiB; the kernel's
    allocations are the output and the params block."""
    rng = np.random.default_rng(3)
    q = cupy.asarray(rng.standard_normal((1, 8192, 64), dtype=np.float32))
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    before = pool.used_bytes()
    out = fastattn.scaled_dot_product_attention(q, q, q, is_causal=True)
    cupy.cuda.Device().synchronize()
    assert pool.used_bytes() - before < 8 * 2**20
    assert bool(cupy.isfinite(out).all())


def test_sdpa_on_the_current_stream():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((3, 50, 16), dtype=np.float32) for _ in range(3))
    expected = reference.scaled_dot_product_attention(q, k, v)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        dq, dk, dv = (cupy.asarray(a) for a in (q, k, v))
        out = fastattn.scaled_dot_product_attention(dq, dk, dv)
        host = cupy.asnumpy(out, stream=stream)
    stream.synchronize()
    np.testing.assert_allclose(host, expected, atol=1e-5)


def test_kernels_compiled_once_per_device():
    x = cupy.ones((2, 8), cupy.float32)
    fastattn.masked_softmax(x)
    device = cupy.cuda.runtime.getDevice()
    module = _cuda._modules[device]
    fastattn.masked_softmax(x, cupy.asarray([3, 5]))
    fastattn.scaled_dot_product_attention(x, x, x)
    assert _cuda._modules[device] is module


def test_mixing_numpy_and_cupy_is_a_type_error():
    q = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="query is a numpy.ndarray but key, value are CuPy"):
        fastattn.scaled_dot_product_attention(q, cupy.asarray(q), cupy.asarray(q))
    with pytest.raises(TypeError, match="out must be a cupy.ndarray"):
        fastattn.masked_softmax(cupy.asarray(q), out=np.empty_like(q))


def test_lists_and_scalars_are_moved_to_the_device():
    q = cupy.asarray(np.random.default_rng(5).standard_normal((2, 4, 3)))
    out = fastattn.scaled_dot_product_attention(q, q, q, valid_lens=[2, 4])
    expected = reference.scaled_dot_product_attention(*(cupy.asnumpy(q),) * 3, valid_lens=[2, 4])
    np.testing.assert_allclose(cupy.asnumpy(out), expected, atol=1e-12)


def test_errors_match_the_cpu_path():
    q = np.ones((2, 12, 5, 4), np.float32)
    k = np.ones((2, 8, 6, 4), np.float32)
    with pytest.raises(ValueError) as cpu:
        fastattn.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError) as gpu:
        fastattn.scaled_dot_product_attention(dev(q), dev(k), dev(k))
    assert str(gpu.value) == str(cpu.value)


# --------------------------------------------------------------------------------------
# masked_softmax and additive_attention


@examples(2.0)
@given(case=softmax_tests.cases())
def test_masked_softmax_matches_reference(run, case):
    check_softmax_case(run, case, softmax_tests.build)


@examples(0.5)
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
        ],
        np.float32,
    )
    vl = np.array([3, 2, 4, 4, 4])
    got = run.softmax(x, vl)
    np.testing.assert_allclose(got, reference.masked_softmax(x, vl), atol=1e-6)
    np.testing.assert_array_equal(got[1], 0.0)
    assert np.isnan(got[2]).all() and np.isnan(got[3]).all()
    np.testing.assert_array_equal(got[4], [1.0, 0.0, 0.0, 0.0])


@examples(1.5)
@given(case=additive_tests.additive_cases())
def test_additive_matches_reference(run, case):
    check_additive_case(run, case, family_build, additive_tests.make_weights, DTYPES)


@examples(0.75)
@given(case=additive_tests.additive_cases(masks="always"))
def test_additive_with_masks(run, case):
    check_additive_case(run, case, family_build, additive_tests.make_weights, DTYPES)


def test_additive_long_keys(run):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 40, 16)).astype(np.float32)
    k = rng.standard_normal((1, 600, 16)).astype(np.float32)
    v = rng.standard_normal((1, 600, 8)).astype(np.float32)
    w = additive_tests.make_weights(8, 16, 16, 24)
    check_additive(
        run, q, k, v, *w, is_causal=True, causal_alignment="bottom_right", return_weights=True
    )


def test_show_config_names_the_device(capsys):
    fastattn.show_config()
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert lines["cuda"].startswith(f"CuPy {cupy.__version__}, device ")

"""A Cython module built in the test that cimports fastattn.capi: a greedy-decode-style
loop (each step's output is the next step's query, the KV cache grows by one key per step)
run for every sequence in parallel in a prange with the GIL released, matching the Python
API bit for bit; and bad calls returning an error status with a message."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn

from helpers.capi_build import build_cython_module

pytest.importorskip("Cython")

SOURCE = r"""
# cython: boundscheck=False, wraparound=False, freethreading_compatible=True
from cython.parallel cimport prange
cimport fastattn.capi as fa

fa.import_fastattn()


def decode(const fa.real[:, :, :, :] q0, const fa.real[:, :, :, :] k_cache,
           const fa.real[:, :, :, :] v_cache, fa.real[:, :, :, :] outs, int[:] status,
           double scale, int steps):
    # outs (batch * steps, heads, 1, dim): step t of sequence b is row b * steps + t
    cdef Py_ssize_t b, t, r
    for b in prange(q0.shape[0], nogil=True, num_threads=2, schedule="static", chunksize=1):
        for t in range(steps):
            r = b * steps + t
            if t == 0:
                status[r] = fa.sdpa(q0[b:b + 1], k_cache[b:b + 1, :, :t + 1],
                                    v_cache[b:b + 1, :, :t + 1], outs[r:r + 1], scale,
                                    True, t)
            else:
                status[r] = fa.sdpa(outs[r - 1:r], k_cache[b:b + 1, :, :t + 1],
                                    v_cache[b:b + 1, :, :t + 1], outs[r:r + 1], scale,
                                    True, t)


def call(const fa.real[:, :, :, :] q, const fa.real[:, :, :, :] k,
         const fa.real[:, :, :, :] v, fa.real[:, :, :, :] out, double scale, int num_threads):
    cdef char msg[200]
    cdef int status
    with nogil:
        status = fa.sdpa(q, k, v, out, scale, False, 0, num_threads, msg, sizeof(msg))
    return status, (msg.decode() if status else "")


def merge(const fa.real[:, :, :, :, :] outputs, const fa.real[:, :, :, :] lses,
          fa.real[:, :, :, :] out, fa.real[:, :, :] lse, int num_threads):
    cdef char msg[200]
    cdef int status
    with nogil:
        status = fa.merge_attention_states(outputs, lses, out, lse, num_threads, msg,
                                           sizeof(msg))
    return status, (msg.decode() if status else "")


def softmax(const fa.real[:, :, :, :] x, fa.real[:, :, :, :] out,
            const unsigned char[:, :, :, :] mask):
    cdef char msg[200]
    cdef int status
    with nogil:
        status = fa.masked_softmax(x, out, mask, 1, msg, sizeof(msg))
    return status, (msg.decode() if status else "")
"""


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return build_cython_module("capi_decode", SOURCE, tmp_path_factory.mktemp("cython"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decode_loop_in_prange_matches_python_api(module, isa, dtype):
    rng = np.random.default_rng(0)
    batch, heads, dim, steps = 4, 2, 32, 12
    q0 = rng.standard_normal((batch, heads, 1, dim)).astype(dtype)
    k_cache = rng.standard_normal((batch, heads, steps, dim)).astype(dtype)
    v_cache = rng.standard_normal((batch, heads, steps, dim)).astype(dtype)
    outs = np.full((batch * steps, heads, 1, dim), np.nan, dtype)
    status = np.full(batch * steps, -1, np.intc)
    module.decode(q0, k_cache, v_cache, outs, status, 0.2, steps)
    assert (status == 0).all()
    for b in range(batch):
        q = q0[b : b + 1]
        for t in range(steps):
            q = fastattn.scaled_dot_product_attention(
                q,
                k_cache[b : b + 1, :, : t + 1],
                v_cache[b : b + 1, :, : t + 1],
                scale=0.2,
                is_causal=True,
                causal_alignment="bottom_right",
            )
            np.testing.assert_array_equal(outs[b * steps + t], q[0])


def test_bad_calls_return_an_error_status(module):
    q = np.zeros((1, 2, 3, 8))
    k = np.zeros((1, 2, 4, 8))
    out = np.full((1, 2, 3, 8), 5.0)
    assert module.call(q, k, k, out, 1.0, 1) == (0, "")
    assert module.call(q, k, k[:, :, :3], out, 1.0, 1) == (
        1,
        "fastattn._core.sdpa: key and value heads/lengths differ",
    )
    out[:] = 5.0
    assert module.call(q, k, k[:, :, ::-1], out, 1.0, 1) == (
        1,
        "fastattn C API sdpa: v has a negative stride",
    )
    assert module.call(q, k, k, out, 1.0, 0) == (1, "fastattn._core.sdpa: num_threads must be >= 1")
    assert module.call(q, k[..., ::2], k, out, 1.0, 1)[1] == (
        "fastattn._core.sdpa: key and query head dims differ"
    )
    assert module.call(q[..., ::2], k[..., ::2], k, out, 1.0, 1)[1] == (
        "fastattn._core.sdpa: query must have a unit-stride last axis"
    )
    assert (out == 5.0).all()


def test_masked_softmax(module):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    mask = rng.random(x.shape) < 0.5
    out = np.full_like(x, np.nan)
    assert module.softmax(x, out, mask.view(np.uint8)) == (0, "")
    np.testing.assert_array_equal(out, fastattn.masked_softmax(x, mask=mask))
    assert module.softmax(x, out[:, :, :, :4], mask.view(np.uint8))[0] == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merge_attention_states_matches_python_api(module, isa, dtype):
    rng = np.random.default_rng(2)
    outputs = rng.standard_normal((3, 2, 4, 6, 16)).astype(dtype)[..., ::2, :]  # strided rows
    lses = rng.standard_normal((3, 2, 4, 6)).astype(dtype)[..., ::2]
    lses[1, 0, 0] = -np.inf
    out = np.full((2, 4, 3, 16), np.nan, dtype)
    lse = np.full((2, 4, 3), np.nan, dtype)
    assert module.merge(outputs, lses, out, lse, 2) == (0, "")
    want, want_lse = fastattn.merge_attention_states(list(outputs), list(lses))
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    out[:] = 5.0
    assert module.merge(outputs, lses[:2], out, lse, 1) == (
        1,
        "fastattn.capi merge_attention_states: outputs and lses stack different numbers of parts",
    )
    assert module.merge(outputs[:0], lses[:0], out, lse, 1) == (
        1,
        "fastattn C API merge_attention_states: num_parts must be >= 1",
    )
    assert module.merge(outputs, lses, out, lse[:, :2], 1) == (
        1,
        "fastattn._core.merge_states: lse has the wrong shape",
    )
    assert (out == 5.0).all()

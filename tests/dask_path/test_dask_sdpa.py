"""scaled_dot_product_attention and merge_attention_states on Dask arrays: lazy Dask arrays
out, equal to the NumPy call on the computed inputs (and to the float64 reference), for
random chunkings of every axis, with keys chunked under causal / window / valid_lens, GQA,
float16/32/64; on the threaded scheduler and on a LocalCluster of worker processes.

Tolerance: with one key chunk a block runs the same kernel on a slice of the rows, and
with several the partial states are merged (``merge_attention_states``), which rounds
differently from one pass over all the keys: a few ulps of the compute dtype per merged
part on O(1) values, so ``64 * eps`` absolute plus the same relative. float16 is computed
in float32 (partial states too) and rounded once at the end, as the NumPy call does, so
the two differ by at most one float16 ulp: ``2**-9``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

EPS = {np.float32: 2.0**-24, np.float64: 2.0**-53}
TOL = {np.float16: 2.0**-9, np.float32: 64 * EPS[np.float32], np.float64: 64 * EPS[np.float64]}
# Against the float64 reference: the dtype's own rounding of O(1) results, with margin.
REF_TOL = {np.float16: 4e-3, np.float32: 2.0**-10, np.float64: 1e-10}
fixture_ok = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _close(got, want, dtype, reference_check=False):
    dtype = np.dtype(dtype).type
    tol = REF_TOL[dtype] if reference_check else TOL[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _chunking(draw, n: int) -> tuple:
    """A random chunking of an axis of length n (n >= 1)."""
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=3)) if n > 1 else ())
    bounds = [0, *[c for c in cuts if 0 < c < n], n]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]) if b > a)


@st.composite
def sdpa_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    b = draw(st.integers(1, 3))
    hkv = draw(st.sampled_from([1, 2]))
    hq = hkv * draw(st.sampled_from([1, 2, 3]))
    lq, lk = draw(st.integers(1, 24)), draw(st.integers(1, 40))
    e, ev = draw(st.sampled_from([4, 8])), draw(st.sampled_from([3, 8]))
    q = rng.standard_normal((b, hq, lq, e)).astype(dtype)
    k = rng.standard_normal((b, hkv, lk, e)).astype(dtype)
    v = rng.standard_normal((b, hkv, lk, ev)).astype(dtype)
    kw = {
        "is_causal": draw(st.booleans()),
        "causal_alignment": draw(st.sampled_from(["top_left", "bottom_right"])),
    }
    if draw(st.booleans()):
        kw["window"] = (draw(st.sampled_from([None, 0, 3])), draw(st.sampled_from([None, 0, 5])))
    lens_kind = draw(st.sampled_from([None, "batch", "row", "dask"]))
    if lens_kind == "batch":
        kw["valid_lens"] = rng.integers(0, lk + 1, (b,))
    elif lens_kind in ("row", "dask"):
        kw["valid_lens"] = rng.integers(0, lk + 1, (b, hq, lq))
    mask_kind = draw(st.sampled_from([None, "bool", "float"]))
    if mask_kind == "bool":
        kw["attn_mask"] = rng.random((1, hq, lq, lk)) < 0.7
    elif mask_kind == "float":
        kw["attn_mask"] = rng.standard_normal((lq, lk)).astype(dtype)
    chunks = {
        "q": (_chunking(draw, b), _chunking(draw, hq), _chunking(draw, lq), (e,)),
        "k": (_chunking(draw, b), _chunking(draw, hkv), _chunking(draw, lk), (e,)),
        "v": (b, hkv, _chunking(draw, lk), draw(st.sampled_from([ev, 2]))),
    }
    weights = draw(st.booleans())
    return q, k, v, kw, chunks, lens_kind == "dask", weights


def _run(case, scheduler):
    q, k, v, kw, chunks, lens_dask, weights = case
    dq = da.from_array(q, chunks=chunks["q"])
    dk = da.from_array(k, chunks=chunks["k"])
    dv = da.from_array(v, chunks=chunks["v"])
    dkw = dict(kw)
    if lens_dask:
        dkw["valid_lens"] = da.from_array(kw["valid_lens"], chunks=(1, 1, 5))
    if "attn_mask" in kw and kw["attn_mask"].ndim == 4:
        dkw["attn_mask"] = da.from_array(kw["attn_mask"], chunks=(1, 1, 7, 9))
    lazy = fastattn.scaled_dot_product_attention(
        dq, dk, dv, return_lse=True, return_weights=weights, **dkw
    )
    assert all(isinstance(x, da.Array) for x in lazy)
    got, got_lse, *got_w = dask.compute(*lazy, scheduler=scheduler)
    want, want_lse, *want_w = fastattn.scaled_dot_product_attention(
        q, k, v, return_lse=True, return_weights=weights, **kw
    )
    if weights:  # each block's weights rescaled by exp(lse_block - lse): a few ulps
        assert got_w[0].shape == want_w[0].shape and got_w[0].dtype == want_w[0].dtype
        _close(got_w[0], want_w[0], q.dtype)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got_lse.shape == want_lse.shape and got_lse.dtype == want_lse.dtype
    _close(got, want, q.dtype)
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    _close(got_lse[finite], want_lse[finite], q.dtype)
    ref = reference.scaled_dot_product_attention(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), **kw
    )
    _close(got, ref, q.dtype, reference_check=True)


@fixture_ok
@given(case=sdpa_cases())
def test_sdpa_threaded_random_chunkings(case, isa):
    _run(case, "threads")


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=sdpa_cases())
def test_sdpa_distributed_random_chunkings(case, client):
    _run(case, client)


def test_long_keys_chunked_causal_skips_blocks(client):
    """Bottom-right causal over 8 key chunks: exact, and the blocks past the diagonal are
    not in the graph."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 64, 16)).astype(np.float32)
    k = rng.standard_normal((2, 256, 16)).astype(np.float32)
    v = rng.standard_normal((2, 256, 16)).astype(np.float32)
    dq, dk, dv = (da.from_array(x, chunks=(1, 32, 16)) for x in (q, k, v))
    out = fastattn.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    lazy = fastattn.scaled_dot_product_attention(
        dq, dk, dv, is_causal=True, causal_alignment="bottom_right"
    )
    want = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    _close(client.compute(out).result(), want, np.float32)
    want = fastattn.scaled_dot_product_attention(
        q, k, v, is_causal=True, causal_alignment="bottom_right"
    )
    _close(client.compute(lazy).result(), want, np.float32)
    parts = lambda x: sum(  # noqa: E731
        1
        for key in dict(x.__dask_graph__())
        if "parts" in str(key[0]) and key[-1] not in ("empty",) and "merge" not in key
    )
    # top-left: query rows 0..63 see keys 0..63 only: 2 query chunks x (1 + 2) key chunks.
    assert parts(out) == 2 * 3
    # bottom-right: query chunk 0 sees keys up to 223 (7 chunks), chunk 1 all 8.
    assert parts(lazy) == 2 * (7 + 8)


def test_float_mask_neginf_removes_nonfinite_keys(isa):
    """A -inf float-mask entry removes its key as False does (docs/semantics.md#float-mask),
    chunk by chunk as on NumPy: NaN keys under -inf reach no row."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 96, 16)).astype(np.float32)
    k = rng.standard_normal((2, 160, 16)).astype(np.float32)
    v = rng.standard_normal((2, 160, 16)).astype(np.float32)
    k[:, 100:110] = np.nan
    fmask = rng.standard_normal((96, 160)).astype(np.float32)
    fmask[:, 100:110] = -np.inf
    fmask[60:, :] = -np.inf  # rows that keep nothing: 0
    want = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=fmask, is_causal=True)
    assert np.isfinite(want).all()
    got = fastattn.scaled_dot_product_attention(
        da.from_array(q, chunks=(1, 32, 16)),
        da.from_array(k, chunks=(1, 64, 16)),
        da.from_array(v, chunks=(1, 64, 16)),
        attn_mask=da.from_array(fmask, chunks=(32, 64)),
        is_causal=True,
    ).compute(scheduler="threads")
    assert np.isfinite(got).all()
    clean = k.copy()
    clean[:, 100:110] = 0
    ref = reference.scaled_dot_product_attention(q, clean, v, attn_mask=fmask, is_causal=True)
    _close(got, ref, np.float32, reference_check=True)


def test_merge_attention_states_on_dask(client):
    rng = np.random.default_rng(1)
    outs = [rng.standard_normal((3, 20, 8)) for _ in range(3)]
    lses = [rng.normal(0, 5, (3, 20)) for _ in range(3)]
    lses[1][0] = -np.inf
    d_out = [da.from_array(o, chunks=(2, 7, 4)) for o in outs]
    d_lse = [da.from_array(x, chunks=(1, 20)) for x in lses]
    got, got_lse = fastattn.merge_attention_states(d_out, d_lse)
    assert isinstance(got, da.Array)
    got, got_lse = dask.compute(got, got_lse, scheduler=client)
    want, want_lse = fastattn.merge_attention_states(outs, lses)
    _close(got, want, np.float64)
    _close(got_lse, want_lse, np.float64)


def test_errors():
    q = da.zeros((2, 4, 8), chunks=2)
    with pytest.raises(
        TypeError, match=r"key is a numpy.ndarray, not a Dask array: pass all of query, key, value"
    ):
        fastattn.scaled_dot_product_attention(q, np.zeros((2, 4, 8)), q)
    with pytest.raises(TypeError, match="out= is not supported for Dask arrays"):
        fastattn.scaled_dot_product_attention(q, q, q, out=np.zeros((2, 4, 8)))
    with pytest.raises(ValueError, match="value has 5 positions"):
        fastattn.scaled_dot_product_attention(q, q, da.zeros((2, 5, 8)))
    # A Dask valid_lens' values are checked in its tasks, with the CPU path's message.
    bad = fastattn.scaled_dot_product_attention(q, q, q, valid_lens=da.from_array(np.array([1, 9])))
    with pytest.raises(ValueError, match=r"valid_lens must lie in \[0, 4\]"):
        bad.compute(scheduler="sync")


def test_numpy_calls_do_not_import_dask(tmp_path):
    """Dask is imported only when the caller passed a Dask array. (The child runs outside
    the checkout, whose uncompiled fastattn/ folder Python would import first.)"""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, fastattn; x = np.ones((2, 3, 4));"
        "fastattn.scaled_dot_product_attention(x, x, x, valid_lens=np.array([1, 2]));"
        "fastattn.masked_softmax(x); assert 'dask' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_worker_killed_mid_computation(client, tmp_path):
    """A worker process dies while the graph runs (once: a file flag guards it); the
    cluster's nanny restarts it, Dask reruns the lost tasks, and the result is still
    right."""
    import os

    flag = str(tmp_path / "killed")
    test_process = os.getpid()

    def kill_once(block):  # nested: pickled by value into the worker
        if os.getpid() != test_process and block.size and not os.path.exists(flag):
            with open(flag, "w"):
                pass
            os._exit(1)
        return block

    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 2, 48, 8))
    k = rng.standard_normal((2, 1, 96, 8))
    v = rng.standard_normal((2, 1, 96, 8))
    dq = da.from_array(q, chunks=(1, 1, 16, 8))
    dk = da.from_array(k, chunks=(1, 1, 24, 8)).map_blocks(kill_once, meta=k[:0, :0, :0, :0])
    dv = da.from_array(v, chunks=(1, 1, 24, 8))
    out, lse = fastattn.scaled_dot_product_attention(
        dq, dk, dv, is_causal=True, causal_alignment="bottom_right", return_lse=True
    )
    got, got_lse = client.compute([out, lse], sync=True)
    assert os.path.exists(flag)  # the kill happened
    want, want_lse = fastattn.scaled_dot_product_attention(
        q, k, v, is_causal=True, causal_alignment="bottom_right", return_lse=True
    )
    _close(got, want, np.float64)
    _close(got_lse, want_lse, np.float64)


def test_task_threads_do_not_oversubscribe(client):
    """Inside a task: num_threads= when given; else fastattn's default over the tasks that
    run beside it (a single-threaded worker process, started with OMP_NUM_THREADS=1 by its
    nanny: 1; elsewhere the fastattn blocks running in this process at that moment)."""
    import threading

    from fastattn._dask import _block, task_threads

    assert client.submit(task_threads, None, pure=False).result() == 1
    assert client.submit(task_threads, 3, pure=False).result() == 3
    default = fastattn.get_num_threads()
    counted = _block(task_threads)
    # A lone block gets all the threads on every local scheduler, main thread or not
    # (it got default // cpu_count in the threaded pool, and from a worker thread).
    assert dask.delayed(counted)(None).compute(scheduler="threads") == default
    assert dask.delayed(counted)(None).compute(scheduler="sync") == default
    from_thread = []
    worker = threading.Thread(
        target=lambda: from_thread.append(dask.delayed(counted)(None).compute(scheduler="sync"))
    )
    worker.start()
    worker.join()
    assert from_thread == [default]
    # Blocks running at once share them.
    barrier = threading.Barrier(3)

    @_block
    def together():
        barrier.wait()  # all three blocks are running now
        got = task_threads(None)
        barrier.wait()  # none leaves before all have counted
        return got

    got = dask.compute(
        *[dask.delayed(together)(pure=False) for _ in range(3)], scheduler="threads", num_workers=3
    )
    assert list(got) == [max(1, default // 3)] * 3
    with pytest.raises(ValueError, match="num_threads"):
        fastattn.scaled_dot_product_attention(*(da.ones((2, 3, 4)),) * 3, num_threads=0)

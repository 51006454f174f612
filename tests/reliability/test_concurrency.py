"""Concurrency: many Python threads calling every public function at once (each call
releases the GIL and runs its own OpenMP team), calls from concurrent.futures pools, and
processes made by os.fork() -- directly, through multiprocessing's "fork" context, and while
another thread of the parent is inside a kernel -- that then call fastattn.

Every concurrent result must equal, bit for bit, the same call made alone with the same
thread count; and results are bit-identical for any thread count, on every ISA
(docs/semantics.md#determinism; test_results_do_not_depend_on_the_thread_count).
A forked child runs single-threaded (GNU OpenMP's pool does not survive fork();
fastattn/_threads.py); the fork tests run in a subprocess with a timeout so a hang fails the
test instead of stalling the suite.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import subprocess
import sys
import sysconfig
import textwrap
import threading

import numpy as np
import pytest

import fastattn

from helpers import TESTS

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def calls():
    """One call of every public function (a few variants each), on fixed random inputs:
    name -> zero-argument function taking ``num_threads``."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 4, 33, 16), dtype=np.float32)
    k = rng.standard_normal((2, 2, 70, 16), dtype=np.float32)
    v = rng.standard_normal((2, 2, 70, 8), dtype=np.float32)
    mask = rng.random((2, 1, 33, 70)) < 0.8
    vl = rng.integers(0, 71, size=(2, 4))
    x = rng.standard_normal((3, 40, 57))
    w_q = rng.standard_normal((16, 12), dtype=np.float32)
    w_k = rng.standard_normal((16, 12), dtype=np.float32)
    w_v = rng.standard_normal(12, dtype=np.float32)
    weight = rng.standard_normal((16, 16), dtype=np.float32) / 4
    xq, xk = rng.standard_normal((50, 2)), rng.standard_normal((300, 2))
    y = rng.standard_normal((300, 3))
    layer = fastattn.MultiHeadAttention(32, 4, num_kv_heads=2, seed=3)
    seq = rng.standard_normal((2, 21, 32), dtype=np.float32)
    parts = list(rng.standard_normal((5, 2, 4, 33, 40), dtype=np.float32))
    part_lses = list(
        np.where(rng.random((5, 2, 4, 33)) < 0.2, -np.inf, rng.normal(0, 5, (5, 2, 4, 33)))
    )
    # The backward functions' inputs: the forward's out and lse, a gradient of out.
    out, lse = fastattn.scaled_dot_product_attention(
        q, k, v, is_causal=True, window=(20, None), return_lse=True
    )
    grad_out = rng.standard_normal(out.shape, dtype=np.float32)
    tq, tk, tv = (a[0].transpose(1, 0, 2) for a in (q, k, v))  # token-major (varlen)
    cu_q, cu_k = [0, 20, 20, 33], [0, 9, 34, 70]
    vout, vlse = fastattn.varlen_attention(tq, tk, tv, cu_q, cu_k, is_causal=True, return_lse=True)
    weights = fastattn.masked_softmax(x, rng_free_lens(x), axis=1)
    return {
        "sdpa_backward": lambda n: fastattn.scaled_dot_product_attention_backward(
            grad_out, q, k, v, out, lse, is_causal=True, window=(20, None), num_threads=n
        ),
        "varlen_attention_backward": lambda n: fastattn.varlen_attention_backward(
            grad_out[0, :, :, :].transpose(1, 0, 2)[:33, :, :8],
            tq,
            tk,
            tv,
            vout,
            vlse,
            cu_q,
            cu_k,
            is_causal=True,
            num_threads=n,
        ),
        "masked_softmax_backward": lambda n: fastattn.masked_softmax_backward(
            x * 0.5, weights, rng_free_lens(x), axis=1, num_threads=n
        ),
        "additive_attention_backward": lambda n: fastattn.additive_attention_backward(
            grad_out, q, k, v, w_q, w_k, w_v, mask, valid_lens=vl, num_threads=n
        ),
        "nadaraya_watson_backward": lambda n: fastattn.nadaraya_watson_backward(
            y[:50] * 0.5, xq, xk, y, bandwidth=1.3, num_threads=n
        ),
        "sdpa": lambda n: fastattn.scaled_dot_product_attention(
            q, k, v, mask, valid_lens=vl, return_lse=True, return_weights=True, num_threads=n
        ),
        "sdpa-causal-window": lambda n: fastattn.scaled_dot_product_attention(
            q, k, v, is_causal=True, causal_alignment="bottom_right", window=(9, 2), num_threads=n
        ),
        "sdpa-decode": lambda n: fastattn.scaled_dot_product_attention(
            q[:, :, :1], np.repeat(k, 40, axis=2), np.repeat(v, 40, axis=2), num_threads=n
        ),
        "masked_softmax": lambda n: fastattn.masked_softmax(
            x, rng_free_lens(x), mask=x > -1.5, axis=1, num_threads=n
        ),
        "additive_attention": lambda n: fastattn.additive_attention(
            q, k, v, w_q, w_k, w_v, mask, valid_lens=vl, return_weights=True, num_threads=n
        ),
        "attention-general-topk": lambda n: fastattn.attention(
            q,
            k,
            v,
            mask,
            score="general",
            weight=weight,
            normalize="topk",
            top_k=5,
            return_weights=True,
            num_threads=n,
        ),
        "attention-gaussian-hardmax": lambda n: fastattn.attention(
            q, k, v, score="gaussian", bandwidth=3.0, normalize="hardmax", num_threads=n
        ),
        "attention-cosine": lambda n: fastattn.attention(
            q, k, v, score="cosine", temperature=0.2, is_causal=True, num_threads=n
        ),
        "nadaraya_watson-gaussian": lambda n: fastattn.nadaraya_watson(
            xq, xk, y, return_weights=True, num_threads=n
        ),
        "nadaraya_watson-epanechnikov": lambda n: fastattn.nadaraya_watson(
            xq, xk, y, kernel="epanechnikov", bandwidth="silverman", num_threads=n
        ),
        "merge_attention_states": lambda n: fastattn.merge_attention_states(
            parts, part_lses, num_threads=n
        ),
        "varlen_attention": lambda n: fastattn.varlen_attention(
            q[0].transpose(1, 0, 2),  # 33 tokens: sequences of 20, 0, 13
            k[0].transpose(1, 0, 2),  # 70 tokens: 9, 25, 36
            v[0].transpose(1, 0, 2),
            [0, 20, 20, 33],
            [0, 9, 34, 70],
            is_causal=True,
            causal_alignment="bottom_right",
            return_lse=True,
            num_threads=n,
        ),
        "MultiHeadAttention": lambda n: layer(
            seq, is_causal=True, need_weights=True, num_threads=n
        ),
    }


def rng_free_lens(x):
    """Per-row valid lengths along axis 1 of ``x`` (deterministic)."""
    rows = (x.shape[0], x.shape[2])
    return (np.arange(np.prod(rows)).reshape(rows) * 7) % (x.shape[1] + 1)


def flatten(result) -> list:
    """A result's arrays (nadaraya_watson_backward's float bandwidth gradient as one)."""
    return [np.asarray(a) for a in (result if isinstance(result, tuple) else (result,))]


def assert_identical(got, expected, what):
    for g, e in zip(flatten(got), flatten(expected)):
        assert g.dtype == e.dtype and g.shape == e.shape, what
        assert g.tobytes() == e.tobytes(), f"{what}: not bit-identical to the serial call"


THREAD_COUNTS = (None, 1, 3)


@pytest.fixture(scope="module")
def serial():
    """The calls and their results made one at a time, per thread count."""
    fns = calls()
    return fns, {n: {name: fn(n) for name, fn in fns.items()} for n in THREAD_COUNTS}


@pytest.mark.parametrize("num_threads", THREAD_COUNTS)
def test_many_threads_calling_everything_at_once(serial, num_threads):
    fns, by_count = serial
    expected = by_count[num_threads]
    names = sorted(fns) * 3
    failures = []
    barrier = threading.Barrier(8)

    def worker(seed):
        order = np.random.default_rng(seed).permutation(len(names))
        barrier.wait()  # all threads start together
        for i in order:
            name = names[i]
            try:
                assert_identical(fns[name](num_threads), expected[name], name)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                failures.append((name, exc))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a worker thread hangs"
    assert not failures, failures[:3]


def test_thread_pool_executor(serial):
    fns, by_count = serial
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        futures = {pool.submit(fns[name], n): (name, n) for name in fns for n in (None, 1)}
        for future in concurrent.futures.as_completed(futures, timeout=300):
            name, n = futures[future]
            assert_identical(future.result(), by_count[n][name], name)


def _as_bytes(result):
    return [(a.dtype.str, a.shape, a.tobytes()) for a in flatten(result)]


def _pool_task(name):
    """Run in a pool's worker process: one call, its bytes back."""
    return _as_bytes(calls()[name](None))


# Python >= 3.12 warns when a process with threads (OpenMP's, here) forks; that is the
# situation under test.
FORK_WARNING = pytest.mark.filterwarnings("ignore:This process.*multi-threaded:DeprecationWarning")


@FORK_WARNING
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_process_pool_executor(serial, method):
    """Workers made by fork (after this process ran OpenMP teams) and by spawn."""
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    fns, by_count = serial
    # A forked worker runs single-threaded; a spawned one with the default thread count.
    expected = by_count[1 if method == "fork" else None]
    fastattn.scaled_dot_product_attention(
        *[np.ones((1, 64, 8), np.float32)] * 3, num_threads=4
    )  # the parent's OpenMP pool is up
    ctx = multiprocessing.get_context(method)
    names = sorted(fns)
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        for name, got in zip(names, pool.map(_pool_task, names, timeout=300)):
            assert got == _as_bytes(expected[name]), name


FORK_SCRIPT = textwrap.dedent("""
    import multiprocessing, os, sys, threading
    import numpy as np
    sys.path.insert(0, {tests!r})
    import fastattn
    from reliability.test_concurrency import calls, _as_bytes, _pool_task

    fns = calls()
    expected = {{name: _as_bytes(fn(1)) for name, fn in fns.items()}}
    for fn in fns.values():   # the OpenMP pool is up, with several threads
        fn(4)

    def child_check(conn):
        assert fastattn._threads.resolve(8) == 1
        got = {{name: _as_bytes(fn(8)) for name, fn in fns.items()}}
        conn.send(got == expected)

    def fork_and_check(label):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                ok = all(_as_bytes(fn(8)) == expected[name] for name, fn in fns.items())
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        answer = os.read(r, 1)
        os.waitpid(pid, 0)
        assert answer == b"1", label + ": the forked child's results differ"
        print(label, "ok", flush=True)

    fork_and_check("os.fork")

    # fork while another thread is inside a kernel (the GIL released)
    big = np.random.default_rng(0).standard_normal((1, 8, 1024, 64)).astype(np.float32)
    stop = threading.Event()
    def busy():
        while not stop.is_set():
            fastattn.scaled_dot_product_attention(big, big, big, num_threads=2)
    t = threading.Thread(target=busy)
    t.start()
    try:
        for i in range(3):
            fork_and_check(f"os.fork during a kernel #{{i}}")
    finally:
        stop.set()
        t.join()

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=child_check, args=(child,))
    p.start()
    assert parent.recv(), "multiprocessing fork child: results differ"
    p.join()
    assert p.exitcode == 0
    print("multiprocessing fork ok", flush=True)

    with ctx.Pool(2) as pool:
        got = pool.map(_pool_task, sorted(fns))
    assert got == [expected[name] for name in sorted(fns)], "fork Pool: results differ"
    print("done", flush=True)
""")


def test_fork_child_computes_single_threaded():
    """A process forked after the parent ran OpenMP teams (and while a parent thread is
    inside a kernel) computes every function, single-threaded, with identical results."""
    script = FORK_SCRIPT.format(tests=str(TESTS))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=TESTS_DIR
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("os.fork ok", "os.fork during a kernel #2 ok", "multiprocessing fork ok", "done"):
        assert line in proc.stdout, proc.stdout + proc.stderr


@FORK_WARNING
def test_forked_child_thread_count_is_one():
    """fastattn/_threads.py: resolve() gives 1 in a forked child, whatever was asked."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            ok = fastattn._threads.resolve(None) == 1 and fastattn._threads.resolve(16) == 1
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    assert answer == b"1"


def test_results_do_not_depend_on_the_thread_count(isa):
    """docs/semantics.md#determinism: identical bits for any thread count. The SDPA
    kernel's query blocks follow the thread count, so this holds only because every row
    goes through the same register tile code (rows are padded to whole tiles) and key
    blocks sit at fixed positions."""
    fns = calls()
    for name, fn in fns.items():
        one = fn(1)
        for n in (2, 3, 8):
            assert_identical(fn(n), one, f"{name}, {n} threads vs 1")


@pytest.mark.skipif(
    not sysconfig.get_config_var("Py_GIL_DISABLED"), reason="needs a free-threaded CPython"
)
def test_free_threaded_import_keeps_the_gil_off():
    """The module declares itself free-threading safe (docs/threads.md): on a free-threaded
    CPython, importing fastattn (and the NumPy it imports) leaves the GIL off, without
    PYTHON_GIL=0 and without CPython's RuntimeWarning about an undeclared module."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = "import sys, fastattn; print(sys._is_gil_enabled())"
    run = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False", run.stdout

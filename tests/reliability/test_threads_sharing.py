"""Thread settings that stay true while the machine changes under the process: the CPUs read
where they can change (affinity after import, cgroup quotas), set_num_threads checking before
it changes anything, get_num_threads saying what the kernels use (forked child included), the
same rule on the fast and the full path, and calls that stop waking worker threads which
cannot get a core (docs/threads.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastattn
import fastattn._threads
from fastattn import _core

LINUX = sys.platform.startswith("linux") and hasattr(os, "sched_setaffinity")
TWO_CPUS = LINUX and len(os.sched_getaffinity(0)) >= 2


@pytest.fixture(autouse=True)
def follow_environment(monkeypatch):
    monkeypatch.delenv("FASTATTN_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with fastattn.set_num_threads(None):
        yield
    _core.team_reset(False)


def _python(code: str) -> str:
    env = {
        k: v for k, v in os.environ.items() if k not in ("FASTATTN_NUM_THREADS", "OMP_NUM_THREADS")
    }
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=os.path.dirname(__file__),  # not the checkout's root: its fastattn/ is uncompiled
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


# A fresh process; THREADS() counts its OS threads, so a call that starts OpenMP workers
# shows. BIG is a call far above the one-thread cut-off, taking the fast path.
_PRELUDE = """
import os
import numpy as np
import fastattn
from fastattn import _core
def THREADS():
    return len(os.listdir("/proc/self/task"))
rng = np.random.default_rng(0)
BIG = [rng.standard_normal((1, 8, 128, 64), dtype=np.float32) for _ in range(3)]
"""


# --------------------------------------------------------------------------------------
# set_num_threads / get_num_threads


@pytest.mark.parametrize("n", [2**31, 2**63, 2**100])
def test_huge_setting_is_capped_not_a_binding_error(n):
    """Before: set_num_threads(2**31) raised pybind11's 'incompatible function arguments'
    after get_num_threads() had already become 2147483648."""
    cap = fastattn._threads._CAP
    fastattn.set_num_threads(n)
    assert fastattn.get_num_threads() == cap
    assert _core.default_threads() == cap  # the fast path's rule agrees
    fastattn.set_num_threads(None)
    outer = fastattn.get_num_threads()
    with fastattn.set_num_threads(n):
        assert fastattn.get_num_threads() == cap
    assert fastattn.get_num_threads() == outer


@pytest.mark.parametrize(
    ("bad", "error"),
    [("4", TypeError), (2.0, TypeError), (True, TypeError), (0, ValueError), (-3, ValueError)],
)
def test_bad_setting_changes_nothing(bad, error):
    with fastattn.set_num_threads(3):
        with pytest.raises(error, match=r"\bn\b"):
            fastattn.set_num_threads(bad)
        assert fastattn.get_num_threads() == 3
        assert _core.default_threads() == 3


def test_get_num_threads_is_what_the_kernels_use():
    """The cap applies to what get_num_threads reports, on both paths."""
    cap = fastattn._threads._CAP
    with fastattn.set_num_threads(cap + 5):
        assert fastattn.get_num_threads() == cap == fastattn._threads.resolve(None)


@pytest.mark.filterwarnings("ignore:This process.*multi-threaded:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_reports_one_thread():
    """Before: in a forked child get_num_threads() said 2 while the kernels ran on 1."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            ok = (
                fastattn.get_num_threads() == 1
                and _core.default_threads() == 1
                and _core.in_forked_child()
            )
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    assert answer == b"1"
    assert not _core.in_forked_child()


# --------------------------------------------------------------------------------------
# The CPUs available


@pytest.mark.skipif(not TWO_CPUS, reason="needs Linux and 2+ CPUs")
def test_affinity_narrowed_after_import_reaches_the_fast_path():
    """Before: the fast path kept the CPU count read at import, so after
    os.sched_setaffinity(0, {cpu}) a large call still started a second OpenMP thread (which
    then fought the first for the one CPU)."""
    out = _python(
        """
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        before = THREADS()
        fastattn.scaled_dot_product_attention(*BIG)
        print(fastattn.get_num_threads(), _core.default_threads(), THREADS() - before)
        """
    )
    assert out == "1 1 0"


@pytest.mark.skipif(not TWO_CPUS, reason="needs Linux and 2+ CPUs")
def test_affinity_widened_again_is_used():
    out = _python(
        """
        cpus = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cpus)})
        one = fastattn.get_num_threads()
        os.sched_setaffinity(0, cpus)
        before = THREADS()
        fastattn.scaled_dot_product_attention(*BIG)
        print(one, fastattn.get_num_threads() == len(cpus), THREADS() > before)
        """
    )
    assert out == "1 True True"


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("max 100000\n", 0),
        ("50000 100000\n", 1),
        ("100000 100000", 1),
        ("150000 100000\n", 2),
        ("400000 100000", 4),
        ("-1 100000", 0),  # cgroup v1's "no limit"
        ("", 0),
        ("garbage", 0),
        ("100000 0", 0),
    ],
)
def test_cgroup_quota_text(text, cpus):
    assert _core.cpus_of_quota(text) == cpus


def test_available_cpus_bounded_by_affinity():
    if LINUX:
        assert 1 <= _core.available_cpus() <= len(os.sched_getaffinity(0))
    else:
        assert _core.available_cpus() >= 1


# --------------------------------------------------------------------------------------
# Sharing the cores with other processes


@pytest.mark.skipif(not TWO_CPUS, reason="needs Linux and 2+ CPUs")
def test_contended_team_runs_on_one_thread():
    """While worker threads are marked late (another process held the cores), a call that
    would wake them runs on the calling thread alone; cleared, it uses the team again."""
    out = _python(
        """
        _core.team_reset(True)
        before = THREADS()
        a = fastattn.scaled_dot_product_attention(*BIG)
        b = fastattn.scaled_dot_product_attention(*BIG, is_causal=True, scale=0.5)
        during = THREADS() - before
        _core.team_reset(False)
        c = fastattn.scaled_dot_product_attention(*BIG)
        print(during, THREADS() > before, a.tobytes() == c.tobytes())
        """
    )
    assert out == "0 True True"


@pytest.mark.skipif(not TWO_CPUS, reason="needs Linux and 2+ CPUs")
def test_late_workers_mark_the_team_contended():
    """Two threads asked for on one CPU: the worker waits for the caller's time slice,
    which the region notices. (Whether a later probe clears the mark depends on the other
    processes on the machine; team_reset stands in for it above.)"""
    out = _python(
        """
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        marked = 0
        for _ in range(100):
            fastattn.scaled_dot_product_attention(*BIG, num_threads=2)
            marked += _core.team_contended()
            _core.team_reset(False)
        print(marked)
        """
    )
    assert int(out) > 0


@pytest.mark.skipif(not TWO_CPUS, reason="needs Linux and 2+ CPUs")
def test_probe_after_the_mark_does_not_hold_up_the_call():
    """The first call after the mark runs out does not probe with its own team (beside a
    busy process the worker is mostly still late, and the call waited a time slice for it):
    it runs on one thread and wakes the probe thread, whose report clears or renews the
    mark."""
    out = _python(
        """
        import time
        def WORKERS():  # OS threads other than the probe's
            names = []
            for t in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{t}/comm") as f:
                    names.append(f.read().strip())
            return sum(n != "fastattn-probe" for n in names)
        ms = 1_000_000
        t = _core.now_ns()
        _core.team_report_at(5 * ms, 6 * ms, t - 60 * ms)  # a 50 ms mark, run out 10 ms ago
        expired = _core.team_contended_until()
        before = WORKERS()
        fastattn.scaled_dot_product_attention(*BIG)
        started = WORKERS() - before
        deadline = time.monotonic() + 5
        while _core.team_contended_until() == expired and time.monotonic() < deadline:
            time.sleep(0.01)
        print(expired < _core.now_ns(), started, _core.team_contended_until() != expired)
        """
    )
    assert out == "True 0 True"


@pytest.mark.skipif(not TWO_CPUS, reason="needs Linux and 2+ CPUs")
def test_probe_on_time_is_confirmed_by_a_second_wake():
    """A probe that wakes on time clears the mark only after waking on time again from a
    2 ms sleep: one prompt wake beside a busy process did not mean the team's worker would
    get a core too. (A probe made late by the machine's load renews the mark instead; the
    loop tries again until one clears it.)"""
    out = _python(
        """
        import time
        ms = 1_000_000
        cleared_after = []
        for _ in range(50):
            time.sleep(0.001)  # (the last probe's thread done)
            t = _core.now_ns()
            _core.team_reset(False)
            _core.team_report_at(5 * ms, 6 * ms, t - 60 * ms)  # run out 10 ms ago
            expired = _core.team_contended_until()
            t0 = _core.now_ns()
            fastattn.scaled_dot_product_attention(*BIG)  # wakes the probe
            while _core.team_contended_until() == expired and _core.now_ns() - t0 < 5e9:
                pass
            if _core.team_contended_until() == 0:
                cleared_after.append(_core.now_ns() - t0)
                if len(cleared_after) == 3:
                    break
        print(len(cleared_after) > 0, min(cleared_after, default=0) >= 2 * ms)
        """
    )
    assert out == "True True"


def test_late_again_soon_after_a_probe_marks_longer():
    """Beside a process that holds a core, most regions find their workers on time and a
    few wait a time slice: a late region soon after the on-time probe that cleared the mark
    doubles the mark (up to 1.6 s) instead of starting again at 50 ms, which cost a time
    slice every 50 ms; one long after the last late region starts at 50 ms."""
    ms = 1_000_000
    late, on_time = (5 * ms, 6 * ms), (10_000, 6 * ms)  # (latest worker start, region)
    t = _core.now_ns()
    _core.team_report_at(*late, t)
    assert _core.team_contended_until() == t + 50 * ms
    for mark in (100, 200, 400, 800, 1600, 1600):
        t = _core.team_contended_until() + ms
        _core.team_report_at(*on_time, t)  # the probe after the mark: on time, cleared
        assert _core.team_contended_until() == 0
        _core.team_report_at(*late, t + 2 * ms)
        assert _core.team_contended_until() == t + 2 * ms + mark * ms
    t = _core.team_contended_until() + ms
    _core.team_report_at(*on_time, t)
    _core.team_report_at(*late, t + 10_000 * ms)  # the neighbour left long ago
    assert _core.team_contended_until() == t + 10_050 * ms


def test_results_identical_when_contended(isa):
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 4, 200, 32)) for _ in range(3))
    base = fastattn.scaled_dot_product_attention(q, k, v, num_threads=2)
    _core.team_reset(True)
    try:
        got = fastattn.scaled_dot_product_attention(q, k, v, num_threads=2)
    finally:
        _core.team_reset(False)
    assert got.tobytes() == base.tobytes()

"""Thread-count policy shared by every kernel call.

Order of precedence: a call's ``num_threads=``; then :func:`set_num_threads`; then the
environment variable ``FASTATTN_NUM_THREADS``, then ``OMP_NUM_THREADS``; then the CPUs
this process may run on now (its affinity, bounded by a cgroup CPU quota: read by the core
on each call, so a change after import counts). A count is capped at 4 per CPU, and is 1
in a child made by ``os.fork()``. The rule lives in the core (``_core.default_threads``),
which the common call's fast path applies without Python; this module holds the setting
and parses the environment forms the core leaves to it. Each kernel call passes its count
explicitly to its OpenMP region, so calls made from other Python threads honour it too.
"""

from __future__ import annotations

import os
import threading

from fastattn import _core
from fastattn._checks import check_size

_lock = threading.Lock()
_setting: int | None = None  # set_num_threads(); None = follow the environment


_env_seen: tuple = ()  # (raw values, the count they gave): the last environment parsed


def _from_environment() -> int:
    """The count the environment asks for (the CPUs available when it asks for none)."""
    global _env_seen
    raws = _core.thread_environment()  # as os.environ has them; cheaper than os.environ.get
    if not (_env_seen and _env_seen[0] == raws):
        _env_seen = (raws, _parse_environment())
    return _env_seen[1] or _available_cpus()


def _available_cpus() -> int:
    return _core.available_cpus()


def _parse_environment() -> int:
    """The environment's count, or 0 when it sets none."""
    for var in ("FASTATTN_NUM_THREADS", "OMP_NUM_THREADS"):
        raw = os.environ.get(var, "").strip()
        if raw:
            first = raw.split(",")[0].strip()  # OMP_NUM_THREADS may list nesting levels
            try:
                return check_size(int(first), var, noun="an integer")
            except (TypeError, ValueError):
                raise ValueError(
                    f"environment variable {var}={raw!r} is not a positive integer"
                ) from None
    return 0


def get_num_threads() -> int:
    """Return the number of threads fastattn's kernels use when a call does not say.

    That is the :func:`set_num_threads` setting, else the environment's, else the CPUs
    this process may run on now; at most 4 per CPU, and 1 in a child made by ``os.fork()``.
    Calls of little work run on one thread whatever this says, and so do calls made while
    other processes hold the cores (see the "Threads and processes" page of the docs).

    >>> import fastattn
    >>> fastattn.get_num_threads() >= 1
    True
    """
    return resolve(None)


class set_num_threads:  # noqa: N801 - used like a function, like numexpr/torch
    """Set the default thread count for fastattn's kernels; usable as a context manager.

    ``n`` is an integer >= 1, or ``None`` to follow the environment again
    (``FASTATTN_NUM_THREADS``, ``OMP_NUM_THREADS``, then the CPUs available).
    As a context manager it restores the previous setting on exit. The setting is
    process-wide (like threadpoolctl's limits): with-blocks in different Python threads
    that overlap restore in the order they exit. For a per-thread choice pass
    ``num_threads=`` to each call. A call runs at most 4 threads per CPU, and a child
    process made by ``os.fork()`` runs single-threaded (OpenMP's pool does not survive
    a fork); results are the same for any thread count.

    >>> import fastattn
    >>> with fastattn.set_num_threads(1):
    ...     fastattn.get_num_threads()
    1
    """

    def __init__(self, n: int | None) -> None:
        global _setting
        value = None if n is None else check_size(n, "n", noun="an integer")
        # Checked before anything changes; the core holds it capped (a C int).
        with _lock:
            self._previous = _setting
            _setting = value
            _push_defaults()

    def __enter__(self) -> set_num_threads:
        return self

    def __exit__(self, *exc_info: object) -> None:
        global _setting
        with _lock:
            _setting = self._previous
            _push_defaults()


# At most 4 threads per CPU: more only costs, and an unbounded count can exhaust the
# process's thread limit (OpenMP then aborts the interpreter).
_CAP = 4 * max(1, os.cpu_count() or 1)


def _push_defaults() -> None:
    """Tell the core (whose fast path resolves a call's count without Python) the setting
    and the cap; a setting above the cap runs capped anyway, so it is pushed capped."""
    _core.set_thread_defaults(setting=min(_setting or 0, _CAP), cap=_CAP)


_push_defaults()


def resolve(num_threads: int | None) -> int:
    """The thread count for one call (validating a per-call ``num_threads=``), capped at
    4 per CPU; 1 in a child process created by ``os.fork()`` (OpenMP's thread pool does
    not survive a fork; the core notices the fork itself)."""
    if num_threads is None:
        n = _core.default_threads()  # -1: an environment form only Python parses
        if n > 0:
            return n
        n = _setting if _setting is not None else _from_environment()
    else:
        n = check_size(num_threads, "num_threads", noun="an integer")
    return 1 if _core.in_forked_child() else min(n, _CAP)


def _register_threadpoolctl() -> None:
    """Let threadpoolctl see and limit fastattn (``user_api="openmp"``), if installed."""
    try:
        import threadpoolctl
    except ImportError:
        return
    if not hasattr(threadpoolctl, "register"):  # threadpoolctl < 3.5
        return

    class FastattnController(threadpoolctl.LibController):
        user_api = "openmp"
        internal_api = "fastattn"
        filename_prefixes = ("_core.",)
        check_symbols = ("fastattn_threadpool_marker",)

        def get_num_threads(self) -> int:
            return get_num_threads()

        def set_num_threads(self, num_threads: int) -> None:
            set_num_threads(num_threads)

        def get_version(self) -> str:
            from fastattn import __version__

            return __version__

    threadpoolctl.register(FastattnController)

"""Thread-count policy shared by every kernel call.

Order of precedence: a call's ``num_threads=``; then :func:`set_num_threads`; then the
environment variable ``FASTATTN_NUM_THREADS``, then ``OMP_NUM_THREADS``; then the CPUs
this process may run on. Each kernel call passes its count explicitly to its OpenMP
region, so calls made from other Python threads honour the setting too.
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
    """The count the environment asks for; parsed again only when a variable changed."""
    global _env_seen
    raws = _core.thread_environment()  # as os.environ has them; cheaper than os.environ.get
    if raws == (None, None):
        return _available_cpus()
    if not (_env_seen and _env_seen[0] == raws):
        _env_seen = (raws, _parse_environment())
    return _env_seen[1]


def _available_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _parse_environment() -> int:
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
    return _available_cpus()


def get_num_threads() -> int:
    """Return the number of threads fastattn's kernels use when a call does not say.

    >>> import fastattn
    >>> fastattn.get_num_threads() >= 1
    True
    """
    setting = _setting
    return setting if setting is not None else _from_environment()


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


_forked_child = False


def _after_fork_in_child() -> None:
    # GNU OpenMP's thread pool does not survive fork(): a parallel region in the child would
    # hang. The child runs single-threaded instead (results do not depend on thread count).
    global _forked_child
    _forked_child = True
    _push_defaults()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _push_defaults() -> None:
    """Tell the core's fast path (which resolves a call's count without Python) this
    module's state: the setting, the cap, the CPUs and whether this is a forked child."""
    _core.set_thread_defaults(
        setting=_setting or 0, cap=_CAP, cpus=_available_cpus(), forked=_forked_child
    )


_push_defaults()


def resolve(num_threads: int | None) -> int:
    """The thread count for one call (validating a per-call ``num_threads=``), capped at
    4 per CPU; 1 in a child process created by ``os.fork()``."""
    if num_threads is None:
        n = _setting if _setting is not None else _from_environment()
    else:
        n = check_size(num_threads, "num_threads", noun="an integer")
    return 1 if _forked_child else min(n, _CAP)


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

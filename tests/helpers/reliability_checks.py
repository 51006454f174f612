"""Helpers of the reliability tests (fuzzing, edge inputs, concurrency): arrays of any dtype,
byte order and memory layout, and a comparison that checks NaN/inf positions exactly.

Not a test module. :func:`realize` turns float64 values into the array a user could hand
fastattn: C- or Fortran-ordered, permuted axes with gaps and negative strides, broadcast
(stride 0), overlapping rows (``as_strided``), unaligned, strides that are not a multiple of
the item size (a field of a packed structured array), read-only, a nested list, in native or
swapped byte order. Every layout but "bcast" and "overlap" keeps the values as given (those
two derive theirs from the values, repeated), so a caller that places special values at
chosen positions asks for a value-preserving layout (:data:`KEEPS_VALUES`).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np

import fastattn

LAYOUTS = (
    "c",
    "c",
    "c",
    "c",
    "fortran",
    "permuted",
    "permuted",
    "bcast",
    "overlap",
    "unaligned",
    "packed",
    "readonly",
    "list",
)
KEEPS_VALUES = frozenset(("c", "fortran", "permuted", "unaligned", "packed", "readonly", "list"))

# (kind, byte order swapped): float dtypes weighted towards float32.
FLOATS = (
    (("f4", False),) * 4
    + (("f8", False),) * 2
    + (("f2", False), ("f4", True), ("f8", True), ("f2", True))
)
# Dtypes every float argument must refuse with TypeError.
BAD_FLOATS = (("i4", False), ("c8", False), ("?", False), ("O", False), ("U3", False))


def dtype_of(kind: str, swapped: bool) -> np.dtype:
    dt = np.dtype(kind)
    return dt.newbyteorder() if swapped and dt.itemsize > 1 else dt


def cast(values: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``values`` (float64) in ``dt``, quietly (overflow to inf, NaN to 0 for ints)."""
    with np.errstate(all="ignore"):
        if dt.kind in "iu":
            return np.nan_to_num(values, nan=0, posinf=0, neginf=0).astype(dt)
        if dt.kind == "b":
            return values > 0
        if dt.kind == "U":
            return values.astype(str).astype(dt)
        return values.astype(dt)


def realize(values: np.ndarray, dt: np.dtype, layout: str, rng: np.random.Generator):
    """An array (or a list) holding ``values`` cast to ``dt``, laid out as ``layout``."""
    values = np.asarray(values, dtype=np.float64)
    shape = values.shape
    ndim = len(shape)
    if dt.kind in "OU" and layout not in ("c", "list"):
        layout = "c"
    if layout == "list":
        if values.size > 400 or dt.kind != "f":
            layout = "c"
        else:
            return cast(values, dt).tolist()
    if layout == "c" or ndim == 0:
        a = np.ascontiguousarray(cast(values, dt))
        return a
    if layout == "readonly":
        a = np.ascontiguousarray(cast(values, dt))
        a.flags.writeable = False
        return a
    if layout == "fortran":
        return np.asfortranarray(cast(values, dt))
    if layout == "permuted":  # axes permuted, gaps between elements, some axes reversed
        perm = rng.permutation(ndim)
        steps = rng.integers(1, 3, ndim)
        big = np.zeros([shape[p] * steps[p] for p in perm], dt)
        if dt.kind == "f":
            big[...] = np.nan  # the gaps hold NaN, so reading one shows
        view = big[tuple(slice(None, None, steps[p]) for p in perm)]
        view = view.transpose(np.argsort(perm))
        view = view[
            tuple(slice(None, None, -1) if flip else slice(None) for flip in rng.random(ndim) < 0.4)
        ]
        view[...] = cast(values, dt)
        return view
    if layout == "bcast":  # stride 0 along one axis of size > 1, or along all of them
        axes = [ax for ax in range(ndim) if shape[ax] > 1]
        if not axes:
            return np.ascontiguousarray(cast(values, dt))
        if rng.random() < 0.2:
            first = values[(slice(0, 1),) * ndim]
        else:
            ax = int(rng.choice(axes))
            first = np.take(values, [0], axis=ax)
        return np.broadcast_to(cast(first, dt), shape)
    if layout == "overlap":  # arbitrary element strides in -2..3: overlap, zero, negative
        mult = rng.integers(-2, 4, ndim)
        extent = [abs(int(m)) * (n - 1) for m, n in zip(mult, shape)]
        if 0 in shape:
            return np.ascontiguousarray(cast(values, dt))
        size = 1 + sum(extent)
        offset = sum(e for m, e in zip(mult, extent) if m < 0)
        flat = values.ravel() if values.size else np.zeros(1)
        base = np.ascontiguousarray(cast(np.resize(flat, size), dt))
        return np.lib.stride_tricks.as_strided(
            base[offset:], shape, tuple(int(m) * dt.itemsize for m in mult), writeable=False
        )
    if layout == "unaligned":
        raw = np.zeros(values.size * dt.itemsize + 1, np.uint8)
        a = raw[1:].view(dt).reshape(shape)
        a[...] = cast(values, dt)
        return a
    if layout == "packed":  # strides of itemsize + 1 bytes: not a multiple of the item size
        rec = np.zeros(shape, dtype=np.dtype([("pad", "u1"), ("x", dt)]))
        a = rec["x"]
        a[...] = cast(values, dt)
        return a
    raise AssertionError(f"unknown layout {layout!r}")


def same_content(a, b) -> bool:
    """Whether two arguments hold the same bytes (lists and scalars by equality)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return (
            a.shape == b.shape
            and a.dtype == b.dtype
            and (a.dtype.kind == "O" or a.tobytes() == b.tobytes())
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return True  # lists, scalars: a call cannot modify them through NumPy


@contextmanager
def active_isa(name: str):
    previous = fastattn._core.active_isa()
    fastattn._core.set_isa(name)
    try:
        yield
    finally:
        fastattn._core.set_isa(previous)


def finite_values(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return np.where(np.isfinite(a), a, 0.0)


def row_norm_max(a) -> float:
    a = finite_values(a)
    return float(np.sqrt((a * a).sum(axis=-1)).max(initial=0.0)) if a.ndim else abs(float(a))


def finite_max(a) -> float:
    return float(np.abs(finite_values(a)).max(initial=0.0))


def compute_eps(*arrays) -> tuple[float, bool]:
    """(eps of the compute dtype, whether the result is float16)."""
    result = np.result_type(*[np.asarray(a).dtype.newbyteorder("=") for a in arrays])
    compute = np.dtype(np.float32) if result == np.float16 else result
    return float(np.finfo(compute).eps), result == np.float16


def assert_close(name, got, expected, tol, skip_rows=None):
    """Same shape, dtype and NaN/+inf/-inf positions; finite entries within ``tol`` (a
    number or an array broadcasting against the result). ``skip_rows``: a bool array over
    the leading axes (all but the last) of rows not to compare."""
    assert isinstance(got, np.ndarray), f"{name}: got {type(got).__name__}"
    assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
    assert got.dtype == expected.dtype, f"{name}: dtype {got.dtype} != {expected.dtype}"
    g = got.astype(np.float64)
    e = expected.astype(np.float64)
    keep = np.ones(g.shape, dtype=bool)
    if skip_rows is not None:
        keep = np.broadcast_to(~skip_rows[..., None], g.shape)
    for what, pred in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = (pred(g) != pred(e)) & keep
        assert not bad.any(), (
            f"{name}: {what} positions differ at {np.argwhere(bad)[:4].tolist()} "
            f"(got {g[bad][:4]}, expected {e[bad][:4]})"
        )
    finite = np.isfinite(e) & keep
    err = np.where(finite, np.abs(np.where(finite, g, 0.0) - np.where(finite, e, 0.0)), 0.0)
    over = err > np.broadcast_to(tol, err.shape)
    assert not over.any(), (
        f"{name}: error {err[over][:4]} over the tolerance "
        f"{np.broadcast_to(tol, err.shape)[over][:4]} at {np.argwhere(over)[:4].tolist()}"
    )


def longest_pause_beside(call, repeats: int = 3) -> tuple[float, int]:
    """Runs ``call()`` ``repeats`` times on a second thread while this thread loops on 1 ms
    sleeps; returns the longest gap between two of this thread's loop turns (seconds) and
    the number of turns. A kernel that held the GIL (or, on a free-threaded CPython, kept
    its thread state attached so that a stop-the-world waited for it) stalls the loop for
    a whole call.

    The clock starts once the worker has been let go, not before ``Thread.start()``:
    waiting for a lock on CPython 3.13t spins on ``sched_yield`` 40 times without
    re-reading the lock (CPython gh-135871), and on a loaded machine each yield lends the
    core out for a scheduler slice, so ``start()``'s handshake took 0.1-0.2 s while the new
    thread computed. That stall is the interpreter's, whatever the thread runs (NumPy's
    ``a @ a`` too), and gone with ``sched_yield`` made a no-op: docs/threads.md.
    """
    go, done = threading.Event(), threading.Event()

    def work():
        go.wait()
        try:
            for _ in range(repeats):
                call()
        finally:
            done.set()

    worker = threading.Thread(target=work)
    worker.start()
    go.set()
    ticks = [time.perf_counter()]
    while not done.is_set():
        time.sleep(0.001)
        ticks.append(time.perf_counter())
    worker.join()
    return float(np.diff(ticks).max()) if len(ticks) > 1 else 0.0, len(ticks)

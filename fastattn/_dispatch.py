"""The one place that picks a backend from the array arguments of a public function.

NumPy (and anything else array-like) -> the CPU kernels; CuPy -> :mod:`fastattn._cuda`;
Dask -> :mod:`fastattn._dask` (a lazy graph whose blocks call the CPU or CUDA backend). Neither CuPy
nor Dask is imported here: an array of their types can only exist once the caller has
imported them, so a NumPy call pays two ``sys.modules`` look-ups.
"""

from __future__ import annotations

import sys

from fastattn import _cuda


def is_dask(a: object) -> bool:
    """Whether ``a`` is a Dask collection with array semantics (``dask.array.Array``)."""
    module = type(a).__module__
    return (module == "dask" or module.startswith("dask.")) and hasattr(a, "chunks")


def _flatten(arrays: tuple) -> list:
    """The arguments, with the elements of list/tuple arguments (merge's parts) spliced in."""
    flat = []
    for a in arrays:
        if isinstance(a, (list, tuple)):
            flat.extend(a)
        else:
            flat.append(a)
    return flat


def backend(*arrays: object) -> str | None:
    """``"dask"``, ``"cupy"`` or None (the CPU kernels) for a call's array arguments.

    Dask wins over CuPy: a Dask array of CuPy chunks is a Dask array (its blocks then run
    on the GPU path). A top-level CuPy array beside a Dask array is a ``TypeError``.
    """
    if sys.modules.get("dask") is None and sys.modules.get("cupy") is None:
        return None
    flat = _flatten(arrays)
    if sys.modules.get("dask") is not None:
        if any(is_dask(a) for a in flat):
            if sys.modules.get("cupy") is not None and any(_cuda._is_cupy_type(a) for a in flat):
                raise TypeError(
                    "a CuPy array was passed beside a Dask array: pass all arrays as Dask "
                    "arrays (dask.array.from_array(x) wraps a CuPy array in one)"
                )
            return "dask"
    if _cuda.uses_gpu(*flat):
        return "cupy"
    return None


def engine(kind: str):
    """The backend module of ``kind`` (:func:`backend`'s answer): :mod:`fastattn._dask`
    (imported only now: it imports Dask) or :mod:`fastattn._cuda`."""
    if kind == "dask":
        from fastattn import _dask

        return _dask
    return _cuda


def forwarded(fn, scope: dict) -> dict:
    """The call of ``fn`` as it was made, by parameter name: the values of ``fn``'s
    parameters in ``scope`` (``locals()`` inside ``fn``), to hand on to a backend whole
    instead of listing every parameter again."""
    names = _PARAMETERS.get(fn)
    if names is None:
        code = fn.__code__
        names = _PARAMETERS[fn] = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return {name: scope[name] for name in names}


_PARAMETERS: dict = {}  # each function's parameter names, as forwarded has read them

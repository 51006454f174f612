"""fastattn: fast, exact attention for NumPy arrays.

A C++ core (OpenMP threads, SIMD chosen at run time, blocked "flash" kernels) behind a
NumPy API. ``fastattn.reference`` holds plain-NumPy twins of every function.
"""

from __future__ import annotations

import os as _os

try:
    from fastattn import _core
except ImportError as _exc:
    if any(n.startswith("_core.") and not n.endswith(".pyi") for n in _os.listdir(__path__[0])):
        raise
    raise ImportError(  # e.g. `python -m fastattn.bench` run in the source checkout
        f"fastattn's compiled module is not in {__path__[0]}: this is the source tree (Python "
        "looks in the current directory first), not the installed package. Run from another "
        "directory, use the console script (fastattn-bench), or install in editable mode "
        "(docs/development.md)."
    ) from _exc
from fastattn import reference  # noqa: F401 - fastattn.reference, the oracle
from fastattn._block_mask import BlockMask, block_mask
from fastattn._config import show_config
from fastattn._family import additive_attention, attention, masked_softmax, nadaraya_watson
from fastattn._family_grad import (
    additive_attention_backward,
    masked_softmax_backward,
    nadaraya_watson_backward,
)
from fastattn._grad import scaled_dot_product_attention_backward, varlen_attention_backward
from fastattn._mha import KVCache, MultiHeadAttention
from fastattn._plot import plot_attention
from fastattn._quantize import quantize_kv
from fastattn._sdpa import merge_attention_states, scaled_dot_product_attention
from fastattn._threads import get_num_threads, set_num_threads
from fastattn._varlen import varlen_attention

__version__ = _core.version


def get_include() -> str:
    """The folder holding ``fastattn/fastattn.h``, the header of fastattn's C API.

    Add it to the include path of C, C++ or Cython code that calls fastattn without the
    interpreter (as ``numpy.get_include()``); ``fastattn/capi.pxd`` is in the package for
    ``cimport``, and ``fastattn.capi`` reaches the same functions from ctypes and Numba.

    Returns
    -------
    str
        An absolute path.

    Examples
    --------
    >>> import os
    >>> import fastattn
    >>> os.path.isfile(os.path.join(fastattn.get_include(), "fastattn", "fastattn.h"))
    True
    """
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "include")


__all__ = [
    "BlockMask",
    "KVCache",
    "MultiHeadAttention",
    "__version__",
    "additive_attention",
    "additive_attention_backward",
    "attention",
    "block_mask",
    "get_include",
    "get_num_threads",
    "masked_softmax",
    "masked_softmax_backward",
    "merge_attention_states",
    "nadaraya_watson",
    "nadaraya_watson_backward",
    "plot_attention",
    "quantize_kv",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "set_num_threads",
    "show_config",
    "varlen_attention",
    "varlen_attention_backward",
]

if _os.environ.get("FASTATTN_ISA"):
    try:
        _core.set_isa(_os.environ["FASTATTN_ISA"].strip().lower())
    except ValueError as exc:
        raise ImportError(f"fastattn: {exc}; available here: {_core.available_isas()}") from None

from fastattn import _threads as _threads_module  # noqa: E402

_threads_module._register_threadpoolctl()

"""fastattn's C API seen from Python: the function table's addresses and the layout of its
argument structs, for ctypes and Numba callers (C and Cython include the header instead:
``fastattn/include/fastattn/fastattn.h`` and ``fastattn/capi.pxd``).

The table is the capsule ``fastattn._core._C_API``; :func:`table` reads it through ctypes.
``sdpa``, ``masked_softmax`` and ``merge_attention_states`` are ctypes function pointers
taking ``(args, msg, msg_size)`` as ``void*`` / ``char*`` / ``size_t``, callable from ctypes
and from Numba's nopython mode (pass ``array.ctypes`` for the pointers). The argument
structs are :class:`SdpaArgs`, :class:`MaskedSoftmaxArgs` and :class:`MergeStatesArgs`
(ctypes), or as NumPy structured dtypes ``SDPA_ARGS_DTYPE``, ``MASKED_SOFTMAX_ARGS_DTYPE``
and ``MERGE_STATES_ARGS_DTYPE`` (for Numba, which reads and writes record fields).
:func:`sdpa_args`, :func:`masked_softmax_args` and :func:`merge_states_args` fill one from
NumPy arrays.
"""

from __future__ import annotations

import ctypes

import numpy as np

from fastattn import _core, get_include

__all__ = [
    "ERROR_INTERNAL",
    "ERROR_INVALID",
    "ERROR_NO_MEMORY",
    "FLOAT32",
    "FLOAT64",
    "MASKED_SOFTMAX_ARGS_DTYPE",
    "MERGE_STATES_ARGS_DTYPE",
    "OK",
    "SDPA_ARGS_DTYPE",
    "VERSION",
    "MaskedSoftmaxArgs",
    "MergeStatesArgs",
    "SdpaArgs",
    "Table",
    "Tensor",
    "get_include",
    "masked_softmax",
    "masked_softmax_args",
    "merge_attention_states",
    "merge_states_args",
    "sdpa",
    "sdpa_args",
    "table",
    "table_address",
]

# The header's numbers (fastattn.h): keep in step with it.
VERSION = 2
OK, ERROR_INVALID, ERROR_NO_MEMORY, ERROR_INTERNAL = 0, 1, 2, 3
FLOAT32, FLOAT64 = 0, 1
_DTYPE_CODES = {np.dtype(np.float32): FLOAT32, np.dtype(np.float64): FLOAT64}


class Tensor(ctypes.Structure):
    """``fastattn_tensor``: data, shape and element strides (batch, head, row, column),
    extent (elements the buffer holds from data on)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("shape", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
        ("extent", ctypes.c_int64),
    ]


# The fields every argument struct of the header opens with.
_ARGS_HEAD = [
    ("struct_size", ctypes.c_size_t),
    ("dtype", ctypes.c_int32),
    ("num_threads", ctypes.c_int32),
]


class SdpaArgs(ctypes.Structure):
    """``fastattn_sdpa_args`` (see the header for every field's meaning)."""

    _fields_ = [
        *_ARGS_HEAD,
        *(
            (name, Tensor)
            for name in ("q", "k", "v", "out", "bool_mask", "float_mask", "valid_lens", "lse")
        ),
        ("scale", ctypes.c_double),
        ("softcap", ctypes.c_double),
        ("causal", ctypes.c_int32),
        ("reserved_", ctypes.c_int32),
        ("diag_offset", ctypes.c_int64),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
    ]


class MaskedSoftmaxArgs(ctypes.Structure):
    """``fastattn_masked_softmax_args`` (see the header)."""

    _fields_ = [
        *_ARGS_HEAD,
        *((name, Tensor) for name in ("x", "out", "mask", "valid_lens")),
    ]


class MergeStatesArgs(ctypes.Structure):
    """``fastattn_merge_states_args`` (see the header): ``outputs`` and ``lses`` are the
    addresses of ``num_parts`` :class:`Tensor` each (``void*`` here, so that the struct has a
    NumPy dtype for Numba)."""

    _fields_ = [
        *_ARGS_HEAD,
        ("num_parts", ctypes.c_int64),
        ("outputs", ctypes.c_void_p),
        ("lses", ctypes.c_void_p),
        ("out", Tensor),
        ("lse", Tensor),
    ]


# (args, msg, msg_size) -> status, with void* args so Numba can pass array.ctypes.
_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class Table(ctypes.Structure):
    """``fastattn_capi``: version and size first, then the functions."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("library_version", ctypes.c_char_p),
        ("sdpa", _FN),
        ("masked_softmax", _FN),
        # version 2
        ("merge_attention_states", _FN),
    ]


SDPA_ARGS_DTYPE = np.dtype(SdpaArgs)
MASKED_SOFTMAX_ARGS_DTYPE = np.dtype(MaskedSoftmaxArgs)
MERGE_STATES_ARGS_DTYPE = np.dtype(MergeStatesArgs)


def table_address() -> int:
    """The address of the ``fastattn_capi`` table (for C code handed it from Python)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get(_core._C_API, b"fastattn._core._C_API")


def table() -> Table:
    """The ``fastattn_capi`` table, read through ctypes (it lives as long as the process)."""
    return Table.from_address(table_address())


_table = table()
sdpa = _table.sdpa
masked_softmax = _table.masked_softmax
merge_attention_states = _table.merge_attention_states


def _tensor(a: np.ndarray | None, ndim: int) -> Tensor:
    """A Tensor of a NumPy array (None = absent): element strides, extent = its reach + 1."""
    t = Tensor()
    if a is None:
        return t
    if a.ndim != ndim:
        raise ValueError(f"expected a {ndim}-D array, got {a.ndim}-D")
    t.data = a.ctypes.data
    steps = [s // a.itemsize for s in a.strides]
    for d, (n, s) in enumerate(zip(a.shape, steps)):
        t.shape[d], t.strides[d] = n, s
    t.extent = 0 if a.size == 0 else 1 + sum((n - 1) * s for n, s in zip(a.shape, steps))
    return t


def sdpa_args(
    q,
    k,
    v,
    out,
    *,
    scale,
    bool_mask=None,
    float_mask=None,
    valid_lens=None,
    lse=None,
    softcap=0.0,
    causal=False,
    diag_offset=0,
    window=(-1, -1),
    num_threads=1,
) -> SdpaArgs:
    """An :class:`SdpaArgs` describing NumPy arrays (4-D, as the header says).

    The arrays must outlive every call made with the struct. Nothing is checked here: the
    C entry point checks everything.
    """
    a = SdpaArgs()
    a.struct_size = ctypes.sizeof(SdpaArgs)
    a.dtype = _DTYPE_CODES.get(q.dtype, -1)
    a.num_threads = num_threads
    a.q, a.k, a.v, a.out = (_tensor(x, 4) for x in (q, k, v, out))
    a.bool_mask, a.float_mask = _tensor(bool_mask, 4), _tensor(float_mask, 4)
    a.valid_lens, a.lse = _tensor(valid_lens, 3), _tensor(lse, 3)
    a.scale, a.softcap, a.causal, a.diag_offset = scale, softcap, int(causal), diag_offset
    a.window_left, a.window_right = window
    return a


def masked_softmax_args(x, out, *, mask=None, valid_lens=None, num_threads=1):
    """A :class:`MaskedSoftmaxArgs` describing 4-D NumPy arrays (they must outlive it)."""
    a = MaskedSoftmaxArgs()
    a.struct_size = ctypes.sizeof(MaskedSoftmaxArgs)
    a.dtype = _DTYPE_CODES.get(x.dtype, -1)
    a.num_threads = num_threads
    a.x, a.out, a.mask = _tensor(x, 4), _tensor(out, 4), _tensor(mask, 4)
    a.valid_lens = _tensor(valid_lens, 3)
    return a


def merge_states_args(outputs, lses, out, lse, *, num_threads=1) -> MergeStatesArgs:
    """A :class:`MergeStatesArgs` describing NumPy arrays: sequences of 4-D ``outputs`` and
    3-D ``lses``, 4-D ``out`` and 3-D ``lse``. The arrays must outlive every call made with
    the struct; the tensor arrays it points to are kept alive by the struct itself.
    Only the one count is checked here (the struct has one ``num_parts`` for both): the C
    entry point checks everything else."""
    if len(outputs) != len(lses):
        raise ValueError(f"{len(outputs)} outputs but {len(lses)} lses")
    a = MergeStatesArgs()
    a.struct_size = ctypes.sizeof(MergeStatesArgs)
    a.dtype = _DTYPE_CODES.get(out.dtype, -1)
    a.num_threads = num_threads
    a.num_parts = len(outputs)
    parts = (Tensor * max(len(outputs), 1))(*(_tensor(x, 4) for x in outputs))
    part_lses = (Tensor * max(len(lses), 1))(*(_tensor(x, 3) for x in lses))
    a.outputs, a.lses = ctypes.addressof(parts), ctypes.addressof(part_lses)
    a._tensors = (parts, part_lses)  # the addresses above stay valid as long as the struct
    a.out, a.lse = _tensor(out, 4), _tensor(lse, 3)
    return a

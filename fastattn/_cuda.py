"""The CUDA path: fastattn's functions on CuPy arrays, computed on the GPU.

The public functions call :func:`uses_gpu` first; it never imports CuPy (an array of
CuPy's type can only exist once the caller has imported it), so NumPy users pay one dict
look-up. When an input is a CuPy array:

* every array argument must be a CuPy array (a NumPy array among them is a ``TypeError``;
  Python scalars and lists are moved to the device);
* the arguments are checked by the same validation layer as the CPU path
  (:mod:`fastattn._validation`, which reads shapes, dtypes and strides), on NumPy *stand-ins* of
  the device arrays: same shape and dtype, no data (a zero-stride view of one element;
  an ``out=`` buffer's stand-in has its strides too, over lazily zeroed host pages).
  ``valid_lens`` is the one argument whose values are checked, so it is copied to the host
  (a device sync). Errors are therefore the CPU path's, word for word;
* the kernels in ``fastattn/cuda/attention.cu`` (package data) are compiled by NVRTC
  through ``cupy.RawModule`` once per device (CuPy also caches the binary on disk) and
  launched on CuPy's current stream. Each launch gets one int64 params block: sizes,
  flags and strides, then one row of element offsets per group (batch entry and query
  head), so broadcast, transposed and sliced inputs are read in place.

The pipeline functions (:func:`sdpa_forward`, :func:`softmax_forward`,
:func:`additive_forward`) take a :class:`Backend`, so the test suite can drive them with
NumPy arrays and a host emulation of the kernels when no GPU is present.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastattn import _threads
from fastattn._checks import check_flag
from fastattn._prepare import pack, with_leading_axes
from fastattn._validation import additive_args, check_out, masked_softmax_args, sdpa_args

KERNEL_SOURCE = ("cuda", "attention.cu")  # package data, relative to fastattn/
COMPILE_OPTIONS = ("-std=c++17",)
BLOCK_THREADS = 128  # kThreads
BLOCK_Q = 16  # kBlockQ: query rows per CTA
BLOCK_V = 64  # kBlockV: value columns per CTA
MAX_GRID = 2**31 - 1

# The params blocks, in the order of the enums of attention.cu (a test compares them).
ATTENTION_PARAMS = (
    "kGroups",
    "kQueries",
    "kKeys",
    "kFeatures",
    "kValueFeatures",
    "kCausal",
    "kDiagOffset",
    "kLeft",
    "kRight",
    "kQueryRow",
    "kQueryCol",
    "kKeyRow",
    "kKeyCol",
    "kValueRow",
    "kValueCol",
    "kMaskRow",
    "kMaskCol",
    "kLensRow",
    "kOutRow",
    "kOutCol",
    "kLseRow",
    "kWeightsRow",
    "kWeightsCol",
)
ATTENTION_SLOTS = (
    "kSlotQuery",
    "kSlotKey",
    "kSlotValue",
    "kSlotMask",
    "kSlotLens",
    "kSlotOut",
    "kSlotLse",
    "kSlotWeights",
)
SOFTMAX_PARAMS = (
    "kRowGroups",
    "kRowsPerGroup",
    "kRowLength",
    "kInRow",
    "kInCol",
    "kKeepRow",
    "kKeepCol",
    "kRowLensStride",
    "kResultRow",
    "kResultCol",
)
SOFTMAX_SLOTS = ("kSlotIn", "kSlotKeep", "kSlotRowLens", "kSlotResult")

_CTYPES = {
    np.dtype(np.float16): "fastattn_cuda::half_t",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}


def attention_kernel(result_dtype: np.dtype, additive: bool) -> str:
    """The name expression of the attention kernel for a result dtype. Storage is the
    result dtype (float16 stays float16); arithmetic is float32 for float16. The additive
    kernel reads the projected queries and keys in the arithmetic type."""
    storage = _CTYPES[np.dtype(result_dtype)]
    acc = "double" if np.dtype(result_dtype) == np.float64 else "float"
    qk = acc if additive else storage
    return (
        f"fastattn_cuda::attention_forward<{qk}, {storage}, {acc}, "
        f"{'true' if additive else 'false'}>"
    )


def softmax_kernel(result_dtype: np.dtype) -> str:
    storage = _CTYPES[np.dtype(result_dtype)]
    acc = "double" if np.dtype(result_dtype) == np.float64 else "float"
    return f"fastattn_cuda::masked_softmax_forward<{storage}, {acc}>"


# Every template instance the Python side launches: NVRTC's name_expressions.
KERNELS = tuple(
    [attention_kernel(dt, additive) for additive in (False, True) for dt in _CTYPES]
    + [softmax_kernel(dt) for dt in _CTYPES]
)


# --------------------------------------------------------------------------------------
# Dispatch (never imports CuPy)


def _is_cupy_type(a: object) -> bool:
    module = type(a).__module__
    return module == "cupy" or module.startswith("cupy.")


def uses_gpu(*arrays: object) -> bool:
    """Whether one of ``arrays`` is a CuPy array. Imports nothing: without ``cupy`` in
    ``sys.modules`` no CuPy array can exist."""
    if sys.modules.get("cupy") is None:
        return False
    return any(_is_cupy_type(a) for a in arrays)


def _device_inputs(cupy, named: dict) -> dict:
    """The array arguments as CuPy arrays (None stays None). A NumPy array among CuPy
    ones is refused: fastattn never moves data between host and device behind your back."""
    result = {}
    for name, value in named.items():
        if value is None or isinstance(value, cupy.ndarray):
            result[name] = value
        elif isinstance(value, np.ndarray) or _is_host_array(value):
            gpu = [n for n, v in named.items() if isinstance(v, cupy.ndarray)]
            raise TypeError(
                f"{name} is a {type(value).__module__}.{type(value).__name__} but "
                f"{', '.join(gpu)} {'is a CuPy array' if len(gpu) == 1 else 'are CuPy arrays'}: "
                f"pass all arrays on the same device (cupy.asarray({name}) moves it to the "
                f"GPU, .get() brings CuPy arrays to the host)"
            )
        else:  # Python and NumPy scalars, (nested) lists
            result[name] = cupy.asarray(value)
    return result


def _is_host_array(value: object) -> bool:
    """Host arrays of other libraries (NumPy's array protocols; not NumPy scalars)."""
    return (
        not isinstance(value, np.generic)
        and not _is_cupy_type(value)
        and (hasattr(value, "__array_interface__") or hasattr(value, "__array__"))
    )


def _device_out(cupy, out):
    if out is None or isinstance(out, cupy.ndarray):
        return out
    raise TypeError(
        f"out must be a cupy.ndarray when the inputs are CuPy arrays, got "
        f"{type(out).__module__}.{type(out).__name__}"
    )


# --------------------------------------------------------------------------------------
# Backends: CuPy, or (in the tests) NumPy with an emulated launch


@dataclass(frozen=True)
class Backend:
    xp: Any  # the array module: cupy (or numpy in the emulation tests)
    to_host: Callable  # array -> numpy.ndarray
    pointer: Callable  # array -> int, the address of its element (0, ..., 0)
    launch: Callable  # (name expression, grid, block, args) -> None


@functools.cache
def kernel_source() -> str:
    """The CUDA C++ source shipped in the package."""
    path = importlib.resources.files("fastattn")
    for part in KERNEL_SOURCE:
        path = path.joinpath(part)
    return path.read_text(encoding="utf-8")


_modules: dict = {}  # device id -> cupy.RawModule
_functions: dict = {}  # (device id, name expression) -> cupy.RawKernel


def _kernel(cupy, name: str):
    device = cupy.cuda.runtime.getDevice()
    fn = _functions.get((device, name))
    if fn is None:
        module = _modules.get(device)
        if module is None:
            module = cupy.RawModule(
                code=kernel_source(), options=COMPILE_OPTIONS, name_expressions=KERNELS
            )
            _modules[device] = module
        fn = module.get_function(name)
        _functions[(device, name)] = fn
    return fn


def _cupy_backend() -> Backend:
    import cupy  # already imported by the caller (uses_gpu saw a CuPy array)

    def launch(name, grid, block, args):
        # Launched on CuPy's current stream.
        _kernel(cupy, name)((grid,), (block,), args)

    return Backend(xp=cupy, to_host=cupy.asnumpy, pointer=lambda a: a.data.ptr, launch=launch)


# --------------------------------------------------------------------------------------
# Stand-ins and layout


def standin(a, dtype=None) -> np.ndarray:
    """A NumPy array with ``a``'s shape and dtype (or ``dtype``) and no data of its own:
    a zero-stride view of one element, for the validation layer."""
    dt = np.dtype(a.dtype if dtype is None else dtype)
    return np.lib.stride_tricks.as_strided(
        np.zeros(1, dt), shape=tuple(a.shape), strides=(0,) * len(a.shape)
    )


def out_standin(out) -> np.ndarray:
    """A NumPy array with ``out``'s shape, dtype *and strides*, for the checks of an out=
    buffer (which look at its layout): a view into zeroed bytes spanning ``out``'s extent
    (np.zeros maps them lazily: no memory is touched, no data copied)."""
    shape, strides = tuple(out.shape), tuple(out.strides)
    if 0 in shape:
        return np.zeros(shape, out.dtype)
    low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + out.itemsize
    return np.ndarray(
        shape, out.dtype, buffer=np.zeros(high - low, np.uint8), offset=-low, strides=strides
    )


def _strides(a) -> tuple:
    """``a``'s strides in elements (any sign)."""
    return tuple(s // a.itemsize for s in a.strides)


def _item_strides(be: Backend, a):
    """``a`` aligned, with strides in whole elements (a copy only if it is not): the
    kernels read whole elements through typed pointers."""
    if any(s % a.itemsize for s in a.strides) or (a.size and be.pointer(a) % a.itemsize):
        a = a.copy()  # not ascontiguousarray, which may return a misaligned array as it is
    return a


def _as_dtype(be: Backend, a, dtype):
    if a.dtype != dtype:
        a = a.astype(dtype)
    return _item_strides(be, a)


def group_offsets(shape: tuple, strides: tuple) -> np.ndarray:
    """Element offsets of every index of ``shape`` for ``strides`` (int64, C order)."""
    off = np.zeros(shape, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(shape, strides)):
        if n > 1 and s:
            off += (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(shape) - axis - 1))
    return off


def _params_block(names: tuple, values: dict, slots: list) -> np.ndarray:
    """The int64 params block: ``values`` in ``names`` order, then the offset rows."""
    missing = set(names) ^ set(values)
    assert not missing, missing
    header = np.array([values[n] for n in names], dtype=np.int64)
    return np.concatenate([header, np.stack(slots, axis=1).astype(np.int64).ravel()])


def _rows_view(be: Backend, lens, user_rows: tuple, full_rows: tuple):
    """Device valid_lens as the validation layer shapes them: int64, trailing size-1 axes
    up to the rows' dims, broadcast to the full rows (a view)."""
    vl = be.xp.asarray(lens)
    vl = _as_dtype(be, vl, np.int64)
    vl = vl.reshape(vl.shape + (1,) * (len(user_rows) - vl.ndim))
    return be.xp.broadcast_to(vl, full_rows)


def _writable_in_place(be: Backend, out) -> bool:
    """Whether the kernels can write ``out`` directly (aligned, strides in whole items)."""
    return not (
        any(s % out.itemsize for s in out.strides) or (out.size and be.pointer(out) % out.itemsize)
    )


def _check_no_alias(be: Backend, out, inputs: dict) -> None:
    for name, arr in inputs.items():
        if arr is not None and be.xp.may_share_memory(out, arr):
            raise ValueError(f"out shares memory with {name}; pass a separate buffer")


def _attention_standins(be: Backend, query, key, value, attn_mask, valid_lens, **_) -> tuple:
    """What the checks read of an attention call on device arrays: stand-ins of q/k/v and
    the mask, and valid_lens copied to the host (its values are checked); the call's other
    arrays (``**_``, the additive weights) are not read here."""
    return (
        standin(query),
        standin(key),
        standin(value),
        None if attn_mask is None else standin(attn_mask),
        None if valid_lens is None else be.to_host(valid_lens),
    )


def _check_device_out(be: Backend, out, args, inputs: dict) -> None:
    """An ``out=`` device buffer (or None): checked as the CPU path checks one, on its
    stand-in, and sharing no memory with ``inputs``."""
    if out is not None:
        check_out(out_standin(out), args.out_shape, args.result_dtype, {})
        _check_no_alias(be, out, inputs)


def _grid(items: int) -> int:
    return max(1, min(items, MAX_GRID))


# --------------------------------------------------------------------------------------
# scaled_dot_product_attention and additive_attention


def _attention_launch(
    be: Backend, args, qkv, out, inputs: dict, want_lse=False, want_weights=False, w_v=None
):
    """Allocate the results, build the params block, launch; (output, lse, weights).
    ``qkv``: device arrays already broadcast to ``args.batch`` and in the kernel's types;
    ``inputs``: the call's device arrays by name (its attn_mask and valid_lens are read).
    ``w_v``: the additive score's weights (its scores are not scaled or soft-capped);
    None: the dot-product score with ``args.scale`` and ``args.softcap``."""
    xp = be.xp
    q, k, v = qkv
    attn_mask, valid_lens = inputs["attn_mask"], inputs["valid_lens"]
    if w_v is None:
        scale, softcap = args.scale, args.softcap or 0.0
    else:
        scale, softcap = 1.0, 0.0
    result_dtype, compute = args.result_dtype, args.compute_dtype
    full_out, full_scores = args.full_out_shape, args.full_scores_shape

    bool_mask = float_mask = None
    if attn_mask is not None:
        m = xp.asarray(attn_mask)
        if m.dtype == np.bool_:
            bool_mask = xp.broadcast_to(_item_strides(be, m), full_scores)
        else:
            float_mask = xp.broadcast_to(_as_dtype(be, m, compute), full_scores)
    lens = None
    if valid_lens is not None:
        lens = _rows_view(be, valid_lens, args.scores_shape[:-1], full_out[:-1])

    target = None
    if out is not None:
        target = with_leading_axes(out, len(full_out))
        if not _writable_in_place(be, target):
            target = None  # written through a temporary below
    result = target if target is not None else xp.empty(full_out, result_dtype)
    lse = xp.empty(full_out[:-1], compute) if want_lse else None
    weights = xp.empty(full_scores, result_dtype) if want_weights else None

    hq, lq, e = q.shape[-3:]
    hkv, lk, ev = v.shape[-3:]
    groups = math.prod(full_out[:-2])
    if groups and lq:
        group = hq // hkv
        mask = bool_mask if bool_mask is not None else float_mask
        zeros = np.zeros(groups, np.int64)

        def heads(a, per_head_axes: int, kv: bool = False):
            """Offsets of ``a``'s (batch..., head) sub-arrays, one per query head."""
            if a is None:
                return zeros
            lead = a.ndim - per_head_axes
            off = group_offsets(a.shape[:lead], _strides(a)[:lead])
            if kv:  # query head h reads kv head h // group
                off = np.repeat(off, group, axis=-1)
            return off.ravel()

        def stride(a, axis):
            return 0 if a is None else _strides(a)[axis]

        values = {
            "kGroups": groups,
            "kQueries": lq,
            "kKeys": lk,
            "kFeatures": e,
            "kValueFeatures": ev,
            "kCausal": int(args.is_causal),
            "kDiagOffset": args.diag_offset,
            "kLeft": args.window[0],
            "kRight": args.window[1],
            "kQueryRow": stride(q, -2),
            "kQueryCol": stride(q, -1),
            "kKeyRow": stride(k, -2),
            "kKeyCol": stride(k, -1),
            "kValueRow": stride(v, -2),
            "kValueCol": stride(v, -1),
            "kMaskRow": stride(mask, -2),
            "kMaskCol": stride(mask, -1),
            "kLensRow": stride(lens, -1),
            "kOutRow": stride(result, -2),
            "kOutCol": stride(result, -1),
            "kLseRow": stride(lse, -1),
            "kWeightsRow": stride(weights, -2),
            "kWeightsCol": stride(weights, -1),
        }
        slots = [
            heads(q, 2),
            heads(k, 2, kv=True),
            heads(v, 2, kv=True),
            heads(mask, 2),
            heads(lens, 1),
            heads(result, 2),
            heads(lse, 1),
            heads(weights, 2),
        ]
        params = xp.asarray(_params_block(ATTENTION_PARAMS, values, slots))
        items = groups * -(-lq // BLOCK_Q) * max(1, -(-ev // BLOCK_V))
        ptr = be.pointer
        be.launch(
            attention_kernel(result_dtype, w_v is not None),
            _grid(items),
            BLOCK_THREADS,
            (
                ptr(q),
                ptr(k),
                ptr(v),
                0 if bool_mask is None else ptr(bool_mask),
                0 if float_mask is None else ptr(float_mask),
                0 if lens is None else ptr(lens),
                0 if w_v is None else ptr(w_v),
                ptr(result),
                0 if lse is None else ptr(lse),
                0 if weights is None else ptr(weights),
                ptr(params),
                float(scale),
                float(softcap),
            ),
        )

    if out is not None:
        if target is None:
            out[...] = result.reshape(args.out_shape)
        output = out
    else:
        output = result.reshape(args.out_shape)
    return (
        output,
        None if lse is None else lse.reshape(args.out_shape[:-1]),
        None if weights is None else weights.reshape(args.scores_shape),
    )


def sdpa_forward(
    be: Backend,
    query,
    key,
    value,
    attn_mask=None,
    *,
    valid_lens=None,
    return_lse=False,
    return_weights=False,
    out=None,
    num_threads=None,
    **options,
):
    """:func:`fastattn.scaled_dot_product_attention` on device arrays of ``be``; ``options``
    (is_causal, causal_alignment, window, scale, softcap) as the public function takes
    them."""
    inputs = {
        "query": query,
        "key": key,
        "value": value,
        "attn_mask": attn_mask,
        "valid_lens": valid_lens,
    }
    args = sdpa_args(*_attention_standins(be, **inputs), **options)
    want_lse = check_flag(return_lse, "return_lse")
    want_weights = check_flag(return_weights, "return_weights")
    _threads.resolve(num_threads)  # checked like the CPU path; the GPU ignores it
    _check_device_out(be, out, args, inputs)

    # Convert before broadcasting so a broadcast input is never materialised.
    q, k, v = (
        be.xp.broadcast_to(
            _as_dtype(be, with_leading_axes(a, 3), args.result_dtype), args.batch + s.shape[-3:]
        )
        for a, s in ((query, args.query), (key, args.key), (value, args.value))
    )
    return pack(*_attention_launch(be, args, (q, k, v), out, inputs, want_lse, want_weights))


def additive_forward(
    be: Backend,
    query,
    key,
    value,
    w_q,
    w_k,
    w_v,
    attn_mask=None,
    *,
    valid_lens=None,
    return_weights=False,
    out=None,
    num_threads=None,
    **options,
):
    """:func:`fastattn.additive_attention` on device arrays of ``be`` (``options``:
    is_causal, causal_alignment, window, as the public function takes them): the projections
    ``q w_q`` and ``k w_k`` by the array module's matmul, the scores, softmax and values
    by the attention kernel (``w_v . tanh(qp + kp)`` per tile, never ``Lq x Lk x hidden``)."""
    inputs = {"query": query, "key": key, "value": value, "w_q": w_q, "w_k": w_k, "w_v": w_v}
    inputs.update(attn_mask=attn_mask, valid_lens=valid_lens)
    q_s, k_s, v_s, mask_s, lens_host = _attention_standins(be, **inputs)
    w_s = [None if w is None else standin(w) for w in (w_q, w_k, w_v)]
    args, _ = additive_args(q_s, k_s, v_s, *w_s, mask_s, lens_host, **options)
    want_weights = check_flag(return_weights, "return_weights")
    _threads.resolve(num_threads)
    _check_device_out(be, out, args, inputs)

    xp, compute = be.xp, args.compute_dtype
    qp = xp.matmul(_as_dtype(be, with_leading_axes(query, 3), compute), w_q.astype(compute))
    kp = xp.matmul(_as_dtype(be, with_leading_axes(key, 3), compute), w_k.astype(compute))
    wv = xp.ascontiguousarray(w_v.astype(compute))
    q = xp.broadcast_to(_item_strides(be, qp), args.batch + qp.shape[-3:])
    k = xp.broadcast_to(_item_strides(be, kp), args.batch + kp.shape[-3:])
    v = xp.broadcast_to(
        _as_dtype(be, with_leading_axes(value, 3), args.result_dtype),
        args.batch + args.value.shape[-3:],
    )
    output, _, weights = _attention_launch(
        be, args, (q, k, v), out, inputs, want_weights=want_weights, w_v=wv
    )
    return pack(output, None, weights)


# --------------------------------------------------------------------------------------
# masked_softmax


def softmax_forward(
    be: Backend, x, valid_lens=None, *, mask=None, axis=-1, out=None, num_threads=None
):
    """:func:`fastattn.masked_softmax` on device arrays of ``be``."""
    xp = be.xp
    lens_host = None if valid_lens is None else be.to_host(valid_lens)
    args = masked_softmax_args(
        standin(x),
        lens_host,
        None if mask is None else standin(mask),
        axis,
        None if out is None else out_standin(out),
    )
    _threads.resolve(num_threads)
    if out is not None:
        _check_no_alias(be, out, {"x": x, "valid_lens": valid_lens, "mask": mask})

    ax = args.axis
    dtype = args.result_dtype
    xd = xp.moveaxis(_as_dtype(be, x, dtype), ax, -1)
    keep = None
    if mask is not None:
        keep = xp.moveaxis(xp.broadcast_to(_item_strides(be, xp.asarray(mask)), x.shape), ax, -1)
    rows = xd.shape[:-1]
    lens = None if valid_lens is None else _rows_view(be, valid_lens, rows, rows)

    target = out
    if out is not None and not _writable_in_place(be, out):
        target = None
    result = target if target is not None else xp.empty(x.shape, dtype)
    yd = xp.moveaxis(result, ax, -1)

    n = xd.shape[-1]
    per_group = rows[-1] if rows else 1
    lead = rows[:-1]
    groups = math.prod(lead)
    if groups and per_group and n:

        def offsets(a):
            if a is None:
                return np.zeros(groups, np.int64)
            k = len(lead)
            return group_offsets(a.shape[:k], _strides(a)[:k]).ravel()

        def stride(a, axis_from_end):
            if a is None or a.ndim < axis_from_end:
                return 0
            return _strides(a)[-axis_from_end]

        values = {
            "kRowGroups": groups,
            "kRowsPerGroup": per_group,
            "kRowLength": n,
            "kInRow": stride(xd, 2),
            "kInCol": stride(xd, 1),
            "kKeepRow": stride(keep, 2),
            "kKeepCol": stride(keep, 1),
            "kRowLensStride": stride(lens, 1),
            "kResultRow": stride(yd, 2),
            "kResultCol": stride(yd, 1),
        }
        slots = [offsets(xd), offsets(keep), offsets(lens), offsets(yd)]
        params = xp.asarray(_params_block(SOFTMAX_PARAMS, values, slots))
        ptr = be.pointer
        be.launch(
            softmax_kernel(dtype),
            _grid(groups * per_group),
            BLOCK_THREADS,
            (
                ptr(xd),
                0 if keep is None else ptr(keep),
                0 if lens is None else ptr(lens),
                ptr(yd),
                ptr(params),
            ),
        )
    if out is not None:
        if target is None:
            out[...] = result
        return out
    return result


# --------------------------------------------------------------------------------------
# The public functions' CUDA entries (called by fastattn._sdpa / fastattn._family)


def merge_attention_states(outputs, lses, **options):
    """Not on the GPU: refused by name."""
    raise NotImplementedError(
        "merge_attention_states does not run on CuPy arrays: pass NumPy arrays (e.g. cupy.asnumpy)"
    )


def _on_device(forward, call: dict, arrays: tuple):
    """A public call (``call``: its arguments by name) computed by ``forward`` with the
    CuPy backend, once the arguments named in ``arrays`` (in that order) are CuPy arrays
    (or None) and ``out`` a CuPy array (or None)."""
    cupy = sys.modules["cupy"]
    call.update(_device_inputs(cupy, {name: call.get(name) for name in arrays}))
    call["out"] = _device_out(cupy, call.get("out"))
    return forward(_cupy_backend(), **call)


def scaled_dot_product_attention(query, key, value, attn_mask=None, **kwargs):
    kwargs.update(query=query, key=key, value=value, attn_mask=attn_mask)
    return _on_device(sdpa_forward, kwargs, ("query", "key", "value", "attn_mask", "valid_lens"))


def additive_attention(query, key, value, w_q, w_k, w_v, attn_mask=None, **kwargs):
    kwargs.update(query=query, key=key, value=value, w_q=w_q, w_k=w_k, w_v=w_v)
    kwargs.update(attn_mask=attn_mask)
    arrays = ("query", "key", "value", "w_q", "w_k", "w_v", "attn_mask", "valid_lens")
    return _on_device(additive_forward, kwargs, arrays)


def masked_softmax(x, valid_lens=None, **kwargs):
    kwargs.update(x=x, valid_lens=valid_lens)
    return _on_device(softmax_forward, kwargs, ("x", "valid_lens", "mask"))


# --------------------------------------------------------------------------------------
# show_config


def describe() -> str:
    """One line on the CUDA path for :func:`fastattn.show_config`. Imports CuPy if it is
    installed (this is the one place that does)."""
    if importlib.util.find_spec("cupy") is None:
        return "not available (CuPy is not installed: pip install 'fastattn[cuda]')"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import cupy

            if not cupy.cuda.is_available():
                return f"not available (CuPy {cupy.__version__} sees no GPU)"
            device = cupy.cuda.Device()
            props = cupy.cuda.runtime.getDeviceProperties(device.id)
            name = props["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            count = cupy.cuda.runtime.getDeviceCount()
            return (
                f"CuPy {cupy.__version__}, device {device.id} of {count}: {name} "
                f"(sm_{device.compute_capability})"
            )
    except Exception as exc:  # a CuPy that cannot load its CUDA libraries
        return f"not available (CuPy failed: {type(exc).__name__}: {exc})"

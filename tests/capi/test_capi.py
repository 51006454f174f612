"""fastattn's C API through each of its doors: ctypes (fastattn.capi), a C99 library
compiled against the header, and a Cython module that cimports fastattn.capi and calls
SDPA from a prange loop without the GIL. Results must be the Python API's bits; bad calls
must come back as an error status with a message, never a crash or a stray read."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import fastattn
import fastattn.capi as capi

from helpers.capi_build import build_c_library

DTYPES = [np.float32, np.float64]


def _qkv(rng, dtype, b=2, hq=4, hkv=2, lq=5, lk=7, d=16, dv=8):
    q = rng.standard_normal((b, hq, lq, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, lk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, lk, dv)).astype(dtype)
    return q, k, v


def _call(fn, args) -> tuple[int, str]:
    msg = ctypes.create_string_buffer(256)
    status = fn(ctypes.addressof(args), msg, len(msg))
    return status, msg.value.decode()


def test_table_header_fields():
    t = capi.table()
    assert t.version == capi.VERSION
    assert t.size == ctypes.sizeof(capi.Table)
    assert t.library_version.decode() == fastattn.__version__


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"causal": True},
        {"causal": True, "diag_offset": 2},
        {"window": (2, 1)},
        {"softcap": 3.0},
        {"masks": True},
    ],
    ids=["plain", "causal", "causal-bottom-right", "window", "softcap", "masks"],
)
def test_ctypes_sdpa_matches_python_api(isa, dtype, options):
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, dtype)
    scale = 0.3
    kw = dict(scale=scale)
    api_kw = dict(scale=scale)
    if options.get("causal"):
        kw["causal"] = True
        kw["diag_offset"] = options.get("diag_offset", 0)
        api_kw["is_causal"] = True
        api_kw["causal_alignment"] = "bottom_right" if kw["diag_offset"] else "top_left"
        if kw["diag_offset"]:
            kw["diag_offset"] = k.shape[2] - q.shape[2]
    if "window" in options:
        kw["window"] = api_kw["window"] = options["window"]
    if "softcap" in options:
        kw["softcap"] = api_kw["softcap"] = options["softcap"]
    if options.get("masks"):
        bool_mask = rng.random((2, 4, 5, 7)) < 0.7
        bool_mask[..., 0] = True
        float_mask = rng.standard_normal((2, 4, 5, 7)).astype(dtype)
        # the Python API takes one mask: a bool one and a float one through separate calls
        for mask_kw, api_mask in (
            ({"bool_mask": bool_mask}, bool_mask),
            ({"float_mask": float_mask}, float_mask),
        ):
            out = np.full((2, 4, 5, 8), np.nan, dtype)
            args = capi.sdpa_args(q, k, v, out, **kw, **mask_kw)
            assert _call(capi.sdpa, args) == (capi.OK, "")
            want = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=api_mask, **api_kw)
            np.testing.assert_array_equal(out, want)
        return
    out = np.full((2, 4, 5, 8), np.nan, dtype)
    lse = np.full((2, 4, 5), np.nan, dtype)
    args = capi.sdpa_args(q, k, v, out, lse=lse, **kw)
    assert _call(capi.sdpa, args) == (capi.OK, "")
    want, want_lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **api_kw)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ctypes_masked_softmax_matches_python_api(isa, dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 18)).astype(dtype)[:, ::2, :, ::2]  # strided
    mask = rng.random(x.shape) < 0.6
    out = np.full(x.shape, np.nan, dtype)
    args = capi.masked_softmax_args(x, out, mask=mask)
    assert _call(capi.masked_softmax, args) == (capi.OK, "")
    np.testing.assert_array_equal(out, fastattn.masked_softmax(x, mask=mask))


def _bad_sdpa_calls(dtype):
    """(name, mutate(args), message fragment): each makes a well-formed call invalid."""

    def set_(field, value):
        return lambda a: setattr(a, field, value)

    def tensor(name, field, value):
        def mutate(a):
            t = getattr(a, name)
            if field == "stride":
                t.strides[2] = value
            elif field == "shape":
                t.shape[2] = value
            elif field == "heads":
                t.shape[1] = value
            else:
                setattr(t, field, value)

        return mutate

    return [
        ("null q", tensor("q", "data", None), "q is NULL"),
        ("null out", tensor("out", "data", None), "out is NULL"),
        ("negative size", tensor("k", "shape", -1), "k has a negative size"),
        ("stride overruns", tensor("k", "stride", 10**6), "k overruns its extent"),
        ("extent too small", tensor("v", "extent", 3), "v overruns its extent"),
        ("negative stride", tensor("q", "stride", -16), "q has a negative stride"),
        ("overflowing stride", tensor("q", "stride", 2**62), "q's strides overflow"),
        ("bad dtype", set_("dtype", 7), "dtype must be FASTATTN_FLOAT32 or FASTATTN_FLOAT64"),
        ("old struct", set_("struct_size", 8), "struct_size is smaller"),
        ("zero threads", set_("num_threads", 0), "num_threads must be >= 1"),
        ("heads", tensor("q", "heads", 3), "key heads do not divide query heads"),
        ("window", set_("window_left", -2), "window sides must be >= -1"),
        ("softcap", set_("softcap", -1.0), "softcap must be >= 0"),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ctypes_bad_calls_return_an_error_status(dtype):
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, dtype)
    for name, mutate, fragment in _bad_sdpa_calls(dtype):
        out = np.full((2, 4, 5, 8), 7.0, dtype)
        args = capi.sdpa_args(q, k, v, out, scale=1.0)
        mutate(args)
        status, message = _call(capi.sdpa, args)
        assert status == capi.ERROR_INVALID, name
        assert fragment in message, (name, message)
        assert (out == 7.0).all(), f"{name}: out was written"


def test_bad_calls_misc():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, np.float32)
    out = np.zeros((2, 4, 5, 8), np.float32)
    # NULL args; no message buffer at all; a short buffer truncates, NUL-terminated
    assert capi.sdpa(None, None, 0) == capi.ERROR_INVALID
    args = capi.sdpa_args(q, k, v, out, scale=1.0)
    args.q.data = None
    assert capi.sdpa(ctypes.addressof(args), None, 0) == capi.ERROR_INVALID
    msg = ctypes.create_string_buffer(b"x" * 16)
    assert capi.sdpa(ctypes.addressof(args), msg, 10) == capi.ERROR_INVALID
    assert msg.raw[:10] == b"fastattn \x00"
    # a misaligned pointer
    args = capi.sdpa_args(q, k, v, out, scale=1.0)
    args.k.data += 2
    assert _call(capi.sdpa, args)[1].endswith("k must be aligned to its item size")
    # masked softmax: mask overrun, NULL x
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    out = np.zeros_like(x)
    args = capi.masked_softmax_args(x, out, mask=np.ones(x.shape, bool))
    args.mask.strides[3] = 5
    assert _call(capi.masked_softmax, args) == (
        capi.ERROR_INVALID,
        "fastattn C API masked_softmax: mask overruns its extent: its shape and strides "
        "reach element 35, its buffer holds 24",
    )
    args.mask.data = None  # absent: fine
    assert _call(capi.masked_softmax, args) == (capi.OK, "")
    args.x.data = None
    assert _call(capi.masked_softmax, args) == (
        capi.ERROR_INVALID,
        "fastattn C API masked_softmax: x is NULL",
    )


def test_a_newer_struct_size_is_accepted_and_read_up_to_this_version():
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, np.float64)
    out = np.zeros((2, 4, 5, 8))
    # a caller compiled against a later header passes a larger struct
    big = (ctypes.c_char * (ctypes.sizeof(capi.SdpaArgs) + 64))()
    args = capi.SdpaArgs.from_buffer(big)
    small = capi.sdpa_args(q, k, v, out, scale=0.5)
    ctypes.memmove(big, ctypes.addressof(small), ctypes.sizeof(small))
    args.struct_size = len(big)
    assert _call(capi.sdpa, args) == (capi.OK, "")
    np.testing.assert_array_equal(out, fastattn.scaled_dot_product_attention(q, k, v, scale=0.5))


def test_numpy_struct_dtypes_match_the_ctypes_layout():
    for dtype, struct in (
        (capi.SDPA_ARGS_DTYPE, capi.SdpaArgs),
        (capi.MASKED_SOFTMAX_ARGS_DTYPE, capi.MaskedSoftmaxArgs),
    ):
        assert dtype.itemsize == ctypes.sizeof(struct)
        for name, _ in struct._fields_:
            assert dtype.fields[name][1] == getattr(struct, name).offset, name
    assert capi.SDPA_ARGS_DTYPE["k"].fields["shape"][1] == capi.Tensor.shape.offset


C_CLIENT = r"""
#include <string.h>
#include "fastattn/fastattn.h"

/* attention of one (1, 1, len_q, dim) float32 query against len_k keys */
int client_sdpa(const fastattn_capi *api, const float *q, const float *k, const float *v,
                float *out, int64_t len_q, int64_t len_k, int64_t kv_rows, int64_t dim, char *msg,
                size_t n) {
  fastattn_sdpa_args a;
  if (api->version < FASTATTN_CAPI_VERSION || api->size < sizeof(fastattn_capi)) return -1;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.dtype = FASTATTN_FLOAT32;
  a.num_threads = 1;
  a.q.data = (void *)q;
  a.q.shape[0] = a.q.shape[1] = 1;
  a.q.shape[2] = len_q;
  a.q.shape[3] = dim;
  a.q.strides[2] = dim;
  a.q.strides[3] = 1;
  a.q.extent = len_q * dim;
  a.k = a.q;
  a.k.data = (void *)k;
  a.k.shape[2] = len_k;
  a.k.extent = kv_rows * dim; /* what the caller's buffers hold */
  a.v = a.k;
  a.v.data = (void *)v;
  a.out = a.q;
  a.out.data = out;
  a.scale = 0.125;
  a.window_left = a.window_right = -1;
  return api->sdpa(&a, msg, n);
}
"""


def test_c_library_compiled_against_the_header(tmp_path):
    lib = ctypes.CDLL(str(build_c_library(C_CLIENT, tmp_path)))
    fp = ctypes.POINTER(ctypes.c_float)
    lib.client_sdpa.argtypes = [
        ctypes.c_void_p,
        fp,
        fp,
        fp,
        fp,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, np.float32, b=1, hq=1, hkv=1, lq=3, lk=16, d=64, dv=64)
    out = np.full(q.shape, np.nan, np.float32)

    def ptr(a):
        return a.ctypes.data_as(fp)

    msg = ctypes.create_string_buffer(200)
    status = lib.client_sdpa(
        capi.table_address(), ptr(q), ptr(k), ptr(v), ptr(out), 3, 16, 16, 64, msg, 200
    )
    assert (status, msg.value) == (capi.OK, b"")
    np.testing.assert_array_equal(out, fastattn.scaled_dot_product_attention(q, k, v, scale=0.125))
    # a length the buffers do not hold: refused, nothing read
    status = lib.client_sdpa(
        capi.table_address(), ptr(q), ptr(k), ptr(v), ptr(out), 3, 17, 16, 64, msg, 200
    )
    assert status == capi.ERROR_INVALID
    assert msg.value.decode() == (
        "fastattn C API sdpa: k overruns its extent: its shape and strides reach element "
        "1087, its buffer holds 1024"
    )

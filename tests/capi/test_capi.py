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


def _merge_parts(rng, dtype, parts=3, shape=(2, 3, 5, 8)):
    """Partial outputs (row-strided views) and lses (strided, some rows -inf in a part)."""
    b, h, lq, dv = shape
    outputs = [
        rng.standard_normal((b, h, 2 * lq, dv)).astype(dtype)[:, :, ::2] for _ in range(parts)
    ]
    lses = [3 * rng.standard_normal((b, 2 * h, lq)).astype(dtype)[:, ::2] for _ in range(parts)]
    lses[0][0, 0, :2] = -np.inf  # a part that saw no key of those rows
    for x in lses:  # and a row that no part saw: zeros and -inf
        x[1, 2, 4] = -np.inf
    return outputs, lses


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_ctypes_merge_states_matches_python_api(isa, dtype, parts, num_threads):
    rng = np.random.default_rng(6)
    outputs, lses = _merge_parts(rng, dtype, parts)
    out = np.full((2, 3, 5, 8), np.nan, dtype)
    lse = np.full((2, 3, 5), np.nan, dtype)
    args = capi.merge_states_args(outputs, lses, out, lse, num_threads=num_threads)
    assert _call(capi.merge_attention_states, args) == (capi.OK, "")
    want, want_lse = fastattn.merge_attention_states(outputs, lses, num_threads=1)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    assert lse[1, 2, 4] == -np.inf and (out[1, 2, 4] == 0).all()
    # strided outputs: out and lse written in place through their strides
    out2 = np.full((2, 3, 5, 16), np.nan, dtype)
    lse2 = np.full((2, 3, 10), np.nan, dtype)
    args = capi.merge_states_args(outputs, lses, out2[..., :8], lse2[..., ::2])
    assert _call(capi.merge_attention_states, args) == (capi.OK, "")
    np.testing.assert_array_equal(out2[..., :8], want)
    np.testing.assert_array_equal(lse2[..., ::2], want_lse)
    assert np.isnan(out2[..., 8:]).all() and np.isnan(lse2[..., 1::2]).all()


def test_ctypes_merge_states_empty_rows():
    outputs = [np.zeros((2, 0, 5, 8), np.float32)] * 2
    lses = [np.zeros((2, 0, 5), np.float32)] * 2
    out, lse = np.zeros((2, 0, 5, 8), np.float32), np.zeros((2, 0, 5), np.float32)
    args = capi.merge_states_args(outputs, lses, out, lse)
    assert _call(capi.merge_attention_states, args) == (capi.OK, "")


def _bad_merge_calls():
    """(name, mutate(args), whole message or fragment): each makes a good call invalid."""
    prefix = "fastattn C API merge_attention_states: "

    def part(which, i, field, value):
        def mutate(a):
            t = ctypes.cast(getattr(a, which), ctypes.POINTER(capi.Tensor))[i]
            if field == "data":
                t.data = value
            elif field == "extent":
                t.extent = value
            else:
                getattr(t, field)[2] = value

        return mutate

    def tensor(name, field, value):
        def mutate(a):
            t = getattr(a, name)
            if field in ("shape", "strides"):
                getattr(t, field)[2] = value
            else:
                setattr(t, field, value)

        return mutate

    def set_(field, value):
        return lambda a: setattr(a, field, value)

    def out_stride_2(a):  # out[..., :8] of a (..., 16) buffer read as out[..., ::2]
        a.out.strides[3], a.out.extent = 2, 2 * 3 * 5 * 16

    return [
        ("null args", None, prefix + "args is NULL"),
        ("old struct", set_("struct_size", 8), prefix + "struct_size is smaller"),
        ("bad dtype", set_("dtype", 5), prefix + "dtype must be FASTATTN_FLOAT32 or"),
        ("no parts", set_("num_parts", 0), prefix + "num_parts must be >= 1"),
        ("negative parts", set_("num_parts", -1), prefix + "num_parts must be >= 1"),
        ("null outputs", set_("outputs", None), prefix + "outputs and lses must not be NULL"),
        ("null lses", set_("lses", None), prefix + "outputs and lses must not be NULL"),
        ("null part", part("outputs", 1, "data", None), prefix + "outputs[1] is NULL"),
        ("null lse part", part("lses", 2, "data", None), prefix + "lses[2] is NULL"),
        (
            "negative size",
            part("outputs", 2, "shape", -3),
            prefix + "outputs[2] has a negative size",
        ),
        (
            "negative stride",
            part("lses", 0, "strides", -1),
            prefix + "lses[0] has a negative stride",
        ),
        (
            "part overruns",
            part("outputs", 1, "strides", 10**6),
            prefix + "outputs[1] overruns its extent",
        ),
        ("lse part overruns", part("lses", 1, "extent", 4), prefix + "lses[1] overruns its extent"),
        ("null out", tensor("out", "data", None), prefix + "out is NULL"),
        ("null lse", tensor("lse", "data", None), prefix + "lse is NULL"),
        ("lse overruns", tensor("lse", "extent", 29), prefix + "lse overruns its extent"),
        # the engine's own checks, shared with the Python API
        (
            "part shape",
            part("outputs", 1, "shape", 4),
            "fastattn._core.merge_states: outputs[i] has the wrong shape",
        ),
        (
            "lse part shape",
            part("lses", 2, "shape", 4),
            "fastattn._core.merge_states: lses[i] has the wrong shape",
        ),
        (
            "lse shape",
            tensor("lse", "shape", 4),
            "fastattn._core.merge_states: lse has the wrong shape",
        ),
        (
            "out last axis",
            out_stride_2,
            "fastattn._core.merge_states: out must have a unit-stride last axis",
        ),
        (
            "zero threads",
            set_("num_threads", 0),
            "fastattn._core.merge_states: num_threads must be >= 1",
        ),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ctypes_merge_states_bad_calls_return_an_error_status(dtype):
    rng = np.random.default_rng(7)
    outputs, lses = _merge_parts(rng, dtype)
    for name, mutate, message in _bad_merge_calls():
        out = np.full((2, 3, 5, 16), 7.0, dtype)  # room for the wrong-stride case
        lse = np.full((2, 3, 5), 7.0, dtype)
        args = capi.merge_states_args(outputs, lses, out[..., :8], lse)
        if mutate is None:
            status = capi.merge_attention_states(None, msg := ctypes.create_string_buffer(256), 256)
            got = msg.value.decode()
        else:
            mutate(args)
            status, got = _call(capi.merge_attention_states, args)
        assert status == capi.ERROR_INVALID, name
        assert got.startswith(message), (name, got)
        assert (out == 7.0).all() and (lse == 7.0).all(), f"{name}: out or lse was written"
    # misaligned out
    args = capi.merge_states_args(outputs, lses, np.zeros((2, 3, 5, 8), dtype), lse)
    args.out.data += 1
    assert _call(capi.merge_attention_states, args) == (
        capi.ERROR_INVALID,
        "fastattn C API merge_attention_states: out must be aligned to its item size",
    )
    with pytest.raises(ValueError, match="3 outputs but 2 lses"):
        capi.merge_states_args(outputs, lses[:2], out, lse)


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
        (capi.MERGE_STATES_ARGS_DTYPE, capi.MergeStatesArgs),
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


C_CLIENT_V1 = r"""
#include <stddef.h>
#include "fastattn/fastattn.h"

/* The table as a consumer compiled against version 1 of the header saw it. */
typedef struct capi_v1 {
  uint32_t version;
  uint32_t size;
  const char *library_version;
  fastattn_sdpa_fn sdpa;
  fastattn_masked_softmax_fn masked_softmax;
} capi_v1;

/* version 1's import rule (fastattn_import): version and size at least its own */
int v1_accepts(const void *table) {
  const capi_v1 *api = (const capi_v1 *)table;
  return api->version >= 1 && api->size >= sizeof(capi_v1);
}

/* version 2 only appended: every version 1 member is where version 1 put it */
int v1_layout_kept(void) {
  return sizeof(capi_v1) == offsetof(fastattn_capi, merge_attention_states) &&
         offsetof(capi_v1, library_version) == offsetof(fastattn_capi, library_version) &&
         offsetof(capi_v1, sdpa) == offsetof(fastattn_capi, sdpa) &&
         offsetof(capi_v1, masked_softmax) == offsetof(fastattn_capi, masked_softmax);
}

int v1_masked_softmax(const void *table, const fastattn_masked_softmax_args *a, char *msg,
                      size_t n) {
  return ((const capi_v1 *)table)->masked_softmax(a, msg, n);
}

/* the merge struct's layout as C sees it: its size, then each member's offset */
size_t merge_layout(int i) {
  const size_t at[] = {sizeof(fastattn_merge_states_args),
                       offsetof(fastattn_merge_states_args, struct_size),
                       offsetof(fastattn_merge_states_args, dtype),
                       offsetof(fastattn_merge_states_args, num_threads),
                       offsetof(fastattn_merge_states_args, num_parts),
                       offsetof(fastattn_merge_states_args, outputs),
                       offsetof(fastattn_merge_states_args, lses),
                       offsetof(fastattn_merge_states_args, out),
                       offsetof(fastattn_merge_states_args, lse)};
  return at[i];
}
"""


def test_a_version_1_consumer_still_imports_and_calls(tmp_path):
    lib = ctypes.CDLL(str(build_c_library(C_CLIENT_V1, tmp_path)))
    lib.v1_accepts.argtypes = [ctypes.c_void_p]
    lib.v1_masked_softmax.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.merge_layout.restype = ctypes.c_size_t
    assert capi.table().version == 2
    assert lib.v1_accepts(capi.table_address()) == 1
    assert lib.v1_layout_kept() == 1
    x = np.random.default_rng(8).standard_normal((1, 2, 3, 4))
    out = np.full_like(x, np.nan)
    args = capi.masked_softmax_args(x, out)
    msg = ctypes.create_string_buffer(200)
    assert lib.v1_masked_softmax(capi.table_address(), ctypes.addressof(args), msg, 200) == capi.OK
    np.testing.assert_array_equal(out, fastattn.masked_softmax(x))
    # the ctypes mirror of the version 2 struct is C's layout
    fields = [name for name, _ in capi.MergeStatesArgs._fields_]
    assert lib.merge_layout(0) == ctypes.sizeof(capi.MergeStatesArgs)
    for i, name in enumerate(fields, 1):
        assert lib.merge_layout(i) == getattr(capi.MergeStatesArgs, name).offset, name

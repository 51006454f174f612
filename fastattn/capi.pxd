# cython: language_level=3
# fastattn's C API for Cython: `cimport fastattn.capi` (or `from fastattn.capi cimport ...`),
# compile with fastattn.get_include() on the include path, call import_fastattn() once at
# module import (GIL held), then call sdpa()/masked_softmax()/merge_attention_states() (or the
# table directly) from
# nogil code, prange loops included. See the header fastattn/fastattn.h for the contract.
# The calls are reentrant, so a module that uses only them and import_fastattn() (at module
# import) may declare `# cython: freethreading_compatible=True` for a free-threaded CPython.
cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset, strncpy

cdef extern from "fastattn/fastattn.h" nogil:
    enum:
        FASTATTN_CAPI_VERSION
        FASTATTN_OK
        FASTATTN_ERROR_INVALID
        FASTATTN_ERROR_NO_MEMORY
        FASTATTN_ERROR_INTERNAL
        FASTATTN_FLOAT32
        FASTATTN_FLOAT64

    ctypedef struct fastattn_tensor:
        void* data
        int64_t shape[4]
        int64_t strides[4]
        int64_t extent

    ctypedef struct fastattn_sdpa_args:
        size_t struct_size
        int32_t dtype
        int32_t num_threads
        fastattn_tensor q, k, v, out
        fastattn_tensor bool_mask, float_mask, valid_lens, lse
        double scale
        double softcap
        int32_t causal
        int64_t diag_offset
        int64_t window_left, window_right

    ctypedef struct fastattn_masked_softmax_args:
        size_t struct_size
        int32_t dtype
        int32_t num_threads
        fastattn_tensor x, out, mask, valid_lens

    ctypedef struct fastattn_merge_states_args:
        size_t struct_size
        int32_t dtype
        int32_t num_threads
        int64_t num_parts
        const fastattn_tensor* outputs
        const fastattn_tensor* lses
        fastattn_tensor out, lse

    ctypedef int (*fastattn_sdpa_fn)(const fastattn_sdpa_args*, char*, size_t) noexcept nogil
    ctypedef int (*fastattn_masked_softmax_fn)(
        const fastattn_masked_softmax_args*, char*, size_t) noexcept nogil
    ctypedef int (*fastattn_merge_states_fn)(
        const fastattn_merge_states_args*, char*, size_t) noexcept nogil

    ctypedef struct fastattn_capi:
        uint32_t version
        uint32_t size
        const char* library_version
        fastattn_sdpa_fn sdpa
        fastattn_masked_softmax_fn masked_softmax
        fastattn_merge_states_fn merge_attention_states

    # The header's per-module table pointer, set by fastattn_import().
    const fastattn_capi* fastattn_api_table

cdef extern from "fastattn/fastattn.h":
    int fastattn_import() except -1


cdef inline int import_fastattn() except -1:
    """Fetch the table (raises ImportError on a too-old fastattn). Call once, GIL held."""
    return fastattn_import()


ctypedef fused real:
    float
    double


cdef inline Py_ssize_t _size(Py_ssize_t* shape) noexcept nogil:
    return shape[0] * shape[1] * shape[2] * shape[3]


cdef inline fastattn_tensor _tensor(char* data, Py_ssize_t* shape, Py_ssize_t* strides,
                                    Py_ssize_t ndim, Py_ssize_t itemsize) noexcept nogil:
    # Element strides; the extent is what the view itself reaches (a memoryview does not
    # say more), so the entry point's overrun check is about these views.
    cdef fastattn_tensor t
    cdef Py_ssize_t d
    cdef int64_t reach = 0
    cdef bint empty = False
    t.data = <void*>data
    for d in range(4):
        t.strides[d] = 0
    for d in range(4):
        t.shape[d] = 0
    for d in range(ndim):
        t.shape[d] = shape[d]
        t.strides[d] = strides[d] // itemsize
        if shape[d] == 0:
            empty = True
        elif strides[d] > 0:
            reach += (shape[d] - 1) * t.strides[d]
    t.extent = 0 if empty else reach + 1
    return t


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline void sdpa_args_init(fastattn_sdpa_args* a, const real[:, :, :, :] q,
                                const real[:, :, :, :] k, const real[:, :, :, :] v,
                                real[:, :, :, :] out, double scale) noexcept nogil:
    """Fills a with these 4-D (batch, heads, len, dim) views (unit-stride last axes, other
    strides >= 0: slices of a KV cache are fine) and the defaults: no mask, not causal, no
    window, no softcap, one thread. Set more fields, then call fastattn_api_table.sdpa."""
    cdef Py_ssize_t isz = sizeof(real)
    memset(a, 0, sizeof(a[0]))
    a.struct_size = sizeof(fastattn_sdpa_args)
    a.dtype = FASTATTN_FLOAT32 if real is float else FASTATTN_FLOAT64
    a.num_threads = 1
    a.q = _tensor(<char*>&q[0, 0, 0, 0] if _size(q.shape) else NULL, q.shape, q.strides, 4, isz)
    a.k = _tensor(<char*>&k[0, 0, 0, 0] if _size(k.shape) else NULL, k.shape, k.strides, 4, isz)
    a.v = _tensor(<char*>&v[0, 0, 0, 0] if _size(v.shape) else NULL, v.shape, v.strides, 4, isz)
    a.out = _tensor(<char*>&out[0, 0, 0, 0] if _size(out.shape) else NULL, out.shape,
                    out.strides, 4, isz)
    a.scale = scale
    a.window_left = -1
    a.window_right = -1


cdef inline int sdpa(const real[:, :, :, :] q, const real[:, :, :, :] k,
                     const real[:, :, :, :] v, real[:, :, :, :] out, double scale,
                     bint causal=False, int64_t diag_offset=0, int num_threads=1,
                     char* msg=NULL, size_t msg_size=0) noexcept nogil:
    """Scaled dot-product attention of 4-D views (see sdpa_args_init), optionally causal
    (diag_offset: 0 = top-left alignment, len_k - len_q = bottom-right). Returns a
    FASTATTN_* status; unless FASTATTN_OK, the message goes to msg. import_fastattn() first.
    (Cython passes optional arguments of a cdef function in order: give the earlier ones.)"""
    cdef fastattn_sdpa_args a
    sdpa_args_init(&a, q, k, v, out, scale)
    a.causal = causal
    a.diag_offset = diag_offset
    a.num_threads = num_threads
    return fastattn_api_table.sdpa(&a, msg, msg_size)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline int masked_softmax(const real[:, :, :, :] x, real[:, :, :, :] out,
                               const uint8_t[:, :, :, :] mask=None, int num_threads=1,
                               char* msg=NULL, size_t msg_size=0) noexcept nogil:
    """Masked softmax along the last axis of 4-D views (any strides >= 0); mask optional
    (None), 1 = keep. Returns a FASTATTN_* status. import_fastattn() first."""
    cdef fastattn_masked_softmax_args a
    cdef Py_ssize_t isz = sizeof(real)
    memset(&a, 0, sizeof(a))
    a.struct_size = sizeof(fastattn_masked_softmax_args)
    a.dtype = FASTATTN_FLOAT32 if real is float else FASTATTN_FLOAT64
    a.num_threads = num_threads
    a.x = _tensor(<char*>&x[0, 0, 0, 0] if _size(x.shape) else NULL, x.shape, x.strides, 4, isz)
    a.out = _tensor(<char*>&out[0, 0, 0, 0] if _size(out.shape) else NULL, out.shape,
                    out.strides, 4, isz)
    if mask is not None:
        a.mask = _tensor(<char*>&mask[0, 0, 0, 0] if _size(mask.shape) else NULL, mask.shape,
                         mask.strides, 4, 1)
    return fastattn_api_table.masked_softmax(&a, msg, msg_size)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline int merge_attention_states(const real[:, :, :, :, :] outputs,
                                       const real[:, :, :, :] lses, real[:, :, :, :] out,
                                       real[:, :, :] lse, int num_threads=1, char* msg=NULL,
                                       size_t msg_size=0) noexcept nogil:
    """Merges the parts stacked on the first axis: outputs (parts, batch, heads, len_q,
    dim_v) with a unit-stride last axis, lses (parts, batch, heads, len_q), into out and
    lse (see the header). Returns a FASTATTN_* status. import_fastattn() first."""
    cdef fastattn_merge_states_args a
    cdef Py_ssize_t isz = sizeof(real), i, n = outputs.shape[0]
    cdef int status
    if lses.shape[0] != n:  # the C struct has one count for both
        if msg != NULL and msg_size > 0:
            strncpy(msg, b"fastattn.capi merge_attention_states: outputs and lses stack "
                    b"different numbers of parts", msg_size - 1)
            msg[msg_size - 1] = 0
        return FASTATTN_ERROR_INVALID
    cdef fastattn_tensor* parts = <fastattn_tensor*>malloc(2 * (n if n > 0 else 1)
                                                           * sizeof(fastattn_tensor))
    if parts == NULL:
        return FASTATTN_ERROR_NO_MEMORY
    memset(&a, 0, sizeof(a))
    a.struct_size = sizeof(fastattn_merge_states_args)
    a.dtype = FASTATTN_FLOAT32 if real is float else FASTATTN_FLOAT64
    a.num_threads = num_threads
    a.num_parts = n
    for i in range(n):
        parts[i] = _tensor(<char*>&outputs[i, 0, 0, 0, 0] if _size(&outputs.shape[1]) else NULL,
                           &outputs.shape[1], &outputs.strides[1], 4, isz)
        parts[n + i] = _tensor(<char*>&lses[i, 0, 0, 0] if _size(lses.shape) else NULL,
                               &lses.shape[1], &lses.strides[1], 3, isz)
    a.outputs = parts
    a.lses = parts + n
    a.out = _tensor(<char*>&out[0, 0, 0, 0] if _size(out.shape) else NULL, out.shape,
                    out.strides, 4, isz)
    a.lse = _tensor(<char*>&lse[0, 0, 0] if lse.shape[0] * lse.shape[1] * lse.shape[2] else NULL,
                    lse.shape, lse.strides, 3, isz)
    status = fastattn_api_table.merge_attention_states(&a, msg, msg_size)
    free(parts)
    return status

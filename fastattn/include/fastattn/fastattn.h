/* fastattn's C API: attention from C, C++, Cython or Numba without the Python interpreter
 * in the loop. Plain C (C99 and C++ both compile it); nothing here needs Python or the GIL.
 *
 * The functions live in a table that the compiled module fastattn._core exports as the
 * PyCapsule "fastattn._core._C_API" (NumPy's _ARRAY_API pattern). Fetch it once, with the
 * GIL held: from C/Cython code that includes Python.h, fastattn_import() below; from Python,
 * fastattn.capi.table_address(). After that every call is GIL-free and thread-safe.
 *
 * Versioning: the table starts with its version and its size in bytes; later versions only
 * append members. A consumer compiled against this header works with any library whose
 * table has version >= the one it needs (fastattn_import checks FASTATTN_CAPI_VERSION).
 * The argument structs start with struct_size (set it to sizeof the struct you filled):
 * members added in later versions sit at the end, and a smaller struct_size means "absent",
 * so their zero value is always the default.
 *
 * Layout: tensors are 4-D (batch, heads, rows, columns) with int64 ELEMENT strides, which
 * must be >= 0 (0 broadcasts); q/k/v/out need a unit-stride last axis, lse is C-contiguous.
 * Every tensor also says how many elements its buffer holds from its data pointer
 * (its `extent`); a call whose shapes and strides would step outside a buffer is refused, as
 * is any other broken invariant (null required pointer, negative size, misaligned pointer,
 * wrong shape): the function returns a nonzero status and writes a message into `msg`,
 * and touches no data. Results are the same bits as the Python API's for the same inputs.
 */
#ifndef FASTATTN_FASTATTN_H_
#define FASTATTN_FASTATTN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The table version this header describes. */
#define FASTATTN_CAPI_VERSION 2
#define FASTATTN_CAPI_CAPSULE "fastattn._core._C_API"

/* Status codes. */
#define FASTATTN_OK 0
#define FASTATTN_ERROR_INVALID 1   /* a broken invariant: shape, stride, pointer, option */
#define FASTATTN_ERROR_NO_MEMORY 2 /* scratch memory could not be allocated */
#define FASTATTN_ERROR_INTERNAL 3  /* anything else (a bug: please report it) */

/* Element types of q/k/v/out/lse/float_mask (bool masks are uint8, valid_lens int64). */
#define FASTATTN_FLOAT32 0
#define FASTATTN_FLOAT64 1

/* One tensor: data, its shape and element strides (batch, head, row, column; 3-D tensors
 * leave the last entry unused), and the number of elements the buffer holds from data on
 * (checked against the reach of the shape and strides). data may be NULL only for an
 * absent optional tensor or an empty one. */
typedef struct fastattn_tensor {
  void* data;
  int64_t shape[4];
  int64_t strides[4];
  int64_t extent;
} fastattn_tensor;

/* scaled dot-product attention, softmax(q k^T * scale [+ float_mask]) v, in blocks.
 * Shapes (each tensor states its own; they must agree):
 *   q (batch, heads_q, len_q, dim_qk), k (batch, heads_kv, len_k, dim_qk),
 *   v (batch, heads_kv, len_k, dim_v), out (batch, heads_q, len_q, dim_v);
 *   heads_kv divides heads_q (grouped-query attention).
 * Optional (data NULL = absent): bool_mask uint8 (batch, heads_q, len_q, len_k), 1 = may
 * attend; float_mask of the dtype, same shape, added to the scores; valid_lens int64
 * (batch, heads_q, len_q) keys visible per row (column stride unused); lse, out's dtype,
 * C-contiguous (batch, heads_q, len_q), receives the log-sum-exp of each row.
 * Visibility: with d = i + diag_offset, key j is visible to row i iff causal implies
 * j <= d and d - window_left <= j <= d + window_right (-1 = unbounded side);
 * diag_offset = 0 is top-left alignment, len_k - len_q bottom-right.
 * softcap > 0 caps scores as softcap * tanh(s / softcap) (0 = none). num_threads >= 1.
 * A row that sees no key gets output 0 and lse -inf (docs/semantics.md, as in Python). */
typedef struct fastattn_sdpa_args {
  size_t struct_size; /* sizeof(fastattn_sdpa_args) */
  int32_t dtype;      /* FASTATTN_FLOAT32 or FASTATTN_FLOAT64 */
  int32_t num_threads;
  fastattn_tensor q, k, v, out;
  fastattn_tensor bool_mask, float_mask, valid_lens, lse;
  double scale;
  double softcap;
  int32_t causal; /* nonzero = causal */
  int32_t reserved_;
  int64_t diag_offset;
  int64_t window_left, window_right;
} fastattn_sdpa_args;

/* masked softmax along the last axis of x (batch, heads, rows, len) into out (same shape);
 * mask uint8 (same shape, 1 = keep) and valid_lens int64 (batch, heads, rows) optional.
 * Strides may be anything >= 0 on every axis. A row with nothing kept gets zeros. */
typedef struct fastattn_masked_softmax_args {
  size_t struct_size; /* sizeof(fastattn_masked_softmax_args) */
  int32_t dtype;
  int32_t num_threads;
  fastattn_tensor x, out, mask, valid_lens;
} fastattn_masked_softmax_args;

/* merge_attention_states (version 2): attention results of the same queries over disjoint
 * key sets, each with its log-sum-exp, merged into the attention over all the keys:
 * per row lse = log(sum_i exp(lse_i)) and out = sum_i exp(lse_i - lse) * out_i, parts
 * summed in the order given (docs/semantics.md#merging-partial-attention; as in Python).
 * outputs and lses point to num_parts >= 1 tensors each (these two arrays of tensors need
 * to live only for the call): outputs[i] (batch, heads, len_q, dim_v), unit-stride last
 * axis, lses[i] (batch, heads, len_q), any strides >= 0 elsewhere; every part has out's
 * shape (parts do not broadcast). out (batch, heads, len_q, dim_v), unit-stride last axis,
 * and lse (batch, heads, len_q), any strides >= 0, are written. All of the dtype. */
typedef struct fastattn_merge_states_args {
  size_t struct_size; /* sizeof(fastattn_merge_states_args) */
  int32_t dtype;
  int32_t num_threads;
  int64_t num_parts;
  const fastattn_tensor* outputs; /* num_parts tensors */
  const fastattn_tensor* lses;    /* num_parts tensors */
  fastattn_tensor out, lse;
} fastattn_merge_states_args;

/* Each function returns a status; unless it is FASTATTN_OK, a NUL-terminated message
 * (truncated to msg_size bytes) is written to msg when msg is not NULL and msg_size > 0. */
typedef int (*fastattn_sdpa_fn)(const fastattn_sdpa_args* args, char* msg, size_t msg_size);
typedef int (*fastattn_masked_softmax_fn)(const fastattn_masked_softmax_args* args, char* msg,
                                          size_t msg_size);
typedef int (*fastattn_merge_states_fn)(const fastattn_merge_states_args* args, char* msg,
                                        size_t msg_size);

typedef struct fastattn_capi {
  uint32_t version;            /* FASTATTN_CAPI_VERSION of the library */
  uint32_t size;               /* sizeof(fastattn_capi) of the library */
  const char* library_version; /* fastattn.__version__ */
  fastattn_sdpa_fn sdpa;
  fastattn_masked_softmax_fn masked_softmax;
  /* version 2 */
  fastattn_merge_states_fn merge_attention_states;
  /* later versions: new members are appended here */
} fastattn_capi;

#ifdef __cplusplus
}
#endif

/* With Python.h included first (as Cython does): fetch the table once, GIL held.
 * Returns 0, or -1 with a Python exception set. */
#if defined(Py_PYTHON_H) && !defined(FASTATTN_NO_IMPORT)
static const fastattn_capi* fastattn_api_table = NULL;

static inline int fastattn_import(void) {
  const fastattn_capi* api;
  if (fastattn_api_table != NULL) return 0;
  api = (const fastattn_capi*)PyCapsule_Import(FASTATTN_CAPI_CAPSULE, 0);
  if (api == NULL) return -1;
  if (api->version < FASTATTN_CAPI_VERSION || api->size < sizeof(fastattn_capi)) {
    PyErr_Format(PyExc_ImportError,
                 "fastattn's C API is version %u, this module was compiled against version %d "
                 "(upgrade fastattn)",
                 (unsigned)api->version, FASTATTN_CAPI_VERSION);
    return -1;
  }
  fastattn_api_table = api;
  return 0;
}
#endif

#endif /* FASTATTN_FASTATTN_H_ */

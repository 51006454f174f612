#include "api/capi.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "api/family.h"
#include "api/merge_states.h"
#include "api/sdpa.h"

namespace fastattn {
namespace {

[[noreturn]] void capi_fail(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string("fastattn C API ") + fn + ": " + what);
}

// A C tensor (its first ndim axes) as an ArrayRef (byte strides), after the checks the
// Python layer's arrays get for free from NumPy: a pointer where data is read, strides >= 0,
// alignment, and every element the shapes and strides reach inside the stated extent.
// An absent optional tensor (data NULL) stays absent. Axes of length <= 1 are never
// stepped along: their strides are ignored. Fills r in place, so that a reused ArrayRef
// keeps its vectors' storage (see per_thread below).
void tensor_ref(const char* fn, const char* name, const fastattn_tensor& t, int ndim, char kind,
                int64_t itemsize, bool required, bool written, ArrayRef& r) {
  r.given = false;
  const int64_t* n = t.shape;
  bool empty = false;
  for (int d = 0; d < ndim; ++d) {
    if (n[d] < 0) capi_fail(fn, std::string(name) + " has a negative size");
    empty = empty || n[d] == 0;
  }
  if (t.data == nullptr) {
    if (required && !empty) capi_fail(fn, std::string(name) + " is NULL");
    if (!required) return;
  }
  int64_t reach = 0;  // the largest element offset any index reaches
  for (int d = 0; d < ndim && !empty; ++d) {
    if (n[d] <= 1) continue;
    if (t.strides[d] < 0) capi_fail(fn, std::string(name) + " has a negative stride");
    int64_t step = 0;
    if (__builtin_mul_overflow(n[d] - 1, t.strides[d], &step) ||
        __builtin_add_overflow(reach, step, &reach))
      capi_fail(fn, std::string(name) + "'s strides overflow");
  }
  int64_t reach_bytes = 0;
  if (!empty && (reach >= t.extent || __builtin_mul_overflow(reach + 1, itemsize, &reach_bytes)))
    capi_fail(fn, std::string(name) + " overruns its extent: its shape and strides reach element " +
                      std::to_string(reach) + ", its buffer holds " + std::to_string(t.extent));
  if (reinterpret_cast<std::uintptr_t>(t.data) % itemsize != 0)
    capi_fail(fn, std::string(name) + " must be aligned to its item size");
  r.given = true;
  r.data = t.data;
  r.kind = kind;
  r.itemsize = itemsize;
  r.writeable = written;
  r.shape.assign(n, n + ndim);
  r.strides.resize(ndim);
  for (int d = 0; d < ndim; ++d) r.strides[d] = n[d] <= 1 ? 0 : t.strides[d] * itemsize;
}

// The engine's call structs hold their shapes in std::vectors: one call struct per thread,
// reused, allocates them once instead of on every call (a few hundred ns of a ~1 us call).
template <class Call>
Call& per_thread() {
  thread_local Call call;
  return call;
}

int64_t dtype_itemsize(const char* fn, int32_t dtype) {
  if (dtype == FASTATTN_FLOAT32) return 4;
  if (dtype == FASTATTN_FLOAT64) return 8;
  capi_fail(fn, "dtype must be FASTATTN_FLOAT32 or FASTATTN_FLOAT64");
}

// Copies args into a zeroed struct of this version: members that an older caller's
// struct_size leaves out keep their zero default.
template <class Args>
Args read_args(const char* fn, const Args* args, size_t first_version_size) {
  if (args == nullptr) capi_fail(fn, "args is NULL");
  if (args->struct_size < first_version_size)
    capi_fail(fn, "struct_size is smaller than any version of the argument struct");
  Args a;
  std::memset(&a, 0, sizeof a);
  std::memcpy(&a, args, args->struct_size < sizeof a ? args->struct_size : sizeof a);
  return a;
}

void sdpa(const fastattn_sdpa_args* args) {
  const char* fn = "sdpa";
  const fastattn_sdpa_args a = read_args(fn, args, sizeof(fastattn_sdpa_args));
  const int64_t itemsize = dtype_itemsize(fn, a.dtype);
  SdpaCall& c = per_thread<SdpaCall>();
  // Shapes agree or not: the engine's one entry check (check_attention) says.
  tensor_ref(fn, "q", a.q, 4, 'f', itemsize, true, false, c.query);
  tensor_ref(fn, "k", a.k, 4, 'f', itemsize, true, false, c.key);
  tensor_ref(fn, "v", a.v, 4, 'f', itemsize, true, false, c.value);
  tensor_ref(fn, "out", a.out, 4, 'f', itemsize, true, true, c.out);
  tensor_ref(fn, "bool_mask", a.bool_mask, 4, 'b', 1, false, false, c.bool_mask);
  tensor_ref(fn, "float_mask", a.float_mask, 4, 'f', itemsize, false, false, c.float_mask);
  tensor_ref(fn, "valid_lens", a.valid_lens, 3, 'i', 8, false, false, c.valid_lens);
  tensor_ref(fn, "lse", a.lse, 3, 'f', itemsize, false, true, c.lse);
  c.weights.given = false;  // the C API returns no weights
  c.scale = a.scale;
  c.softcap = a.softcap;
  c.causal = a.causal != 0;
  c.diag_offset = a.diag_offset;
  c.window_left = a.window_left;
  c.window_right = a.window_right;
  c.num_threads = a.num_threads;
  scaled_dot_product_attention(c);
}

void masked_softmax(const fastattn_masked_softmax_args* args) {
  const char* fn = "masked_softmax";
  const fastattn_masked_softmax_args a = read_args(fn, args, sizeof(fastattn_masked_softmax_args));
  const int64_t itemsize = dtype_itemsize(fn, a.dtype);
  MaskedSoftmaxCall& c = per_thread<MaskedSoftmaxCall>();
  tensor_ref(fn, "x", a.x, 4, 'f', itemsize, true, false, c.x);
  tensor_ref(fn, "out", a.out, 4, 'f', itemsize, true, true, c.out);
  tensor_ref(fn, "mask", a.mask, 4, 'b', 1, false, false, c.mask);
  tensor_ref(fn, "valid_lens", a.valid_lens, 3, 'i', 8, false, false, c.valid_lens);
  c.num_threads = a.num_threads;
  fastattn::masked_softmax(c);
}

void merge_attention_states(const fastattn_merge_states_args* args) {
  const char* fn = "merge_attention_states";
  const fastattn_merge_states_args a = read_args(fn, args, sizeof(fastattn_merge_states_args));
  const int64_t itemsize = dtype_itemsize(fn, a.dtype);
  if (a.num_parts < 1) capi_fail(fn, "num_parts must be >= 1");
  if (a.outputs == nullptr || a.lses == nullptr) capi_fail(fn, "outputs and lses must not be NULL");
  MergeStatesCall& c = per_thread<MergeStatesCall>();
  const size_t parts = size_t(a.num_parts);
  // resize, not assign: the ArrayRefs keep their vectors' storage from call to call.
  c.outputs.resize(parts);
  c.lses.resize(parts);
  char name[40];  // "outputs[i]", for the messages: on the stack, no allocation per part
  for (size_t i = 0; i < parts; ++i) {
    std::snprintf(name, sizeof name, "outputs[%zu]", i);
    tensor_ref(fn, name, a.outputs[i], 4, 'f', itemsize, true, false, c.outputs[i]);
    std::snprintf(name, sizeof name, "lses[%zu]", i);
    tensor_ref(fn, name, a.lses[i], 3, 'f', itemsize, true, false, c.lses[i]);
  }
  tensor_ref(fn, "out", a.out, 4, 'f', itemsize, true, true, c.out);
  tensor_ref(fn, "lse", a.lse, 3, 'f', itemsize, true, true, c.lse);
  c.num_threads = a.num_threads;
  // Shapes agree across parts and with out/lse, unit-stride last axes: the engine's check.
  fastattn::merge_attention_states(c);
}

void copy_message(const char* what, char* msg, size_t msg_size) noexcept {
  if (msg == nullptr || msg_size == 0) return;
  const size_t n = std::min(std::strlen(what), msg_size - 1);
  std::memcpy(msg, what, n);
  msg[n] = '\0';
}

// The boundary: no exception leaves; the message is copied while the exception lives.
template <class F>
int guarded(F&& body, char* msg, size_t msg_size) noexcept {
  try {
    body();
    return FASTATTN_OK;
  } catch (const std::invalid_argument& e) {
    copy_message(e.what(), msg, msg_size);
    return FASTATTN_ERROR_INVALID;
  } catch (const std::bad_alloc& e) {
    copy_message(e.what(), msg, msg_size);
    return FASTATTN_ERROR_NO_MEMORY;
  } catch (const std::exception& e) {
    copy_message(e.what(), msg, msg_size);
    return FASTATTN_ERROR_INTERNAL;
  } catch (...) {
    copy_message("fastattn C API: unknown error", msg, msg_size);
    return FASTATTN_ERROR_INTERNAL;
  }
}

extern "C" int capi_sdpa(const fastattn_sdpa_args* args, char* msg, size_t msg_size) {
  return guarded([&] { sdpa(args); }, msg, msg_size);
}

extern "C" int capi_masked_softmax(const fastattn_masked_softmax_args* args, char* msg,
                                   size_t msg_size) {
  return guarded([&] { masked_softmax(args); }, msg, msg_size);
}

extern "C" int capi_merge_states(const fastattn_merge_states_args* args, char* msg,
                                 size_t msg_size) {
  return guarded([&] { merge_attention_states(args); }, msg, msg_size);
}

}  // namespace

const fastattn_capi* capi_table() {
  static const fastattn_capi table = {
      FASTATTN_CAPI_VERSION, sizeof(fastattn_capi), FASTATTN_VERSION, capi_sdpa,
      capi_masked_softmax,   capi_merge_states,
  };
  return &table;
}

}  // namespace fastattn

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/merge_states.h"
#include "api/sdpa.h"
#include "api/threads.h"
#include "bindings/array_ref.h"
#include "bindings/attention_args.h"
#include "bindings/interruptible.h"
#include "bindings/mask_summary.h"

namespace py = pybind11;

namespace fastattn {

// ---------------------------------------------------------------------------------------
// The fast path of fastattn.scaled_dot_product_attention (see fastattn/_sdpa.py): the
// common call (NumPy arrays of float32 or float64, the usual options) checked here by the
// same check_attention the full path ends in, computed, and returned; None for anything
// else, so the full Python path runs and raises its own messages. It never raises for a
// call it declines.

namespace {

// The thread count a call without num_threads= gets, the one rule of fastattn/_threads.py
// (which calls default_threads below): the set_num_threads setting (pushed by
// set_thread_defaults), else the environment, else the CPUs available (kAvailableCpus:
// read when the call is large enough to use them, api/threads.h). The environment is read
// with getenv on each call and parsed again only when it changed.
struct ThreadDefaults {
  int setting = 0;  // set_num_threads(); 0 = follow the environment
  // The last environment parsed: FASTATTN_NUM_THREADS and OMP_NUM_THREADS (null if
  // unset), and the count they gave (0: neither set; -1: a form left to the Python parser).
  bool seen = false, set_fa = false, set_omp = false;
  std::string fa, omp;
  int parsed = -1;
};
ThreadDefaults g_threads;  // read and written under StateLock

// The fast path's shared state (g_threads, the keyword-name cache of bind_args) is guarded
// by the GIL on a default build; on a free-threaded build (Py_GIL_DISABLED), where calls
// from several threads run this code at once, by a PyMutex (which lets the interpreter
// stop the world while a thread waits for it). Nothing inside calls into Python code.
#ifdef Py_GIL_DISABLED
PyMutex g_state_mutex = {0};
struct StateLock {
  StateLock() { PyMutex_Lock(&g_state_mutex); }
  ~StateLock() { PyMutex_Unlock(&g_state_mutex); }
  StateLock(const StateLock&) = delete;
  StateLock& operator=(const StateLock&) = delete;
};
#else
struct StateLock {
  StateLock() {}  // the GIL is held
};
#endif

// The count one environment value gives, or 0 when it is empty (look further), or -1 for
// a form this parser leaves to Python's (which accepts more, or raises).
int parse_threads(const char* raw) {
  const char* s = raw;
  while (*s == ' ' || *s == '\t') ++s;
  if (*s == '\0') return 0;
  int64_t n = 0;
  int digits = 0;
  for (; *s >= '0' && *s <= '9'; ++s) {
    if (++digits > 9) return -1;
    n = n * 10 + (*s - '0');
  }
  while (*s == ' ' || *s == '\t') ++s;
  if (digits == 0 || n < 1 || (*s != '\0' && *s != ',')) return -1;
  return int(n);
}

// The two variables, in precedence order; fastattn/_threads.py reads them through
// thread_environment below.
constexpr const char* kThreadVariables[2] = {"FASTATTN_NUM_THREADS", "OMP_NUM_THREADS"};

int environment_threads() {
  ThreadDefaults& t = g_threads;
  const char* fa = std::getenv(kThreadVariables[0]);
  const char* omp = std::getenv(kThreadVariables[1]);
  if (!(t.seen && t.set_fa == (fa != nullptr) && t.set_omp == (omp != nullptr) &&
        (!fa || t.fa == fa) && (!omp || t.omp == omp))) {
    t.seen = true;
    t.set_fa = fa != nullptr;
    t.set_omp = omp != nullptr;
    t.fa = fa ? fa : "";
    t.omp = omp ? omp : "";
    t.parsed = 0;
    for (const char* raw : {fa, omp}) {
      if (!raw) continue;
      t.parsed = parse_threads(raw);
      if (t.parsed != 0) break;
    }
  }
  return t.parsed;
}

// The default count before the cap: the setting, the environment's, kAvailableCpus, or -1
// for an environment form left to the Python parser.
int default_threads() {
  if (g_threads.setting > 0) return g_threads.setting;
  const int env = environment_threads();
  return env == 0 ? kAvailableCpus : env;
}

// The resolved count (as _threads.resolve; kAvailableCpus left for the kernels' call to
// resolve), or -1 to decline.
int resolve_threads(PyObject* num_threads) {
  int n;
  if (num_threads == Py_None) {
    {
      StateLock lock;
      n = default_threads();
    }
    if (n == kAvailableCpus) return in_forked_child() ? 1 : n;
  } else {
    if (!PyLong_CheckExact(num_threads)) return -1;  // bools and the like: Python's rules
    const long v = PyLong_AsLong(num_threads);
    if (v < 1 || v > (1L << 30)) {
      PyErr_Clear();
      return -1;
    }
    n = int(v);
  }
  if (n < 1) return -1;
  return resolve_available(n);
}

enum FastArg {
  kQuery,
  kKey,
  kValue,
  kAttnMask,
  kValidLens,
  kIsCausal,
  kCausalAlignment,
  kWindow,
  kScale,
  kSoftcap,
  kReturnLse,
  kReturnWeights,
  kOut,
  kNumThreads,
  kSinks,
  kAlibiSlopes,
  kNumFastArgs
};
constexpr const char* kFastArgNames[kNumFastArgs] = {"query",
                                                     "key",
                                                     "value",
                                                     "attn_mask",
                                                     "valid_lens",
                                                     "is_causal",
                                                     "causal_alignment",
                                                     "window",
                                                     "scale",
                                                     "softcap",
                                                     "return_lse",
                                                     "return_weights",
                                                     "out",
                                                     "num_threads",
                                                     "sinks",
                                                     "alibi_slopes"};

// The keyword names of the last call and where each goes: the caller passes the same
// constant tuple every time, so the names are matched once.
PyObject* g_last_kwnames = nullptr;
int g_last_slots[kNumFastArgs];

bool bind_args(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** slot) {
  for (int i = 0; i < kNumFastArgs; ++i) slot[i] = nullptr;
  if (nargs > kNumFastArgs) return false;
  for (Py_ssize_t i = 0; i < nargs; ++i) slot[i] = args[i];
  if (kwnames) {
    const Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
    if (nk > kNumFastArgs) return false;
    StateLock lock;
    if (kwnames != g_last_kwnames) {
      int slots[kNumFastArgs];  // (the cache changes only for names that all matched)
      for (Py_ssize_t j = 0; j < nk; ++j) {
        int found = -1;
        for (int i = 0; i < kNumFastArgs && found < 0; ++i)
          if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, j), kFastArgNames[i]) == 0)
            found = i;
        if (found < 0) return false;
        slots[j] = found;
      }
      std::copy(slots, slots + nk, g_last_slots);
      Py_XDECREF(g_last_kwnames);
      Py_INCREF(kwnames);
      g_last_kwnames = kwnames;
    }
    for (Py_ssize_t j = 0; j < nk; ++j) {
      PyObject*& s = slot[g_last_slots[j]];
      if (s) return false;
      s = args[nargs + j];
    }
  }
  for (int i = 0; i < kNumFastArgs; ++i)
    if (!slot[i]) return false;
  return true;
}

// Whether s is the str `text`; `interned` is that str interned, which a literal in the
// caller's source is, so the usual call is one pointer comparison.
bool is_ascii(PyObject* s, PyObject* interned, const char* text) {
  return s == interned ||
         (PyUnicode_CheckExact(s) && PyUnicode_CompareWithASCIIString(s, text) == 0);
}
PyObject* g_bottom_right = nullptr;  // interned "bottom_right" and "top_left"
PyObject* g_top_left = nullptr;

PyObject* g_ndarray = nullptr;  // numpy.ndarray

// The call, or false to decline. Arrays are exact ndarrays of one rank >= 3 whose batch
// dims broadcast (a size-1 dim becomes a stride-0 one, as np.broadcast_to); dtypes,
// strides, alignment and the rest are check_attention's (it throws, and we decline).
bool fast_call(PyObject** slot, SdpaCall* call, int64_t* diag_from_len, double* default_scale) {
  for (int i : {kAttnMask, kValidLens, kWindow, kSoftcap, kOut})
    if (slot[i] != Py_None) return false;
  if (slot[kReturnLse] != Py_False || slot[kReturnWeights] != Py_False) return false;
  if (slot[kIsCausal] != Py_True && slot[kIsCausal] != Py_False) return false;
  call->causal = slot[kIsCausal] == Py_True;
  const bool bottom_right = is_ascii(slot[kCausalAlignment], g_bottom_right, "bottom_right");
  if (!bottom_right && !is_ascii(slot[kCausalAlignment], g_top_left, "top_left")) return false;
  *diag_from_len = bottom_right;
  PyObject* scale = slot[kScale];
  if (scale != Py_None && !PyFloat_CheckExact(scale)) return false;
  *default_scale = scale == Py_None;
  if (scale != Py_None) call->scale = PyFloat_AS_DOUBLE(scale);
  const int threads = resolve_threads(slot[kNumThreads]);
  if (threads < 1 && threads != kAvailableCpus) return false;
  call->num_threads = threads;
  for (int i : {kQuery, kKey, kValue})
    if (Py_TYPE(slot[i]) != reinterpret_cast<PyTypeObject*>(g_ndarray)) return false;
  for (int i : {kSinks, kAlibiSlopes})
    if (slot[i] != Py_None && Py_TYPE(slot[i]) != reinterpret_cast<PyTypeObject*>(g_ndarray))
      return false;
  return true;
}

// A per-head option (sinks, ALiBi slopes) given as shape (Hq,), as the kernel reads it:
// (batch..., Hq) with stride-0 batch dims; false (decline) for any other shape (Python
// broadcasts those). Its dtype is check_attention's.
bool head_option(PyObject* obj, const char* name, const std::vector<py::ssize_t>& out_shape,
                 ArrayRef* ref) {
  if (obj == Py_None) return true;
  *ref = array_ref(py::reinterpret_borrow<py::object>(obj), name);
  const size_t bn = out_shape.size() - 3;
  if (ref->ndim() != 1 || ref->shape[0] != out_shape[bn]) return false;
  const int64_t stride = ref->strides[0];
  ref->shape.assign(out_shape.begin(), out_shape.begin() + int64_t(bn) + 1);
  ref->strides.assign(bn + 1, 0);
  ref->strides[bn] = stride;
  return true;
}

PyObject* sdpa_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* slot[kNumFastArgs];
  if (!bind_args(args, nargs, kwnames, slot)) {
    PyErr_SetString(PyExc_TypeError, "fastattn._core.sdpa_fast: bad arguments");
    return nullptr;
  }
  try {
    SdpaCall call;
    int64_t bottom_right = 0;
    double default_scale = 0;
    if (!fast_call(slot, &call, &bottom_right, &default_scale)) Py_RETURN_NONE;
    call.query = array_ref(py::reinterpret_borrow<py::object>(slot[kQuery]), "query");
    call.key = array_ref(py::reinterpret_borrow<py::object>(slot[kKey]), "key");
    call.value = array_ref(py::reinterpret_borrow<py::object>(slot[kValue]), "value");
    const int64_t nd = call.query.ndim();
    if (nd < 3 || call.key.ndim() != nd || call.value.ndim() != nd) Py_RETURN_NONE;
    std::vector<py::ssize_t> out_shape(nd);
    for (int64_t d = 0; d < nd - 3; ++d) {
      int64_t n = 1;
      for (ArrayRef* a : {&call.query, &call.key, &call.value})
        if (a->shape[d] != 1) {
          if (n != 1 && a->shape[d] != n) Py_RETURN_NONE;  // Python says why
          n = a->shape[d];
        }
      for (ArrayRef* a : {&call.query, &call.key, &call.value})
        if (a->shape[d] != n) {
          a->shape[d] = n;
          a->strides[d] = 0;
        }
      out_shape[d] = n;
    }
    out_shape[nd - 3] = call.query.shape[nd - 3];
    out_shape[nd - 2] = call.query.shape[nd - 2];
    out_shape[nd - 1] = call.value.shape[nd - 1];
    const int64_t e = call.query.shape[nd - 1];
    if (default_scale) call.scale = e > 0 ? 1.0 / std::sqrt(double(e)) : 0.0;
    if (call.num_threads == kAvailableCpus) {  // the CPUs, read only if they can be used
      double work = double(call.query.shape[nd - 2]) * double(call.key.shape[nd - 2]) *
                    double(e + out_shape[nd - 1]);
      for (int64_t d = 0; d < nd - 2; ++d) work *= double(out_shape[d]);
      call.num_threads = threads_for_work(work, kAvailableCpus);
    }
    if (bottom_right) call.diag_offset = call.key.shape[nd - 2] - call.query.shape[nd - 2];
    if (!head_option(slot[kSinks], "sinks", out_shape, &call.sinks) ||
        !head_option(slot[kAlibiSlopes], "alibi_slopes", out_shape, &call.alibi))
      Py_RETURN_NONE;
    py::array out(py::reinterpret_borrow<py::array>(slot[kQuery]).dtype(), out_shape);
    call.out = array_ref(out, "out");
    Interruptible ctrl_c;  // Ctrl-C between the kernel's tasks
    {
      py::gil_scoped_release release;  // q/k/v are held by the caller's frame
      scaled_dot_product_attention(call);
    }
    if (ctrl_c.raised_now()) return nullptr;  // KeyboardInterrupt, say
    return out.release().ptr();
  } catch (...) {
    // Declined: the full path runs and raises whatever applies, in its own words.
    PyErr_Clear();
    Py_RETURN_NONE;
  }
}

}  // namespace

void register_sdpa(py::module_& m) {
  py::class_<PrebuiltMaskSummary>(m, "MaskSummary",
                                  "A bool mask's tile summary (fastattn.block_mask); opaque.")
      .def_property_readonly("nbytes",
                             [](const PrebuiltMaskSummary& s) { return s.words.size() * 8; });
  m.def(
      "mask_summary",
      [](const py::array& mask, int num_threads) {
        // _block_mask.py hands a C-contiguous bool array of 2 to kMaxBatchDims + 3 dims.
        const int64_t nd = mask.ndim();
        if (mask.dtype().kind() != 'b' || nd < 2 || nd > kMaxBatchDims + 3 ||
            !(mask.flags() & py::array::c_style))
          throw py::value_error("mask_summary: mask must be a C-contiguous bool array, 2-D+");
        PrebuiltMaskSummary s;
        s.mask = mask;
        std::vector<int64_t> shape(mask.shape(), mask.shape() + nd);
        s.len_k = shape[nd - 1];
        {
          py::gil_scoped_release release;
          s.rows = summarise_bool_mask(mask.data(), shape.data(), nd, num_threads, &s.words,
                                       &s.row_words);
        }
        return s;
      },
      py::arg("mask"), py::arg("num_threads"),
      "The tile summary of a bool mask, which sdpa(mask_summary=...) reads instead of "
      "summarising that mask again (see fastattn/_block_mask.py).");
  // The shared keyword arguments (query ... num_threads) are attention_args.h's.
  def_attention(
      m, "sdpa",
      [](SdpaCall& call, double softcap, const py::object& key_scale, const py::object& value_scale,
         const py::object& mask_summary) {
        call.softcap = softcap;
        call.key_scale = array_ref(key_scale, "key_scale");
        call.value_scale = array_ref(value_scale, "value_scale");
        call.mask_summary = prebuilt_summary(mask_summary);
        py::gil_scoped_release release;
        scaled_dot_product_attention(call);
      },
      "Blocked attention on validated, broadcast arrays (see fastattn/_sdpa.py).",
      py::arg("softcap") = 0.0, py::arg("key_scale") = py::none(),
      py::arg("value_scale") = py::none(), py::arg("mask_summary") = py::none());

  m.def(
      "merge_states",
      [](const py::sequence& outputs, const py::sequence& lses, const py::object& out,
         const py::object& lse, int num_threads) {
        MergeStatesCall call;
        for (const py::handle& a : outputs)
          call.outputs.push_back(array_ref(py::reinterpret_borrow<py::object>(a), "outputs[i]"));
        for (const py::handle& a : lses)
          call.lses.push_back(array_ref(py::reinterpret_borrow<py::object>(a), "lses[i]"));
        call.out = array_ref(out, "out");
        call.lse = array_ref(lse, "lse");
        call.num_threads = num_threads;
        Interruptible ctrl_c;  // Ctrl-C between the kernel's row chunks
        {
          // The sequences (and so the arrays) stay referenced by the caller's frame.
          py::gil_scoped_release release;
          merge_attention_states(call);
        }
        ctrl_c.check();
      },
      py::arg("outputs"), py::arg("lses"), py::arg("out"), py::arg("lse"), py::arg("num_threads"),
      "Merges partial attention states by log-sum-exp (see fastattn/_sdpa.py).");

  // A raw vectorcall function: pybind11's dispatcher would cost more than the kernel on a
  // decode step (it turns the keywords into a dict and matches them by name every call).
  static PyMethodDef fast_def = {
      "sdpa_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(sdpa_fast)),
      METH_FASTCALL | METH_KEYWORDS,
      "The common scaled_dot_product_attention call, computed; None for any other "
      "(see fastattn/_sdpa.py)."};
  g_ndarray = py::object(py::module_::import("numpy").attr("ndarray")).release().ptr();
  Interruptible::main_thread() =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  g_bottom_right = PyUnicode_InternFromString("bottom_right");
  g_top_left = PyUnicode_InternFromString("top_left");
  m.add_object("sdpa_fast", py::reinterpret_steal<py::object>(
                                PyCFunction_NewEx(&fast_def, nullptr, m.attr("__name__").ptr())));
  // The process environment's thread variables, read with getenv: os.environ's writes go
  // through putenv/unsetenv, so this sees them, and costs far less per call than
  // os.environ.get of an unset name (which raises and catches KeyError inside).
  m.def(
      "thread_environment",
      [] {
        auto read = [](const char* name) -> py::object {
          const char* raw = std::getenv(name);
          return raw ? py::object(py::str(raw)) : py::object(py::none());
        };
        return py::make_tuple(read(kThreadVariables[0]), read(kThreadVariables[1]));
      },
      "(FASTATTN_NUM_THREADS, OMP_NUM_THREADS) as the process environment has them (None = "
      "unset).");
  m.def(
      "set_thread_defaults",
      [](int setting, int cap) {
        StateLock lock;
        g_threads.setting = setting;
        set_thread_cap(cap);
        g_threads.seen = false;  // parse the environment again
      },
      py::arg("setting"), py::arg("cap"),
      "What a call without num_threads= runs with (fastattn/_threads.py pushes it).");
  m.def(
      "default_threads",
      [] {
        int n;
        {
          StateLock lock;
          n = default_threads();
        }
        return n == -1 ? -1 : resolve_available(n);
      },
      "The thread count a call without num_threads= gets (capped, 1 in a forked child), or "
      "-1 when the environment holds a form only fastattn/_threads.py parses.");
  m.def("available_cpus", &available_cpus,
        "The CPUs this process may run on now (affinity, bounded by a cgroup CPU quota).");
  m.def("cpus_of_quota", &cpus_of_quota, py::arg("text"),
        "The CPUs a cgroup cpu.max text allows (0: no limit); for tests.");
  m.def("in_forked_child", &in_forked_child,
        "Whether this process was made by fork() after fastattn loaded.");
  m.def("team_reset", &team_reset, py::arg("contended"),
        "Clear the record of late worker threads, or mark the team contended (for tests).");
  m.def("team_watch", &team_watch, py::arg("on"),
        "Whether small calls heed the late-worker mark (on by default; off for A/B timings).");
  m.def("team_contended", &team_contended,
        "Whether calls now run on one thread because worker threads started late.");
  m.def("team_report_at", &team_report_at, py::arg("latest_start_ns"), py::arg("region_ns"),
        py::arg("now_ns"),
        "Record a 2-thread region that ended at now_ns (monotonic ns; for tests).");
  m.def("team_contended_until", &team_contended_until,
        "When the late-worker mark ends (monotonic ns), 0 if none (for tests).");
  m.def("now_ns", &now_ns, "The monotonic clock of the late-worker watch, in ns (for tests).");
}

}  // namespace fastattn

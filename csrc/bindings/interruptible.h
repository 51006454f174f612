// Interruptible: Ctrl-C for a call that releases the GIL (api/threads.h, CallInterrupt).
//
//   Interruptible ctrl_c;                       // GIL held
//   { py::gil_scoped_release r; kernel(call); }
//   ctrl_c.check();                             // raises what a signal handler raised
//
// On the main thread the kernels' tasks poll Python's signal handlers every 100 ms from
// 100 ms into the call (taking the GIL for the poll only); a handler that raises (SIGINT's
// KeyboardInterrupt) stops the remaining tasks, and check() raises it. Other threads do not
// poll (Python runs signal handlers on the main thread only).
#pragma once

#include <pybind11/pybind11.h>

#include "api/threads.h"

namespace fastattn {

class Interruptible : CallInterrupt {
 public:
  Interruptible() : outer_(t_call_interrupt), outer_polls_(t_polls_interrupt) {
    if (PyThread_get_thread_ident() == main_thread()) {
      poll = &Interruptible::run_handlers;
      next_poll_ns = now_ns() + kInterruptPollNs;
    }
    t_call_interrupt = this;
    t_polls_interrupt = poll != nullptr;
  }
  ~Interruptible() {
    t_call_interrupt = outer_;
    t_polls_interrupt = outer_polls_;
    Py_XDECREF(type_);
    Py_XDECREF(value_);
    Py_XDECREF(traceback_);
  }
  Interruptible(const Interruptible&) = delete;
  Interruptible& operator=(const Interruptible&) = delete;

  // Whether a handler raised (its exception is then set as the current one: the caller
  // returns nullptr, or throws py::error_already_set()). GIL held.
  bool raised_now() {
    if (!type_) return false;
    PyErr_Restore(type_, value_, traceback_);
    type_ = value_ = traceback_ = nullptr;
    return true;
  }
  void check() {
    if (raised_now()) throw pybind11::error_already_set();
  }

  // The ident of the interpreter's main thread (read once, at module import).
  static unsigned long& main_thread() {
    static unsigned long ident = PyThread_get_thread_ident();
    return ident;
  }

 private:
  static bool run_handlers(CallInterrupt* c) {
    auto* self = static_cast<Interruptible*>(c);
    const PyGILState_STATE gil = PyGILState_Ensure();
    const bool raised = PyErr_CheckSignals() != 0;
    if (raised) PyErr_Fetch(&self->type_, &self->value_, &self->traceback_);
    PyGILState_Release(gil);
    return raised;
  }

  CallInterrupt* outer_;
  bool outer_polls_;
  PyObject* type_ = nullptr;
  PyObject* value_ = nullptr;
  PyObject* traceback_ = nullptr;
};

}  // namespace fastattn

#include <omp.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "api/errors.h"
#include "dispatch/isa.h"

namespace py = pybind11;

namespace fastattn {

void register_config(py::module_& m) {
  m.def("available_isas", &available_isas, "ISAs compiled in and supported here, best last.");
  m.def("compiled_isas", &compiled_isas, "ISAs compiled into this build.");
  m.def("cpu_has_avx512_bf16", &cpu_has_avx512_bf16,
        "Whether this CPU and OS support AVX512-BF16 (for show_config).");
  m.def("arm_features", &arm_features,
        "Arm features this CPU reports (asimd, fp16, bf16, i8mm, dotprod, sve, sve2); empty "
        "off Arm (for show_config and fastattn-bench's report).");
  m.def(
      "active_isa", [] { return std::string(active_kernels().name); },
      "The ISA the kernels currently run with.");
  m.def("set_isa", &set_isa, py::arg("name"), "Select the kernels' ISA by name.");
  m.def("omp_max_threads", [] { return omp_get_max_threads(); });
  m.def(
      "exp2",
      [](const py::array& x) -> py::array {
        // The active ISA's softmax exp2 on a 1-D float32/float64 array (for tests).
        if (x.ndim() != 1 || !(x.flags() & py::array::c_style))
          throw py::value_error("x must be a contiguous 1-D array");
        const KernelTable& k = active_kernels();
        if (py::isinstance<py::array_t<float>>(x)) {
          auto a = py::array_t<float>::ensure(x);
          py::array_t<float> out(a.size());
          k.exp2_f32(a.data(), out.mutable_data(), a.size());
          return out;
        }
        if (py::isinstance<py::array_t<double>>(x)) {
          auto a = py::array_t<double>::ensure(x);
          py::array_t<double> out(a.size());
          k.exp2_f64(a.data(), out.mutable_data(), a.size());
          return out;
        }
        throw py::type_error("x must be float32 or float64");
      },
      py::arg("x"));
  // Machine-limit probes of the active ISA (kernels/machine_limits-inl.h).
  m.def(
      "fma_peak",
      [](const std::string& dtype, int num_threads, double seconds) {
        if (dtype != "float32" && dtype != "float64")
          throw py::value_error("dtype must be 'float32' or 'float64', got dtype='" + dtype + "'");
        if (num_threads < 1) throw py::value_error("num_threads must be >= 1");
        if (!(seconds > 0)) throw py::value_error("seconds must be > 0");
        const KernelTable& k = active_kernels();
        py::gil_scoped_release release;
        return dtype == "float32" ? k.fma_peak_f32(num_threads, seconds)
                                  : k.fma_peak_f64(num_threads, seconds);
      },
      py::arg("dtype") = "float32", py::arg("num_threads") = 1, py::arg("seconds") = 0.2,
      "GFLOP/s of vector FMAs (2 flops each) on the active ISA.");
  m.def(
      "bf16_dot_peak",
      [](int num_threads, double seconds) {
        if (num_threads < 1) throw py::value_error("num_threads must be >= 1");
        if (!(seconds > 0)) throw py::value_error("seconds must be > 0");
        double gflops;
        {
          py::gil_scoped_release release;
          gflops = bf16_dot_peak(num_threads, seconds);
        }
        if (gflops < 0)
          throw std::runtime_error(
              "bf16_dot_peak is not available on ISA '" + std::string(active_kernels().name) +
              "': it measures the bfloat16 dot-product instruction, which only the avx512bf16 "
              "(vdpbf16ps) and neon_bf16 (BFDOT) ISAs run; bfloat16 is widened to float32 "
              "elsewhere (see fma_peak('float32'))");
        return gflops;
      },
      py::arg("num_threads") = 1, py::arg("seconds") = 0.2,
      "GFLOP/s of the bfloat16 dot product (vdpbf16ps on the avx512bf16 ISA, BFDOT on "
      "neon_bf16: 2 bfloat16 multiply-adds per float32 lane, 2 flops each); RuntimeError on "
      "any other ISA.");
  m.def(
      "read_bandwidth",
      [](int64_t nbytes, int num_threads, int repeats) {
        if (nbytes < 1) throw py::value_error("nbytes must be >= 1");
        if (num_threads < 1) throw py::value_error("num_threads must be >= 1");
        if (repeats < 1) throw py::value_error("repeats must be >= 1");
        const KernelTable& k = active_kernels();
        double gbs;
        {
          py::gil_scoped_release release;
          gbs = k.read_bandwidth_f64(nbytes, num_threads, repeats);
        }
        if (gbs < 0) throw ScratchAllocationError("read_bandwidth");
        return gbs;
      },
      py::arg("nbytes") = int64_t(1) << 30, py::arg("num_threads") = 1, py::arg("repeats") = 3,
      "Best GB/s of a vectorised sum over nbytes (larger than the caches) on the active ISA.");
  m.attr("version") = FASTATTN_VERSION;
  m.attr("compiler") = FASTATTN_COMPILER;
  m.attr("openmp_version") = _OPENMP;
}

}  // namespace fastattn

// A symbol threadpoolctl looks for to recognise this library among loaded modules
// named "_core.*" (see fastattn/_threads.py).
extern "C" __attribute__((visibility("default"))) int fastattn_threadpool_marker() { return 1; }

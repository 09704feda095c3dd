// orthopt._C: Python bindings over the C++ library (thin; the logic lives in src/).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "orthopt/orthogonalize.h"
#include "orthopt/runtime.h"
#include "bindings.h"

namespace py = pybind11;

namespace {

at::Tensor py_orthogonalize(const at::Tensor& G, const py::object& schedule, int steps, const std::string& method,
                            const py::object& compute_dtype, const std::vector<int>& restarts,
                            const std::vector<int64_t>& split_sizes, bool flatten, double gram_aspect_threshold,
                            const py::object& safety, const py::object& eps, const std::string& nonfinite,
                            const py::object& execution) {
  orthopt::OrthoOptions opt;
  if (py::isinstance<py::str>(schedule)) {
    opt.schedule = schedule.cast<std::string>();
  } else {
    opt.schedule = "custom";
    for (auto t : schedule) {
      auto v = t.cast<std::vector<double>>();
      TORCH_CHECK(v.size() == 3, "argument 'schedule': custom triples must have 3 entries (a, b, c), got ", v.size());
      opt.custom_triples.push_back({v[0], v[1], v[2]});
    }
  }
  opt.steps = steps;
  opt.method = orthopt::parse_method(method);
  if (!compute_dtype.is_none()) opt.compute_dtype = orthopt::python::to_scalar_type(compute_dtype, "compute_dtype");
  opt.gram_restarts = restarts;
  opt.split_sizes = split_sizes;
  opt.flatten = flatten;
  opt.gram_aspect_threshold = gram_aspect_threshold;
  if (!safety.is_none()) opt.safety = safety.cast<double>();
  if (!eps.is_none()) opt.eps = eps.cast<double>();
  TORCH_CHECK(nonfinite == "error" || nonfinite == "propagate",
              "argument 'nonfinite': expected 'error' or 'propagate', got '", nonfinite, "'");
  opt.nonfinite = nonfinite == "error" ? orthopt::NonFinitePolicy::Error : orthopt::NonFinitePolicy::Propagate;
  opt.execution = orthopt::python::to_execution(execution);
  py::gil_scoped_release nogil;
  return orthopt::orthogonalize(G, opt);
}

py::list py_schedules() {
  py::list out;
  for (const auto& s : orthopt::builtin_schedules()) {
    py::dict d;
    d["name"] = s.name;
    py::list triples;
    for (const auto& t : s.triples) triples.append(py::make_tuple(t[0], t[1], t[2]));
    d["triples"] = triples;
    d["tail"] = py::make_tuple(s.tail[0], s.tail[1], s.tail[2]);
    d["safety"] = s.safety;
    d["eps"] = s.eps;
    out.append(d);
  }
  return out;
}

}  // namespace

namespace orthopt::python {

at::ScalarType to_scalar_type(const py::object& dtype, const char* arg) {
  TORCH_CHECK(THPDtype_Check(dtype.ptr()), "argument '", arg, "': expected a torch.dtype");
  return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
}

ExecutionOptions to_execution(const py::object& value) {
  if (value.is_none()) return {};
  if (py::isinstance<py::str>(value)) return parse_execution(value.cast<std::string>());
  TORCH_CHECK_TYPE(py::isinstance<py::dict>(value), "argument 'execution': expected None, a str or a dict, got ",
                   std::string(py::str(py::type::of(value))));
  ExecutionOptions e;
  for (auto item : value.cast<py::dict>()) {
    TORCH_CHECK_TYPE(py::isinstance<py::str>(item.first) && py::isinstance<py::str>(item.second),
                     "argument 'execution': expected {field: 'auto' | 'on' | 'off'}, got ",
                     std::string(py::repr(item.first)), ": ", std::string(py::repr(item.second)));
    set_field(e, item.first.cast<std::string>(), item.second.cast<std::string>());
  }
  return e;
}

}  // namespace orthopt::python

PYBIND11_MODULE(_C, m) {
  // Importing changes no process-wide setting: torch's thread count is the caller's (the CLI and
  // the C++ tests call init_runtime; Python code calls orthopt.set_num_threads when it wants it).
  m.doc() = "orthopt C++ core";
  // c10::ValueError / c10::TypeError (TORCH_CHECK_VALUE / TORCH_CHECK_TYPE) as Python's
  // ValueError / TypeError, like torch.optim's; other c10::Error stay RuntimeError. Local to
  // this module, so torch's own translation is left as it is.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    }
  });
  m.def(
      "set_num_threads",
      [](const py::object& n) {
        int threads = 0;
        if (n.is_none()) {
          threads = orthopt::requested_threads();
          if (threads == 0) threads = orthopt::default_intra_op_threads(orthopt::available_cores(),
                                                                         orthopt::blas_threading());
        } else {
          TORCH_CHECK_TYPE(py::isinstance<py::int_>(n) && !py::isinstance<py::bool_>(n),
                           "argument 'n': expected an int or None, got ", std::string(py::str(py::type::of(n))));
          threads = n.cast<int>();
          TORCH_CHECK_VALUE(threads >= 1, "argument 'n': must be >= 1, got ", threads);
        }
        at::set_num_threads(threads);
        return threads;
      },
      py::arg("n") = py::none(),
      "Sets torch's intra-op thread count to n, or with n=None to what the orthopt CLI takes: "
      "ORTHOPT_NUM_THREADS or OMP_NUM_THREADS where set, else one per core (1 with OpenBLAS's "
      "pthreads build). Returns the count set.");
  m.def("orthogonalize", &py_orthogonalize, py::arg("G"), py::arg("schedule") = "polar_express",
        py::arg("steps") = 5, py::arg("method") = "auto", py::arg("compute_dtype") = py::none(),
        py::arg("restarts") = std::vector<int>{2}, py::arg("split_sizes") = std::vector<int64_t>{},
        py::arg("flatten") = false, py::arg("gram_aspect_threshold") = 1.5, py::arg("safety") = py::none(),
        py::arg("eps") = py::none(), py::arg("nonfinite") = "error", py::kw_only(), py::arg("execution") = py::none(),
        "Approximate polar factor of G [m, n] or [..., m, n] by Newton–Schulz. execution: which implementation "
        "runs (None, 'field=value,...' or {field: value}; docs/execution.md).");
  m.def("filesystem_provider", &orthopt::filesystem_provider,
        "Shared object that runs the library's std::filesystem code (must be the system libstdc++).");
  m.def("schedules", &py_schedules, "Each built-in schedule's name, triples, tail, safety and eps.");
  orthopt::python::register_all(m);
}

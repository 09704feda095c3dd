// orthopt._C.CudaGraphOptimizer: the C++ orthopt::CudaGraphOptimizer over an orthopt._C.Optimizer
// (python/orthopt/cuda_graph.py wraps it for the torch.optim front ends).
#include <torch/extension.h>

#include "bindings.h"
#include "orthopt/cuda_graph.h"

namespace py = pybind11;

namespace orthopt::python {

void register_graph(py::module_& m) {
  py::class_<orthopt::CudaGraphOptimizer>(m, "CudaGraphOptimizer",
                                          "CUDA-graph step of an orthopt._C.Optimizer (include/orthopt/cuda_graph.h)")
      // keep_alive: the wrapper holds a reference to the optimizer, which must outlive it.
      .def(py::init<orthopt::Optimizer&, int>(), py::arg("optimizer"), py::arg("warmup_steps") = 10,
           py::keep_alive<1, 2>())
      // The GIL stays held: a capture in the default (global) mode must not see CUDA calls
      // from other Python threads; a replay is a single launch.
      .def("step", &orthopt::CudaGraphOptimizer::step)
      .def("release", &orthopt::CudaGraphOptimizer::release)
      .def_property_readonly("captured", &orthopt::CudaGraphOptimizer::captured)
      .def_property_readonly("warmup_steps", &orthopt::CudaGraphOptimizer::warmup_steps)
      .def_property_readonly("eager_steps", &orthopt::CudaGraphOptimizer::eager_steps);
}

}  // namespace orthopt::python

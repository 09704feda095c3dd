#include "bindings.h"

namespace orthopt::python {

void register_optim(pybind11::module_& m);
void register_graph(pybind11::module_& m);
void register_distributed(pybind11::module_& m);

// Binding files add their register_* call here.
void register_all(pybind11::module_& m) {
  register_optim(m);
  register_graph(m);
  register_distributed(m);
}

}  // namespace orthopt::python

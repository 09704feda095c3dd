#pragma once
// Shared helpers of the binding files; each binding file contributes one register_* function.
#include <torch/extension.h>

namespace orthopt::python {

at::ScalarType to_scalar_type(const pybind11::object& dtype, const char* arg);

// Calls every register_* of the other binding files (see register_all.cpp).
void register_all(pybind11::module_& m);

}  // namespace orthopt::python

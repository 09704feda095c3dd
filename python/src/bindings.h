#pragma once
// Shared helpers of the binding files; each binding file contributes one register_* function.
#include <torch/extension.h>

#include "orthopt/execution.h"

namespace orthopt::python {

at::ScalarType to_scalar_type(const pybind11::object& dtype, const char* arg);

// ExecutionOptions from None (all auto), a str "field=value,..." or a dict {field: value}.
ExecutionOptions to_execution(const pybind11::object& value);

// Calls every register_* of the other binding files (see register_all.cpp).
void register_all(pybind11::module_& m);

}  // namespace orthopt::python

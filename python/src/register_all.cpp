#include "bindings.h"

namespace orthopt::python {

// Binding files add their register_* call here.
void register_all(pybind11::module_& m) { (void)m; }

}  // namespace orthopt::python

#pragma once
// Process-wide runtime setup shared by the CLI, the tests and the Python module.

namespace orthopt {

// Sets torch's intra-op thread count to the number of cores (Debian's torch starts
// with 1) unless ORTHOPT_NUM_THREADS or OMP_NUM_THREADS says otherwise. Idempotent.
void init_runtime();

// Number of hardware threads available to this process.
int available_cores();

}  // namespace orthopt

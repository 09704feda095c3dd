#pragma once
// Compile-time torch version tests: the code builds against Debian's libtorch 1.13 (CI) and
// torch 2.x with CUDA (GPU machines), and some APIs changed in between.
#include <torch/version.h>

#define ORTHOPT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// CK(call): the kernel tools' check of a CUDA or orthopt call (0 is success): prints the error
// code, where, and orthopt_last_error(), and exits.
#pragma once
#include <cstdio>
#include <cstdlib>

#include "orthopt_kernels.h"

#define CK(x)                                                                                         \
  do {                                                                                                \
    auto e_ = (x);                                                                                    \
    if (e_ != 0) {                                                                                    \
      std::printf("error %d at %s:%d: %s\n", static_cast<int>(e_), __FILE__, __LINE__, orthopt_last_error()); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

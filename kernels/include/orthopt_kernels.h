#ifndef ORTHOPT_KERNELS_H
#define ORTHOPT_KERNELS_H
/* orthopt CUDA kernels: a framework-free C API on raw device pointers and a stream. This header
 * includes every capability's header (orthopt/kernels/*.h); include those for one capability. */
#include "orthopt/kernels/status.h"
#include "orthopt/kernels/sym.h"
#include "orthopt/kernels/gemm.h"
#include "orthopt/kernels/cast.h"
#include "orthopt/kernels/multi_tensor.h"
#include "orthopt/kernels/householder.h"
#endif

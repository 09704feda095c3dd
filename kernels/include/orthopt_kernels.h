#ifndef ORTHOPT_KERNELS_H
#define ORTHOPT_KERNELS_H
/* orthopt CUDA kernels: a framework-free C API on raw device pointers and a stream. */
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ORTHOPT_OK = 0, ORTHOPT_ERR_INVALID = 1, ORTHOPT_ERR_CUDA = 2 } orthopt_status;

/* Human-readable text of the last error on this thread. */
const char* orthopt_last_error(void);

#ifdef __cplusplus
}
#endif
#endif

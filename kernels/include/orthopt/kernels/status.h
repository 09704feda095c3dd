#ifndef ORTHOPT_KERNELS_STATUS_H
#define ORTHOPT_KERNELS_STATUS_H
/* orthopt CUDA kernels: a framework-free C API on raw device pointers and a stream.
 *
 * Layout convention: every matrix is row-major and contiguous ([rows, cols], leading
 * dimension = cols); a batch is `batch` matrices spaced `stride_*` elements apart.
 * Element types are 16-bit (bf16 or fp16) unless said; accumulation and the epilogues are fp32.
 * Every function returns ORTHOPT_OK or an error whose text orthopt_last_error() gives.
 * This header: the status, the element types and the last error. */
#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ORTHOPT_OK = 0, ORTHOPT_ERR_INVALID = 1, ORTHOPT_ERR_CUDA = 2 } orthopt_status;

typedef enum { ORTHOPT_BF16 = 0, ORTHOPT_FP16 = 1, ORTHOPT_FP32 = 2 } orthopt_dtype;

/* Human-readable text of the last error on this thread. */
const char* orthopt_last_error(void);

#ifdef __cplusplus
}
#endif
#endif

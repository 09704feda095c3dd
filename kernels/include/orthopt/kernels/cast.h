#ifndef ORTHOPT_KERNELS_CAST_H
#define ORTHOPT_KERNELS_CAST_H
/* orthopt CUDA kernels: the scaled cast of the Newton–Schulz input (orthopt_scale_cast). */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "orthopt/kernels/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scaled cast, optionally transposed, batched (the Newton–Schulz input, algorithms.md §1):
 *     out[b] = op(in[b] / (norm[b]·safety + eps))     or     out[b] = op(in[b])  when norm == NULL
 * with in [batch, rows, cols] and op = identity (out [batch, rows, cols]) or, when transpose != 0,
 * the transpose (out [batch, cols, rows]). in and out are contiguous, in_dtype and out_dtype
 * each ORTHOPT_FP32, _BF16 or _FP16; norm is a device array of `batch` fp32 values (e.g. the
 * Frobenius norms) or NULL. The arithmetic is fp32 and that of ATen's
 * `(in.to(fp32) / (norm * safety + eps)).to(out_dtype)`, one rounding per operation:
 * d = fl(fl(norm·safety) + eps) (no fused multiply-add), x / d correctly rounded, the result
 * rounded to nearest even in out_dtype; so results equal that expression bit for bit. out must
 * not overlap in. An empty batch (any size 0) launches nothing. No allocation, no host
 * synchronization: the call can be captured in a CUDA graph. */
orthopt_status orthopt_scale_cast(int64_t batch, int64_t rows, int64_t cols, const void* in, orthopt_dtype in_dtype,
                                  const float* norm, float safety, float eps, void* out, orthopt_dtype out_dtype,
                                  int transpose, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

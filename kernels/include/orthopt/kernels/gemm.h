#ifndef ORTHOPT_KERNELS_GEMM_H
#define ORTHOPT_KERNELS_GEMM_H
/* orthopt CUDA kernels: general products (orthopt_gemm) and Muon's update folded into one
 * (orthopt_gemm_update). */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "orthopt/kernels/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* General product, batched, through cuBLAS (fp32 accumulation, β·C epilogue in the library):
 *     D = alpha·A·X + beta·C
 * with A [m, k], X [k, n], C, D [m, n], all row-major. An operand may instead be stored as its
 * transpose (a_transposed: A stored [k, m]; x_transposed: X stored [n, k]); no data moves, the
 * library reads it transposed (Newton–Schulz on a tall matrix in its own layout).
 * A and X are in dtype (bf16 or fp16); C and D in out_dtype: dtype, or ORTHOPT_FP32 (the fp32
 * accumulator rounded once to fp32, e.g. Newton–Schulz's last product written in the caller's
 * dtype instead of a cast pass after it). C may be NULL (beta ignored); C may equal D. */
orthopt_status orthopt_gemm(orthopt_dtype dtype, orthopt_dtype out_dtype, int64_t batch, int64_t m, int64_t n,
                            int64_t k, const void* A, int64_t stride_a, int a_transposed, const void* X,
                            int64_t stride_x, int x_transposed, float alpha, const void* C,
                            int64_t stride_c, float beta, void* D, int64_t stride_d, cudaStream_t stream);

/* Muon's decoupled update folded into a product (the last Newton–Schulz product: no direction
 * written and read back by an update pass):
 *     W[b] ← β·W[b] + α·(A[b]·X[b])      for b < batch,
 * A, X, their strides and transposed flags as orthopt_gemm (bf16 or fp16); W[b] an fp32 row-major
 * [m, n] contiguous matrix at the device address weight[b] (a host array: separate tensors, read
 * through cuBLASLt's pointer-array batch mode). α = −fl32(lr·factor), β = fl32(1 − lr·weight_decay),
 * rounded as orthopt_multi_update rounds them, read on the device from lr (one fp64 value), so a
 * captured graph follows a scheduled lr; where keep holds 0 (a skipped step), α = 0 and β = 1,
 * which leaves W as it was where A·X is finite. The epilogue's fp32 α·acc + β·W replaces the
 * update pass's rounding of A·X to dtype first. scratch: device memory of
 * orthopt_gemm_update_scratch_bytes(batch), pointer-aligned, not in use by another launch until
 * this one has run (the pointer arrays and α, β are written there by a setup launch). The first
 * call of a shape outside a stream capture times cuBLASLt's candidates on stand-in weights taken
 * for that while from the stream's memory pool (batch·m·n floats; where none is free, the
 * heuristic's first choice is kept). */
size_t orthopt_gemm_update_scratch_bytes(int64_t batch);
/* Whether orthopt_gemm_update takes these addresses: every matrix (A + b·stride_a, X + b·stride_x
 * in elements of dtype_bytes, weight[b]) at a multiple of 256 bytes, the alignment cuBLASLt's
 * heuristic assumes and cannot check where pointer arrays hold the addresses. */
int orthopt_gemm_update_aligned(int64_t batch, const void* A, int64_t stride_a, const void* X, int64_t stride_x,
                                float* const* weight, int dtype_bytes);
orthopt_status orthopt_gemm_update(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                                   const void* A, int64_t stride_a, int a_transposed, const void* X,
                                   int64_t stride_x, int x_transposed, float* const* weight, double factor,
                                   const double* lr, double weight_decay, const uint8_t* keep, void* scratch,
                                   cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

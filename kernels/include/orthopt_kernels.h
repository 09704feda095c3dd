#ifndef ORTHOPT_KERNELS_H
#define ORTHOPT_KERNELS_H
/* orthopt CUDA kernels: a framework-free C API on raw device pointers and a stream.
 *
 * Layout convention: every matrix is row-major and contiguous ([rows, cols], leading
 * dimension = cols); a batch is `batch` matrices spaced `stride_*` elements apart.
 * Element types are 16-bit (bf16 or fp16); accumulation and the epilogue are fp32.
 * Every function returns ORTHOPT_OK or an error whose text orthopt_last_error() gives. */
#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ORTHOPT_OK = 0, ORTHOPT_ERR_INVALID = 1, ORTHOPT_ERR_CUDA = 2 } orthopt_status;

typedef enum { ORTHOPT_BF16 = 0, ORTHOPT_FP16 = 1 } orthopt_dtype;

/* How a symmetric product is computed. */
typedef enum {
  ORTHOPT_SYM_AUTO = 0,   /* the fastest measured path for the device and shape */
  ORTHOPT_SYM_BLOCKS = 1, /* cuBLAS products over the lower-triangle blocks, then a mirror pass */
  ORTHOPT_SYM_NATIVE = 2, /* our tensor-core kernel (mma.sync, sm_80+): lower tiles only, each
                             written twice (in place and mirrored) */
  ORTHOPT_SYM_DENSE = 3   /* one dense cuBLASLt product (fewest launches, for small m): both
                             triangles, symmetric up to rounding; for B != A it multiplies by B
                             as stored (equal to Bᵀ by the symmetry contract) */
} orthopt_sym_path;

/* Human-readable text of the last error on this thread. */
const char* orthopt_last_error(void);

/* Symmetric product, batched:
 *     D = alpha·A·Bᵀ + beta·C + diag·I
 * with A, B [m, k] and C, D [m, m]. The caller promises that A·Bᵀ is symmetric, which holds
 * for B == A (D = α·X·Xᵀ, a SYRK) and for A·B' with commuting symmetric A, B' [m, m]
 * (pass B = B': a symmetric B' equals its transpose). Only the lower triangle of A·Bᵀ is
 * computed; the upper triangle of D is its mirror, so D is exactly symmetric (BLOCKS,
 * NATIVE; DENSE: up to rounding). C must be symmetric (pass NULL for none). D must not
 * overlap A, B or C. Requires k % 8 == 0 and 16-byte aligned A, B for the native path. */
orthopt_status orthopt_sym_abt(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k,
                               const void* A, int64_t stride_a, const void* B, int64_t stride_b,
                               float alpha, const void* C, int64_t stride_c, float beta, float diag,
                               void* D, int64_t stride_d, orthopt_sym_path path, cudaStream_t stream);

/* General product, batched, through cuBLAS (fp32 accumulation, β·C epilogue in the library):
 *     D = alpha·A·X + beta·C
 * with A [m, k], X [k, n], C, D [m, n]. C may be NULL (beta ignored); C may equal D. */
orthopt_status orthopt_gemm(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                            const void* A, int64_t stride_a, const void* X, int64_t stride_x,
                            float alpha, const void* C, int64_t stride_c, float beta, void* D,
                            int64_t stride_d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

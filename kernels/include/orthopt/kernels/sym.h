#ifndef ORTHOPT_KERNELS_SYM_H
#define ORTHOPT_KERNELS_SYM_H
/* orthopt CUDA kernels: symmetric products D = α·A·Bᵀ + β·C + diag·I (orthopt_sym_abt). */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "orthopt/kernels/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a symmetric product is computed. Why these paths and the alternatives measured:
 * docs/decisions/symmetric-product-kernels.md. */
typedef enum {
  ORTHOPT_SYM_AUTO = 0,       /* the fastest measured path for the device and shape */
  ORTHOPT_SYM_BLOCKS = 1,     /* the portable reference path: cuBLAS products over the lower-triangle
                                 blocks, then a mirror pass */
  ORTHOPT_SYM_DENSE = 2,      /* one dense cuBLASLt product (fewest launches, for small m): both
                                 triangles, symmetric up to rounding; for B != A it multiplies by B
                                 as stored (equal to Bᵀ by the symmetry contract) */
  ORTHOPT_SYM_PERSISTENT = 3  /* the persistent Hopper kernel (wgmma + TMA; sm_90a builds on compute
                                 capability 9.0): lower 128×128 tiles only, each written twice (in
                                 place and mirrored), pairs of tiles sharing an operand tile per
                                 CTA, epilogue stored by TMA */
} orthopt_sym_path;

/* Symmetric product, batched:
 *     D = alpha·A·Bᵀ + beta·C + diag·I
 * with A, B [m, k] and C, D [m, m]. The caller promises that A·Bᵀ is symmetric, which holds
 * for B == A (D = α·X·Xᵀ, a SYRK) and for A·B' with commuting symmetric A, B' [m, m]
 * (pass B = B': a symmetric B' equals its transpose). Only the lower triangle of A·Bᵀ is
 * computed; the upper triangle of D is its mirror, so D is exactly symmetric (BLOCKS,
 * PERSISTENT; DENSE: up to rounding). C must be symmetric (pass NULL for none). D must not
 * overlap A, B or C. PERSISTENT requires k % 8 == 0 and 16-byte aligned A, B (AUTO takes
 * another path where they do not hold).
 * The persistent Hopper kernel is launched as a programmatic dependent: they may start while
 * the previous kernel in the stream finishes and wait for it on the device before touching
 * memory; it lets a following programmatic-dependent kernel launch early, which then must wait
 * for it likewise (griddepcontrol.wait). */
orthopt_status orthopt_sym_abt(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k,
                               const void* A, int64_t stride_a, const void* B, int64_t stride_b,
                               float alpha, const void* C, int64_t stride_c, float beta, float diag,
                               void* D, int64_t stride_d, orthopt_sym_path path, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

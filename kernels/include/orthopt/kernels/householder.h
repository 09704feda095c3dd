#ifndef ORTHOPT_KERNELS_HOUSEHOLDER_H
#define ORTHOPT_KERNELS_HOUSEHOLDER_H
/* orthopt CUDA kernels: the Householder panel reduction and the T factor of Dion's blocked QR. */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "orthopt/kernels/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Householder reduction of a narrow panel, the latency-bound part of orthopt's blocked
 * Householder QR (src/optim/update_math.cpp, householder_q_blocked; ATen reference:
 * householder_panel_reference there). For each of `batch` panels A[b] [rows, cols] (fp32,
 * element (r, c) at A[b·stride_a + r·ld + c]; 1 <= cols <= 32, cols <= rows <=
 * orthopt_householder_panel_max_rows(cols); read only), column c = 0, 1, ... in turn is reduced
 * by the reflector H_c = I − τ_c·v_c·v_cᵀ that maps it below row c onto β·e_c (β = −sign(α)·‖x‖,
 * α the diagonal entry), applied to the columns right of it. Writes V[b] [rows, cols] (element
 * (r, c) at V[b·stride_v + r·ldv + c]; must not overlap A): v_c in column c, 1 on the diagonal,
 * 0 above. τ_c is always 2/‖v_c‖², so the caller forms the T of the compact WY form
 * H_0·H_1⋯ = I − V·T·Vᵀ from VᵀV alone (T⁻¹ = upper(VᵀV) with the diagonal halved). So a column
 * with nothing below its diagonal takes v_c = e_c, τ_c = 2 (its row is negated; a zero column
 * too), where LAPACK's larfg takes τ = 0: the factors then differ from LAPACK's in that
 * column's sign. fp32 arithmetic, fp32 sums within a warp and fp64 beyond, each column scaled by
 * a power of two first (V unchanged; no overflow or underflow of the sums); deterministic.
 * One launch (the panel in registers, a cluster of up to 8 CTAs per panel where one CTA cannot
 * hold it), no allocation, no host synchronization (graph-capturable). batch or cols 0: nothing. */
/* The tallest panel of `cols` columns on the current device: with clusters (compute capability
 * 9.0 on, and this library compiled for it) 8192 rows at 17 to 32 columns, 16384 at 9 to 16,
 * 32768 at 5 to 8, 65536 at 1 to 4; an eighth of that without; 0 when cols is not in [1, 32] or
 * the device cannot be queried. */
int64_t orthopt_householder_panel_max_rows(int64_t cols);
/* How many waves a launch of `batch` panels [rows, cols] takes on the current device (panels
 * resident at once, from the occupancy of its cluster size): the caller's choice of panel width.
 * 0 when the launch is not possible. */
int64_t orthopt_householder_panel_waves(int64_t batch, int64_t rows, int64_t cols);
orthopt_status orthopt_householder_panel(int64_t batch, int64_t rows, int64_t cols, const float* A, int64_t ld,
                                         int64_t stride_a, float* V, int64_t ldv, int64_t stride_v,
                                         cudaStream_t stream);
/* The T factor of the compact WY form H_0⋯H_n−1 = I − V·T·Vᵀ of n <= 32 reflectors with τ_c =
 * 2/‖v_c‖² (orthopt_householder_panel's), from their Gram matrix: for each of `batch` matrices,
 * G[b] [n, n] = VᵀV (element (i, j) at G[b·stride_g + i·ldg + j]; only the upper triangle and
 * the diagonal are read), T[b] = U⁻¹ with U = the strict upper triangle of G and G's diagonal
 * halved (upper triangular; the zeros below the diagonal are written too; element (i, j) at
 * T[b·stride_t + i·ldt + j]; must not overlap G). fp32 in and out, fp64 sums. One launch, no
 * allocation, no host synchronization. batch or n 0: nothing. */
orthopt_status orthopt_householder_t_factor(int64_t batch, int64_t n, const float* G, int64_t ldg, int64_t stride_g,
                                            float* T, int64_t ldt, int64_t stride_t, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

#ifndef ORTHOPT_KERNELS_MULTI_TENSOR_H
#define ORTHOPT_KERNELS_MULTI_TENSOR_H
/* orthopt CUDA kernels: the multi-tensor elementwise kernels of the optimizer step (momentum,
 * the Newton–Schulz input, updates, AdamW, Lion, NorMuon's factors, Dion3's row selection) and
 * the library's side streams. */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "orthopt/kernels/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Multi-tensor elementwise kernels of the optimizer step (algorithms.md §3, §7, §9) ----
 *
 * Each call updates a list of `count` tensors in a few launches instead of several small
 * launches per tensor: device pointers, sizes and per-tensor factors travel by value in the
 * kernel arguments (tables of a few dozen tensors; a longer list takes one launch per table),
 * nothing is copied to the device, so the calls can be captured in a CUDA graph.
 *
 * Common arguments:
 *   count, numel  `count` tensors; numel (host array) their element counts. Tensor i of every
 *                 list is contiguous with numel[i] elements (0: skipped). Lists are host arrays
 *                 of `count` device pointers, one dtype per list (ORTHOPT_FP32, _BF16, _FP16);
 *                 the math is fp32. Different lists must not overlap.
 *   lr            device pointer to the learning rate (fp64), read by the kernels.
 *   keep          device pointer to one byte, or NULL (always apply). When it holds 0 nothing
 *                 at all is written, whatever the inputs hold (NaN included): the skip factor.
 *   param_out     NULL, or a list receiving a copy of the new W in param_dtype (the bf16/fp16
 *                 parameter of an fp32 master weight).
 * The fp32 arithmetic is that of orthopt's ATen reference step (src/optim/update_math.cpp),
 * operation by operation: same order, each product and sum rounded (no fused multiply-add),
 * scalar hyperparameters rounded to fp32 once, lr·wd, 1 − lr·wd and lr·factor in fp64.
 *
 * Decoupled weight decay and update (every function below that takes W):
 *   W ← W·(1 − lr·wd) − (lr·factor)·D
 *   cautious: W ← W − [W·D ≥ 0]·(lr·wd)·W − (lr·factor)·D   (decay only where W·D ≥ 0)  */

/* Muon momentum: M ← μ·M + w·G (w = grad_weight: 1 for accumulate, 1 − μ for ema) and the
 * orthogonalization input out = w·G + μ·M_new (nesterov) or M_new, written in out_dtype
 * (e.g. straight into a stacked batch buffer); out == NULL: no output (Dion3's M ← M + G). */
orthopt_status orthopt_multi_momentum(int64_t count, const int64_t* numel, void* const* momentum,
                                      orthopt_dtype momentum_dtype, const void* const* grad,
                                      orthopt_dtype grad_dtype, void* const* out, orthopt_dtype out_dtype,
                                      double mu, double grad_weight, int nesterov, const uint8_t* keep,
                                      cudaStream_t stream);

/* The library's side streams, per device: index in [0, ORTHOPT_SIDE_STREAMS), created on first
 * use (non-blocking). Products queued on a side stream use that stream's own cuBLAS handles and
 * workspace, so they may run concurrently with products on any other stream (independent
 * Newton–Schulz chains); every other stream shares the device's. Create them, and run a product
 * on each, before a CUDA-graph capture (e.g. by an eager warm-up step). */
#define ORTHOPT_SIDE_STREAMS 4
orthopt_status orthopt_side_stream(int index, cudaStream_t* out);

/* Momentum over whole rows with a statistic per row, in the same pass: tensor j has numel[j] /
 * cols rows of cols elements; M ← μ·M + w·G and out as orthopt_multi_momentum, and stats[j][r]:
 *   ORTHOPT_ROW_L1_MOMENTUM: Σ_c |M_new[r, c]| (Dion3's selection scores; out must be NULL),
 *     over the stored values, rounded to M's dtype like ATen's norm of a bf16/fp16 tensor;
 *   ORTHOPT_ROW_SUMSQ_OUT: Σ_c out[r, c]² over the output's stored values (the squared
 *     Frobenius norm of a Newton–Schulz input is the sum over its rows; out may be NULL).
 * fp32 accumulation in a fixed order (one warp per row): deterministic. A skipped step writes
 * no momentum, zeros as out (a finite NS input: see orthopt_gemm_update), and as statistics the
 * unchanged M's L1 norms, or 0. */
typedef enum { ORTHOPT_ROW_L1_MOMENTUM = 0, ORTHOPT_ROW_SUMSQ_OUT = 1 } orthopt_row_stat;
orthopt_status orthopt_multi_momentum_rows(int64_t count, const int64_t* numel, int64_t cols,
                                           void* const* momentum, orthopt_dtype momentum_dtype,
                                           const void* const* grad, orthopt_dtype grad_dtype, void* const* out,
                                           orthopt_dtype out_dtype, double mu, double grad_weight, int nesterov,
                                           orthopt_row_stat stat, float* const* stats, const uint8_t* keep,
                                           cudaStream_t stream);

/* Muon momentum and the Newton–Schulz input of `batch` matrices [rows, cols] in one pass:
 * M[b] ← μ·M[b] + w·G[b] as orthopt_multi_momentum, and out[b] = U[b] / (‖U[b]‖_F·safety + eps)
 * rounded to out_dtype (bf16 or fp16), U[b] the fp32 input orthopt_multi_momentum writes
 * (w·G + μ·M_new with nesterov, else M_new). Bit for bit what orthopt_multi_momentum_rows
 * (ORTHOPT_ROW_SUMSQ_OUT, fp32 out), orthopt_norms_from_row_sumsq and orthopt_scale_cast give
 * in turn, without the fp32 input in memory: each block keeps its rows of U in shared memory
 * until the norms of its matrices are known (one block per multiprocessor, a cooperative
 * launch). momentum[b], grad[b]: contiguous [rows, cols] device arrays (fp32, bf16 or fp16);
 * out: contiguous [batch, rows, cols], 16-byte aligned; row_sumsq: device scratch of batch·rows
 * floats (receives the rows' sums of squares of U); arrived: device scratch of batch unsigned
 * ints (zeroed here). Needs orthopt_momentum_ns_input_fits(rows, cols). A skipped step (keep
 * holding 0) writes no momentum, and zeros as out and row_sumsq. No allocation, no host
 * synchronization: graph-capturable. */
orthopt_status orthopt_momentum_ns_input(int64_t batch, int64_t rows, int64_t cols, void* const* momentum,
                                         orthopt_dtype momentum_dtype, const void* const* grad,
                                         orthopt_dtype grad_dtype, void* out, orthopt_dtype out_dtype, double mu,
                                         double grad_weight, int nesterov, float safety, float eps, float* row_sumsq,
                                         unsigned int* arrived, const uint8_t* keep, cudaStream_t stream);
/* 1 when matrices [rows, cols] fit orthopt_momentum_ns_input on the current device: cols a
 * multiple of 4, the rows of one matrix within the blocks' shared memory (on an H100, 132 blocks
 * of 223 KiB: about 7.5 M elements), cooperative launch; else 0. */
int orthopt_momentum_ns_input_fits(int64_t rows, int64_t cols);
/* norms[b] = √(Σ_r row_sumsq[b·rows + r]) in fp32, summed in orthopt_momentum_ns_input's fixed
 * order (deterministic): the norms of the two-pass form. One launch, graph-capturable. */
orthopt_status orthopt_norms_from_row_sumsq(int64_t batch, int64_t rows, const float* row_sumsq, float* norms,
                                            cudaStream_t stream);

/* Decoupled update with the direction D (e.g. the orthogonalized momentum); factor: host array
 * of per-tensor lr factors (the lr adjustment), NULL for all 1. row_scale: NULL, or per tensor a
 * device fp32 array of numel[j] / cols factors, one per row of cols elements, and then
 * D = direction · row_scale[j][row] (one fp32 product, NorMuon's Û = U · factor without storing
 * Û); every numel[j] must then be a multiple of cols. */
orthopt_status orthopt_multi_update(int64_t count, const int64_t* numel, void* const* weight,
                                    orthopt_dtype weight_dtype, const void* const* direction,
                                    orthopt_dtype direction_dtype, void* const* param_out,
                                    orthopt_dtype param_dtype, const double* factor, const float* const* row_scale,
                                    int64_t cols, const double* lr, double weight_decay, int cautious,
                                    const uint8_t* keep, cudaStream_t stream);

/* The decoupled update with a direction that is nonzero on selected rows only (Dion3): weight[j]
 * (numel[j] elements, rows of cols) is updated everywhere, with D = 0 outside the selection;
 * row r of it takes direction row row_map[j][r] of direction[j] (a compact [*, cols] tensor)
 * where row_map[j][r] >= 0, and D = 0 where it is -1. Same arithmetic as orthopt_multi_update
 * with the zero-padded full-size direction, without that direction. The map entries (int32,
 * device) must be -1 or valid rows of direction[j]: they are not checked on the device. */
orthopt_status orthopt_multi_update_selected(int64_t count, const int64_t* numel, void* const* weight,
                                             orthopt_dtype weight_dtype, const void* const* direction,
                                             orthopt_dtype direction_dtype, const int32_t* const* row_map,
                                             int64_t cols, void* const* param_out, orthopt_dtype param_dtype,
                                             const double* factor, const double* lr, double weight_decay,
                                             int cautious, const uint8_t* keep, cudaStream_t stream);

/* AdamW: m ← β1·m + (1−β1)·G, v ← β2·v + (1−β2)·G², t = step + 1,
 * D = (m / (1−β1^t)) / (sqrt(v) / sqrt(1−β2^t) + eps), decoupled update with factor 1, step ← t.
 * step: per tensor a device fp32 count of the steps taken (orthopt's AdamW state); the bias
 * corrections are computed in fp64 from it, and a second launch per table increments it. */
orthopt_status orthopt_multi_adamw(int64_t count, const int64_t* numel, const void* const* grad,
                                   orthopt_dtype grad_dtype, void* const* exp_avg, void* const* exp_avg_sq,
                                   orthopt_dtype state_dtype, float* const* step, void* const* weight,
                                   orthopt_dtype weight_dtype, void* const* param_out, orthopt_dtype param_dtype,
                                   const double* lr, double beta1, double beta2, double eps, double weight_decay,
                                   int cautious, const uint8_t* keep, cudaStream_t stream);

/* Lion: D = sign(β1·m + (1−β1)·G) (sign(0) = 0), m ← β2·m + (1−β2)·G, decoupled update with
 * factor 1. */
orthopt_status orthopt_multi_lion(int64_t count, const int64_t* numel, const void* const* grad,
                                  orthopt_dtype grad_dtype, void* const* exp_avg, orthopt_dtype state_dtype,
                                  void* const* weight, orthopt_dtype weight_dtype, void* const* param_out,
                                  orthopt_dtype param_dtype, const double* lr, double beta1, double beta2,
                                  double weight_decay, int cautious, const uint8_t* keep, cudaStream_t stream);

/* NorMuon's row normalization factors (algorithms.md §4; orthopt's ATen reference:
 * src/optim/update_math.cpp, normuon_row_factors) of `batch` matrices u[b] [rows, cols]
 * (contiguous, one after the other, u_dtype), with their fp32 row variances updated:
 *   s_r       = Σ_c u[r, c]²                        (fp32; the reference squares the row's norm)
 *   V_r       ← β2·V_r + s_r·((1 − β2)/cols)
 *   inv_r     = 1 / (√V_r + eps)
 *   factor_r  = inv_r · (√Σ_r s_r / max(√Σ_r s_r·inv_r², 1e-8))   (sums per matrix)
 * so that Û = u · factor (row r scaled) has u's Frobenius norm. factors: fp32 [batch·rows],
 * written (also used as scratch: it must not overlap u or variance). variance: fp32; row r of
 * matrix b is variance[b·rows + r], or with variance_rows (device int64 [batch·rows], NULL for
 * that identity) variance[variance_rows[b·rows + r]], e.g. Dion3's selected rows (entries
 * distinct and valid: not checked on the device). keep as for the multi-tensor kernels, except
 * that a skipped step still writes the factors (of the new variances, which it does not
 * store), as the reference computes them; the update that uses them then writes nothing.
 * fp32 arithmetic in the reference's order, hyperparameters rounded to fp32 once; the sums run
 * in a fixed order (deterministic) that is not the reference's. Two launches, no allocation,
 * no host synchronization (graph-capturable). batch or rows 0: nothing. */
orthopt_status orthopt_normuon_factors(int64_t batch, int64_t rows, int64_t cols, const void* u,
                                       orthopt_dtype u_dtype, float* variance, const int64_t* variance_rows,
                                       double beta2, double eps, float* factors, const uint8_t* keep,
                                       cudaStream_t stream);
/* Dion3's selection and error feedback (algorithms.md §5; orthopt's ATen reference:
 * update_math.cpp, dion3_select, as the optimizer's banked path runs it) on `batch` momentum
 * matrices M[b] [rows, cols] (contiguous, one after the other, `dtype`) and the k rows chosen in
 * each (rows_idx: device int64 [batch·k], matrix b's at b·k.., each in [0, rows) and distinct
 * within its matrix; not checked on the device):
 *   selected[b·k + i, :] = M[b, rows_idx[b·k + i], :]    (the stored values; selected in dtype)
 *   M[b, rows_idx[b·k + i], :] ← μ·(that row)            (one fp32 product, rounded to dtype)
 *   flat[b·k + i] = b·rows + rows_idx[b·k + i]           (int64: the row in M's [batch·rows])
 *   row_map[flat[b·k + i]] = b·k + i                     (int32, unless row_map is NULL: the
 *      direction row of orthopt_multi_update_selected; other entries are not written, so fill
 *      the map with -1 first)
 * keep as for the multi-tensor kernels, except that a skipped step writes selected, flat and
 * row_map (not M), as the reference computes them before its gated write. One launch (one
 * warp per selected row), no allocation, no host synchronization. batch or k 0: nothing. */
orthopt_status orthopt_dion3_take_rows(int64_t batch, int64_t rows, int64_t cols, int64_t k, void* momentum,
                                       orthopt_dtype dtype, const int64_t* rows_idx, double mu, void* selected,
                                       int64_t* flat, int32_t* row_map, const uint8_t* keep, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif

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
 * Each call updates a list of tensors in a few launches instead of several small launches per
 * tensor: device pointers, sizes and per-tensor factors travel by value in the kernel arguments
 * (tables of a few dozen tensors; a longer list takes one launch per table), nothing is copied
 * to the device, so the calls can be captured in a CUDA graph.
 *
 * A list of tensors: tensor j is contiguous with numel[j] elements at data[j] (device memory).
 *   count  the number of tensors; every list of a call has the count of its first list.
 *   numel  host array of count element counts. The first list of a call must give it (0:
 *          tensor j is skipped in every list, its pointers may be NULL); NULL in another list:
 *          the first list's counts. Where a list's tensors have other sizes (per-row statistics,
 *          step counts, row maps, a compact direction) the function says which; given counts
 *          are checked.
 *   data   host array of count device pointers; NULL: the list is absent, where the function
 *          allows it (count, numel and dtype are then ignored).
 *   dtype  ORTHOPT_FP32, _BF16 or _FP16, one per list; the math is fp32. Lists of a fixed type
 *          (fp32 statistics, row scales and step counts, int32 row maps) ignore it.
 * Different lists must not overlap.
 *
 * Common arguments:
 *   lr         device pointer to the learning rate (fp64), read by the kernels.
 *   keep       device pointer to one byte, or NULL (always apply). When it holds 0 nothing at all
 *              is written, whatever the inputs hold (NaN included): the skip factor.
 *   param_out  an absent list, or one receiving a copy of the new W in its dtype (the bf16/fp16
 *              parameter of an fp32 master weight).
 * The fp32 arithmetic is that of orthopt's ATen reference step (src/optim/update_math.cpp),
 * operation by operation: same order, each product and sum rounded (no fused multiply-add),
 * scalar hyperparameters rounded to fp32 once, lr·wd, 1 − lr·wd and lr·factor in fp64.
 *
 * Decoupled weight decay and update (every function below that takes W):
 *   W ← W·(1 − lr·wd) − (lr·factor)·D
 *   cautious: W ← W − [W·D ≥ 0]·(lr·wd)·W − (lr·factor)·D   (decay only where W·D ≥ 0)  */
typedef struct orthopt_tensor_list {
  int64_t count;
  const int64_t* numel;
  void* const* data;
  orthopt_dtype dtype;
} orthopt_tensor_list;

/* Muon momentum: M ← μ·M + w·G, w = grad_weight (1 for accumulate, 1 − μ for ema). */
typedef struct orthopt_momentum_params {
  double mu, grad_weight;
  int nesterov; /* the orthogonalization input is w·G + μ·M_new, else M_new */
} orthopt_momentum_params;

/* The decoupled update's hyperparameters (see above). */
typedef struct orthopt_decay_params {
  const double* lr; /* device */
  double weight_decay;
  int cautious;
} orthopt_decay_params;

/* Muon momentum and the orthogonalization input out = w·G + μ·M_new (nesterov) or M_new,
 * written in out's dtype (e.g. straight into a stacked batch buffer); out absent: no output
 * (Dion3's M ← M + G). */
orthopt_status orthopt_multi_momentum(orthopt_tensor_list momentum, orthopt_tensor_list grad, orthopt_tensor_list out,
                                      orthopt_momentum_params params, const uint8_t* keep, cudaStream_t stream);

/* The library's side streams, per device: index in [0, ORTHOPT_SIDE_STREAMS), created on first
 * use (non-blocking). Products queued on a side stream use that stream's own cuBLAS handles and
 * workspace, so they may run concurrently with products on any other stream (independent
 * Newton–Schulz chains); every other stream shares the device's. Create them, and run a product
 * on each, before a CUDA-graph capture (e.g. by an eager warm-up step). */
#define ORTHOPT_SIDE_STREAMS 4
orthopt_status orthopt_side_stream(int index, cudaStream_t* out);

/* Momentum over whole rows with a statistic per row, in the same pass: tensor j has numel[j] /
 * cols rows of cols elements; M ← μ·M + w·G and out as orthopt_multi_momentum, and stats (fp32,
 * numel[j] / cols per tensor) [j][r]:
 *   ORTHOPT_ROW_L1_MOMENTUM: Σ_c |M_new[r, c]| (Dion3's selection scores; out must be absent),
 *     over the stored values, rounded to M's dtype like ATen's norm of a bf16/fp16 tensor;
 *   ORTHOPT_ROW_SUMSQ_OUT: Σ_c out[r, c]² over the output's stored values (the squared
 *     Frobenius norm of a Newton–Schulz input is the sum over its rows; out may be absent).
 * fp32 accumulation in a fixed order (one warp per row): deterministic. A skipped step writes
 * no momentum, zeros as out (a finite NS input: see orthopt_gemm_update), and as statistics the
 * unchanged M's L1 norms, or 0. */
typedef enum { ORTHOPT_ROW_L1_MOMENTUM = 0, ORTHOPT_ROW_SUMSQ_OUT = 1 } orthopt_row_stat;
orthopt_status orthopt_multi_momentum_rows(orthopt_tensor_list momentum, orthopt_tensor_list grad,
                                           orthopt_tensor_list out, orthopt_tensor_list stats, int64_t cols,
                                           orthopt_momentum_params params, orthopt_row_stat stat,
                                           const uint8_t* keep, cudaStream_t stream);

/* Muon momentum and the Newton–Schulz input of `batch` (momentum.count) matrices [rows, cols] in
 * one pass:
 * M[b] ← μ·M[b] + w·G[b] as orthopt_multi_momentum, and out[b] = U[b] / (‖U[b]‖_F·safety + eps)
 * rounded to out_dtype (bf16 or fp16), U[b] the fp32 input orthopt_multi_momentum writes
 * (w·G + μ·M_new with nesterov, else M_new). Bit for bit what orthopt_multi_momentum_rows
 * (ORTHOPT_ROW_SUMSQ_OUT, fp32 out), orthopt_norms_from_row_sumsq and orthopt_scale_cast give
 * in turn, without the fp32 input in memory: each block keeps its rows of U in shared memory
 * until the norms of its matrices are known (one block per multiprocessor, a cooperative
 * launch). Where the fp32 sum of squares of a finite U[b] overflows (entries beyond ≈ 1.8e19),
 * out[b] = (U[b]/p) / (‖U[b]/p‖_F·safety + eps/p) with p the power of two that brings max|U[b]|
 * into [1, 2), as the reference computes it (algorithms.md §1), instead of zeros: the same bits
 * as the two-pass form still, unless eps/p or an entry of U[b]/p is subnormal. momentum, grad:
 * lists of contiguous [rows, cols] matrices (numel NULL or rows·cols each); out: contiguous
 * [batch, rows, cols], 16-byte aligned; row_sumsq: device scratch of batch·rows floats (receives
 * the rows' sums of squares of U, of U/p where they overflowed); arrived: device scratch of
 * 2·batch unsigned ints (zeroed here). Needs orthopt_momentum_ns_input_fits(rows, cols). A
 * skipped step (keep holding 0) writes no momentum, and zeros as out and row_sumsq. No
 * allocation, no host synchronization: graph-capturable. */
typedef struct orthopt_ns_input_params {
  orthopt_momentum_params momentum;
  float safety, eps; /* out = U / (‖U‖_F·safety + eps) */
} orthopt_ns_input_params;
orthopt_status orthopt_momentum_ns_input(orthopt_tensor_list momentum, orthopt_tensor_list grad, int64_t rows,
                                         int64_t cols, void* out, orthopt_dtype out_dtype,
                                         orthopt_ns_input_params params, float* row_sumsq, unsigned int* arrived,
                                         const uint8_t* keep, cudaStream_t stream);
/* 1 when matrices [rows, cols] fit orthopt_momentum_ns_input on the current device: cols a
 * multiple of 4, the rows of one matrix within the blocks' shared memory (on an H100, 132 blocks
 * of 223 KiB: about 7.5 M elements), cooperative launch; else 0. */
int orthopt_momentum_ns_input_fits(int64_t rows, int64_t cols);
/* norms[b] = √(Σ_r row_sumsq[b·rows + r]) in fp32, summed in orthopt_momentum_ns_input's fixed
 * order (deterministic): the norms of the two-pass form. input: the fp32 [batch, rows, cols]
 * matrices whose rows' sums of squares row_sumsq holds (contiguous). Where a sum is +Inf
 * (finite entries whose squares overflow fp32, or an Inf entry), norms[b] = p·√(Σ (input[b]/p)²)
 * instead, p the power of two that brings max|input[b]| into [1, 2) (1 for an Inf entry),
 * summed as orthopt_momentum_ns_input sums then: orthopt_scale_cast by this norm writes that
 * kernel's bits. It stays +Inf where p·√Σ exceeds the fp32 range (entries ≳ 3.4e38/√(rows·cols)).
 * One launch, graph-capturable. */
orthopt_status orthopt_norms_from_row_sumsq(int64_t batch, int64_t rows, int64_t cols, const float* row_sumsq,
                                            const float* input, float* norms, cudaStream_t stream);
/* Where norms[b] (device, fp32) is +Inf, replaces it by p·√(Σ (input[b]/p)²) as
 * orthopt_norms_from_row_sumsq does (a fixed order; input [batch, rows, cols] contiguous in fp32,
 * bf16 or fp16), and leaves every other norm as it is (a block per matrix that reads one float
 * and returns). For the norms of orthopt_scale_cast taken by a reduction whose fp32 sum
 * overflowed on finite entries. One launch, no host synchronization: graph-capturable. */
orthopt_status orthopt_repair_norms(int64_t batch, int64_t rows, int64_t cols, const void* input,
                                    orthopt_dtype dtype, float* norms, cudaStream_t stream);

/* The update's hyperparameters: the decay, factor (host array of per-tensor lr factors, the lr
 * adjustment; NULL for all 1) and cols, the row length of row scales and row maps. */
typedef struct orthopt_update_params {
  orthopt_decay_params decay;
  const double* factor;
  int64_t cols;
} orthopt_update_params;

/* Decoupled update with the direction D (e.g. the orthogonalized momentum). row_scale: absent,
 * or per tensor fp32 factors, numel[j] / cols of them, one per row of cols elements, and then
 * D = direction · row_scale[j][row] (one fp32 product, NorMuon's Û = U · factor without storing
 * Û); every numel[j] must then be a multiple of cols. */
orthopt_status orthopt_multi_update(orthopt_tensor_list weight, orthopt_tensor_list direction,
                                    orthopt_tensor_list param_out, orthopt_tensor_list row_scale,
                                    orthopt_update_params params, const uint8_t* keep, cudaStream_t stream);

/* The decoupled update with a direction that is nonzero on selected rows only (Dion3): weight[j]
 * (numel[j] elements, rows of params.cols) is updated everywhere, with D = 0 outside the
 * selection; row r of it takes direction row row_map[j][r] of direction[j] (a compact [*, cols]
 * tensor: numel, if given, a multiple of cols) where row_map[j][r] >= 0, and D = 0 where it is
 * -1. Same arithmetic as orthopt_multi_update with the zero-padded full-size direction, without
 * that direction. row_map: int32, numel[j] / cols entries per tensor, each -1 or a valid row of
 * direction[j] (not checked on the device). */
orthopt_status orthopt_multi_update_selected(orthopt_tensor_list weight, orthopt_tensor_list direction,
                                             orthopt_tensor_list row_map, orthopt_tensor_list param_out,
                                             orthopt_update_params params, const uint8_t* keep, cudaStream_t stream);

/* AdamW: m ← β1·m + (1−β1)·G, v ← β2·v + (1−β2)·G², t = step + 1,
 * D = (m / (1−β1^t)) / (sqrt(v) / sqrt(1−β2^t) + eps), decoupled update with factor 1, step ← t.
 * step: per tensor one fp32 count of the steps taken (orthopt's AdamW state; numel, if given, 1
 * each); the bias corrections are computed in fp64 from it, and a second launch per table
 * increments it. grad, exp_avg, exp_avg_sq, weight, param_out: each its own dtype. */
typedef struct orthopt_adamw_params {
  orthopt_decay_params decay;
  double beta1, beta2, eps;
} orthopt_adamw_params;
orthopt_status orthopt_multi_adamw(orthopt_tensor_list grad, orthopt_tensor_list exp_avg,
                                   orthopt_tensor_list exp_avg_sq, orthopt_tensor_list step,
                                   orthopt_tensor_list weight, orthopt_tensor_list param_out,
                                   orthopt_adamw_params params, const uint8_t* keep, cudaStream_t stream);

/* Lion: D = sign(β1·m + (1−β1)·G) (sign(0) = 0), m ← β2·m + (1−β2)·G, decoupled update with
 * factor 1. */
typedef struct orthopt_lion_params {
  orthopt_decay_params decay;
  double beta1, beta2;
} orthopt_lion_params;
orthopt_status orthopt_multi_lion(orthopt_tensor_list grad, orthopt_tensor_list exp_avg, orthopt_tensor_list weight,
                                  orthopt_tensor_list param_out, orthopt_lion_params params, const uint8_t* keep,
                                  cudaStream_t stream);

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

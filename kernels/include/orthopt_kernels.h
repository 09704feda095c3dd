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

typedef enum { ORTHOPT_BF16 = 0, ORTHOPT_FP16 = 1, ORTHOPT_FP32 = 2 } orthopt_dtype;

/* How a symmetric product is computed. */
typedef enum {
  ORTHOPT_SYM_AUTO = 0,   /* the fastest measured path for the device and shape */
  ORTHOPT_SYM_BLOCKS = 1, /* cuBLAS products over the lower-triangle blocks, then a mirror pass */
  ORTHOPT_SYM_NATIVE = 2, /* our tensor-core kernel (mma.sync, sm_80+): lower tiles only, each
                             written twice (in place and mirrored) */
  ORTHOPT_SYM_DENSE = 3,  /* one dense cuBLASLt product (fewest launches, for small m): both
                             triangles, symmetric up to rounding; for B != A it multiplies by B
                             as stored (equal to Bᵀ by the symmetry contract) */
  ORTHOPT_SYM_WGMMA = 4,  /* our Hopper kernel (wgmma + TMA, sm_90a builds on compute capability
                             9.0): lower 128×128 tiles only, each written twice, like NATIVE;
                             one tile per CTA, two CTAs per multiprocessor */
  ORTHOPT_SYM_WGMMA_PINGPONG = 5, /* the same tiles and instructions, persistent: one CTA per
                                     multiprocessor loops over the tiles (loads run ahead into the
                                     next tile) and its two consumer warpgroups take whole tiles in
                                     turn, so one's epilogue runs under the other's main loop */
  ORTHOPT_SYM_WGMMA_COOP = 6 /* persistent like PINGPONG, but the two consumer warpgroups work
                                together on 128×256 tiles (two 128×128 lower tiles of one row
                                sharing the A tile): 25% fewer operand bytes per product, the
                                epilogue not hidden */,
  ORTHOPT_SYM_WGMMA_PAIR = 7 /* PINGPONG on clusters of two CTAs (two multiprocessors) that take
                                two tiles sharing one operand tile, each CTA loading half of it
                                for both by TMA multicast: 25% fewer operand bytes per CTA, the
                                epilogue still hidden */,
  ORTHOPT_SYM_WGMMA_WIDE = 8 /* PINGPONG with each consumer warpgroup's unit 64 rows × 256
                                columns (two lower tiles of a block row) and one wgmma
                                m64n256k16 per step: fewer shared-memory operand reads per
                                multiply-add, more operand bytes from L2; slower than
                                PINGPONG on an H200 (docs/gpu.md) */,
  ORTHOPT_SYM_WGMMA_PINGPONG_TMA = 9 /* PINGPONG with the epilogue written into the consumer
                                warpgroup's shared buffer and stored by TMA (whole 128-byte rows;
                                the tile, then its transpose at the mirrored place), where D rows
                                are 16-byte multiples and D (and C, if given) 16-byte aligned;
                                PINGPONG's register epilogue elsewhere; a 3-stage ring */,
  ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF = 10 /* PINGPONG_TMA through one buffer per warpgroup (the
                                tile, then, once stored, its transpose), keeping PINGPONG's
                                4-stage ring */,
  ORTHOPT_SYM_WGMMA_COOP_N256 = 11 /* both consumer warpgroups of a CTA on one pair of lower
                                tiles sharing an operand tile (128×256), each on 64 rows × 256
                                columns with one wgmma m64n256k16 per step (less shared-memory
                                traffic per multiply-add than PINGPONG), the epilogue staged and
                                stored by TMA, where D can be (as PINGPONG_TMA); PINGPONG
                                elsewhere; a 3-stage ring of 48 KiB stages */,
  ORTHOPT_SYM_WGMMA_COOP_N256_PRODUCER_STORES = 12 /* COOP_N256 with the epilogue's TMA stores
                                issued and waited for by the producer thread: the consumer
                                warpgroups stage each tile and go on without meeting each other
                                or waiting for the stores (only for a tile's in-place stores to
                                be read before its mirror is staged) */
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
 * overlap A, B or C. Requires k % 8 == 0 and 16-byte aligned A, B for the native path.
 * The persistent Hopper kernels are launched as programmatic dependents: they may start while
 * the previous kernel in the stream finishes and wait for it on the device before touching
 * memory; they let a following programmatic-dependent kernel launch early, which then must wait
 * for them likewise (griddepcontrol.wait). ORTHOPT_SYM_PDL=0 in the environment launches them
 * plainly. */
orthopt_status orthopt_sym_abt(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k,
                               const void* A, int64_t stride_a, const void* B, int64_t stride_b,
                               float alpha, const void* C, int64_t stride_c, float beta, float diag,
                               void* D, int64_t stride_d, orthopt_sym_path path, cudaStream_t stream);

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
 * for that while from the stream's memory pool (batch·m·n floats; where none is free, or
 * ORTHOPT_GEMM_UPDATE_TUNING=0, the heuristic's first choice is kept). */
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

#pragma once
// ATen glue over the multi-tensor elementwise kernels of the optimizer step
// (kernels/include/orthopt/kernels/multi_tensor.h, orthopt_multi_*): lists of CUDA tensors updated
// in a few launches. Compiled only when torch has CUDA and the kernels are built
// (ORTHOPT_WITH_CUDA).
//
// Lists hold tensors of one device; tensors at the same index of different lists have the same
// number of elements and are contiguous. A list may mix dtypes (fp32, bf16, fp16): it is split
// into one kernel call per combination of dtypes. `keep` is a 0-d bool CUDA tensor (false:
// nothing at all is written, the skip factor) or undefined (always apply); `lr` a 0-d fp64
// CUDA tensor. `param_copies` is empty or has one entry per tensor, undefined where no copy is
// wanted: the bf16/fp16 parameter that receives the new fp32 master weight.
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/ATen.h>

#include <vector>

namespace orthopt::cuda {

// Whether the multi-tensor kernels take this tensor: a non-empty contiguous CUDA tensor in
// fp32, bf16 or fp16, with the kernels on (like handles()).
bool multi_tensor_handles(const at::Tensor& t);

// M ← μ·M + w·G and out = nesterov ? w·G + μ·M_new : M_new (in out's dtype; `outs` empty:
// none), over rows of `cols` (orthopt_multi_momentum_rows), with one statistic per row written
// to stats[i] (fp32, one per row of momenta[i]; deterministic): the L1 norm of M_new (Dion3's
// selection scores; no outputs), or the sum of squares of the output (the NS input's squared
// norm, summed over its rows). A skipped step writes the unchanged M's L1 norms, or zeros (and
// zeros as outs).
enum class RowStat { L1OfMomentum, SumSqOfOutput };
void momentum_rows(const std::vector<at::Tensor>& momenta, const std::vector<at::Tensor>& grads,
                   const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& stats, int64_t cols, double mu,
                   double grad_weight, bool nesterov, RowStat stat, const at::Tensor& keep);

// The NS input's per-matrix norms from momentum_rows' SumSqOfOutput statistics row_sumsq
// [B, rows] (fp32) of `stack` [B, rows, cols] (fp32, contiguous): √ of each matrix's sum of rows
// in orthopt_norms_from_row_sumsq's fixed order, the order momentum_ns_input uses. Where the sum
// overflows fp32 on finite entries, the norm comes from the stack divided by a power of two
// instead, as momentum_ns_input's does (still +Inf beyond the fp32 range of the norm itself).
// Returns [B] fp32.
at::Tensor norms_from_row_sumsq(const at::Tensor& row_sumsq, const at::Tensor& stack);
// Where norms[b] is +Inf (an fp32 reduction overflowed), replaces it in place by matrix b of
// `input`'s norm taken over input / p, p a power of two (orthopt_repair_norms); other norms keep
// their bits. input: contiguous fp32/bf16/fp16 CUDA [B, rows, cols]; norms: B contiguous fp32
// values on its device (any shape, e.g. [B, 1, 1]). No host synchronization.
void repair_norms(const at::Tensor& input, const at::Tensor& norms);

// Whether momentum_ns_input takes matrices [rows, cols] on `device`
// (orthopt_momentum_ns_input_fits) with the kernels on (ExecutionOptions::fused_ns_input is
// the caller's choice).
bool momentum_ns_input_handles(const at::Device& device, int64_t rows, int64_t cols);
// momentum_rows(SumSqOfOutput) into an fp32 stack, norms_from_row_sumsq and the scaled cast
// of that stack to `out`'s dtype, in one kernel (orthopt_momentum_ns_input), bit for bit (a
// skipped step: zeros as `out` in both forms). out: contiguous [B, rows, cols] CUDA bf16/fp16,
// one matrix per momentum; momenta and grads: contiguous, rows·cols elements each, one dtype
// per list.
void momentum_ns_input(const std::vector<at::Tensor>& momenta, const std::vector<at::Tensor>& grads,
                       const at::Tensor& out, double mu, double grad_weight, bool nesterov, double safety,
                       double eps, const at::Tensor& keep);

// update() with D = A[b]·X[b] for weights[b], in one product whose epilogue does the update
// (orthopt_gemm_update; plain decoupled decay): no D written in A's dtype and read back. A
// [B, m, k], X [B, k, n]: one 16-bit dtype, each contiguous or the transpose of a contiguous
// tensor; weights: B fp32 contiguous tensors of m·n elements (row-major [m, n]) on A's device;
// lr, keep as update(). The epilogue forms (1 − lr·wd)·W − (lr·factor)·acc from the product's fp32
// accumulator, where update() rounds D to A's dtype first. Where a matrix's address is not a
// multiple of 256 bytes (orthopt_gemm_update_aligned), D is written in A's dtype and update() runs.
void update_by_product(const at::Tensor& A, const at::Tensor& X, const std::vector<at::Tensor>& weights,
                       double factor, const at::Tensor& lr, double weight_decay, const at::Tensor& keep);

// W ← W·(1 − lr·wd) − (lr·factor)·D (cautious: decay only where W·D >= 0). With row_scales
// (one fp32 tensor per weight, one value per row of `cols` elements; empty: none), D is
// directions[i] · row_scales[i][row] in fp32 (NorMuon's Û without storing it).
void update(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& directions,
            const std::vector<at::Tensor>& param_copies, const std::vector<double>& factors, const at::Tensor& lr,
            double weight_decay, bool cautious, const at::Tensor& keep,
            const std::vector<at::Tensor>& row_scales = {}, int64_t cols = 0);

// update() with a direction that is nonzero on selected rows only (Dion3): row r of weights[i]
// (rows of `cols`) takes row row_maps[i][r] of directions[i] (compact [*, cols]) where that
// int32 entry is >= 0 and D = 0 where it is -1 (entries not checked on the device).
void update_selected(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& directions,
                     const std::vector<at::Tensor>& row_maps, int64_t cols, const std::vector<at::Tensor>& param_copies,
                     const std::vector<double>& factors, const at::Tensor& lr, double weight_decay, bool cautious,
                     const at::Tensor& keep);

// NorMuon's row factors (orthopt_normuon_factors) of the matrices U [..., rows, cols]
// (contiguous CUDA, fp32/bf16/fp16), with their fp32 row variances updated in place unless
// the step is skipped: `variance` holds one per row of U (contiguous), or, with
// `variance_rows` (int64, one per row of U), row i's variance is variance.view(-1)[variance_rows[i]]
// (Dion3's selected rows; entries distinct and valid, not checked on the device). Returns
// the factors, fp32 [..., rows, 1]: Û = U · factors.
at::Tensor normuon_factors(const at::Tensor& U, const at::Tensor& variance, const at::Tensor& variance_rows,
                           double beta2, double eps, const at::Tensor& keep);
// Dion3's selection from the momenta M [B, rows, cols] (contiguous CUDA, fp32/bf16/fp16) and
// the chosen rows rows_idx [B, k] (int64, distinct per matrix; not checked on the device),
// by orthopt_dion3_take_rows: returns the selection [B, k, cols] (M's dtype, the stored rows),
// the rows' indices in [B·rows] (int64 [B·k]) and the int32 row map of update_selected
// ([B·rows]: the selection row, or -1), and scales the chosen rows of M by mu unless the step
// is skipped.
struct Dion3Selection {
  at::Tensor selected, flat, row_map;
};
Dion3Selection dion3_take_rows(const at::Tensor& M, const at::Tensor& rows_idx, double mu, const at::Tensor& keep);
// AdamW moments, bias corrections from each tensor's 0-d fp32 step count (incremented), update.
void adamw(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& exp_avgs,
           const std::vector<at::Tensor>& exp_avg_sqs, const std::vector<at::Tensor>& steps,
           const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& param_copies, const at::Tensor& lr,
           double beta1, double beta2, double eps, double weight_decay, bool cautious, const at::Tensor& keep);

// Lion: D = sign(β1·m + (1−β1)·G), m ← β2·m + (1−β2)·G, update.
void lion(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& exp_avgs,
          const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& param_copies, const at::Tensor& lr,
          double beta1, double beta2, double weight_decay, bool cautious, const at::Tensor& keep);

}  // namespace orthopt::cuda
#endif

#pragma once
// The per-algorithm update math (algorithms.md §2–7) as small pure functions on ATen tensors.
// Each returns NEW tensors and never writes its inputs: the optimizer decides whether to
// commit them (the skip factor), which keeps "skip => bit-identical" in one place.
// This is the plain reference path; a fused GPU kernel may replace one function at a time.
//
// Hyperparameters that change over time arrive as 0-d device tensors (lr, step) so the
// step needs no host synchronization; constant options are host doubles.

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "orthopt/optim.h"

namespace orthopt::optim_detail {

// §2: the factor on lr for a fan_out × fan_in matrix update.
double lr_adjust_factor(LrAdjust rule, int64_t fan_out, int64_t fan_in);

// §3 momentum: the weight w of G in M ← μ·M + w·G (1 accumulate, 1 − μ ema).
double momentum_grad_weight(double mu, MomentumStyle style);
// §3 momentum. Returns {new momentum, orthogonalization input}.
std::pair<at::Tensor, at::Tensor> muon_momentum(const at::Tensor& M, const at::Tensor& G, double mu,
                                                MomentumStyle style, bool nesterov);

// §4 NorMuon normalization of U [..., rows, cols] with row variance V [..., rows, 1] (fp32).
// Returns {Û, new V}; Û in fp32 for fp32/bf16/fp16 U (fp64 for fp64 U), so a bf16/fp16
// Newton–Schulz result can be passed as is. Û = U · factor, factor from normuon_row_factors.
std::pair<at::Tensor, at::Tensor> normuon_normalize(const at::Tensor& U, const at::Tensor& V, double beta2,
                                                    double eps);

// The per-row factors of Û = U · factor ([..., rows, 1], fp32; fp64 for fp64 U) and the new V:
// normuon_normalize without the product, for the update kernel that applies them itself.
std::pair<at::Tensor, at::Tensor> normuon_row_factors(const at::Tensor& U, const at::Tensor& V, double beta2,
                                                      double eps);

// Decoupled weight decay and the step: W·(1 − lr·wd) − lr_step·D, where with `cautious` the
// decay applies only where W·D >= 0 (the update also pushes W towards zero).
// lr and lr_step are 0-d tensors (lr_step already holds the lr adjustment).
at::Tensor decoupled_update(const at::Tensor& W, const at::Tensor& D, const at::Tensor& lr, const at::Tensor& lr_step,
                            double weight_decay, bool cautious);
// The decay part alone: W·(1 − lr·wd), cautious as above (D only feeds the mask). Returns W
// itself when weight_decay is 0.
at::Tensor decayed_weights(const at::Tensor& W, const at::Tensor& D, const at::Tensor& lr, double weight_decay,
                           bool cautious);
// decoupled_update(W, D) for the D that holds U [..., k, cols] on `rows` [..., k] and zeros
// elsewhere (Dion3), without building D: the other rows get the decay alone, which is what
// `decayed − 0·lr_step` is bit for bit (the cautious mask sees D = 0 there too).
at::Tensor decoupled_update_rows(const at::Tensor& W, const at::Tensor& rows, const at::Tensor& U,
                                 const at::Tensor& lr, const at::Tensor& lr_step, double weight_decay, bool cautious);

// §7 AdamW moments and direction D (W ← ... − lr·D). step is the 0-d step count AFTER this step.
struct AdamWResult {
  at::Tensor exp_avg, exp_avg_sq, direction;
};
AdamWResult adamw_direction(const at::Tensor& m, const at::Tensor& v, const at::Tensor& G, const at::Tensor& step,
                            double beta1, double beta2, double eps);

// Lion: D = sign(β1·m + (1−β1)·G); m ← β2·m + (1−β2)·G. Returns {new m, D}.
std::pair<at::Tensor, at::Tensor> lion_direction(const at::Tensor& m, const at::Tensor& G, double beta1,
                                                 double beta2);

// §5 Dion3 row selection on the accumulated momentum M [..., rows, cols].
struct Dion3Selection {
  at::Tensor rows;          // [..., k] selected row indices (int64)
  at::Tensor selected;      // [..., k, cols] copy of M[S] before error feedback (orthogonalization input)
  at::Tensor momentum;      // M with M[S] ← μ·M[S]
};
int64_t dion3_rank(double fraction, int64_t rows);  // k = max(1, ceil(f·rows))
// Indices [..., k] of the k rows of M with the largest L1 norms (sorted, largest first).
at::Tensor dion3_rows(const at::Tensor& M, double fraction);
// The same from the rows' scores [..., rows] (their L1 norms, computed elsewhere).
at::Tensor dion3_top_rows(const at::Tensor& scores, double fraction);
Dion3Selection dion3_select(const at::Tensor& M, double fraction, double mu);
// Gathers/scatters rows along dim -2 by indices [..., k] (distinct within each matrix).
// flat_rows: those indices into the [prod(leading)·rows, cols] view of X (n_rows = X.size(-2)).
at::Tensor flat_rows(const at::Tensor& rows, int64_t n_rows);
at::Tensor gather_rows(const at::Tensor& X, const at::Tensor& rows);
at::Tensor scatter_rows(const at::Tensor& X, const at::Tensor& rows, const at::Tensor& values);
// The same by flat indices (flat_rows(), computed once for several moves): rows of X's
// [prod(leading)·rows, cols] view as [n, cols]; put_rows_ writes them in place (X contiguous).
at::Tensor take_rows(const at::Tensor& X, const at::Tensor& flat);
const at::Tensor& put_rows_(const at::Tensor& X, const at::Tensor& flat, const at::Tensor& values);

// §6 Dion low-rank step on M [..., m, n] (accumulated, fp32) and Q [..., n, r].
struct DionResult {
  at::Tensor momentum, Q, direction;  // direction = P·Qᵀ, [..., m, n]
};
int64_t dion_rank(double rank_fraction, int64_t rows, int64_t cols);  // ceil(f·min(m, n)), >= 1
// The whole step with the Householder QR (DionQr::Householder).
DionResult dion_step(const at::Tensor& M, const at::Tensor& Q, double mu, double eps);
// The step in its parts, for DionQr::Cholesky: P = M·Q (fp32), orthonormalized P -> result.
at::Tensor dion_power(const at::Tensor& M, const at::Tensor& Q);
DionResult dion_finish(const at::Tensor& M, const at::Tensor& P, double mu, double eps);
// dion_finish with the new momentum written over M (contiguous fp32, momentum + G on entry; the
// result's momentum is M): the bank path's form where nothing gates the step, without a
// bank-sized result and its copy into the state. The same bits as dion_finish.
DionResult dion_finish_(const at::Tensor& M, const at::Tensor& P, double mu, double eps);
// Q of the fp32 Householder QR of P [..., m, r]: LAPACK on the CPU (and with
// execution kernels=off, cuSOLVER on a GPU, through linalg_qr); on a GPU with the kernels,
// householder_q_blocked with the panel kernel, LAPACK's reflectors (β = −sign(α)·‖x‖: the same
// column signs, except where a column has nothing below its diagonal, which LAPACK leaves and
// ours negates), in batched products instead of cuSOLVER's one call per matrix.
at::Tensor householder_q(const at::Tensor& P);
// The blocked Householder QR (compact WY, LAPACK's geqrf + orgqr in batched form) of P [..., m, r]
// (fp32, m >= r): panels of `panel_cols` columns reduced by householder_panel_reference or, with
// `kernel_panel` (CUDA tensors), by orthopt_householder_panel, combined recursively; each
// panel's T from its VᵀV (T⁻¹ = upper(VᵀV), diagonal halved, as every τ is 2/‖v‖²; with
// `kernel_panel` by orthopt_householder_t_factor), merged up the recursion by products, the
// trailing columns updated and Q accumulated backwards from I[:, :r] by products. Products in
// full fp32 (TF32 off inside).
at::Tensor householder_q_blocked(const at::Tensor& P, int64_t panel_cols, bool kernel_panel);
// Xᵀ·Y for X [B, L, a], Y [B, L, b] as `splits` partial products over chunks of L (taken as
// extra batch entries), summed: the blocked QR's inner products of reflectors (long L, small
// a×b), which cuBLAS otherwise runs with one block per output tile looping over all of L,
// leaving most of a GPU idle. inner_product_splits: how many (1 on the CPU; a power of two
// dividing L, chunks of >= 128 rows, until ≈ 512 output tiles of 32×32).
int64_t inner_product_splits(const at::Tensor& X, int64_t b);
at::Tensor split_inner_products(const at::Tensor& X, const at::Tensor& Y, int64_t splits);
// The panel step in ATen ops, one column at a time (the kernel's reference): V [B, L, b] (fp32,
// contiguous; v_c in column c, unit diagonal, zeros above) of the panel A [B, L, b], L >= b.
at::Tensor householder_panel_reference(const at::Tensor& A);
// T [B, n, n] of the compact WY form I − V·T·Vᵀ of reflectors with τ = 2/‖v‖², from their Gram
// matrix G = VᵀV [B, n, n]: T⁻¹ = upper(G) with the diagonal halved (a triangular solve; the
// reference of orthopt_householder_t_factor).
at::Tensor householder_t_factor_reference(const at::Tensor& G);
// Cholesky QR2 of P [..., m, r] (fp32), computed in fp64: twice R = chol(XᵀX)ᵀ, X ← X·R⁻¹.
// `ok` (bool [...], one per matrix, P's device, no host synchronization) is false where that
// matrix's Cholesky failed or its Q is not finite; the caller takes householder_q there.
// Batched: on a GPU a single small Cholesky or triangular solve is latency-bound, so callers
// stack same-shaped matrices into one call.
struct CholeskyQ {
  at::Tensor Q, ok;  // Q fp32, R of each pass with a positive diagonal
};
CholeskyQ cholesky_qr2_q(const at::Tensor& P);

}  // namespace orthopt::optim_detail

#include "optim/update_math.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "orthopt/runtime.h"
#ifdef ORTHOPT_WITH_CUDA
#include "cuda/householder_cuda.h"
#endif

namespace orthopt::optim_detail {

double lr_adjust_factor(LrAdjust rule, int64_t fan_out, int64_t fan_in) {
  const double out = static_cast<double>(fan_out), in = static_cast<double>(fan_in);
  switch (rule) {
    case LrAdjust::SpectralNorm: return std::sqrt(out / in);
    case LrAdjust::Jordan: return std::sqrt(std::max(1.0, out / in));
    case LrAdjust::RmsNorm: return 0.2 * std::sqrt(std::max(out, in));
    case LrAdjust::None: return 1.0;
  }
  return 1.0;
}

double momentum_grad_weight(double mu, MomentumStyle style) { return style == MomentumStyle::Ema ? 1.0 - mu : 1.0; }

std::pair<at::Tensor, at::Tensor> muon_momentum(const at::Tensor& M, const at::Tensor& G, double mu,
                                                MomentumStyle style, bool nesterov) {
  // accumulate: M = μM + G,        Nesterov input G + μM
  // ema:        M = μM + (1−μ)G,   Nesterov input (1−μ)G + μM
  const double g_weight = momentum_grad_weight(mu, style);
  at::Tensor M_new = M * mu + G * g_weight;
  at::Tensor input = nesterov ? G * g_weight + M_new * mu : M_new;
  return {M_new, input};
}

std::pair<at::Tensor, at::Tensor> normuon_row_factors(const at::Tensor& U, const at::Tensor& V, double beta2,
                                                      double eps) {
  // Two passes over U: its row sums of squares (accumulated in fp32, fp64 for fp64 U, without a
  // widened copy of a bf16/fp16 U), and one product with a per-row factor. Both Frobenius norms
  // of the formula come from the row sums: ‖U‖² = Σ_r s_r and ‖U/(√V+ε)‖² = Σ_r s_r/(√V_r+ε)².
  // (The direct form, ten passes over an fp32 copy, cost 15 ms per step on Llama 1.26B.)
  const at::ScalarType acc = U.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor row_sq =
      at::linalg_vector_norm(U, 2, at::IntArrayRef{-1}, /*keepdim=*/true, acc).square();  // [..., rows, 1]
  // V (fp32 state) widened first: for fp64 U the blend is fp64 throughout (V·β₂ in fp32 was off
  // by ≈ 6e-8 relative before the sum).
  at::Tensor V_new = V.to(acc) * beta2 + row_sq * ((1.0 - beta2) / static_cast<double>(U.size(-1)));
  const at::Tensor inv = (V_new.sqrt() + eps).reciprocal();  // 1/(√V+ε) per row
  // Keep the Frobenius norm of U (per matrix): the normalization only redistributes it.
  const at::Tensor norm_U = row_sq.sum(-2, /*keepdim=*/true).sqrt();
  const at::Tensor norm_hat = (row_sq * inv.square()).sum(-2, /*keepdim=*/true).sqrt();
  const at::Tensor factor = inv * (norm_U / norm_hat.clamp_min(1e-8));  // [..., rows, 1], acc dtype
  return {factor, V_new};
}

std::pair<at::Tensor, at::Tensor> normuon_normalize(const at::Tensor& U, const at::Tensor& V, double beta2,
                                                    double eps) {
  auto [factor, V_new] = normuon_row_factors(U, V, beta2, eps);
  return {U * factor, V_new};  // Û in fp32 (fp64 for fp64 U): never rounded back to bf16/fp16
}

at::Tensor decayed_weights(const at::Tensor& W, const at::Tensor& D, const at::Tensor& lr, double weight_decay,
                           bool cautious) {
  if (weight_decay == 0.0) return W;
  if (cautious) {
    // Decay only where W and the update direction agree in sign (W·D >= 0).
    at::Tensor mask = (W * D >= 0).to(W.scalar_type());
    return W - W * mask * (lr * weight_decay);
  }
  return W * (1.0 - lr * weight_decay);
}

at::Tensor decoupled_update(const at::Tensor& W, const at::Tensor& D, const at::Tensor& lr, const at::Tensor& lr_step,
                            double weight_decay, bool cautious) {
  return decayed_weights(W, D, lr, weight_decay, cautious) - D * lr_step;
}

at::Tensor decoupled_update_rows(const at::Tensor& W, const at::Tensor& rows, const at::Tensor& U,
                                 const at::Tensor& lr, const at::Tensor& lr_step, double weight_decay, bool cautious) {
  // A 0-d CPU zero: the mask's W·0 without a full-size D (and no device kernel to make it).
  const at::Tensor zero = at::zeros({}, at::TensorOptions().dtype(W.scalar_type()));
  const at::Tensor others = decayed_weights(W, zero, lr, weight_decay, cautious);
  return scatter_rows(others, rows,
                      decoupled_update(gather_rows(W, rows), U, lr, lr_step, weight_decay, cautious));
}

AdamWResult adamw_direction(const at::Tensor& m, const at::Tensor& v, const at::Tensor& G, const at::Tensor& step,
                            double beta1, double beta2, double eps) {
  AdamWResult r;
  r.exp_avg = m * beta1 + G * (1.0 - beta1);
  r.exp_avg_sq = v * beta2 + G * G * (1.0 - beta2);
  // Bias corrections as 0-d fp64 tensors: exact for any step, and 0-d so they do not promote.
  const at::Tensor t = step.to(at::kDouble);
  at::Tensor bc1 = 1.0 - at::pow(beta1, t);
  at::Tensor bc2 = 1.0 - at::pow(beta2, t);
  r.direction = (r.exp_avg / bc1) / (r.exp_avg_sq.sqrt() / bc2.sqrt() + eps);
  return r;
}

std::pair<at::Tensor, at::Tensor> lion_direction(const at::Tensor& m, const at::Tensor& G, double beta1,
                                                 double beta2) {
  at::Tensor D = (m * beta1 + G * (1.0 - beta1)).sign();
  at::Tensor m_new = m * beta2 + G * (1.0 - beta2);
  return {m_new, D};
}

int64_t dion3_rank(double fraction, int64_t rows) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(fraction * static_cast<double>(rows))));
}

// Whole rows move as rows of the [prod(leading)·rows, cols] view, by one index per row
// (index_select / index_copy): a gather/scatter along dim -2 would read an int64 index per
// ELEMENT, which made Dion3's row moves cost more than the rows themselves on a GPU.
at::Tensor flat_rows(const at::Tensor& rows, int64_t n_rows) {
  const at::Tensor r = rows.reshape({-1, rows.size(-1)});
  if (r.size(0) == 1) return r.reshape({-1});
  return (r + at::arange(r.size(0), r.options()).mul_(n_rows).unsqueeze(1)).reshape({-1});
}

at::Tensor take_rows(const at::Tensor& X, const at::Tensor& flat) {
  return X.reshape({-1, X.size(-1)}).index_select(0, flat);
}

const at::Tensor& put_rows_(const at::Tensor& X, const at::Tensor& flat, const at::Tensor& values) {
  TORCH_CHECK(X.is_contiguous(), "put_rows_: the target must be contiguous");
  X.view({-1, X.size(-1)}).index_copy_(0, flat, values.reshape({-1, X.size(-1)}).to(X.scalar_type()));
  return X;
}

at::Tensor gather_rows(const at::Tensor& X, const at::Tensor& rows) {
  auto sizes = rows.sizes().vec();
  sizes.push_back(X.size(-1));
  return take_rows(X, flat_rows(rows, X.size(-2))).view(sizes);
}

at::Tensor scatter_rows(const at::Tensor& X, const at::Tensor& rows, const at::Tensor& values) {
  return put_rows_(X.clone(at::MemoryFormat::Contiguous), flat_rows(rows, X.size(-2)), values);
}

at::Tensor dion3_top_rows(const at::Tensor& scores, double fraction) {
  const int64_t k = dion3_rank(fraction, scores.size(-1));
  return std::get<1>(at::topk(scores, k, /*dim=*/-1, /*largest=*/true, /*sorted=*/true));
}

at::Tensor dion3_rows(const at::Tensor& M, double fraction) {
  // Row L1 norms [..., rows] as one reduction (no |M| temporary: M is the size of the weights).
  return dion3_top_rows(at::linalg_vector_norm(M, 1, at::IntArrayRef{-1}), fraction);
}

Dion3Selection dion3_select(const at::Tensor& M, double fraction, double mu) {
  Dion3Selection s;
  s.rows = dion3_rows(M, fraction);
  s.selected = gather_rows(M, s.rows);
  // Error feedback on exactly the selected rows; the others keep accumulating.
  s.momentum = scatter_rows(M, s.rows, s.selected * mu);
  return s;
}

int64_t dion_rank(double rank_fraction, int64_t rows, int64_t cols) {
  return std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(rank_fraction * static_cast<double>(std::min(rows, cols)))));
}

at::Tensor dion_power(const at::Tensor& M, const at::Tensor& Q) { return at::matmul(M.to(at::kFloat), Q); }

namespace {
// C·beta + alpha·(A·B) for [m, k]·[k, n] or batched [..., m, k]·[..., k, n]: one product with
// C in its epilogue (cuBLAS's β), instead of the product, a scaling pass and an addition.
// `in_place`: written over C (contiguous), the same BLAS call without the copy of C into a new
// result that the out-of-place form makes first, so the same bits.
at::Tensor addmm_any(const at::Tensor& C, const at::Tensor& A, const at::Tensor& B, double beta, double alpha,
                     bool in_place = false) {
  if (C.dim() == 2) return in_place ? C.addmm_(A, B, beta, alpha) : at::addmm(C, A, B, beta, alpha);
  const auto m = C.size(-2), n = C.size(-1), k = A.size(-1);
  const at::Tensor A3 = A.reshape({-1, m, k}), B3 = B.reshape({-1, k, n});
  if (in_place) {
    C.view({-1, m, n}).baddbmm_(A3, B3, beta, alpha);
    return C;
  }
  return at::baddbmm(C.reshape({-1, m, n}), A3, B3, beta, alpha).view(C.sizes());
}

// dion_finish and dion_finish_: `in_place` writes the new momentum over M (fp32).
DionResult finish(const at::Tensor& M, const at::Tensor& P, double mu, double eps, bool in_place) {
  DionResult r;
  const at::Tensor M32 = M.to(at::kFloat);  // M itself when it is fp32
  const at::Tensor R = at::matmul(M32.transpose(-2, -1), P);  // [..., n, r], from M before it changes
  // Error feedback M − (1−μ)·P·Rᵀ as one product with M as its β·C (two bank-sized fp32 passes
  // fewer on a GPU; the same formula, rounded once in the product's epilogue).
  r.momentum = addmm_any(M32, P, R.transpose(-2, -1), 1.0, -(1.0 - mu), in_place);
  if (!in_place) r.momentum = r.momentum.to(M.scalar_type());
  r.Q = R / (at::linalg_vector_norm(R, 2, at::IntArrayRef{-2}, /*keepdim=*/true) + eps);
  r.direction = at::matmul(P, r.Q.transpose(-2, -1));
  return r;
}
}  // namespace

DionResult dion_finish(const at::Tensor& M, const at::Tensor& P, double mu, double eps) {
  return finish(M, P, mu, eps, /*in_place=*/false);
}

DionResult dion_finish_(const at::Tensor& M, const at::Tensor& P, double mu, double eps) {
  TORCH_CHECK(M.scalar_type() == at::kFloat && M.is_contiguous() && M.dim() >= 2,
              "dion_finish_: argument 'M' must be a contiguous fp32 [..., m, n] tensor, got ", M.sizes(), " ",
              M.scalar_type());
  return finish(M, P, mu, eps, /*in_place=*/true);
}

at::Tensor householder_panel_reference(const at::Tensor& A) {
  TORCH_CHECK(A.dim() == 3 && A.scalar_type() == at::kFloat && A.size(1) >= A.size(2),
              "householder_panel_reference: argument 'A' must be fp32 [B, L, b] with L >= b, got ", A.sizes(), " ",
              A.scalar_type());
  const int64_t L = A.size(1), b = A.size(2);
  at::Tensor V = A.clone(at::MemoryFormat::Contiguous);
  for (int64_t c = 0; c < b; ++c) {
    at::Tensor x = V.select(2, c).narrow(1, c, L - c);  // [B, L − c], a view of column c
    // The kernel's formulas: fp64 norm, β = −sign(α)·‖x‖, v = x/(α − β) with v_c = 1,
    // τ = 2/‖v‖²; a zero column takes v = e_c, τ = 2.
    const at::Tensor alpha = x.select(1, 0).to(at::kDouble);
    const at::Tensor sigma = x.narrow(1, 1, L - c - 1).to(at::kDouble).square().sum(1);
    const at::Tensor norm = (alpha.square() + sigma).sqrt();
    const at::Tensor beta = at::where(alpha < 0, norm, -norm);
    const at::Tensor scale = at::where(norm > 0, 1.0 / (alpha - beta), at::zeros_like(norm));
    const at::Tensor tau = (2.0 / (1.0 + sigma * scale.square())).to(at::kFloat);
    at::Tensor v = x * scale.to(at::kFloat).unsqueeze(1);
    v.select(1, 0).fill_(1.0);
    x.copy_(v);
    V.select(2, c).narrow(1, 0, c).zero_();
    if (c + 1 < b) {  // a_k ← a_k − τ·(vᵀa_k)·v for the columns k > c, rows >= c
      at::Tensor rest = V.narrow(1, c, L - c).narrow(2, c + 1, b - c - 1);
      const at::Tensor w = at::bmm(v.unsqueeze(1), rest);  // [B, 1, b − c − 1]
      rest.sub_(at::bmm(v.unsqueeze(2), w * tau.view({-1, 1, 1})));
    }
  }
  return V;
}

at::Tensor householder_t_factor_reference(const at::Tensor& G) {
  TORCH_CHECK(G.dim() == 3 && G.size(1) == G.size(2),
              "householder_t_factor_reference: argument 'G' must be [B, n, n], got ", G.sizes());
  const at::Tensor T_inv = G.triu(1) + at::diag_embed(G.diagonal(0, 1, 2) * 0.5);
  const int64_t n = G.size(1);
  return at::linalg_solve_triangular(T_inv, at::eye(n, G.options()).expand_as(G), /*upper=*/true, /*left=*/true);
}

int64_t inner_product_splits(const at::Tensor& X, int64_t b) {
  if (!X.is_cuda()) return 1;
  const int64_t B = X.size(0), L = X.size(1), a = X.size(2);
  // cuBLAS's fp32 tiles for such shapes are 32×32 (profile, H200); ≈ 4 blocks per multiprocessor
  // of a 132-multiprocessor GPU keep it busy; chunks of >= 128 rows keep each block's loop long.
  const int64_t tiles = B * ((a + 31) / 32) * ((b + 31) / 32);
  int64_t s = 1;
  while (tiles * s < 512 && L % (2 * s) == 0 && L / (2 * s) >= 128) s *= 2;
  return s;
}

at::Tensor split_inner_products(const at::Tensor& X, const at::Tensor& Y, int64_t splits) {
  TORCH_CHECK(X.dim() == 3 && Y.dim() == 3 && X.size(0) == Y.size(0) && X.size(1) == Y.size(1),
              "split_inner_products: arguments 'X' and 'Y' must be [B, L, a] and [B, L, b], got ", X.sizes(), " and ",
              Y.sizes());
  TORCH_CHECK(splits >= 1 && X.size(1) % splits == 0, "split_inner_products: argument 'splits' = ", splits,
              " must be >= 1 and divide L = ", X.size(1));
  if (splits == 1) return at::bmm(X.transpose(1, 2), Y);
  const int64_t B = X.size(0), L = X.size(1), a = X.size(2), b = Y.size(2);
  // The chunks as batch entries (a copy where X or Y is a strided view: the caller passes views
  // whose chunks are views where it can), then their sum in a fixed order (deterministic). One
  // product per chunk instead, with no copies, was 8× slower on Llama's Dion banks (H200): each
  // launch then has B blocks.
  const at::Tensor Xs = X.reshape({B * splits, L / splits, a}), Ys = Y.reshape({B * splits, L / splits, b});
  return at::bmm(Xs.transpose(1, 2), Ys).view({B, splits, a, b}).sum(1);
}

at::Tensor householder_q_blocked(const at::Tensor& P, int64_t panel_cols, bool kernel_panel) {
  TORCH_CHECK(P.dim() >= 2 && P.scalar_type() == at::kFloat && P.size(-2) >= P.size(-1),
              "householder_q_blocked: argument 'P' must be fp32 [..., m, r] with m >= r, got ", P.sizes(), " ",
              P.scalar_type());
  TORCH_CHECK(panel_cols >= 1, "householder_q_blocked: argument 'panel_cols' must be >= 1, got ", panel_cols);
#ifndef ORTHOPT_WITH_CUDA
  TORCH_CHECK(!kernel_panel, "householder_q_blocked: argument 'kernel_panel': this build has no CUDA kernels");
#endif
  // "QR in fp32" (algorithms.md §6): TF32 products would leave Q orthogonal to ≈ 1e-3 only.
  const auto fp32 = Tf32Products::forbidden();
  const int64_t m = P.size(-2), r = P.size(-1);
  at::Tensor A = P.reshape({-1, m, r}).clone(at::MemoryFormat::Contiguous);
  const int64_t B = A.size(0);
  // The reflectors: v_j in column j of V from row j down (unit diagonal, zeros above).
  at::Tensor V = at::zeros_like(A);
  // T of the compact WY form of all r reflectors: H_0⋯H_r−1 = I − V·T·Vᵀ, T upper triangular.
  // The T of reflectors [a, b) is T's diagonal block [a, b) (a diagonal block of a triangular
  // matrix's inverse is the inverse of that block of T⁻¹ = upper(VᵀV), diagonal halved), so the
  // recursion builds T once, from the panels' T, and every later product takes a block of it.
  at::Tensor T = at::zeros({B, r, r}, A.options());
  auto T_block = [&](int64_t i0, int64_t ni, int64_t k0, int64_t nk) { return T.narrow(1, i0, ni).narrow(2, k0, nk); };
  // Xᵀ·Y over the rows >= j0 of the column blocks X, Y [B, m, ·] of V, A or Q, where X or Y is
  // zero above row j0 (a block of V from its diagonal on). Where the products are split over
  // chunks of rows (small outputs on a GPU), they run over all m rows instead (the rows above j0
  // add exact zeros): chunks of whole columns are views of V, A and Q, where chunks of a
  // narrow() from row j0 would be copies (≈ 7 ms a step on Llama's Dion banks, H200); the rows
  // added are at most r/m of the work.
  auto inner = [&](int64_t j0, const at::Tensor& X, const at::Tensor& Y) {
    const at::Tensor Xr = X.narrow(1, j0, m - j0), Yr = Y.narrow(1, j0, m - j0);
    const int64_t splits = inner_product_splits(Xr, Y.size(2));
    if (j0 == 0 || splits == 1) return split_inner_products(Xr, Yr, splits);
    return split_inner_products(X, Y, inner_product_splits(X, Y.size(2)));
  };
  // Q is accumulated backwards in blocks of whole panels, [k·block, (k + 1)·block).
  const int64_t block = std::max<int64_t>(panel_cols, (128 + panel_cols - 1) / panel_cols * panel_cols);
  // Columns [j0, j0 + n) of A, recursively (Elmroth–Gustavson): the left half, its reflectors
  // applied to the right half as products, the right half, then T's block of the two halves,
  // T12 = −T1·(V1ᵀV2)·T2. The products then have inner dimensions of up to r/2 columns instead
  // of one panel's: cuBLAS ran the panel-by-panel form's narrow products (a panel's columns by
  // all the columns to its right) at a fraction of its rate (H200, Llama's Dion banks). `whole`:
  // the columns' whole T is needed (a left half's, for its update); otherwise only the parts
  // inside Q's blocks (T12's corner where a Q block straddles the two halves).
  std::function<void(int64_t, int64_t, bool)> factor = [&](int64_t j0, int64_t n, bool whole) {
    const int64_t L = m - j0;
    if (n <= panel_cols) {
      const at::Tensor panel = A.narrow(1, j0, L).narrow(2, j0, n);
      const at::Tensor Vc = V.narrow(2, j0, n);
      at::Tensor Vp = Vc.narrow(1, j0, L);
      at::Tensor Tp = T_block(j0, n, j0, n);
#ifdef ORTHOPT_WITH_CUDA
      if (kernel_panel) {
        cuda::householder_panel_into(panel, Vp);  // straight into V: no copy
        cuda::householder_t_factor_into(inner(j0, Vc, Vc), Tp);
        return;
      }
#endif
      Vp.copy_(householder_panel_reference(panel));
      Tp.copy_(householder_t_factor_reference(inner(j0, Vc, Vc)));
      return;
    }
    const int64_t n1 = (n / 2 + panel_cols - 1) / panel_cols * panel_cols;  // whole panels, < n
    factor(j0, n1, /*whole=*/true);
    const at::Tensor V1 = V.narrow(1, j0, L).narrow(2, j0, n1);
    at::Tensor A12 = A.narrow(1, j0, L).narrow(2, j0 + n1, n - n1);  // A12 ← (I − V1·T1ᵀ·V1ᵀ)·A12
    const at::Tensor W1 = inner(j0, V.narrow(2, j0, n1), A.narrow(2, j0 + n1, n - n1));  // V1ᵀ·A12
    A12.baddbmm_(V1, at::bmm(T_block(j0, n1, j0, n1).transpose(1, 2), W1), 1.0, -1.0);
    factor(j0 + n1, n - n1, whole);
    // T12's rows [i0, s) and columns [s, k1), s the split: V1ᵀV2 over the rows >= s (V2 is zero
    // above them), between the diagonal blocks of T1 and T2 (triangular: T12[I, K] = −T1[I, I]·
    // (V1ᵀV2)[I, K]·T2[K, K] for a trailing I and a leading K).
    const int64_t s = j0 + n1;
    int64_t i0 = j0, k1 = j0 + n;
    if (!whole) {
      if (s % block == 0) return;  // no Q block straddles s
      i0 = std::max(j0, s / block * block), k1 = std::min(k1, (s / block + 1) * block);
    }
    const at::Tensor W = inner(s, V.narrow(2, i0, s - i0), V.narrow(2, s, k1 - s));
    T_block(i0, s - i0, s, k1 - s)
        .baddbmm_(at::bmm(T_block(i0, s - i0, i0, s - i0), W), T_block(s, k1 - s, s, k1 - s), 0.0, -1.0);
  };
  factor(0, r, /*whole=*/false);
  // Q = H_0⋯H_r−1·I[:, :r], in blocks from the last: block [j0, j0 + n) touches rows and
  // columns >= j0 only. Q in A's buffer: the factorization is done with A (V holds the
  // reflectors), so the QR holds two P-sized buffers at its peak, not three.
  at::Tensor Q = A.copy_(at::eye(m, r, A.options()).expand({B, m, r}));
  for (int64_t j0 = (r - 1) / block * block; j0 >= 0; j0 -= block) {
    const int64_t n = std::min(block, r - j0), L = m - j0;
    const at::Tensor Vb = V.narrow(1, j0, L).narrow(2, j0, n);
    at::Tensor Qs = Q.narrow(1, j0, L).narrow(2, j0, r - j0);
    const at::Tensor W = inner(j0, V.narrow(2, j0, n), Q.narrow(2, j0, r - j0));  // Vbᵀ·Qs
    Qs.baddbmm_(Vb, at::bmm(T_block(j0, n, j0, n), W), 1.0, -1.0);
  }
  return Q.reshape(P.sizes());
}

at::Tensor householder_q(const at::Tensor& P) {
#ifdef ORTHOPT_WITH_CUDA
  // Panels of the width whose launches take the fewest waves on this GPU (a panel's columns are
  // sequential, so a second wave doubles its time), the widest of those (fewer panels and
  // launches, longer inner dimensions for the products); taller than the kernel takes: cuSOLVER.
  if (P.is_cuda() && P.scalar_type() == at::kFloat && kernels_enabled() && P.dim() >= 2 && P.numel() > 0 &&
      P.size(-2) >= P.size(-1)) {
    const int64_t m = P.size(-2), r = P.size(-1), batch = P.numel() / (m * r);
    int64_t best = 0, best_waves = 0;
    for (int64_t width = 32; width >= 1; width /= 2) {
      const int64_t cols = std::min(width, r);
      if (cols < width && width < 32) continue;  // r < width: the same panels as the wider try
      const int64_t waves = cuda::householder_panel_waves(batch, m, cols, P.device());
      if (waves > 0 && (best == 0 || waves < best_waves)) best = cols, best_waves = waves;
    }
    if (best > 0) return householder_q_blocked(P, best, /*kernel_panel=*/true);
  }
#endif
  return std::get<0>(at::linalg_qr(P, "reduced"));
}

CholeskyQ cholesky_qr2_q(const at::Tensor& P) {
  // fp64 so that the Gram matrix's condition number, cond(P)², stays far from 1/ε for any P
  // an fp32 P can represent (cond ≲ 1e7); the second pass restores orthogonality lost in the
  // first. Each pass is one batched product, one batched Cholesky, the inverse of the r×r
  // factor and one batched product.
  at::Tensor X = P.to(at::kDouble);
  at::Tensor ok = at::ones(P.sizes().slice(0, P.dim() - 2), P.options().dtype(at::kBool));
  const int64_t r = P.size(-1);
  const at::Tensor I = at::eye(r, X.options());
  for (int pass = 0; pass < 2; ++pass) {
    const at::Tensor G = at::matmul(X.transpose(-2, -1), X);  // [..., r, r]
    auto [L, info] = at::linalg_cholesky_ex(G, /*upper=*/false, /*check_errors=*/false);  // info [...]
    ok = ok.logical_and(info == 0);
    // X·L⁻ᵀ as a product with the inverted factor rather than a triangular solve on the m×r X:
    // on a GPU cuBLAS's batched trsm ran at ≈ 12 TFLOP/s in fp64 (H200, Llama's Dion banks: 20 ms
    // of a 167 ms step), the product on the tensor cores. Only the r×r inverse is a solve. Its
    // error, ≈ ε·cond(L) = ε·cond(P) ≤ 1e-9 relative in fp64, is far below the fp32 result's.
    const at::Tensor L_inv = at::linalg_solve_triangular(L, I.expand_as(L), /*upper=*/false, /*left=*/true);
    X = at::matmul(X, L_inv.transpose(-2, -1));
  }
  CholeskyQ q;
  q.Q = X.to(at::kFloat);
  q.ok = ok.logical_and(at::isfinite(q.Q).flatten(-2).all(-1));
  return q;
}

DionResult dion_step(const at::Tensor& M, const at::Tensor& Q, double mu, double eps) {
  return dion_finish(M, householder_q(dion_power(M, Q)), mu, eps);  // orthonormal columns (fp32 QR)
}

}  // namespace orthopt::optim_detail

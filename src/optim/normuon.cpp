// NorMuon's row normalization per bank (algorithms.md §4), used by the Muon/NorMuon step.
#include "optim/optimizer_impl.h"

#include "optim/update_math.h"

namespace orthopt {

using namespace optim_core;

// NorMuon (§4) on a bank's orthogonalized matrices U [B, rows, cols], for the bank with its
// params' variances stacked: commits them and returns Û = U · factors [B, rows, cols].
at::Tensor OptimizerImpl::normuon_bank(size_t g, const Bank& b, const at::Tensor& U) { return U * normuon_bank_factors(g, b, U); }

// normuon_bank() without the product: commits the variances and returns Û's row factors
// [B, rows, 1] (fp32; fp64 for fp64 U), Û = U · factors.
at::Tensor OptimizerImpl::normuon_bank_factors(size_t g, const Bank& b, const at::Tensor& U) {
  const auto& o = groups[g].options;
  const at::Tensor V = owned_bank(g, b, "variance", 1, at::kFloat);  // in place (the variance is fp32)
  auto [factors, V_new] = optim_detail::normuon_row_factors(U, V, o.normuon_beta2, o.normuon_eps);
  assign_gated_(V, V_new, keep_flag());
  return factors;
}

// Orthogonalization and NorMuon normalization of `mats` (one per active param, matrix view),
// one orthogonalize() and one normuon_bank() per bank. Returns Û per param (matrix view).
std::vector<at::Tensor> OptimizerImpl::orthogonalize_normuon_banks(size_t g, const std::vector<size_t>& idx,
                                                    const std::vector<at::Tensor>& mats) {
  const auto& o = groups[g].options;
  std::vector<at::Tensor> out(idx.size());
  for (const Bank& b : banks(g, idx)) {
    std::vector<at::Tensor> in;
    for (size_t j : b.positions) in.push_back(mats[j]);
    const at::Tensor U = orthogonalize(stack_bank(in, b.rows, b.cols, b.dtype), batch_ortho_options(o.ortho));
    const at::Tensor U_hat = normuon_bank(g, b, U);
    for (size_t j = 0; j < b.positions.size(); ++j)
      out[b.positions[j]] = b.slice(U_hat, j).reshape(mats[b.positions[j]].sizes());
  }
  return out;
}

}  // namespace orthopt

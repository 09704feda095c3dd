// Muon and NorMuon (algorithms.md §3, §4): the reference step and the fused CUDA step.
#include "optim/optimizer_impl.h"

#include "optim/update_math.h"
#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#include "cuda/products_cuda.h"
#endif

namespace orthopt {

using namespace optim_core;
using optim_detail::lr_adjust_factor;

// ---- Muon / NorMuon (§3, §4)
void OptimizerImpl::step_muon(size_t g, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  const auto idx = active(g);
  const GroupPlan plan = plan_group(g, idx);
#ifdef ORTHOPT_WITH_CUDA
  if (plan.path == GroupPlan::Path::Fused) return step_muon_fused(g, idx, plan, lr);
#endif
  std::vector<at::Tensor> inputs;
  for (size_t i : idx) {
    auto& st = state_of(g, i);
    const auto& p = groups[g].params[i];
    auto [M_new, U_in] = optim_detail::muon_momentum(st.at("momentum").to(work_dtype(p)), grad_of(g, i),
                                                     o.momentum, o.momentum_style, o.nesterov);
    commit(st.at("momentum"), M_new);
    inputs.push_back(U_in.reshape(matrix_sizes(p, o)));
  }
  // NorMuon per bank; the per-matrix normalization below is its reference path.
  const bool banked = plan.path == GroupPlan::Path::Banked;
  const auto outs = banked ? orthogonalize_normuon_banks(g, idx, inputs) : orthogonalize_all(inputs, o.ortho);
  for (size_t j = 0; j < idx.size(); ++j) {
    const size_t i = idx[j];
    const auto& p = groups[g].params[i];
    at::Tensor U = outs[j];
    if (o.algorithm == Algorithm::NorMuon && !banked) {
      auto& V = state_of(g, i).at("variance");
      auto [U_hat, V_new] = optim_detail::normuon_normalize(U, V, o.normuon_beta2, o.normuon_eps);
      commit(V, V_new);
      U = U_hat;
    }
    auto [D, factor] = adjust_rows(U, o);
    auto W_new = optim_detail::decoupled_update(weights(g, i), D.reshape(p.sizes()), lr, lr * factor,
                                                o.weight_decay, o.cautious_weight_decay);
    write_weights(g, i, W_new);
  }
}

#ifdef ORTHOPT_WITH_CUDA
void OptimizerImpl::step_muon_fused(size_t g, const std::vector<size_t>& idx, const GroupPlan& plan,
                                    const at::Tensor& lr) {
  const auto& o = groups[g].options;
  const auto& params = groups[g].params;
  // Per bank, the momentum kernel writes the orthogonalization inputs straight into one fp32
  // [B, rows, cols] buffer (the stack the reference builds) and sums each row's squares of
  // them: the NS input norms then come from [B, rows] partial sums instead of another read of
  // the stack.
  // Where the NS input is the bank as stored (wide and square banks, tall ones in Gram NS's own
  // layout) and the bank fits the blocks' shared memory, one kernel does the momentum and
  // writes that input in its 16-bit dtype instead (cuda::momentum_ns_input: the same bits
  // without the fp32 stack written and read back; ExecutionOptions::fused_ns_input).
  const std::vector<Bank>& bks = plan.banks;
  const double grad_weight = optim_detail::momentum_grad_weight(o.momentum, o.momentum_style);
  const OrthoOptions ortho = batch_ortho_options(o.ortho);
  const Schedule schedule = resolve_schedule(ortho);
  std::vector<at::Tensor> stacks, norms;
  std::vector<bool> prepared;
  for (size_t k = 0; k < bks.size(); ++k) {
    const Bank& b = bks[k];
    std::vector<at::Tensor> momenta, grads;
    for (size_t j = 0; j < b.params.size(); ++j) {
      momenta.push_back(state_of(g, b.params[j]).at("momentum"));
      grads.push_back(params[b.params[j]].grad());
    }
    if (const std::optional<at::ScalarType> ns_dtype = plan.muon[k].one_pass_input) {
      const at::Tensor input = at::empty({b.size(), b.rows, b.cols}, momenta[0].options().dtype(*ns_dtype));
      std::vector<at::Tensor> matrix_momenta, matrix_grads;  // one per matrix: a param may hold several
      for (size_t j = 0; j < momenta.size(); ++j) {
        const at::Tensor m3 = momenta[j].view({-1, b.rows, b.cols}), g3 = grads[j].reshape({-1, b.rows, b.cols});
        for (int64_t e = 0; e < m3.size(0); ++e) {
          matrix_momenta.push_back(m3[e]);
          matrix_grads.push_back(g3[e]);
        }
      }
      cuda::momentum_ns_input(matrix_momenta, matrix_grads, input, o.momentum, grad_weight, o.nesterov,
                              schedule.safety, schedule.eps, keep_flag());
      stacks.push_back(input);
      norms.emplace_back();
      prepared.push_back(true);
      continue;
    }
    const at::Tensor stack =
        at::empty({b.size(), b.rows, b.cols}, params[b.params[0]].options().dtype(at::kFloat));
    const at::Tensor row_sq = at::empty({b.size(), b.rows}, stack.options());
    std::vector<at::Tensor> inputs, stats;
    for (size_t j = 0; j < b.params.size(); ++j) {
      inputs.push_back(b.slice(stack, j));
      stats.push_back(b.slice(row_sq, j));
    }
    cuda::momentum_rows(momenta, grads, inputs, stats, b.cols, o.momentum, grad_weight, o.nesterov,
                        cuda::RowStat::SumSqOfOutput, keep_flag());
    stacks.push_back(stack);
    // [B]: the order momentum_ns_input sums in, so both forms give the same bits. The stack is
    // read again only for a matrix whose sum overflowed fp32 (finite entries beyond ≈ 1.8e19).
    if (o.ortho.split_sizes.empty()) norms.push_back(cuda::norms_from_row_sumsq(row_sq, stack));
    prepared.push_back(false);
  }

  std::vector<at::Tensor> outs(idx.size());
  // Muon without split_sizes: the NS result in its compute dtype is the direction (the update
  // kernel widens bf16/fp16 exactly, as the reference's cast to fp32 does, so the update is
  // the same). With split_sizes NorMuon normalizes the compute-dtype result into fp32 and Muon
  // takes the fp32 result, whose math continues in fp32.
  const bool direct = o.algorithm == Algorithm::Muon && o.ortho.split_sizes.empty();
  // NorMuon without split_sizes: U also stays in its compute dtype (made contiguous like
  // Muon's) and its row factors go to the update kernel, which forms D = U · factor[row] in
  // fp32 as the reference's Û = U · factor does, without an fp32 Û written and read back
  // (and, for tall banks, transposed). On an H200 NorMuon cost 8.4 ms per step more than Muon
  // on Llama 1.26B with Û materialized.
  const bool row_scaled = o.algorithm == Algorithm::NorMuon && o.ortho.split_sizes.empty();
  std::vector<at::Tensor> bank_factors(bks.size());  // row_scaled: Û's row factors per bank
  // Without split_sizes every bank in one call: the Gram NS of banks with the same m (after
  // orientation) iterates as one batch (detail::orthogonalize_many_in_compute_dtype).
  // Muon's update folded into the last NS product (detail::FoldedUpdate: the epilogue writes
  // the weights, no direction written and read back by the update kernel) for banks whose
  // params are their own fp32 weights (no master copy), with plain decoupled decay. A skipped
  // step must leave the weights as they were through α = 0, β = 1, so the product must be
  // finite: both momentum kernels write zeros as the NS input then, which the prepared input
  // keeps and the two-pass form's scaled cast keeps where eps > 0 (0 / (0 + eps); with eps = 0
  // it would be NaN, so those banks are not folded). Banks the products do not take come back
  // with a result and are updated below (ExecutionOptions::fold_update).
  std::vector<detail::FoldedUpdate> folds(bks.size());
  std::vector<const detail::FoldedUpdate*> fold_of(bks.size(), nullptr);
  for (size_t k = 0; k < bks.size(); ++k) {
    const Bank& b = bks[k];
    if (!plan.muon[k].fold) continue;
    detail::FoldedUpdate& u = folds[k];
    for (size_t i : b.params) {
      const at::Tensor w3 = params[i].detach().view({-1, b.rows, b.cols});
      for (int64_t e = 0; e < w3.size(0); ++e) u.weights.push_back(w3[e]);
    }
    u.factor = lr_adjust_factor(o.lr_adjust, b.rows, b.cols);
    u.lr = lr;
    u.weight_decay = o.weight_decay;
    u.keep = keep_flag();
    fold_of[k] = &u;
  }
  std::vector<at::Tensor> ns;
  if (o.ortho.split_sizes.empty())
    ns = detail::orthogonalize_many_in_compute_dtype(stacks, ortho, norms, prepared, fold_of);
  for (size_t k = 0; k < bks.size(); ++k) {
    const Bank& b = bks[k];
    if (!ns.empty() && !ns[k].defined()) continue;  // updated by the NS products: outs stay undefined
    // Tall matrices may come back as transposed views and the update kernel reads D
    // contiguously: one copy per bank (a no-op for wide ones and, on the GPU kernels' path, for
    // tall ones through Gram NS), for Muon and NorMuon by the transpose kernel in the compute
    // dtype; NorMuon's row factors are then taken over the contiguous copy (for tall banks
    // another summation order than the reference's over the view: fp32 rounding). With
    // split_sizes NorMuon normalizes the views like the reference, one normuon_bank() per bank.
    at::Tensor res;
    if (o.algorithm == Algorithm::Muon && !direct) {
      res = orthogonalize(stacks[k], ortho).contiguous();
    } else {
      at::Tensor U = !ns.empty() ? ns[k] : detail::orthogonalize_in_compute_dtype(stacks[k], ortho);
      if (U.scalar_type() == at::kDouble) U = U.to(at::kFloat);  // fp64 NS: as orthogonalize() casts
      // NorMuon reads the compute-dtype result as is (normuon_normalize widens it in its
      // reductions and returns fp32): no fp32 copy of the NS result first.
      if (direct || row_scaled) {
        res = cuda::contiguous(U);
        if (row_scaled)  // normuon_bank_factors() in two kernel launches
          bank_factors[k] = cuda::normuon_factors(res, owned_bank(g, b, "variance", 1, at::kFloat), {},
                                                  o.normuon_beta2, o.normuon_eps, keep_flag());
      } else {
        res = normuon_bank(g, b, U).contiguous();
      }
    }
    for (size_t j = 0; j < b.params.size(); ++j)
      outs[b.positions[j]] = b.slice(res, j).view(matrix_sizes(params[b.params[j]], o));
  }

  // An update's lists; add() appends param i: its weight (and copy), its direction from the NS
  // result `out` and its lr adjustment.
  struct UpdateLists {
    std::vector<at::Tensor> weights, copies, directions;
    std::vector<double> factors;
  };
  auto add = [&](UpdateLists& l, size_t i, const at::Tensor& out) {
    auto [D, factor] = adjust_rows(out, o);
    add_weights(g, i, l.weights, l.copies);
    l.directions.push_back(D.reshape(params[i].sizes()).contiguous());
    l.factors.push_back(factor);
  };
  if (row_scaled) {
    // One update per bank: the row factors of its params are rows of the bank's length.
    for (size_t k = 0; k < bks.size(); ++k) {
      const Bank& b = bks[k];
      UpdateLists l;
      std::vector<at::Tensor> row_factors;
      for (size_t j = 0; j < b.params.size(); ++j) {
        add(l, b.params[j], outs[b.positions[j]]);
        row_factors.push_back(b.slice(bank_factors[k], j).reshape({-1}));  // fp32: U is never fp64 here
      }
      cuda::update(l.weights, l.directions, l.copies, l.factors, lr, o.weight_decay, o.cautious_weight_decay,
                   keep_flag(), row_factors, b.cols);
    }
    return;
  }
  UpdateLists l;
  for (size_t j = 0; j < idx.size(); ++j)
    if (outs[j].defined()) add(l, idx[j], outs[j]);  // undefined: the NS products did the update
  if (!l.weights.empty())
    cuda::update(l.weights, l.directions, l.copies, l.factors, lr, o.weight_decay, o.cautious_weight_decay,
                 keep_flag());
}
#endif  // ORTHOPT_WITH_CUDA

}  // namespace orthopt

// Dion (algorithms.md §6): per bank, the host part of a step (finish_step) and the per-parameter
// reference step.
#include "optim/optimizer_impl.h"

#include "orthopt/runtime.h"

#include "optim/update_math.h"
#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#endif

namespace orthopt {

using namespace optim_core;
using optim_detail::lr_adjust_factor;

// ---- Dion (§6)
void OptimizerImpl::step_dion(size_t g, const at::Tensor& lr) {
  const auto idx = active(g);
  const GroupPlan plan = plan_group(g, idx);
  if (plan.path != GroupPlan::Path::Reference) return step_dion_banks(g, idx, plan, lr);
  step_dion_reference(g, idx, lr);
}

// Per bank: step_dion_reference()'s operations on [B, m, n] stacks (on a GPU the per-parameter
// step is launch-bound: about ten small operations per parameter), so each matrix gets the
// same values. Momenta and Q live in one buffer per bank and are updated in place
// (owned_bank()). No host synchronization, also with `cholesky`: a bank is stepped only if
// every factorization in it succeeded (a device-side gate, beside the skip flag), and
// finish_step() steps a bank where one failed again through the reference path, from its
// untouched state, which then takes the Householder QR for the failed matrices.
void OptimizerImpl::step_dion_banks(size_t g, const std::vector<size_t>& idx, const GroupPlan& plan,
                                    const at::Tensor& lr) {
  const auto& o = groups[g].options;
  const auto& params = groups[g].params;
#ifdef ORTHOPT_WITH_CUDA
  const bool kernels = plan.path == GroupPlan::Path::Fused;  // the weights through the update kernel
#endif
  for (const Bank& b : plan.banks) {
    // Q is fp32 [..., n, r] for every param (state_specs(); loads are converted to it).
    const int64_t r = state_of(g, b.params[0]).at("Q").size(-1);
    const at::Tensor Q = owned_bank(g, b, "Q", b.cols, r, at::kFloat);
    TORCH_INTERNAL_ASSERT(Q.defined(), "Dion's Q is not fp32");
    // The momenta: a view of the state when it lives in one buffer of the work dtype, else
    // stacked (and written back per param).
    const at::Tensor owned_momenta = owned_bank(g, b, "momentum", b.cols, b.dtype);
    const at::Tensor momenta = owned_momenta.defined()
                                   ? owned_momenta
                                   : stack_bank(bank_state(g, b, "momentum"), b.rows, b.cols, b.dtype);
    std::vector<at::Tensor> grads;
    for (size_t i : b.params) grads.push_back(params[i].grad().detach());
    // Nothing gates this step (no skip flag, no Cholesky): M = momentum + G is formed in the
    // state's buffer and the new momentum written over it there (dion_finish_), two
    // bank-sized copies fewer (H200, Llama set: ≈ 5 ms of device-to-device copies a step).
    const bool in_place = o.dion_qr == DionQr::Householder && !keep_flag().defined() &&
                          owned_momenta.defined() && momenta.scalar_type() == at::kFloat;
    at::Tensor M;  // momentum + G [B, m, n]
    if (in_place) {
      // Each gradient added into its slice of the momenta, one multi-tensor launch: the bank of
      // gradients is never stacked (a bank-sized copy; aten::cat was 2.2 ms of Llama's step on
      // an H200). The same sums as momenta + stack(grads).
      std::vector<at::Tensor> slices;
      for (size_t j = 0; j < b.params.size(); ++j) slices.push_back(b.slice(momenta, j).view(grads[j].sizes()));
      at::_foreach_add_(slices, grads);
      M = momenta;
    } else {
      M = momenta + stack_bank(grads, b.rows, b.cols, b.dtype);
    }
    const at::Tensor raw = optim_detail::dion_power(M, Q);
    at::Tensor P, gate = keep_flag();
    if (o.dion_qr == DionQr::Cholesky) {
      const auto q = optim_detail::cholesky_qr2_q(raw);
      P = q.Q;
      const at::Tensor ok = q.ok.all();
      pending_dion.push_back({g, b.params, ok});
      gate = gate.defined() ? gate.logical_and(ok) : ok;
    } else {
      P = optim_detail::householder_q(raw);
    }
    auto res = in_place ? optim_detail::dion_finish_(M, P, o.momentum, o.eps)
                        : optim_detail::dion_finish(M, P, o.momentum, o.eps);
    if (!in_place) {  // in place, the momenta hold the new momentum already
      if (owned_momenta.defined()) {
        assign_gated_(momenta, res.momentum, gate);
      } else {
        commit_bank(b, bank_state(g, b, "momentum"), res.momentum, momenta, gate);
      }
    }
    assign_gated_(Q, res.Q, gate);
    const double factor = lr_adjust_factor(o.lr_adjust, b.rows, b.cols);
#ifdef ORTHOPT_WITH_CUDA
    if (kernels) {  // res.direction is fp32, the reference's direction in the work dtype
      std::vector<at::Tensor> weights, copies, directions;
      for (size_t j = 0; j < b.params.size(); ++j) {
        add_weights(g, b.params[j], weights, copies);
        directions.push_back(b.slice(res.direction, j).reshape(params[b.params[j]].sizes()));
      }
      cuda::update(weights, directions, copies, std::vector<double>(weights.size(), factor), lr, o.weight_decay,
                   o.cautious_weight_decay, gate);
      continue;
    }
#endif
    std::vector<at::Tensor> storage;
    for (size_t i : b.params) storage.push_back(weight_storage(g, i));
    const at::Tensor W_old = stack_bank(storage, b.rows, b.cols, b.dtype);
    write_weights_bank(g, b,
                       optim_detail::decoupled_update(W_old, res.direction.to(b.dtype), lr, lr * factor,
                                                      o.weight_decay, o.cautious_weight_decay),
                       W_old, gate);
  }
}

// The host part of a step (Optimizer::finish_step()): the Dion banks whose Cholesky QR2
// failed somewhere (step_dion_banks() left them as they were) take their step now, through
// the reference path. One synchronization, only when there are such banks to check.
void OptimizerImpl::finish_step() {
  if (pending_dion.empty()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flags;
  for (const auto& pb : pending_dion) flags.push_back(pb.ok);
  if (skip_active) flags.push_back(keep);
  const at::Tensor host = at::stack(flags).to(at::kCPU);  // the one sync
  if (skip_active && !host[static_cast<int64_t>(pending_dion.size())].item<bool>()) return;  // skipped step
  const at::Tensor scale = lr_scale.to(at::kDouble);
  for (size_t k = 0; k < pending_dion.size(); ++k) {
    if (host[static_cast<int64_t>(k)].item<bool>()) continue;
    const auto& pb = pending_dion[k];
    const KernelsScope kernels(groups[pb.g].options.ortho.execution.kernels);
    step_dion_reference(pb.g, pb.params, scale * groups[pb.g].options.lr);
    pb.ok.fill_(true);  // done: a second call steps nothing (a graph's next replay sets it again)
  }
}

// The per-parameter reference path of step_dion().
void OptimizerImpl::step_dion_reference(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  // M = momentum + G, formed again where it is used rather than held for every parameter
  // between the two passes of the Cholesky path (one weight-sized tensor each).
  auto momentum_of = [&](size_t i) {
    const auto& p = groups[g].params[i];
    return (state_of(g, i).at("momentum").to(work_dtype(p)) + grad_of(g, i)).reshape(matrix_sizes(p, o));
  };
  // The orthonormalized P of every active parameter. Cholesky: all of them first, then one
  // host synchronization reads which parameters had a failed factorization, and those take
  // the Householder QR. (Per parameter: stacking same-shaped ones is the bank path's job.)
  std::vector<at::Tensor> P(idx.size());
  if (o.dion_qr == DionQr::Cholesky && !idx.empty()) {
    std::vector<at::Tensor> raw(idx.size()), ok(idx.size());
    for (size_t j = 0; j < idx.size(); ++j) {
      raw[j] = optim_detail::dion_power(momentum_of(idx[j]), state_of(g, idx[j]).at("Q"));
      const auto q = optim_detail::cholesky_qr2_q(raw[j]);
      P[j] = q.Q;
      ok[j] = q.ok.all();
    }
    const at::Tensor ok_host = at::stack(ok).to(at::kCPU);  // the one sync
    for (size_t j = 0; j < idx.size(); ++j)
      if (!ok_host[j].item<bool>()) {
        P[j] = optim_detail::householder_q(raw[j]);
        ++dion_qr_fallbacks;
      }
  }
  for (size_t j = 0; j < idx.size(); ++j) {
    const size_t i = idx[j];
    auto& st = state_of(g, i);
    const auto& p = groups[g].params[i];
    const auto msz = matrix_sizes(p, o);
    const at::Tensor M = momentum_of(i);
    auto r = P[j].defined() ? optim_detail::dion_finish(M, P[j], o.momentum, o.eps)
                            : optim_detail::dion_step(M, st.at("Q"), o.momentum, o.eps);
    commit(st.at("momentum"), r.momentum.reshape(p.sizes()));
    commit(st.at("Q"), r.Q);
    at::Tensor W = weights(g, i);
    const double factor = lr_adjust_factor(o.lr_adjust, msz[msz.size() - 2], msz.back());
    write_weights(g, i,
                  optim_detail::decoupled_update(W, r.direction.to(W.scalar_type()).reshape(p.sizes()), lr,
                                                 lr * factor, o.weight_decay, o.cautious_weight_decay));
  }
}

}  // namespace orthopt

// Lion (algorithms.md §9): the reference step and the fused step (CUDA kernel, CPU loop).
#include "optim/optimizer_impl.h"

#include "optim/cpu_loops.h"
#include "optim/update_math.h"
#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#endif

namespace orthopt {

using namespace optim_core;

// ---- Lion
void OptimizerImpl::step_lion(size_t g, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  const auto idx = active(g);
  if (plan_group(g, idx).path == GroupPlan::Path::Fused) return step_lion_fused(g, idx, lr);
  for (size_t i : idx) {
    auto& st = state_of(g, i);
    const auto& p = groups[g].params[i];
    auto [m_new, D] = optim_detail::lion_direction(st.at("exp_avg").to(work_dtype(p)), grad_of(g, i), o.beta1, o.beta2);
    commit(st.at("exp_avg"), m_new);
    write_weights(g, i,
                  optim_detail::decoupled_update(weights(g, i), D, lr, lr, o.weight_decay, o.cautious_weight_decay));
  }
}

void OptimizerImpl::step_lion_fused(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  if (groups[g].params[idx[0]].device().is_cpu()) {
    if (keep_flag().defined() && !keep_flag().item<bool>()) return;  // skipped: as commit() leaves it
    const optim_detail::DecayOptions decay{lr.item<double>(), o.weight_decay, o.cautious_weight_decay};
    for (size_t i : idx)
      optim_detail::lion_cpu(groups[g].params[i].grad(), state_of(g, i).at("exp_avg"), groups[g].params[i].detach(),
                             o.beta1, o.beta2, decay);
    return;
  }
#ifdef ORTHOPT_WITH_CUDA
  std::vector<at::Tensor> grads, exp_avgs, weights, copies;
  for (size_t i : idx) {
    grads.push_back(groups[g].params[i].grad());
    exp_avgs.push_back(state_of(g, i).at("exp_avg"));
    add_weights(g, i, weights, copies);
  }
  cuda::lion(grads, exp_avgs, weights, copies, lr, o.beta1, o.beta2, o.weight_decay, o.cautious_weight_decay,
             keep_flag());
#endif
}

}  // namespace orthopt

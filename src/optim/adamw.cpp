// AdamW (algorithms.md §7): the reference step and the fused step (CUDA kernel, CPU loop).
#include "optim/optimizer_impl.h"

#include "optim/cpu_loops.h"
#include "optim/update_math.h"
#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#endif

namespace orthopt {

using namespace optim_core;

// ---- AdamW (§7)
void OptimizerImpl::step_adamw(size_t g, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  const auto idx = active(g);
  if (plan_group(g, idx).path == GroupPlan::Path::Fused) return step_adamw_fused(g, idx, lr);
  for (size_t i : idx) {
    auto& st = state_of(g, i);
    const auto& p = groups[g].params[i];
    at::Tensor step_new = st.at("step") + 1;
    auto r = optim_detail::adamw_direction(st.at("exp_avg").to(work_dtype(p)), st.at("exp_avg_sq").to(work_dtype(p)),
                                           grad_of(g, i), step_new, o.beta1, o.beta2, o.eps);
    commit(st.at("exp_avg"), r.exp_avg);
    commit(st.at("exp_avg_sq"), r.exp_avg_sq);
    commit(st.at("step"), step_new);
    write_weights(g, i,
                  optim_detail::decoupled_update(weights(g, i), r.direction, lr, lr, o.weight_decay,
                                                 o.cautious_weight_decay));
  }
}

void OptimizerImpl::step_adamw_fused(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  if (groups[g].params[idx[0]].device().is_cpu()) {
    // A skipped step leaves everything as it was, as the reference's commit() does.
    if (keep_flag().defined() && !keep_flag().item<bool>()) return;
    const optim_detail::DecayOptions decay{lr.item<double>(), o.weight_decay, o.cautious_weight_decay};
    for (size_t i : idx) {
      auto& st = state_of(g, i);
      // The bias corrections as the reference computes them (0-d fp64 from the fp32 step + 1),
      // then rounded alike; the step count advances after the loop has run.
      const at::Tensor t = (st.at("step") + 1).to(at::kDouble);
      const double bc1 = (1.0 - at::pow(o.beta1, t)).item<double>();
      const double bc2_sqrt = (1.0 - at::pow(o.beta2, t)).sqrt().item<double>();
      optim_detail::adamw_cpu(groups[g].params[i].grad(), st.at("exp_avg"), st.at("exp_avg_sq"),
                              groups[g].params[i].detach(), bc1, bc2_sqrt, o.beta1, o.beta2, o.eps, decay);
      st.at("step").add_(1);
    }
    return;
  }
#ifdef ORTHOPT_WITH_CUDA
  std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, counts, weights, copies;
  for (size_t i : idx) {
    auto& st = state_of(g, i);
    grads.push_back(groups[g].params[i].grad());
    exp_avgs.push_back(st.at("exp_avg"));
    exp_avg_sqs.push_back(st.at("exp_avg_sq"));
    counts.push_back(st.at("step"));
    add_weights(g, i, weights, copies);
  }
  cuda::adamw(grads, exp_avgs, exp_avg_sqs, counts, weights, copies, lr, o.beta1, o.beta2, o.eps, o.weight_decay,
              o.cautious_weight_decay, keep_flag());
#endif
}

}  // namespace orthopt

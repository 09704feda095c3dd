// AdamW (algorithms.md §7): the reference step and the fused CUDA step.
#include "optim/optimizer_impl.h"

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
#ifdef ORTHOPT_WITH_CUDA
  if (plan_group(g, idx).path == GroupPlan::Path::Fused) return step_adamw_fused(g, idx, lr);
#endif
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

#ifdef ORTHOPT_WITH_CUDA
void OptimizerImpl::step_adamw_fused(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
  const auto& o = groups[g].options;
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
}
#endif  // ORTHOPT_WITH_CUDA

}  // namespace orthopt

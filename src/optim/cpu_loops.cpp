// The fused AdamW and Lion loops on the CPU (cpu_loops.h). Each scalar below is rounded to fp32
// as ATen rounds a Scalar or 0-d operand of an fp32 operation, and each expression keeps the
// reference's order of operations; built with -ffp-contract=off (CMakeLists.txt), so no
// multiply-add is fused where the reference rounds twice.
#include "optim/cpu_loops.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace orthopt::optim_detail {

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task: ATen's own grain for elementwise work

void check_operand(const at::Tensor& t, const at::Tensor& like, const char* name, const char* fn) {
  TORCH_CHECK(cpu_loops_take(t), fn, ": argument '", name, "' must be a contiguous fp32 CPU tensor");
  TORCH_CHECK(t.numel() == like.numel(), fn, ": argument '", name, "' has ", t.numel(), " elements, expected ",
              like.numel());
}

// The decoupled update of one weight w with direction d (decayed_weights, then − d·lr).
struct Decoupled {
  float lr, decay, lr_wd;
  bool any_decay, cautious;
  explicit Decoupled(const DecayOptions& o)
      : lr(static_cast<float>(o.lr)),
        decay(static_cast<float>(1.0 - o.lr * o.weight_decay)),
        lr_wd(static_cast<float>(o.lr * o.weight_decay)),
        any_decay(o.weight_decay != 0.0),
        cautious(o.cautious) {}
  float operator()(float w, float d) const {
    float decayed = w;
    if (any_decay) {
      if (cautious) {
        const float mask = (w * d >= 0.0f) ? 1.0f : 0.0f;
        decayed = w - (w * mask) * lr_wd;
      } else {
        decayed = w * decay;
      }
    }
    return decayed - d * lr;
  }
};

}  // namespace

bool cpu_loops_take(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() > 0 &&
         t.layout() == at::kStrided;
}

void adamw_cpu(const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
               const at::Tensor& weight, double bias_correction1, double bias_correction2_sqrt, double beta1,
               double beta2, double eps, const DecayOptions& decay) {
  const char* fn = "orthopt::optim_detail::adamw_cpu";
  check_operand(grad, weight, "grad", fn);
  check_operand(exp_avg, weight, "exp_avg", fn);
  check_operand(exp_avg_sq, weight, "exp_avg_sq", fn);
  check_operand(weight, weight, "weight", fn);
  const float b1 = static_cast<float>(beta1), one_minus_b1 = static_cast<float>(1.0 - beta1);
  const float b2 = static_cast<float>(beta2), one_minus_b2 = static_cast<float>(1.0 - beta2);
  const float bc1 = static_cast<float>(bias_correction1), bc2_sqrt = static_cast<float>(bias_correction2_sqrt);
  const float e = static_cast<float>(eps);
  const Decoupled update(decay);
  const float* g = grad.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  float* w = weight.data_ptr<float>();
  at::parallel_for(0, weight.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float gi = g[i];
      const float mi = m[i] * b1 + gi * one_minus_b1;
      const float vi = v[i] * b2 + (gi * gi) * one_minus_b2;
      const float d = (mi / bc1) / (std::sqrt(vi) / bc2_sqrt + e);
      m[i] = mi;
      v[i] = vi;
      w[i] = update(w[i], d);
    }
  });
}

void lion_cpu(const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& weight, double beta1,
              double beta2, const DecayOptions& decay) {
  const char* fn = "orthopt::optim_detail::lion_cpu";
  check_operand(grad, weight, "grad", fn);
  check_operand(exp_avg, weight, "exp_avg", fn);
  check_operand(weight, weight, "weight", fn);
  const float b1 = static_cast<float>(beta1), one_minus_b1 = static_cast<float>(1.0 - beta1);
  const float b2 = static_cast<float>(beta2), one_minus_b2 = static_cast<float>(1.0 - beta2);
  const Decoupled update(decay);
  const float* g = grad.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* w = weight.data_ptr<float>();
  at::parallel_for(0, weight.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float gi = g[i];
      const float c = m[i] * b1 + gi * one_minus_b1;
      const float d = static_cast<float>((0.0f < c) - (c < 0.0f));  // ATen's sign: 0 for NaN
      m[i] = m[i] * b2 + gi * one_minus_b2;
      w[i] = update(w[i], d);
    }
  });
}

}  // namespace orthopt::optim_detail

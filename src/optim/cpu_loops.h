#pragma once
// The fused AdamW and Lion updates on the CPU: one pass over each parameter's gradient, state
// and weights, where the reference (adamw_direction / lion_direction, decoupled_update) makes a
// dozen ATen passes and as many temporaries. The arithmetic is the reference's, operation for
// operation in fp32 with its scalars rounded as ATen rounds them, so both give the same bits
// (tests/python/test_execution.py); the file is compiled without floating-point contraction.
#include <ATen/ATen.h>

namespace orthopt::optim_detail {

// Whether the loops take this tensor: CPU, fp32, contiguous, not empty.
bool cpu_loops_take(const at::Tensor& t);

struct DecayOptions {
  double lr = 0.0;            // this step's lr (the group's lr times the lr scale)
  double weight_decay = 0.0;
  bool cautious = false;      // decay only where the weight and the direction agree in sign
};

// AdamW: exp_avg, exp_avg_sq and weight updated in place from grad. bias_correction1 is
// 1 − β₁ᵗ and bias_correction2_sqrt is √(1 − β₂ᵗ), both computed by the caller as the reference
// computes them (0-d fp64 tensors), so that they round alike.
void adamw_cpu(const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
               const at::Tensor& weight, double bias_correction1, double bias_correction2_sqrt, double beta1,
               double beta2, double eps, const DecayOptions& decay);

// Lion: exp_avg and weight updated in place from grad.
void lion_cpu(const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& weight, double beta1,
              double beta2, const DecayOptions& decay);

}  // namespace orthopt::optim_detail

#pragma once
// Peers the benchmarks time in the same run: plain torch written here, never our engine.
#include <ATen/ATen.h>

#include "orthopt/schedules.h"

namespace orthopt::bench {

// Dense Newton–Schulz in plain torch, the formulation of torch.optim.Muon (fp32 normalization,
// iteration in `compute`, A = X·Xᵀ, B = b·A + c·A·A, X = a·X + B·X, each product one cuBLAS
// call with its β·C epilogue), same schedule and orientation as ours. Returns G's dtype.
at::Tensor torch_dense_ns(const at::Tensor& G, const Schedule& s, int steps, at::ScalarType compute);

}  // namespace orthopt::bench

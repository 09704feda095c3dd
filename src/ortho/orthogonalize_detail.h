#pragma once
// Internal entry points of the orthogonalization engine (not part of the public API).

#include <ATen/ATen.h>

#include "orthopt/orthogonalize.h"

namespace orthopt::detail {

// orthogonalize(G, opt) before its final cast to G's dtype: the Newton–Schulz result in the
// compute dtype, with G's shape; for tall matrices (rows > cols) a transposed view of the
// contiguous [..., cols, rows] result (with split_sizes: contiguous). orthogonalize() returns
// this .to(G.scalar_type()); the fused optimizer step uses it directly as the update direction
// (a bf16/fp16 direction widens to fp32 exactly, like that cast).
at::Tensor orthogonalize_in_compute_dtype(const at::Tensor& G, const OrthoOptions& opt);

}  // namespace orthopt::detail

#pragma once
// The orthogonalization engine: approximate polar factor of each matrix by Newton–Schulz
// (standard or Gram, algorithms.md §1).

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <string>
#include <vector>

#include "orthopt/execution.h"
#include "orthopt/schedules.h"

namespace orthopt {

enum class OrthoMethod {
  Standard,  // X <- a·X + (b·A + c·A²)·X with A = X·Xᵀ
  Gram,      // iterate on R = X·Xᵀ (m×m) and apply the accumulated Q once; for cols >> rows
  Auto,      // Gram when cols >= gram_aspect_threshold·rows, else Standard
};

// What to do when the input holds NaN or Inf.
enum class NonFinitePolicy {
  Error,      // throw (one host synchronization on a GPU, after the work is enqueued)
  Propagate,  // no check: NaN/Inf flow through to the output (optimizers use this; their
              // firewall looks at the gradient norm instead)
};

struct OrthoOptions {
  std::string schedule = "polar_express";  // a name from builtin_schedules(), or "custom"
  std::vector<Triple> custom_triples;      // used when schedule == "custom"
  int steps = 5;
  OrthoMethod method = OrthoMethod::Auto;
  // Default: fp32 on CPU; on CUDA bf16 for standard NS and fp16 for Gram NS.
  c10::optional<at::ScalarType> compute_dtype;
  std::vector<int> gram_restarts = {2};  // restart before these 0-based step indices
  double gram_aspect_threshold = 1.5;
  c10::optional<double> safety;  // overrides the schedule's
  c10::optional<double> eps;     // overrides the schedule's
  std::vector<int64_t> split_sizes;  // row blocks orthogonalized independently (fused QKV)
  bool flatten = false;              // a >=3-D weight is one [dim0, prod(rest)] matrix
  NonFinitePolicy nonfinite = NonFinitePolicy::Error;
  ExecutionOptions execution;  // which implementation runs (orthopt/execution.h); not the math
};

// Orthogonalizes G of shape [m, n] or [..., m, n] (leading dims: a batch of independent
// matrices; with flatten: one matrix [size(0), prod(rest)]). Returns G's shape and dtype.
at::Tensor orthogonalize(const at::Tensor& G, const OrthoOptions& opt = {});

// Checks G's shape and dtype and the options, not G's values (orthogonalize does the NaN/Inf
// check of NonFinitePolicy::Error); throws c10::Error naming the offending argument.
void validate_ortho_args(const at::Tensor& G, const OrthoOptions& opt);

// The schedule the options select (built-in or custom, with overrides applied).
Schedule resolve_schedule(const OrthoOptions& opt);

// The method used for one rows×cols matrix (orientation already applied: rows <= cols).
OrthoMethod resolve_method(int64_t rows, int64_t cols, const OrthoOptions& opt);

// The compute dtype used for a matrix on `device` with the resolved method.
at::ScalarType resolve_compute_dtype(const OrthoOptions& opt, c10::Device device, OrthoMethod method);

// Non-empty when Gram NS with these options in this compute dtype is known to go wrong: in half
// precision (fp16, bf16) without restarts over three or more steps, R's spurious negative
// eigenvalues grow unchecked (relative error 0.6-1.2 against float64 measured, against 0.03-0.05
// with the default restart). orthogonalize warns once per process with this text.
std::string gram_precision_warning(const OrthoOptions& opt, at::ScalarType compute);

// Dense FLOPs of 5-step-equivalent standard NS, 2·(2m²n + 2m³ + 2m²n) per step with
// m = min, n = max: the reference count performance.md uses for rates.
double standard_ns_flops(int64_t rows, int64_t cols, int steps);

// FLOPs the chosen method actually performs (dense products; no symmetric savings).
double method_flops(int64_t rows, int64_t cols, int steps, OrthoMethod method,
                    const std::vector<int>& restarts);

const char* to_string(OrthoMethod m);
OrthoMethod parse_method(const std::string& s);  // "standard" | "gram" | "auto"

}  // namespace orthopt

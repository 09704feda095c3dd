// The orthogonalization's options: names, the resolved schedule, method and compute dtype, FLOP
// counts and the checks of arguments (orthopt/orthogonalize.h).
#include "orthopt/orthogonalize.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace orthopt {
namespace {

constexpr int kMaxSteps = 100;

bool is_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

}  // namespace

const char* to_string(OrthoMethod m) {
  switch (m) {
    case OrthoMethod::Standard: return "standard";
    case OrthoMethod::Gram: return "gram";
    case OrthoMethod::Auto: return "auto";
  }
  return "?";
}

OrthoMethod parse_method(const std::string& s) {
  if (s == "standard") return OrthoMethod::Standard;
  if (s == "gram") return OrthoMethod::Gram;
  if (s == "auto") return OrthoMethod::Auto;
  TORCH_CHECK(false, "argument 'method': unknown method '", s, "' (known: standard, gram, auto)");
}

Schedule resolve_schedule(const OrthoOptions& opt) {
  Schedule s = opt.schedule == "custom"
                   ? custom_schedule(opt.custom_triples, opt.safety.value_or(1.0), opt.eps.value_or(1e-7))
                   : find_schedule(opt.schedule);
  if (opt.safety) {
    TORCH_CHECK(std::isfinite(*opt.safety) && *opt.safety > 0, "argument 'safety': must be finite and > 0, got ", *opt.safety);
    s.safety = *opt.safety;
  }
  if (opt.eps) {
    TORCH_CHECK(std::isfinite(*opt.eps) && *opt.eps >= 0, "argument 'eps': must be finite and >= 0, got ", *opt.eps);
    s.eps = *opt.eps;
  }
  return s;
}

OrthoMethod resolve_method(int64_t rows, int64_t cols, const OrthoOptions& opt) {
  if (opt.method != OrthoMethod::Auto) return opt.method;
  return static_cast<double>(cols) >= opt.gram_aspect_threshold * static_cast<double>(rows)
             ? OrthoMethod::Gram
             : OrthoMethod::Standard;
}

at::ScalarType resolve_compute_dtype(const OrthoOptions& opt, c10::Device device, OrthoMethod method) {
  if (opt.compute_dtype) return *opt.compute_dtype;
  if (device.is_cpu()) return at::kFloat;
  return method == OrthoMethod::Gram ? at::kHalf : at::kBFloat16;
}

std::string gram_precision_warning(const OrthoOptions& opt, at::ScalarType compute) {
  if (!opt.gram_restarts.empty() || opt.steps < 3 || (compute != at::kHalf && compute != at::kBFloat16)) return {};
  return "Gram Newton-Schulz in " + std::string(c10::toString(compute)) + " without restarts ('gram_restarts' is "
         "empty, " + std::to_string(opt.steps) + " steps): R's spurious negative eigenvalues grow unchecked and the "
         "result can be far from orthogonal (relative error 0.6-1.2 measured, against 0.03-0.05 with the default "
         "restart before step 2). Keep a restart, or compute in float32.";
}

double standard_ns_flops(int64_t rows, int64_t cols, int steps) {
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

double method_flops(int64_t rows, int64_t cols, int steps, OrthoMethod method, const std::vector<int>& restarts) {
  if (method != OrthoMethod::Gram) return standard_ns_flops(rows, cols, steps);
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  auto is_restart = [&](int t) { return std::find(restarts.begin(), restarts.end(), t) != restarts.end(); };
  double f = 2.0 * m * m * n;  // R = X·Xᵀ
  bool fresh = true;
  for (int t = 0; t < steps; ++t) {
    if (t > 0 && is_restart(t)) { f += 4.0 * m * m * n; fresh = true; }
    f += 2.0 * m * m * m;                    // R·R
    if (!fresh) f += 2.0 * m * m * m;        // Q·Z
    fresh = false;
    if (t + 1 == steps || is_restart(t + 1)) continue;
    f += 4.0 * m * m * m;                    // R·Z, Z·RZ
  }
  return f + 2.0 * m * m * n;                // Q·X
}

void validate_ortho_args(const at::Tensor& G, const OrthoOptions& opt) {
  TORCH_CHECK(G.defined(), "argument 'G': undefined tensor");
  TORCH_CHECK(G.dim() >= 2, "argument 'G': expected a matrix [m, n] or a batch [..., m, n], got a ", G.dim(),
              "-D tensor of shape ", G.sizes());
  for (int64_t d = 0; d < G.dim(); ++d)
    TORCH_CHECK(G.size(d) > 0, "argument 'G': dimension ", d, " is empty (shape ", G.sizes(), ")");
  TORCH_CHECK(is_float(G.scalar_type()), "argument 'G': expected a floating-point tensor, got dtype ",
              G.scalar_type());
  TORCH_CHECK(!G.is_sparse(), "argument 'G': sparse tensors are not supported");
  TORCH_CHECK(opt.steps >= 1 && opt.steps <= kMaxSteps, "argument 'steps': must be in [1, ", kMaxSteps, "], got ",
              opt.steps);
  for (int r : opt.gram_restarts)
    TORCH_CHECK(r >= 1 && r < opt.steps, "argument 'restarts': restart index ", r, " is outside the step range [1, ",
                opt.steps - 1, "] for steps=", opt.steps);
  TORCH_CHECK(std::isfinite(opt.gram_aspect_threshold) && opt.gram_aspect_threshold >= 1.0,
              "argument 'gram_aspect_threshold': must be >= 1, got ", opt.gram_aspect_threshold);
  if (opt.compute_dtype)
    TORCH_CHECK(is_float(*opt.compute_dtype), "argument 'compute_dtype': expected a floating-point dtype, got ",
                *opt.compute_dtype);
  (void)resolve_schedule(opt);  // throws on an unknown schedule or bad overrides
  const int64_t rows = opt.flatten ? G.size(0) : G.size(-2);
  if (!opt.split_sizes.empty()) {
    int64_t sum = 0;
    for (int64_t s : opt.split_sizes) {
      TORCH_CHECK(s > 0, "argument 'split_sizes': sizes must be positive, got ", s);
      sum += s;
    }
    TORCH_CHECK(sum == rows, "argument 'split_sizes': sizes sum to ", sum, " but the matrix has ", rows, " rows");
  }
}

}  // namespace orthopt

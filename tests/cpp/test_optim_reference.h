#pragma once
// Plain float64 reference steps for the optimizer tests (algorithms.md §1–7), written
// independently of src/optim: one matrix at a time, no batching, no in-place tricks.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "orthopt/schedules.h"

namespace ref {

using at::Tensor;

inline Tensor f64(const Tensor& t) { return t.detach().to(at::kDouble).clone(); }

// Standard Newton–Schulz of one matrix [m, n] in float64 with the named schedule.
inline Tensor newton_schulz(const Tensor& G, const std::string& schedule, int steps) {
  const auto& s = orthopt::find_schedule(schedule);
  const bool tall = G.size(0) > G.size(1);
  Tensor X = tall ? G.t() : G;
  X = X / (X.norm() * s.safety + s.eps);
  for (int t = 0; t < steps; ++t) {
    const auto& abc = s.at_step(t);
    Tensor A = at::matmul(X, X.t());
    Tensor B = A * abc[1] + at::matmul(A, A) * abc[2];
    X = X * abc[0] + at::matmul(B, X);
  }
  return tall ? X.t() : X;
}

// Orthogonalizes U [.., m, n] per matrix (leading dims are a batch); split_sizes cut rows.
inline Tensor orthogonalize(const Tensor& U, const std::string& schedule, int steps,
                            const std::vector<int64_t>& split_sizes = {}) {
  Tensor flat = U.reshape({-1, U.size(-2), U.size(-1)});
  std::vector<Tensor> mats;
  for (int64_t b = 0; b < flat.size(0); ++b) {
    Tensor m = flat[b];
    if (split_sizes.empty()) {
      mats.push_back(newton_schulz(m, schedule, steps));
    } else {
      std::vector<Tensor> blocks;
      int64_t off = 0;
      for (int64_t s : split_sizes) {
        blocks.push_back(newton_schulz(m.narrow(0, off, s), schedule, steps));
        off += s;
      }
      mats.push_back(at::cat(blocks, 0));
    }
  }
  return at::stack(mats, 0).reshape(U.sizes());
}

inline double lr_factor(const std::string& rule, double out, double in) {
  if (rule == "spectral_norm") return std::sqrt(out / in);
  if (rule == "jordan") return std::sqrt(std::max(1.0, out / in));
  if (rule == "rms_norm") return 0.2 * std::sqrt(std::max(out, in));
  return 1.0;
}

// W·(1 − lr·wd) (cautious: only where W·D >= 0) − lr_step·D.
inline Tensor apply(const Tensor& W, const Tensor& D, double lr, double lr_step, double wd, bool cautious) {
  Tensor decay = cautious ? (W * D >= 0).to(at::kDouble) * (lr * wd) : at::full_like(W, lr * wd);
  return W - W * decay - D * lr_step;
}

// NorMuon normalization of one matrix U [rows, cols] with variance V [rows, 1] (updated).
inline Tensor normuon(const Tensor& U, Tensor& V, double beta2, double eps) {
  V = V * beta2 + (U * U).mean(1, true) * (1 - beta2);
  Tensor Uh = U / (V.sqrt() + eps);
  return Uh * (U.norm() / std::max(Uh.norm().item<double>(), 1e-8));
}

// Relative Frobenius distance ‖a − b‖ / ‖b‖.
inline double rel(const Tensor& a, const Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() / b.to(at::kDouble).norm().item<double>();
}

}  // namespace ref

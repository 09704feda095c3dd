// One Muon step from an installed orthopt, against Newton–Schulz written out plainly in float64.
// Exit status 0 when the step matches; prints what differs otherwise.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include <ATen/ATen.h>

#include <orthopt/optim.h>
#include <orthopt/orthogonalize.h>
#include <orthopt/version.h>

namespace {

// Jordan's schedule (a, b, c) for 5 steps on X = G / (‖G‖_F + 1e-7), rows <= cols.
at::Tensor plain_newton_schulz(const at::Tensor& G) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  at::Tensor X = G.to(at::kDouble);
  X = X / (X.norm() + 1e-7);
  for (int t = 0; t < 5; ++t) {
    at::Tensor A = at::matmul(X, X.t());
    X = a * X + at::matmul(b * A + c * at::matmul(A, A), X);
  }
  return X;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "orthopt_consumer: FAILED: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main() {
  std::printf("orthopt %s (header), %s (CMake package)\n", ORTHOPT_VERSION_STRING, ORTHOPT_PACKAGE_VERSION);
  if (std::strcmp(ORTHOPT_VERSION_STRING, ORTHOPT_PACKAGE_VERSION) != 0) return fail("version mismatch");

  at::manual_seed(0);
  const double lr = 0.05;
  at::Tensor W = at::randn({8, 16});
  const at::Tensor W0 = W.clone();
  const at::Tensor G = at::randn({8, 16});
  W.mutable_grad() = G.clone();

  // First step with accumulated momentum: M = G, update -lr·orthogonalize(G) (no decay, no lr scaling).
  orthopt::ParamGroup group;
  group.params = {W};
  group.options.algorithm = orthopt::Algorithm::Muon;
  group.options.lr = lr;
  group.options.weight_decay = 0.0;
  group.options.momentum_style = orthopt::MomentumStyle::Accumulate;
  group.options.nesterov = false;
  group.options.lr_adjust = orthopt::LrAdjust::None;
  group.options.ortho.schedule = "jordan";
  group.options.ortho.steps = 5;
  group.options.ortho.method = orthopt::OrthoMethod::Standard;
  orthopt::Optimizer opt({group});
  opt.step();

  if (!W.isfinite().all().item<bool>()) return fail("the weight is not finite");
  const double moved = (W - W0).abs().max().item<double>();
  if (!(moved > 1e-3)) return fail("the weight did not move");

  // Float32 NS of an 8x16 matrix against float64: entries of the update are O(0.3); 5 steps of
  // products of 16-term sums keep the float32 rounding near 1e-6, 1e-4 leaves room.
  const at::Tensor expected = W0.to(at::kDouble) - lr * plain_newton_schulz(G);
  const double err = (W.to(at::kDouble) - expected).abs().max().item<double>();
  std::printf("max |W - W_reference| = %.3g (moved by up to %.3g)\n", err, moved);
  if (!(err < 1e-4)) return fail("the step differs from the plain Newton-Schulz reference");

  const at::Tensor O = orthopt::orthogonalize(G, group.options.ortho);
  const double err_call = ((W0 - lr * O) - W).abs().max().item<double>();
  if (!(err_call < 1e-6)) return fail("the step differs from orthopt::orthogonalize");
  std::printf("orthopt_consumer: ok\n");
  return 0;
}

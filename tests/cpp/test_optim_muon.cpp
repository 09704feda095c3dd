// Muon and AdamW against plain float64 reference steps; save/load, skip factor, routing and
// bad input of orthopt::Optimizer.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "orthopt/optim.h"
#include "test_optim_reference.h"

using orthopt::Algorithm;
using orthopt::GroupOptions;
using orthopt::LrAdjust;
using orthopt::MomentumStyle;
using orthopt::Optimizer;
using orthopt::ParamGroup;

namespace {

// Tolerance: the orthogonalization computes in fp32 (the CPU default, unit roundoff 6e-8)
// against a float64 reference; 5 polar_express steps amplify rounding to a measured 2e-6..6e-6
// relative on these random matrices. The params are float64 so that the metric, the relative
// error of the parameter DISPLACEMENT W_T − W_0, sees the update math and not the storage.
// 1e-5 is the bound and catches any wrong coefficient, factor or sign (>1e-3).
constexpr double kTol = 1e-5;
// The `auto` method uses Gram NS for wide matrices, less accurate in fp32 (measured 1e-5..5e-5
// vs float64 standard NS on these shapes; the engine's property, tested in its own tests).
constexpr double kTolGram = 1e-4;
// fp32 parameters add storage rounding: |W| ~ 1 rounds at 6e-8 against displacements of
// ~4e-3 per entry, i.e. ~1.5e-5 relative on the displacement.
constexpr double kTolFp32Params = 5e-5;

struct Shape {
  std::string name;
  std::vector<int64_t> sizes;
  std::vector<int64_t> split;  // non-empty: own group with split_sizes
};

// wide, tall, square (two of them: batched together), a 3-D expert stack and a fused split.
const std::vector<Shape> kShapes = {
    {"wide", {16, 40}, {}},  {"tall", {40, 16}, {}},         {"square_a", {24, 24}, {}},
    {"square_b", {24, 24}, {}}, {"experts", {3, 12, 20}, {}}, {"qkv", {24, 20}, {16, 8}},
};

at::Tensor randn(at::IntArrayRef sizes, at::Generator& gen, at::ScalarType dtype = at::kFloat) {
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

struct MuonConfig {
  MomentumStyle style = MomentumStyle::Accumulate;
  bool nesterov = false;
  std::string lr_adjust = "spectral_norm";
  bool cautious = false;
  double lr = 0.02, wd = 0.1, mu = 0.95;
  std::string schedule = "polar_express";
  orthopt::OrthoMethod method = orthopt::OrthoMethod::Standard;
};

std::string describe(const MuonConfig& c) {
  std::ostringstream s;
  s << orthopt::to_string(c.style) << (c.nesterov ? "+nesterov" : "") << " " << c.lr_adjust
    << (c.cautious ? " cautious" : "") << " " << c.schedule << " " << orthopt::to_string(c.method);
  return s.str();
}

// Runs `steps` Muon steps with the optimizer and with the reference; returns the worst
// relative error of the parameter displacement over all shapes.
double muon_vs_reference(const MuonConfig& c, int steps, at::ScalarType dtype = at::kDouble) {
  auto gen = at::detail::createCPUGenerator(1234);
  GroupOptions o;
  o.algorithm = Algorithm::Muon;
  o.lr = c.lr;
  o.weight_decay = c.wd;
  o.momentum = c.mu;
  o.momentum_style = c.style;
  o.nesterov = c.nesterov;
  o.lr_adjust = orthopt::parse_lr_adjust(c.lr_adjust);
  o.cautious_weight_decay = c.cautious;
  o.ortho.schedule = c.schedule;
  o.ortho.method = c.method;

  std::vector<at::Tensor> params, W0, W, M;
  std::vector<ParamGroup> groups(1);
  groups[0].options = o;
  for (const auto& s : kShapes) {
    auto p = randn(s.sizes, gen, dtype).requires_grad_(true);
    params.push_back(p);
    W0.push_back(ref::f64(p));
    W.push_back(ref::f64(p));
    M.push_back(at::zeros(s.sizes, at::kDouble));
    if (s.split.empty()) {
      groups[0].params.push_back(p);
    } else {
      ParamGroup g;
      g.options = o;
      g.options.ortho.split_sizes = s.split;
      g.params = {p};
      groups.push_back(g);
    }
  }
  Optimizer opt(groups);
  const bool ema = c.style == MomentumStyle::Ema;
  for (int t = 0; t < steps; ++t) {
    for (size_t k = 0; k < kShapes.size(); ++k) {
      auto G = randn(kShapes[k].sizes, gen, dtype);
      params[k].mutable_grad() = G;
      const auto G64 = ref::f64(G);
      // Reference Muon step (algorithms.md §3).
      M[k] = ema ? M[k] * c.mu + G64 * (1 - c.mu) : M[k] * c.mu + G64;
      at::Tensor Uin = M[k];
      if (c.nesterov) Uin = ema ? G64 * (1 - c.mu) + M[k] * c.mu : G64 + M[k] * c.mu;
      at::Tensor U = ref::orthogonalize(Uin, c.schedule, 5, kShapes[k].split);
      const double rows = static_cast<double>(W[k].size(-2)), cols = static_cast<double>(W[k].size(-1));
      if (kShapes[k].split.empty()) {
        U = U * ref::lr_factor(c.lr_adjust, rows, cols);
      } else {
        std::vector<at::Tensor> blocks;
        int64_t off = 0;
        for (int64_t s : kShapes[k].split) {
          blocks.push_back(U.narrow(0, off, s) * ref::lr_factor(c.lr_adjust, static_cast<double>(s), cols));
          off += s;
        }
        U = at::cat(blocks, 0);
      }
      W[k] = ref::apply(W[k], U, c.lr, c.lr, c.wd, c.cautious);
    }
    opt.step();
  }
  double worst = 0;
  for (size_t k = 0; k < kShapes.size(); ++k) {
    const double e = ref::rel(ref::f64(params[k]) - W0[k], W[k] - W0[k]);
    worst = std::max(worst, e);
    // The momentum state must match too.
    worst = std::max(worst, ref::rel(opt.param_state(k < 5 ? 0 : 1, k < 5 ? k : 0).at("momentum"), M[k]));
  }
  return worst;
}

TEST(OptimMuon, OneStepAndTrajectoriesMatchReference) {
  std::vector<MuonConfig> configs;
  for (auto style : {MomentumStyle::Accumulate, MomentumStyle::Ema})
    for (bool nesterov : {false, true}) {
      MuonConfig c;
      c.style = style;
      c.nesterov = nesterov;
      configs.push_back(c);
    }
  for (const char* rule : {"jordan", "rms_norm", "none"}) {
    MuonConfig c;
    c.lr_adjust = rule;
    configs.push_back(c);
  }
  {
    MuonConfig c;  // cautious weight decay with a large wd so a wrong mask shows
    c.cautious = true;
    c.wd = 5.0;
    configs.push_back(c);
    c.schedule = "jordan";
    c.cautious = false;
    c.wd = 0.1;
    configs.push_back(c);
    c.schedule = "polar_express";
    c.method = orthopt::OrthoMethod::Auto;  // Gram NS for the wide matrices
    c.nesterov = true;
    configs.push_back(c);
  }
  for (const auto& c : configs) {
    const double one = muon_vs_reference(c, 1);
    const double ten = muon_vs_reference(c, 10);
    std::cout << "muon " << describe(c) << ": rel err 1 step " << one << ", 10 steps " << ten << "\n";
    const double tol = c.method == orthopt::OrthoMethod::Standard ? kTol : kTolGram;
    EXPECT_LT(one, tol) << describe(c);
    EXPECT_LT(ten, tol) << describe(c);
  }
  const double fp32 = muon_vs_reference(MuonConfig{}, 10, at::kFloat);
  std::cout << "muon default, fp32 params: rel err 10 steps " << fp32 << "\n";
  EXPECT_LT(fp32, kTolFp32Params);
}

// AdamW (and its cautious variant) against the reference; 1-D and 2-D params.
TEST(OptimAdamW, TrajectoryMatchesReference) {
  for (bool cautious : {false, true}) {
    auto gen = at::detail::createCPUGenerator(99);
    GroupOptions o;
    o.algorithm = Algorithm::AdamW;
    o.lr = 1e-2;
    o.weight_decay = cautious ? 3.0 : 0.1;
    o.cautious_weight_decay = cautious;
    std::vector<std::vector<int64_t>> shapes = {{32}, {12, 7}, {2, 3, 5}};
    ParamGroup g;
    g.options = o;
    std::vector<at::Tensor> W0, W, m, v;
    for (const auto& s : shapes) {
      auto p = randn(s, gen).requires_grad_(true);
      g.params.push_back(p);
      W0.push_back(ref::f64(p));
      W.push_back(ref::f64(p));
      m.push_back(at::zeros(s, at::kDouble));
      v.push_back(at::zeros(s, at::kDouble));
    }
    Optimizer opt({g});
    for (int t = 1; t <= 10; ++t) {
      for (size_t k = 0; k < shapes.size(); ++k) {
        auto G = randn(shapes[k], gen);
        g.params[k].mutable_grad() = G;
        auto G64 = ref::f64(G);
        m[k] = m[k] * 0.9 + G64 * 0.1;
        v[k] = v[k] * 0.95 + G64 * G64 * 0.05;
        auto D = (m[k] / (1 - std::pow(0.9, t))) / ((v[k] / (1 - std::pow(0.95, t))).sqrt() + 1e-8);
        W[k] = ref::apply(W[k], D, o.lr, o.lr, o.weight_decay, cautious);
      }
      opt.step();
      if (t == 1 || t == 10)
        for (size_t k = 0; k < shapes.size(); ++k)
          EXPECT_LT(ref::rel(ref::f64(g.params[k]) - W0[k], W[k] - W0[k]), kTol)
              << "cautious=" << cautious << " step " << t << " shape " << k;
    }
    EXPECT_EQ(opt.step_count(), 10);
    EXPECT_EQ(opt.param_state(0, 0).at("step").item<float>(), 10.0f);
  }
}

TEST(OptimMuon, ParamsWithoutGradAreSkipped) {
  auto gen = at::detail::createCPUGenerator(5);
  auto a = randn({8, 8}, gen).requires_grad_(true), b = randn({8, 8}, gen).requires_grad_(true);
  ParamGroup g;
  g.params = {a, b};
  Optimizer opt({g});
  auto b0 = b.detach().clone();
  a.mutable_grad() = randn({8, 8}, gen);
  opt.step();
  EXPECT_TRUE(at::equal(b, b0));
  EXPECT_TRUE(opt.param_state(0, 1).empty());
  EXPECT_FALSE(opt.param_state(0, 0).empty());
}

// lr_scale multiplies the lr: scale 0.5 with lr 0.02 equals lr 0.01.
TEST(OptimMuon, LrScaleMultipliesLr) {
  auto run = [](double lr, double scale) {
    auto gen = at::detail::createCPUGenerator(17);
    ParamGroup g;
    g.params = {randn({10, 14}, gen).requires_grad_(true)};
    g.options.lr = lr;
    g.options.weight_decay = 0.3;
    Optimizer opt({g});
    opt.set_lr_scale(scale);
    for (int t = 0; t < 3; ++t) {
      g.params[0].mutable_grad() = randn({10, 14}, gen);
      opt.step();
    }
    return ref::f64(g.params[0]);
  };
  EXPECT_LT(ref::rel(run(0.02, 0.5), run(0.01, 1.0)), 1e-6);
  EXPECT_GT(ref::rel(run(0.02, 1.0), run(0.01, 1.0)), 1e-3);
}

}  // namespace

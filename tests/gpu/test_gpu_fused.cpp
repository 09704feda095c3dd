// The fused multi-tensor optimizer step on the GPU (src/cuda/multi_tensor_cuda.h, docs/gpu.md):
// not in CI (needs a GPU; tests/gpu/run.sh runs it).
//
// Fused vs reference: two optimizers over identical parameters receive identical random
// gradients for 10 steps; one steps with kernels=off (the ATen reference path), the
// other on the fused path. The kernels perform the reference's fp32 operations one by one, in the
// same order and without fused multiply-adds (kernels/src/multi_tensor.cu), so the trajectories
// are expected to agree bit for bit. The bound, 1e-5 of how far the reference tensor moved
// (parameters, master weights) or of its norm (state that starts at zero), leaves room for fp32
// rounding differences only: 2^-24 ≈ 6e-8 per operation, a handful of operations per step, 10
// steps, about 1e-6; a wrong formula, scalar, dtype or buffer shows as 1e-3 to 1. Tensors stored
// in bf16/fp16 may round an fp32 difference of one unit to the neighbouring 16-bit value: 2^-8
// of their norm more. The matrix groups orthogonalize in fp32 in that comparison
// (compute_dtype), so both runs use the same ATen Newton–Schulz: kernels=off switches
// the bf16/fp16 product kernels off too, and those differ from ATen's products at bf16 level.
// One difference remains with fp32 NS, for tall matrices only: the fused run prepares the NS
// input with the scale_cast kernel, which takes the Frobenius norm over the matrix as stored,
// while the reference reduces its transposed copy (another summation order). The norms may then
// differ in the last bit and the NS results by fp32 rounding (~1e-7 relative per step), far
// inside the 1e-5 bound; wide matrices stay bit-identical. (Muon directions in the NS compute
// dtype, bf16/fp16, widen to fp32 exactly in the update kernel, as the reference's cast does.)
// Since Dion3 and NorMuon run per bank, batches differ between the two runs too: see the bound
// of MatchesReferencePathToFp32Rounding.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/householder_cuda.h"
#include "cuda/multi_tensor_cuda.h"
#include "cuda/products_cuda.h"
#include "gpu_test_util.h"
#include "optim/update_math.h"
#include "orthopt/cuda_graph.h"
#include "orthopt/optim.h"
#include "orthopt/runtime.h"

namespace {

using orthopt::Algorithm;
using orthopt::CudaGraphOptimizer;
using orthopt::GroupOptions;
using orthopt::Optimizer;
using orthopt::gpu_test::first_mismatch;
using orthopt::ParamGroup;

struct KernelsOff {  // the reference path for the rest of the scope (ExecutionOptions::kernels = off)
  orthopt::KernelsScope scope{orthopt::Toggle::Off};
};
using orthopt::gpu_test::set_execution;
using orthopt::ExecutionOptions;
using orthopt::Toggle;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

class GpuFused : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// One group: parameter shapes and dtypes (empty: all fp32) and its options beyond the defaults.
struct Spec {
  Algorithm algorithm;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::ScalarType> dtypes;
  std::function<void(GroupOptions&)> tweak;
};

std::vector<int64_t> vec(int64_t n) { return {n}; }

// Every path of the fused step: same-shaped matrices (one stacked buffer), a 3-D stack, tall
// matrices (transposed NS results), tensors larger than a kernel chunk (16384 elements), groups
// with more tensors than a kernel table holds (56 for AdamW), mixed dtypes in one group, master
// weights, 16-bit parameters and state without them, split_sizes, flatten, ema, Nesterov,
// cautious weight decay, weight decay 0. NorMuon and Dion3 run per bank of same-shaped matrices
// (2-D params and 3-D stacks together); the reference path per matrix. Dion3's row choice comes
// from row L1 norms that the two paths reduce with different kernel splits on the GPU: the same
// rows unless two norms tie to the last bits (random data: they do not).
std::vector<Spec> fused_specs() {
  std::vector<Spec> s;
  s.push_back({Algorithm::Muon, {{64, 96}, {64, 96}, {3, 32, 48}, {300, 200}, {96, 40}}, {}, [](GroupOptions& o) {
                 o.nesterov = true;
                 o.cautious_weight_decay = true;
               }});
  s.push_back({Algorithm::Muon,
               {{48, 80}, {48, 80}, {40, 56}},
               {at::kBFloat16, at::kFloat, at::kHalf},
               [](GroupOptions& o) {
                 o.master_weights = true;
                 o.momentum_style = orthopt::MomentumStyle::Ema;
               }});
  s.push_back({Algorithm::Muon, {{40, 56}, {56, 40}}, {at::kBFloat16, at::kBFloat16}, [](GroupOptions& o) {
                 o.nesterov = true;
                 o.lr_adjust = orthopt::LrAdjust::RmsNorm;
               }});
  s.push_back({Algorithm::Muon, {{96, 64}}, {}, [](GroupOptions& o) { o.ortho.split_sizes = {32, 32, 32}; }});
  s.push_back({Algorithm::Muon, {{8, 4, 3, 3}}, {}, [](GroupOptions& o) {
                 o.ortho.flatten = true;
                 o.weight_decay = 0.0;
               }});
  s.push_back({Algorithm::NorMuon, {{80, 40}, {80, 40}, {40, 120}, {2, 40, 120}}, {},
               [](GroupOptions& o) { o.cautious_weight_decay = true; }});
  s.push_back({Algorithm::Dion3, {{64, 96}, {64, 96}, {2, 64, 96}, {300, 200}, {120, 40}}, {}, [](GroupOptions& o) {
                 o.fraction = 0.3;
                 o.scale_lr_by_fraction = true;
                 o.cautious_weight_decay = true;
               }});
  s.push_back({Algorithm::Dion3,
               {{48, 80}, {48, 80}, {40, 56}},
               {at::kBFloat16, at::kFloat, at::kHalf},
               [](GroupOptions& o) { o.master_weights = true; }});
  s.push_back({Algorithm::Dion3, {{40, 56}, {40, 56}}, {at::kBFloat16, at::kBFloat16}, [](GroupOptions& o) {
                 o.weight_decay = 0.0;
                 o.lr_adjust = orthopt::LrAdjust::RmsNorm;
               }});
  {
    Spec adam{Algorithm::AdamW, {}, {}, [](GroupOptions& o) { o.lr = 3e-3; }};
    for (int i = 0; i < 60; ++i) adam.shapes.push_back(vec(96));
    adam.shapes.push_back({32, 16});
    adam.shapes.push_back(vec(50000));
    s.push_back(adam);
  }
  s.push_back({Algorithm::AdamW,
               {vec(96), vec(20000), {7, 9}},
               {at::kBFloat16, at::kBFloat16, at::kHalf},
               [](GroupOptions& o) {
                 o.lr = 3e-3;
                 o.master_weights = true;
                 o.cautious_weight_decay = true;
                 o.weight_decay = 0.1;
               }});
  s.push_back({Algorithm::AdamW, {vec(128), {3, 50}}, {at::kBFloat16, at::kBFloat16}, [](GroupOptions& o) {
                 o.lr = 3e-3;
                 o.weight_decay = 0.0;
               }});
  s.push_back({Algorithm::Lion, {vec(50), {7, 9}, vec(20000)}, {}, [](GroupOptions& o) {
                 o.lr = 1e-4;
                 o.cautious_weight_decay = true;
               }});
  s.push_back({Algorithm::Lion, {vec(33), {64, 8}}, {at::kHalf, at::kHalf}, [](GroupOptions& o) { o.lr = 1e-4; }});
  // Last, so that the groups above draw the random values they drew before it came: fp32
  // params without master weights, plain decay. With a 16-bit NS the update is folded into the
  // last NS product (wide, square and 3-D stacks; a tall bank Gram NS takes in its own layout).
  s.push_back({Algorithm::Muon, {{128, 384}, {2, 128, 384}, {96, 96}, {1024, 256}}, {},
               [](GroupOptions& o) { o.lr_adjust = orthopt::LrAdjust::RmsNorm; }});
  return s;
}

std::vector<ParamGroup> make_groups(const std::vector<Spec>& specs, uint64_t seed, bool fp32_ns) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<ParamGroup> groups;
  for (size_t g = 0; g < specs.size(); ++g) {
    ParamGroup grp;
    grp.options.algorithm = specs[g].algorithm;
    grp.options.lr = 0.02;
    grp.options.weight_decay = 0.05;
    if (specs[g].tweak) specs[g].tweak(grp.options);
    if (fp32_ns) grp.options.ortho.compute_dtype = at::kFloat;
    for (size_t i = 0; i < specs[g].shapes.size(); ++i) {
      const at::ScalarType dtype = specs[g].dtypes.empty() ? at::kFloat : specs[g].dtypes[i];
      at::Tensor p = at::randn(specs[g].shapes[i], gen, at::kFloat).mul_(0.1).to(dtype).cuda();
      p.set_requires_grad(true);
      p.mutable_grad() = at::zeros_like(p);  // persistent gradient buffer, filled in place
      grp.params.push_back(p);
      grp.names.push_back("g" + std::to_string(g) + "_p" + std::to_string(i));
    }
    groups.push_back(std::move(grp));
  }
  return groups;
}

// Fills every gradient buffer with the same random values in all optimizers (NaN when asked).
void fill_grads(const std::vector<Optimizer*>& opts, int64_t step, bool nan = false) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  const auto& groups = opts[0]->param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const at::Tensor& p0 = groups[g].params[i];
      at::Tensor grad = at::randn(p0.sizes(), gen, at::kFloat);
      if (nan) grad.view(-1).narrow(0, 0, 1).fill_(NAN);
      grad = grad.to(p0.scalar_type()).cuda();
      for (Optimizer* o : opts) o->param_groups()[g].params[i].grad().copy_(grad);
    }
}

std::vector<at::Tensor> snapshot_params(const Optimizer& o) {
  std::vector<at::Tensor> out;
  for (const auto& g : o.param_groups())
    for (const auto& p : g.params) out.push_back(p.detach().clone());
  return out;
}

// Compares the fused optimizer `a` with the reference `b` (tensor by tensor, see the file
// comment); `start` holds b's parameters before the first step. Matrix-group parameters,
// master weights and NorMuon variances get `ns_rel` of their movement when the two runs
// orthogonalize differently (0: the tight bound). Returns the worst ratio difference / bound.
double worst_ratio(const Optimizer& a, const Optimizer& b, const std::vector<at::Tensor>& start, double ns_rel,
                   std::string* where) {
  double worst = 0.0;
  size_t k = 0;
  const auto& ga = a.param_groups();
  const auto& gb = b.param_groups();
  for (size_t g = 0; g < ga.size(); ++g) {
    const bool matrix = orthopt::is_matrix_algorithm(ga[g].options.algorithm);
    for (size_t i = 0; i < ga[g].params.size(); ++i, ++k) {
      auto check = [&](const std::string& what, const at::Tensor& x, const at::Tensor& y, const at::Tensor& y0,
                       bool ns_dependent) {
        const bool low = x.scalar_type() != at::kFloat;
        const auto xd = x.detach().to(at::kDouble), yd = y.detach().to(at::kDouble);
        const double diff = (xd - yd).norm().item<double>();
        const double moved = (yd - y0.to(at::kDouble)).norm().item<double>();
        const double rel = ns_dependent && ns_rel > 0 ? ns_rel : 1e-5;
        const double bound = rel * moved + (low ? std::ldexp(1.0, -8) * yd.norm().item<double>() : 0.0) + 1e-30;
        EXPECT_TRUE(at::isfinite(xd).all().item<bool>()) << ga[g].names[i] << " " << what;
        const double r = diff / bound;
        if (!(r <= worst)) {
          worst = std::isnan(r) ? INFINITY : r;
          *where = ga[g].names[i] + " " + what;
        }
      };
      check("(parameter)", ga[g].params[i], gb[g].params[i], start[k], matrix);
      const auto& sa = a.param_state(g, i);
      const auto& sb = b.param_state(g, i);
      EXPECT_EQ(sa.size(), sb.size()) << ga[g].names[i];
      for (const auto& [key, t] : sa) {
        const at::Tensor& ref = sb.at(key);
        const at::Tensor zero = at::zeros_like(ref);
        if (key == "master") check("(state 'master')", t, ref, start[k].to(at::kFloat), matrix);
        else check("(state '" + key + "')", t, ref, zero, matrix && key == "variance");
      }
    }
  }
  return worst;
}

// Dion per bank (src/optim/optimizer.cpp, step_dion_banks) against its per-parameter
// reference, with both orthonormalizations: a mixed bank (2-D params and a 3-D stack), tall
// and wide banks, a single-param bank, bf16 with master weights next to fp32, 16-bit
// parameters and momenta without them (stacked, not owned), cautious decay.
std::vector<Spec> dion_specs() {
  std::vector<Spec> s;
  for (const auto qr : {orthopt::DionQr::Householder, orthopt::DionQr::Cholesky}) {
    s.push_back({Algorithm::Dion, {{64, 96}, {64, 96}, {2, 64, 96}, {300, 200}, {120, 40}}, {}, [qr](GroupOptions& o) {
                   o.dion_qr = qr;
                   o.rank_fraction = 0.25;
                   o.cautious_weight_decay = true;
                 }});
    s.push_back({Algorithm::Dion,
                 {{48, 80}, {48, 80}, {40, 56}},
                 {at::kBFloat16, at::kFloat, at::kHalf},
                 [qr](GroupOptions& o) {
                   o.dion_qr = qr;
                   o.master_weights = true;
                 }});
    s.push_back({Algorithm::Dion, {{40, 56}, {40, 56}}, {at::kBFloat16, at::kBFloat16}, [qr](GroupOptions& o) {
                   o.dion_qr = qr;
                   o.weight_decay = 0.0;
                   o.lr_adjust = orthopt::LrAdjust::RmsNorm;
                 }});
  }
  return s;
}

void run_fused_vs_reference(const std::vector<Spec>& specs, bool fp32_ns, double ns_rel, const char* label) {
  Optimizer fused(make_groups(specs, 21, fp32_ns));
  Optimizer reference(make_groups(specs, 21, fp32_ns));
  const auto start = snapshot_params(reference);
  const double lr_scales[] = {1.0, 0.9, 0.7, 1.0, 0.5, 0.8, 1.0, 0.3, 0.6, 1.0};  // a schedule: lr read from the device
  double worst = 0.0;
  std::string where;
  for (int t = 0; t < 10; ++t) {
    fused.set_lr_scale(lr_scales[t]);
    reference.set_lr_scale(lr_scales[t]);
    fill_grads({&fused, &reference}, t);
    fused.step();
    {
      KernelsOff off;
      reference.step();
    }
    std::string w;
    const double r = worst_ratio(fused, reference, start, ns_rel, &w);
    if (r > worst) {
      worst = r;
      where = w + " at step " + std::to_string(t);
    }
  }
  std::printf("[ fused vs reference, %s ] worst difference / bound = %.3g%s%s\n", label, worst,
              where.empty() ? "" : " at ", where.c_str());
  EXPECT_LE(worst, 1.0) << "worst at " << where;
  // Both moved: the comparison is not between two untouched optimizers.
  const auto now = snapshot_params(fused);
  for (size_t k = 0; k < now.size(); ++k) EXPECT_FALSE(at::equal(now[k], start[k])) << "parameter " << k;
  EXPECT_EQ(fused.step_count(), 10);
}

// NS-dependent tensors get 1e-4 of their movement here: the fused run orthogonalizes and
// NorMuon-normalizes per bank (a [40,120] param stacked with a [2,40,120] one: batch 3), the
// reference per shape (batches of 1 and 2), cuBLAS and ATen's reductions pick kernels and
// summation orders by size, and NorMuon's factors come from orthopt_normuon_factors (its own
// fixed summation order), so the fp32 results differ by rounding (≈1e-7 per operation, grown
// by five NS iterations and NorMuon's division by the row RMS). Measured on an H200: 1.9e-5 of
// the movement (a NorMuon param, step 0). Everything that does not depend on NS keeps 1e-5.
TEST_F(GpuFused, MatchesReferencePathToFp32Rounding) {
  run_fused_vs_reference(fused_specs(), /*fp32_ns=*/true, 1e-4, "fp32 NS");
}

// Dion per bank: batched products, QR and Cholesky QR2 against per-parameter ones (cuBLAS and
// cuSOLVER pick kernels by batch size), so the fp32 results differ by rounding; the parameters
// get the NS-dependent tensors' 1e-4 of their movement, momentum and Q 1e-5 of their norm.
TEST_F(GpuFused, DionBanksMatchReferencePathToFp32Rounding) {
  run_fused_vs_reference(dion_specs(), /*fp32_ns=*/true, 1e-4, "Dion banks");
}

// With the default NS dtypes the runs differ by the NS implementations (our bf16/fp16 product
// kernels vs ATen's), each within its rounding noise of float64: up to 2.4e-2 relative on the
// Gram NS shapes measured in docs/gpu.md. Parameters that depend on NS results must agree within
// 0.1 of their movement (a wiring error gives O(1)); everything else (momentum, AdamW, Lion)
// keeps the tight bound, since it depends on the gradients only.
TEST_F(GpuFused, MatchesReferencePathWithDefaultNsUpToNsNoise) {
  run_fused_vs_reference(fused_specs(), /*fp32_ns=*/false, 0.1, "default NS");
}


// The fused step replays bit-identically under CudaGraphOptimizer: eager fused steps vs warm-up,
// capture and replays, with a scheduled lr and skipped steps (NaN gradients) inside the graph.
TEST_F(GpuFused, GraphReplayBitIdenticalToEagerFusedSteps) {
  const auto specs = fused_specs();
  Optimizer eager(make_groups(specs, 22, false));
  Optimizer graphed_opt(make_groups(specs, 22, false));
  auto one = at::ones({}, at::kFloat), zero = at::zeros({}, at::kFloat);
  eager.set_skip_factor(one);  // gating on before the capture
  graphed_opt.set_skip_factor(one);
  const int warmup = 2, steps = 9;
  CudaGraphOptimizer graphed(graphed_opt, warmup);
  for (int t = 0; t < steps; ++t) {
    const bool skip = t == 5 || t == 6;
    const double scale = 0.2 + 0.8 * 0.5 * (1.0 + std::cos(M_PI * t / steps));
    for (Optimizer* o : {&eager, &graphed_opt}) {
      o->set_lr_scale(scale);
      o->set_skip_factor(skip ? zero : one);
    }
    fill_grads({&eager, &graphed_opt}, 200 + t, /*nan=*/skip);
    const auto before = snapshot_params(graphed_opt);
    eager.step();
    graphed.step();
    EXPECT_EQ(graphed.captured(), t >= warmup) << "step " << t;
    bool unchanged = true;
    const auto after = snapshot_params(graphed_opt);
    for (size_t k = 0; k < after.size(); ++k) unchanged = unchanged && at::equal(after[k], before[k]);
    EXPECT_EQ(unchanged, skip) << "step " << t;
    const std::string diff = first_mismatch(eager, graphed_opt);
    ASSERT_EQ(diff, "") << "step " << t << (t >= warmup ? " (replay)" : " (eager warm-up)")
                        << ": graphed optimizer differs from eager at " << diff;
  }
  EXPECT_EQ(graphed_opt.step_count(), steps - 2);
}

// Skip factor 0: parameters and every state tensor stay bit-identical, with NaN gradients, on
// the fused path; the next normal step applies.
TEST_F(GpuFused, SkippedStepWritesNothingEvenWithNanGradients) {
  Optimizer opt(make_groups(fused_specs(), 23, false));
  fill_grads({&opt}, 0);
  opt.step();  // state exists
  opt.set_skip_factor(at::zeros({}, at::kFloat));
  fill_grads({&opt}, 1, /*nan=*/true);
  const auto params = snapshot_params(opt);
  std::vector<std::vector<at::Tensor>> states;
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      states.emplace_back();
      for (const auto& [key, t] : opt.param_state(g, i)) states.back().push_back(t.clone());
    }
  opt.step();
  size_t k = 0, s = 0;
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i, ++k, ++s) {
      EXPECT_TRUE(at::equal(groups[g].params[i], params[k])) << groups[g].names[i];
      size_t j = 0;
      for (const auto& [key, t] : opt.param_state(g, i))
        EXPECT_TRUE(at::equal(t, states[s][j++])) << groups[g].names[i] << " state '" << key << "'";
    }
  EXPECT_EQ(opt.step_count(), 1);
  opt.set_skip_factor(at::ones({}, at::kFloat));
  fill_grads({&opt}, 2);
  opt.step();
  const auto after = snapshot_params(opt);
  for (size_t j = 0; j < after.size(); ++j) EXPECT_FALSE(at::equal(after[j], params[j])) << "parameter " << j;
  EXPECT_EQ(opt.step_count(), 2);
}

// Groups the kernels do not take keep the reference path: fp64 parameters give the same
// result with and without kernels=off (NS in fp32, which the product kernels do not
// take either).
TEST_F(GpuFused, Fp64GroupsKeepTheReferencePath) {
  const std::vector<Spec> specs = {
      {Algorithm::Muon, {{32, 48}}, {at::kDouble}, {}},
      {Algorithm::AdamW, {vec(64)}, {at::kDouble}, {}},
      {Algorithm::Lion, {vec(64)}, {at::kDouble}, {}},
  };
  Optimizer a(make_groups(specs, 24, /*fp32_ns=*/true));
  Optimizer b(make_groups(specs, 24, /*fp32_ns=*/true));
  for (int t = 0; t < 3; ++t) {
    fill_grads({&a, &b}, t);
    a.step();
    KernelsOff off;
    b.step();
  }
  EXPECT_EQ(first_mismatch(a, b), "");
}

// The two bank kernels against the optimizer's own ATen reference on the same device, on random
// inputs. NorMuon's factors (orthopt_normuon_factors) sum in another order than ATen's
// reductions: the bound 2(2·cols + rows + 20)·2^-24 relative is the one kernel_check justifies
// for the fp32 sums (the row's squares, the two sums over rows); measured differences are far
// smaller. Dion3's take kernel copies and does one fp32 product per element: bit for bit.
TEST_F(GpuFused, NormuonFactorsMatchTheReferenceFormula) {
  namespace od = orthopt::optim_detail;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(7);
  const double beta2 = 0.95, eps = 1e-8;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const int64_t B = 5, rows = 192, cols = 768, total_rows = 300;
    const double bound = 2.0 * (2 * cols + rows + 20) / 16777216.0;
    const at::Tensor U = (at::randn({B, rows, cols}, cuda) * 0.05).to(dt);
    // Every row's variance (NorMuon's bank).
    const at::Tensor V0 = at::rand({B, rows, 1}, cuda) * 1e-3;
    at::Tensor V = V0.clone();
    const at::Tensor f = orthopt::cuda::normuon_factors(U, V, {}, beta2, eps, at::Tensor());
    auto [f_ref, V_ref] = od::normuon_row_factors(U, V0, beta2, eps);
    EXPECT_LT(((f - f_ref).abs() / f_ref).max().item<double>(), bound) << dt;
    EXPECT_LT(((V - V_ref).abs() / V_ref).max().item<double>(), bound) << dt;
    // Selected rows' variances (Dion3): rows 0..total_rows of each matrix's bank, k = rows taken.
    const at::Tensor Vb0 = at::rand({B, total_rows, 1}, cuda) * 1e-3;
    at::Tensor Vb = Vb0.clone();
    std::vector<at::Tensor> per_matrix;
    for (int64_t b = 0; b < B; ++b) per_matrix.push_back(at::randperm(total_rows, cuda.dtype(at::kLong)).narrow(0, 0, rows));
    const at::Tensor picked = at::stack(per_matrix, 0);
    const at::Tensor flat = od::flat_rows(picked, total_rows);
    const at::Tensor fs = orthopt::cuda::normuon_factors(U, Vb, flat, beta2, eps, at::Tensor());
    const at::Tensor V_sel = od::take_rows(Vb0, flat).view({B, rows, 1});
    auto [fs_ref, V_sel_ref] = od::normuon_row_factors(U, V_sel, beta2, eps);
    at::Tensor Vb_ref = Vb0.clone();
    od::put_rows_(Vb_ref, flat, V_sel_ref);
    EXPECT_LT(((fs - fs_ref).abs() / fs_ref).max().item<double>(), bound) << dt;
    EXPECT_LT(((Vb - Vb_ref).abs() / Vb_ref).max().item<double>(), bound) << dt;  // untouched rows: 0
    // Skipped step: the variances keep their bits, the factors are still computed.
    at::Tensor Vs = Vb0.clone();
    const at::Tensor fk = orthopt::cuda::normuon_factors(U, Vs, flat, beta2, eps, at::zeros({}, cuda.dtype(at::kBool)));
    EXPECT_TRUE(at::equal(Vs, Vb0)) << dt;
    EXPECT_TRUE(at::equal(fk, fs)) << dt;
  }
}

TEST_F(GpuFused, Dion3TakeRowsMatchesTheReferenceBitForBit) {
  namespace od = orthopt::optim_detail;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(11);
  const double mu = 0.95;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    for (int64_t cols : {768, 7}) {
      const int64_t B = 4, rows = 96, k = 24;
      const at::Tensor M0 = at::randn({B, rows, cols}, cuda).to(dt);
      const at::Tensor scores = at::rand({B, rows}, cuda);
      const at::Tensor picked = od::dion3_top_rows(scores, static_cast<double>(k) / rows);
      ASSERT_EQ(picked.size(1), k);
      at::Tensor M = M0.clone();
      const auto took = orthopt::cuda::dion3_take_rows(M, picked, mu, at::Tensor());
      const at::Tensor flat = od::flat_rows(picked, rows);
      at::Tensor M_ref = M0.clone();
      const at::Tensor sel_ref = od::take_rows(M_ref, flat).view({B, k, cols});
      od::put_rows_(M_ref, flat, sel_ref * mu);
      EXPECT_TRUE(at::equal(took.selected, sel_ref)) << dt << " cols " << cols;
      EXPECT_TRUE(at::equal(took.flat, flat)) << dt << " cols " << cols;
      EXPECT_TRUE(at::equal(M, M_ref)) << dt << " cols " << cols;
      const at::Tensor map_ref = at::full({B * rows}, -1, cuda.dtype(at::kInt))
                                     .index_copy_(0, flat, at::arange(B * k, cuda.dtype(at::kInt)));
      EXPECT_TRUE(at::equal(took.row_map, map_ref)) << dt << " cols " << cols;
      // Skipped: M keeps its bits; the selection, the indices and the map are written.
      at::Tensor Ms = M0.clone();
      const auto skipped = orthopt::cuda::dion3_take_rows(Ms, picked, mu, at::zeros({}, cuda.dtype(at::kBool)));
      EXPECT_TRUE(at::equal(Ms, M0)) << dt << " cols " << cols;
      EXPECT_TRUE(at::equal(skipped.selected, sel_ref)) << dt << " cols " << cols;
    }
  }
  const at::Tensor M = at::ones({2, 8, 4}, cuda);
  std::string err = error_of([&] { orthopt::cuda::dion3_take_rows(M, at::zeros({2, 3}, cuda.dtype(at::kInt)), 0.9, {}); });
  EXPECT_NE(err.find("'rows_idx'"), std::string::npos) << err;
  err = error_of([&] { orthopt::cuda::normuon_factors(M, at::ones({5}, cuda), {}, 0.95, 1e-8, {}); });
  EXPECT_NE(err.find("'variance'"), std::string::npos) << err;
}

// The Householder panel kernel (orthopt_householder_panel) against its ATen reference
// (householder_panel_reference, the same formulas one column at a time in fp32 with fp64
// norms): Gaussian panels (well conditioned), several widths (power of two or not), heights
// one CTA holds and clusters of 2 to 8 CTAs, a strided view of a wider batch as the blocked QR
// passes it, a zero column, and columns scaled 1e±30 (V does not change under column scaling).
// The two differ in summation order only: V's entries are <= 1 and each is a few dozen fp32
// operations from the input, so 1e-5 is ≈ 100 ulps of slack, while a wrong reflector or row
// gives O(1).
TEST_F(GpuFused, HouseholderPanelMatchesReference) {
  namespace od = orthopt::optim_detail;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(12);
  for (const auto& [B, L, b, lead] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {3, 2048, 16, 16}, {2, 5632, 8, 8}, {4, 768, 32, 40}, {3, 300, 5, 64}, {2, 9, 9, 9}, {2, 6400, 1, 3},
           {3, 2048, 32, 32}, {2, 5632, 32, 36}, {1, 8192, 32, 32}, {2, 3000, 13, 16}}) {
    ASSERT_GE(orthopt::cuda::householder_panel_max_rows(b, at::Device(at::kCUDA, 0)), L) << L << "x" << b;
    const at::Tensor wide = at::randn({B, L, lead}, cuda);
    at::Tensor A = wide.narrow(2, lead - b, b);  // rows of unit column stride, ld = lead
    if (b > 3) A.select(2, 2).zero_();           // a zero column below the others
    if (L == 5632 && b == 32) {                  // columns 60 orders of magnitude apart
      A.select(2, 0).mul_(1e30);
      A.select(2, 1).mul_(1e-30);
    }
    const at::Tensor V = orthopt::cuda::householder_panel(A);
    const at::Tensor V_ref = od::householder_panel_reference(A);
    const double diff = (V - V_ref).abs().max().item<double>();
    std::printf("[ householder panel %lldx%lldx%lld ] max |V - V_ref| = %.3g\n", (long long)B, (long long)L,
                (long long)b, diff);
    EXPECT_LT(diff, 1e-5) << L << "x" << b;
    EXPECT_TRUE(at::isfinite(V).all().item<bool>());
    EXPECT_TRUE(at::equal(V, orthopt::cuda::householder_panel(A))) << "deterministic";
  }
  const at::Tensor too_tall = at::randn({1, orthopt::cuda::householder_panel_max_rows(32, at::Device(at::kCUDA, 0)) + 1, 32}, cuda);
  std::string err = error_of([&] { orthopt::cuda::householder_panel(too_tall); });
  EXPECT_NE(err.find("registers"), std::string::npos) << err;
  err = error_of([&] { orthopt::cuda::householder_panel(at::randn({1, 40, 33}, cuda)); });
  EXPECT_NE(err.find("'cols'"), std::string::npos) << err;
  err = error_of([&] { orthopt::cuda::householder_panel(at::randn({1, 40, 8}, cuda).transpose(1, 2)); });
  EXPECT_NE(err.find("'A'"), std::string::npos) << err;
}

// The T-factor kernel (orthopt_householder_t_factor) through its glue, against its ATen
// reference (householder_t_factor_reference: a triangular solve) on the Gram matrices of the
// panel kernel's own reflectors, written into a block of a wider T as the blocked QR does (the
// rest of T keeps its bytes). T's entries are O(1) (near-orthogonal reflectors, U's diagonal
// >= 1/2); the two differ in rounding only (fp64 sums against cuBLAS's fp32 trsm): 1e-5 is
// ≈ 100 ulps, a wrong entry is O(0.1).
TEST_F(GpuFused, HouseholderTFactorMatchesReference) {
  namespace od = orthopt::optim_detail;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(13);
  for (const auto& [B, L, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {12, 768, 32}, {88, 2048, 16}, {5, 300, 7}, {3, 40, 1}}) {
    const at::Tensor V = orthopt::cuda::householder_panel(at::randn({B, L, n}, cuda));
    const at::Tensor G = at::bmm(V.transpose(1, 2), V);
    at::Tensor wide = at::full({B, n + 3, n + 5}, 7.0, cuda);
    at::Tensor T = wide.narrow(1, 1, n).narrow(2, 2, n);
    orthopt::cuda::householder_t_factor_into(G, T);
    const at::Tensor T_ref = od::householder_t_factor_reference(G);
    const double diff = (T - T_ref).abs().max().item<double>();
    std::printf("[ householder T factor %lldx%lld from %lld rows ] max |T - T_ref| = %.3g\n", (long long)B,
                (long long)n, (long long)L, diff);
    EXPECT_LT(diff, 1e-5) << L << "x" << n;
    at::Tensor outside = wide.clone();
    outside.narrow(1, 1, n).narrow(2, 2, n).fill_(7.0);
    EXPECT_TRUE(at::equal(outside, at::full_like(wide, 7.0))) << "T's block only";
  }
  at::Tensor T = at::empty({1, 33, 33}, cuda);
  std::string err = error_of([&] { orthopt::cuda::householder_t_factor_into(at::eye(33, cuda).unsqueeze(0), T); });
  EXPECT_NE(err.find("'G'"), std::string::npos) << err;
}

// Dion's QR on the GPU (householder_q: the blocked QR with the panel kernel) on Dion's shapes
// (Llama's P = M·Q: 2048×512 and 5632×512; GPT-2's 768×192), against float64: Q orthogonal to a
// small multiple of ε·m (Householder's bound, whatever the condition), P in Q's span to a few
// ε·√m, and Q within 100·ε·cond of LAPACK's fp32 Q (a perturbation of relative size ε moves Q
// by up to cond times that; Gaussian P: cond ≈ (√m + √r)/(√m − √r), 2–8 for the tall shapes,
// hundreds for the square one). Column signs are aligned first: the reflectors are LAPACK's
// except where a column has nothing below its diagonal (the last one of a square P), which LAPACK
// leaves as it is (τ = 0) and ours flips (τ = 2, see orthopt_householder_panel). Dion's step
// does not depend on the signs of P's columns.
TEST_F(GpuFused, BlockedHouseholderQrMatchesFloat64) {
  namespace od = orthopt::optim_detail;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const double eps32 = 5.96e-8;
  at::manual_seed(13);
  for (const auto& [B, m, r] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {3, 2048, 512}, {2, 5632, 512}, {4, 768, 192}, {2, 100, 100}, {2, 1000, 600}}) {
    const at::Tensor P = at::randn({B, m, r}, cuda);
    const at::Tensor Q = od::householder_q(P);
    ASSERT_EQ(Q.sizes(), P.sizes());
    const at::Tensor Qd = Q.to(at::kDouble), Pd = P.to(at::kDouble);
    const double orth =
        (at::matmul(Qd.transpose(1, 2), Qd) - at::eye(r, Qd.options())).abs().max().item<double>();
    const at::Tensor resid = Pd - at::matmul(Qd, at::matmul(Qd.transpose(1, 2), Pd));
    const double span = (resid.flatten(1).norm(2, {1}) / Pd.flatten(1).norm(2, {1})).max().item<double>();
    const at::Tensor lapack = std::get<0>(at::linalg_qr(P.cpu(), "reduced")).to(at::kDouble);
    const at::Tensor signs = (Qd.cpu() * lapack).sum(1, /*keepdim=*/true).sign();
    const double vs_lapack = (Qd.cpu() - lapack * signs).abs().max().item<double>();
    const at::Tensor sv = at::linalg_svdvals(Pd.cpu());
    const double cond = (sv.select(1, 0) / sv.select(1, r - 1)).max().item<double>();
    std::printf("[ householder_q %lldx%lldx%lld ] max |QtQ - I| %.3g, span residual %.3g, max |Q - Q_lapack| %.3g "
                "(cond %.3g)\n",
                (long long)B, (long long)m, (long long)r, orth, span, vs_lapack, cond);
    EXPECT_LT(orth, 3 * eps32 * m);
    EXPECT_LT(span, 20 * eps32 * std::sqrt(double(m)));
    EXPECT_LT(vs_lapack, 100 * eps32 * cond);
    EXPECT_TRUE(at::equal(Q, od::householder_q(P))) << "deterministic";
  }
}

// orthopt_momentum_ns_input against the two-pass form it replaces, bit for bit: momentum_rows
// into an fp32 stack with the rows' sums of squares, norms_from_row_sumsq, scale_cast. Random
// momenta and gradients (fp32, and bf16 state; fp32, bf16 and fp16 gradients, some starting one
// element past an aligned address, which a kernel with vector loads must handle), outputs
// poisoned with NaN first; shapes of one round and of several (4 × 2048², 16.8 M elements, more
// than an H100's 132 blocks hold at once; GPT-2's 12 × 768×3072 bank), a launch split in two
// (130 matrices, more than one launch's pointer table), bf16 and fp16 inputs, Nesterov and not,
// the skipped step (momenta unchanged, zeros written). Overflow: the gradients of every other
// matrix times 1e20, finite, but their squares' fp32 sum is +Inf; both forms then scale by a
// power of two first (the reference's pow2_scale), and still give the same bits (the two-pass
// norm is that power of two times the one-pass kernel's norm of the scaled input, both summed
// in one order; eps/p and the scaled entries are far from subnormal here), instead of zeros.
// Such matrices next to normal ones, in one round and over several, and in rounds where a
// block holds rows of several matrices (130 × 64 rows).
TEST_F(GpuFused, MomentumNsInputBitIdenticalToTwoPasses) {
  namespace oc = orthopt::cuda;
  struct Case {
    int64_t batch, rows, cols;
    at::ScalarType state, out;
    bool nesterov;
    at::ScalarType grad;
    bool offset_grad;       // the gradients one element past an aligned address
    double overflow = 1.0;  // the factor of the even matrices' gradients
  };
  const std::vector<Case> cases = {{3, 768, 768, at::kFloat, at::kBFloat16, true, at::kFloat, false},
                                   {5, 256, 1024, at::kFloat, at::kHalf, true, at::kBFloat16, false},
                                   {2, 1024, 256, at::kFloat, at::kHalf, false, at::kHalf, true},
                                   {4, 2048, 2048, at::kFloat, at::kBFloat16, true, at::kFloat, true},
                                   {12, 768, 3072, at::kFloat, at::kHalf, false, at::kFloat, false},
                                   {130, 64, 96, at::kBFloat16, at::kHalf, true, at::kBFloat16, false},
                                   {1, 37, 12, at::kFloat, at::kBFloat16, true, at::kFloat, true},
                                   {3, 768, 768, at::kFloat, at::kBFloat16, true, at::kFloat, false, 1e20},
                                   {4, 2048, 2048, at::kFloat, at::kHalf, false, at::kBFloat16, true, 1e20},
                                   {130, 64, 96, at::kBFloat16, at::kHalf, true, at::kBFloat16, false, 1e20}};
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const double mu = 0.95, grad_weight = 0.05, safety = 1.02, eps = 1e-6;
  auto gen = at::detail::createCPUGenerator(77);
  for (const Case& c : cases) {
    const std::string label = std::to_string(c.batch) + "x" + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                              " grad " + c10::toString(c.grad) + (c.offset_grad ? " (offset)" : "") +
                              (c.overflow != 1.0 ? " (overflow)" : "");
    ASSERT_TRUE(oc::momentum_ns_input_handles(at::Device(at::kCUDA, 0), c.rows, c.cols)) << label;
    const at::Tensor M0 = at::randn({c.batch, c.rows, c.cols}, gen).to(c.state).cuda();
    const int64_t numel = c.batch * c.rows * c.cols, offset = c.offset_grad ? 1 : 0;
    const at::Tensor G_host = at::randn({numel + offset}, gen).mul_(3.0);
    if (c.overflow != 1.0)  // in place, through the view; finite in fp32 and bf16
      G_host.narrow(0, offset, numel).view({c.batch, c.rows, c.cols}).slice(0, 0, c.batch, 2).mul_(c.overflow);
    const at::Tensor G = G_host.to(c.grad).cuda().narrow(0, offset, numel).view({c.batch, c.rows, c.cols});
    for (const bool skip : {false, true}) {
      const at::Tensor keep = at::full({}, !skip, cuda.dtype(at::kBool));
      // The two-pass form.
      const at::Tensor M_ref = M0.clone(), stack = at::empty({c.batch, c.rows, c.cols}, cuda);
      const at::Tensor row_sq = at::empty({c.batch, c.rows}, cuda);
      std::vector<at::Tensor> Ms, Gs, outs, stats;
      for (int64_t b = 0; b < c.batch; ++b) {
        Ms.push_back(M_ref[b]);
        Gs.push_back(G[b]);
        outs.push_back(stack[b]);
        stats.push_back(row_sq[b]);
      }
      oc::momentum_rows(Ms, Gs, outs, stats, c.cols, mu, grad_weight, c.nesterov, oc::RowStat::SumSqOfOutput, keep);
      const at::Tensor norms = oc::norms_from_row_sumsq(row_sq, stack);
      const at::Tensor want = oc::scale_cast(stack, norms, safety, eps, c.out, /*transpose=*/false);
      // One pass.
      const at::Tensor M_one = M0.clone();
      const at::Tensor got = at::full({c.batch, c.rows, c.cols}, NAN, cuda.dtype(c.out));
      std::vector<at::Tensor> Ms1;
      for (int64_t b = 0; b < c.batch; ++b) Ms1.push_back(M_one[b]);
      oc::momentum_ns_input(Ms1, Gs, got, mu, grad_weight, c.nesterov, safety, eps, keep);
      EXPECT_TRUE(at::equal(M_one, M_ref)) << label << (skip ? " skipped" : "") << ": momentum";
      if (skip) {
        EXPECT_TRUE(at::equal(M_one, M0)) << label << ": a skipped step wrote the momentum";
        EXPECT_TRUE(at::equal(got, at::zeros_like(got))) << label << ": a skipped step writes zeros";
        continue;
      }
      ASSERT_TRUE(at::isfinite(got).all().item<bool>()) << label << ": an output left unwritten (NaN poison)";
      if (c.overflow != 1.0) {
        const at::Tensor sums = row_sq.sum(1);  // fp32: the plain sums of the scaled matrices overflow
        EXPECT_TRUE(at::isinf(sums.slice(0, 0, c.batch, 2)).all().item<bool>()) << label << ": no overflow to test";
        EXPECT_TRUE(at::isfinite(norms).all().item<bool>()) << label << ": " << norms;
        EXPECT_TRUE((got.abs().amax(at::IntArrayRef{1, 2}) > 0).all().item<bool>()) << label << ": a zero input";
      }
      EXPECT_TRUE(at::equal(got, want)) << label << ": NS input differs from the two-pass form, max "
                                        << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
      // And the input is what its definition says, within the 16-bit rounding: U / (‖U‖·s + eps).
      const at::Tensor U = stack.to(at::kDouble);
      const at::Tensor n64 = at::linalg_vector_norm(U, 2, at::IntArrayRef{1, 2}, true);
      const at::Tensor x64 = U / (n64 * safety + eps);
      const double ulp = c.out == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      EXPECT_LE((got.to(at::kDouble) - x64).abs().max().item<double>(), ulp * x64.abs().max().item<double>())
          << label;
    }
  }
}

// Muon and NorMuon steps with the one-pass input (default) and with the two-pass form
// (fused_ns_input=off) stay bit-identical over several steps: banks it takes (square,
// wide and 3-D stacks, tall banks Gram NS takes in their own layout, a bank of several rounds)
// next to banks it does not (tall ones NS transposes; rows of 90 elements, not a multiple of 4).
TEST_F(GpuFused, OnePassNsInputStepBitIdenticalToTwoPasses) {
  std::vector<Spec> specs;
  specs.push_back({Algorithm::Muon,
                   {{768, 768}, {768, 768}, {3, 256, 1024}, {1024, 256}, {1024, 256}, {1536, 1280}, {60, 90},
                    {3, 2048, 2048}},
                   {},
                   [](GroupOptions& o) { o.nesterov = true; }});
  specs.push_back({Algorithm::Muon, {{512, 512}, {256, 768}}, {}, [](GroupOptions& o) {
                     o.nesterov = false;
                     o.momentum_style = orthopt::MomentumStyle::Ema;
                     o.cautious_weight_decay = true;
                   }});
  specs.push_back({Algorithm::NorMuon, {{256, 512}, {2, 256, 512}, {512, 128}}, {}, nullptr});
  Optimizer one(make_groups(specs, 31, false));
  Optimizer two(make_groups(specs, 31, false));
  // The two-pass input is never folded: compare the inputs alone.
  set_execution(one, &ExecutionOptions::fold_update, Toggle::Off);
  set_execution(two, &ExecutionOptions::fold_update, Toggle::Off);
  set_execution(two, &ExecutionOptions::fused_ns_input, Toggle::Off);
  for (int t = 0; t < 4; ++t) {
    fill_grads({&one, &two}, 300 + t);
    one.step();
    two.step();
    const std::string diff = first_mismatch(one, two);
    ASSERT_EQ(diff, "") << "step " << t << ": one-pass and two-pass NS inputs differ at " << diff;
  }
}

// Muon on gradients times 1e20: finite, but the fp32 sums of the NS inputs' squares overflow
// (before, every such input was scaled to zeros: no update). The fused step, with the one-pass
// input (fused_ns_input=on), with the two-pass form (off), and with fp32 NS (always the
// two-pass form), against the reference path, which divides by a power of two first
// (pow2_scale), within the neighbouring tests' bounds: 0.1 of the movement with the default NS
// dtypes (NS noise), 1e-4 with fp32 NS. Banks wide, square, tall and a 3-D stack, bf16
// parameters, and split_sizes (the scaled cast's own norms, kernel_path_norms). No weight
// decay, so a parameter whose update is zero stays bit for bit as it was: each must move, in
// both runs.
TEST_F(GpuFused, MuonStepWithOverflowingSquaresMatchesReference) {
  std::vector<Spec> specs;
  specs.push_back({Algorithm::Muon, {{128, 384}, {2, 128, 384}, {96, 96}, {1024, 256}, {300, 200}}, {},
                   [](GroupOptions& o) {
                     o.nesterov = true;
                     o.weight_decay = 0.0;
                   }});
  specs.push_back({Algorithm::Muon, {{48, 80}, {48, 80}}, {at::kBFloat16, at::kBFloat16}, [](GroupOptions& o) {
                     o.momentum_style = orthopt::MomentumStyle::Ema;
                     o.weight_decay = 0.0;
                   }});
  specs.push_back({Algorithm::Muon, {{96, 64}}, {}, [](GroupOptions& o) {
                     o.ortho.split_sizes = {32, 32, 32};
                     o.weight_decay = 0.0;
                   }});
  struct Run {
    bool fp32_ns;
    Toggle fused_ns_input;
    double ns_rel;
    const char* label;
  };
  for (const Run r : {Run{false, Toggle::On, 0.1, "one-pass NS input"},
                      Run{false, Toggle::Off, 0.1, "two-pass NS input"}, Run{true, Toggle::Auto, 1e-4, "fp32 NS"}}) {
    Optimizer fused(make_groups(specs, 51, r.fp32_ns));
    Optimizer reference(make_groups(specs, 51, r.fp32_ns));
    set_execution(fused, &ExecutionOptions::fused_ns_input, r.fused_ns_input);
    const auto start = snapshot_params(reference);
    double worst = 0.0;
    std::string where;
    for (int t = 0; t < 3; ++t) {
      fill_grads({&fused, &reference}, 500 + t);
      for (Optimizer* o : {&fused, &reference})
        for (const auto& g : o->param_groups())
          for (const auto& p : g.params) p.grad().mul_(1e20);  // finite: |g| ≲ 5e20
      fused.step();
      {
        KernelsOff off;
        reference.step();
      }
      std::string w;
      const double ratio = worst_ratio(fused, reference, start, r.ns_rel, &w);
      if (ratio > worst) {
        worst = ratio;
        where = w + " at step " + std::to_string(t);
      }
    }
    std::printf("[ overflowing squares, fused vs reference, %s ] worst difference / bound = %.3g%s%s\n", r.label, worst,
                where.empty() ? "" : " at ", where.c_str());
    EXPECT_LE(worst, 1.0) << r.label << ": worst at " << where;
    const auto now = snapshot_params(fused), now_ref = snapshot_params(reference);
    for (size_t k = 0; k < now.size(); ++k) {
      EXPECT_FALSE(at::equal(now[k], start[k])) << r.label << ": parameter " << k << " not updated";
      EXPECT_FALSE(at::equal(now_ref[k], start[k])) << r.label << ": parameter " << k << " not updated (reference)";
    }
  }
}

// orthopt_gemm_update against a float64 reference: W ← (1 − lr·wd)·W − lr·factor·(A·X) for
// plain and transposed operands (the layouts mm_update passes), more matrices than one setup
// chunk (128), weights that are slices of one 3-D tensor; outputs are the weights themselves,
// random, never zero. Bound: the fp32 accumulation over k bf16 products (≤ k·2⁻²⁴ of Σ|a·x|, far
// below 1e-4 of the product's size) plus a few fp32 roundings of W (4·2⁻²⁴·|W|). Where a matrix
// address is not a multiple of 256 bytes (X slices of 1920 or 2880 bytes, 33×35 weights) the
// product runs in bf16/fp16 with the update pass after it instead (orthopt_gemm_update_aligned),
// so the product's rounding, 2⁻⁹ of it in bf16, takes the 1e-4's place: 2⁻⁸. A skipped step
// (keep false) leaves W bit-identical.
TEST_F(GpuFused, UpdateByProductMatchesFloat64) {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  auto gen = at::detail::createCPUGenerator(77);
  struct Case {
    int64_t batch, m, k, n;
    bool a_t, x_t;
    bool folded;  // false: an address off 256 bytes, the two-pass form
  };
  for (const Case c : {Case{3, 96, 128, 160, false, false, true}, Case{2, 200, 64, 64, true, true, true},
                       Case{130, 16, 24, 40, false, false, false}, Case{4, 64, 96, 48, false, true, true},
                       Case{3, 24, 40, 36, false, false, false}, Case{2, 33, 24, 35, false, false, false},
                       Case{2, 33, 24, 35, true, true, false}, Case{140, 16, 32, 64, false, false, true}}) {
    for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
      const std::string label = "batch " + std::to_string(c.batch) + " m " + std::to_string(c.m) + " k " +
                                std::to_string(c.k) + " n " + std::to_string(c.n) + (c.a_t ? " Aᵀ" : "") +
                                (c.x_t ? " Xᵀ" : "") + (dt == at::kHalf ? " fp16" : " bf16");
      const at::Tensor A = c.a_t ? at::randn({c.batch, c.k, c.m}, gen).to(dt).cuda().transpose(1, 2)
                                 : at::randn({c.batch, c.m, c.k}, gen).to(dt).cuda();
      const at::Tensor X = c.x_t ? at::randn({c.batch, c.n, c.k}, gen).to(dt).cuda().transpose(1, 2)
                                 : at::randn({c.batch, c.k, c.n}, gen).to(dt).cuda();
      const at::Tensor W = at::randn({c.batch, c.m, c.n}, gen).cuda();
      const at::Tensor W0 = W.clone();
      std::vector<at::Tensor> weights;
      for (int64_t b = 0; b < c.batch; ++b) weights.push_back(W[b]);
      const double lr = 0.0173, factor = 1.37, wd = 0.1;
      const at::Tensor lr_t = at::full({}, lr, cuda.dtype(at::kDouble));
      orthopt::cuda::update_by_product(A, X, weights, factor, lr_t, wd, at::ones({}, cuda.dtype(at::kBool)));
      const at::Tensor P = at::bmm(A.to(at::kDouble), X.to(at::kDouble));
      const at::Tensor ref = (1.0 - lr * wd) * W0.to(at::kDouble) - lr * factor * P;
      const at::Tensor err = (W.to(at::kDouble) - ref).abs();
      const double product_rel = c.folded ? 1e-4 : std::ldexp(1.0, -8);
      const at::Tensor bound = 4.0 * std::ldexp(1.0, -24) * ref.abs() + product_rel * lr * factor * P.abs().max();
      EXPECT_TRUE((err <= bound).all().item<bool>())
          << label << ": worst error / bound " << (err / bound).max().item<double>();
      const at::Tensor before = W.clone();
      orthopt::cuda::update_by_product(A, X, weights, factor, lr_t, wd, at::zeros({}, cuda.dtype(at::kBool)));
      EXPECT_TRUE(at::equal(W, before)) << label << ": a skipped step changed the weights";
    }
  }
  // Argument errors name the argument and write nothing.
  const at::Tensor A = at::randn({2, 8, 8}, cuda).to(at::kBFloat16), W = at::randn({2, 8, 8}, cuda);
  const at::Tensor lr_t = at::full({}, 0.1, cuda.dtype(at::kDouble)), W0 = W.clone();
  EXPECT_NE(error_of([&] { orthopt::cuda::update_by_product(A, A, {W[0]}, 1.0, lr_t, 0.0, at::Tensor()); })
                .find("argument 'weights'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              orthopt::cuda::update_by_product(A, A, {W[0], W[1].to(at::kBFloat16)}, 1.0, lr_t, 0.0, at::Tensor());
            }).find("argument 'weights' [1]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { orthopt::cuda::update_by_product(A, A.to(at::kHalf), {W[0], W[1]}, 1.0, lr_t, 0.0, {}); })
                .find("arguments 'A', 'X'"),
            std::string::npos);
  EXPECT_TRUE(at::equal(W, W0));
}

// Muon with its update folded into the last NS product (default) against the same steps with
// fold_update=off (the direction written in bf16 and read back by the update kernel):
// momenta bit-identical (1e-5 bound), parameters within 2⁻⁶ of their movement (the unfolded run
// rounds each step's direction to bf16, 2⁻⁹ relative, over 4 applied steps; a wrong factor,
// decay or layout gives O(1)), and not bit-identical: the fold was taken. Step 2 is skipped
// with NaN gradients: both runs keep their parameters bit for bit (the fold's α = 0, β = 1 on a
// finite product). `two_pass`: the NS input from momentum_rows and the scaled cast
// (fused_ns_input=off, as for banks the one-pass kernel does not fit, e.g. Llama's
// 2048×5632), whose stack a skipped step fills with zeros.
void check_folded_against_unfolded(bool two_pass) {
  std::vector<Spec> specs;
  specs.push_back({Algorithm::Muon, {{768, 768}, {256, 1024}, {3, 256, 1024}, {1024, 256}, {2, 1024, 256}}, {},
                   [](GroupOptions& o) { o.nesterov = true; }});
  specs.push_back({Algorithm::Muon, {{512, 512}, {128, 640}}, {}, [](GroupOptions& o) {
                     o.lr_adjust = orthopt::LrAdjust::RmsNorm;
                     o.weight_decay = 0.1;
                   }});
  Optimizer folded(make_groups(specs, 41, false));
  Optimizer unfolded(make_groups(specs, 41, false));
  set_execution(unfolded, &ExecutionOptions::fold_update, Toggle::Off);
  if (two_pass)
    for (Optimizer* o : {&folded, &unfolded}) set_execution(*o, &ExecutionOptions::fused_ns_input, Toggle::Off);
  auto one = at::ones({}, at::kFloat), zero = at::zeros({}, at::kFloat);
  const auto start = snapshot_params(unfolded);
  const double lr_scales[] = {1.0, 0.6, 0.9, 0.9, 0.4};
  for (int t = 0; t < 5; ++t) {
    const bool skip = t == 2;
    const auto before = snapshot_params(folded), before_unfolded = snapshot_params(unfolded);
    for (Optimizer* o : {&folded, &unfolded}) {
      o->set_lr_scale(lr_scales[t]);
      o->set_skip_factor(skip ? zero : one);
    }
    fill_grads({&folded, &unfolded}, 400 + t, /*nan=*/skip);
    folded.step();
    unfolded.step();
    if (skip) {
      const auto after = snapshot_params(folded), after_unfolded = snapshot_params(unfolded);
      for (size_t k = 0; k < after.size(); ++k) {
        EXPECT_TRUE(at::equal(after[k], before[k])) << "folded, skipped step: parameter " << k << " changed";
        EXPECT_TRUE(at::equal(after_unfolded[k], before_unfolded[k])) << "unfolded, skipped step: parameter " << k;
      }
    }
  }
  std::string where;
  const double worst = worst_ratio(folded, unfolded, start, std::ldexp(1.0, -6), &where);
  std::printf("[ folded vs unfolded update%s ] worst difference / bound = %.3g at %s\n",
              two_pass ? ", two-pass NS input" : "", worst, where.c_str());
  EXPECT_LE(worst, 1.0) << "worst at " << where;
  const auto a = snapshot_params(folded), b = snapshot_params(unfolded);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_FALSE(at::equal(a[k], b[k])) << "parameter " << k << ": not folded";
}

TEST_F(GpuFused, FoldedUpdateMatchesUnfoldedUpToBf16Rounding) { check_folded_against_unfolded(false); }

TEST_F(GpuFused, FoldedUpdateOfTwoPassNsInputMatchesUnfolded) { check_folded_against_unfolded(true); }

TEST_F(GpuFused, PredicateAndArgumentErrors) {
  using orthopt::cuda::multi_tensor_handles;
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  EXPECT_TRUE(multi_tensor_handles(at::ones({4, 4}, cuda)));
  EXPECT_TRUE(multi_tensor_handles(at::ones({4, 4}, cuda.dtype(at::kBFloat16))));
  EXPECT_TRUE(multi_tensor_handles(at::ones({4, 4}, cuda.dtype(at::kHalf))));
  EXPECT_FALSE(multi_tensor_handles(at::ones({4, 4}, cuda.dtype(at::kDouble))));
  EXPECT_FALSE(multi_tensor_handles(at::ones({4, 4})));                    // CPU
  EXPECT_FALSE(multi_tensor_handles(at::ones({4, 6}, cuda).t()));           // not contiguous
  EXPECT_FALSE(multi_tensor_handles(at::ones({0}, cuda)));                  // empty
  {
    KernelsOff off;
    EXPECT_FALSE(multi_tensor_handles(at::ones({4, 4}, cuda)));
  }
  const at::Tensor W = at::ones({8}, cuda), D = at::ones({8}, cuda), lr = at::ones({}, cuda.dtype(at::kDouble));
  std::string err = error_of([&] { orthopt::cuda::update({W}, {D, D}, {}, {1.0}, lr, 0.0, false, at::Tensor()); });
  EXPECT_NE(err.find("'directions'"), std::string::npos) << err;
  err = error_of([&] { orthopt::cuda::update({W}, {D.cpu()}, {}, {1.0}, lr, 0.0, false, at::Tensor()); });
  EXPECT_NE(err.find("'directions' [0]"), std::string::npos) << err;
  err = error_of([&] { orthopt::cuda::update({W}, {at::ones({9}, cuda)}, {}, {1.0}, lr, 0.0, false, at::Tensor()); });
  EXPECT_NE(err.find("elements"), std::string::npos) << err;
  err = error_of([&] { orthopt::cuda::update({W}, {D}, {}, {1.0}, lr.to(at::kFloat), 0.0, false, at::Tensor()); });
  EXPECT_NE(err.find("'lr'"), std::string::npos) << err;
  const at::Tensor M = at::ones({4, 8}, cuda);
  err = error_of([&] { orthopt::cuda::momentum_ns_input({M}, {M}, at::empty({1, 4, 8}, cuda), 0.9, 1.0, true, 1.0, 1e-7, at::Tensor()); });
  EXPECT_NE(err.find("'out'"), std::string::npos) << err;  // fp32: not an NS input dtype
  err = error_of([&] {
    orthopt::cuda::momentum_ns_input({M, M}, {M, M}, at::empty({1, 4, 8}, cuda.dtype(at::kBFloat16)), 0.9, 1.0, true,
                                     1.0, 1e-7, at::Tensor());
  });
  EXPECT_NE(err.find("'momenta'"), std::string::npos) << err;
  EXPECT_FALSE(orthopt::cuda::momentum_ns_input_handles(at::Device(at::kCUDA, 0), 4, 90));  // rows of 90: not whole vectors
  EXPECT_FALSE(orthopt::cuda::momentum_ns_input_handles(at::Device(at::kCUDA, 0), 8192, 8192));  // beyond shared memory
  {
    KernelsOff off;
    EXPECT_FALSE(orthopt::cuda::momentum_ns_input_handles(at::Device(at::kCUDA, 0), 64, 64));
  }
}

}  // namespace

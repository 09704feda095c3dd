// Step guards (algorithms.md §9): spike guard statistics and decisions against a plain reference,
// injected spikes, level shifts, non-finite handling, the firewall, gradient clipping against a
// float64 reference, and bit-exact save/load.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <deque>
#include <limits>
#include <random>
#include <sstream>

#include "orthopt/train/guards.h"

using orthopt::train::NonFiniteAbort;
using orthopt::train::NonFiniteFirewall;
using orthopt::train::SpikeGuard;

namespace {

at::Tensor scalar(double v) { return at::tensor(v, at::kFloat).reshape({}); }
at::Tensor scalar64(double v) { return at::tensor(v, at::kDouble).reshape({}); }

// Plain reference: mean and population std of the values in a deque.
std::pair<double, double> mean_std(const std::deque<double>& xs) {
  if (xs.empty()) return {0.0, 0.0};
  double sum = 0;
  for (double x : xs) sum += x;
  const double mean = sum / xs.size();
  double ss = 0;
  for (double x : xs) ss += (x - mean) * (x - mean);
  return {mean, std::sqrt(ss / xs.size())};
}

float decide(SpikeGuard& g, double loss, double gnorm) {
  return g.observe(scalar64(loss), scalar64(gnorm)).item<float>();
}

}  // namespace

TEST(SpikeGuard, WindowStatisticsAndDecisionsMatchPlainReference) {
  // Small window and sigma factor 2 so decisions go both ways on random data.
  const int64_t W = 16;
  const double sf = 2.0;
  SpikeGuard guard(W, sf);
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::deque<double> losses, gnorms;
  int skips = 0, applies_active = 0;
  for (int i = 0; i < 200; ++i) {
    const double loss = 2.0 + u(rng) + (u(rng) < 0.1 ? 3.0 * u(rng) : 0.0);
    const double gnorm = 0.5 + u(rng) + (u(rng) < 0.1 ? 5.0 * u(rng) : 0.0);
    const auto [lm, ls] = mean_std(losses);
    const auto [gm, gs] = mean_std(gnorms);
    const auto st = guard.stats();
    // fp64 sums of <= 16 values of magnitude ~3: agreement to ~1e-15 relative; 1e-12 is generous.
    ASSERT_EQ(st.count, static_cast<int64_t>(losses.size()));
    ASSERT_NEAR(st.loss_mean, lm, 1e-12);
    ASSERT_NEAR(st.loss_std, ls, 1e-12);
    ASSERT_NEAR(st.gnorm_mean, gm, 1e-12);
    ASSERT_NEAR(st.gnorm_std, gs, 1e-12);
    const bool active = 2 * static_cast<int64_t>(losses.size()) >= W;
    const bool spike = active && (loss > lm + sf * ls || gnorm > gm + sf * gs);
    const float got = decide(guard, loss, gnorm);
    ASSERT_EQ(got, spike ? 0.0f : 1.0f) << "step " << i;
    skips += spike;
    applies_active += active && !spike;
    losses.push_back(loss);
    gnorms.push_back(gnorm);
    if (static_cast<int64_t>(losses.size()) > W) losses.pop_front(), gnorms.pop_front();
  }
  // The data really exercised both outcomes.
  EXPECT_GT(skips, 5);
  EXPECT_GT(applies_active, 50);
}

TEST(SpikeGuard, SkipsInjectedSpikeOnlyAfterHalfWindow) {
  SpikeGuard guard;  // window 128, 6 sigma
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, 0.01);
  for (int i = 0; i < 63; ++i) EXPECT_EQ(decide(guard, 3.0 + noise(rng), 1.0 + noise(rng)), 1.0f);
  // 63 values < half of 128: the guard is not active yet, even a huge spike is applied.
  EXPECT_EQ(decide(guard, 100.0, 1.0), 1.0f);
  EXPECT_EQ(guard.stats().count, 64);
  // The spike itself entered the window and inflated σ; feed more normal values.
  for (int i = 0; i < 128; ++i) decide(guard, 3.0 + noise(rng), 1.0 + noise(rng));
  EXPECT_EQ(decide(guard, 4.0, 1.0), 0.0f);   // loss spike (σ ≈ 0.01)
  EXPECT_EQ(decide(guard, 3.0, 50.0), 0.0f);  // grad-norm spike
  EXPECT_EQ(decide(guard, 3.0, 1.0), 1.0f);   // normal again
  EXPECT_EQ(guard.stats().count, 128);
}

TEST(SpikeGuard, LevelShiftIsAcceptedOnceItFillsTheWindow) {
  const int64_t W = 32;
  SpikeGuard guard(W, 6.0);
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0.0, 0.01);
  for (int i = 0; i < W; ++i) ASSERT_EQ(decide(guard, 1.0 + noise(rng), 1.0 + noise(rng)), 1.0f);
  // Loss jumps to a new level and stays there.
  EXPECT_EQ(decide(guard, 2.0 + noise(rng), 1.0 + noise(rng)), 0.0f);
  int last_skip = 0;
  for (int i = 1; i < 3 * W; ++i)
    if (decide(guard, 2.0 + noise(rng), 1.0 + noise(rng)) == 0.0f) last_skip = i;
  EXPECT_LT(last_skip, W);  // accepted at the latest once the window holds only the new level
  const auto st = guard.stats();
  EXPECT_NEAR(st.loss_mean, 2.0, 0.01);
}

TEST(SpikeGuard, NonFiniteValuesAreSkippedAndNeverEnterTheWindow) {
  SpikeGuard a(8, 3.0), b(8, 3.0);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(1.0, 2.0);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int i = 0; i < 30; ++i) {
    const double l = u(rng), g = u(rng);
    if (i % 7 == 3) {  // only `a` sees the non-finite observations, also before activation
      EXPECT_EQ(decide(a, nan, g), 0.0f);
      EXPECT_EQ(decide(a, l, inf), 0.0f);
      EXPECT_EQ(decide(a, -inf, nan), 0.0f);
    }
    ASSERT_EQ(decide(a, l, g), decide(b, l, g)) << i;
    const auto sa = a.stats(), sb = b.stats();
    // Bit-identical: the non-finite values changed nothing.
    ASSERT_EQ(sa.count, sb.count);
    ASSERT_EQ(sa.loss_mean, sb.loss_mean);
    ASSERT_EQ(sa.loss_std, sb.loss_std);
    ASSERT_EQ(sa.gnorm_mean, sb.gnorm_mean);
    ASSERT_EQ(sa.gnorm_std, sb.gnorm_std);
  }
}

TEST(SpikeGuard, DecisionIsADeviceScalarAndInputsMayBeFloat) {
  SpikeGuard guard(4, 6.0);
  const at::Tensor d = guard.observe(scalar(1.5), at::tensor({2.5}, at::kFloat));  // shape [1] is ok
  EXPECT_EQ(d.dim(), 0);
  EXPECT_EQ(d.scalar_type(), at::kFloat);
  EXPECT_EQ(d.device(), c10::Device(c10::kCPU));
  EXPECT_THROW(guard.observe(at::ones({2}), scalar(1.0)), c10::Error);
  EXPECT_THROW(SpikeGuard(1, 6.0), c10::Error);
  EXPECT_THROW(SpikeGuard(8, 0.0), c10::Error);
}

TEST(SpikeGuard, SaveLoadRoundTripIsBitExact) {
  SpikeGuard a(16, 2.5);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < 23; ++i) decide(a, 3.0 + u(rng), 1.0 + u(rng));  // wrapped ring buffer
  std::stringstream buf;
  {
    torch::serialize::OutputArchive out;
    a.save(out);
    out.save_to(buf);
  }
  SpikeGuard b(16, 2.5);
  {
    torch::serialize::InputArchive in;
    in.load_from(buf);
    b.load(in);
  }
  for (int i = 0; i < 40; ++i) {
    const double l = 3.0 + u(rng) * (i % 5 == 0 ? 4.0 : 1.0), g = 1.0 + u(rng);
    ASSERT_EQ(decide(a, l, g), decide(b, l, g)) << i;
    const auto sa = a.stats(), sb = b.stats();
    ASSERT_EQ(sa.loss_mean, sb.loss_mean);
    ASSERT_EQ(sa.loss_std, sb.loss_std);
    ASSERT_EQ(sa.gnorm_mean, sb.gnorm_mean);
    ASSERT_EQ(sa.gnorm_std, sb.gnorm_std);
    ASSERT_EQ(sa.count, sb.count);
  }
  // A guard configured differently refuses the state.
  buf.clear();
  buf.seekg(0);
  SpikeGuard other(32, 2.5);
  torch::serialize::InputArchive in;
  in.load_from(buf);
  EXPECT_THROW(other.load(in), c10::Error);
}

TEST(SpikeGuard, CudaGuardMatchesCpuGuard) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  SpikeGuard cpu(16, 2.0), gpu(16, 2.0, c10::Device(c10::kCUDA, 0));
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < 100; ++i) {
    const double l = 2.0 + u(rng) + (u(rng) < 0.1 ? 4.0 : 0.0), g = 1.0 + u(rng);
    const double bad = i % 17 == 5 ? std::numeric_limits<double>::quiet_NaN() : l;
    const at::Tensor d = gpu.observe(scalar(bad).cuda(), scalar(g).cuda());
    ASSERT_TRUE(d.is_cuda());
    // Inputs are fp32 on both sides, the windows fp64 with the same reduction order up to the
    // backend's summation tree: decisions must agree; statistics to fp64 rounding.
    ASSERT_EQ(d.item<float>(), cpu.observe(scalar(bad), scalar(g)).item<float>()) << i;
  }
  const auto sc = cpu.stats(), sg = gpu.stats();
  EXPECT_EQ(sc.count, sg.count);
  EXPECT_NEAR(sc.loss_mean, sg.loss_mean, 1e-12);
  EXPECT_NEAR(sc.gnorm_std, sg.gnorm_std, 1e-12);
}

TEST(SpikeGuard, SaveSnapshotsTheStateDespiteInPlaceUpdates) {
  // observe() updates its tensors in place (for graph capture); save() must still snapshot them.
  SpikeGuard guard(8, 6.0);
  std::stringstream before;
  torch::serialize::OutputArchive out;
  guard.save(out);
  const float first = decide(guard, 1.0, 1.0);
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(guard.stats().count, 1);
  out.save_to(before);
  torch::serialize::InputArchive in;
  in.load_from(before);
  guard.load(in);  // back to the empty state, through the same storage
  EXPECT_EQ(guard.stats().count, 0);
}

TEST(NonFiniteFirewall, CountsConsecutiveAndAborts) {
  NonFiniteFirewall fw(3);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(fw.check(scalar(2.0), scalar(1.0), 0));
  EXPECT_FALSE(fw.check(scalar(nan), scalar(1.0), 1));
  EXPECT_FALSE(fw.check(scalar(2.0), scalar(inf), 2));
  EXPECT_EQ(fw.consecutive(), 2);
  EXPECT_TRUE(fw.check(scalar(2.0), scalar(1.0), 3));  // a finite step resets the count
  EXPECT_EQ(fw.consecutive(), 0);
  EXPECT_FALSE(fw.check(scalar(-inf), scalar(1.0), 4));
  EXPECT_FALSE(fw.check(scalar(2.0), scalar(nan), 5));

  std::stringstream buf;  // round trip of the count mid-streak
  {
    torch::serialize::OutputArchive out;
    fw.save(out);
    out.save_to(buf);
  }
  NonFiniteFirewall restored(3);
  {
    torch::serialize::InputArchive in;
    in.load_from(buf);
    restored.load(in);
  }
  EXPECT_EQ(restored.consecutive(), 2);

  for (NonFiniteFirewall* f : {&fw, &restored}) {
    try {
      f->check(scalar(nan), scalar(nan), 6);
      ADD_FAILURE() << "expected NonFiniteAbort";
    } catch (const NonFiniteAbort& e) {
      EXPECT_EQ(e.step(), 6);
      EXPECT_EQ(e.consecutive(), 3);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("step 6"), std::string::npos) << msg;
      EXPECT_NE(msg.find("3 consecutive"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(NonFiniteFirewall(0), c10::Error);
}

// On `device`. On CUDA with torch >= 2.1, fp32 grads take the multi-tensor norm (and, when all
// grads are fp32, the multi-tensor scale), a bf16 grad the per-parameter path: with_bf16 picks.
static void check_norm_and_clip_against_float64(c10::Device device, bool with_bf16) {
  torch::manual_seed(3);
  // The last parameter is bf16 if with_bf16 (its grad is upcast inside the norm); param 3 has no
  // grad. A non-contiguous grad (param 2, transposed) is read as it lies.
  std::vector<at::Tensor> params = {torch::randn({7, 5}), torch::randn({13}), torch::randn({3, 4, 2}),
                                    torch::randn({6}), torch::randn({4, 4}).to(with_bf16 ? at::kBFloat16 : at::kFloat)};
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] = params[i].to(device);
    params[i].set_requires_grad(true);
    if (i == 3) continue;
    at::Tensor g = (torch::randn(params[i].sizes()) * (0.5 + i)).to(params[i].scalar_type()).to(device);
    if (i == 2) g = (torch::randn({3, 2, 4}) * (0.5 + i)).to(device).transpose(1, 2);
    params[i].mutable_grad() = g;
  }

  auto reference_norm = [&] {
    double ss = 0;
    for (const auto& p : params) {
      if (!p.grad().defined()) continue;
      const at::Tensor g = p.grad().to(at::kCPU, at::kDouble).contiguous();
      const double* d = g.data_ptr<double>();
      for (int64_t k = 0; k < g.numel(); ++k) ss += d[k] * d[k];
    }
    return std::sqrt(ss);
  };
  const double ref = reference_norm();
  const at::Tensor norm = orthopt::train::global_grad_norm(params);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_EQ(norm.scalar_type(), at::kFloat);
  // fp32 accumulation over ~100 values: relative error ~1e-7·sqrt(n); 1e-5 bounds it comfortably.
  EXPECT_NEAR(norm.item<double>(), ref, 1e-5 * ref);

  std::vector<at::Tensor> before;
  for (const auto& p : params) before.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());

  // max_norm above the norm, and max_norm <= 0: grads untouched bitwise, factor 1.
  for (double max_norm : {ref * 2.0, 0.0, -1.0}) {
    const at::Tensor f = orthopt::train::clip_grad_norm(params, max_norm, norm);
    EXPECT_EQ(f.item<float>(), 1.0f);
    for (size_t i = 0; i < params.size(); ++i)
      if (before[i].defined()) EXPECT_TRUE(params[i].grad().equal(before[i])) << i;
  }

  const double max_norm = ref / 4.0;
  const double scale = max_norm / (ref + 1e-6);
  const at::Tensor f = orthopt::train::clip_grad_norm(params, max_norm, norm);
  EXPECT_NEAR(f.item<double>(), scale, 1e-5 * scale);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!before[i].defined()) {
      EXPECT_FALSE(params[i].grad().defined());
      continue;
    }
    const at::Tensor expected = before[i].to(at::kDouble) * scale;
    // fp32 grads: one rounding of the product (1e-6 rel); bf16 grads: 8-bit mantissa, 2^-8 rel.
    const double rtol = params[i].grad().scalar_type() == at::kBFloat16 ? 8e-3 : 1e-5;
    EXPECT_TRUE(torch::allclose(params[i].grad().to(at::kDouble), expected, rtol, 1e-12)) << i;
  }
  // After clipping the global norm is max_norm.
  EXPECT_NEAR(orthopt::train::global_grad_norm(params).item<double>(), max_norm, 5e-3 * max_norm);

  // No grads at all: zero norm.
  std::vector<at::Tensor> none = {torch::randn({3}).to(device)};
  EXPECT_EQ(orthopt::train::global_grad_norm(none).item<float>(), 0.0f);
}

TEST(GradClip, NormAndClipMatchFloat64Reference) {
  check_norm_and_clip_against_float64(c10::kCPU, /*with_bf16=*/true);
  check_norm_and_clip_against_float64(c10::kCPU, /*with_bf16=*/false);
}

TEST(GradClip, NormAndClipMatchFloat64ReferenceOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_norm_and_clip_against_float64(c10::Device(c10::kCUDA, 0), /*with_bf16=*/true);
  check_norm_and_clip_against_float64(c10::Device(c10::kCUDA, 0), /*with_bf16=*/false);
}

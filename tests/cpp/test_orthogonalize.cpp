// Tests of the orthogonalization engine (algorithms.md §1).
//
// Every numerical check compares against `reference_ns` below: a plain float64 Newton–Schulz
// written from algorithms.md with its own normalization, its own coefficient tables and its own
// handling of tall inputs. It never calls the library.
//
// Inputs are built as U·diag(s)·Vᵀ with random orthonormal U, V and s log-spaced, so the
// singular values are known and spread (1e-3..1 unless a test says otherwise).

#include "test_util.h"
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "orthopt/orthogonalize.h"
#include "orthopt/schedules.h"
#include "ortho/orthogonalize_detail.h"

namespace {

using orthopt::NonFinitePolicy;
using orthopt::OrthoMethod;
using orthopt::OrthoOptions;
using Coeffs = std::array<double, 3>;

// ---------------------------------------------------------------------------------------------
// The independent reference.

struct RefSchedule {
  std::vector<Coeffs> triples;
  Coeffs tail;  // used for steps beyond the table
  double safety;
  double eps;
};

// Raw Polar Express paper triples t = 1..7 (algorithms.md §1 table), copied here on purpose.
const std::vector<Coeffs> kPaperRaw = {
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
    {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
    {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
};

Coeffs divide(const Coeffs& t, double d) { return {t[0] / d, t[1] / (d * d * d), t[2] / (d * d * d * d * d)}; }

RefSchedule ref_schedule(const std::string& name) {
  if (name == "jordan") {
    const Coeffs j = {3.4445, -4.7750, 2.0315};
    return {{j}, j, 1.0, 1e-7};
  }
  if (name == "you") {
    std::vector<Coeffs> t = {{4.0848, -6.8946, 2.9270},
                             {3.9505, -6.3029, 2.6377},
                             {3.7418, -5.5913, 2.3037},
                             {2.8769, -3.1427, 1.2046},
                             {2.8366, -3.0525, 1.2012}};
    return {t, t.back(), 1.0, 1e-7};
  }
  if (name == "polar_express") {
    std::vector<Coeffs> t = {{8.156554524902461, -22.48329292557795, 15.878769915207462},
                             {4.042929935166739, -2.808917465908714, 0.5000178451051316},
                             {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
                             {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
                             {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};
    return {t, t.back(), 1.02, 1e-6};
  }
  if (name == "polar_express_paper") {
    std::vector<Coeffs> t;
    for (const auto& raw : kPaperRaw) t.push_back(divide(raw, 1.01));
    return {t, {1.875, -1.25, 0.375}, 1.01, 1e-7};  // the tail is undivided
  }
  if (name == "gram") {
    std::vector<Coeffs> t;
    for (int i = 0; i < 5; ++i) t.push_back(divide(kPaperRaw[i], 1.05));
    return {t, t.back(), 1.0, 1e-7};
  }
  ADD_FAILURE() << "no reference table for " << name;
  return {};
}

const std::vector<std::string> kBuiltinNames = {"jordan", "you", "polar_express", "polar_express_paper", "gram"};

// A user schedule for the "custom" tests: two odd quintics with p(1) = 1 (the second has
// p'(1) = 0), so the tail (repeating the second) converges.
const std::vector<Coeffs> kCustomTriples = {{3.0, -3.2, 1.2}, {2.0, -1.5, 0.5}};
constexpr double kCustomSafety = 1.05, kCustomEps = 1e-6;

// Newton–Schulz on one matrix in float64, exactly as algorithms.md §1 states it.
torch::Tensor reference_ns_matrix(const torch::Tensor& G, const RefSchedule& s, int steps) {
  torch::Tensor X = G.to(torch::kFloat64);
  const bool tall = X.size(0) > X.size(1);
  if (tall) X = X.t();
  X = X / (X.norm() * s.safety + s.eps);  // Frobenius norm of the whole matrix
  for (int t = 0; t < steps; ++t) {
    const Coeffs& c = t < static_cast<int>(s.triples.size()) ? s.triples[t] : s.tail;
    torch::Tensor A = X.mm(X.t());
    torch::Tensor B = c[1] * A + c[2] * A.mm(A);
    X = c[0] * X + B.mm(X);
  }
  return tall ? X.t().contiguous() : X;
}

// Any [..., m, n]: one matrix at a time.
torch::Tensor reference_ns(const torch::Tensor& G, const RefSchedule& s, int steps) {
  auto flat = G.reshape({-1, G.size(-2), G.size(-1)});
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < flat.size(0); ++i) out.push_back(reference_ns_matrix(flat[i], s, steps));
  return torch::stack(out).reshape(G.sizes());
}

// ---------------------------------------------------------------------------------------------
// Inputs and measures.

// [m, n] float64 = U·diag(s)·Vᵀ, s log-spaced in [lo, hi], U, V random with orthonormal columns.
torch::Tensor spread_matrix(int64_t m, int64_t n, double lo = 1e-3, double hi = 1.0) {
  const int64_t k = std::min(m, n);
  auto U = std::get<0>(at::linalg_qr(torch::randn({m, k}, torch::kFloat64)));
  auto V = std::get<0>(at::linalg_qr(torch::randn({n, k}, torch::kFloat64)));
  auto s = torch::logspace(std::log10(lo), std::log10(hi), k, 10.0, torch::kFloat64);
  return (U * s).mm(V.t());
}

// The number of matrices in a [..., m, n] shape.
int64_t batch_count(const std::vector<int64_t>& shape) {
  int64_t b = 1;
  for (size_t d = 0; d + 2 < shape.size(); ++d) b *= shape[d];
  return b;
}

torch::Tensor spread_batch(int64_t b, int64_t m, int64_t n, double lo = 1e-3, double hi = 1.0) {
  std::vector<torch::Tensor> mats;
  for (int64_t i = 0; i < b; ++i) mats.push_back(spread_matrix(m, n, lo, hi));
  return torch::stack(mats);
}

// ‖a − b‖_F / ‖b‖_F in float64.
double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  auto a64 = a.to(torch::kFloat64), b64 = b.to(torch::kFloat64);
  return (a64 - b64).norm().item<double>() / b64.norm().item<double>();
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

OrthoOptions options(const std::string& schedule, OrthoMethod method = OrthoMethod::Auto,
                     c10::optional<at::ScalarType> compute = c10::nullopt, int steps = 5) {
  OrthoOptions o;
  o.schedule = schedule;
  o.method = method;
  o.compute_dtype = compute;
  o.steps = steps;
  if (schedule == "custom") {
    o.custom_triples = {kCustomTriples[0], kCustomTriples[1]};
    o.safety = kCustomSafety;
    o.eps = kCustomEps;
  }
  return o;
}

RefSchedule reference_for(const std::string& schedule) {
  if (schedule == "custom") return {kCustomTriples, kCustomTriples.back(), kCustomSafety, kCustomEps};
  return ref_schedule(schedule);
}

using orthopt::test::error_of;

// Expects `f` to throw a c10::Error whose message names `argument`.
template <class F>
void expect_error_naming(F&& f, const std::string& argument) {
  const std::string msg = error_of(f);
  ASSERT_FALSE(msg.empty()) << "expected an error naming argument '" << argument << "'";
  EXPECT_NE(msg.find("argument '" + argument + "'"), std::string::npos) << msg;
}

class Orthogonalize : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(1234); }
};

// ---------------------------------------------------------------------------------------------
// Schedules.

TEST_F(Orthogonalize, BuiltinSchedulesMatchAlgorithmsTable) {
  const auto& all = orthopt::builtin_schedules();
  ASSERT_EQ(all.size(), kBuiltinNames.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& s = all[i];
    EXPECT_EQ(s.name, kBuiltinNames[i]);
    const RefSchedule r = ref_schedule(s.name);
    ASSERT_EQ(s.triples.size(), r.triples.size()) << s.name;
    // Copied decimals vs the library's constants: equal up to the last bit of the divisions.
    for (size_t t = 0; t < r.triples.size(); ++t)
      for (int k = 0; k < 3; ++k) EXPECT_NEAR(s.triples[t][k], r.triples[t][k], 1e-14 * std::abs(r.triples[t][k]));
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(s.tail[k], r.tail[k], 1e-14 * std::abs(r.tail[k])) << s.name;
    EXPECT_DOUBLE_EQ(s.safety, r.safety) << s.name;
    EXPECT_DOUBLE_EQ(s.eps, r.eps) << s.name;
    EXPECT_EQ(&orthopt::find_schedule(s.name), &s);
  }
  EXPECT_EQ(orthopt::resolve_schedule({}).name, "polar_express");  // the default
}

TEST_F(Orthogonalize, StepsBeyondTableRepeatTheTail) {
  const auto& paper = orthopt::find_schedule("polar_express_paper");
  for (int t : {7, 8, 20, 99}) {
    const auto& c = paper.at_step(t);
    EXPECT_EQ(c[0], 1.875);
    EXPECT_EQ(c[1], -1.25);
    EXPECT_EQ(c[2], 0.375);
  }
  const auto& pe = orthopt::find_schedule("polar_express");
  EXPECT_EQ(pe.at_step(5), pe.triples.back());
  EXPECT_EQ(pe.at_step(50), pe.triples.back());
  const auto custom = orthopt::resolve_schedule(options("custom"));
  EXPECT_EQ(custom.at_step(9), kCustomTriples.back());

  // Numerically, in float64 compute so that the two tails are distinguishable: 10 steps of
  // polar_express_paper on singular values down to 1e-5 (still moving at t = 8).
  auto G = spread_matrix(32, 96, 1e-5, 1.0);
  auto out = orthopt::orthogonalize(G, options("polar_express_paper", OrthoMethod::Standard, at::kDouble, 10));
  const RefSchedule right = ref_schedule("polar_express_paper");
  RefSchedule wrong = right;
  wrong.tail = right.triples.back();  // the divided t = 7 triple repeated: not the contract
  const double err_right = rel_err(out, reference_ns(G, right, 10));
  const double err_wrong = rel_err(out, reference_ns(G, wrong, 10));
  std::printf("paper tail: err vs contract %.2e, vs repeated-last-triple %.2e\n", err_right, err_wrong);
  EXPECT_LT(err_right, 1e-10);  // float64 vs float64: rounding only
  EXPECT_GT(err_wrong, 1e-6);   // the test can tell the tails apart

  // And at fp32 compute for every schedule with steps past its table.
  auto G32 = spread_matrix(48, 96).to(torch::kFloat32);
  for (const std::string name : {"jordan", "you", "polar_express", "polar_express_paper", "gram", "custom"}) {
    auto o = orthopt::orthogonalize(G32, options(name, OrthoMethod::Standard, at::kFloat, 10));
    EXPECT_LT(rel_err(o, reference_ns(G32, reference_for(name), 10)), 1e-4) << name;
  }
}

// ---------------------------------------------------------------------------------------------
// Every schedule vs the reference at fp32 compute.

TEST_F(Orthogonalize, EveryScheduleMatchesReferenceFp32) {
  // Wide, tall, square, batched 3-D and 4-D. 1e-4: fp32 rounding (~6e-8) amplified by the
  // iteration's gain on the smallest singular values (~10³ over 5 steps) stays well below it.
  const std::vector<std::vector<int64_t>> shapes = {{32, 96}, {96, 32}, {64, 64}, {3, 48, 80}, {2, 2, 40, 24}};
  for (const std::string name : {"jordan", "you", "polar_express", "polar_express_paper", "gram", "custom"}) {
    for (const auto& shape : shapes) {
      const int64_t m = shape[shape.size() - 2], n = shape[shape.size() - 1];
      int64_t batch = 1;
      for (size_t d = 0; d + 2 < shape.size(); ++d) batch *= shape[d];
      auto G = spread_batch(batch, m, n).reshape(shape).to(torch::kFloat32);
      auto ref = reference_ns(G, reference_for(name), 5);
      auto out = orthopt::orthogonalize(G, options(name, OrthoMethod::Standard, at::kFloat));
      ASSERT_EQ(out.sizes(), G.sizes());
      ASSERT_EQ(out.scalar_type(), torch::kFloat32);
      EXPECT_LT(rel_err(out, ref), 1e-4) << name << " " << G.sizes();  // measured <= 5e-6
      // Gram NS (what `auto` picks for the wide and tall shapes here) squares the condition
      // number by working on R = X·Xᵀ, so fp32 rounding weighs more: measured up to 1.4e-4
      // with the default restart, hence the 1e-3 bound of the Gram-vs-standard contract.
      auto gram = orthopt::orthogonalize(G, options(name, OrthoMethod::Gram, at::kFloat));
      EXPECT_LT(rel_err(gram, ref), 1e-3) << name << " " << G.sizes() << " gram";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Gram Newton–Schulz.

TEST_F(Orthogonalize, GramEqualsStandard) {
  const std::vector<std::vector<int>> restart_sets = {{2}, {}, {1, 3}};
  for (const std::string name : {"gram", "polar_express"}) {
    auto G = spread_batch(3, 32, 128);
    for (const auto& restarts : restart_sets) {
      // float64: the two are the same polynomial in exact arithmetic; only rounding differs.
      auto o64 = options(name, OrthoMethod::Gram, at::kDouble);
      o64.gram_restarts = restarts;
      auto s64 = options(name, OrthoMethod::Standard, at::kDouble);
      EXPECT_LT(rel_err(orthopt::orthogonalize(G, o64), orthopt::orthogonalize(G, s64)), 1e-10) << name;
      EXPECT_LT(rel_err(orthopt::orthogonalize(G, o64), reference_ns(G, ref_schedule(name), 5)), 1e-10) << name;
      // fp32: Gram forms R = X·Xᵀ and its powers, so rounding is amplified more than in standard
      // NS: measured ~1e-4 with restarts, ~1.2e-3 without (so no fp32 bound for that case; the
      // float64 check above covers its math).
      if (restarts.empty()) continue;
      auto G32 = G.to(torch::kFloat32);
      auto o32 = options(name, OrthoMethod::Gram, at::kFloat);
      o32.gram_restarts = restarts;
      auto s32 = options(name, OrthoMethod::Standard, at::kFloat);
      EXPECT_LT(rel_err(orthopt::orthogonalize(G32, o32), orthopt::orthogonalize(G32, s32)), 1e-3) << name;
    }
  }
}

TEST_F(Orthogonalize, Fp16GramWithRestartStaysNearFloat64Standard) {
  // fp16 Gram (CPU emulation: fp32 accumulate, one rounding to fp16 per product) on singular
  // values 1e-3..1, vs the float64 reference of standard NS. Measured on 4×[64, 256]:
  // with restart [2]: 3.3e-2 (gram schedule), 4.2e-2 (polar_express); other seeds 3.2e-2..4.5e-2.
  // Without restart: 0.72 and 1.10 (0.61..1.22 over seeds): the spurious negative eigenvalues
  // of R grow unchecked. Bound 0.06: the worst measured (4.5e-2) with a 1.3× margin.
  auto G = spread_batch(4, 64, 256).to(torch::kFloat32);
  for (const std::string name : {"gram", "polar_express"}) {
    auto ref = reference_ns(G, ref_schedule(name), 5);
    auto with = options(name, OrthoMethod::Gram, at::kHalf);
    auto without = with;
    without.gram_restarts = {};
    auto out = orthopt::orthogonalize(G, with);
    const double err_with = rel_err(out, ref), err_without = rel_err(orthopt::orthogonalize(G, without), ref);
    std::printf("fp16 gram %s: restart [2] %.3e, no restart %.3e\n", name.c_str(), err_with, err_without);
    EXPECT_EQ(out.scalar_type(), torch::kFloat32);
    EXPECT_LT(err_with, 0.06);
    EXPECT_GT(err_without, 5 * err_with);  // measured ≥ 18×
  }
}

// The configuration measured above (half precision, no restart) is the one orthogonalize warns
// about; float32, a restart, or too few steps for the published restart do not warn.
TEST_F(Orthogonalize, GramWithoutRestartInHalfPrecisionHasAWarning) {
  OrthoOptions o;
  o.gram_restarts = {};
  for (auto dt : {at::kHalf, at::kBFloat16}) {
    const std::string w = orthopt::gram_precision_warning(o, dt);
    EXPECT_NE(w.find("without restarts"), std::string::npos) << w;
    EXPECT_NE(w.find("gram_restarts"), std::string::npos) << w;
  }
  EXPECT_TRUE(orthopt::gram_precision_warning(o, at::kFloat).empty());
  EXPECT_TRUE(orthopt::gram_precision_warning(o, at::kDouble).empty());
  o.steps = 2;
  EXPECT_TRUE(orthopt::gram_precision_warning(o, at::kHalf).empty());
  o.steps = 5;
  o.gram_restarts = {3};
  EXPECT_TRUE(orthopt::gram_precision_warning(o, at::kHalf).empty());
  EXPECT_TRUE(orthopt::gram_precision_warning(OrthoOptions{}, at::kHalf).empty());  // the default restarts
}

// ---------------------------------------------------------------------------------------------
// Convergence to the polar factor and the singular-value band.

// σ in [0.5, 1]: after 30 steps of polar_express_paper (its tail has p(1) = 1, p'(1) = p''(1) = 0)
// every singular value has converged to 1. Measured: fp32 1.0e-6..1.3e-6 (fp32 rounding of an
// orthogonal matrix), fp64 2.5e-15..3.2e-15.
TEST_F(Orthogonalize, ManyStepsApproachSvdPolarFactor) {
  for (const auto& mn : std::vector<std::array<int64_t, 2>>{{48, 96}, {96, 48}, {64, 64}}) {
    auto G = spread_matrix(mn[0], mn[1], 0.5, 1.0);
    auto svd = at::linalg_svd(G, /*full_matrices=*/false);
    auto polar = std::get<0>(svd).mm(std::get<2>(svd));  // U·Vᵀ (linalg_svd returns Vᵀ)
    auto o = options("polar_express_paper", OrthoMethod::Standard, at::kFloat, 30);
    const double err32 = rel_err(orthopt::orthogonalize(G.to(torch::kFloat32), o), polar);
    o.compute_dtype = at::kDouble;
    const double err64 = rel_err(orthopt::orthogonalize(G, o), polar);
    std::printf("polar factor %ldx%ld after 30 steps: fp32 %.2e, fp64 %.2e\n", (long)mn[0], (long)mn[1], err32, err64);
    EXPECT_LT(err32, 1e-5);
    EXPECT_LT(err64, 1e-12);
  }
}

// NS acts on each singular value separately: σ_out = p₅(…p₁(σ / (‖G‖_F·s + ε))). The singular
// values of the output must be that scalar composition of the input's (an exact prediction), and
// they lie in a band. Measured band (fp32, standard and auto, shapes below, 3 seeds):
// [0.4190, 1.1409]. The top is the maximum of the composed polynomial (1.1411 on a fine grid).
// The bottom is not the polynomial's minimum on [1e-3/1.02, 1] (0.847): the Frobenius norm of a
// 64-rank input with log-spaced σ in [1e-3, 1] is ≈ 2.26, so the smallest normalized σ is
// ≈ 4.3e-4 and maps to 0.419. Smaller ranks give higher bottoms.
TEST_F(Orthogonalize, PolarExpressSingularValueBand) {
  const RefSchedule pe = ref_schedule("polar_express");
  double lo = 1e9, hi = 0, worst_prediction = 0;
  for (const auto& mn : std::vector<std::array<int64_t, 2>>{{64, 64}, {32, 128}, {128, 32}, {48, 80}}) {
    for (int rep = 0; rep < 3; ++rep) {
      auto G64 = spread_matrix(mn[0], mn[1]);
      auto G = G64.to(torch::kFloat32);
      // The prediction, from the input's singular values alone.
      auto x = at::linalg_svdvals(G.to(torch::kFloat64));
      x = x / (G.to(torch::kFloat64).norm() * pe.safety + pe.eps);
      for (const auto& c : pe.triples) x = c[0] * x + c[1] * x.pow(3) + c[2] * x.pow(5);
      auto predicted = std::get<0>(x.sort(0, /*descending=*/true));
      for (auto method : {OrthoMethod::Standard, OrthoMethod::Auto}) {
        auto out = orthopt::orthogonalize(G, options("polar_express", method, at::kFloat));
        auto sv = at::linalg_svdvals(out.to(torch::kFloat64));
        lo = std::min(lo, sv.min().item<double>());
        hi = std::max(hi, sv.max().item<double>());
        worst_prediction = std::max(worst_prediction, max_abs_diff(sv, predicted));
      }
    }
  }
  std::printf("polar_express 5 steps, fp32: singular values in [%.4f, %.4f], max |σ - predicted| %.2e\n", lo,
              hi, worst_prediction);
  EXPECT_GE(lo, 0.41);
  EXPECT_LE(hi, 1.15);
  // fp32 (Gram for the wide shapes under auto): measured 1e-4 at most.
  EXPECT_LT(worst_prediction, 1e-3);
}

// ---------------------------------------------------------------------------------------------
// Shapes: batch, orientation, split, flatten.

TEST_F(Orthogonalize, BatchedEqualsPerMatrixLoop) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4, 32, 96}, {4, 96, 32}, {2, 3, 40, 40}}) {
    const int64_t m = shape[shape.size() - 2], n = shape[shape.size() - 1];
    auto G = spread_batch(batch_count(shape), m, n).reshape(shape).to(torch::kFloat32);
    auto batched = orthopt::orthogonalize(G, {});
    auto flat = G.reshape({-1, m, n});
    std::vector<torch::Tensor> singles;
    for (int64_t i = 0; i < flat.size(0); ++i) singles.push_back(orthopt::orthogonalize(flat[i], {}));
    auto looped = torch::stack(singles).reshape(shape);
    // Same products per matrix; a batched GEMM may block differently, so allow fp32 rounding.
    EXPECT_LT(max_abs_diff(batched, looped), 1e-6) << G.sizes();
    EXPECT_LT(rel_err(batched, reference_ns(G, ref_schedule("polar_express"), 5)), 1e-4);
  }
}

// orthogonalize_many: batches of different shapes in one call; the Gram ones with the same m
// (wide and tall, several widths) iterate together. Each result must equal the single-input
// call: the stacked m×m products compute each matrix's product on its own (CPU: bit for bit,
// measured), and both must sit on the float64 standard-NS reference.
TEST_F(Orthogonalize, ManyEqualsOneByOne) {
  const std::vector<std::vector<int64_t>> shapes = {
      {3, 24, 96}, {2, 72, 24}, {4, 24, 60},  // Gram, m = 24: one iteration for all three
      {2, 24, 30},                            // standard (aspect 1.25)
      {2, 16, 64}, {1, 40, 16}};              // Gram, m = 16: another
  // fp16 (Gram NS's 16-bit type): emulated on the CPU (fp32 products, each result rounded once),
  // where R is written into its slice of the stacked buffer by a rounding copy, not rounded alone.
  for (const auto dtype : {at::kFloat, at::kDouble, at::kHalf}) {
    std::vector<torch::Tensor> Gs;
    for (const auto& sh : shapes) Gs.push_back(spread_batch(sh[0], sh[1], sh[2]).to(dtype));
    OrthoOptions o;
    o.compute_dtype = dtype;
    const auto many = orthopt::detail::orthogonalize_many_in_compute_dtype(Gs, o);
    ASSERT_EQ(many.size(), Gs.size());
    for (size_t i = 0; i < Gs.size(); ++i) {
      const auto one = orthopt::detail::orthogonalize_in_compute_dtype(Gs[i], o);
      EXPECT_EQ(many[i].sizes(), Gs[i].sizes());
      EXPECT_EQ(many[i].scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(many[i], one)) << "input " << i << " " << Gs[i].sizes() << " " << dtype
                                              << ": max |difference| " << max_abs_diff(many[i], one);
      // Gram NS vs float64 standard NS: 1e-10 in fp64 (GramEqualsStandard); in fp32 Gram's
      // rounding of R's powers measured ~1e-4 with the restart, so 1e-3; in fp16 (2^-11 per
      // rounded result, over 5 iterations) measured 1.0e-2 to 3.3e-2 here, so 0.1.
      EXPECT_LT(rel_err(many[i], reference_ns(Gs[i], ref_schedule("polar_express"), 5)),
                dtype == at::kDouble ? 1e-10 : (dtype == at::kFloat ? 1e-3 : 0.1))
          << "input " << i;
    }
  }
  OrthoOptions split;
  split.split_sizes = {8, 16};
  expect_error_naming([&] { orthopt::detail::orthogonalize_many_in_compute_dtype({spread_batch(1, 24, 96)}, split); },
                      "split_sizes");
  expect_error_naming([&] { orthopt::detail::orthogonalize_many_in_compute_dtype({torch::ones({3})}, {}); }, "G");
}

// Norms given by the caller (the fused Muon step sums them in its momentum pass) replace the
// reduction over the input: the wide input's own fp32 norms give its result bit for bit; norms
// scaled by 2 halve the NS input, which the result must show (it is not ignored); a wrong count
// or dtype is refused naming 'norms'.
TEST_F(Orthogonalize, ManyTakesGivenNorms) {
  const auto G = spread_batch(3, 24, 30).to(at::kFloat);  // standard NS (aspect 1.25 < the Gram threshold 1.5)
  const auto G2 = spread_batch(2, 24, 96).to(at::kFloat);  // Gram
  OrthoOptions o;
  o.compute_dtype = at::kFloat;
  const auto plain = orthopt::detail::orthogonalize_many_in_compute_dtype({G, G2}, o);
  const auto norm = [](const torch::Tensor& X) { return at::linalg_vector_norm(X, 2, at::IntArrayRef{1, 2}); };
  const auto given = orthopt::detail::orthogonalize_many_in_compute_dtype({G, G2}, o, {norm(G), norm(G2)});
  for (size_t i = 0; i < 2; ++i)
    EXPECT_TRUE(torch::equal(plain[i], given[i])) << "input " << i << ": max |difference| "
                                                  << max_abs_diff(plain[i], given[i]);
  const auto halved = orthopt::detail::orthogonalize_many_in_compute_dtype({G, G2}, o, {2 * norm(G), 2 * norm(G2)});
  EXPECT_GT(max_abs_diff(halved[0], plain[0]), 1e-3);  // NS from X/2 has not converged like NS from X
  expect_error_naming([&] { orthopt::detail::orthogonalize_many_in_compute_dtype({G, G2}, o, {norm(G)}); }, "norms");
  expect_error_naming(
      [&] { orthopt::detail::orthogonalize_many_in_compute_dtype({G, G2}, o, {norm(G).to(at::kDouble), norm(G2)}); },
      "norms");
}

// An input handed over ready-made (`prepared`: what the fused GPU step's momentum kernel
// writes) is used as the NS input as is: the same input computed here as the reference path
// computes it gives the same bits; flags of the wrong count, or a tall input (NS would
// transpose it), are refused; on the CPU no caller is offered the ready-made form.
TEST_F(Orthogonalize, ManyTakesPreparedInputs) {
  const auto G = spread_batch(3, 24, 30).to(at::kFloat);   // standard NS
  const auto G2 = spread_batch(2, 24, 96).to(at::kFloat);  // Gram
  OrthoOptions o;
  o.compute_dtype = at::kFloat;
  const orthopt::Schedule s = orthopt::resolve_schedule(o);
  const auto input = [&](const torch::Tensor& X) {
    return X / (at::linalg_vector_norm(X, 2, at::IntArrayRef{1, 2}, true) * s.safety + s.eps);
  };
  const auto plain = orthopt::detail::orthogonalize_many_in_compute_dtype({G, G2}, o);
  const auto prepared =
      orthopt::detail::orthogonalize_many_in_compute_dtype({input(G), G2}, o, {}, std::vector<bool>{true, false});
  for (size_t i = 0; i < 2; ++i)
    EXPECT_TRUE(torch::equal(plain[i], prepared[i])) << "input " << i << ": max |difference| "
                                                     << max_abs_diff(plain[i], prepared[i]);
  // Taken as is, not scaled again: NS from X/2 has not converged like NS from X.
  const auto halved =
      orthopt::detail::orthogonalize_many_in_compute_dtype({input(G) / 2, G2}, o, {}, std::vector<bool>{true, false});
  EXPECT_GT(max_abs_diff(halved[0], plain[0]), 1e-3);
  expect_error_naming(
      [&] { orthopt::detail::orthogonalize_many_in_compute_dtype({G, G2}, o, {}, std::vector<bool>{true}); },
      "prepared");
  const auto tall = G.transpose(1, 2).contiguous();
  expect_error_naming(
      [&] { orthopt::detail::orthogonalize_many_in_compute_dtype({tall}, o, {}, std::vector<bool>{true}); },
      "prepared");
  EXPECT_FALSE(orthopt::detail::prepared_input_dtype(24, 30, OrthoOptions{}, G).has_value());
}

TEST_F(Orthogonalize, TallEqualsTransposeOfWide) {
  for (auto method : {OrthoMethod::Standard, OrthoMethod::Gram}) {
    auto W = spread_batch(2, 32, 96);
    // float64 compute: the orientation logic is exact up to float64 rounding.
    auto o64 = options("polar_express", method, at::kDouble);
    const double err64 = rel_err(orthopt::orthogonalize(W.transpose(-2, -1).contiguous(), o64),
                                 orthopt::orthogonalize(W, o64).transpose(-2, -1));
    EXPECT_LT(err64, 1e-12);
    // fp32 compute: not bit-identical. The tall input's norm is reduced through a transposed
    // view, so it can differ from the wide one's in the last bit, and the iteration amplifies
    // that like any fp32 rounding (gain ~10³ on σ = 1e-3). Measured: standard 4.2e-6, Gram
    // 6.6e-5, i.e. the size of each method's fp32 error vs float64; bounds as vs the reference.
    auto W32 = W.to(torch::kFloat32);
    auto o32 = options("polar_express", method, at::kFloat);
    const double err32 = rel_err(orthopt::orthogonalize(W32.transpose(-2, -1).contiguous(), o32),
                                 orthopt::orthogonalize(W32, o32).transpose(-2, -1));
    std::printf("tall vs transposed wide (%s): fp64 %.2e, fp32 %.2e\n", orthopt::to_string(method), err64, err32);
    EXPECT_LT(err32, method == OrthoMethod::Standard ? 1e-4 : 1e-3);
  }
}

TEST_F(Orthogonalize, SplitEqualsSeparateBlocks) {
  struct Case {
    std::vector<int64_t> shape;
    std::vector<int64_t> split;
  };
  // Fused QKV with equal blocks, unequal GQA-like blocks (q 64, k 16, v 16), and a batch of them.
  const std::vector<Case> cases = {{{96, 64}, {32, 32, 32}}, {{96, 128}, {64, 16, 16}}, {{2, 96, 128}, {64, 16, 16}}};
  for (const auto& c : cases) {
    const int64_t m = c.shape[c.shape.size() - 2], n = c.shape[c.shape.size() - 1];
    auto G = spread_batch(batch_count(c.shape), m, n).reshape(c.shape).to(torch::kFloat32);
    OrthoOptions o;
    o.split_sizes = c.split;
    auto split = orthopt::orthogonalize(G, o);
    ASSERT_EQ(split.sizes(), G.sizes());
    auto blocks = G.split_with_sizes(c.split, -2);
    std::vector<torch::Tensor> separate, reference;
    for (const auto& b : blocks) {
      separate.push_back(orthopt::orthogonalize(b.contiguous(), {}));
      reference.push_back(reference_ns(b, ref_schedule("polar_express"), 5));
    }
    EXPECT_LT(max_abs_diff(split, torch::cat(separate, -2)), 1e-6);
    EXPECT_LT(rel_err(split, torch::cat(reference, -2)), 1e-4);
    // Not the same as orthogonalizing the whole matrix (the test can tell).
    EXPECT_GT(rel_err(split, reference_ns(G, ref_schedule("polar_express"), 5)), 1e-2);
  }
}

TEST_F(Orthogonalize, FlattenEqualsReshapedMatrix) {
  auto W = spread_matrix(16, 36).reshape({16, 4, 3, 3}).to(torch::kFloat32);  // a conv weight
  OrthoOptions o;
  o.flatten = true;
  auto flat = orthopt::orthogonalize(W, o);
  ASSERT_EQ(flat.sizes(), W.sizes());
  auto as_matrix = orthopt::orthogonalize(W.reshape({16, 36}), {});
  EXPECT_LT(max_abs_diff(flat.reshape({16, 36}), as_matrix), 1e-6);
  EXPECT_LT(rel_err(flat.reshape({16, 36}), reference_ns(W.reshape({16, 36}), ref_schedule("polar_express"), 5)), 1e-4);
  // Without flatten the same tensor is a batch of 64 3×3 matrices: a different result.
  EXPECT_GT(rel_err(orthopt::orthogonalize(W, {}), flat), 1e-2);
  // flatten with split_sizes counts rows on dim 0.
  o.split_sizes = {8, 8};
  auto split_flat = orthopt::orthogonalize(W, o).reshape({16, 36});
  auto halves = W.reshape({16, 36}).split(8, 0);
  EXPECT_LT(max_abs_diff(split_flat, torch::cat({orthopt::orthogonalize(halves[0].contiguous(), {}),
                                                 orthopt::orthogonalize(halves[1].contiguous(), {})})),
            1e-6);
}

// ---------------------------------------------------------------------------------------------
// Special values and dtypes.

TEST_F(Orthogonalize, ZeroMatrixGivesZeros) {
  for (auto method : {OrthoMethod::Standard, OrthoMethod::Gram}) {
    for (auto compute : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
      auto Z = torch::zeros({16, 48});
      auto out = orthopt::orthogonalize(Z, options("polar_express", method, compute));
      EXPECT_TRUE(out.eq(0).all().item<bool>()) << orthopt::to_string(method) << " " << compute;
    }
  }
  // A zero matrix inside a batch stays zero; its neighbour is unaffected.
  auto G = spread_batch(2, 24, 40).to(torch::kFloat32);
  G[0].zero_();
  auto out = orthopt::orthogonalize(G, {});
  EXPECT_TRUE(out[0].eq(0).all().item<bool>());
  EXPECT_LT(max_abs_diff(out[1], orthopt::orthogonalize(G[1].contiguous(), {})), 1e-6);
}

TEST_F(Orthogonalize, HalfInputReturnsItsDtype) {
  auto G = spread_batch(2, 32, 64);
  for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
    auto Gh = G.to(dtype);
    auto out = orthopt::orthogonalize(Gh, {});
    EXPECT_EQ(out.scalar_type(), dtype);
    EXPECT_EQ(out.sizes(), G.sizes());
    // The reference sees the same rounded input; what remains is fp32 compute plus one rounding
    // of the output to bf16 (8 significant bits, 2^-9 ≈ 2e-3) or fp16 (2^-12 ≈ 2.4e-4).
    EXPECT_LT(rel_err(out, reference_ns(Gh, ref_schedule("polar_express"), 5)), dtype == torch::kBFloat16 ? 5e-3 : 1e-3)
        << dtype;
  }
  // float64 input at the default (fp32) compute comes back as float64.
  EXPECT_EQ(orthopt::orthogonalize(G, {}).scalar_type(), torch::kFloat64);
}

// ---------------------------------------------------------------------------------------------
// Bad input.

TEST_F(Orthogonalize, BadInputNamesTheArgument) {
  auto G = torch::randn({8, 16});
  expect_error_naming([] { orthopt::orthogonalize(torch::tensor(1.0f), {}); }, "G");
  expect_error_naming([] { orthopt::orthogonalize(torch::randn({8}), {}); }, "G");
  expect_error_naming([] { orthopt::orthogonalize(torch::randn({0, 8}), {}); }, "G");
  expect_error_naming([] { orthopt::orthogonalize(torch::randn({8, 0}), {}); }, "G");
  expect_error_naming([] { orthopt::orthogonalize(torch::randn({0, 8, 8}), {}); }, "G");
  expect_error_naming([] { orthopt::orthogonalize(torch::ones({8, 16}, torch::kInt32), {}); }, "G");
  expect_error_naming([] { orthopt::orthogonalize(torch::ones({8, 16}, torch::kBool), {}); }, "G");
  expect_error_naming([] { orthopt::orthogonalize(at::Tensor(), {}); }, "G");

  auto with = [&](auto edit) {
    OrthoOptions o;
    edit(o);
    return [o, G] { orthopt::orthogonalize(G, o); };
  };
  expect_error_naming(with([](OrthoOptions& o) { o.schedule = "jordann"; }), "schedule");
  expect_error_naming(with([](OrthoOptions& o) { o.schedule = "custom"; }), "schedule");  // no triples
  expect_error_naming(with([](OrthoOptions& o) {
                        o.schedule = "custom";
                        o.custom_triples = {{3.0, NAN, 1.0}};
                      }),
                      "schedule");
  for (int steps : {0, -1, 101})
    expect_error_naming(with([steps](OrthoOptions& o) { o.steps = steps; }), "steps");
  for (int r : {-1, 0, 5, 7})
    expect_error_naming(with([r](OrthoOptions& o) { o.gram_restarts = {r}; }), "restarts");
  expect_error_naming(with([](OrthoOptions& o) { o.steps = 2; }), "restarts");  // default restart {2} needs >= 3 steps
  expect_error_naming(with([](OrthoOptions& o) { o.split_sizes = {4, 3}; }), "split_sizes");
  expect_error_naming(with([](OrthoOptions& o) { o.split_sizes = {4, 4, 4}; }), "split_sizes");
  expect_error_naming(with([](OrthoOptions& o) { o.split_sizes = {8, 0}; }), "split_sizes");
  expect_error_naming(with([](OrthoOptions& o) { o.compute_dtype = at::kInt; }), "compute_dtype");
  expect_error_naming(with([](OrthoOptions& o) { o.gram_aspect_threshold = 0.5; }), "gram_aspect_threshold");
  expect_error_naming(with([](OrthoOptions& o) { o.safety = 0.0; }), "safety");
  expect_error_naming(with([](OrthoOptions& o) { o.eps = -1.0; }), "eps");
  expect_error_naming([] { orthopt::parse_method("fast"); }, "method");
  // Boundaries that are valid.
  EXPECT_NO_THROW(with([](OrthoOptions& o) { o.steps = 100; })());
  EXPECT_NO_THROW(with([](OrthoOptions& o) { o.steps = 1; o.gram_restarts = {}; })());
}

TEST_F(Orthogonalize, NonFiniteInput) {
  auto G = spread_batch(3, 16, 40).to(torch::kFloat32);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    auto B = G.clone();
    B[1][3][5] = bad;
    expect_error_naming([&] { orthopt::orthogonalize(B, {}); }, "G");  // the default policy
    // The check runs after the work is enqueued: every path still refuses, and returns nothing.
    for (auto method : {OrthoMethod::Standard, OrthoMethod::Gram}) {
      auto o = options("polar_express", method, at::kFloat);
      expect_error_naming([&] { orthopt::orthogonalize(B, o); }, "G");
      expect_error_naming([&] { orthopt::detail::orthogonalize_many_in_compute_dtype({G[0].contiguous(), B}, o); },
                          "G");
      auto split = o;
      split.split_sizes = {6, 10};
      expect_error_naming([&] { orthopt::orthogonalize(B, split); }, "G");
    }
    auto flat = OrthoOptions{};
    flat.flatten = true;
    expect_error_naming([&] { orthopt::orthogonalize(B, flat); }, "G");
    for (auto method : {OrthoMethod::Standard, OrthoMethod::Gram}) {
      auto o = options("polar_express", method, at::kFloat);
      o.nonfinite = NonFinitePolicy::Propagate;
      auto out = orthopt::orthogonalize(B, o);
      // The whole matrix holding the bad value becomes NaN (its norm is NaN/Inf, and Inf/Inf is
      // NaN); the other matrices of the batch are untouched.
      EXPECT_TRUE(out[1].isnan().all().item<bool>()) << bad;
      EXPECT_TRUE(out[0].isfinite().all().item<bool>());
      EXPECT_LT(max_abs_diff(out[0], orthopt::orthogonalize(G[0].contiguous(), o)), 1e-6);
      EXPECT_LT(max_abs_diff(out[2], orthopt::orthogonalize(G[2].contiguous(), o)), 1e-6);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Method and dtype selection, FLOP counts.

TEST_F(Orthogonalize, MethodAndComputeDtypeSelection) {
  OrthoOptions o;
  EXPECT_EQ(orthopt::resolve_method(64, 95, o), OrthoMethod::Standard);
  EXPECT_EQ(orthopt::resolve_method(64, 96, o), OrthoMethod::Gram);  // cols >= 1.5·rows
  EXPECT_EQ(orthopt::resolve_method(64, 64, o), OrthoMethod::Standard);
  o.gram_aspect_threshold = 3.0;
  EXPECT_EQ(orthopt::resolve_method(64, 96, o), OrthoMethod::Standard);
  o.method = OrthoMethod::Gram;
  EXPECT_EQ(orthopt::resolve_method(64, 64, o), OrthoMethod::Gram);
  EXPECT_EQ(orthopt::parse_method("standard"), OrthoMethod::Standard);
  EXPECT_EQ(orthopt::parse_method("gram"), OrthoMethod::Gram);
  EXPECT_EQ(orthopt::parse_method("auto"), OrthoMethod::Auto);

  OrthoOptions d;
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  EXPECT_EQ(orthopt::resolve_compute_dtype(d, cpu, OrthoMethod::Standard), at::kFloat);
  EXPECT_EQ(orthopt::resolve_compute_dtype(d, cpu, OrthoMethod::Gram), at::kFloat);
  EXPECT_EQ(orthopt::resolve_compute_dtype(d, cuda, OrthoMethod::Standard), at::kBFloat16);
  EXPECT_EQ(orthopt::resolve_compute_dtype(d, cuda, OrthoMethod::Gram), at::kHalf);
  d.compute_dtype = at::kDouble;
  EXPECT_EQ(orthopt::resolve_compute_dtype(d, cuda, OrthoMethod::Gram), at::kDouble);
}

TEST_F(Orthogonalize, FlopCountsMatchAlgorithmsFormulas) {
  const double m = 64, n = 256;
  // algorithms.md §1.1: dense standard 5 steps = 20m²n + 10m³ (orientation-free).
  EXPECT_DOUBLE_EQ(orthopt::standard_ns_flops(64, 256, 5), 20 * m * m * n + 10 * m * m * m);
  EXPECT_DOUBLE_EQ(orthopt::standard_ns_flops(256, 64, 5), 20 * m * m * n + 10 * m * m * m);
  // Gram with restart [2], dense products: twice the symmetric count 6m²n + 14m³ ... except
  // that only X·Xᵀ products are symmetric among the m²n terms: R (2), restart Q·X + X·Xᵀ (4),
  // final Q·X (2) = 8m²n; the m³ terms 2·14 = 28.
  EXPECT_DOUBLE_EQ(orthopt::method_flops(64, 256, 5, OrthoMethod::Gram, {2}), 8 * m * m * n + 28 * m * m * m);
  EXPECT_DOUBLE_EQ(orthopt::method_flops(64, 256, 5, OrthoMethod::Standard, {2}), 20 * m * m * n + 10 * m * m * m);
}

}  // namespace

// NorMuon, Dion3, Dion2, Dion, Lion and fp32 master weights against plain float64 reference steps
// (algorithms.md §4–7), plus the Dion3 selection / error-feedback / variance semantics.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <tuple>

#include "optim/update_math.h"  // optim_detail::normuon_normalize (internal)
#include "orthopt/optim.h"
#include "test_optim_reference.h"

using orthopt::Algorithm;
using orthopt::GroupOptions;
using orthopt::Optimizer;
using orthopt::ParamGroup;

namespace {

// Same precision argument as test_optim_muon.cpp: float64 params, fp32 orthogonalization
// (standard NS, 2e-6..6e-6 measured), displacement relative error; 1e-5 is the bound.
constexpr double kTol = 1e-5;

at::Tensor randn(at::IntArrayRef sizes, at::Generator& gen, at::ScalarType dtype = at::kDouble) {
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
}

struct Shape {
  std::string name;
  std::vector<int64_t> sizes;
};
const std::vector<Shape> kShapes = {
    {"wide", {16, 40}}, {"tall", {40, 16}}, {"square_a", {24, 24}}, {"square_b", {24, 24}}, {"experts", {3, 12, 20}}};

GroupOptions matrix_options(Algorithm a) {
  GroupOptions o;
  o.algorithm = a;
  o.lr = 0.02;
  o.weight_decay = 0.1;
  o.ortho.method = orthopt::OrthoMethod::Standard;
  return o;
}

// Reference state of one parameter, as [matrices, rows, cols] views for per-matrix loops.
struct RefParam {
  at::Tensor W0, W, M, V, Q;
};

// Runs `steps` steps of `opt_options` over kShapes (or `shapes`) and of `ref_step` (which
// updates one RefParam given the gradient, as [B, rows, cols]); returns the worst relative
// error of the parameter displacement.
double compare(const GroupOptions& o, int steps,
               const std::function<void(RefParam&, const at::Tensor& G, size_t k)>& ref_step,
               const std::vector<Shape>& shapes = kShapes,
               const std::function<void(Optimizer&, std::vector<RefParam>&)>& init = nullptr) {
  auto gen = at::detail::createCPUGenerator(4321);
  ParamGroup g;
  g.options = o;
  std::vector<RefParam> refs;
  for (const auto& s : shapes) {
    auto p = randn(s.sizes, gen).requires_grad_(true);
    g.params.push_back(p);
    RefParam r;
    r.W0 = ref::f64(p).reshape({-1, p.size(-2), p.size(-1)});
    r.W = r.W0.clone();
    r.M = at::zeros_like(r.W);
    r.V = at::zeros({r.W.size(0), r.W.size(1), 1}, at::kDouble);
    refs.push_back(r);
  }
  Optimizer opt({g});
  if (init) init(opt, refs);
  for (int t = 0; t < steps; ++t) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      auto G = randn(shapes[k].sizes, gen);
      g.params[k].mutable_grad() = G;
      ref_step(refs[k], ref::f64(G).reshape(refs[k].W.sizes()), k);
    }
    opt.step();
  }
  double worst = 0;
  for (size_t k = 0; k < shapes.size(); ++k)
    worst = std::max(worst, ref::rel(ref::f64(g.params[k]).reshape(refs[k].W.sizes()) - refs[k].W0,
                                     refs[k].W - refs[k].W0));
  return worst;
}

// ---------------------------------------------------------------- NorMuon

TEST(OptimNorMuon, MatchesReference) {
  for (bool nesterov : {false, true}) {
    auto o = matrix_options(Algorithm::NorMuon);
    o.nesterov = nesterov;
    auto step = [&](RefParam& r, const at::Tensor& G, size_t) {
      r.M = r.M * o.momentum + G;
      at::Tensor Uin = nesterov ? G + r.M * o.momentum : r.M;
      for (int64_t b = 0; b < r.W.size(0); ++b) {
        at::Tensor U = ref::newton_schulz(Uin[b], "polar_express", 5);
        at::Tensor V = r.V[b].clone();
        at::Tensor Uh = ref::normuon(U, V, 0.95, 1e-8);
        r.V[b].copy_(V);
        const double adj = ref::lr_factor("spectral_norm", r.W.size(1), r.W.size(2));
        r.W[b].copy_(ref::apply(r.W[b], Uh, o.lr, o.lr * adj, o.weight_decay, false));
      }
    };
    const double one = compare(o, 1, step), ten = compare(o, 10, step);
    std::cout << "normuon nesterov=" << nesterov << ": rel err 1 step " << one << ", 10 steps " << ten << "\n";
    EXPECT_LT(one, kTol);
    EXPECT_LT(ten, kTol);
  }
}

// Split (fused QKV) rows: blocks orthogonalized on their own, NorMuon normalization over the
// whole matrix, then each block's own lr factor.
TEST(OptimNorMuon, SplitMatchesReference) {
  auto o = matrix_options(Algorithm::NorMuon);
  o.ortho.split_sizes = {16, 8};
  o.lr_adjust = orthopt::LrAdjust::Jordan;
  auto step = [&](RefParam& r, const at::Tensor& G, size_t) {
    r.M = r.M * o.momentum + G;
    at::Tensor U = ref::orthogonalize(r.M[0], "polar_express", 5, {16, 8});
    at::Tensor V = r.V[0].clone();
    at::Tensor Uh = ref::normuon(U, V, 0.95, 1e-8);
    r.V[0].copy_(V);
    at::Tensor D = at::cat({Uh.narrow(0, 0, 16) * ref::lr_factor("jordan", 16, 20),
                            Uh.narrow(0, 16, 8) * ref::lr_factor("jordan", 8, 20)});
    r.W[0].copy_(ref::apply(r.W[0], D, o.lr, o.lr, o.weight_decay, false));
  };
  const std::vector<Shape> shapes = {{"qkv", {24, 20}}};
  const double one = compare(o, 1, step, shapes), ten = compare(o, 10, step, shapes);
  std::cout << "normuon split: rel err 1 step " << one << ", 10 steps " << ten << "\n";
  EXPECT_LT(one, kTol);
  EXPECT_LT(ten, kTol);
}

// flatten: a 4-D conv weight is one [out, prod(rest)] matrix for Muon.
TEST(OptimMuonFlatten, FourDWeightIsOneMatrix) {
  auto o = matrix_options(Algorithm::Muon);
  o.ortho.flatten = true;
  auto gen = at::detail::createCPUGenerator(12);
  auto p = randn({6, 2, 3, 4}, gen).requires_grad_(true);
  ParamGroup g;
  g.params = {p};
  g.options = o;
  Optimizer opt({g});
  at::Tensor W0 = ref::f64(p).reshape({6, 24}), W = W0.clone(), M = at::zeros_like(W);
  for (int t = 0; t < 10; ++t) {
    auto G = randn({6, 2, 3, 4}, gen);
    p.mutable_grad() = G;
    M = M * o.momentum + ref::f64(G).reshape({6, 24});
    W = ref::apply(W, ref::newton_schulz(M, "polar_express", 5), o.lr, o.lr * std::sqrt(6.0 / 24.0),
                   o.weight_decay, false);
    opt.step();
  }
  EXPECT_LT(ref::rel(ref::f64(p).reshape({6, 24}) - W0, W - W0), kTol);
}

// NorMuon variance update on its own: V = (1−β₂)·mean_j U² after one step from zero.
TEST(OptimNorMuon, VarianceUpdate) {
  auto o = matrix_options(Algorithm::NorMuon);
  o.normuon_beta2 = 0.8;
  auto p = at::randn({10, 30}, at::kDouble).requires_grad_(true);
  ParamGroup g;
  g.params = {p};
  g.options = o;
  Optimizer opt({g});
  auto G = at::randn({10, 30}, at::kDouble);
  p.mutable_grad() = G;
  opt.step();
  at::Tensor U = ref::newton_schulz(G, "polar_express", 5);
  at::Tensor V = (U * U).mean(1, true) * (1 - 0.8);
  EXPECT_LT(ref::rel(opt.param_state(0, 0).at("variance"), V), kTol);
}

// normuon_normalize on its own: batched [B, rows, cols] bf16 / fp16 / fp32 / fp64 inputs (and a
// transposed view, as NS returns tall matrices) against the §4 formula in plain float64, per
// matrix, on the input's exact values.
//
// Tolerance, elementwise relative: Û_rc = U_rc · f_r exactly in the reference, and the function
// computes U_rc · f_r with one rounding, so |Û − Û_ref| <= (err(f_r) + u)·|Û_ref| with u the unit
// roundoff of the compute dtype (fp32: 2^-24 ≈ 6e-8, also for bf16/fp16 input, whose values
// fp32 holds exactly; fp64: 2^-53 ≈ 1.1e-16). f_r comes from a sum of `cols` positive squares
// (relative error <= cols·u), the V blend, sqrt and reciprocal (a few u), and two sums of `rows`
// positive terms under a sqrt (<= rows·u / 2 each): err(f_r) <= (1.5·cols + rows + 20)·u
// ≈ 130·u for these shapes (<= 48 × 48), i.e. 8e-6 in fp32 and 1.5e-14 in fp64: bounds 1e-5
// and 1e-13. A Û rounded to bf16 (2^-9 ≈ 2e-3) or fp16 (2^-11) fails them by orders of magnitude.
// The new V is a shorter chain of the same terms (same bounds).
TEST(OptimNorMuon, NormalizeMatchesFloat64Formula) {
  auto gen = at::detail::createCPUGenerator(777);
  const double beta2 = 0.95, eps = 1e-8;
  // The §4 formula for one matrix U [rows, cols] and V [rows, 1], fp64.
  auto formula = [&](const at::Tensor& U, const at::Tensor& V) -> std::pair<at::Tensor, at::Tensor> {
    at::Tensor V_new = V * beta2 + (U * U).mean(1, true) * (1 - beta2);
    at::Tensor Uh = U / (V_new.sqrt() + eps);
    Uh = Uh * (U.norm().item<double>() / std::max(Uh.norm().item<double>(), 1e-8));
    return {Uh, V_new};
  };
  struct Case {
    at::ScalarType dtype;
    std::vector<int64_t> sizes;  // [B, rows, cols]
    bool transposed;             // U a transposed view of a contiguous [B, cols, rows]
    bool zero_variance;          // first step: V = 0
  };
  const std::vector<Case> cases = {
      {at::kBFloat16, {3, 24, 40}, false, false}, {at::kBFloat16, {2, 48, 16}, true, true},
      {at::kHalf, {3, 24, 40}, false, false},     {at::kFloat, {3, 24, 40}, false, false},
      {at::kFloat, {2, 48, 16}, true, false},     {at::kFloat, {4, 16, 16}, false, true},
      {at::kDouble, {3, 24, 40}, false, false},   {at::kDouble, {2, 48, 16}, true, true}};
  for (const auto& c : cases) {
    const int64_t B = c.sizes[0], rows = c.sizes[1], cols = c.sizes[2];
    // Entries ~ 1/sqrt(cols) with rows of different scales (as an orthogonalized update).
    at::Tensor U = c.transposed ? randn({B, cols, rows}, gen, c.dtype).transpose(-2, -1)
                                : randn({B, rows, cols}, gen, c.dtype);
    U = (U.to(at::kDouble) * (at::rand({B, rows, 1}, gen, at::kDouble) + 0.1) / std::sqrt(double(cols)))
            .to(c.dtype);
    if (c.transposed) U = U.transpose(-2, -1).contiguous().transpose(-2, -1);
    U.select(0, 0).select(0, 1).zero_();  // a zero row
    const at::Tensor V = c.zero_variance ? at::zeros({B, rows, 1})
                                         : at::rand({B, rows, 1}, gen, at::kDouble).div(cols).to(at::kFloat);
    const std::string what = std::string(c10::toString(c.dtype)) + (c.transposed ? " transposed" : "") +
                             (c.zero_variance ? " V=0" : "");
    ASSERT_EQ(U.is_contiguous(), !c.transposed) << what;

    auto [U_hat, V_new] = orthopt::optim_detail::normuon_normalize(U, V, beta2, eps);
    const at::ScalarType expect = c.dtype == at::kDouble ? at::kDouble : at::kFloat;
    EXPECT_EQ(U_hat.scalar_type(), expect) << what;
    EXPECT_EQ(V_new.scalar_type(), expect) << what;
    ASSERT_EQ(U_hat.sizes(), U.sizes()) << what;
    ASSERT_EQ(V_new.sizes(), V.sizes()) << what;

    const double tol = c.dtype == at::kDouble ? 1e-13 : 1e-5;
    double worst_U = 0, worst_V = 0;
    for (int64_t b = 0; b < B; ++b) {
      auto [Uh_ref, V_ref] = formula(U[b].to(at::kDouble), V[b].to(at::kDouble));
      // Elementwise relative error (the reference's zeros must come out as exact zeros).
      const at::Tensor dU = (U_hat[b].to(at::kDouble) - Uh_ref).abs();
      EXPECT_TRUE(at::all(dU <= tol * Uh_ref.abs()).item<bool>()) << what << " matrix " << b;
      worst_U = std::max(worst_U, (dU / Uh_ref.abs().clamp_min(1e-300)).max().item<double>());
      const at::Tensor dV = (V_new[b].to(at::kDouble) - V_ref).abs();
      EXPECT_TRUE(at::all(dV <= tol * V_ref.abs()).item<bool>()) << what << " matrix " << b;
      worst_V = std::max(worst_V, (dV / V_ref.abs().clamp_min(1e-300)).max().item<double>());
    }
    std::cout << "normuon_normalize " << what << " " << at::IntArrayRef(c.sizes) << ": max rel err U_hat "
              << worst_U << ", V " << worst_V << "\n";
  }
}

// ---------------------------------------------------------------- Dion3

// Reference Dion3 step on one matrix (algorithms.md §5); returns the selected rows.
at::Tensor dion3_ref(at::Tensor W, at::Tensor M, at::Tensor V, const at::Tensor& G, const GroupOptions& o) {
  M.add_(G);
  const int64_t rows = M.size(0);
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.fraction * rows)));
  at::Tensor S = std::get<1>(M.abs().sum(1).topk(k));
  at::Tensor Ms = M.index_select(0, S).clone();
  M.index_copy_(0, S, Ms * o.momentum);
  at::Tensor U = ref::newton_schulz(Ms, "polar_express", 5);
  at::Tensor Vs = V.index_select(0, S);
  at::Tensor Uh = ref::normuon(U, Vs, o.normuon_beta2, o.normuon_eps);
  V.index_copy_(0, S, Vs);
  at::Tensor D = at::zeros_like(W);
  D.index_copy_(0, S, Uh);
  double adj = ref::lr_factor("spectral_norm", rows, M.size(1));  // full matrix shape
  if (o.scale_lr_by_fraction) adj /= std::sqrt(o.fraction);
  W.copy_(ref::apply(W, D, o.lr, o.lr * adj, o.weight_decay, o.cautious_weight_decay));
  return S;
}

TEST(OptimDion3, MatchesReference) {
  for (double f : {0.25, 0.5, 1.0}) {
    for (bool scale : {false, true}) {
      auto o = matrix_options(Algorithm::Dion3);
      o.fraction = f;
      o.scale_lr_by_fraction = scale;
      // Cautious decay (with a large wd so a wrong mask shows) on one of the configurations.
      o.cautious_weight_decay = f == 0.5 && scale;
      if (o.cautious_weight_decay) o.weight_decay = 5.0;
      auto step = [&](RefParam& r, const at::Tensor& G, size_t) {
        for (int64_t b = 0; b < r.W.size(0); ++b) dion3_ref(r.W[b], r.M[b], r.V[b], G[b], o);
      };
      const double one = compare(o, 1, step), ten = compare(o, 10, step);
      std::cout << "dion3 f=" << f << " scale_lr=" << scale << ": rel err 1 step " << one << ", 10 steps " << ten
                << "\n";
      EXPECT_LT(one, kTol);
      EXPECT_LT(ten, kTol);
    }
  }
}

// Selection, error feedback on exactly the selected rows, untouched variance elsewhere, and
// k = max(1, ceil(f·rows)).
TEST(OptimDion3, SelectionSemantics) {
  for (auto [rows, f] : std::vector<std::pair<int64_t, double>>{{10, 0.25}, {10, 0.01}, {10, 1.0}, {7, 0.5}}) {
    auto o = matrix_options(Algorithm::Dion3);
    o.fraction = f;
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(f * rows)));
    auto p = at::randn({rows, 12}, at::kDouble).requires_grad_(true);
    ParamGroup g;
    g.params = {p};
    g.options = o;
    Optimizer opt({g});
    // Step 1 from zero state, then step 2 to see accumulation and untouched variance.
    at::Tensor M_expected = at::zeros({rows, 12}, at::kDouble);
    for (int t = 0; t < 2; ++t) {
      auto G = at::randn({rows, 12}, at::kDouble);
      // Make the top rows obvious: scale some rows up so the L1 ranking is unambiguous.
      G = G * at::linspace(1, 3, rows, at::kDouble).flip(0).roll(t * 3).unsqueeze(1);
      p.mutable_grad() = G;
      const at::Tensor V_before = opt.param_state(0, 0).empty() ? at::zeros({rows, 1}, at::kDouble)
                                                                 : opt.param_state(0, 0).at("variance").clone().to(at::kDouble);
      M_expected = M_expected + G;
      at::Tensor S = std::get<1>(M_expected.abs().sum(1).topk(k));
      at::Tensor selected = at::zeros({rows}, at::kBool).index_fill_(0, S, true);
      opt.step();
      const auto& st = opt.param_state(0, 0);
      at::Tensor M = st.at("momentum"), V = st.at("variance").to(at::kDouble);
      for (int64_t i = 0; i < rows; ++i) {
        const bool sel = selected[i].item<bool>();
        // Error feedback: selected rows scaled by μ, the others keep the full accumulation.
        at::Tensor expect_row = sel ? M_expected[i] * o.momentum : M_expected[i];
        EXPECT_LT(ref::rel(M[i], expect_row), 1e-12) << "row " << i << " selected=" << sel;
        if (sel)
          EXPECT_FALSE(at::equal(V[i], V_before[i])) << "variance of selected row " << i << " not updated";
        else
          EXPECT_TRUE(at::equal(V[i], V_before[i])) << "variance of unselected row " << i << " changed";
      }
      M_expected.index_copy_(0, S, M_expected.index_select(0, S) * o.momentum);
    }
  }
}

TEST(OptimDion3, RankFormula) {
  auto p = at::randn({10, 12}, at::kDouble).requires_grad_(true);
  for (auto [f, k] : std::vector<std::pair<double, int64_t>>{{0.25, 3}, {0.01, 1}, {1.0, 10}, {0.5, 5}}) {
    auto o = matrix_options(Algorithm::Dion3);
    o.fraction = f;
    ParamGroup g;
    g.params = {p};
    g.options = o;
    Optimizer opt({g});
    p.mutable_grad() = at::randn({10, 12}, at::kDouble);
    opt.step();
    EXPECT_EQ((opt.param_state(0, 0).at("variance") != 0).sum().item<int64_t>(), k) << "f=" << f;
  }
}

// ---------------------------------------------------------------- Dion2

// Reference Dion2 step on one matrix (dion's Dion2): Dion3's selection and error feedback on the
// shorter side (rows when rows <= cols, else columns), no normalization.
void dion2_ref(at::Tensor W, at::Tensor M, const at::Tensor& G, const GroupOptions& o) {
  M.add_(G);
  const int64_t rows = M.size(0), cols = M.size(1);
  const bool by_cols = rows > cols;
  at::Tensor X = by_cols ? M.t() : M;  // views: writes reach M
  const int64_t n = X.size(0);
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.fraction * n)));
  at::Tensor S = std::get<1>(X.abs().sum(1).topk(k));
  at::Tensor Xs = X.index_select(0, S).clone();
  X.index_copy_(0, S, Xs * o.momentum);
  at::Tensor U = ref::newton_schulz(Xs, "polar_express", 5);
  at::Tensor D = at::zeros({n, by_cols ? rows : cols}, W.options());
  D.index_copy_(0, S, U);
  if (by_cols) D = D.t();
  double adj = ref::lr_factor("spectral_norm", rows, cols);  // full matrix shape
  if (o.scale_lr_by_fraction) adj /= std::sqrt(o.fraction);
  W.copy_(ref::apply(W, D, o.lr, o.lr * adj, o.weight_decay, o.cautious_weight_decay));
}

TEST(OptimDion2, MatchesReference) {
  for (double f : {0.25, 0.5, 1.0}) {
    auto o = matrix_options(Algorithm::Dion2);
    o.fraction = f;
    o.momentum = 0.9;
    o.scale_lr_by_fraction = f == 0.5;
    auto step = [&](RefParam& r, const at::Tensor& G, size_t) {
      for (int64_t b = 0; b < r.W.size(0); ++b) dion2_ref(r.W[b], r.M[b], G[b], o);
    };
    const double one = compare(o, 1, step), ten = compare(o, 10, step);
    std::cout << "dion2 f=" << f << ": rel err 1 step " << one << ", 10 steps " << ten << "\n";
    EXPECT_LT(one, kTol);
    EXPECT_LT(ten, kTol);
  }
}

// ---------------------------------------------------------------- Dion

// Both orthonormalizations against the same float64 reference (Householder QR): for full-rank P
// the Cholesky QR2 Q differs only in column signs, which leave P·Qᵀ unchanged.
void check_dion_matches_reference(orthopt::DionQr qr) {
  auto o = matrix_options(Algorithm::Dion);
  o.dion_qr = qr;
  o.rank_fraction = 0.5;
  // The random initial Q is set through load_param_states so the reference knows it.
  auto init = [&](Optimizer& opt, std::vector<RefParam>& refs) {
    auto gen = at::detail::createCPUGenerator(77);
    std::vector<std::vector<Optimizer::StateDict>> states(1);
    for (size_t k = 0; k < kShapes.size(); ++k) {
      const auto& s = kShapes[k].sizes;
      const int64_t m = s[s.size() - 2], n = s.back();
      const int64_t r = static_cast<int64_t>(std::ceil(0.5 * std::min(m, n)));
      auto qsize = s;
      qsize[qsize.size() - 2] = n;
      qsize.back() = r;
      at::Tensor Q = at::randn(qsize, gen, at::TensorOptions().dtype(at::kFloat));
      states[0].push_back({{"momentum", at::zeros(s, at::kDouble)}, {"Q", Q}});
      refs[k].Q = ref::f64(Q).reshape({-1, n, r});
    }
    opt.load_param_states(states);
  };
  auto step = [&](RefParam& r, const at::Tensor& G, size_t) {
    for (int64_t b = 0; b < r.W.size(0); ++b) {
      at::Tensor M = r.M[b];
      M.add_(G[b]);
      at::Tensor P = std::get<0>(at::linalg_qr(at::matmul(M, r.Q[b])));
      at::Tensor R = at::matmul(M.t(), P);
      M.sub_(at::matmul(P, R.t()) * (1 - o.momentum));
      r.Q[b].copy_(R / (R.norm(2, {0}, true) + o.eps));
      const double adj = std::sqrt(static_cast<double>(r.W.size(1)) / static_cast<double>(r.W.size(2)));
      r.W[b].copy_(ref::apply(r.W[b], at::matmul(P, r.Q[b].t()), o.lr, o.lr * adj, o.weight_decay, false));
    }
  };
  // Dion computes in fp32 throughout (QR included): no NS amplification, same bound.
  const double one = compare(o, 1, step, kShapes, init), ten = compare(o, 10, step, kShapes, init);
  std::cout << "dion " << orthopt::to_string(qr) << ": rel err 1 step " << one << ", 10 steps " << ten << "\n";
  EXPECT_LT(one, kTol);
  EXPECT_LT(ten, kTol);
}

TEST(OptimDion, MatchesReference) { check_dion_matches_reference(orthopt::DionQr::Householder); }
TEST(OptimDion, CholeskyQrMatchesReference) { check_dion_matches_reference(orthopt::DionQr::Cholesky); }

// A plain float64 QR for the test: modified Gram–Schmidt, each column twice ("twice is enough"),
// R with a positive diagonal (the convention of a Cholesky QR).
at::Tensor mgs2_q(const at::Tensor& P) {
  at::Tensor A = P.to(at::kDouble).contiguous().clone();
  const int64_t m = A.size(0), r = A.size(1);
  auto a = A.accessor<double, 2>();
  for (int64_t j = 0; j < r; ++j) {
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        double d = 0;
        for (int64_t i = 0; i < m; ++i) d += a[i][k] * a[i][j];
        for (int64_t i = 0; i < m; ++i) a[i][j] -= d * a[i][k];
      }
    double n = 0;
    for (int64_t i = 0; i < m; ++i) n += a[i][j] * a[i][j];
    n = std::sqrt(n);
    for (int64_t i = 0; i < m; ++i) a[i][j] /= n;
  }
  return A;
}

// Random m×r matrix with singular values spread log-uniformly over [1/cond, 1].
at::Tensor with_condition(int64_t m, int64_t r, double cond, at::Generator& gen) {
  const at::Tensor U = std::get<0>(at::linalg_qr(at::randn({m, r}, gen, at::kDouble)));
  const at::Tensor V = std::get<0>(at::linalg_qr(at::randn({r, r}, gen, at::kDouble)));
  const at::Tensor s = at::pow(cond, -at::linspace(0, 1, r, at::kDouble));
  return at::matmul(U * s, V.t()).to(at::kFloat);
}

TEST(OptimDion, CholeskyQr2MatchesFloat64Qr) {
  using orthopt::optim_detail::cholesky_qr2_q;
  auto gen = at::detail::createCPUGenerator(91);
  for (double cond : {1.0, 1e2, 1e4, 1e6, 1e7}) {
    // A batch of three tall matrices, as a Dion bank passes them.
    at::Tensor P = at::stack({with_condition(200, 24, cond, gen), with_condition(200, 24, cond, gen),
                              with_condition(200, 24, cond, gen)});
    const auto q = cholesky_qr2_q(P);
    ASSERT_TRUE(q.ok.all().item<bool>()) << "cond " << cond;
    ASSERT_EQ(q.Q.scalar_type(), at::kFloat);
    ASSERT_EQ(q.Q.sizes(), P.sizes());
    double worst_q = 0, worst_orth = 0;
    for (int64_t b = 0; b < 3; ++b) {
      const at::Tensor Q = q.Q[b].to(at::kDouble);
      worst_q = std::max(worst_q, (Q - mgs2_q(P[b])).abs().max().item<double>());
      worst_orth = std::max(worst_orth, (at::matmul(Q.t(), Q) - at::eye(24, at::kDouble)).abs().max().item<double>());
    }
    std::cout << "cholesky qr2 cond " << cond << ": max |Q - Q_ref| " << worst_q << ", max |QtQ - I| " << worst_orth
              << "\n";
    // Q is rounded to fp32 (entries <= 1: half an ulp 6e-8) after an fp64 computation whose error
    // grows like cond·1e-16 (<= 1e-9 here); the reference sees the same fp32 P. A few ulps of
    // slack: 1e-7 for Q, 2e-7 for QᵀQ − I (sums of 200 products of rounded entries).
    EXPECT_LT(worst_q, 1e-7) << "cond " << cond;
    EXPECT_LT(worst_orth, 2e-7) << "cond " << cond;
  }
}

// The blocked Householder QR (the GPU's householder_q, here with its ATen panel) against the
// float64 Gram–Schmidt Q, column signs aligned (Householder's R diagonal is −sign(α)·‖x‖).
TEST(OptimDion, BlockedHouseholderQrMatchesFloat64Qr) {
  using orthopt::optim_detail::householder_q_blocked;
  auto gen = at::detail::createCPUGenerator(94);
  const double eps32 = 5.96e-8;  // fp32 unit roundoff
  for (double cond : {1.0, 1e2, 1e4}) {
    for (const auto& [m, r, panel] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {200, 24, 32}, {200, 24, 7}, {200, 24, 1}, {61, 61, 16}, {300, 70, 32}, {600, 300, 8}}) {
      const at::Tensor P = at::stack({with_condition(m, r, cond, gen), with_condition(m, r, cond, gen)});
      const at::Tensor Q = householder_q_blocked(P, panel, /*kernel_panel=*/false);
      ASSERT_EQ(Q.sizes(), P.sizes());
      ASSERT_EQ(Q.scalar_type(), at::kFloat);
      double worst_q = 0, worst_orth = 0, worst_span = 0;
      for (int64_t b = 0; b < 2; ++b) {
        const at::Tensor Qd = Q[b].to(at::kDouble), ref = mgs2_q(P[b]), Pd = P[b].to(at::kDouble);
        const at::Tensor signs = (Qd * ref).sum(0).sign();
        worst_q = std::max(worst_q, (Qd - ref * signs).abs().max().item<double>());
        worst_orth = std::max(worst_orth, (at::matmul(Qd.t(), Qd) - at::eye(r, at::kDouble)).abs().max().item<double>());
        const at::Tensor resid = Pd - at::matmul(Qd, at::matmul(Qd.t(), Pd));
        worst_span = std::max(worst_span, (resid.norm() / Pd.norm()).item<double>());
      }
      std::cout << "blocked householder " << m << "x" << r << " panel " << panel << " cond " << cond
                << ": max |Q - Q_ref| " << worst_q << ", max |QtQ - I| " << worst_orth << ", span residual "
                << worst_span << "\n";
      // Householder QR is backward stable: Q orthogonal to a small multiple of ε·m whatever the
      // condition (3ε·m bounds the sums of m rounded products here), P in Q's span to a few ε·√m,
      // and Q itself within ≈ ε·cond of the exact factor (a perturbation of P of relative size ε
      // moves Q by up to cond times that; 100ε·cond leaves room for the constant).
      EXPECT_LT(worst_orth, 3 * eps32 * m) << m << "x" << r << " panel " << panel << " cond " << cond;
      EXPECT_LT(worst_span, 20 * eps32 * std::sqrt(double(m))) << m << "x" << r << " panel " << panel;
      EXPECT_LT(worst_q, 100 * eps32 * cond) << m << "x" << r << " panel " << panel << " cond " << cond;
    }
  }
}

// Blocked and LAPACK's Householder take the same reflectors: equal Q up to rounding; a zero
// column or a zero matrix still gives an orthonormal, finite Q; each matrix of a batch is
// factored on its own.
TEST(OptimDion, BlockedHouseholderQrEdgeCases) {
  using orthopt::optim_detail::householder_q_blocked;
  auto gen = at::detail::createCPUGenerator(95);
  const at::Tensor good = with_condition(90, 20, 10.0, gen);
  const at::Tensor lapack = std::get<0>(at::linalg_qr(good, "reduced"));
  // cond 10: Q moves by ≈ 10·ε per unit of P's rounding; 2e-5 leaves room for m = 90 sums.
  EXPECT_LT((householder_q_blocked(good, 8, false) - lapack).abs().max().item<double>(), 2e-5);
  at::Tensor zero_col = good.clone();
  zero_col.select(1, 5).zero_();
  const at::Tensor batch = at::stack({good, zero_col, at::zeros_like(good), good * 1e-30, good * 1e30});
  const at::Tensor Q = householder_q_blocked(batch, 8, false);
  ASSERT_TRUE(at::isfinite(Q).all().item<bool>());
  for (int64_t b = 0; b < batch.size(0); ++b) {
    const at::Tensor Qd = Q[b].to(at::kDouble);
    EXPECT_LT((at::matmul(Qd.t(), Qd) - at::eye(20, at::kDouble)).abs().max().item<double>(), 3 * 5.96e-8 * 90)
        << "matrix " << b;
  }
  EXPECT_TRUE(at::equal(Q[0], householder_q_blocked(good, 8, false)));
  // The scaled copies take the same reflectors: the fp64 norms neither overflow nor underflow.
  EXPECT_LT((Q[3] - Q[0]).abs().max().item<double>(), 1e-5);
  EXPECT_LT((Q[4] - Q[0]).abs().max().item<double>(), 1e-5);
  EXPECT_THROW(householder_q_blocked(good.t(), 8, false), c10::Error);  // m < r
  EXPECT_THROW(householder_q_blocked(good.to(at::kDouble), 8, false), c10::Error);
}

// The blocked QR's split inner products (used on GPUs) against a float64 product, on strided
// views as the QR passes them: fp32 sums of L = 512 products of unit-size Gaussians, ≈ √512·ε
// relative of terms of size ≈ √512: 1e-4 absolute is ≈ 40× that.
TEST(OptimDion, SplitInnerProductsMatchFloat64) {
  using orthopt::optim_detail::split_inner_products;
  auto gen = at::detail::createCPUGenerator(96);
  const at::Tensor big = at::randn({3, 600, 40}, gen, at::kFloat);
  const at::Tensor X = big.narrow(1, 88, 512).narrow(2, 3, 7), Y = big.narrow(1, 88, 512).narrow(2, 10, 30);
  const at::Tensor ref = at::matmul(X.to(at::kDouble).transpose(1, 2), Y.to(at::kDouble));
  for (int64_t s : {1, 2, 4, 8, 512}) {
    const at::Tensor got = split_inner_products(X, Y, s);
    ASSERT_EQ(got.sizes(), at::IntArrayRef({3, 7, 30}));
    EXPECT_LT((got.to(at::kDouble) - ref).abs().max().item<double>(), 1e-4) << "splits " << s;
    // Operands whose chunks are a view (contiguous copies): the one-product form.
    const at::Tensor got_c = split_inner_products(X.contiguous(), Y.contiguous(), s);
    EXPECT_LT((got_c.to(at::kDouble) - ref).abs().max().item<double>(), 1e-4) << "contiguous, splits " << s;
  }
  EXPECT_THROW(split_inner_products(X, Y, 3), c10::Error);  // 512 % 3 != 0
  EXPECT_THROW(split_inner_products(X, Y.narrow(1, 0, 500), 2), c10::Error);
  EXPECT_EQ(orthopt::optim_detail::inner_product_splits(X, 30), 1);  // CPU tensors: no split
}

TEST(OptimDion, CholeskyQr2ReportsFailure) {
  using orthopt::optim_detail::cholesky_qr2_q;
  auto gen = at::detail::createCPUGenerator(92);
  at::Tensor good = with_condition(50, 8, 10.0, gen);
  at::Tensor zero_col = good.clone();
  zero_col.select(1, 3).zero_();
  at::Tensor nan_entry = good.clone();
  nan_entry[7][2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(cholesky_qr2_q(good).ok.item<bool>());
  EXPECT_FALSE(cholesky_qr2_q(zero_col).ok.item<bool>());
  EXPECT_FALSE(cholesky_qr2_q(nan_entry).ok.item<bool>());
  // In a batch, per matrix: a bad one does not fail its neighbours.
  const at::Tensor ok = cholesky_qr2_q(at::stack({good, zero_col, good * 3, nan_entry})).ok;
  ASSERT_EQ(ok.sizes(), at::IntArrayRef({4}));
  EXPECT_TRUE(ok[0].item<bool>());
  EXPECT_FALSE(ok[1].item<bool>());
  EXPECT_TRUE(ok[2].item<bool>());
  EXPECT_FALSE(ok[3].item<bool>());
}

// A parameter whose P is rank-deficient (a zero column in its Q) takes the Householder QR:
// bit-identical to the Householder optimizer. The others of the group keep the Cholesky QR
// (close to, not equal to, Householder's), also the one of the same shape that shared its
// batched factorization.
TEST(OptimDion, CholeskyQrFallsBackPerParameter) {
  auto gen = at::detail::createCPUGenerator(93);
  const std::vector<std::vector<int64_t>> shapes = {{12, 10}, {12, 10}, {9, 14}};
  std::vector<at::Tensor> W0, Q0, G;
  for (const auto& s : shapes) {
    W0.push_back(randn(s, gen, at::kFloat));
    Q0.push_back(randn({s[1], 5}, gen, at::kFloat));  // r = ⌈0.5·min(m, n)⌉ = 5 for all three
    G.push_back(randn(s, gen, at::kFloat));
  }
  Q0[0].select(1, 2).zero_();
  std::vector<at::Tensor> after[2];
  for (int k = 0; k < 2; ++k) {
    ParamGroup g;
    g.options = matrix_options(Algorithm::Dion);
    g.options.rank_fraction = 0.5;
    g.options.dion_qr = k == 0 ? orthopt::DionQr::Householder : orthopt::DionQr::Cholesky;
    std::vector<Optimizer::StateDict> states;
    for (size_t i = 0; i < shapes.size(); ++i) {
      g.params.push_back(W0[i].clone().requires_grad_(true));
      states.push_back({{"momentum", at::zeros_like(W0[i])}, {"Q", Q0[i]}});
    }
    Optimizer opt({g});
    opt.load_param_states({states});
    for (size_t i = 0; i < shapes.size(); ++i) g.params[i].mutable_grad() = G[i];
    opt.step();
    for (size_t i = 0; i < shapes.size(); ++i) after[k].push_back(g.params[i].detach().clone());
    EXPECT_TRUE(at::isfinite(after[k][0]).all().item<bool>());
    EXPECT_EQ(opt.dion_qr_fallbacks(), k == 0 ? 0 : 1);
  }
  EXPECT_TRUE(at::equal(after[0][0], after[1][0])) << "the rank-deficient parameter fell back to Householder";
  for (size_t i = 1; i < shapes.size(); ++i) {
    EXPECT_FALSE(at::equal(after[0][i], after[1][i])) << "parameter " << i << " kept the Cholesky QR";
    const double rel = ((after[1][i] - after[0][i]).norm() / (after[0][i] - W0[i]).norm()).item<double>();
    EXPECT_LT(rel, 1e-5) << "parameter " << i << " agrees with Householder's update to fp32 precision";
  }
}

// ---------------------------------------------------------------- Lion

TEST(OptimLion, MatchesReference) {
  GroupOptions o;
  o.algorithm = Algorithm::Lion;
  o.lr = 1e-3;
  o.weight_decay = 0.5;
  o.beta1 = 0.9;
  o.beta2 = 0.99;
  std::vector<Shape> shapes = {{"vec", {1, 33}}, {"mat", {9, 13}}};
  auto step = [&](RefParam& r, const at::Tensor& G, size_t) {
    at::Tensor D = (r.M * o.beta1 + G * (1 - o.beta1)).sign();
    r.M = r.M * o.beta2 + G * (1 - o.beta2);
    r.W = ref::apply(r.W, D, o.lr, o.lr, o.weight_decay, false);
  };
  // float64 params: Lion computes in float64 there, so only rounding (1e-15) differs.
  const double ten = compare(o, 10, step, shapes);
  std::cout << "lion: rel err 10 steps " << ten << "\n";
  EXPECT_LT(ten, 1e-12);
}

// ---------------------------------------------------------------- master weights

// bf16 params with fp32 master weights follow the fp32 trajectory; the bf16 param is the
// master rounded to bf16 after every step.
TEST(OptimMasterWeights, Bf16ParamsFollowFp32Master) {
  auto gen = at::detail::createCPUGenerator(3);
  auto o = matrix_options(Algorithm::Muon);
  o.master_weights = true;
  auto W32 = at::randn({16, 24}, gen, at::TensorOptions().dtype(at::kFloat));
  auto p = W32.to(at::kBFloat16).requires_grad_(true);
  ParamGroup g;
  g.params = {p};
  g.options = o;
  Optimizer opt({g});
  at::Tensor W0 = ref::f64(p), W = W0.clone(), M = at::zeros_like(W);
  for (int t = 0; t < 10; ++t) {
    auto G = at::randn({16, 24}, gen, at::TensorOptions().dtype(at::kFloat)).to(at::kBFloat16);
    p.mutable_grad() = G;
    M = M * o.momentum + ref::f64(G);
    at::Tensor U = ref::newton_schulz(M, "polar_express", 5);
    W = ref::apply(W, U, o.lr, o.lr * std::sqrt(16.0 / 24.0), o.weight_decay, false);
    opt.step();
    const auto& master = opt.param_state(0, 0).at("master");
    ASSERT_EQ(master.scalar_type(), at::kFloat);
    ASSERT_EQ(opt.param_state(0, 0).at("momentum").scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(p.detach(), master.to(at::kBFloat16))) << "step " << t;
  }
  // fp32 master storage: the fp32-params bound of test_optim_muon.cpp (5e-5).
  const double err = ref::rel(ref::f64(opt.param_state(0, 0).at("master")) - W0, W - W0);
  std::cout << "master weights: rel err 10 steps " << err << "\n";
  EXPECT_LT(err, 5e-5);
}

}  // namespace

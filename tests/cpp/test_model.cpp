// The trainer's transformer: shapes, causality, RoPE, attention, RMSNorm and MoE against plain
// float64 references, and how the parameters are routed to optimizers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "orthopt/optim.h"
#include "orthopt/train/model.h"

using namespace orthopt;
using namespace orthopt::train;

namespace {

ModelConfig small_config() {
  ModelConfig c = model_preset("tiny");
  c.d_model = 16; c.n_layers = 2; c.n_heads = 2; c.d_ff = 24; c.context = 12;
  return c;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST(Model, PresetsAndShapes) {
  torch::manual_seed(0);
  Transformer tiny(model_preset("tiny"));
  // "tiny ≈ 1M params" is a promise of the docs; keep it honest.
  EXPECT_GT(tiny->num_parameters(), 800000);
  EXPECT_LT(tiny->num_parameters(), 1200000);
  auto idx = torch::randint(0, 256, {3, 20}, torch::kLong);
  auto logits = tiny->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 20, 256}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  // Untrained model: the loss is near ln(256) (init std 0.02 keeps logits small).
  auto loss = tiny->loss(idx, torch::randint(0, 256, {3, 20}, torch::kLong)).lm.item<double>();
  EXPECT_NEAR(loss, std::log(256.0), 0.2);
  EXPECT_THROW(model_preset("huge"), c10::Error);
  EXPECT_THROW(tiny->forward(torch::randint(0, 256, {1, 129}, torch::kLong)), c10::Error);  // > context
  ModelConfig bad = small_config();
  bad.n_heads = 3;
  EXPECT_THROW(validate_model_config(bad), c10::Error);
}

TEST(Model, FutureTokensDoNotAffectPastLogits) {
  torch::manual_seed(1);
  Transformer model(small_config());
  model->eval();
  torch::NoGradGuard no_grad;
  auto a = torch::randint(0, 256, {2, 12}, torch::kLong);
  auto b = a.clone();
  const int64_t t = 7;
  b.slice(1, t, 12).random_(0, 256);  // change positions t.. only
  auto la = model->forward(a), lb = model->forward(b);
  // Masked attention weights are exactly 0, so earlier positions see identical inputs; the
  // tolerance only allows for a different summation order inside the kernels.
  EXPECT_LT(max_abs_diff(la.slice(1, 0, t), lb.slice(1, 0, t)), 1e-6);
  // And the test can fail: later positions do change.
  EXPECT_GT(max_abs_diff(la.slice(1, t, 12), lb.slice(1, t, 12)), 1e-4);
  // Changing one early token changes the logits after it.
  auto c = a.clone();
  c.index_put_({0, 2}, (a.index({0, 2}).item<int64_t>() + 1) % 256);
  auto lc = model->forward(c);
  EXPECT_GT(max_abs_diff(la.index({0}).slice(0, 2, 12), lc.index({0}).slice(0, 2, 12)), 1e-4);
  EXPECT_LT(max_abs_diff(la.index({0}).slice(0, 0, 2), lc.index({0}).slice(0, 0, 2)), 1e-6);
}

TEST(Model, RopeMatchesPlainRotation) {
  torch::manual_seed(2);
  const int64_t T = 9, hd = 8;
  const double base = 10000.0;
  auto x = torch::randn({2, 3, T, hd});
  auto tables = rope_tables(T, hd, base, c10::kCPU);
  auto y = apply_rope(x, tables.first, tables.second);
  auto xd = x.to(at::kDouble);
  auto acc = xd.accessor<double, 4>();
  double worst = 0.0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t pos = 0; pos < T; ++pos)
        for (int64_t i = 0; i < hd / 2; ++i) {
          const double angle = pos * std::pow(base, -2.0 * i / hd);
          const double x1 = acc[b][h][pos][i], x2 = acc[b][h][pos][i + hd / 2];
          const double r1 = x1 * std::cos(angle) - x2 * std::sin(angle);
          const double r2 = x1 * std::sin(angle) + x2 * std::cos(angle);
          worst = std::max({worst, std::abs(r1 - y[b][h][pos][i].item<double>()),
                            std::abs(r2 - y[b][h][pos][i + hd / 2].item<double>())});
        }
  // fp32 tables and products of O(1) values: a few ulp of 1 (1.2e-7 each).
  EXPECT_LT(worst, 2e-6);
  // The property RoPE exists for: <R(m)q, R(n)k> depends on m − n only.
  auto q = torch::randn({1, 1, 1, hd}).expand({1, 1, T, hd}).contiguous();
  auto k = torch::randn({1, 1, 1, hd}).expand({1, 1, T, hd}).contiguous();
  auto rq = apply_rope(q, tables.first, tables.second), rk = apply_rope(k, tables.first, tables.second);
  const double d03 = (rq[0][0][0] * rk[0][0][3]).sum().item<double>();
  const double d47 = (rq[0][0][4] * rk[0][0][7]).sum().item<double>();
  const double d40 = (rq[0][0][4] * rk[0][0][0]).sum().item<double>();
  EXPECT_NEAR(d03, d47, 1e-5);
  EXPECT_GT(std::abs(d03 - d40), 1e-3);  // but not on m and n symmetrically
}

TEST(Model, AttentionAndNormMatchFloat64Reference) {
  torch::manual_seed(3);
  ModelConfig cfg = small_config();
  CausalSelfAttention attn(cfg);
  attn->to(at::kDouble);
  const int64_t B = 2, T = 5, D = cfg.d_model, H = cfg.n_heads, hd = D / H;
  auto x = torch::randn({B, T, D}, at::kDouble);
  auto tables = rope_tables(T, hd, cfg.rope_base, c10::kCPU);
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = attn->forward(x, tables.first, tables.second);
  }
  // Plain reference: per head, rotate q and k, softmax over j <= i, weighted sum of v.
  auto W = attn->qkv->weight.detach();  // [3D, D]
  auto q = at::matmul(x, W.slice(0, 0, D).t()), k = at::matmul(x, W.slice(0, D, 2 * D).t()),
       v = at::matmul(x, W.slice(0, 2 * D, 3 * D).t());
  auto rot = [&](const at::Tensor& m, int64_t b, int64_t pos, int64_t h) {
    std::vector<double> out(hd);
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double a = pos * std::pow(cfg.rope_base, -2.0 * i / hd);
      const double x1 = m[b][pos][h * hd + i].item<double>(), x2 = m[b][pos][h * hd + i + hd / 2].item<double>();
      out[i] = x1 * std::cos(a) - x2 * std::sin(a);
      out[i + hd / 2] = x1 * std::sin(a) + x2 * std::cos(a);
    }
    return out;
  };
  auto ref = torch::zeros({B, T, D}, at::kDouble);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const auto qi = rot(q, b, i, h);
        std::vector<double> w;
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          const auto kj = rot(k, b, j, h);
          double s = 0;
          for (int64_t e = 0; e < hd; ++e) s += qi[e] * kj[e];
          w.push_back(s / std::sqrt(static_cast<double>(hd)));
          mx = std::max(mx, w.back());
        }
        double z = 0;
        for (auto& s : w) z += (s = std::exp(s - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += w[j] / z * v[b][j][h * hd + e].item<double>();
          ref[b][i][h * hd + e] = acc;
        }
      }
  ref = at::matmul(ref, attn->proj->weight.detach().t());
  // float64 throughout except the fp32 RoPE tables (|error| ~1e-7 relative on O(1) values).
  EXPECT_LT(max_abs_diff(y, ref), 1e-5);

  RMSNorm norm(D, 1e-6);
  {
    torch::NoGradGuard no_grad;
    norm->weight.uniform_(0.5, 1.5);
  }
  auto xn = torch::randn({3, D});
  auto yn = norm->forward(xn);
  for (int64_t r = 0; r < 3; ++r) {
    double ms = 0;
    for (int64_t e = 0; e < D; ++e) ms += std::pow(xn[r][e].item<double>(), 2) / D;
    for (int64_t e = 0; e < D; ++e) {
      const double expect = xn[r][e].item<double>() / std::sqrt(ms + 1e-6) * norm->weight[e].item<double>();
      EXPECT_NEAR(yn[r][e].item<double>(), expect, 1e-5 * std::max(1.0, std::abs(expect)));  // fp32 rounding
    }
  }
}

TEST(Model, MoEMatchesPerTokenReferenceAndBalances) {
  torch::manual_seed(4);
  ModelConfig cfg = small_config();
  cfg.n_experts = 4; cfg.top_k = 2; cfg.router_bias_rate = 0.01;
  MoE moe(cfg);
  for (auto& p : moe->parameters()) {
    torch::NoGradGuard no_grad;
    p.normal_(0.0, 0.3);
  }
  moe->to(at::kDouble);  // buffers too: the bias is float64 here
  {
    torch::NoGradGuard no_grad;
    moe->bias.copy_(torch::tensor({0.05, -0.02, 0.0, 0.1}));
  }
  const int64_t N = 10, D = cfg.d_model;
  auto x = torch::randn({1, N, D}, at::kDouble);
  at::Tensor z = torch::zeros({}, at::kFloat);
  moe->train();
  auto y = moe->forward(x, &z);
  // Reference per token: p = softmax(router·x); top-k of p + bias; gates p renormalized.
  double z_ref = 0;
  for (int64_t n = 0; n < N; ++n) {
    auto xn = x[0][n];
    auto logits = at::matmul(moe->router.detach(), xn);
    std::vector<double> p(cfg.n_experts), score(cfg.n_experts);
    double mx = logits.max().item<double>(), sum = 0;
    for (int64_t e = 0; e < cfg.n_experts; ++e) sum += (p[e] = std::exp(logits[e].item<double>() - mx));
    z_ref += std::pow(mx + std::log(sum), 2) / N;
    for (int64_t e = 0; e < cfg.n_experts; ++e) {
      p[e] /= sum;
      score[e] = p[e] + moe->bias[e].item<double>();
    }
    std::vector<int64_t> order(cfg.n_experts);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    double gsum = p[order[0]] + p[order[1]];
    auto expect = torch::zeros({D}, at::kDouble);
    for (int k = 0; k < 2; ++k) {
      const int64_t e = order[k];
      auto h = at::silu(at::matmul(moe->w_gate[e].detach(), xn)) * at::matmul(moe->w_up[e].detach(), xn);
      expect += p[e] / gsum * at::matmul(moe->w_down[e].detach(), h);
    }
    // Routing probabilities are fp32 by design (the logits of a float64 input are cast): ~1e-7 relative.
    EXPECT_LT(max_abs_diff(y[0][n], expect), 1e-5) << "token " << n;
  }
  EXPECT_NEAR(z.item<double>(), z_ref, 1e-4 * z_ref);
  // Loads: every token counted top_k times; bias moves toward the under-loaded experts.
  EXPECT_EQ(moe->load.sum().item<double>(), N * 2);
  auto load = moe->load.clone();
  auto bias_before = moe->bias.clone();
  moe->update_bias(torch::ones({}));
  auto step = moe->bias - bias_before;
  for (int64_t e = 0; e < cfg.n_experts; ++e) {
    const double l = load[e].item<double>(), m = load.mean().item<double>();
    EXPECT_NEAR(step[e].item<double>(), l < m ? 0.01 : (l > m ? -0.01 : 0.0), 1e-8);  // rate passes through fp32
  }
  EXPECT_EQ(moe->load.abs().sum().item<double>(), 0.0);
  // A skipped step (factor 0) leaves the bias unchanged.
  moe->forward(x, nullptr);
  auto held = moe->bias.clone();
  moe->update_bias(torch::zeros({}));
  EXPECT_TRUE(torch::equal(held, moe->bias));
  // Gradients reach the router through the gates.
  auto out = moe->forward(x, nullptr).pow(2).sum();
  out.backward();
  EXPECT_GT(moe->router.grad().abs().sum().item<double>(), 0.0);
}

TEST(Model, ParamRouting) {
  torch::manual_seed(5);
  ModelConfig cfg = small_config();
  Transformer model(cfg);
  RoutingOptions routing;
  auto groups = model->param_groups(routing);
  int64_t matrix = 0, scalar = 0, qkv_seen = 0;
  for (const auto& g : groups) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      const std::string& name = g.names.at(i);
      const bool is_matrix = is_matrix_algorithm(g.options.algorithm);
      if (name == "tok_emb.weight" || name == "lm_head.weight") {
        EXPECT_FALSE(is_matrix) << name;
        EXPECT_EQ(g.options.weight_decay, 0.0) << name;
      } else if (g.params[i].dim() == 1) {
        EXPECT_FALSE(is_matrix) << name;
      } else {
        EXPECT_TRUE(is_matrix) << name;
      }
      if (name.find("attn.qkv.weight") != std::string::npos) {
        ++qkv_seen;
        EXPECT_EQ(g.options.ortho.split_sizes, (std::vector<int64_t>{cfg.d_model, cfg.d_model, cfg.d_model}));
      } else if (is_matrix) {
        EXPECT_TRUE(g.options.ortho.split_sizes.empty()) << name;
      }
      (is_matrix ? matrix : scalar) += g.params[i].numel();
    }
  }
  EXPECT_EQ(qkv_seen, cfg.n_layers);
  EXPECT_EQ(matrix + scalar, model->num_parameters());

  // Dion3 selects rows of the whole fused matrix: no split there.
  RoutingOptions dion3;
  dion3.matrix.algorithm = Algorithm::Dion3;
  for (const auto& g : model->param_groups(dion3))
    if (is_matrix_algorithm(g.options.algorithm)) EXPECT_TRUE(g.options.ortho.split_sizes.empty());

  ModelConfig moe_cfg = cfg;
  moe_cfg.n_experts = 4;
  Transformer moe_model(moe_cfg);
  for (const auto& g : moe_model->param_groups(routing))
    for (size_t i = 0; i < g.params.size(); ++i) {
      if (g.names[i].find("moe.router") != std::string::npos) EXPECT_FALSE(is_matrix_algorithm(g.options.algorithm));
      if (g.params[i].dim() == 3) EXPECT_TRUE(is_matrix_algorithm(g.options.algorithm)) << g.names[i];
    }
}

// Activation checkpointing recomputes the same operations in the backward pass: the loss and
// every gradient keep their bits, for each mode, and for a micro-batch accumulated onto earlier
// gradients; the MoE model refuses it.
TEST(Model, ActivationCheckpointingKeepsLossAndGradientBits) {
  const auto grads_of = [](const std::string& mode) {
    ModelConfig c = small_config();
    c.activation_checkpointing = mode;
    torch::manual_seed(7);
    Transformer model(c);
    model->train();
    torch::manual_seed(8);
    const at::Tensor idx = torch::randint(0, 256, {3, c.context}, at::kLong);
    const at::Tensor targets = torch::randint(0, 256, {3, c.context}, at::kLong);
    std::vector<at::Tensor> out;
    for (int micro = 0; micro < 2; ++micro) {  // the second one accumulates onto the first
      const LossParts loss = model->loss(idx.roll(micro, 1), targets);
      loss.total.backward();
      out.push_back(loss.total.detach().clone());
    }
    for (const auto& p : model->parameters()) {
      EXPECT_TRUE(p.grad().defined());
      out.push_back(p.grad().clone());
    }
    return out;
  };
  const auto kept = grads_of("none");
  for (const std::string mode : {"block", "selective"}) {
    const auto recomputed = grads_of(mode);
    ASSERT_EQ(recomputed.size(), kept.size());
    for (size_t i = 0; i < kept.size(); ++i)
      EXPECT_TRUE(torch::equal(kept[i], recomputed[i])) << mode << ": tensor " << i << " differs by "
                                                        << max_abs_diff(kept[i], recomputed[i]);
  }
  ModelConfig moe = small_config();
  moe.n_experts = 4;
  moe.activation_checkpointing = "block";
  EXPECT_THROW(
      {
        try {
          validate_model_config(moe);
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("activation_checkpointing"), std::string::npos);
          throw;
        }
      },
      c10::Error);
  moe.n_experts = 0;
  moe.activation_checkpointing = "sometimes";
  EXPECT_THROW(validate_model_config(moe), c10::Error);
}

// A recomputed function's intermediate tensors are not kept: with the function's output alone
// reachable from the graph, the saved tensors are its inputs only; and under no_grad it is the
// function itself.
TEST(Model, RecomputeInBackwardMatchesAutograd) {
  torch::manual_seed(3);
  const at::Tensor a = torch::randn({5, 7}, at::kDouble).requires_grad_(true);
  const at::Tensor b = torch::randn({7, 4}, at::kDouble).requires_grad_(true);
  const at::Tensor w = torch::randn({4}, at::kDouble).requires_grad_(true);  // used inside, not an input
  const auto fn = [&w](const std::vector<at::Tensor>& in) { return at::tanh(at::matmul(in[0], in[1])) * w; };
  const at::Tensor g = torch::randn({5, 4}, at::kDouble);
  fn({a, b}).backward(g);
  const at::Tensor ga = a.grad().clone(), gb = b.grad().clone(), gw = w.grad().clone();
  a.mutable_grad().reset();
  b.mutable_grad().reset();
  w.mutable_grad().reset();
  const at::Tensor out = recompute_in_backward(fn, {a, b});
  EXPECT_TRUE(torch::equal(out, fn({a, b}).detach()));
  out.backward(g);
  EXPECT_TRUE(torch::equal(a.grad(), ga));
  EXPECT_TRUE(torch::equal(b.grad(), gb));
  EXPECT_TRUE(torch::equal(w.grad(), gw));
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(recompute_in_backward(fn, {a, b}).requires_grad());
}

// The MoE layer against a per-token loop written here (float64, the module's routing repeated):
// outputs and every gradient, with k = 3 of 5 experts, so that experts get different numbers of
// tokens and one may get none.
TEST(Model, MoEMatchesPerTokenLoopWithGradients) {
  torch::manual_seed(11);
  ModelConfig cfg = small_config();
  cfg.n_experts = 5; cfg.top_k = 3;
  MoE moe(cfg);
  for (auto& p : moe->parameters()) {
    torch::NoGradGuard no_grad;
    p.normal_(0.0, 0.3);
  }
  moe->to(at::kDouble);
  {
    torch::NoGradGuard no_grad;
    moe->bias.copy_(torch::tensor({0.3, -0.2, 0.0, 0.1, -1.0}));  // expert 4 is rarely chosen
  }
  const int64_t N = 37, D = cfg.d_model;
  const at::Tensor x = torch::randn({1, N, D}, at::kDouble).requires_grad_(true);
  const at::Tensor R = torch::randn({1, N, D}, at::kDouble);
  moe->eval();  // no load counting
  (moe->forward(x, nullptr) * R).sum().backward();
  std::vector<at::Tensor> got = {x.grad().clone()};
  for (const auto& p : moe->parameters()) got.push_back(p.grad().clone());
  const at::Tensor y_got = moe->forward(x, nullptr).detach();
  x.mutable_grad().reset();
  for (auto& p : moe->parameters()) p.mutable_grad().reset();

  // Reference: the routing as the module computes it, then token by token.
  const at::Tensor flat = x.reshape({N, D});
  const at::Tensor logits = at::matmul(flat.to(at::kFloat), moe->router.to(at::kFloat).t());
  const at::Tensor probs = at::softmax(logits, -1);
  const at::Tensor chosen = std::get<1>((probs.detach() + moe->bias).topk(cfg.top_k, -1));
  at::Tensor gates = probs.gather(-1, chosen);
  gates = gates / gates.sum(-1, true);
  std::vector<at::Tensor> rows;
  for (int64_t n = 0; n < N; ++n) {
    at::Tensor acc = at::zeros({D}, at::kDouble);
    for (int64_t j = 0; j < cfg.top_k; ++j) {
      const int64_t e = chosen[n][j].item<int64_t>();
      const at::Tensor h = at::silu(at::matmul(moe->w_gate[e], flat[n])) * at::matmul(moe->w_up[e], flat[n]);
      acc = acc + at::matmul(moe->w_down[e], h) * gates[n][j].to(at::kDouble);
    }
    rows.push_back(acc);
  }
  const at::Tensor y_ref = at::stack(rows).view({1, N, D});
  (y_ref * R).sum().backward();
  std::vector<at::Tensor> want = {x.grad().clone()};
  for (const auto& p : moe->parameters()) want.push_back(p.grad().clone());

  EXPECT_GT(chosen.eq(0).sum().item<int64_t>(), chosen.eq(3).sum().item<int64_t>());  // uneven loads
  EXPECT_LT(max_abs_diff(y_got, y_ref.detach()), 1e-12);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // The router's gradient passes through the fp32 routing in both (same operations); the rest
    // is float64 throughout.
    const double scale = want[i].abs().max().item<double>() + 1e-30;
    EXPECT_LT(max_abs_diff(got[i], want[i]) / scale, 1e-6) << "gradient " << i;
  }
}

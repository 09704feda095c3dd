// Optimizer state handling: save -> load -> continue bit for bit, skip factor 0 leaves
// everything bit-identical, load refuses mismatches without changing anything, routing
// rules, and bad input errors naming the parameter and the option.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "orthopt/optim.h"

using orthopt::Algorithm;
using orthopt::GroupOptions;
using orthopt::Optimizer;
using orthopt::ParamGroup;

namespace {

at::Tensor randn(at::IntArrayRef sizes, at::Generator& gen) {
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
}

GroupOptions with(Algorithm a) {
  GroupOptions o;
  o.algorithm = a;
  return o;
}

// One group of every algorithm over fresh random params (a bf16 param with master weights
// in the muon group). Shapes are small: this is about state, not math.
struct Model {
  std::vector<ParamGroup> groups;
  std::vector<at::Tensor> all;

  explicit Model(uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    auto add = [&](GroupOptions o, std::vector<std::vector<int64_t>> shapes, at::ScalarType dtype = at::kFloat) {
      ParamGroup g;
      g.options = o;
      for (const auto& s : shapes) {
        auto p = randn(s, gen).to(dtype).requires_grad_(true);
        g.params.push_back(p);
        all.push_back(p);
      }
      groups.push_back(g);
    };
    add(with(Algorithm::Muon), {{12, 20}, {20, 12}, {2, 8, 8}});
    auto mw = with(Algorithm::Muon);
    mw.master_weights = true;
    add(mw, {{16, 16}}, at::kBFloat16);
    add(with(Algorithm::NorMuon), {{12, 20}});
    add(with(Algorithm::Dion3), {{16, 10}, {3, 8, 12}});
    add(with(Algorithm::Dion), {{16, 24}});
    add(with(Algorithm::AdamW), {{20}, {5, 5}});
    add(with(Algorithm::Lion), {{7}});
  }

  // Deterministic gradients for step t, independent of the parameter values.
  void set_grads(int t) {
    auto gen = at::detail::createCPUGenerator(1000 + t);
    for (auto& p : all) p.mutable_grad() = randn(p.sizes(), gen).to(p.scalar_type());
  }
};

std::vector<at::Tensor> snapshot(const Model& m, const Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.all) out.push_back(p.detach().clone());
  for (size_t g = 0; g < m.groups.size(); ++g)
    for (size_t i = 0; i < m.groups[g].params.size(); ++i)
      for (const auto& [name, t] : opt.param_state(g, i)) out.push_back(t.clone());
  return out;
}

bool bit_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type() || !at::equal(a[i], b[i]))
      return false;
  return true;
}

std::string save(const Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream s;
  archive.save_to(s);
  return s.str();
}

void load(Optimizer& opt, const std::string& bytes) {
  std::istringstream s(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(s);
  opt.load(archive);
}

TEST(OptimState, SaveLoadContinueIsBitIdentical) {
  Model a(1);
  Optimizer opt_a(a.groups);
  for (int t = 0; t < 3; ++t) {
    a.set_grads(t);
    opt_a.step();
  }
  const std::string bytes = save(opt_a);

  // A fresh model with the same parameter values and a fresh optimizer loading the state.
  Model b(2);
  for (size_t k = 0; k < a.all.size(); ++k) b.all[k].detach().copy_(a.all[k].detach());
  Optimizer opt_b(b.groups);
  load(opt_b, bytes);
  EXPECT_EQ(opt_b.step_count(), 3);
  EXPECT_TRUE(bit_equal(snapshot(a, opt_a), snapshot(b, opt_b)));

  for (int t = 3; t < 7; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    opt_a.step();
    opt_b.step();
  }
  EXPECT_TRUE(bit_equal(snapshot(a, opt_a), snapshot(b, opt_b)));
  EXPECT_EQ(opt_b.step_count(), 7);
}

TEST(OptimState, LoadMismatchThrowsAndChangesNothing) {
  Model a(1);
  Optimizer opt_a(a.groups);
  a.set_grads(0);
  opt_a.step();
  const std::string bytes = save(opt_a);

  // Other shapes: the first matrix is 12x21 instead of 12x20.
  {
    Model b(3);
    auto gen = at::detail::createCPUGenerator(4);
    b.groups[0].params[0] = randn({12, 21}, gen).requires_grad_(true);
    b.all[0] = b.groups[0].params[0];
    Optimizer opt_b(b.groups);
    b.set_grads(0);
    opt_b.step();
    const auto before = snapshot(b, opt_b);
    try {
      load(opt_b, bytes);
      ADD_FAILURE() << "load of mismatched shapes did not throw";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bit_equal(before, snapshot(b, opt_b)));
    EXPECT_EQ(opt_b.step_count(), 1);
  }
  // Another optimizer: group 0 is adamw instead of muon.
  {
    Model b(3);
    b.groups[0].options = with(Algorithm::AdamW);
    Optimizer opt_b(b.groups);
    const auto before = snapshot(b, opt_b);
    try {
      load(opt_b, bytes);
      ADD_FAILURE() << "load of another algorithm did not throw";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("algorithm 'muon'"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bit_equal(before, snapshot(b, opt_b)));
  }
}

TEST(OptimState, SkipFactorZeroIsBitIdentical) {
  Model a(7);
  Optimizer opt(a.groups);
  for (int t = 0; t < 2; ++t) {
    a.set_grads(t);
    opt.step();
  }
  const auto before = snapshot(a, opt);
  // A skipped step, with finite and with non-finite gradients (the firewall's case).
  opt.set_skip_factor(at::zeros({}));
  a.set_grads(2);
  opt.step();
  EXPECT_TRUE(bit_equal(before, snapshot(a, opt)));
  for (auto& p : a.all) p.mutable_grad().view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  opt.step();
  EXPECT_TRUE(bit_equal(before, snapshot(a, opt)));
  EXPECT_EQ(opt.step_count(), 2);

  // Skip factor 1 is a normal step, bit-identical to an optimizer that never skipped.
  Model b(7);
  Optimizer ref(b.groups);
  for (int t = 0; t < 3; ++t) {
    b.set_grads(t);
    ref.step();
  }
  opt.set_skip_factor(at::ones({}));
  a.set_grads(2);
  opt.step();
  EXPECT_TRUE(bit_equal(snapshot(a, opt), snapshot(b, ref)));
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(OptimState, StateBytesCountsState) {
  Model a(1);
  Optimizer opt(a.groups);
  EXPECT_EQ(opt.state_bytes(), 0);
  a.set_grads(0);
  opt.step();
  int64_t expected = 0;
  for (size_t g = 0; g < a.groups.size(); ++g)
    for (size_t i = 0; i < a.groups[g].params.size(); ++i)
      for (const auto& [n, t] : opt.param_state(g, i)) expected += t.numel() * t.element_size();
  EXPECT_EQ(opt.state_bytes(), expected);
  // muon 12x20 fp32 momentum alone is 960 bytes; everything together is more.
  EXPECT_GT(expected, 960);
}

// ---------------------------------------------------------------- routing

// Dion's initial Q: the single-process rule (checkpoints and runs depend on it: it must not
// change), and a parameter assembled from matrices of others taking their Q
// (set_initial_q_sources, what the distributed layers use).
namespace {
at::Tensor seeded_q(size_t g, size_t i, at::IntArrayRef sizes) {
  auto gen = at::detail::createCPUGenerator(0x6f72746f + 1000003ULL * g + i);
  return randn(sizes, gen);
}

// A skipped step creates the state without changing it.
void create_state(Optimizer& opt) {
  for (const auto& g : opt.param_groups())
    for (auto p : g.params) p.mutable_grad() = at::ones_like(p);
  opt.set_skip_factor(at::zeros({}));
  opt.step();
  opt.set_skip_factor(at::ones({}));
}
}  // namespace

TEST(OptimDionQ, SingleProcessSeedRule) {
  auto o = with(Algorithm::Dion);
  auto flat = o;
  flat.ortho.flatten = true;
  flat.rank_fraction = 0.5;
  std::vector<ParamGroup> groups(2);
  groups[0].options = with(Algorithm::Muon);
  groups[0].params = {at::randn({8, 8})};
  groups[1].options = o;
  groups[1].params = {at::randn({16, 40}), at::randn({40, 16}), at::randn({3, 16, 40})};
  ParamGroup fg;
  fg.options = flat;
  fg.params = {at::randn({8, 4, 6})};
  groups.push_back(fg);
  Optimizer opt(groups);
  create_state(opt);
  EXPECT_TRUE(at::equal(opt.param_state(1, 0).at("Q"), seeded_q(1, 0, {40, 4})));
  EXPECT_TRUE(at::equal(opt.param_state(1, 1).at("Q"), seeded_q(1, 1, {16, 4})));
  EXPECT_TRUE(at::equal(opt.param_state(1, 2).at("Q"), seeded_q(1, 2, {3, 40, 4})));
  EXPECT_TRUE(at::equal(opt.param_state(2, 0).at("Q"), seeded_q(2, 0, {24, 4})));  // [8, 24], r = 4
}

TEST(OptimDionQ, SourcesAssembleOtherParametersQ) {
  // A [4, 16, 40] piece holding matrix 2 of a [3,16,40] stack (param 3 of group 1), a whole
  // [16,40] (param 0 of group 1) and matrices 0..1 of a [2,2,16,40] stack (param 5 of group 1).
  ParamGroup piece;
  piece.options = with(Algorithm::Dion);
  piece.params = {at::randn({4, 16, 40}), at::randn({16, 40})};
  Optimizer opt({piece});
  opt.set_initial_q_sources(0, 0, {{1, 3, {3, 16, 40}, 2, 3}, {1, 0, {16, 40}, 0, 1}, {1, 5, {2, 2, 16, 40}, 0, 2}});
  opt.set_initial_q_sources(0, 1, {{1, 0, {16, 40}, 0, 1}});
  create_state(opt);
  const at::Tensor want = at::cat({seeded_q(1, 3, {3, 40, 4}).narrow(0, 2, 1), seeded_q(1, 0, {40, 4}).unsqueeze(0),
                                   seeded_q(1, 5, {2, 2, 40, 4}).reshape({4, 40, 4}).narrow(0, 0, 2)});
  EXPECT_TRUE(at::equal(opt.param_state(0, 0).at("Q"), want));
  EXPECT_TRUE(at::equal(opt.param_state(0, 1).at("Q"), seeded_q(1, 0, {40, 4})));

  // Loaded state wins; a loaded empty state makes the next step start from the sources again.
  auto states = std::vector<std::vector<Optimizer::StateDict>>{{opt.param_state(0, 0), {}}};
  for (auto& [name, t] : states[0][0]) t = t.clone().fill_(0.5);
  opt.load_param_states(states);
  EXPECT_TRUE(opt.param_state(0, 1).empty());
  create_state(opt);
  EXPECT_TRUE(at::equal(opt.param_state(0, 0).at("Q"), at::full({4, 40, 4}, 0.5)));
  EXPECT_TRUE(at::equal(opt.param_state(0, 1).at("Q"), seeded_q(1, 0, {40, 4})));

  auto throws = [&](size_t i, std::vector<orthopt::QSource> src, const std::string& needle) {
    try {
      opt.set_initial_q_sources(0, i, src);
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  throws(1, {{1, 0, {40, 16}, 0, 1}}, "has matrix shape [40, 16], the parameter's matrices are 16x40");
  throws(1, {{1, 3, {3, 16, 40}, 2, 4}}, "range [2, 4) is outside its 3 matrices");
  throws(0, {{1, 3, {3, 16, 40}, 0, 3}}, "cover 3 matrices, the parameter has 4");
  Optimizer muon({ParamGroup{{at::randn({16, 40})}, {}, with(Algorithm::Muon)}});
  EXPECT_THROW(muon.set_initial_q_sources(0, 0, {{0, 0, {16, 40}, 0, 1}}), c10::Error);
}

TEST(OptimRouting, DefaultRulesOnSmallModel) {
  auto p = [](std::vector<int64_t> s, bool grad = true) { return at::randn(s).requires_grad_(grad); };
  std::vector<std::pair<std::string, at::Tensor>> named = {
      {"tok_emb.weight", p({50, 8})},        {"blocks.0.attn.qkv.weight", p({24, 8})},
      {"blocks.0.attn.proj.weight", p({8, 8})}, {"blocks.0.ln1.weight", p({8})},
      {"blocks.0.mlp.experts.w1", p({4, 16, 8})}, {"blocks.0.mlp.fc.bias", p({16})},
      {"stem.conv.weight", p({8, 3, 3, 3})},   {"lm_head.weight", p({50, 8})},
      {"frozen.weight", p({8, 8}, false)},     {"scale", p({})},
  };
  orthopt::RoutingOptions r;
  GroupOptions qkv;
  qkv.algorithm = Algorithm::NorMuon;
  qkv.ortho.split_sizes = {8, 8, 8};
  r.overrides.push_back({"attn\\.qkv", qkv});
  auto groups = orthopt::route_params(named, r);
  auto names_of = [&](size_t g) { return groups[g].names; };
  ASSERT_EQ(groups.size(), 5u);
  using V = std::vector<std::string>;
  EXPECT_EQ(groups[0].options.algorithm, Algorithm::Muon);
  EXPECT_EQ(names_of(0), (V{"blocks.0.attn.proj.weight", "blocks.0.mlp.experts.w1"}));
  EXPECT_TRUE(groups[1].options.ortho.flatten);
  EXPECT_EQ(names_of(1), (V{"stem.conv.weight"}));
  EXPECT_EQ(groups[2].options.algorithm, Algorithm::AdamW);
  EXPECT_DOUBLE_EQ(groups[2].options.weight_decay, r.scalar.weight_decay);
  EXPECT_EQ(names_of(2), (V{"blocks.0.ln1.weight", "blocks.0.mlp.fc.bias", "scale"}));
  EXPECT_EQ(groups[3].options.algorithm, Algorithm::AdamW);
  EXPECT_DOUBLE_EQ(groups[3].options.weight_decay, 0.0);
  EXPECT_EQ(names_of(3), (V{"tok_emb.weight", "lm_head.weight"}));
  EXPECT_EQ(groups[4].options.algorithm, Algorithm::NorMuon);
  EXPECT_EQ(names_of(4), (V{"blocks.0.attn.qkv.weight"}));
  // The routed groups form a valid optimizer that steps.
  Optimizer opt(groups);
  for (auto& [n, t] : named)
    if (t.requires_grad()) t.mutable_grad() = at::randn(t.sizes());
  opt.step();
  EXPECT_EQ(opt.step_count(), 1);
}

// ---------------------------------------------------------------- bad input

template <typename F>
void expect_error(F&& f, std::vector<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << fragments[0] << "'";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    for (const auto& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << "message: " << msg;
  }
}

ParamGroup one(const std::string& name, at::Tensor p, GroupOptions o = {}) {
  ParamGroup g;
  g.params = {p.requires_grad_(true)};
  g.names = {name};
  g.options = o;
  return g;
}

TEST(OptimErrors, BadInputNamesParamAndOption) {
  auto mat = [] { return at::randn({8, 8}); };
  expect_error([&] { Optimizer({one("ln.weight", at::randn({8}))}); }, {"'ln.weight'", "1-D", "'algorithm'"});
  expect_error([&] { Optimizer({one("scale", at::randn({}))}); }, {"'scale'", "0-D"});
  GroupOptions o;
  o.lr = -1;
  expect_error([&] { Optimizer({one("w", mat(), o)}); }, {"'lr'", "-1"});
  o = {};
  o.momentum = 1.0;
  expect_error([&] { Optimizer({one("w", mat(), o)}); }, {"'momentum'", "[0, 1)"});
  o = {};
  o.momentum = -0.1;
  expect_error([&] { Optimizer({one("w", mat(), o)}); }, {"'momentum'"});
  o = with(Algorithm::Dion3);
  o.fraction = 0;
  expect_error([&] { Optimizer({one("w", mat(), o)}); }, {"'fraction'", "(0, 1]"});
  o.fraction = 1.5;
  expect_error([&] { Optimizer({one("w", mat(), o)}); }, {"'fraction'"});
  expect_error([] { orthopt::parse_algorithm("sgd"); }, {"'algorithm'", "sgd"});
  o = {};
  o.ortho.schedule = "fancy";
  expect_error([&] { Optimizer({one("w", mat(), o)}); }, {"fancy"});
  o = {};
  o.ortho.split_sizes = {4, 3};
  expect_error([&] { Optimizer({one("qkv.weight", mat(), o)}); }, {"'qkv.weight'", "split_sizes", "8 rows"});
  auto shared = mat().requires_grad_(true);
  ParamGroup g1 = one("a", shared), g2 = one("b", shared, with(Algorithm::AdamW));
  expect_error([&] { Optimizer({g1, g2}); }, {"'b'", "more than once"});
  // Sparse gradients are refused at the step.
  auto w = at::randn({8, 8}).requires_grad_(true);
  Optimizer opt({one("emb", w, with(Algorithm::AdamW))});
  w.mutable_grad() = at::randn({8, 8}).to_sparse();
  expect_error([&] { opt.step(); }, {"'emb'", "sparse"});
  // set_group_options validates like the constructor.
  o = {};
  o.lr = std::nan("");
  Optimizer ok({one("w", mat())});
  expect_error([&] { ok.set_group_options(0, o); }, {"'lr'"});
  // Options that would change the shape of existing state are refused after the first step;
  // a scalar change (lr) is accepted.
  auto w2 = at::randn({8, 12}).requires_grad_(true);
  Optimizer dion({one("w2", w2, with(Algorithm::Dion))});
  w2.mutable_grad() = at::randn({8, 12});
  dion.step();
  o = with(Algorithm::Dion);
  o.rank_fraction = 0.5;
  expect_error([&] { dion.set_group_options(0, o); }, {"'w2'", "state 'Q'"});
  o.rank_fraction = 0.25;
  o.lr = 0.5;
  dion.set_group_options(0, o);
  EXPECT_DOUBLE_EQ(dion.param_groups()[0].options.lr, 0.5);
  o.algorithm = Algorithm::Muon;
  expect_error([&] { dion.set_group_options(0, o); }, {"'algorithm'", "cannot change"});
}

}  // namespace

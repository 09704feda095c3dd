// The batched Dion3, NorMuon and Dion steps (one op per bank of same-shaped matrices, src/optim/optimizer.cpp)
// against their per-matrix reference paths, in one process: ExecutionOptions::banks on and off.
//
// Two optimizers over identical parameters receive identical random gradients; one steps on the
// batched path, the other on the reference path. Tolerance: none. Every parameter and every state
// tensor must be bit-identical after every step (compared as integers, so NaN and -0 count too):
// the batched path performs the reference's operations on the same values, and on the CPU the
// batched reductions (row L1 norms, row means, per-matrix Frobenius norms), topk, gather, scatter
// and the Newton–Schulz products give each slice of a stack the bits they give it alone. (One
// exception, outside these small shapes: an fp64 reduction over more than 32768 elements of a
// lone matrix is split across threads (NorMuon: more than 32768 rows); docs/optimizers.md,
// "Batched Dion3 and NorMuon". Another, for Dion: a batched product of fewer than 400
// multiply-adds per matrix is summed by ATen's own loop, the 2-D one by BLAS.)
// (On a GPU the reduction kernels may split a reduction differently for a different number of
// outputs; tests/gpu/test_gpu_fused.cpp bounds that case by fp32 rounding.)
//
// Covered: mixed banks (2-D params next to a 3-D expert stack of the same matrix shape), tall, wide
// and square matrices, single-param banks, gradless (frozen) params, fp32 / fp64 / bf16 params, bf16
// with fp32 master weights (also in one bank with an fp32 param), flatten, split_sizes (NorMuon),
// cautious weight decay (with inf / NaN / -0 weights), weight decay 0, scale_lr_by_fraction,
// fraction 1 (tall selections), and the skip factor: gating on, a skipped step with NaN gradients
// (bit-identical state on both paths), and normal steps after it.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "orthopt/optim.h"

namespace {

using orthopt::Algorithm;
using orthopt::GroupOptions;
using orthopt::Optimizer;
using orthopt::ParamGroup;

// The batched path is not the CPU default (use_banks() in core.cpp): ExecutionOptions::banks = on
// selects it for one optimizer, off the per-matrix path for the other.
class OptimBanks : public ::testing::Test {};

struct ParamSpec {
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  bool frozen = false;  // never gets a gradient
};

struct GroupSpec {
  Algorithm algorithm;
  std::vector<ParamSpec> params;
  std::function<void(GroupOptions&)> tweak;
};

std::vector<ParamGroup> make_groups(const std::vector<GroupSpec>& specs) {
  auto gen = at::detail::createCPUGenerator(31);
  std::vector<ParamGroup> groups;
  for (size_t g = 0; g < specs.size(); ++g) {
    ParamGroup grp;
    grp.options.algorithm = specs[g].algorithm;
    grp.options.lr = 0.02;
    grp.options.weight_decay = 0.1;
    grp.options.ortho.method = orthopt::OrthoMethod::Auto;  // Gram NS on the wide banks
    if (specs[g].tweak) specs[g].tweak(grp.options);
    for (size_t i = 0; i < specs[g].params.size(); ++i) {
      const auto& ps = specs[g].params[i];
      grp.params.push_back(at::randn(ps.sizes, gen, at::kFloat).to(ps.dtype).requires_grad_(true));
      grp.names.push_back("g" + std::to_string(g) + "_p" + std::to_string(i));
    }
    groups.push_back(std::move(grp));
  }
  return groups;
}

// Fresh tensors with the same values (each optimizer owns its parameters).
std::vector<ParamGroup> copy_groups(const std::vector<ParamGroup>& groups) {
  auto out = groups;
  for (auto& g : out)
    for (auto& p : g.params) p = p.detach().clone().requires_grad_(true);
  return out;
}

std::vector<ParamGroup> on_path(std::vector<ParamGroup> groups, orthopt::Toggle banks) {
  for (auto& g : groups) g.options.ortho.execution.banks = banks;
  return groups;
}
std::vector<ParamGroup> batched_path(const std::vector<ParamGroup>& groups) {
  return on_path(copy_groups(groups), orthopt::Toggle::On);
}
std::vector<ParamGroup> reference_path(const std::vector<ParamGroup>& groups) {
  return on_path(copy_groups(groups), orthopt::Toggle::Off);
}

// The same random gradients (NaN in every one when asked) for every optimizer; frozen params get none.
void fill_grads(const std::vector<GroupSpec>& specs, const std::vector<Optimizer*>& opts, int step, bool nan) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  for (size_t g = 0; g < specs.size(); ++g)
    for (size_t i = 0; i < specs[g].params.size(); ++i) {
      const auto& ps = specs[g].params[i];
      if (ps.frozen) continue;
      at::Tensor grad = at::randn(ps.sizes, gen, at::kFloat);
      if (nan) grad.view(-1).narrow(0, 0, 3).fill_(NAN);
      for (Optimizer* o : opts) o->param_groups()[g].params[i].mutable_grad() = grad.to(ps.dtype);
    }
}

// The bits of t (so NaN equals NaN and -0 differs from 0).
at::Tensor bits(const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous();
  switch (c.element_size()) {
    case 2: return c.view(at::kShort);
    case 4: return c.view(at::kInt);
    default: return c.view(at::kLong);
  }
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(bits(a), bits(b));
}

// Everything an optimizer owns: parameters and state, by name.
std::vector<std::pair<std::string, at::Tensor>> snapshot(const Optimizer& o) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const auto& groups = o.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const std::string name = groups[g].names[i];
      out.emplace_back(name, groups[g].params[i].detach().clone());
      for (const auto& [key, t] : o.param_state(g, i)) out.emplace_back(name + " state '" + key + "'", t.clone());
    }
  return out;
}

// The first tensor that differs in its bits ("" when none).
std::string first_difference(const std::vector<std::pair<std::string, at::Tensor>>& a,
                             const std::vector<std::pair<std::string, at::Tensor>>& b) {
  if (a.size() != b.size()) return "tensor count " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].first != b[k].first) return "names " + a[k].first + " vs " + b[k].first;
    if (!same_bits(a[k].second, b[k].second)) {
      const auto x = a[k].second.to(at::kDouble), y = b[k].second.to(at::kDouble);
      std::ostringstream s;
      s << a[k].first << " (max |difference| " << (x - y).abs().nan_to_num(0).max().item<double>() << ")";
      return s.str();
    }
  }
  return "";
}

// Steps both paths 7 times: two steps without gating, then gating on (factor 1), a skipped step with
// NaN gradients, and normal steps; compares after every step.
void expect_batched_equals_reference(const std::vector<GroupSpec>& specs) {
  const auto groups = make_groups(specs);
  Optimizer batched(batched_path(groups)), reference(reference_path(groups));
  const at::Tensor one = at::ones({}), zero = at::zeros({});
  for (int t = 0; t < 7; ++t) {
    const bool skip = t == 4;
    if (t >= 3) {  // gating on from step 3
      batched.set_skip_factor(skip ? zero : one);
      reference.set_skip_factor(skip ? zero : one);
    }
    batched.set_lr_scale(1.0 - 0.1 * t);  // a schedule, read from the device
    reference.set_lr_scale(1.0 - 0.1 * t);
    fill_grads(specs, {&batched, &reference}, t, /*nan=*/skip);
    const auto before = snapshot(batched);
    batched.step();
    reference.step();
    const auto now = snapshot(batched);
    ASSERT_EQ(first_difference(now, snapshot(reference)), "") << "batched path differs from the reference at step " << t;
    if (skip) EXPECT_EQ(first_difference(now, before), "") << "the skipped step " << t << " changed something";
  }
  EXPECT_EQ(batched.step_count(), 6);
  // The comparison is between optimizers that did something: active params moved, frozen ones did not.
  for (size_t g = 0; g < specs.size(); ++g)
    for (size_t i = 0; i < specs[g].params.size(); ++i)
      EXPECT_EQ(same_bits(batched.param_groups()[g].params[i], groups[g].params[i]), specs[g].params[i].frozen)
          << groups[g].names[i];
}

TEST_F(OptimBanks, Dion3BatchedEqualsPerMatrixBitForBit) {
  const auto bf16 = at::kBFloat16;
  const std::vector<GroupSpec> specs = {
      // Mixed bank 16x40 (two 2-D params + a 3-D stack), tall, square bank with a stack, a frozen
      // param; cautious decay with a large wd so a wrong mask shows, lr scaled by fraction.
      {Algorithm::Dion3,
       {{{16, 40}}, {{16, 40}}, {{3, 16, 40}}, {{40, 16}}, {{24, 24}}, {{2, 24, 24}}, {{16, 40}, at::kFloat, true}},
       [](GroupOptions& o) {
         o.fraction = 0.3;
         o.scale_lr_by_fraction = true;
         o.cautious_weight_decay = true;
         o.weight_decay = 2.0;
       }},
      // bf16 with fp32 master weights, in one bank with an fp32 param; Jordan lr rule.
      {Algorithm::Dion3,
       {{{16, 40}, bf16}, {{16, 40}}, {{20, 12}, bf16}, {{2, 20, 12}, bf16}},
       [](GroupOptions& o) {
         o.master_weights = true;
         o.lr_adjust = orthopt::LrAdjust::Jordan;
       }},
      // bf16 params and state without master weights; weight decay 0.
      {Algorithm::Dion3, {{{16, 40}, bf16}, {{16, 40}, bf16}, {{12, 20}, bf16}},
       [](GroupOptions& o) { o.weight_decay = 0.0; }},
      // fp64, every row selected (tall selections, transposed NS results).
      {Algorithm::Dion3, {{{16, 40}, at::kDouble}, {{16, 40}, at::kDouble}, {{3, 16, 40}, at::kDouble},
                          {{40, 16}, at::kDouble}},
       [](GroupOptions& o) { o.fraction = 1.0; }},
      // flatten (a 4-D weight as one matrix), single-param banks viewed in place, wd 0, rms_norm.
      {Algorithm::Dion3, {{{6, 2, 3, 4}}, {{8, 24}}},
       [](GroupOptions& o) {
         o.ortho.flatten = true;
         o.weight_decay = 0.0;
         o.lr_adjust = orthopt::LrAdjust::RmsNorm;
         o.fraction = 0.5;
       }},
  };
  expect_batched_equals_reference(specs);
}

// Special weights under cautious decay: inf, NaN and -0 in selected and unselected rows take the
// same path through decoupled_update_rows as through the full-size direction.
TEST_F(OptimBanks, Dion3CautiousDecaySpecialValuesBitForBit) {
  const std::vector<GroupSpec> specs = {
      {Algorithm::Dion3, {{{16, 40}}, {{16, 40}}}, [](GroupOptions& o) {
         o.cautious_weight_decay = true;
         o.weight_decay = 0.5;
       }}};
  auto groups = make_groups(specs);
  at::Tensor W = groups[0].params[0].detach();
  for (int64_t r = 0; r < 16; r += 3) {  // about a third of the rows, so some get selected
    W[r][0] = INFINITY;
    W[r][1] = -0.0;
    W[r][2] = NAN;
    W[r][3] = -INFINITY;
  }
  Optimizer batched(batched_path(groups)), reference(reference_path(groups));
  for (int t = 0; t < 3; ++t) {
    fill_grads(specs, {&batched, &reference}, t, false);
    batched.step();
    reference.step();
    ASSERT_EQ(first_difference(snapshot(batched), snapshot(reference)), "") << "step " << t;
  }
}

TEST_F(OptimBanks, NorMuonBatchedEqualsPerMatrixBitForBit) {
  const auto bf16 = at::kBFloat16;
  const std::vector<GroupSpec> specs = {
      // Mixed bank, tall bank (transposed NS results), frozen param; Nesterov, cautious decay.
      {Algorithm::NorMuon,
       {{{16, 40}}, {{16, 40}}, {{3, 16, 40}}, {{40, 16}}, {{40, 16}}, {{24, 24}}, {{16, 40}, at::kFloat, true}},
       [](GroupOptions& o) {
         o.nesterov = true;
         o.cautious_weight_decay = true;
       }},
      // fp64 with split_sizes (blocks orthogonalized alone, NorMuon over the whole matrix).
      {Algorithm::NorMuon, {{{24, 20}, at::kDouble}, {{24, 20}, at::kDouble}, {{2, 24, 20}, at::kDouble}},
       [](GroupOptions& o) {
         o.ortho.split_sizes = {16, 8};
         o.lr_adjust = orthopt::LrAdjust::Jordan;
       }},
      // bf16 with master weights in one bank with fp32; ema momentum.
      {Algorithm::NorMuon, {{{16, 40}, bf16}, {{16, 40}}, {{40, 16}, bf16}},
       [](GroupOptions& o) {
         o.master_weights = true;
         o.momentum_style = orthopt::MomentumStyle::Ema;
       }},
      // flatten, and bf16 without master weights.
      {Algorithm::NorMuon, {{{6, 2, 3, 4}}, {{12, 20}, bf16}}, [](GroupOptions& o) { o.ortho.flatten = true; }},
  };
  expect_batched_equals_reference(specs);
}

// The per-bank Dion3 step keeps a bank's momenta (and variances) in one buffer and updates it in
// place: after the first step each param's momentum is a view of that buffer (state_version counts the move once),
// later steps neither move nor copy it; the in-place path still equals the reference bit for bit
// after load_param_states() (the loaded tensors are moved into a new buffer on the next step), and
// a saved view holds only its own elements.
TEST_F(OptimBanks, Dion3MomentaLiveInOneBufferAcrossStepsAndLoads) {
  const std::vector<GroupSpec> specs = {{Algorithm::Dion3, {{{16, 40}}, {{16, 40}}, {{3, 16, 40}}, {{24, 24}}}, {}}};
  const auto groups = make_groups(specs);
  Optimizer batched(batched_path(groups)), reference(reference_path(groups));
  auto step_both = [&](int t) {
    fill_grads(specs, {&batched, &reference}, t, false);
    batched.step();
    reference.step();
    ASSERT_EQ(first_difference(snapshot(batched), snapshot(reference)), "") << "step " << t;
  };
  EXPECT_EQ(batched.state_version(), 0);
  step_both(0);
  const int64_t version = batched.state_version();
  EXPECT_EQ(version, 2) << "the momenta and the variances of the bank of three 16x40 params move into one "
                           "buffer each (the 24x24 bank has one param: already consecutive)";
  const at::Tensor m0 = batched.param_state(0, 0).at("momentum"), m2 = batched.param_state(0, 2).at("momentum");
  EXPECT_TRUE(m0.is_alias_of(m2));
  EXPECT_EQ(m2.storage_offset() - m0.storage_offset(), 2 * 16 * 40);
  const at::Tensor v0 = batched.param_state(0, 0).at("variance"), v2 = batched.param_state(0, 2).at("variance");
  EXPECT_TRUE(v0.is_alias_of(v2));
  EXPECT_EQ(v2.storage_offset() - v0.storage_offset(), 2 * 16);
  const void* live = m0.data_ptr();
  step_both(1);
  step_both(2);
  EXPECT_EQ(batched.state_version(), version) << "later steps must not move the momenta";
  EXPECT_EQ(batched.param_state(0, 0).at("momentum").data_ptr(), live);

  // A checkpoint round trip: views are saved as their own elements, and the in-place path
  // continues from loaded (separate) tensors exactly like the reference.
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive archive;
    batched.save(archive);
    archive.save_to(buffer);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(buffer);
  Optimizer restored(copy_groups(batched.param_groups()));
  restored.load(archive);
  for (size_t i = 0; i < 4; ++i) {
    const at::Tensor m = restored.param_state(0, i).at("momentum");
    EXPECT_EQ(m.storage().nbytes(), static_cast<size_t>(m.numel()) * m.element_size()) << "param " << i;
    EXPECT_TRUE(same_bits(m, batched.param_state(0, i).at("momentum"))) << "param " << i;
  }
  const int64_t loaded = restored.state_version();
  for (int t = 3; t < 5; ++t) {
    fill_grads(specs, {&restored, &reference}, t, false);
    restored.step();
    reference.step();
    ASSERT_EQ(first_difference(snapshot(restored), snapshot(reference)), "") << "after load, step " << t;
  }
  EXPECT_EQ(restored.state_version(), loaded + 2) << "the loaded momenta and variances move into one buffer once";
}


TEST_F(OptimBanks, DionBatchedEqualsPerParamBitForBit) {
  const auto bf16 = at::kBFloat16;
  for (const auto qr : {orthopt::DionQr::Householder, orthopt::DionQr::Cholesky}) {
    SCOPED_TRACE(orthopt::to_string(qr));
    auto with_qr = [qr](std::function<void(GroupOptions&)> more) {
      return [qr, more](GroupOptions& o) {
        o.dion_qr = qr;
        if (more) more(o);
      };
    };
    const std::vector<GroupSpec> specs = {
        // Mixed bank 16x40 (two 2-D params + a 3-D stack), tall, square bank with a stack, a frozen
        // param; cautious decay with a large wd so a wrong mask shows.
        {Algorithm::Dion,
         {{{16, 40}}, {{16, 40}}, {{3, 16, 40}}, {{40, 16}}, {{24, 24}}, {{2, 24, 24}}, {{16, 40}, at::kFloat, true}},
         with_qr([](GroupOptions& o) {
           o.rank_fraction = 0.3;
           o.cautious_weight_decay = true;
           o.weight_decay = 2.0;
         })},
        // bf16 with fp32 master weights, in one bank with an fp32 param; Jordan lr rule.
        {Algorithm::Dion, {{{16, 40}, bf16}, {{16, 40}}, {{20, 12}, bf16}, {{2, 20, 12}, bf16}},
         with_qr([](GroupOptions& o) {
           o.master_weights = true;
           o.lr_adjust = orthopt::LrAdjust::Jordan;
         })},
        // bf16 params and momenta without master weights (stacked, not owned); weight decay 0.
        {Algorithm::Dion, {{{16, 40}, bf16}, {{16, 40}, bf16}, {{12, 20}, bf16}},
         with_qr([](GroupOptions& o) { o.weight_decay = 0.0; })},
        // fp64 params (fp32 Q and products), full rank.
        {Algorithm::Dion, {{{16, 40}, at::kDouble}, {{16, 40}, at::kDouble}, {{40, 16}, at::kDouble}},
         with_qr([](GroupOptions& o) { o.rank_fraction = 1.0; })},
        // flatten (a 4-D weight as one matrix), single-param banks, rms_norm. Full rank: with
        // r = 2 the products would be below ATen's 400 multiply-adds, where its CPU bmm sums in
        // its own loop and mm in BLAS (the header's exception).
        {Algorithm::Dion, {{{6, 2, 3, 4}}, {{8, 24}}}, with_qr([](GroupOptions& o) {
           o.ortho.flatten = true;
           o.lr_adjust = orthopt::LrAdjust::RmsNorm;
           o.rank_fraction = 1.0;
         })},
    };
    expect_batched_equals_reference(specs);
  }
}

// Dion cholesky with a parameter whose P is rank-deficient (a zero column in its Q) inside a
// bank of three: on both paths that parameter, and only it, takes the Householder QR.
TEST_F(OptimBanks, DionCholeskyFallbackInABankBitForBit) {
  const std::vector<GroupSpec> specs = {{Algorithm::Dion, {{{12, 10}}, {{12, 10}}, {{2, 12, 10}}, {{9, 14}}},
                                         [](GroupOptions& o) {
                                           o.rank_fraction = 0.5;
                                           o.dion_qr = orthopt::DionQr::Cholesky;
                                         }}};
  const auto groups = make_groups(specs);
  Optimizer batched(batched_path(groups)), reference(reference_path(groups));
  fill_grads(specs, {&batched, &reference}, 0, false);
  batched.step();  // creates the state; then param 1's Q gets a zero column
  reference.step();
  ASSERT_EQ(first_difference(snapshot(batched), snapshot(reference)), "");
  for (Optimizer* o : {&batched, &reference}) {
    std::vector<std::vector<Optimizer::StateDict>> states(1);
    for (size_t i = 0; i < 4; ++i) {
      Optimizer::StateDict st;
      for (const auto& [k, t] : o->param_state(0, i)) st[k] = t.clone();
      if (i == 1) st["Q"].select(1, 2).zero_();
      states[0].push_back(st);
    }
    o->load_param_states(states);
  }
  for (int t = 1; t < 3; ++t) {
    fill_grads(specs, {&batched, &reference}, t, false);
    batched.step();
    reference.step();
    ASSERT_EQ(first_difference(snapshot(batched), snapshot(reference)), "") << "step " << t;
  }
  // Step 1 falls back for param 1; its Q is then full rank again (R's columns), step 2 does not.
  EXPECT_EQ(batched.dion_qr_fallbacks(), 1);
  EXPECT_EQ(reference.dion_qr_fallbacks(), 1);
}

// The same failure, step by step through step()'s two parts (the CUDA graph captures the first):
// enqueue_step() leaves the failed bank (params 0-2, the four 12×10 matrices) exactly as it was
// and steps the other (param 3); finish_step() then steps the failed bank as the reference path
// does. A skipped step (skip factor 0) changes nothing and falls back nowhere.
TEST_F(OptimBanks, DionCholeskyFailedBankIsSteppedByFinishStep) {
  const std::vector<GroupSpec> specs = {{Algorithm::Dion, {{{12, 10}}, {{12, 10}}, {{2, 12, 10}}, {{9, 14}}},
                                         [](GroupOptions& o) {
                                           o.rank_fraction = 0.5;
                                           o.dion_qr = orthopt::DionQr::Cholesky;
                                         }}};
  const auto groups = make_groups(specs);
  Optimizer batched(batched_path(groups)), reference(reference_path(groups));
  fill_grads(specs, {&batched, &reference}, 0, false);
  batched.step();
  reference.step();
  for (Optimizer* o : {&batched, &reference}) {  // param 1's Q gets a zero column: its P is rank-deficient
    std::vector<std::vector<Optimizer::StateDict>> states(1);
    for (size_t i = 0; i < 4; ++i) {
      Optimizer::StateDict st;
      for (const auto& [k, t] : o->param_state(0, i)) st[k] = t.clone();
      if (i == 1) st["Q"].select(1, 2).zero_();
      states[0].push_back(st);
    }
    o->load_param_states(states);
  }
  const at::Tensor zero = at::zeros({});
  for (Optimizer* o : {&batched, &reference}) o->set_skip_factor(zero);
  fill_grads(specs, {&batched, &reference}, 1, false);
  const auto before = snapshot(batched);
  batched.step();
  EXPECT_EQ(first_difference(snapshot(batched), before), "") << "a skipped step changed something";
  EXPECT_EQ(batched.dion_qr_fallbacks(), 0);

  for (Optimizer* o : {&batched, &reference}) o->set_skip_factor(at::ones({}));
  batched.enqueue_step();
  const auto enqueued = snapshot(batched);
  for (size_t k = 0; k < enqueued.size(); ++k) {
    const bool failed_bank = enqueued[k].first.rfind("g0_p3", 0) != 0;
    EXPECT_EQ(at::equal(enqueued[k].second, before[k].second), failed_bank) << enqueued[k].first;
  }
  EXPECT_EQ(batched.dion_qr_fallbacks(), 0);
  batched.finish_step();
  reference.step();
  EXPECT_EQ(first_difference(snapshot(batched), snapshot(reference)), "");
  EXPECT_EQ(batched.dion_qr_fallbacks(), 1);
  EXPECT_EQ(reference.dion_qr_fallbacks(), 1);
  batched.finish_step();  // a second call does not step the bank again
  EXPECT_EQ(batched.dion_qr_fallbacks(), 1);
  EXPECT_EQ(first_difference(snapshot(batched), snapshot(reference)), "");
}
}  // namespace

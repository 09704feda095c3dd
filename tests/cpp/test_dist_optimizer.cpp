// Distributed optimizer on c10d Gloo, 1–3 processes on localhost.
//
// The test binary is its own worker: a test spawns ranks with dist::launch_local(N, [this
// binary, --gtest_filter=DistWorker.Entry]) and ORTHOPT_DIST_SCENARIO set; DistWorker.Entry
// runs one rank of that scenario and writes its results into ORTHOPT_DIST_OUT. The parent then
// compares them with a single-process orthopt::Optimizer on the same global batch.
//
// Reference: the 1-process orthopt::Optimizer (its own math is checked against fp64 references
// in the optim tests). What is under test here is the distribution: layout, padding, ownership,
// reduce-scatter/all-gather, state sharding and re-sharding.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <tuple>

#include "orthopt/distributed.h"
#include "orthopt/runtime.h"
#include "orthopt/optim.h"

namespace fs = std::filesystem;
using namespace orthopt;

namespace {

std::string env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

at::Generator gen(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

// The test model: three groups with uneven banks.
//   Muon:  5×[16,24] (bank of 5: 3+2 on N=2, 2+2+1 on N=3), 2×[24,16], one [3,16,16] expert
//          stack plus one [16,16] (a bank of 4 whose stack straddles ranks at N=3), one [20,20]
//          (bank of 1: empty shards on the other ranks).
//   Dion3: 4×[32,16] and one [16,48], f = 0.25.
//   AdamW: [50], [7,9], [13]: 176 elements, sharded by element (88/88, 59/59/58).
std::vector<ParamGroup> make_groups(uint64_t seed) {
  auto g = gen(seed);
  auto make = [&](std::vector<int64_t> shape) { return at::randn(shape, g).mul_(0.5); };
  ParamGroup muon, dion3, adamw;
  muon.options.algorithm = Algorithm::Muon;
  muon.options.lr = 0.02;
  for (int i = 0; i < 5; ++i) muon.params.push_back(make({16, 24}));
  muon.params.push_back(make({24, 16}));
  muon.params.push_back(make({3, 16, 16}));
  muon.params.push_back(make({20, 20}));
  muon.params.push_back(make({24, 16}));
  muon.params.push_back(make({16, 16}));
  dion3.options.algorithm = Algorithm::Dion3;
  dion3.options.lr = 0.03;
  dion3.options.fraction = 0.25;
  for (int i = 0; i < 4; ++i) dion3.params.push_back(make({32, 16}));
  dion3.params.push_back(make({16, 48}));
  adamw.options.algorithm = Algorithm::AdamW;
  adamw.options.lr = 3e-3;
  adamw.params = {make({50}), make({7, 9}), make({13})};
  return {muon, dion3, adamw};
}

// make_groups() with every group on the bank path (ExecutionOptions::banks = on; the CPU default
// steps per matrix): distributed equals single process there too.
std::vector<ParamGroup> make_banked_groups(uint64_t seed) {
  auto groups = make_groups(seed);
  for (auto& g : groups) g.options.ortho.execution.banks = orthopt::Toggle::On;
  return groups;
}

// The Dion test model, fp64 (Dion's own math is fp32; fp64 keeps the storage exact):
//   group 0 Dion: 3×[16,40], a [3,16,40] stack and a [2,2,16,40] stack (a bank of 10 [16,40]
//     matrices: the 3-stack straddles ranks at N = 2 and 3, the 4-D one at N = 3), 2×[40,16]
//     (tall; an empty shard at N = 3), one [24,24] (a bank of 1).
//   group 1 Dion with flatten, rank_fraction 0.5: [8,4,6] (one [8,24] matrix) and [8,24] (a bank
//     of 2), [4,3,2,4] (one [4,24]).
//   group 2 Muon with flatten: [8,4,6] and [6,2,2,6] (the banks must not be flattened again).
std::vector<ParamGroup> make_dion_groups(uint64_t seed) {
  auto g = gen(seed);
  auto make = [&](std::vector<int64_t> shape) { return at::randn(shape, g, at::kDouble).mul_(0.5); };
  ParamGroup dion, dion_flat, muon_flat;
  dion.options.algorithm = Algorithm::Dion;
  dion.options.lr = 0.02;
  for (int i = 0; i < 3; ++i) dion.params.push_back(make({16, 40}));
  dion.params.push_back(make({3, 16, 40}));
  dion.params.push_back(make({2, 2, 16, 40}));
  dion.params.push_back(make({40, 16}));
  dion.params.push_back(make({40, 16}));
  dion.params.push_back(make({24, 24}));
  dion_flat.options = dion.options;
  dion_flat.options.ortho.flatten = true;
  dion_flat.options.rank_fraction = 0.5;
  dion_flat.params = {make({8, 4, 6}), make({8, 24}), make({4, 3, 2, 4})};
  muon_flat.options.algorithm = Algorithm::Muon;
  muon_flat.options.lr = 0.02;
  muon_flat.options.ortho.flatten = true;
  muon_flat.params = {make({8, 4, 6}), make({6, 2, 2, 6})};
  return {dion, dion_flat, muon_flat};
}

using Model = std::vector<ParamGroup> (*)(uint64_t);
Model model_from_env() { return env("ORTHOPT_DIST_MODEL") == "dion" ? make_dion_groups : make_groups; }

// The local gradient of `rank` at `step`: multiples of 1/256 in [-1/4, 1/4), so sums over up
// to 3 ranks are exact in fp32 and the averaged global gradient is bit-identical however the
// collective orders its additions.
at::Tensor local_grad(const at::Tensor& p, int64_t step, int64_t rank, int64_t index) {
  auto g = gen(100000 + 1000 * step + 37 * rank + index);
  return at::randint(-64, 64, p.sizes(), g, at::kFloat).div_(256).to(p.scalar_type());
}

std::vector<at::Tensor> all_params(const std::vector<ParamGroup>& groups) {
  std::vector<at::Tensor> out;
  for (const auto& g : groups)
    for (const auto& p : g.params) out.push_back(p);
  return out;
}

void set_local_grads(const std::vector<ParamGroup>& groups, int64_t step, int64_t rank) {
  int64_t i = 0;
  for (const auto& g : groups)
    for (auto p : g.params) p.mutable_grad() = local_grad(p, step, rank, i++);
}

// Per group, per param: the state entry `name` (undefined where there is none).
std::vector<std::vector<at::Tensor>> state_entries(const Optimizer& opt, const std::string& name) {
  std::vector<std::vector<at::Tensor>> out(opt.param_groups().size());
  for (size_t g = 0; g < out.size(); ++g)
    for (size_t i = 0; i < opt.param_groups()[g].params.size(); ++i) {
      const auto& st = opt.param_state(g, i);
      out[g].push_back(st.count(name) ? st.at(name).clone() : at::Tensor());
    }
  return out;
}

// The 1-process run on the global batch: gradient = mean of the ranks' local gradients.
// `q`: Dion's Q per group and param at the end (with steps = 0: the initial Q, made by a
// skipped step, which creates the state and changes nothing).
std::vector<at::Tensor> reference_run(int world, int64_t steps, int64_t* state_bytes = nullptr, Model model = make_groups,
                                      std::vector<std::vector<at::Tensor>>* q = nullptr) {
  auto groups = model(7);
  Optimizer opt(groups);
  if (steps == 0) {
    opt.set_skip_factor(at::zeros({}));
    set_local_grads(groups, 0, 0);
    opt.step();
  }
  for (int64_t s = 0; s < steps; ++s) {
    int64_t i = 0;
    for (const auto& g : groups)
      for (auto p : g.params) {
        at::Tensor sum = at::zeros_like(p);
        for (int r = 0; r < world; ++r) sum.add_(local_grad(p, s, r, i));
        p.mutable_grad() = sum.div_(world);
        ++i;
      }
    opt.step();
  }
  if (state_bytes) *state_bytes = opt.state_bytes();
  if (q) *q = state_entries(opt, "Q");
  return all_params(groups);
}

// Relative Frobenius error per parameter. Both sides run the same fp32 operations; only the
// batching of the Newton–Schulz products differs (one [n,m,k] bank slice vs the optimizer's
// own stacking), which changes results at the level of fp32 rounding (~1e-7 relative), far
// below the 1e-6 bound; a layout or ownership bug gives O(1) errors.
void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what << " param " << i;
    const double rel = (got[i].to(at::kDouble) - want[i].to(at::kDouble)).norm().item<double>() /
                       want[i].to(at::kDouble).norm().item<double>();
    EXPECT_LE(rel, 1e-6) << what << ": param " << i << " relative error " << rel;
    worst = std::max(worst, rel);
  }
  std::cout << what << ": largest relative error " << worst << "\n";
}

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

struct Launch {
  int rc;
  double seconds;
  std::string err;
};

// Runs `nproc` ranks of `scenario` with results in `out`.
Launch launch(int nproc, const std::string& scenario, const std::string& out,
              const std::vector<std::pair<std::string, std::string>>& extra_env = {},
              std::chrono::milliseconds grace = std::chrono::seconds(5)) {
  ::setenv("ORTHOPT_DIST_SCENARIO", scenario.c_str(), 1);
  ::setenv("ORTHOPT_DIST_OUT", out.c_str(), 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);  // N ranks share 2 cores
  for (const auto& [k, v] : extra_env) ::setenv(k.c_str(), v.c_str(), 1);
  testing::internal::CaptureStderr();
  auto t0 = std::chrono::steady_clock::now();
  int rc = dist::launch_local(nproc, {self_exe(), "--gtest_filter=DistWorker.Entry"}, grace);
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string err = testing::internal::GetCapturedStderr();
  for (const auto& kv : extra_env) ::unsetenv(kv.first.c_str());
  ::unsetenv("ORTHOPT_DIST_SCENARIO");
  return {rc, sec, err};
}

// The multi-process tests run on Gloo; a build without Gloo headers (pip torch on the GPU
// machine) cannot create that backend.
#define REQUIRE_GLOO()                                                                     \
  if (!dist::backend_available("gloo")) GTEST_SKIP() << "this build has no c10d Gloo backend"

fs::path scratch_root() { return fs::temp_directory_path() / ("orthopt_test_dist_" + std::to_string(::getpid())); }

std::string fresh_dir(const std::string& name) {
  auto d = scratch_root() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// Scratch directories stay for inspection when a test failed, and go otherwise.
class RemoveScratchOnSuccess : public testing::Environment {
 public:
  void TearDown() override {
    if (!testing::UnitTest::GetInstance()->Failed()) fs::remove_all(scratch_root());
  }
};
testing::Environment* const kScratchCleanup = testing::AddGlobalTestEnvironment(new RemoveScratchOnSuccess);

std::vector<at::Tensor> load_tensors(const std::string& path) {
  std::vector<at::Tensor> v;
  torch::load(v, path);
  return v;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Expected optimizer-state bytes of the pieces one rank owns (fp32 state):
// Muon momentum m·k; Dion3 momentum m·k + variance m; AdamW exp_avg + exp_avg_sq per element
// plus one 0-d step per local parameter.
int64_t expected_state_bytes(const dist::DistributedOptimizer& opt) {
  int64_t b = 0;
  for (const auto& p : opt.owned_pieces()) {
    const int64_t n = p.end - p.begin;
    if (n <= 0) continue;
    switch (opt.param_groups()[p.group].options.algorithm) {
      case Algorithm::Muon: b += 4 * n * p.rows * p.cols; break;
      case Algorithm::Dion3: b += 4 * n * (p.rows * p.cols + p.rows); break;
      case Algorithm::AdamW: b += 4 * (2 * n + 1); break;
      default: ADD_FAILURE() << "unexpected algorithm";
    }
  }
  return b;
}

// Compares the Q of every Dion piece in the shard files of `dir` (written by `world` ranks) with
// the single-process Q `want` (per group and param) sliced like the layout: the matrices of a
// bank in parameter order, [begin, end) of them. `tol` 0: bit for bit. Returns the number of
// matrices compared (the parent checks that every Dion matrix was).
int64_t compare_piece_q(const std::string& dir, int world, const std::vector<ParamGroup>& groups,
                        const std::vector<std::vector<at::Tensor>>& want, double tol, const std::string& what) {
  int64_t matrices = 0;
  for (int r = 0; r < world; ++r) {
    const auto meta = nlohmann::json::parse(read_text(dir + "/optim_shard_" + std::to_string(r) + ".json"));
    torch::serialize::InputArchive ar;
    ar.load_from(dir + "/optim_shard_" + std::to_string(r) + ".pt");
    for (const auto& piece : meta.at("pieces")) {
      const size_t k = piece.at("segment").get<size_t>();
      const auto& seg = meta.at("segments").at(k);
      const size_t g = seg.at("group").get<size_t>();
      const int64_t begin = piece.at("begin").get<int64_t>(), end = piece.at("end").get<int64_t>();
      if (groups[g].options.algorithm != Algorithm::Dion || end <= begin) continue;
      const int64_t rows = seg.at("rows").get<int64_t>(), cols = seg.at("cols").get<int64_t>();
      std::vector<at::Tensor> bank;
      for (size_t i = 0; i < groups[g].params.size(); ++i) {
        const auto& p = groups[g].params[i];
        const bool flat = groups[g].options.ortho.flatten && p.dim() >= 3;
        if ((flat ? p.size(0) : p.size(-2)) != rows || (flat ? p.numel() / p.size(0) : p.size(-1)) != cols) continue;
        bank.push_back(want[g][i].reshape({-1, want[g][i].size(-2), want[g][i].size(-1)}));
      }
      const at::Tensor expected = at::cat(bank, 0).narrow(0, begin, end - begin);
      at::Tensor got;
      ar.read("piece" + std::to_string(k) + "_Q", got, true);
      const std::string where = what + ": rank " + std::to_string(r) + " group " + std::to_string(g) + " bank " +
                                std::to_string(rows) + "x" + std::to_string(cols) + " [" + std::to_string(begin) +
                                ":" + std::to_string(end) + ")";
      EXPECT_EQ(got.sizes(), expected.sizes()) << where;
      if (got.sizes() != expected.sizes()) continue;
      if (tol == 0) {
        EXPECT_TRUE(at::equal(got, expected)) << where << ": max difference "
                                              << (got - expected).abs().max().item<double>();
      } else {
        const double rel = (got.to(at::kDouble) - expected.to(at::kDouble)).norm().item<double>() /
                           expected.to(at::kDouble).norm().item<double>();
        EXPECT_LE(rel, tol) << where;
      }
      matrices += end - begin;
    }
  }
  return matrices;
}

int64_t dion_matrices(const std::vector<ParamGroup>& groups) {
  int64_t n = 0;
  for (const auto& g : groups)
    for (const auto& p : g.params)
      if (g.options.algorithm == Algorithm::Dion) n += g.options.ortho.flatten && p.dim() >= 3 ? 1 : p.numel() / (p.size(-2) * p.size(-1));
  return n;
}

// ---------------------------------------------------------------- worker side

void write_params(const std::vector<ParamGroup>& groups, const std::string& path) {
  torch::save(all_params(groups), path);
}

void run_worker(const std::string& scenario, const std::string& out) {
  auto ctx = std::make_shared<dist::DistContext>();
  const int rank = ctx->rank(), world = ctx->world_size();
  const std::string tag = std::to_string(rank);

  if (scenario == "equal" || scenario == "equal_banks") {
    const Model model = scenario == "equal" ? make_groups : make_banked_groups;
    // Ranks > 0 start from different values: the constructor must broadcast rank 0's.
    auto groups = model(rank == 0 ? 7 : 7 + rank);
    dist::DistributedOptimizer opt(groups, ctx);
    for (int64_t s = 0; s < 3; ++s) {
      set_local_grads(groups, s, rank);
      opt.step();
    }
    write_params(groups, out + "/params_" + tag + ".pt");
    std::ofstream(out + "/state_" + tag + ".txt") << opt.state_bytes() << " " << expected_state_bytes(opt) << " "
                                                  << opt.step_count() << "\n";
    // Bytes per step counted by the context: one reduce-scatter and one all-gather of the
    // whole [N·chunk] fp32 buffer (the constructor's broadcast is counted apart).
    const auto& stats = ctx->comm_stats();
    const int64_t flat_bytes = 4 * world * opt.flat_elements_per_rank();
    EXPECT_EQ(stats.at("all_gather").calls, 3);
    EXPECT_EQ(stats.at("all_gather").payload_bytes, 3 * flat_bytes);
    const char* rs = world == 1 || ctx->backend() == "nccl" ? "reduce_scatter" : "reduce_scatter_via_all_reduce";
    EXPECT_EQ(stats.at(rs).payload_bytes, 3 * flat_bytes);
    EXPECT_EQ(stats.at("broadcast").calls, 1);
    // plan_layout describes the same layout without building anything.
    auto plan = dist::plan_layout(model(7), world);
    EXPECT_EQ(plan.chunk_elements, opt.flat_elements_per_rank());
    int64_t owned = 0;
    for (const auto& p : opt.owned_pieces()) owned += (p.end - p.begin) * (p.is_bank ? p.rows * p.cols : 1);
    EXPECT_EQ(plan.owned_elements[rank], owned);
    // build_layout, which orthopt._C.dist_layout hands to the Python engine, is the layout the
    // optimizer runs: same segments, same ranges owned by this rank.
    const auto layout = dist::build_layout(model(7), world);
    EXPECT_EQ(layout.chunk, opt.flat_elements_per_rank());
    ASSERT_EQ(layout.segments.size(), opt.owned_pieces().size());
    for (size_t k = 0; k < layout.segments.size(); ++k) {
      const auto& s = layout.segments[k];
      const auto& p = opt.owned_pieces()[k];
      EXPECT_TRUE(s.group == p.group && s.is_bank == p.is_bank && s.rows == p.rows && s.cols == p.cols) << k;
      EXPECT_EQ(s.owned_begin(rank), p.begin) << k;
      EXPECT_EQ(s.owned_end(rank), p.end) << k;
    }
  } else if (scenario == "clip") {
    // The split step with global-norm clipping to 0.5 (the averaged gradient's norm is about
    // 7, so every step is clipped; the parent asserts it).
    auto groups = make_groups(7);
    dist::DistributedOptimizer opt(groups, ctx);
    std::ofstream norms(out + "/norms_" + tag + ".txt");
    norms.precision(10);
    for (int64_t s = 0; s < 3; ++s) {
      set_local_grads(groups, s, rank);
      at::Tensor norm = opt.reduce_gradients();
      at::Tensor factor = (0.5 / (norm + 1e-6)).clamp_max(1.0);
      for (auto& p : opt.owned_params()) p.mutable_grad().mul_(factor);
      opt.apply_update();
      norms << norm.item<double>() << "\n";
    }
    EXPECT_THROW(opt.apply_update(), c10::Error);  // without a reduce_gradients() first
    write_params(groups, out + "/params_" + tag + ".pt");
  } else if (scenario == "dion") {
    {  // The initial Q of every piece: a skipped step creates the state and changes nothing.
      auto groups = make_dion_groups(7);
      dist::DistributedOptimizer opt(groups, ctx);
      opt.set_skip_factor(at::zeros({}));
      set_local_grads(groups, 0, rank);
      opt.step();
      opt.save_shard(out + "/q0");
    }
    auto groups = make_dion_groups(rank == 0 ? 7 : 7 + rank);
    dist::DistributedOptimizer opt(groups, ctx);
    for (int64_t s = 0; s < 3; ++s) {
      set_local_grads(groups, s, rank);
      opt.step();
      if (s == 0) write_params(groups, out + "/step1_" + tag + ".pt");
    }
    write_params(groups, out + "/params_" + tag + ".pt");
  } else if (scenario == "save") {  // ORTHOPT_DIST_SAVE_STEPS (2) steps, then a sharded checkpoint with the model
    auto groups = model_from_env()(7);
    dist::DistributedOptimizer opt(groups, ctx);
    const int64_t steps = std::stoi(env("ORTHOPT_DIST_SAVE_STEPS", "2"));
    auto save = [&](bool overwrite) {
      dist::save_sharded_checkpoint(
          opt, out + "/ckpt", [&](const std::string& tmp) { write_params(groups, tmp + "/model.pt"); }, overwrite);
    };
    for (int64_t s = 0; s < steps; ++s) {
      set_local_grads(groups, s, rank);
      opt.step();
      // A checkpoint one step earlier, replaced by the last one (what the resume tests load).
      if (s + 2 == steps) save(false);
    }
    save(steps >= 2);
    EXPECT_FALSE(fs::exists(out + "/ckpt.old")) << "the replaced checkpoint was left behind";
  } else if (scenario == "resume") {  // load at this world size, continue up to 4 steps
    auto groups = model_from_env()(99);  // overwritten by the checkpoint's model
    const std::string ckpt = env("ORTHOPT_DIST_CKPT");
    auto model = load_tensors(ckpt + "/model.pt");
    auto params = all_params(groups);
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(model[i]);
    dist::DistributedOptimizer opt(groups, ctx);
    opt.load_shards(ckpt);
    if (!env("ORTHOPT_DIST_LOADED").empty()) opt.save_shard(env("ORTHOPT_DIST_LOADED"));  // the re-sharded state
    // The reference's ranks 0 and 1 produced the gradients; with another world size the
    // global batch is kept the same by giving each rank of the resumed run the same
    // 2-rank average (data parallelism averages, so equal local gradients average to it).
    for (int64_t s = std::stoi(env("ORTHOPT_DIST_FROM", "2")); s < 4; ++s) {
      int64_t i = 0;
      for (const auto& g : groups)
        for (auto p : g.params) {
          p.mutable_grad() = (local_grad(p, s, 0, i) + local_grad(p, s, 1, i)).div_(2);
          ++i;
        }
      opt.step();
    }
    write_params(groups, out + "/params_" + tag + ".pt");
    std::ofstream(out + "/steps_" + tag + ".txt") << opt.step_count() << "\n";
  } else if (scenario == "kill" || scenario == "stall") {
    // The victim rank (ORTHOPT_DIST_VICTIM, default 1) dies (kill) or stops answering (stall)
    // before the 2nd step; the others must fail with an error on their own: they ignore the
    // launcher's SIGTERM here.
    const int victim = std::stoi(env("ORTHOPT_DIST_VICTIM", "1"));
    if (rank != victim) ::signal(SIGTERM, SIG_IGN);
    auto groups = make_groups(7);
    dist::DistributedOptimizer opt(groups, ctx);
    set_local_grads(groups, 0, rank);
    opt.step();
    if (rank == victim) {
      if (scenario == "kill") ::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    try {
      for (int64_t s = 1; s < 4; ++s) {
        set_local_grads(groups, s, rank);
        opt.step();
      }
      std::ofstream(out + "/error_" + tag + ".txt") << "no error\n";
    } catch (const c10::Error& e) {
      std::ofstream(out + "/error_" + tag + ".txt") << e.what_without_backtrace() << "\n";
      std::_Exit(3);
    }
  } else if (scenario == "mismatch") {
    auto groups = make_groups(7);
    if (rank == world - 1) groups[1].options.fraction = 0.5;  // a different Dion3 fraction
    try {
      dist::DistributedOptimizer opt(groups, ctx);
      std::ofstream(out + "/error_" + tag + ".txt") << "no error\n";
    } catch (const c10::Error& e) {
      std::ofstream(out + "/error_" + tag + ".txt") << e.what_without_backtrace() << "\n";
      std::_Exit(3);
    }
  } else {
    FAIL() << "unknown ORTHOPT_DIST_SCENARIO " << scenario;
  }
}

}  // namespace

// Entry point of the spawned ranks; does nothing in a normal test run.
TEST(DistWorker, Entry) {
  const std::string scenario = env("ORTHOPT_DIST_SCENARIO");
  if (scenario.empty() || env("RANK").empty()) GTEST_SKIP() << "only runs as a spawned rank";
  run_worker(scenario, env("ORTHOPT_DIST_OUT"));
}

// ---------------------------------------------------------------- tests

// (world size, banks): the per-matrix CPU default and the bank path.
class DistEqualsSingleProcess : public testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DistEqualsSingleProcess, MuonDion3AdamWUnevenBanks) {
  REQUIRE_GLOO();
  const auto [world, banked] = GetParam();
  const std::string scenario = banked ? "equal_banks" : "equal";
  const std::string out = fresh_dir(scenario + std::to_string(world));
  auto l = launch(world, scenario, out);
  ASSERT_EQ(l.rc, 0) << l.err;
  int64_t ref_state = 0;
  auto want = reference_run(world, 3, &ref_state, banked ? make_banked_groups : make_groups);
  int64_t sum_state = 0, max_state = 0;
  for (int r = 0; r < world; ++r) {
    expect_close(load_tensors(out + "/params_" + std::to_string(r) + ".pt"), want, "rank " + std::to_string(r));
    std::istringstream st(read_text(out + "/state_" + std::to_string(r) + ".txt"));
    int64_t bytes = 0, expected = 0, steps = 0;
    st >> bytes >> expected >> steps;
    EXPECT_EQ(bytes, expected) << "rank " << r << " holds state for more than the pieces it owns";
    EXPECT_EQ(steps, 3);
    sum_state += bytes;
    max_state = std::max(max_state, bytes);
  }
  // Sharded state adds up to the single-process state, up to AdamW's 0-d step counters
  // (one per local parameter instead of one per model parameter: 3 in the reference).
  EXPECT_NEAR(static_cast<double>(sum_state), static_cast<double>(ref_state), 4.0 * (world + 3));
  // ≈ 1/N per rank: whole-matrix ownership rounds to matrices; the largest rank of this small
  // uneven model holds at most 1/N + 20% of the total (measured ratios are printed).
  const double share = static_cast<double>(max_state) / static_cast<double>(ref_state);
  std::cout << "world " << world << ": state per rank max " << max_state << " of " << ref_state << " bytes (share "
            << share << ", ideal " << 1.0 / world << ")\n";
  if (world > 1) EXPECT_LE(share, 1.0 / world + 0.2);
}

INSTANTIATE_TEST_SUITE_P(Gloo, DistEqualsSingleProcess,
                         testing::Values(std::make_tuple(1, false), std::make_tuple(2, false), std::make_tuple(3, false),
                                         std::make_tuple(2, true), std::make_tuple(3, true)));

TEST(DistSplitStep, GlobalNormClippingEqualsSingleProcess) {
  REQUIRE_GLOO();
  const int world = 3;
  const std::string out = fresh_dir("clip");
  auto l = launch(world, "clip", out);
  ASSERT_EQ(l.rc, 0) << l.err;
  // Reference: the global gradient's norm in fp64, the same clip factor, one process.
  auto groups = make_groups(7);
  Optimizer opt(groups);
  std::vector<double> want_norms;
  for (int64_t s = 0; s < 3; ++s) {
    int64_t i = 0;
    double sq = 0;
    for (const auto& g : groups)
      for (auto p : g.params) {
        at::Tensor sum = at::zeros_like(p);
        for (int r = 0; r < world; ++r) sum.add_(local_grad(p, s, r, i));
        p.mutable_grad() = sum.div_(world);
        sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
        ++i;
      }
    want_norms.push_back(std::sqrt(sq));
    const double factor = std::min(1.0, 0.5 / (want_norms.back() + 1e-6));
    ASSERT_LT(factor, 1.0);  // the test must exercise clipping
    for (const auto& g : groups)
      for (auto p : g.params) p.mutable_grad().mul_(factor);
    opt.step();
  }
  for (int r = 0; r < world; ++r) {
    std::istringstream in(read_text(out + "/norms_" + std::to_string(r) + ".txt"));
    for (double w : want_norms) {
      double got = 0;
      in >> got;
      // fp32 sum of squares over ~5k elements vs fp64: ~1e-7 relative.
      EXPECT_NEAR(got, w, 1e-6 * w) << "rank " << r;
    }
    expect_close(load_tensors(out + "/params_" + std::to_string(r) + ".pt"), all_params(groups),
                 "clipped, rank " + std::to_string(r));
  }
}

TEST(DistCheckpoint, SaveAt2ResumeAt1And2And3) {
  REQUIRE_GLOO();
  const std::string out = fresh_dir("ckpt");
  auto s = launch(2, "save", out);
  ASSERT_EQ(s.rc, 0) << s.err;
  ASSERT_TRUE(fs::exists(out + "/ckpt/optim_shard_0.json"));
  ASSERT_TRUE(fs::exists(out + "/ckpt/optim_shard_1.pt"));
  ASSERT_FALSE(fs::exists(out + "/ckpt.tmp"));
  auto want = reference_run(2, 4);  // uninterrupted, 4 steps on the 2-rank global batch
  for (int world : {1, 2, 3}) {
    const std::string res = out + "/resume" + std::to_string(world);
    fs::create_directories(res);
    auto r = launch(world, "resume", res, {{"ORTHOPT_DIST_CKPT", out + "/ckpt"}});
    ASSERT_EQ(r.rc, 0) << r.err;
    for (int k = 0; k < world; ++k) {
      expect_close(load_tensors(res + "/params_" + std::to_string(k) + ".pt"), want,
                   "resumed at world " + std::to_string(world) + " rank " + std::to_string(k));
      EXPECT_EQ(read_text(res + "/steps_" + std::to_string(k) + ".txt"), "4\n");
    }
  }
}

// Saved at N=3, where the block rotation gives rank 0 the upper blocks of some banks (e.g. the
// [16,16] bank: rank 0 owns matrices [2,4), rank 2 [0,2)), loaded at N=1: every state tensor of
// the single piece of a segment is the old pieces' tensors concatenated in range order.
TEST(DistCheckpoint, SaveAt3WithRotatedBlocksLoadsAt1) {
  REQUIRE_GLOO();
  const std::string out = fresh_dir("ckpt_rot");
  auto s = launch(3, "save", out);
  ASSERT_EQ(s.rc, 0) << s.err;
  const std::string res = out + "/resume1";
  fs::create_directories(res + "/loaded");
  auto r = launch(1, "resume", res, {{"ORTHOPT_DIST_CKPT", out + "/ckpt"}, {"ORTHOPT_DIST_LOADED", res + "/loaded"}});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto shard = [](const std::string& dir, int rank) {
    const std::string base = dir + "/optim_shard_" + std::to_string(rank);
    auto ar = std::make_shared<torch::serialize::InputArchive>();
    ar->load_from(base + ".pt");
    return std::make_pair(nlohmann::json::parse(read_text(base + ".json")), ar);
  };
  const auto [meta1, ar1] = shard(res + "/loaded", 0);
  std::vector<std::pair<nlohmann::json, std::shared_ptr<torch::serialize::InputArchive>>> old;
  for (int rank = 0; rank < 3; ++rank) old.push_back(shard(out + "/ckpt", rank));
  bool rotated = false;
  int64_t compared = 0;
  for (const auto& piece : meta1.at("pieces")) {
    const size_t k = piece.at("segment").get<size_t>();
    std::vector<std::tuple<int64_t, int, size_t>> parts;  // (begin, old rank, index in its shard)
    for (int rank = 0; rank < 3; ++rank) {
      const auto& pieces = old[rank].first.at("pieces");
      for (size_t j = 0; j < pieces.size(); ++j)
        if (pieces[j].at("segment").get<size_t>() == k && pieces[j].at("end") > pieces[j].at("begin"))
          parts.emplace_back(pieces[j].at("begin").get<int64_t>(), rank, j);
    }
    // `parts` is in rank order; out of range order where the rotation moved a block.
    rotated = rotated || !std::is_sorted(parts.begin(), parts.end());
    std::sort(parts.begin(), parts.end());
    for (const auto& name : piece.at("state")) {
      at::Tensor got;
      ar1->read("piece" + std::to_string(k) + "_" + name.get<std::string>(), got, true);
      if (got.dim() == 0) continue;
      std::vector<at::Tensor> want;
      for (const auto& [begin, rank, j] : parts) {
        at::Tensor t;
        old[rank].second->read("piece" + std::to_string(j) + "_" + name.get<std::string>(), t, true);
        want.push_back(t);
      }
      EXPECT_TRUE(at::equal(got, at::cat(want, 0))) << "segment " << k << " state " << name;
      ++compared;
    }
  }
  EXPECT_TRUE(rotated) << "no segment of the test model has its blocks out of rank order at N=3";
  EXPECT_GT(compared, 0);
}

// Dion: every piece's initial Q is exactly its slice of the single-process Q, and N ranks then
// follow the single process (N = 1 too: the local optimizer's params are bank pieces, not the
// model's). A flatten Muon group rides along (the local optimizer must not re-flatten banks).
class DistDion : public testing::TestWithParam<int> {};

TEST_P(DistDion, InitialQAndStepsEqualSingleProcess) {
  REQUIRE_GLOO();
  const int world = GetParam();
  const std::string out = fresh_dir("dion" + std::to_string(world));
  fs::create_directories(out + "/q0");
  auto l = launch(world, "dion", out);
  ASSERT_EQ(l.rc, 0) << l.err;
  const auto groups = make_dion_groups(7);
  std::vector<std::vector<at::Tensor>> q0;
  reference_run(world, 0, nullptr, make_dion_groups, &q0);
  EXPECT_EQ(compare_piece_q(out + "/q0", world, groups, q0, 0.0, "initial Q"), dion_matrices(groups));
  const auto step1 = reference_run(world, 1, nullptr, make_dion_groups);
  const auto step3 = reference_run(world, 3, nullptr, make_dion_groups);
  for (int r = 0; r < world; ++r) {
    const std::string tag = std::to_string(r);
    expect_close(load_tensors(out + "/step1_" + tag + ".pt"), step1, "dion N=" + std::to_string(world) + " 1 step, rank " + tag);
    expect_close(load_tensors(out + "/params_" + tag + ".pt"), step3, "dion N=" + std::to_string(world) + " 3 steps, rank " + tag);
  }
}

INSTANTIATE_TEST_SUITE_P(Gloo, DistDion, testing::Values(1, 2, 3));

// Dion checkpoints: saved at N=2 after 2 steps, resumed at N = 1, 2, 3: the re-sharded Q is the
// single-process Q and the runs continue like it. A checkpoint saved before the first step (no
// state) at N=3 and resumed at N=2 starts from the single-process Q.
TEST(DistCheckpoint, DionResumeReshardsQ) {
  REQUIRE_GLOO();
  const std::string out = fresh_dir("dion_ckpt");
  const std::pair<std::string, std::string> model{"ORTHOPT_DIST_MODEL", "dion"};
  auto s = launch(2, "save", out, {model});
  ASSERT_EQ(s.rc, 0) << s.err;
  const auto groups = make_dion_groups(7);
  std::vector<std::vector<at::Tensor>> q2;
  reference_run(2, 2, nullptr, make_dion_groups, &q2);
  const auto want = reference_run(2, 4, nullptr, make_dion_groups);
  for (int world : {1, 2, 3}) {
    const std::string res = out + "/resume" + std::to_string(world);
    fs::create_directories(res + "/loaded");
    auto r = launch(world, "resume", res,
                    {model, {"ORTHOPT_DIST_CKPT", out + "/ckpt"}, {"ORTHOPT_DIST_LOADED", res + "/loaded"}});
    ASSERT_EQ(r.rc, 0) << r.err;
    // After 2 steps both sides hold Q computed in fp32 (batched per bank vs per parameter).
    EXPECT_EQ(compare_piece_q(res + "/loaded", world, groups, q2, 1e-6, "re-sharded Q at N=" + std::to_string(world)),
              dion_matrices(groups));
    for (int k = 0; k < world; ++k)
      expect_close(load_tensors(res + "/params_" + std::to_string(k) + ".pt"), want,
                   "dion resumed at N=" + std::to_string(world) + " rank " + std::to_string(k));
  }
  const std::string early = out + "/early";
  fs::create_directories(early);
  auto s0 = launch(3, "save", early, {model, {"ORTHOPT_DIST_SAVE_STEPS", "0"}});
  ASSERT_EQ(s0.rc, 0) << s0.err;
  const std::string res = early + "/resume2";
  fs::create_directories(res);
  auto r = launch(2, "resume", res, {model, {"ORTHOPT_DIST_CKPT", early + "/ckpt"}, {"ORTHOPT_DIST_FROM", "0"}});
  ASSERT_EQ(r.rc, 0) << r.err;
  for (int k = 0; k < 2; ++k)
    expect_close(load_tensors(res + "/params_" + std::to_string(k) + ".pt"), want,
                 "dion from a stateless checkpoint, rank " + std::to_string(k));
}

TEST(DistFaults, KilledRankEndsTheJobWithinTheTimeout) {
  REQUIRE_GLOO();
  const std::string out = fresh_dir("kill");
  // Grace 60 s: the launcher's SIGKILL must not be what ends the survivors.
  auto l = launch(3, "kill", out, {{"ORTHOPT_DIST_TIMEOUT_S", "10"}}, std::chrono::seconds(60));
  EXPECT_EQ(l.rc, 128 + SIGKILL) << l.err;
  EXPECT_NE(l.err.find("rank 1 was killed by signal 9"), std::string::npos) << l.err;
  EXPECT_LT(l.seconds, 30.0);
  for (int r : {0, 2}) {
    const std::string e = read_text(out + "/error_" + std::to_string(r) + ".txt");
    EXPECT_NE(e.find("failed on rank " + std::to_string(r)), std::string::npos) << e;
  }
}

TEST(DistFaults, KilledRank0WhichHostsTheStore) {
  REQUIRE_GLOO();
  const std::string out = fresh_dir("kill0");
  auto l = launch(2, "kill", out, {{"ORTHOPT_DIST_TIMEOUT_S", "10"}, {"ORTHOPT_DIST_VICTIM", "0"}},
                  std::chrono::seconds(60));
  EXPECT_EQ(l.rc, 128 + SIGKILL) << l.err;
  EXPECT_NE(l.err.find("rank 0 was killed by signal 9"), std::string::npos) << l.err;
  EXPECT_LT(l.seconds, 30.0);
  const std::string e = read_text(out + "/error_1.txt");
  EXPECT_NE(e.find("failed on rank 1"), std::string::npos) << e;
}

// The CLI: `orthopt launch` around `orthopt dist-step` (ORTHOPT_BIN is set by ctest).
TEST(DistCli, LaunchDistStepAndFailure) {
  REQUIRE_GLOO();
  const std::string bin = env("ORTHOPT_BIN");
  if (bin.empty()) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)";
  const std::string out = fresh_dir("cli");
  const std::string cmd = "OMP_NUM_THREADS=1 " + bin + " launch --nproc 2 -- " + bin +
                          " dist-step --set small --steps 1 --warmup 0 --json " + out + "/r.json > " + out +
                          "/stdout.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text(out + "/stdout.txt");
  const std::string r = read_text(out + "/r.json");
  EXPECT_NE(r.find("\"world_size\": 2"), std::string::npos) << r;
  EXPECT_NE(r.find("\"reduce_scatter_via_all_reduce\""), std::string::npos) << r;
  // A failing rank: the launcher's exit code is non-zero and names the rank.
  const std::string bad = bin + " launch --nproc 2 -- /bin/sh -c '[ $RANK = 0 ] && exit 4; exec sleep 30' > " + out + "/bad.txt 2>&1";
  const int status = std::system(bad.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 4) << status;
  EXPECT_NE(read_text(out + "/bad.txt").find("rank 0 exited with code 4"), std::string::npos) << read_text(out + "/bad.txt");
}

TEST(DistFaults, StalledRankTimesOutTheOthers) {
  REQUIRE_GLOO();
  const std::string out = fresh_dir("stall");
  auto l = launch(2, "stall", out, {{"ORTHOPT_DIST_TIMEOUT_S", "3"}}, std::chrono::seconds(60));
  EXPECT_EQ(l.rc, 3) << l.err;  // rank 0's own error exit, blamed by the launcher
  EXPECT_NE(l.err.find("rank 0 exited with code 3"), std::string::npos) << l.err;
  EXPECT_LT(l.seconds, 30.0);  // 3 s timeout + start-up, not the 60 s stall
  const std::string e = read_text(out + "/error_0.txt");
  EXPECT_NE(e.find("failed on rank 0"), std::string::npos) << e;
}

TEST(DistFaults, MismatchedConfigDetectedAtStartup) {
  REQUIRE_GLOO();
  const std::string out = fresh_dir("mismatch");
  auto l = launch(3, "mismatch", out);
  EXPECT_NE(l.rc, 0);
  for (int r = 0; r < 3; ++r) {
    const std::string e = read_text(out + "/error_" + std::to_string(r) + ".txt");
    EXPECT_NE(e.find("optimizer configuration differs across ranks: rank(s) 2"), std::string::npos) << e;
    EXPECT_NE(e.find("f=0.5"), std::string::npos) << e;
  }
}

TEST(DistContext, MissingEnvironmentNamesTheVariable) {
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("RANK");
  try {
    dist::DistContext ctx;
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE"), std::string::npos) << e.what();
  }
  dist::DistOptions o;
  o.rank = 3;
  o.world_size = 2;
  EXPECT_THROW(dist::DistContext{o}, c10::Error);
}

TEST(DistLaunch, SetsEnvironmentAndPropagatesFailure) {
  const std::string out = fresh_dir("launch");
  testing::internal::CaptureStderr();
  int rc = dist::launch_local(3, {"/bin/sh", "-c", "echo $RANK $WORLD_SIZE $MASTER_ADDR > " + out + "/env_$RANK"});
  testing::internal::GetCapturedStderr();
  ASSERT_EQ(rc, 0);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(read_text(out + "/env_" + std::to_string(r)), std::to_string(r) + " 3 127.0.0.1\n");

  // Rank 1 fails; ranks 0 and 2 would sleep for a minute: they are stopped.
  testing::internal::CaptureStderr();
  auto t0 = std::chrono::steady_clock::now();
  rc = dist::launch_local(3, {"/bin/sh", "-c", "[ \"$RANK\" = 1 ] && exit 7; exec sleep 60"});
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 7);
  EXPECT_NE(err.find("rank 1 exited with code 7"), std::string::npos) << err;
  EXPECT_LT(sec, 20.0);

  EXPECT_THROW(dist::launch_local(0, {"/bin/true"}), c10::Error);
  EXPECT_THROW(dist::launch_local(2, {"no-such-command-orthopt"}), c10::Error);
}

// The ranks share the threads init_runtime would give one process (one per core, or 1 with
// OpenBLAS's pthreads build): that / nproc each, unless the caller chose a count.
TEST(DistLaunch, SplitsTheCoresAmongLocalRanks) {
  EXPECT_EQ(dist::threads_per_local_rank(2, 2), 1);
  EXPECT_EQ(dist::threads_per_local_rank(2, 3), 1);
  EXPECT_EQ(dist::threads_per_local_rank(16, 4), 4);
  EXPECT_EQ(dist::threads_per_local_rank(16, 3), 5);
  EXPECT_EQ(dist::threads_per_local_rank(8, 1), 8);

  const char* saved_orthopt = std::getenv("ORTHOPT_NUM_THREADS");
  const char* saved_omp = std::getenv("OMP_NUM_THREADS");
  const std::string keep_orthopt = saved_orthopt ? saved_orthopt : "", keep_omp = saved_omp ? saved_omp : "";
  ::unsetenv("ORTHOPT_NUM_THREADS");
  ::unsetenv("OMP_NUM_THREADS");
  const std::string out = fresh_dir("launch_threads");
  const std::string cmd = "echo ${ORTHOPT_NUM_THREADS:-unset} > " + out + "/threads_$RANK";
  testing::internal::CaptureStderr();
  int rc = dist::launch_local(2, {"/bin/sh", "-c", cmd});
  testing::internal::GetCapturedStderr();
  ASSERT_EQ(rc, 0);
  const int per_process = orthopt::default_intra_op_threads(orthopt::available_cores(), orthopt::blas_threading());
  const std::string expected = std::to_string(dist::threads_per_local_rank(per_process, 2)) + "\n";
  for (int r = 0; r < 2; ++r) EXPECT_EQ(read_text(out + "/threads_" + std::to_string(r)), expected);

  // A variable that asks for no count ("0", which init_runtime ignores) does not shadow the split.
  ::setenv("ORTHOPT_NUM_THREADS", "0", 1);
  testing::internal::CaptureStderr();
  rc = dist::launch_local(2, {"/bin/sh", "-c", "echo ${ORTHOPT_NUM_THREADS:-unset} > " + out + "/zero_$RANK"});
  testing::internal::GetCapturedStderr();
  ASSERT_EQ(rc, 0);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(read_text(out + "/zero_" + std::to_string(r)), expected);
  ::unsetenv("ORTHOPT_NUM_THREADS");

  // A count the caller set is passed on unchanged.
  ::setenv("OMP_NUM_THREADS", "3", 1);
  testing::internal::CaptureStderr();
  rc = dist::launch_local(2, {"/bin/sh", "-c", "echo ${ORTHOPT_NUM_THREADS:-unset} $OMP_NUM_THREADS > " + out + "/omp_$RANK"});
  testing::internal::GetCapturedStderr();
  ASSERT_EQ(rc, 0);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(read_text(out + "/omp_" + std::to_string(r)), "unset 3\n");

  ::unsetenv("OMP_NUM_THREADS");
  if (saved_orthopt) ::setenv("ORTHOPT_NUM_THREADS", keep_orthopt.c_str(), 1);
  if (saved_omp) ::setenv("OMP_NUM_THREADS", keep_omp.c_str(), 1);
}

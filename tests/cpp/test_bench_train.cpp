// `orthopt bench train` through the real binary ($ORTHOPT_BIN, set by ctest): both rows hold
// positive finite timings, the FLOPs per token equal the count written out here from the preset's
// dimensions (PaLM's 6·N + 12·L·T·d, N the product weights: every matrix but the embedding), and
// the CLI's thread policy (cli/threads.h) picks the documented count for a given load.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "orthopt/runtime.h"
#include "orthopt/train/model.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int rc;
  std::string out;
  nlohmann::json doc;
};

// Runs `env <env> orthopt bench train <args> --json <file>` with the thread and wait-policy
// variables of the test's own environment removed.
CliRun bench_train(const std::string& env, const std::string& args, const std::string& name) {
  const auto dir = orthopt::test::scratch_root("orthopt_test_bench_train");
  const auto json = dir / (name + ".json");
  const auto out = dir / (name + ".out");
  const std::string cmd = "env -u ORTHOPT_NUM_THREADS -u OMP_NUM_THREADS -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "
                          "-u LOCAL_WORLD_SIZE -u ORTHOPT_TEST_BUSY_CORES " + env + " " +
                          orthopt::test::orthopt_bin() + " bench train " + args + " --json " + json.string() + " > " +
                          out.string() + " 2>&1";
  CliRun r;
  const int status = std::system(cmd.c_str());
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = cmd + "\n" + orthopt::test::read_file(out);
  if (fs::exists(json)) r.doc = nlohmann::json::parse(orthopt::test::read_file(json));
  return r;
}

// The tiny preset counted by hand: per block q, k, v and the output projection (4·d²), the three
// SwiGLU matrices (3·d·ff) and two norm gains; the embedding and the untied head (V·d each); the
// final norm gain.
struct Counts {
  double n_params, n_matmul, flops_per_token;
};

Counts tiny_counts() {
  const auto m = orthopt::train::model_preset("tiny");
  const double d = m.d_model, L = m.n_layers, ff = m.d_ff, V = m.vocab_size, T = m.context;
  Counts c;
  c.n_matmul = L * (4 * d * d + 3 * d * ff) + V * d;
  c.n_params = c.n_matmul + L * 2 * d + V * d + d;
  c.flops_per_token = 6 * c.n_matmul + 12 * L * T * d;
  return c;
}

bool positive_finite(const nlohmann::json& v) { return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0; }

}  // namespace

TEST(BenchTrain, TinyOnTheCpuGivesBothRowsWithTheHandCountedFlops) {
  if (!std::getenv("ORTHOPT_BIN")) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)";
  const CliRun r = bench_train("ORTHOPT_NUM_THREADS=1", "--device cpu --preset tiny --batch-size 4 --steps 2 --warmup 1",
                            "tiny");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("orthopt "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pytorch-peer "), std::string::npos) << r.out;
  const Counts c = tiny_counts();
  const auto& doc = r.doc;
  EXPECT_EQ(doc["flops_per_token"].get<double>(), c.flops_per_token);
  EXPECT_EQ(doc["n_matmul_params"].get<double>(), c.n_matmul);
  EXPECT_TRUE(doc["peak_flops"].is_null());  // CPU: no MFU
  ASSERT_EQ(doc["rows"].size(), 2u) << r.out;
  EXPECT_EQ(doc["rows"][0]["name"], "orthopt");
  EXPECT_EQ(doc["rows"][1]["name"], "pytorch-peer");
  const double tokens_per_step = 4.0 * orthopt::train::model_preset("tiny").context;
  for (const auto& row : doc["rows"]) {
    const std::string name = row["name"];
    EXPECT_EQ(row["n_params"].get<double>(), c.n_params) << name;
    EXPECT_EQ(row["flops_per_token"].get<double>(), c.flops_per_token) << name;
    EXPECT_EQ(row["threads"].get<int>(), 1) << name;
    for (const char* key : {"tokens_per_s", "ms_per_step", "fwd_ms", "bwd_ms", "clip_ms", "opt_ms",
                            "peak_memory_bytes", "achieved_flops", "final_loss"})
      EXPECT_TRUE(positive_finite(row[key])) << name << " " << key << ": " << row[key];
    const double parts = row["fwd_ms"].get<double>() + row["bwd_ms"].get<double>() + row["clip_ms"].get<double>() +
                         row["opt_ms"].get<double>();
    EXPECT_NEAR(row["ms_per_step"].get<double>(), parts, 1e-9 * parts) << name;
    const double tps = tokens_per_step / (row["ms_per_step"].get<double>() / 1e3);
    EXPECT_NEAR(row["tokens_per_s"].get<double>(), tps, 1e-6 * tps) << name;
    EXPECT_NEAR(row["achieved_flops"].get<double>(), c.flops_per_token * tps, 1e-6 * c.flops_per_token * tps) << name;
    EXPECT_TRUE(row["mfu"].is_null()) << name;
  }
  // Same sampler, same seed, same corpus: the same first batch.
  EXPECT_EQ(doc["rows"][0]["first_batch_sum"], doc["rows"][1]["first_batch_sum"]);
}

TEST(BenchTrain, BadPresetIsAUsageErrorNamingTheFlag) {
  if (!std::getenv("ORTHOPT_BIN")) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)";
  const CliRun r = bench_train("", "--device cpu --preset huge --dry-run", "bad_preset");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--preset"), std::string::npos) << r.out;
}

// The documented policy: ORTHOPT_NUM_THREADS / OMP_NUM_THREADS where set; else the runtime's
// default less the cores other programs keep busy (rounded), at least 1; OpenMP waits passively
// unless the environment chose a wait policy.
TEST(ThreadPolicy, ThreadsFollowTheLoadAndTheEnvironment) {
  if (!std::getenv("ORTHOPT_BIN")) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)";
  const int base = orthopt::default_intra_op_threads(orthopt::available_cores(), orthopt::blas_threading());
  struct Case {
    std::string env;
    int threads;
    std::string wait_policy;
  };
  const std::vector<Case> cases = {
      {"ORTHOPT_TEST_BUSY_CORES=0", base, "PASSIVE"},
      {"ORTHOPT_TEST_BUSY_CORES=0.4", base, "PASSIVE"},
      {"ORTHOPT_TEST_BUSY_CORES=1", std::max(1, base - 1), "PASSIVE"},
      {"ORTHOPT_TEST_BUSY_CORES=1.6", std::max(1, base - 2), "PASSIVE"},
      {"ORTHOPT_TEST_BUSY_CORES=1000", 1, "PASSIVE"},
      {"ORTHOPT_TEST_BUSY_CORES=1000 ORTHOPT_NUM_THREADS=3", 3, "PASSIVE"},
      {"ORTHOPT_TEST_BUSY_CORES=1000 OMP_NUM_THREADS=2", 2, "PASSIVE"},
      {"ORTHOPT_TEST_BUSY_CORES=0 LOCAL_WORLD_SIZE=2", std::max(1, base / 2), "PASSIVE"},
      {"ORTHOPT_TEST_BUSY_CORES=0 OMP_WAIT_POLICY=active", base, "active"},
      {"ORTHOPT_TEST_BUSY_CORES=0 GOMP_SPINCOUNT=1000", base, ""},
  };
  int i = 0;
  for (const auto& c : cases) {
    const CliRun r = bench_train(c.env, "--device cpu --preset tiny --dry-run", "policy_" + std::to_string(i++));
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.doc["threads"].get<int>(), c.threads) << c.env << "\n" << r.out;
    EXPECT_EQ(r.doc["omp_wait_policy"].get<std::string>(), c.wait_policy) << c.env << "\n" << r.out;
    EXPECT_TRUE(r.doc["flops_per_token"].is_number()) << r.out;
  }
}

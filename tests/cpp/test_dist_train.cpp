// `orthopt train --nproc N` end to end through the real binary ($ORTHOPT_BIN, set by ctest):
// the ranks train, checkpoint their optimizer shards and sampler states, and resume — with the
// same world size bit-exactly like the uninterrupted run, with another one after re-sharding.
#include "test_util.h"
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <sys/wait.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "orthopt/distributed.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using orthopt::test::read_file;
std::string bin() { return orthopt::test::orthopt_bin(); }

fs::path scratch() { return orthopt::test::scratch_root("orthopt_test_dist_train"); }


// A small deterministic text (40 KB) so the test does not depend on the default corpus.
std::string corpus() {
  static const std::string path = [] {
    const char* words[] = {"in", "the", "beginning", "was", "word", "and", "light", "shone", "upon", "waters"};
    std::string text;
    uint64_t x = 987654321;
    while (text.size() < 40000) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      text += words[(x >> 33) % 10];
      text += ((x >> 21) % 7 == 0) ? ".\n" : " ";
    }
    const auto p = scratch() / "corpus.txt";
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }();
  return path;
}

struct Run {
  int rc;
  std::string out;
};

Run train(const fs::path& run_dir, const std::string& extra) {
  const auto log = scratch() / "last.log";
  const std::string cmd = "OMP_NUM_THREADS=1 " + bin() +
                          " train --preset tiny --context 32 --batch-size 4 --steps 6 --eval-every 3 "
                          "--eval-batches 1 --checkpoint-every 3 --keep-last 5 --progress off --data " +
                          corpus() + " --run-dir " + run_dir.string() + " " + extra + " > " + log.string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), read_file(log)};
}

// metrics.jsonl without the timing fields.
std::vector<json> metrics(const fs::path& run_dir) {
  std::vector<json> out;
  std::istringstream in(read_file(run_dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json j = json::parse(line);
    j.erase("time_s");
    j.erase("tokens_per_s");
    j.erase("opt_ms");
    out.push_back(j);
  }
  return out;
}

// Scratch directories stay for inspection when a test failed, and go otherwise.
class RemoveScratchOnSuccess : public testing::Environment {
 public:
  void TearDown() override {
    if (!testing::UnitTest::GetInstance()->Failed()) fs::remove_all(scratch());
  }
};
testing::Environment* const kScratchCleanup = testing::AddGlobalTestEnvironment(new RemoveScratchOnSuccess);

#define REQUIRE_BIN_AND_GLOO()                                                          \
  if (!std::getenv("ORTHOPT_BIN")) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)"; \
  if (!orthopt::dist::backend_available("gloo")) GTEST_SKIP() << "this build has no c10d Gloo backend"

}  // namespace

TEST(DistTrain, TwoRanksCheckpointResumeAndReshard) {
  REQUIRE_BIN_AND_GLOO();
  // Uninterrupted 2-rank run.
  const fs::path a = scratch() / "a";
  auto r = train(a, "--nproc 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* f : {"model.pt", "metadata.json", "optim_shard_0.pt", "optim_shard_1.pt", "optim_shard_0.json",
                        "optim_shard_1.json", "sampler_0.txt", "sampler_1.txt"})
    EXPECT_TRUE(fs::exists(a / "step_3" / f)) << f;
  EXPECT_FALSE(fs::exists(a / "step_3" / "optimizer.pt"));
  EXPECT_FALSE(fs::exists(a / ".dist_staging_3"));
  // The shards are checksummed in the published metadata like every other file.
  EXPECT_NE(read_file(a / "step_6" / "metadata.json").find("optim_shard_1.pt"), std::string::npos);
  const auto full = metrics(a);
  ASSERT_FALSE(full.empty()) << r.out;
  // Tokens count the global batch: 2 ranks × 4 sequences × 32 bytes per step.
  EXPECT_EQ(full.front().at("tokens").get<int64_t>(), 2 * 4 * 32) << full.front().dump();

  // Interrupted after step 3, resumed with the same world size: identical metrics (CPU).
  const fs::path b = scratch() / "b";
  r = train(b, "--nproc 2 --stop-after 3");
  ASSERT_EQ(r.rc, 0) << r.out;
  fs::copy(b, scratch() / "c", fs::copy_options::recursive);
  r = train(b, "--nproc 2 --resume");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto resumed = metrics(b);
  ASSERT_EQ(resumed.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(resumed[i], full[i]) << "line " << i;

  // The same checkpoint resumed on 3 ranks: the optimizer state is re-sharded; the new rank has
  // no sampler state and says so. It must finish and evaluate finitely.
  const fs::path c = scratch() / "c";
  r = train(c, "--nproc 3 --resume");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("rank 2: the checkpoint has no sampler state"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(c / "step_6" / "optim_shard_2.pt"));
  const auto last = metrics(c).back();
  EXPECT_EQ(last.at("type"), "eval") << last.dump();
  EXPECT_TRUE(std::isfinite(last.at("val_loss").get<double>())) << last.dump();

  // A distributed checkpoint is refused by a single-process resume, with the reason.
  r = train(a, "--resume");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("written by a distributed run; resume it with --nproc"), std::string::npos) << r.out;
}

TEST(DistTrain, MoETwoRanksResumeEqualsUninterruptedRun) {
  REQUIRE_BIN_AND_GLOO();
  // The router biases are buffers outside the optimizer; they move by the expert loads. Only
  // rank 0's model is checkpointed, so if the ranks' biases drifted apart (per-rank loads), the
  // resumed run — both ranks restart from rank 0's biases — would leave the uninterrupted one.
  const std::string moe = "--nproc 2 --n-experts 4 --top-k 2 --router-bias-rate 0.01";
  const fs::path a = scratch() / "moe_a", b = scratch() / "moe_b";
  auto r = train(a, moe);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto full = metrics(a);
  ASSERT_FALSE(full.empty()) << r.out;
  r = train(b, moe + " --stop-after 3");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = train(b, moe + " --resume");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto resumed = metrics(b);
  ASSERT_EQ(resumed.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(resumed[i], full[i]) << "line " << i;
}

TEST(DistTrain, LeadKilledAfterPublishLeavesNoStagingDirectoryBehind) {
  REQUIRE_BIN_AND_GLOO();
  // The lead dies right after publishing step 3 (before it removes the staging directory of the
  // ranks' shards); the launcher then stops the other rank. The next run removes the leftover.
  const fs::path a = scratch() / "killed_after_publish";
  ::setenv("ORTHOPT_FAULT_CHECKPOINT", "after_rename", 1);
  auto r = train(a, "--nproc 2");
  ::unsetenv("ORTHOPT_FAULT_CHECKPOINT");
  ASSERT_NE(r.rc, 0) << r.out;
  ASSERT_TRUE(fs::exists(a / "step_3" / "metadata.json")) << r.out;
  ASSERT_TRUE(fs::exists(a / ".dist_staging_3")) << "the kill did not land between publish and cleanup: " << r.out;
  r = train(a, "--nproc 2 --resume");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  for (const auto& e : fs::directory_iterator(a))
    EXPECT_EQ(e.path().filename().string().rfind(".dist_staging_", 0), std::string::npos) << e.path();
  EXPECT_TRUE(fs::exists(a / "step_6" / "metadata.json"));
}

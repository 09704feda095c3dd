// Disk errors and bad input end `orthopt train` cleanly: a write that fails part-way (a full disk,
// injected with the test-only ORTHOPT_FAULT_ENOSPC, or a real small tmpfs where mounting is
// allowed) stops the run with exit 2 and a message naming the file and the errno text, publishes
// nothing, and leaves every saved checkpoint as it was; a resume once the disk has room again
// ends where an uninterrupted run ends. Usage errors exit with 2 and name the flag, file or word.
#include "test_archive_util.h"
#include "test_util.h"
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "orthopt/train/checkpoint.h"
#include "orthopt/train/data.h"
#include "orthopt/train/io.h"
#include "orthopt/version.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace orthopt::train;
using orthopt::test::error_of;
using orthopt::test::read_file;

namespace {

fs::path scratch_root() { return orthopt::test::scratch_root("orthopt_test_io_faults"); }

fs::path fresh_dir(const std::string& name) { return orthopt::test::fresh_dir(scratch_root(), name); }

// Sets an environment variable for the scope (the library reads the fault hook at each write).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string& n, const std::string& value) : name(n) { ::setenv(n.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

std::string corpus_path() {
  static const std::string path = orthopt::test::write_word_corpus(scratch_root() / "corpus.txt", 12345);
  return path;
}

using Result = orthopt::test::CliResult;
Result run(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
  return orthopt::test::run_cli(scratch_root(), args, env);
}

// 12 steps, a checkpoint every 4 (none pruned), evaluation every 4 (tiny_train_args).
std::vector<std::string> train_args(const fs::path& run_dir, std::vector<std::string> extra = {}) {
  return orthopt::test::tiny_train_args(run_dir, corpus_path(), std::move(extra));
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// metrics.jsonl without the timing fields; every line must be a whole JSON object.
std::vector<std::string> deterministic_metrics(const fs::path& run_dir) {
  std::vector<std::string> out;
  for (const auto& line : lines_of(read_file(run_dir / "metrics.jsonl"))) {
    auto j = json::parse(line);
    j.erase("time_s");
    j.erase("tokens_per_s");
    j.erase("opt_ms");
    out.push_back(j.dump());
  }
  return out;
}

// relative path -> SHA-256 of every file under dir.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> s;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) s[fs::relative(e.path(), dir).string()] = sha256_file(e.path().string());
  return s;
}

// Names in dir other than the published step_<N> checkpoints and the run's own files.
std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name == "metrics.jsonl" || name == "config.json") continue;
    if (name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos) continue;
    out.push_back(name);
  }
  return out;
}

using orthopt::test::expect_archives_equal;

// The model, optimizer and guards of two checkpoints are identical.
void expect_same_weights(const fs::path& a, const fs::path& b) {
  for (const char* f : {"model.pt", "optimizer.pt", "guards.pt"}) {
    torch::serialize::InputArchive x, y;
    x.load_from((a / f).string());
    y.load_from((b / f).string());
    expect_archives_equal(x, y, f);
  }
}

const fs::path& reference_run() {
  static const fs::path dir = [] {
    auto d = fresh_dir("reference");
    const auto r = run(train_args(d));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return d;
  }();
  return dir;
}

// A run stopped after step 4 (its checkpoint step_4 published) to resume from.
fs::path stopped_after_4(const std::string& name) {
  static const fs::path base = [] {
    auto d = fresh_dir("base_after_4");
    const auto r = run(train_args(d, {"--stop-after", "4"}));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return d;
  }();
  const auto dir = fresh_dir(name);
  fs::copy(base, dir, fs::copy_options::recursive);
  return dir;
}

void expect_enospc_error(const Result& r, const std::string& file) {
  EXPECT_EQ(r.exit_code, 2) << "signal " << r.signal << "\n" << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

}  // namespace

// ---------------------------------------------------------------- the checked writers

TEST(IoFaults, CheckedWritersFailWholeAndLeaveNoPartialFile) {
  const auto dir = fresh_dir("writers");
  fs::create_directories(dir);
  const std::string file = (dir / "a.bin").string();
  {
    ScopedEnv fault("ORTHOPT_FAULT_ENOSPC", "a.bin@100");
    const std::string msg = error_of([&] { write_file_checked(file, std::string(1000, 'x')); });
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(file));
    write_file_checked(file, std::string(100, 'y'));  // fits under the limit
    EXPECT_EQ(read_file(file), std::string(100, 'y'));
  }
  // An append that does not fit is cut back: the file keeps only whole records.
  const std::string log = (dir / "log.jsonl").string();
  {
    ScopedEnv fault("ORTHOPT_FAULT_ENOSPC", "log.jsonl@20");
    AppendFile f(log);
    f.append("{\"a\":1}\n");
    const std::string msg = error_of([&] { f.append("{\"b\":22222222222}\n"); });
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    EXPECT_EQ(read_file(log), "{\"a\":1}\n");
  }
  // An atomic replacement that fails keeps the old content and leaves no temporary file.
  const std::string target = (dir / "config.json").string();
  write_file_atomically(target, "old\n");
  {
    ScopedEnv fault("ORTHOPT_FAULT_ENOSPC", "config.json@3");
    const std::string msg = error_of([&] { write_file_atomically(target, "new content\n"); });
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    EXPECT_NE(msg.find(target), std::string::npos) << msg;
  }
  EXPECT_EQ(read_file(target), "old\n");
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  // A malformed fault spec is an error, not a fault that never fires.
  {
    ScopedEnv fault("ORTHOPT_FAULT_ENOSPC", "a.bin");
    EXPECT_NE(error_of([&] { write_file_checked(file, "z"); }).find("ORTHOPT_FAULT_ENOSPC"), std::string::npos);
  }
}

TEST(IoFaults, ArchiveBytesRoundTrip) {
  torch::serialize::OutputArchive out;
  const at::Tensor t = torch::randn({7, 5});
  out.write("t", t);
  const std::string bytes = archive_bytes(out);
  std::istringstream in(bytes);
  torch::serialize::InputArchive back;
  back.load_from(in);
  at::Tensor u;
  back.read("t", u);
  EXPECT_TRUE(torch::equal(t, u));
}

TEST(IoFaults, FullDiskDuringWriteCheckpointKeepsThePreviousOne) {
  const auto dir = fresh_dir("library_ckpt");
  const std::string run_dir = (dir / "run").string();
  auto files = [](const std::string& a, const std::string& b) {
    return std::vector<std::pair<std::string, CheckpointFileWriter>>{
        {"a", [a](const std::string& p) { write_file_checked(p, a); }},
        {"b", [b](const std::string& p) { write_file_checked(p, b); }}};
  };
  write_checkpoint(run_dir, 1, files(std::string(300, '1'), std::string(300, '2')), {});
  const auto before = snapshot(run_dir);
  {
    ScopedEnv fault("ORTHOPT_FAULT_ENOSPC", "step_2.tmp/b@100");
    const std::string msg =
        error_of([&] { write_checkpoint(run_dir, 2, files(std::string(300, '3'), std::string(300, '4')), {}); });
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step_2.tmp/b"), std::string::npos) << msg;
  }
  {
    ScopedEnv fault("ORTHOPT_FAULT_ENOSPC", "step_2.tmp/metadata.json@10");
    EXPECT_NE(error_of([&] { write_checkpoint(run_dir, 2, files("3", "4"), {}); }).find("metadata.json"),
              std::string::npos);
  }
  EXPECT_FALSE(fs::exists(checkpoint_dir(run_dir, 2)));
  EXPECT_FALSE(fs::exists(checkpoint_dir(run_dir, 2) + ".tmp"));  // its space is given back
  EXPECT_EQ(snapshot(run_dir), before);
  EXPECT_EQ(*latest_valid_checkpoint(run_dir), checkpoint_dir(run_dir, 1));
  write_checkpoint(run_dir, 2, files("3", "4"), {});  // room again: the next save works
  EXPECT_NO_THROW(verify_checkpoint(checkpoint_dir(run_dir, 2)));
}

// ---------------------------------------------------------------- the trainer

TEST(IoFaults, FullDiskWhileWritingEachCheckpointFileStopsTheRunThenResumes) {
  // Each file of the step-8 checkpoint in turn fails part-way (metrics.jsonl is the checkpoint's
  // copy); the run resumed from step_4 must stop with exit 2 and change nothing already saved.
  for (const std::string file : {"model.pt", "optimizer.pt", "guards.pt", "metrics.jsonl", "metadata.json"}) {
    SCOPED_TRACE(file);
    const auto dir = stopped_after_4("ckpt_" + file);
    const auto step4 = snapshot(dir / "step_4");
    auto r = run(train_args(dir, {"--resume"}), {{"ORTHOPT_FAULT_ENOSPC", "step_8.tmp/" + file + "@1000"}});
    expect_enospc_error(r, "step_8.tmp/" + file);
    EXPECT_NE(r.err.find("the run stopped at step 8; the checkpoints already saved are unchanged"), std::string::npos)
        << r.err;
    EXPECT_EQ(snapshot(dir / "step_4"), step4);
    EXPECT_FALSE(fs::exists(dir / "step_8"));
    EXPECT_TRUE(leftovers(dir).empty()) << leftovers(dir).front();
    EXPECT_EQ(fs::path(*latest_valid_checkpoint(dir.string())).filename(), "step_4");
    // The disk has room again: the resume ends as the uninterrupted run.
    r = run(train_args(dir, {"--resume"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_same_weights(reference_run() / "step_12", dir / "step_12");
    EXPECT_EQ(deterministic_metrics(dir), deterministic_metrics(reference_run()));
  }
}

TEST(IoFaults, TransientFullDiskOnMetricsStopsTheRunWithWholeLinesThenResumes) {
  // The disk is full from the middle of step 6's metrics line on: every later line would have
  // been lost and the step-8 checkpoint would have copied the cut file. (Lines differ in length
  // by their timing fields: the limit is half a line past the end of step 5's.)
  const auto dir = stopped_after_4("metrics_full");
  const auto step4 = snapshot(dir / "step_4");
  const std::string metrics = (dir / "metrics.jsonl").string();
  const auto base_lines = lines_of(read_file(metrics));  // steps 1-4 and the evaluation at 4
  const size_t line = base_lines.front().size() + 1;
  const size_t limit = read_file(metrics).size() + line + line / 2;
  const size_t kept = base_lines.size() + 1;  // ... and step 5
  auto r = run(train_args(dir, {"--resume"}), {{"ORTHOPT_FAULT_ENOSPC", metrics + "@" + std::to_string(limit)}});
  expect_enospc_error(r, metrics);
  EXPECT_NE(r.err.find("the run stopped at step 6"), std::string::npos) << r.err;
  // Whole lines only, those of steps 1-5, and no checkpoint after the failure.
  const auto got = deterministic_metrics(dir);  // throws on a cut line
  ASSERT_EQ(got.size(), kept);
  const auto want = deterministic_metrics(reference_run());
  EXPECT_EQ(got, std::vector<std::string>(want.begin(), want.begin() + kept));
  EXPECT_EQ(snapshot(dir / "step_4"), step4);
  EXPECT_FALSE(fs::exists(dir / "step_8"));
  r = run(train_args(dir, {"--resume"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_weights(reference_run() / "step_12", dir / "step_12");
  EXPECT_EQ(deterministic_metrics(dir), deterministic_metrics(reference_run()));
  // Every checkpoint's copy of the metrics is whole lines too.
  for (int step : {4, 8, 12})
    for (const auto& line : lines_of(read_file(dir / ("step_" + std::to_string(step)) / "metrics.jsonl")))
      EXPECT_NO_THROW(json::parse(line)) << step << ": " << line;
}

TEST(IoFaults, FullDiskOnConfigOfAFreshRun) {
  const auto dir = fresh_dir("config_full");
  const auto r = run(train_args(dir), {{"ORTHOPT_FAULT_ENOSPC", (dir / "config.json").string() + "@10"}});
  expect_enospc_error(r, (dir / "config.json").string());
  EXPECT_FALSE(fs::exists(dir / "config.json"));
  for (const auto& e : fs::directory_iterator(dir)) ADD_FAILURE() << "left behind: " << e.path();
}

TEST(IoFaults, RealFullTmpfs) {
  // A tmpfs with room for about one checkpoint: the second save runs out of space.
  const auto mnt = fresh_dir("tmpfs");
  fs::create_directories(mnt);
  uint64_t one = 0;
  for (const auto& e : fs::recursive_directory_iterator(reference_run() / "step_4"))
    if (e.is_regular_file()) one += e.file_size();
  const std::string opts = "size=" + std::to_string(one + one / 2 + 200000);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0)
    GTEST_SKIP() << "mount -t tmpfs not permitted here (" << std::strerror(errno)
                 << "); the injected ENOSPC tests cover the same paths";
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const auto dir = mnt / "run";
  auto r = run(train_args(dir));
  EXPECT_EQ(r.exit_code, 2) << "signal " << r.signal << "\n" << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  // What was saved before the disk filled up is intact.
  auto latest = latest_valid_checkpoint(dir.string());
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(), "step_4");
  expect_same_weights(reference_run() / "step_4", *latest);
  EXPECT_TRUE(leftovers(dir).empty()) << leftovers(dir).front();
  for (const auto& line : lines_of(read_file(dir / "metrics.jsonl"))) EXPECT_NO_THROW(json::parse(line)) << line;

  // The issue's case: a 300 KB disk fills up during the first checkpoint.
  ASSERT_EQ(::umount2(mnt.c_str(), 0), 0) << std::strerror(errno);
  ASSERT_EQ(::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=300k"), 0) << std::strerror(errno);
  r = run(train_args(mnt / "small", {"--checkpoint-every", "2"}));
  EXPECT_EQ(r.exit_code, 2) << "signal " << r.signal << "\n" << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_FALSE(latest_valid_checkpoint((mnt / "small").string()).has_value());
}

TEST(IoFaults, StepDirectoryBeyondInt64IsSkippedWithAWarning) {
  const auto dir = fresh_dir("huge_step");
  fs::create_directories(dir / "step_99999999999999999999");
  const auto listed = step_directories(dir.string());
  EXPECT_TRUE(listed.empty());
  auto r = run(train_args(dir, {"--steps", "4"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("step_99999999999999999999"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("out of range"), std::string::npos) << r.err;
  r = run(train_args(dir, {"--steps", "4", "--resume"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir / "step_99999999999999999999"));  // left alone
  ASSERT_EQ(step_directories(dir.string()).size(), 1u);
  EXPECT_EQ(step_directories(dir.string())[0].step, 4);
}

TEST(IoFaults, StaleStagingDirectoriesAreRemoved) {
  const auto dir = stopped_after_4("staging");
  fs::create_directories(dir / ".dist_staging_4");
  std::ofstream(dir / ".dist_staging_4" / "optim_shard_0.pt") << "stale";
  fs::create_directories(dir / ".dist_staging_notastep");  // not ours: left alone
  const auto r = run(train_args(dir, {"--resume"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir / ".dist_staging_4"));
  EXPECT_TRUE(fs::exists(dir / ".dist_staging_notastep"));
}

// ---------------------------------------------------------------- usage errors

struct BadInput {
  std::string name;
  std::vector<std::string> args;  // {RUN_DIR} and {CONFIG} are replaced
  std::string config;             // written to {CONFIG} when not empty
  std::vector<std::string> needles;
};

TEST(IoFaults, UsageErrorsExitWith2AndNameTheInput) {
  const std::vector<BadInput> cases = {
      {"config_array", {"--config", "{CONFIG}", "--steps", "2"}, "[1, 2]", {"--config", "{CONFIG}", "JSON object", "array"}},
      {"config_string", {"--config", "{CONFIG}", "--steps", "2"}, "\"steps\"", {"--config", "{CONFIG}", "JSON object", "string"}},
      {"config_directory", {"--config", "{DIR}"}, "", {"--config", "{DIR}", "directory"}},
      {"config_missing", {"--config", "{DIR}/nope.json"}, "", {"--config", "nope.json", "does not exist"}},
      {"config_null", {"--config", "{CONFIG}"}, R"({"lr": null})", {"--config", "'lr'", "null"}},
      {"config_int_overflow", {"--config", "{CONFIG}"}, R"({"grad_accum": 9223372036854775808})",
       {"'grad_accum'", "out of range"}},
      {"flag_int_overflow", {"--batch-size", "9223372036854775808"}, "", {"--batch-size", "out of range"}},
      {"flag_negative_seed", {"--seed", "-1"}, "", {"--seed", "non-negative"}},
      {"unknown_flag", {"--stpes", "3"}, "", {"--stpes", "did you mean '--steps'"}},
      {"unknown_flag_far", {"--bogus-flag", "1"}, "", {"--bogus-flag"}},
      {"bad_nproc", {"--nproc", "many"}, "", {"--nproc"}},
  };
  const auto cfg = scratch_root() / "usage_config.json";
  const auto cfg_dir = fresh_dir("usage_config_dir");
  fs::create_directories(cfg_dir);
  auto subst = [&](std::string s) {
    for (const auto& [key, value] : std::map<std::string, std::string>{{"{CONFIG}", cfg.string()}, {"{DIR}", cfg_dir.string()}})
      for (size_t at; (at = s.find(key)) != std::string::npos;) s.replace(at, key.size(), value);
    return s;
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    if (!c.config.empty()) std::ofstream(cfg) << c.config;
    const auto dir = fresh_dir("usage_" + c.name);
    std::vector<std::string> extra;
    for (const auto& a : c.args) extra.push_back(subst(a));
    const auto r = run(train_args(dir, extra));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    for (const auto& n : c.needles) EXPECT_NE(r.err.find(subst(n)), std::string::npos) << subst(n) << "\n" << r.err;
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir)) << "wrote " << dir;
  }
  // Outside `train`: commands and compare's own flags.
  struct Plain {
    std::vector<std::string> args;
    std::vector<std::string> needles;
  };
  const auto cdir = fresh_dir("usage_compare");
  const std::vector<Plain> plain = {
      {{"trian", "--steps", "2"}, {"unknown command 'trian'", "did you mean 'train'"}},
      {{"frobnicate"}, {"unknown command 'frobnicate'", "commands:"}},
      {{}, {"subcommand", "commands:"}},
      {{"compare", "--seeds", "-1", "--steps", "2", "--data", corpus_path(), "--run-dir", cdir.string(), "--no-plot"},
       {"--seeds", "non-negative", "'-1'"}},
      {{"compare", "--seeds", "1,x", "--steps", "2", "--data", corpus_path(), "--run-dir", cdir.string(), "--no-plot"},
       {"--seeds", "'x'"}},
      {{"compare", "--algoritms", "muon", "--run-dir", cdir.string()}, {"did you mean '--algorithms'"}},
  };
  for (const auto& c : plain) {
    SCOPED_TRACE(c.args.empty() ? std::string("(no arguments)") : c.args[0] + " " + (c.args.size() > 1 ? c.args[1] : ""));
    const auto r = run(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    for (const auto& n : c.needles) EXPECT_NE(r.err.find(n), std::string::npos) << n << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(cdir));
  // Help and the version still succeed.
  EXPECT_EQ(run({"--help"}).exit_code, 0);
  EXPECT_EQ(run({"train", "--help"}).exit_code, 0);
  const auto version = run({"--version"});
  EXPECT_EQ(version.exit_code, 0) << version.err;
  EXPECT_EQ(version.out, std::string("orthopt ") + ORTHOPT_VERSION_STRING + "\n");
}

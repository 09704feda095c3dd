// `orthopt train` end to end through the real binary ($ORTHOPT_BIN): bit-exact resume,
// the non-finite firewall, crash safety under SIGKILL and injected faults during checkpoint
// writes, clear errors that leave the run directory untouched, gradient accumulation and a
// quick `orthopt compare`. Tiny model, 32-byte context, 4 sequences per batch: seconds per run.
#include "test_archive_util.h"
#include "test_util.h"
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "orthopt/train/checkpoint.h"
#include "orthopt/train/schedule.h"
#include "orthopt/train/trainer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace orthopt::train;

namespace {

using orthopt::test::read_file;

fs::path scratch_root() { return orthopt::test::scratch_root("orthopt_test_trainer"); }

fs::path fresh_dir(const std::string& name) { return orthopt::test::fresh_dir(scratch_root(), name); }

std::string corpus_path() {
  static const std::string path = orthopt::test::write_word_corpus(scratch_root() / "corpus.txt", 12345);
  return path;
}

using Result = orthopt::test::CliResult;
using orthopt::test::spawn_cli;
using orthopt::test::wait_cli;
Result run(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
  return orthopt::test::run_cli(scratch_root(), args, env);
}

// The run every test compares against: 12 steps, evaluation every 4 (tiny_train_args).
std::vector<std::string> train_args(const fs::path& run_dir, std::vector<std::string> extra = {}) {
  return orthopt::test::tiny_train_args(run_dir, corpus_path(), std::move(extra));
}

// metrics.jsonl without the timing fields (the only ones allowed to differ between runs).
std::vector<std::string> deterministic_metrics(const fs::path& run_dir) {
  std::vector<std::string> lines;
  std::istringstream in(read_file(run_dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line);
    j.erase("time_s");
    j.erase("tokens_per_s");
    j.erase("opt_ms");
    lines.push_back(j.dump());
  }
  return lines;
}

using orthopt::test::expect_archives_equal;

void expect_same_file_content(const fs::path& a, const fs::path& b) {
  torch::serialize::InputArchive x, y;
  x.load_from(a.string());
  y.load_from(b.string());
  expect_archives_equal(x, y, a.filename().string());
}

void expect_same_checkpoint(const fs::path& a, const fs::path& b, bool with_guards = true) {
  ASSERT_TRUE(fs::exists(a)) << a;
  ASSERT_TRUE(fs::exists(b)) << b;
  expect_same_file_content(a / "model.pt", b / "model.pt");
  expect_same_file_content(a / "optimizer.pt", b / "optimizer.pt");
  if (with_guards) expect_same_file_content(a / "guards.pt", b / "guards.pt");
}

// path -> SHA-256 of every file under dir (to prove nothing was written).
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> s;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) s[fs::relative(e.path(), dir).string()] = sha256_file(e.path().string());
  return s;
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

}  // namespace

TEST(Trainer, ReferenceRunLearnsAndLogs) {
  const auto& dir = reference_run();
  const auto lines = deterministic_metrics(dir);
  int train_lines = 0, eval_lines = 0;
  double first_loss = 0, last_eval = 0;
  for (const auto& l : lines) {
    auto j = json::parse(l);
    if (j["type"] == "train") {
      ++train_lines;
      EXPECT_EQ(j["step"].get<int64_t>(), train_lines);
      EXPECT_EQ(j["skipped"], "none");
      if (train_lines == 1) first_loss = j["loss"].get<double>();
    } else {
      ++eval_lines;
      last_eval = j["val_loss"].get<double>();
      EXPECT_NEAR(j["val_bpb"].get<double>(), last_eval / std::log(2.0), 1e-12);
    }
  }
  EXPECT_EQ(train_lines, 12);
  EXPECT_EQ(eval_lines, 3);  // steps 4, 8, 12
  EXPECT_NEAR(first_loss, std::log(256.0), 0.3);
  EXPECT_LT(last_eval, first_loss - 0.5);  // 12 steps on a 20-word corpus: clearly learning
  // keep_last 10: checkpoints 4, 8, 12, all valid.
  for (int s : {4, 8, 12}) EXPECT_NO_THROW(verify_checkpoint((dir / ("step_" + std::to_string(s))).string()));
}

TEST(Trainer, ResumeIsBitExact) {
  const auto dir = fresh_dir("resume");
  auto r = run(train_args(dir, {"--stop-after", "6"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(dir / "step_6"));
  ASSERT_FALSE(fs::exists(dir / "step_8"));
  r = run(train_args(dir, {"--resume"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos);
  expect_same_checkpoint(reference_run() / "step_12", dir / "step_12");
  EXPECT_EQ(deterministic_metrics(reference_run()), deterministic_metrics(dir));
}

namespace {

// On the CPU: a run stopped at step 6 with the flags `first` and resumed with `second` ends with
// the uninterrupted run's checkpoint and metrics. Returns the first part's stdout.
std::string expect_stopped_and_resumed_like_reference(const std::string& name, std::vector<std::string> first,
                                                      std::vector<std::string> second) {
  const std::vector<std::string> cpu = {"--device", "cpu"};
  fs::path reference = reference_run();
  if (torch::cuda::is_available()) {  // the shared reference ran under device auto, on the GPU
    reference = fresh_dir(name + "_reference");
    const auto r = run(train_args(reference, cpu));
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  const auto dir = fresh_dir(name);
  first.insert(first.begin(), cpu.begin(), cpu.end());
  first.insert(first.end(), {"--stop-after", "6"});
  const auto r1 = run(train_args(dir, first));
  EXPECT_EQ(r1.exit_code, 0) << r1.err;
  second.insert(second.begin(), cpu.begin(), cpu.end());
  second.push_back("--resume");
  const auto r2 = run(train_args(dir, second));
  EXPECT_EQ(r2.exit_code, 0) << r2.err;
  expect_same_checkpoint(reference / "step_12", dir / "step_12");
  EXPECT_EQ(deterministic_metrics(reference), deterministic_metrics(dir));
  return r1.out;
}

}  // namespace

// `deterministic` (like `cuda_graph`) says how a step executes, not what it computes: it is not
// in the config hash, so a run may be resumed with it toggled; on the CPU, torch's strict mode
// runs every operation of the loop and changes no bit. On CUDA it picks other kernels (other
// bits), so the check runs on the CPU, against a CPU reference where the shared one ran on a GPU.
TEST(Trainer, DeterministicIsAnExecutionOption) {
  const std::string out = expect_stopped_and_resumed_like_reference("deterministic", {"--deterministic", "true"}, {});
  EXPECT_NE(out.find("deterministic kernels"), std::string::npos) << out;
}

// Activation checkpointing recomputes the same operations: a run that changes the mode on
// resume ends with the uninterrupted run's checkpoint and metrics.
TEST(Trainer, ActivationCheckpointingIsAnExecutionOption) {
  expect_stopped_and_resumed_like_reference("activation_checkpointing", {"--activation-checkpointing", "block"},
                                            {"--activation-checkpointing", "selective"});
}

// Dion with the Cholesky QR trains (finite loss, validation written) and says how often it fell
// back to Householder; its config records the choice.
TEST(Trainer, DionCholeskyQrTrainsAndReportsFallbacks) {
  const auto dir = fresh_dir("dion_cholesky");
  const auto r = run(train_args(dir, {"--algorithm", "dion", "--dion-qr", "cholesky", "--steps", "4", "--eval-every", "4"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("dion_qr cholesky fell back to Householder in "), std::string::npos) << r.out;
  EXPECT_EQ(json::parse(read_file(dir / "config.json"))["dion_qr"], "cholesky");
  EXPECT_NE(r.out.find("final val loss"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("final val loss nan"), std::string::npos) << r.out;
}

// `tf32` computes other bits, so it is in the config hash (a run resumes only as it began), but
// only when set: the checkpoints of runs from before the key still resume.
TEST(Trainer, Tf32IsHashedOnlyWhenSet) {
  TrainConfig c;
  c.device = "cuda";
  const std::string plain = config_sha256(c, "data");
  EXPECT_EQ(config_sha256(config_from_json(json{{"device", "cuda"}, {"tf32", false}}), "data"), plain);
  c.tf32 = true;
  EXPECT_NE(config_sha256(c, "data"), plain);
  EXPECT_EQ(to_json(c)["tf32"], true);
  EXPECT_TRUE(config_from_json(to_json(c)).tf32);
}

TEST(Trainer, GradAccumulationAdvancesPerOptimizerStep) {
  const auto dir = fresh_dir("accum");
  auto r = run(train_args(dir, {"--grad-accum", "3", "--steps", "5", "--eval-every", "5"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  LrSchedule wsd;  // the default schedule
  int64_t s = 0;
  for (const auto& l : deterministic_metrics(dir)) {
    auto j = json::parse(l);
    if (j["type"] != "train") continue;
    ++s;
    EXPECT_EQ(j["step"].get<int64_t>(), s);
    EXPECT_EQ(j["tokens"].get<int64_t>(), s * 3 * 4 * 32);
    EXPECT_DOUBLE_EQ(j["lr_factor"].get<double>(), lr_factor(wsd, 5, s));
  }
  EXPECT_EQ(s, 5);
}

TEST(Trainer, NonFiniteStepsAreSkippedThenAbort) {
  const auto dir = fresh_dir("nonfinite");
  auto r = run(train_args(dir, {"--steps", "6", "--checkpoint-every", "2", "--inject-nonfinite", "3,4"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step 3: non-finite loss or gradient norm, step skipped"), std::string::npos) << r.out;
  for (const auto& l : deterministic_metrics(dir)) {
    auto j = json::parse(l);
    if (j["type"] == "train")
      EXPECT_EQ(j["skipped"], (j["step"] == 3 || j["step"] == 4) ? "nonfinite" : "none") << l;
  }
  // Steps 3 and 4 were skipped: params and optimizer state after step 4 are those after step 2.
  expect_same_checkpoint(dir / "step_2", dir / "step_4", /*with_guards=*/false);
  // ... and step 5 trains again.
  torch::serialize::InputArchive a, b;
  a.load_from((dir / "step_4" / "model.pt").string());
  b.load_from((dir / "step_6" / "model.pt").string());
  torch::serialize::InputArchive ha, hb;  // module archives nest: lm_head/weight
  a.read("lm_head", ha);
  b.read("lm_head", hb);
  at::Tensor wa, wb;
  ha.read("weight", wa);
  hb.read("weight", wb);
  EXPECT_FALSE(torch::equal(wa, wb));

  const auto dir2 = fresh_dir("nonfinite_abort");
  r = run(train_args(dir2, {"--inject-nonfinite", "3,4,5,6", "--max-nonfinite", "3"}));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.err.find("aborting at step 5: 3 consecutive steps with a non-finite loss"), std::string::npos) << r.err;
}

TEST(Trainer, SigkillDuringCheckpointingThenResume) {
  const auto dir = fresh_dir("sigkill");
  fs::create_directories(dir);
  const auto out = scratch_root() / "kill.out", err = scratch_root() / "kill.err";
  // A checkpoint every step, so most of the wall time is spent inside checkpoint writes.
  // inotify reports the creation of step_N.tmp at once: the kill lands while its files are
  // being written (polling the directory is too slow to catch a write of a few milliseconds).
  const int watch = ::inotify_init1(IN_NONBLOCK);
  ASSERT_GE(watch, 0);
  ASSERT_GE(::inotify_add_watch(watch, dir.c_str(), IN_CREATE), 0);
  const pid_t pid = spawn_cli(train_args(dir, {"--checkpoint-every", "1", "--keep-last", "2"}), {}, out, err);
  bool killed = false;
  std::string killed_at;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!killed && std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{watch, POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) {
      if (::waitpid(pid, nullptr, WNOHANG) != 0) break;  // ended without being killed
      continue;
    }
    alignas(inotify_event) char buf[4096];
    const ssize_t n = ::read(watch, buf, sizeof(buf));
    for (ssize_t off = 0; n > 0 && off < n && !killed;) {
      const auto* ev = reinterpret_cast<const inotify_event*>(buf + off);
      const std::string name = ev->len ? ev->name : "";
      // Kill while the checkpoint of step >= 5 is being written (its step_N.tmp just appeared).
      std::smatch m;
      static const std::regex publishing(R"(step_(\d+)\.tmp)");
      if (std::regex_match(name, m, publishing) && std::stoll(m[1]) >= 5) {
        ::kill(pid, SIGKILL);
        killed = true;
        killed_at = name;
      }
      off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
    }
  }
  ::close(watch);
  const auto r = wait_cli(pid, out, err);
  ASSERT_TRUE(killed) << "never saw a checkpoint being written: " << r.err;
  ASSERT_EQ(r.signal, SIGKILL) << r.out << r.err;
  EXPECT_TRUE(fs::exists(dir / killed_at)) << killed_at << " was published or removed before the kill landed";
  // What is left: complete checkpoints and at most a stale .tmp, never a half-published step_N.
  int complete = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.find(".tmp") == std::string::npos) {
      EXPECT_NO_THROW(verify_checkpoint(e.path().string())) << name;
      ++complete;
    }
  }
  EXPECT_GE(complete, 1);
  const auto resumed = run(train_args(dir, {"--checkpoint-every", "1", "--keep-last", "2", "--resume"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  expect_same_checkpoint(reference_run() / "step_12", dir / "step_12");
  EXPECT_EQ(deterministic_metrics(reference_run()), deterministic_metrics(dir));
}

TEST(Trainer, InjectedCrashAtEveryCheckpointStageThenResume) {
  const auto base = fresh_dir("stages_base");
  auto r = run(train_args(base, {"--stop-after", "4"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& stage : kCheckpointFaultStages) {
    SCOPED_TRACE(stage);
    const auto dir = fresh_dir("stage_" + stage);
    fs::copy(base, dir, fs::copy_options::recursive);
    // Resume and crash while writing the checkpoint of step 8.
    r = run(train_args(dir, {"--resume"}), {{"ORTHOPT_FAULT_CHECKPOINT", stage}});
    ASSERT_EQ(r.exit_code, 137) << r.err;
    auto latest = latest_valid_checkpoint(dir.string());
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(fs::path(*latest).filename(), stage == "after_rename" ? "step_8" : "step_4");
    r = run(train_args(dir, {"--resume"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_same_checkpoint(reference_run() / "step_12", dir / "step_12");
    EXPECT_EQ(deterministic_metrics(reference_run()), deterministic_metrics(dir));
  }
}

TEST(Trainer, BadInputGivesClearErrorsAndWritesNothing) {
  auto expect_error = [](const Result& r, const std::string& needle) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
  };
  const auto none = fresh_dir("never_created");
  expect_error(run(train_args(none, {"--bogus-flag", "1"})), "--bogus-flag");
  expect_error(run(train_args(none, {"--steps", "0"})), "steps: must be in [1");
  expect_error(run(train_args(none, {"--batch-size", "four"})), "--batch-size: expected an integer");
  expect_error(run(train_args(none, {"--lr", "-1"})), "lr: must be in [0, 10]");
  expect_error(run(train_args(none, {"--algorithm", "sgd"})), "algorithm: unknown 'sgd'");
  expect_error(run(train_args(none, {"--schedule", "linear"})), "schedule");
  expect_error(run(train_args(none, {"--algorithm", "dion", "--dion-qr", "givens"})),
               "dion_qr: must be householder or cholesky, got 'givens'");
  expect_error(run(train_args(none, {"--data", (scratch_root() / "nope.txt").string()})), "does not exist");
  expect_error(run(train_args(none, {"--cuda-graph", "true", "--device", "cpu"})),
               "cuda_graph: needs a CUDA device, but device is 'cpu'");
  expect_error(run(train_args(none, {"--cuda-graph", "true", "--nproc", "2"})), "--cuda-graph: not available with --nproc");
  if (!torch::cuda::is_available())  // device auto finds no GPU: refused before anything is written
    expect_error(run(train_args(none, {"--cuda-graph", "true"})), "cuda_graph: needs a CUDA device; device 'auto' resolved to cpu");
  expect_error(run(train_args(none, {"--tf32", "true", "--device", "cpu"})), "tf32: needs a CUDA device, but device is 'cpu'");
  if (!torch::cuda::is_available())
    expect_error(run(train_args(none, {"--tf32", "true"})), "tf32: needs a CUDA device; device 'auto' resolved to cpu");
  expect_error(run(train_args(none, {"--tf32", "maybe"})), "--tf32");
  EXPECT_FALSE(fs::exists(none));
  // compare checks every run's configuration before the first run starts.
  const auto refused = fresh_dir("compare_refused");
  expect_error(run({"compare", "--steps", "2", "--data", corpus_path(), "--algorithms", "adamw,sgd", "--run-dir",
                    refused.string(), "--no-plot"}),
               "algorithm: unknown 'sgd'");
  EXPECT_FALSE(fs::exists(refused));

  // A run to resume from (checkpoint at step 4).
  const auto dir = fresh_dir("errors");
  auto r = run(train_args(dir, {"--stop-after", "4"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto before = snapshot(dir);
  expect_error(run(train_args(dir, {"--resume", "--lr", "0.05"})), "config mismatch");
  EXPECT_EQ(snapshot(dir), before);
  expect_error(run(train_args(dir, {"--resume", "--dion-qr", "cholesky"})), "config mismatch");
  EXPECT_EQ(snapshot(dir), before);
  expect_error(run(train_args(dir)), "already holds a run");
  EXPECT_EQ(snapshot(dir), before);

  // Corrupt one byte of the only checkpoint.
  {
    std::fstream f(dir / "step_4" / "optimizer.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char ch;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x5a);
    f.seekp(100);
    f.write(&ch, 1);
  }
  before = snapshot(dir);
  expect_error(run(train_args(dir, {"--resume"})), "corrupted");
  EXPECT_EQ(snapshot(dir), before);

  // Config file: unknown keys are errors; flags override the file's values.
  const auto cfg_bad = scratch_root() / "bad.json";
  std::ofstream(cfg_bad) << R"({"steps": 3, "learning_rate": 0.1})";
  expect_error(run(train_args(fresh_dir("cfg_bad"), {"--config", cfg_bad.string()})), "unknown key 'learning_rate'");
  const auto cfg = scratch_root() / "good.json";
  std::ofstream(cfg) << R"({"steps": 3, "lr": 0.013, "eval_every": 1})";
  const auto cdir = fresh_dir("cfg");
  std::vector<std::string> args = train_args(cdir);
  args.insert(args.end(), {"--config", cfg.string(), "--steps", "2"});
  r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto written = json::parse(read_file(cdir / "config.json"));
  EXPECT_EQ(written["steps"], 2);     // the flag won over the file
  EXPECT_EQ(written["lr"], 0.013);    // the file's value was used
  EXPECT_EQ(written["eval_every"], 4);  // train_args' flag won over the file
}

TEST(Trainer, CompareWritesTablesAndPlot) {
  const auto dir = fresh_dir("compare");
  const char* src = std::getenv("ORTHOPT_SOURCE_DIR");
  ASSERT_TRUE(src) << "ORTHOPT_SOURCE_DIR is set by ctest";
  auto r = run({"compare", "--preset", "tiny", "--context", "32", "--batch-size", "4", "--steps", "6",
                "--eval-every", "3", "--eval-batches", "2", "--data", corpus_path(), "--algorithms", "adamw,muon",
                "--run-dir", dir.string(), "--plot-script", std::string(src) + "/scripts/plot_compare.py"});
  // The plot needs matplotlib in /usr/bin/python3 (scripts/bootstrap.sh installs it; the GPU
  // machine has none): without it compare writes the tables and says how to draw the plot later.
  const bool can_plot = std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  if (!can_plot) EXPECT_NE(r.out.find("plot: not drawn"), std::string::npos) << r.out;
  const std::string csv = read_file(dir / "compare.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;  // header + 2 optimizers
  EXPECT_NE(csv.find("\nadamw,"), std::string::npos);
  EXPECT_NE(csv.find("\nmuon,"), std::string::npos);
  EXPECT_NE(read_file(dir / "compare.md").find("| muon |"), std::string::npos);
  if (can_plot) {
    const std::string png = read_file(dir / "compare.png");
    ASSERT_GT(png.size(), 1000u);
    EXPECT_EQ(png.substr(1, 3), "PNG");
  } else {
    EXPECT_FALSE(fs::exists(dir / "compare.png"));
  }
  // The curves hold both optimizers' evaluations at steps 3 and 6.
  const std::string curves = read_file(dir / "curves.csv");
  EXPECT_NE(curves.find("adamw,1,6,"), std::string::npos);
  EXPECT_NE(curves.find("muon,1,3,"), std::string::npos);
  // A second comparison into the same directory is refused.
  r = run({"compare", "--steps", "2", "--data", corpus_path(), "--run-dir", dir.string(), "--no-plot"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("already holds a comparison"), std::string::npos) << r.err;
}

TEST(Trainer, MoEResumeIsBitExactAndBiasesMove) {
  const std::vector<std::string> moe = {"--n-experts", "4", "--top-k", "2", "--router-z-loss", "1e-3", "--steps", "6",
                                        "--eval-every", "3", "--checkpoint-every", "3", "--router-bias-rate", "0.01"};
  const auto full = fresh_dir("moe_full");
  auto r = run(train_args(full, moe));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto split = fresh_dir("moe_split");
  std::vector<std::string> stop = moe;
  stop.insert(stop.end(), {"--stop-after", "3"});
  r = run(train_args(split, stop));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> resume = moe;
  resume.push_back("--resume");
  r = run(train_args(split, resume));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_checkpoint(full / "step_6", split / "step_6");  // includes the router biases (buffers)
  EXPECT_EQ(deterministic_metrics(full), deterministic_metrics(split));
  // Six balancing updates of ±0.01 (or 0 for an expert exactly at the mean load).
  torch::serialize::InputArchive a, blocks, block0, moe_archive;
  a.load_from((full / "step_6" / "model.pt").string());
  a.read("blocks", blocks);
  blocks.read("0", block0);
  block0.read("moe", moe_archive);
  at::Tensor bias;
  moe_archive.read("bias", bias, /*is_buffer=*/true);
  EXPECT_GT(bias.abs().max().item<double>(), 0.005);
  EXPECT_LE(bias.abs().max().item<double>(), 0.06 + 1e-6);
}

TEST(Trainer, StepsToReachInterpolatesBetweenEvaluations) {
  const std::vector<EvalPoint> evals = {{25, 2.0}, {50, 1.8}, {75, 1.6}, {100, 1.7}};
  EXPECT_DOUBLE_EQ(steps_to_reach(evals, 1.7), 62.5);   // halfway between 1.8 at 50 and 1.6 at 75
  EXPECT_DOUBLE_EQ(steps_to_reach(evals, 1.8), 50.0);   // exactly at an evaluation
  EXPECT_DOUBLE_EQ(steps_to_reach(evals, 2.5), 25.0);   // already below at the first evaluation
  EXPECT_DOUBLE_EQ(steps_to_reach(evals, 1.5), -1.0);   // never
}

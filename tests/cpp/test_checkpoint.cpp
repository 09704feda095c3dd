// Crash-safe checkpoints (algorithms.md §11, docs/checkpoints.md): a process killed at any point
// of a write — at every fault-injection stage and by real SIGKILLs at random times — never leaves a
// step_<N> that latest_valid_checkpoint accepts but that does not verify, and the previous
// checkpoint stays usable. Plus corruption, config mismatch, overwrite and prune rules.
#include "test_util.h"
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "orthopt/train/checkpoint.h"

namespace fs = std::filesystem;
using namespace orthopt::train;

namespace {

// A fresh directory under the temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "orthopt_ckpt_XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string run_dir() const { return (path / "run").string(); }
};

// Deterministic content of file `name` of checkpoint `step`: lets a test check what it reads back
// independently of the checksums the library computed.
std::string content_for(int64_t step, const std::string& name, size_t size) {
  std::mt19937_64 rng(static_cast<uint64_t>(step) * 1000003u + std::hash<std::string>{}(name));
  std::string bytes(size, '\0');
  for (auto& c : bytes) c = static_cast<char>(rng() & 0xff);
  return bytes;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("write failed: " + path);
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::string kConfigSha = sha256_hex("config A");

struct Sizes {
  size_t model = 64 * 1024, optimizer = 32 * 1024 + 17;
};

void write_step(const std::string& run_dir, int64_t step, Sizes sizes = {}, bool overwrite = false,
                int64_t salt = 0) {
  CheckpointMeta meta;
  meta.tokens_seen = step * 1000;
  meta.config_sha256 = kConfigSha;
  meta.optimizer = "muon";
  meta.extra = {{"data_position", step * 7}};
  const int64_t seed = step + salt;
  write_checkpoint(
      run_dir, step,
      {{"model.pt", [=](const std::string& p) { write_bytes(p, content_for(seed, "model.pt", sizes.model)); }},
       {"optimizer.pt",
        [=](const std::string& p) { write_bytes(p, content_for(seed, "optimizer.pt", sizes.optimizer)); }}},
      meta, overwrite);
}

// The files of checkpoint dir hold exactly what write_step(step) wrote.
bool content_matches(const std::string& dir, int64_t step, Sizes sizes = {}, int64_t salt = 0) {
  return read_bytes(dir + "/model.pt") == content_for(step + salt, "model.pt", sizes.model) &&
         read_bytes(dir + "/optimizer.pt") == content_for(step + salt, "optimizer.pt", sizes.optimizer);
}

std::vector<std::string> tmp_entries(const std::string& run_dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(run_dir))
    if (e.path().extension() == ".tmp") out.push_back(e.path().filename().string());
  return out;
}

using orthopt::test::error_of;

void flip_byte(const std::string& path, size_t offset) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x40));
}

}  // namespace

TEST(Checkpoint, Sha256KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  TempDir tmp;
  const std::string path = (tmp.path / "a.bin").string();
  write_bytes(path, std::string(1000000, 'a'));  // FIPS 180-2 test vector: one million 'a'
  EXPECT_EQ(sha256_file(path), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  const std::string big = content_for(1, "big", 3 * (1 << 20) + 123);  // spans several read chunks
  write_bytes(path, big);
  EXPECT_EQ(sha256_file(path), sha256_hex(big));
  EXPECT_NE(error_of([&] { sha256_file((tmp.path / "missing").string()); }).find("missing"), std::string::npos);
}

TEST(Checkpoint, WriteVerifyAndLoadRoundTrip) {
  TempDir tmp;
  const std::string run = tmp.run_dir();
  EXPECT_FALSE(latest_valid_checkpoint(run).has_value());  // run dir does not exist yet
  torch::manual_seed(0);
  const at::Tensor weights = torch::randn({17, 9});
  CheckpointMeta meta;
  meta.tokens_seen = 12345;
  meta.config_sha256 = kConfigSha;
  meta.optimizer = "normuon";
  meta.extra = {{"lr_factor", 0.5}};
  write_checkpoint(run, 5,
                   {{"model.pt", [&](const std::string& p) { torch::save(weights, p); }},
                    {"notes.txt", [](const std::string& p) { write_bytes(p, "hello"); }}},
                   meta);
  const auto latest = latest_valid_checkpoint(run);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, checkpoint_dir(run, 5));
  const CheckpointMeta got = read_checkpoint_meta(*latest, kConfigSha);
  EXPECT_EQ(got.format_version, 1);
  EXPECT_EQ(got.step, 5);
  EXPECT_EQ(got.tokens_seen, 12345);
  EXPECT_EQ(got.optimizer, "normuon");
  EXPECT_EQ(got.extra["lr_factor"].get<double>(), 0.5);
  ASSERT_EQ(got.files.size(), 2u);
  EXPECT_EQ(got.files.at("notes.txt").first, 5);
  EXPECT_EQ(got.files.at("notes.txt").second, sha256_hex("hello"));
  at::Tensor loaded;
  torch::load(loaded, *latest + "/model.pt");
  EXPECT_TRUE(loaded.equal(weights));
  EXPECT_TRUE(tmp_entries(run).empty());
  // metadata.json is plain JSON with the documented fields.
  const auto j = nlohmann::json::parse(read_bytes(*latest + "/metadata.json"));
  for (const char* key : {"format_version", "step", "tokens_seen", "config_sha256", "optimizer", "files", "extra"})
    EXPECT_TRUE(j.contains(key)) << key;
}

TEST(Checkpoint, FaultInjectionAtEveryStageKeepsThePreviousCheckpoint) {
  ASSERT_EQ(kCheckpointFaultStages.size(), 7u);
  for (const std::string& stage : kCheckpointFaultStages) {
    SCOPED_TRACE(stage);
    TempDir tmp;
    const std::string run = tmp.run_dir();
    write_step(run, 1);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // child: die inside the write of step 2
      ::setenv("ORTHOPT_FAULT_CHECKPOINT", stage.c_str(), 1);
      try {
        write_step(run, 2);
      } catch (...) {
        std::_Exit(3);
      }
      std::_Exit(0);  // the fault did not fire
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 137);

    const bool published = stage == "after_rename";
    const auto latest = latest_valid_checkpoint(run);
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(*latest, checkpoint_dir(run, published ? 2 : 1));
    EXPECT_EQ(fs::exists(checkpoint_dir(run, 2)), published);
    // The previous checkpoint is intact and loadable.
    EXPECT_EQ(read_checkpoint_meta(checkpoint_dir(run, 1), kConfigSha).step, 1);
    EXPECT_TRUE(content_matches(checkpoint_dir(run, 1), 1));
    if (published) EXPECT_TRUE(content_matches(checkpoint_dir(run, 2), 2));

    // The next write cleans up whatever the crash left and succeeds.
    write_step(run, 3);
    EXPECT_TRUE(tmp_entries(run).empty());
    EXPECT_EQ(*latest_valid_checkpoint(run), checkpoint_dir(run, 3));
    if (!published) {
      write_step(run, 2);  // the interrupted step can be written again
      EXPECT_TRUE(content_matches(checkpoint_dir(run, 2), 2));
    }
  }
}

TEST(Checkpoint, KilledOverwriteLeavesEitherTheOldOrTheNewCheckpoint) {
  // overwrite = true swaps the new directory in with one atomic exchange: a kill just before it
  // keeps the old content, a kill just after it has the new one, never a mix or nothing.
  for (const std::string stage : {"before_rename", "after_rename"}) {
    SCOPED_TRACE(stage);
    TempDir tmp;
    const std::string run = tmp.run_dir();
    write_step(run, 4);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setenv("ORTHOPT_FAULT_CHECKPOINT", stage.c_str(), 1);
      try {
        write_step(run, 4, {}, /*overwrite=*/true, /*salt=*/100);
      } catch (...) {
        std::_Exit(3);
      }
      std::_Exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 137);
    const auto latest = latest_valid_checkpoint(run);
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(*latest, checkpoint_dir(run, 4));
    EXPECT_TRUE(content_matches(*latest, 4, {}, stage == "after_rename" ? 100 : 0));
  }
}

TEST(Checkpoint, UnknownFaultStageIsAnError) {
  TempDir tmp;
  ::setenv("ORTHOPT_FAULT_CHECKPOINT", "after_lunch", 1);
  const std::string msg = error_of([&] { write_step(tmp.run_dir(), 1); });
  ::unsetenv("ORTHOPT_FAULT_CHECKPOINT");
  EXPECT_NE(msg.find("after_lunch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mid_metadata"), std::string::npos) << msg;  // lists the valid stages
  EXPECT_FALSE(fs::exists(checkpoint_dir(tmp.run_dir(), 1)));
}

TEST(Checkpoint, RealSigkillAtRandomTimesNeverLeavesABadCheckpoint) {
  // A child writes checkpoints of a few MB in a loop (pruning to 3 as the trainer does) and is
  // SIGKILLed after a random delay. Afterwards every step_<N> directory must verify and hold exactly
  // the bytes written for step N; .tmp leftovers are never returned. Repeats until several kills
  // landed in the middle of a write (a .tmp directory was left behind).
  const Sizes sizes{3u << 20, (1u << 20) + 5};
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> delay_ms(5, 400);
  int iterations = 0, mid_write_kills = 0, checkpoints_checked = 0;
  while (iterations < 40 && (iterations < 6 || mid_write_kills < 3)) {
    ++iterations;
    TempDir tmp;
    const std::string run = tmp.run_dir();
    const int delay = delay_ms(rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + " iteration " + std::to_string(iterations) +
                 " delay " + std::to_string(delay) + " ms");
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        for (int64_t step = 1;; ++step) {
          write_step(run, step, sizes);
          prune_checkpoints(run, 3);
        }
      } catch (...) {
        std::_Exit(3);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited on its own with status " << status;
    if (!fs::exists(run)) continue;  // killed before the first directory existed
    if (!tmp_entries(run).empty()) ++mid_write_kills;

    for (const auto& e : fs::directory_iterator(run)) {
      const std::string name = e.path().filename().string();
      if (e.path().extension() == ".tmp") continue;
      ASSERT_EQ(name.rfind("step_", 0), 0u) << name;
      const int64_t step = std::stoll(name.substr(5));
      EXPECT_EQ(read_checkpoint_meta(e.path().string(), kConfigSha).step, step);
      EXPECT_TRUE(content_matches(e.path().string(), step, sizes)) << name;
      ++checkpoints_checked;
    }
    const auto latest = latest_valid_checkpoint(run);
    if (latest) {
      EXPECT_EQ(fs::path(*latest).extension(), "");
      EXPECT_EQ(fs::path(*latest).filename().string().rfind("step_", 0), 0u);
    }
  }
  std::cout << "[ sigkill  ] seed " << seed << ": " << iterations << " kills, " << mid_write_kills
            << " mid-write, " << checkpoints_checked << " published checkpoints verified\n";
  EXPECT_GE(mid_write_kills, 1);
  EXPECT_GT(checkpoints_checked, 0);
}

TEST(Checkpoint, CorruptionIsRejectedNamingTheFile) {
  TempDir tmp;
  const std::string run = tmp.run_dir();
  write_step(run, 1);
  write_step(run, 2);
  const std::string step2 = checkpoint_dir(run, 2);
  flip_byte(step2 + "/optimizer.pt", 1234);
  std::string msg = error_of([&] { read_checkpoint_meta(step2, kConfigSha); });
  EXPECT_NE(msg.find("corrupted"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer.pt"), std::string::npos) << msg;
  testing::internal::CaptureStderr();
  const auto latest = latest_valid_checkpoint(run);
  const std::string warning = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, checkpoint_dir(run, 1));
  EXPECT_NE(warning.find("optimizer.pt"), std::string::npos) << warning;
  EXPECT_TRUE(fs::exists(step2 + "/optimizer.pt"));  // nothing deleted or repaired

  // Truncated file: size mismatch named.
  fs::resize_file(step2 + "/model.pt", 100);
  msg = error_of([&] { verify_checkpoint(step2); });
  EXPECT_NE(msg.find("model.pt"), std::string::npos) << msg;
  // Missing file, bad metadata, unknown version, wrong step, a .tmp name.
  write_step(run, 3);
  const std::string step3 = checkpoint_dir(run, 3);
  fs::remove(step3 + "/model.pt");
  EXPECT_NE(error_of([&] { verify_checkpoint(step3); }).find("'model.pt' is missing"), std::string::npos);
  write_step(run, 4);
  const std::string step4 = checkpoint_dir(run, 4);
  auto j = nlohmann::json::parse(read_bytes(step4 + "/metadata.json"));
  j["format_version"] = 99;
  write_bytes(step4 + "/metadata.json", j.dump());
  EXPECT_NE(error_of([&] { verify_checkpoint(step4); }).find("unknown format version 99"), std::string::npos);
  j["format_version"] = 1;
  j["step"] = 5;
  write_bytes(step4 + "/metadata.json", j.dump());
  EXPECT_NE(error_of([&] { verify_checkpoint(step4); }).find("does not match"), std::string::npos);
  write_bytes(step4 + "/metadata.json", "{\"format_version\": 1, \"step\": ");
  EXPECT_NE(error_of([&] { verify_checkpoint(step4); }).find("not valid JSON"), std::string::npos);
  fs::remove(step4 + "/metadata.json");
  EXPECT_NE(error_of([&] { verify_checkpoint(step4); }).find("missing metadata.json"), std::string::npos);
  fs::create_directory(run + "/step_9.tmp");
  EXPECT_NE(error_of([&] { verify_checkpoint(run + "/step_9.tmp"); }).find("not a published"), std::string::npos);
  testing::internal::CaptureStderr();
  EXPECT_EQ(*latest_valid_checkpoint(run), checkpoint_dir(run, 1));
  testing::internal::GetCapturedStderr();
}

TEST(Checkpoint, ConfigMismatchIsAClearError) {
  TempDir tmp;
  write_step(tmp.run_dir(), 1);
  const std::string other = sha256_hex("config B");
  const std::string msg = error_of([&] { read_checkpoint_meta(checkpoint_dir(tmp.run_dir(), 1), other); });
  EXPECT_NE(msg.find("config mismatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find(other), std::string::npos) << msg;
  EXPECT_NE(msg.find(kConfigSha), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { read_checkpoint_meta(checkpoint_dir(tmp.run_dir(), 1), ""); }).find("expected_config_sha256"),
            std::string::npos);
}

TEST(Checkpoint, ExistingTargetIsNotOverwrittenUnlessAsked) {
  TempDir tmp;
  const std::string run = tmp.run_dir();
  write_step(run, 3);
  const std::string dir = checkpoint_dir(run, 3);
  const std::string msg = error_of([&] { write_step(run, 3, {}, /*overwrite=*/false, /*salt=*/100); });
  EXPECT_NE(msg.find("already exists"), std::string::npos) << msg;
  EXPECT_TRUE(content_matches(dir, 3));
  write_step(run, 3, {}, /*overwrite=*/true, /*salt=*/100);
  EXPECT_TRUE(content_matches(dir, 3, {}, 100));
  EXPECT_EQ(verify_checkpoint(dir).step, 3);
  EXPECT_TRUE(tmp_entries(run).empty());
}

TEST(Checkpoint, BadFileListsAndFailingWritersPublishNothing) {
  TempDir tmp;
  const std::string run = tmp.run_dir();
  auto noop = [](const std::string& p) { write_bytes(p, "x"); };
  EXPECT_NE(error_of([&] { write_checkpoint(run, 1, {{"a/b", noop}}, {}); }).find("'a/b'"), std::string::npos);
  EXPECT_NE(error_of([&] { write_checkpoint(run, 1, {{"metadata.json", noop}}, {}); }).find("reserved"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_checkpoint(run, 1, {{"a", noop}, {"a", noop}}, {}); }).find("duplicate"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_checkpoint(run, 1, {{"a", [](const std::string&) {}}}, {}); })
                .find("did not create"),
            std::string::npos);
  EXPECT_THROW(write_checkpoint(run, 1, {{"a", [](const std::string&) -> void { throw std::runtime_error("disk full"); }}}, {}),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(checkpoint_dir(run, 1)));
  EXPECT_FALSE(latest_valid_checkpoint(run).has_value());
  // A run_dir that is a regular file: a c10::Error naming the call, not a filesystem_error.
  const std::string file_run = (tmp.path / "not_a_dir").string();
  write_bytes(file_run, "x");
  EXPECT_NE(error_of([&] { write_step(file_run, 1); }).find("write_checkpoint"), std::string::npos);
  write_step(run, 1);  // cleans the stale .tmp of the failed attempts
  EXPECT_TRUE(tmp_entries(run).empty());
}

TEST(Checkpoint, PruneRereadsOnlyWhatItCannotTrust) {
  TempDir tmp;
  const std::string run = tmp.run_dir();
  for (int64_t s = 1; s <= 3; ++s) write_step(run, s);
  auto bytes_of = [&](int64_t s) {
    int64_t n = 0;
    for (const auto& e : fs::directory_iterator(checkpoint_dir(run, s)))
      if (e.path().filename() != "metadata.json") n += static_cast<int64_t>(fs::file_size(e.path()));
    return n;
  };
  // Fresh files are not trusted (a write within the same timestamp tick would not show): the
  // first prune reads all three.
  int64_t before = sha256_bytes_read();
  prune_checkpoints(run, 10);
  EXPECT_EQ(sha256_bytes_read() - before, bytes_of(1) + bytes_of(2) + bytes_of(3));
  // Settled (timestamps >= 2 s old) and verified once more: remembered from then on.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  prune_checkpoints(run, 10);
  before = sha256_bytes_read();
  prune_checkpoints(run, 10);
  EXPECT_EQ(sha256_bytes_read() - before, 0);
  // A damaged file changes its ctime: that checkpoint is read again, found invalid and left
  // alone; the newest valid one (step 2) is kept without reading it, step 1 goes.
  flip_byte(checkpoint_dir(run, 3) + "/optimizer.pt", 5);
  before = sha256_bytes_read();
  testing::internal::CaptureStderr();
  prune_checkpoints(run, 1);
  const std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find("step_3"), std::string::npos) << warning;
  EXPECT_LE(sha256_bytes_read() - before, bytes_of(3));
  EXPECT_GT(sha256_bytes_read() - before, 0);
  EXPECT_TRUE(fs::exists(checkpoint_dir(run, 3)));
  EXPECT_TRUE(fs::exists(checkpoint_dir(run, 2)));
  EXPECT_FALSE(fs::exists(checkpoint_dir(run, 1)));
  // Resuming never trusts the record: it reads the checkpoint it returns.
  before = sha256_bytes_read();
  EXPECT_EQ(latest_valid_checkpoint(run), checkpoint_dir(run, 2));
  EXPECT_GE(sha256_bytes_read() - before, bytes_of(2));
}

TEST(Checkpoint, PruneKeepsTheNewestValid) {
  TempDir tmp;
  const std::string run = tmp.run_dir();
  for (int64_t s = 1; s <= 6; ++s) write_step(run, s);
  prune_checkpoints(run, 2);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(run)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_5", "step_6"}));

  // The newest is corrupted: it is left alone, and the newest VALID one is kept.
  write_step(run, 7);
  flip_byte(checkpoint_dir(run, 7) + "/model.pt", 10);
  testing::internal::CaptureStderr();
  prune_checkpoints(run, 1);
  testing::internal::GetCapturedStderr();
  EXPECT_TRUE(fs::exists(checkpoint_dir(run, 7)));
  EXPECT_TRUE(fs::exists(checkpoint_dir(run, 6)));
  EXPECT_FALSE(fs::exists(checkpoint_dir(run, 5)));
  EXPECT_TRUE(content_matches(checkpoint_dir(run, 6), 6));
  EXPECT_THROW(prune_checkpoints(run, 0), c10::Error);
}

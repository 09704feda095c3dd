#pragma once
// Small helpers shared by the C++ tests.
#include <c10/util/Exception.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace orthopt::test {

// The message of the c10::Error that `f` throws (without backtrace), or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// The orthopt binary under test (ctest sets ORTHOPT_BIN).
inline std::string orthopt_bin() {
  const char* b = std::getenv("ORTHOPT_BIN");
  return b ? b : "build/orthopt";
}

// A fresh scratch directory <tmp>/<prefix>_<pid>, created once per process (one prefix per binary).
inline std::filesystem::path scratch_root(const std::string& prefix) {
  static const std::filesystem::path root = [&] {
    auto p = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    return p;
  }();
  return root;
}

// The whole content of a file ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An empty directory <scratch>/<name> (removed first if it exists; created by whoever writes there).
inline std::filesystem::path fresh_dir(const std::filesystem::path& scratch, const std::string& name) {
  auto p = scratch / name;
  std::filesystem::remove_all(p);
  return p;
}

// A small deterministic English-like corpus of 60 KB at `path` (independent of the Bible cache).
inline std::string write_word_corpus(const std::filesystem::path& path, uint64_t seed) {
  const char* words[] = {"the", "light", "water", "and", "earth", "said", "was", "good", "of", "day",
                         "night", "upon", "face", "deep", "form", "void", "moved", "God", "heaven", "created"};
  std::string text;
  uint64_t x = seed;
  while (text.size() < 60000) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    text += words[(x >> 33) % 20];
    text += ((x >> 20) % 9 == 0) ? ".\n" : " ";
  }
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

// The outcome of one run of the orthopt binary.
struct CliResult {
  int exit_code = -1;  // -1: killed by a signal
  int signal = 0;
  std::string out, err;
};

// Starts the orthopt binary with `args`, stdout and stderr to files, `env` added to the environment.
inline pid_t spawn_cli(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                       const std::filesystem::path& out, const std::filesystem::path& err) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    // One thread unless the caller says otherwise: these runs are tiny, and ctest runs tests in
    // parallel on few cores.
    ::setenv("ORTHOPT_NUM_THREADS", "1", 0);
    for (const auto& kv : env) ::setenv(kv.first.c_str(), kv.second.c_str(), 1);
    if (!::freopen(out.c_str(), "w", stdout) || !::freopen(err.c_str(), "w", stderr)) ::_exit(120);
    std::string b = orthopt_bin();
    std::vector<std::string> copy = args;
    std::vector<char*> argv{b.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(b.c_str(), argv.data());
    ::_exit(121);
  }
  return pid;
}

// Waits for a spawn_cli process and reads what it wrote.
inline CliResult wait_cli(pid_t pid, const std::filesystem::path& out, const std::filesystem::path& err) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  CliResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

// Runs the orthopt binary to its end; its output goes through <scratch>/last.{out,err}.
inline CliResult run_cli(const std::filesystem::path& scratch, const std::vector<std::string>& args,
                         const std::map<std::string, std::string>& env = {}) {
  const auto out = scratch / "last.out", err = scratch / "last.err";
  return wait_cli(spawn_cli(args, env, out, err), out, err);
}

// The tiny training run the trainer and disk-fault tests share: 12 steps, evaluation and a
// checkpoint every 4 (none pruned), on `data`, into `run_dir`, then `extra`.
inline std::vector<std::string> tiny_train_args(const std::filesystem::path& run_dir, const std::string& data,
                                                std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"train",        "--preset",       "tiny",           "--context",  "32",
                                "--batch-size", "4",              "--steps",        "12",         "--eval-every",
                                "4",            "--eval-batches", "2",              "--data",     data,
                                "--run-dir",    run_dir.string(), "--progress",     "off",        "--checkpoint-every",
                                "4",            "--keep-last",    "10"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

}  // namespace orthopt::test

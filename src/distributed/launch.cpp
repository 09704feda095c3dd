// Local multi-process launcher (`--nproc N`): fork/exec N ranks with the c10d environment,
// wait for all, and turn the first failure into "everyone stops, non-zero exit naming the rank".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "orthopt/distributed.h"
#include "orthopt/runtime.h"

extern char** environ;

namespace orthopt::dist {

int threads_per_local_rank(int threads, int nproc) { return std::max(1, threads / std::max(1, nproc)); }

int find_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(fd >= 0, "find_free_port: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // the kernel picks a free one
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  TORCH_CHECK(ok, "find_free_port: bind/getsockname failed: ", std::strerror(err));
  return ntohs(addr.sin_port);
}

namespace {

// argv[0] as an executable path: as given when it has a '/', else searched on PATH.
std::string resolve_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string cand = (end > start ? dirs.substr(start, end - start) : ".") + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  TORCH_CHECK(false, "launch: command '", name, "' not found on PATH");
}

const char* const kDistVars[] = {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
                                 "MASTER_PORT="};

std::vector<std::string> rank_environment(int rank, int nproc, int port) {
  // The ranks' thread count, unless the environment asks for one (as init_runtime reads it); an
  // inherited ORTHOPT_NUM_THREADS that asks for none (e.g. "0") would shadow it, so it goes.
  const bool set_threads = requested_threads() == 0;
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    bool replaced = set_threads && std::strncmp(*e, "ORTHOPT_NUM_THREADS=", 20) == 0;
    for (const char* v : kDistVars) replaced |= std::strncmp(*e, v, std::strlen(v)) == 0;
    if (!replaced) env.emplace_back(*e);
  }
  env.push_back(fmt::format("RANK={}", rank));
  env.push_back(fmt::format("LOCAL_RANK={}", rank));
  env.push_back(fmt::format("WORLD_SIZE={}", nproc));
  env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", nproc));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back(fmt::format("MASTER_PORT={}", port));
  if (set_threads)  // the share of what init_runtime would give one process (BLAS-aware)
    env.push_back(fmt::format("ORTHOPT_NUM_THREADS={}",
                              threads_per_local_rank(default_intra_op_threads(available_cores(), blas_threading()), nproc)));
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace) {
  TORCH_CHECK(nproc >= 1, "launch: --nproc must be >= 1, got ", nproc);
  TORCH_CHECK(!argv.empty(), "launch: no command to run");
  const std::string exe = resolve_executable(argv[0]);
  const int port = find_free_port();
  const pid_t parent = ::getpid();

  // Everything the children need is prepared before fork(): between fork and exec only
  // async-signal-safe calls are allowed (the parent may have torch's threads running).
  std::vector<std::string> args = argv;
  std::vector<char*> cargs = c_strings(args);
  std::vector<std::vector<std::string>> envs;
  std::vector<std::vector<char*>> cenvs;
  for (int r = 0; r < nproc; ++r) envs.push_back(rank_environment(r, nproc, port));
  for (auto& e : envs) cenvs.push_back(c_strings(e));

  std::vector<pid_t> pids(nproc, -1);
  auto terminate_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  for (int r = 0; r < nproc; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      terminate_all(SIGKILL);
      for (pid_t p : pids)
        if (p > 0) ::waitpid(p, nullptr, 0);
      TORCH_CHECK(false, "launch: fork() failed for rank ", r, ": ", std::strerror(err));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a dead launcher takes its ranks along
      if (::getppid() != parent) ::_exit(125);
      ::execve(exe.c_str(), cargs.data(), cenvs[r].data());
      static const char msg[] = "orthopt launch: exec failed\n";
      ssize_t ignored = ::write(2, msg, sizeof(msg) - 1);
      (void)ignored;
      ::_exit(127);
    }
    pids[r] = pid;
  }

  int first_failed = -1, first_code = 0;
  std::string first_reason;
  std::chrono::steady_clock::time_point kill_at{};
  int running = nproc;
  while (running > 0) {
    // Reap what has ended in this sweep. When several ranks failed in the same sweep, blame
    // one killed by a signal first (the others typically failed because it died), then the
    // lowest rank.
    int sweep_rank = -1, sweep_code = 0;
    bool sweep_signaled = false;
    std::string sweep_reason;
    for (int r = 0; r < nproc; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      pids[r] = -1;
      --running;
      int code = 1;
      bool signaled = false;
      std::string reason = "could not be waited for";
      if (got > 0 && WIFEXITED(status)) {
        code = WEXITSTATUS(status);
        reason = fmt::format("exited with code {}", code);
      } else if (got > 0 && WIFSIGNALED(status)) {
        code = 128 + WTERMSIG(status);
        signaled = true;
        reason = fmt::format("was killed by signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
      }
      if (code != 0 && (sweep_rank < 0 || (signaled && !sweep_signaled))) {
        sweep_rank = r;
        sweep_code = code;
        sweep_signaled = signaled;
        sweep_reason = reason;
      }
    }
    if (sweep_rank >= 0 && first_failed < 0) {
      first_failed = sweep_rank;
      first_code = sweep_code;
      first_reason = sweep_reason;
      std::cerr << fmt::format("orthopt launch: rank {} {}; stopping the other ranks\n", sweep_rank, sweep_reason);
      terminate_all(SIGTERM);
      kill_at = std::chrono::steady_clock::now() + grace;
    }
    if (first_failed >= 0 && running > 0 && std::chrono::steady_clock::now() >= kill_at) {
      terminate_all(SIGKILL);
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (first_failed >= 0) {
    std::cerr << fmt::format("orthopt launch: failed: rank {} of {} {}\n", first_failed, nproc, first_reason);
    return first_code != 0 ? first_code : 1;
  }
  return 0;
}

std::vector<std::string> relaunch_argv(const std::vector<std::string>& drop) {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  TORCH_CHECK(in, "relaunch_argv: cannot read /proc/self/cmdline");
  std::vector<std::string> args;
  for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
  TORCH_CHECK(!args.empty(), "relaunch_argv: empty command line");
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) args[0] = exe.string();
  std::vector<std::string> out{args[0]};
  for (size_t i = 1; i < args.size(); ++i) {
    bool dropped = false;
    for (const auto& d : drop) {
      if (args[i] == d) {
        ++i;  // and its value
        dropped = true;
      } else if (args[i].rfind(d + "=", 0) == 0) {
        dropped = true;
      }
      if (dropped) break;
    }
    if (!dropped) out.push_back(args[i]);
  }
  return out;
}

}  // namespace orthopt::dist

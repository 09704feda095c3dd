// The CLI's CPU thread policy (threads.h).
#include "threads.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "orthopt/runtime.h"

namespace orthopt::cli {
namespace {

// Runs before every library initializer (the executable's .preinit_array): libgomp reads
// OMP_WAIT_POLICY in its initializer, and libc's initializer resets the environment a setenv
// here would change, so the program re-executes itself with the variable added. Only the
// shared objects have been mapped by now, so the second start costs little.
char* g_passive_env[8192];
char g_passive_entry[] = "OMP_WAIT_POLICY=PASSIVE";

void reexec_with_passive_openmp(int /*argc*/, char** argv, char** envp) {
  if (envp == nullptr || argv == nullptr) return;
  size_t n = 0;
  for (char** e = envp; *e != nullptr; ++e, ++n) {
    if (std::strncmp(*e, "OMP_WAIT_POLICY=", 16) == 0 || std::strncmp(*e, "GOMP_SPINCOUNT=", 15) == 0) return;
  }
  if (n + 2 > sizeof(g_passive_env) / sizeof(g_passive_env[0])) return;
  for (size_t i = 0; i < n; ++i) g_passive_env[i] = envp[i];
  g_passive_env[n] = g_passive_entry;
  g_passive_env[n + 1] = nullptr;
  ::execve("/proc/self/exe", argv, g_passive_env);  // returns only on failure: run as we are
}

__attribute__((section(".preinit_array"), used)) void (*const g_preinit)(int, char**, char**) =
    &reexec_with_passive_openmp;

struct CpuTimes {
  unsigned long long busy = 0, total = 0;
  bool ok = false;
};

CpuTimes read_cpu_times() {
  CpuTimes t;
  std::ifstream f("/proc/stat");
  std::string line;
  if (!std::getline(f, line) || line.rfind("cpu ", 0) != 0) return t;
  std::istringstream ss(line.substr(4));
  unsigned long long v[8] = {};  // user nice system idle iowait irq softirq steal
  for (auto& x : v)
    if (!(ss >> x)) return t;
  t.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  t.total = t.busy + v[3] + v[4];
  t.ok = true;
  return t;
}

}  // namespace

int threads_under_load(int base, double busy) {
  base = std::max(base, 1);
  if (!(busy > 0.0)) return base;
  const int others = static_cast<int>(std::lround(busy));
  return std::clamp(base - others, 1, base);
}

double busy_cores_of_others() {
  if (const char* fake = std::getenv("ORTHOPT_TEST_BUSY_CORES")) {
    char* end = nullptr;
    const double v = std::strtod(fake, &end);
    if (end != fake && *end == '\0' && std::isfinite(v) && v >= 0.0) return v;
    return -1.0;
  }
  const CpuTimes a = read_cpu_times();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const CpuTimes b = read_cpu_times();
  if (!a.ok || !b.ok || b.total <= a.total) return -1.0;
  const double share = static_cast<double>(b.busy - a.busy) / static_cast<double>(b.total - a.total);
  return std::clamp(share, 0.0, 1.0) * static_cast<double>(available_cores());
}

const ThreadChoice& apply_thread_policy() {
  static ThreadChoice choice;
  static bool done = false;
  if (done) return choice;
  done = true;
  init_runtime();
  if (const char* w = std::getenv("OMP_WAIT_POLICY")) choice.wait_policy = w;
  if (const int requested = requested_threads(); requested > 0) {
    choice.threads = requested;
    choice.reason = std::getenv("ORTHOPT_NUM_THREADS") && std::atoi(std::getenv("ORTHOPT_NUM_THREADS")) > 0
                        ? "ORTHOPT_NUM_THREADS" : "OMP_NUM_THREADS";
  } else {
    const int base = default_intra_op_threads(available_cores(), blas_threading());
    std::ostringstream r;
    r << "runtime default " << base;
    const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
    const int ranks = local_world ? std::atoi(local_world) : 0;
    if (ranks > 1) {
      // Local data-parallel ranks start together: each takes its share of the cores (their
      // measurements would see one another starting up).
      choice.threads = std::max(1, base / ranks);
      r << " shared by " << ranks << " local ranks";
    } else {
      choice.busy = busy_cores_of_others();
      choice.threads = threads_under_load(base, choice.busy);
      r.setf(std::ios::fixed);
      r.precision(2);
      if (choice.busy >= 0.0) r << " less the cores other programs keep busy (" << choice.busy << ", rounded)";
      else r << " (the load of other programs could not be read)";
    }
    choice.reason = r.str();
  }
  at::set_num_threads(choice.threads);
  return choice;
}

}  // namespace orthopt::cli

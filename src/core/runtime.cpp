#include "orthopt/runtime.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <cstdlib>
#include <thread>

namespace orthopt {

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

void init_runtime() {
  static bool done = false;
  if (done) return;
  done = true;
  int threads = available_cores();
  for (const char* var : {"ORTHOPT_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(var)) {
      int n = std::atoi(v);
      if (n > 0) { threads = n; break; }
    }
  }
  at::set_num_threads(threads);
}

}  // namespace orthopt

#include "orthopt/runtime.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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

bool gpu_kernels_enabled() {
  const char* env = std::getenv("ORTHOPT_GPU_KERNELS");
  return !(env && std::strcmp(env, "0") == 0);
}

std::string shared_object_of(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

std::string filesystem_provider() {
  // The address as this library sees it: resolved through its own GOT entry, i.e. the binding
  // the dynamic linker chose for liborthopt's calls.
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&);
  RemoveAll fn = &std::filesystem::remove_all;
  return shared_object_of(reinterpret_cast<const void*>(fn));
}

}  // namespace orthopt

#include "orthopt/runtime.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
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

std::string blas_threading() {
  // The libopenblas torch loaded, whatever the scope it was loaded in (the Python module's
  // libraries are not in the global scope); NOLOAD: never load one.
  void* lib = dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return "other";
  using GetParallel = int (*)();
  auto get_parallel = reinterpret_cast<GetParallel>(dlsym(lib, "openblas_get_parallel"));
  const int kind = get_parallel ? get_parallel() : -1;  // 0 sequential, 1 pthreads, 2 OpenMP
  dlclose(lib);
  return kind == 0 ? "openblas-sequential" : kind == 1 ? "openblas-pthreads" : kind == 2 ? "openblas-openmp" : "openblas";
}

int default_intra_op_threads(int cores, const std::string& blas) {
  // OpenBLAS's pthreads build runs every product on its own pool of `cores` threads, which spin
  // after each product; torch's OpenMP threads running the next operation meanwhile compete
  // with them for the same cores (2 cores: an addmm with beta at 34 GFLOP/s instead of 233, a
  // 40-step `orthopt train` 19.2 s instead of 9.3 with one torch thread). One torch thread
  // leaves the cores to OpenBLAS's products.
  return blas == "openblas-pthreads" ? 1 : cores;
}

int requested_threads() {
  for (const char* var : {"ORTHOPT_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(var)) {
      int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 0;
}

void init_runtime() {
  static bool done = false;
  if (done) return;
  done = true;
  int threads = requested_threads();
  if (threads == 0) threads = default_intra_op_threads(available_cores(), blas_threading());
  at::set_num_threads(threads);
}

Tf32Products::Tf32Products(bool on) : Tf32Products(on, true) {}

Tf32Products::Tf32Products(bool change, bool allow)
    : change_(change), prev_(at::globalContext().allowTF32CuBLAS()) {
  if (change_) at::globalContext().setAllowTF32CuBLAS(allow);
}

Tf32Products Tf32Products::forbidden() { return Tf32Products(true, false); }

Tf32Products::~Tf32Products() {
  if (change_) at::globalContext().setAllowTF32CuBLAS(prev_);
}

namespace {
thread_local bool kernels_on = true;
}  // namespace

bool kernels_enabled() { return kernels_on; }

KernelsScope::KernelsScope(Toggle kernels) : prev_(kernels_on) {
  if (kernels == Toggle::Off) kernels_on = false;
}

KernelsScope::~KernelsScope() { kernels_on = prev_; }

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

#pragma once
// Process-wide runtime setup shared by the CLI, the tests and the Python module.

#include <string>

#include "orthopt/execution.h"

namespace orthopt {

// Sets torch's intra-op thread count (Debian's torch starts with 1) to ORTHOPT_NUM_THREADS or
// OMP_NUM_THREADS where set, else to default_intra_op_threads(available_cores(),
// blas_threading()). Idempotent.
void init_runtime();

// Number of hardware threads available to this process.
int available_cores();

// The thread count the environment asks for: the first positive ORTHOPT_NUM_THREADS or
// OMP_NUM_THREADS, in that order; 0 when neither gives one.
int requested_threads();

// The threading of the BLAS torch runs its CPU products on: "openblas-openmp" (the build
// scripts/bootstrap.sh selects: its products run on torch's OpenMP threads),
// "openblas-pthreads" (its own thread pool), "openblas-sequential", "openblas" (kind not
// reported), or "other" (no libopenblas loaded, e.g. pip's torch with MKL).
std::string blas_threading();

// torch's intra-op threads for `cores` cores: `cores`, except 1 with OpenBLAS's pthreads build,
// whose spinning pool makes torch's threads slow down the products (runtime.cpp says by how much).
int default_intra_op_threads(int cores, const std::string& blas_threading);

// Whether orthopt's own kernels may run in this thread: on CUDA the products, the multi-tensor
// step and scale_cast; on the CPU the fused update loops (AdamW, Lion). True unless a KernelsScope with ExecutionOptions::kernels = Off is open (the
// optimizer's step and orthogonalize() open one from their options), which leaves the ATen
// reference paths.
bool kernels_enabled();

// Switches the CUDA kernels off in this thread for the scope's lifetime when `kernels` is
// Toggle::Off (Auto and On leave the enclosing choice), then restores it.
class KernelsScope {
 public:
  explicit KernelsScope(Toggle kernels);
  ~KernelsScope();
  KernelsScope(const KernelsScope&) = delete;
  KernelsScope& operator=(const KernelsScope&) = delete;

 private:
  bool prev_;
};

// torch's TF32 switch for fp32 cuBLAS products (`at::globalContext().setAllowTF32CuBLAS`, what
// `torch.backends.cuda.matmul.allow_tf32 = True` does in Python) turned on for this object's
// lifetime when `on`, then restored; when not `on` the process's setting is left as it is.
// forbidden(): turned off for the object's lifetime, then restored, for products that must stay
// fp32 whatever the caller chose (Dion's Householder QR: algorithms.md's "QR in fp32").
class Tf32Products {
 public:
  explicit Tf32Products(bool on);
  static Tf32Products forbidden();
  ~Tf32Products();
  Tf32Products(const Tf32Products&) = delete;
  Tf32Products& operator=(const Tf32Products&) = delete;

 private:
  Tf32Products(bool change, bool allow);
  bool change_;
  bool prev_;
};

// File name of the loaded object (executable or shared library) that holds `address`, or
// "unknown".
std::string shared_object_of(const void* address);

// File name of the shared object whose std::filesystem code this library runs. It must be the
// system libstdc++: pip's torch 2.x exports its own static copy of those symbols
// (pytorch/pytorch#133437), built from other headers, and calls bound to it crash. The build
// makes libstdc++ the first dependency of every orthopt binary (CMakeLists.txt); tests check it.
std::string filesystem_provider();

}  // namespace orthopt

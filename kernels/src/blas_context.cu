// Per-thread, per-device cuBLAS handles with a fixed workspace. They live for the process
// (handles are cheap to keep and costly to create; destroying them at exit races the CUDA
// runtime's own teardown).
#include <map>

#include "internal.h"

namespace orthopt_k {

orthopt_status blas_context(BlasContext** out) {
  thread_local std::map<int, BlasContext> contexts;
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  auto it = contexts.find(device);
  if (it == contexts.end()) {
    BlasContext ctx;
    ORTHOPT_CUBLAS_TRY(cublasCreate(&ctx.blas));
    ORTHOPT_CUBLAS_TRY(cublasLtCreate(&ctx.lt));
    ORTHOPT_CUDA_TRY(cudaMalloc(&ctx.workspace, kWorkspaceBytes));
    ORTHOPT_CUBLAS_TRY(cublasSetWorkspace(ctx.blas, ctx.workspace, kWorkspaceBytes));
    it = contexts.emplace(device, ctx).first;
  }
  *out = &it->second;
  return ORTHOPT_OK;
}

}  // namespace orthopt_k

// Rectangular products D = α·A·X + β·C through cuBLASLt (fp32 accumulation, β·C in its epilogue).
// Row-major operands are handed to the column-major library as their transposes:
// Dᵀ = Xᵀ·Aᵀ, so no data moves.
#include <map>
#include <tuple>

#include "internal.h"

namespace orthopt_k {
namespace {

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t x = nullptr, a = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

orthopt_status make_layout(cublasLtMatrixLayout_t* out, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                           int64_t batch, int64_t stride) {
  ORTHOPT_CUBLAS_TRY(cublasLtMatrixLayoutCreate(out, type, rows, cols, ld));
  int32_t count = static_cast<int32_t>(batch);
  ORTHOPT_CUBLAS_TRY(
      cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  ORTHOPT_CUBLAS_TRY(
      cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  return ORTHOPT_OK;
}

orthopt_status get_plan(BlasContext* ctx, const PlanKey& key, Plan** out) {
  thread_local std::map<PlanKey, Plan> plans;  // descriptors are small; shapes per run are few
  auto it = plans.find(key);
  if (it != plans.end()) {
    *out = &it->second;
    return ORTHOPT_OK;
  }
  const auto [dt, batch, m, n, k, sa, sx, sc, sd, device] = key;
  const cudaDataType_t type = cuda_type(static_cast<orthopt_dtype>(dt));
  Plan p;
  ORTHOPT_CUBLAS_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  ORTHOPT_STATUS_TRY(make_layout(&p.x, type, n, k, n, batch, sx));  // Xᵀ: n×k col-major
  ORTHOPT_STATUS_TRY(make_layout(&p.a, type, k, m, k, batch, sa));  // Aᵀ: k×m col-major
  ORTHOPT_STATUS_TRY(make_layout(&p.c, type, n, m, n, batch, sc));
  ORTHOPT_STATUS_TRY(make_layout(&p.d, type, n, m, n, batch, sd));
  cublasLtMatmulPreference_t pref;
  ORTHOPT_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  ORTHOPT_CUBLAS_TRY(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p.op, p.x, p.a, p.c, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    return fail(ORTHOPT_ERR_CUDA, "cuBLASLt found no algorithm for a %lldx%lldx%lld product (status %d)",
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), static_cast<int>(st));
  p.algo = result.algo;
  *out = &plans.emplace(key, p).first->second;
  return ORTHOPT_OK;
}

}  // namespace
}  // namespace orthopt_k

using namespace orthopt_k;

extern "C" orthopt_status orthopt_gemm(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                                       const void* A, int64_t stride_a, const void* X, int64_t stride_x,
                                       float alpha, const void* C, int64_t stride_c, float beta, void* D,
                                       int64_t stride_d, cudaStream_t stream) {
  if (!valid_dtype(dtype)) return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm: argument 'dtype' must be bf16 or fp16");
  if (batch < 1 || m < 1 || n < 1 || k < 1)
    return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm: sizes must be positive (batch %lld, m %lld, n %lld, k %lld)",
                static_cast<long long>(batch), static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k));
  if (!A || !X || !D) return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm: arguments 'A', 'X', 'D' must not be NULL");
  if (!C) {
    C = D;
    stride_c = stride_d;
    beta = 0.0f;
  }
  BlasContext* ctx = nullptr;
  ORTHOPT_STATUS_TRY(blas_context(&ctx));
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  Plan* plan = nullptr;
  ORTHOPT_STATUS_TRY(get_plan(ctx, PlanKey{dtype, batch, m, n, k, stride_a, stride_x, stride_c, stride_d, device}, &plan));
  ORTHOPT_CUBLAS_TRY(cublasLtMatmul(ctx->lt, plan->op, &alpha, X, plan->x, A, plan->a, &beta, C, plan->c, D, plan->d,
                                    &plan->algo, ctx->workspace, kWorkspaceBytes, stream));
  return ORTHOPT_OK;
}

// Rectangular products D = α·A·X + β·C through cuBLASLt (fp32 accumulation, β·C in its epilogue).
// Row-major operands are handed to the column-major library as their transposes:
// Dᵀ = Xᵀ·Aᵀ, so no data moves; an operand stored transposed is read with op T. cuBLASLt's first
// heuristic choice can be slower than the legacy cuBLAS call
// (bench/results/2026-11-29-h100-sym-products.md), so the first call of each shape times the top
// candidates on its own operands, round-robin, and keeps the fastest.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "internal.h"

namespace orthopt_k {
namespace {

// (dtype, out_dtype, batch, m, n, k, strides of A, X, C, D, device, a_transposed, x_transposed)
using PlanKey =
    std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, bool>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t x = nullptr, a = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // heuristic order
  bool tuned = false;
};

constexpr int kCandidates = 6;
constexpr size_t kTuningRounds = 5;

// Times one call of `launch` on `stream` and keeps the smaller of *best_ms (negative: none yet)
// and this time.
template <class Launch>
orthopt_status time_once(cudaStream_t stream, cudaEvent_t t0, cudaEvent_t t1, Launch launch, float* best_ms) {
  ORTHOPT_CUDA_TRY(cudaEventRecord(t0, stream));
  ORTHOPT_CUBLAS_TRY(launch());
  ORTHOPT_CUDA_TRY(cudaEventRecord(t1, stream));
  ORTHOPT_CUDA_TRY(cudaEventSynchronize(t1));
  float ms = 0.0f;
  ORTHOPT_CUDA_TRY(cudaEventElapsedTime(&ms, t0, t1));
  if (*best_ms < 0.0f || ms < *best_ms) *best_ms = ms;
  return ORTHOPT_OK;
}

// stride kPointerArray: the batch's matrices are at addresses read from a device array
// (cuBLASLt's pointer-array batch mode) instead of at a fixed stride.
constexpr int64_t kPointerArray = -1;

orthopt_status make_layout(cublasLtMatrixLayout_t* out, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                           int64_t batch, int64_t stride) {
  ORTHOPT_CUBLAS_TRY(cublasLtMatrixLayoutCreate(out, type, rows, cols, ld));
  int32_t count = static_cast<int32_t>(batch);
  ORTHOPT_CUBLAS_TRY(
      cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  if (stride == kPointerArray) {
    const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    ORTHOPT_CUBLAS_TRY(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
    return ORTHOPT_OK;
  }
  ORTHOPT_CUBLAS_TRY(
      cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  return ORTHOPT_OK;
}

// The layout of an operand the product needs as a rows×cols column-major matrix: a row-major
// [cols, rows] array is that matrix as stored; a row-major [rows, cols] array (an operand stored
// transposed) is its transpose, read with op T (attribute `trans`).
orthopt_status operand_layout(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t trans,
                              cublasLtMatrixLayout_t* out, cudaDataType_t type, int64_t rows, int64_t cols,
                              bool transposed, int64_t batch, int64_t stride) {
  if (!transposed) return make_layout(out, type, rows, cols, rows, batch, stride);
  const cublasOperation_t t = CUBLAS_OP_T;
  ORTHOPT_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(op, trans, &t, sizeof(t)));
  return make_layout(out, type, cols, rows, cols, batch, stride);
}

// Whether log_candidate() prints (ORTHOPT_GEMM_TUNING_LOG=1).
bool tuning_log_on() {
  const char* log = std::getenv("ORTHOPT_GEMM_TUNING_LOG");
  return log && log[0] == '1';
}

// One line on stderr per timed candidate (ORTHOPT_GEMM_TUNING_LOG=1): which cuBLASLt
// configuration the tuning saw for a shape, its best time and whether it was kept. A diagnostic
// for profiles: nvjet kernel names do not say which product they serve or why.
void log_candidate(int64_t batch, int64_t m, int64_t n, int64_t k, bool a_t, bool x_t, bool with_c, size_t index,
                   const cublasLtMatmulAlgo_t& algo, float best_ms, bool chosen) {
  const struct {
    const char* name;
    cublasLtMatmulAlgoConfigAttributes_t attr;
  } fields[] = {{"id", CUBLASLT_ALGO_CONFIG_ID},
                {"tile", CUBLASLT_ALGO_CONFIG_TILE_ID},
                {"splitk", CUBLASLT_ALGO_CONFIG_SPLITK_NUM},
                {"reduction", CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME},
                {"swizzle", CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING},
                {"custom", CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION},
                {"stages", CUBLASLT_ALGO_CONFIG_STAGES_ID},
                {"inner", CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID},
                {"cluster", CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID}};
  std::string line = "orthopt_gemm tuning " + std::to_string(batch) + "x" + std::to_string(m) + "x" +
                     std::to_string(n) + "x" + std::to_string(k) + (a_t ? " A^T" : "") + (x_t ? " X^T" : "") +
                     (with_c ? " +beta*C" : "") + ": candidate " + std::to_string(index);
  for (const auto& f : fields) {
    // The attributes are 32- or 16-bit: try both sizes.
    uint32_t v32 = 0;
    uint16_t v16 = 0;
    size_t written = 0;
    std::string value = "?";
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, f.attr, &v32, sizeof(v32), &written) == CUBLAS_STATUS_SUCCESS)
      value = std::to_string(v32);
    else if (cublasLtMatmulAlgoConfigGetAttribute(&algo, f.attr, &v16, sizeof(v16), &written) == CUBLAS_STATUS_SUCCESS)
      value = std::to_string(v16);
    line += std::string(" ") + f.name + " " + value;
  }
  std::fprintf(stderr, "%s, best %.4f ms%s\n", line.c_str(), best_ms, chosen ? " (kept)" : "");
}

// Times the plan's candidates on `run` (which launches one product with the given algorithm on
// `stream`) and keeps the fastest as plan->algo. Round-robin: every round times each candidate
// once, starting one candidate later each round, and each keeps its best time. Timing them one
// after another let clocks still rising from idle favour the later candidates (suspected in
// 8192² NS outliers, docs/gpu.md). `report(index, algo, best ms, kept)` sees every usable one.
template <class Run, class Report>
orthopt_status keep_fastest(Plan* plan, cudaStream_t stream, Run run, Report report) {
  std::vector<size_t> usable;
  for (size_t i = 0; i < plan->candidates.size(); ++i)
    if (run(plan->candidates[i]) == CUBLAS_STATUS_SUCCESS) usable.push_back(i);  // warm-up; skips one that cannot run
  std::vector<float> best(usable.size(), -1.0f);
  cudaEvent_t t0, t1;
  ORTHOPT_CUDA_TRY(cudaEventCreate(&t0));
  ORTHOPT_CUDA_TRY(cudaEventCreate(&t1));
  orthopt_status status = ORTHOPT_OK;
  for (size_t round = 0; round < kTuningRounds && status == ORTHOPT_OK; ++round) {
    for (size_t j = 0; j < usable.size() && status == ORTHOPT_OK; ++j) {
      const size_t u = (j + round) % usable.size();
      status = time_once(stream, t0, t1, [&] { return run(plan->candidates[usable[u]]); }, &best[u]);
    }
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  ORTHOPT_STATUS_TRY(status);
  size_t fastest = 0;
  for (size_t u = 1; u < usable.size(); ++u)
    if (best[u] < best[fastest]) fastest = u;
  if (!usable.empty()) plan->algo = plan->candidates[usable[fastest]];
  for (size_t u = 0; u < usable.size(); ++u) report(u, plan->candidates[usable[u]], best[u], u == fastest);
  return ORTHOPT_OK;
}

orthopt_status get_plan(BlasContext* ctx, const PlanKey& key, Plan** out) {
  thread_local std::map<PlanKey, Plan> plans;  // descriptors are small; shapes per run are few
  auto it = plans.find(key);
  if (it != plans.end()) {
    *out = &it->second;
    return ORTHOPT_OK;
  }
  const auto [dt, out_dt, batch, m, n, k, sa, sx, sc, sd, device, a_transposed, x_transposed] = key;
  const cudaDataType_t type = cuda_type(static_cast<orthopt_dtype>(dt));
  const cudaDataType_t out_type = cuda_type(static_cast<orthopt_dtype>(out_dt));
  Plan p;
  ORTHOPT_CUBLAS_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (sd == kPointerArray) {  // orthopt_gemm_update: α and β are read from device memory
    const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    ORTHOPT_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)));
  }
  // cuBLASLt computes Dᵀ (n×m) = Xᵀ (n×k) · Aᵀ (k×m), its operands A and B being our Xᵀ and Aᵀ.
  ORTHOPT_STATUS_TRY(operand_layout(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &p.x, type, n, k, x_transposed, batch, sx));
  ORTHOPT_STATUS_TRY(operand_layout(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &p.a, type, k, m, a_transposed, batch, sa));
  ORTHOPT_STATUS_TRY(make_layout(&p.c, out_type, n, m, n, batch, sc));
  ORTHOPT_STATUS_TRY(make_layout(&p.d, out_type, n, m, n, batch, sd));
  cublasLtMatmulPreference_t pref;
  ORTHOPT_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  ORTHOPT_CUBLAS_TRY(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx->lt, p.op, p.x, p.a, p.c, p.d, pref, kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    return fail(ORTHOPT_ERR_CUDA, "cuBLASLt found no algorithm for a %lldx%lldx%lld product (status %d)",
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), static_cast<int>(st));
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(results[i].algo);
  if (p.candidates.empty()) return fail(ORTHOPT_ERR_CUDA, "cuBLASLt returned no usable algorithm");
  p.algo = p.candidates.front();
  *out = &plans.emplace(key, p).first->second;
  return ORTHOPT_OK;
}

}  // namespace

orthopt_status gemm_impl(orthopt_dtype dtype, orthopt_dtype out_dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                         const void* A, int64_t stride_a, bool a_transposed, const void* X, int64_t stride_x,
                         bool x_transposed, float alpha, const void* C, int64_t stride_c, float beta, void* D,
                         int64_t stride_d, cudaStream_t stream) {
  if (!C) {
    C = D;
    stride_c = stride_d;
    beta = 0.0f;
  }
  BlasContext* ctx = nullptr;
  ORTHOPT_STATUS_TRY(blas_context(stream, &ctx));
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  Plan* plan = nullptr;
  ORTHOPT_STATUS_TRY(get_plan(
      ctx,
      PlanKey{dtype, out_dtype, batch, m, n, k, stride_a, stride_x, stride_c, stride_d, device, a_transposed,
              x_transposed},
      &plan));
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(ctx->lt, plan->op, &alpha, X, plan->x, A, plan->a, &beta, C, plan->c, D, plan->d, &algo,
                          ctx->workspace, kWorkspaceBytes, stream);
  };
  if (!plan->tuned) {
    plan->tuned = true;
    // Only when D is scratch until the last run (C is not D, or not read) and no capture is on.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ORTHOPT_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    if ((C != D || beta == 0.0f) && capture == cudaStreamCaptureStatusNone && plan->candidates.size() > 1) {
      const bool log = tuning_log_on();
      ORTHOPT_STATUS_TRY(keep_fastest(plan, stream, run, [&](size_t u, const cublasLtMatmulAlgo_t& algo, float ms,
                                                             bool chosen) {
        if (log) log_candidate(batch, m, n, k, a_transposed, x_transposed, beta != 0.0f, u, algo, ms, chosen);
      }));
    }
  }
  ORTHOPT_CUBLAS_TRY(run(plan->algo));
  return ORTHOPT_OK;
}

// ---- Muon's update folded into the last Newton–Schulz product (orthopt_gemm_update).

constexpr int kUpdateWeights = 128;  // weight addresses per setup launch (kernel arguments: 1 KiB)
// The alignment (bytes) every matrix address must have: cuBLASLt cannot check addresses that
// pointer arrays hold, and its heuristic assumes 256 unless told less. (A racecheck fault seen
// while candidates were timed, which prompted this rule, turned out to be the sanitizer's own:
// it fails on these pointer-array products whatever their alignment, even with no kernel
// instrumented; memcheck with every kernel checked is clean. tests/gpu/run.sh says so.)
constexpr int kUpdateMinAlignment = 256;
constexpr int64_t kOperandBytes = 2;  // A and X: bf16 or fp16 (valid_dtype)

struct UpdateSetup {
  const char* x;  // our X (cuBLASLt's A) and A (its B), strided
  const char* a;
  int64_t x_stride_bytes, a_stride_bytes;
  int64_t batch, first, count;  // this launch writes entries first .. first + count − 1
  float* weight[kUpdateWeights];
  const double* lr;
  const uint8_t* keep;
  double factor, weight_decay;
};

// The pointer arrays (X's, A's and the weights', `batch` each) and, in the first launch, {α, β}:
// −(lr·factor) and 1 − lr·wd as the update kernel rounds them (decay_consts).
__global__ void gemm_update_setup(const __grid_constant__ UpdateSetup s, const void** arrays, float* alpha_beta) {
  const int64_t i = threadIdx.x;
  if (i < s.count) {
    const int64_t b = s.first + i;
    arrays[b] = s.x + b * s.x_stride_bytes;
    arrays[s.batch + b] = s.a + b * s.a_stride_bytes;
    arrays[2 * s.batch + b] = s.weight[i];
  }
  if (s.first == 0 && i == 0) {
    const bool skip = s.keep != nullptr && *s.keep == 0;
    const DecayConsts c = decay_consts(*s.lr, s.weight_decay, s.factor);
    alpha_beta[0] = skip ? 0.0f : -c.step;
    alpha_beta[1] = skip ? 1.0f : c.keep;
  }
}

// The largest power of two up to 256 that every matrix address of orthopt_gemm_update divides.
int update_alignment(int64_t batch, const void* A, int64_t stride_a, const void* X, int64_t stride_x,
                     float* const* weight, size_t elem) {
  uintptr_t bits = 256 | reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(X);
  if (batch > 1) bits |= static_cast<uintptr_t>(stride_a) * elem | static_cast<uintptr_t>(stride_x) * elem;
  for (int64_t b = 0; b < batch; ++b) bits |= reinterpret_cast<uintptr_t>(weight[b]);
  return static_cast<int>(bits & (~bits + 1));  // the lowest set bit
}

orthopt_status gemm_update_impl(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k, const void* A,
                                int64_t stride_a, bool a_transposed, const void* X, int64_t stride_x,
                                bool x_transposed, float* const* weight, double factor, const double* lr,
                                double weight_decay, const uint8_t* keep, void* scratch, cudaStream_t stream) {
  BlasContext* ctx = nullptr;
  ORTHOPT_STATUS_TRY(blas_context(stream, &ctx));
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  Plan* plan = nullptr;
  ORTHOPT_STATUS_TRY(get_plan(ctx,
                              PlanKey{dtype, ORTHOPT_FP32, batch, m, n, k, kPointerArray, kPointerArray, kPointerArray,
                                      kPointerArray, device, a_transposed, x_transposed},
                              &plan));
  const void** arrays = static_cast<const void**>(scratch);  // X's, A's, then the weights' addresses
  UpdateSetup s{};
  s.x = static_cast<const char*>(X);
  s.a = static_cast<const char*>(A);
  s.x_stride_bytes = stride_x * kOperandBytes;
  s.a_stride_bytes = stride_a * kOperandBytes;
  s.batch = batch;
  s.lr = lr;
  s.keep = keep;
  s.factor = factor;
  s.weight_decay = weight_decay;
  // Writes the pointer arrays (weights at `w`) and {α, β} into `to` (scratch's layout).
  auto setup = [&](float* const* w, const void** to) -> orthopt_status {
    for (int64_t first = 0; first < batch; first += kUpdateWeights) {
      s.first = first;
      s.count = std::min<int64_t>(kUpdateWeights, batch - first);
      for (int64_t i = 0; i < s.count; ++i) s.weight[i] = w[first + i];
      gemm_update_setup<<<1, kUpdateWeights, 0, stream>>>(s, to, reinterpret_cast<float*>(to + 3 * batch));
      ORTHOPT_CUDA_TRY(cudaGetLastError());
    }
    return ORTHOPT_OK;
  };
  auto run = [&](const cublasLtMatmulAlgo_t& algo, const void** on) {
    const float* ab = reinterpret_cast<const float*>(on + 3 * batch);
    void* d = const_cast<const void**>(on + 2 * batch);  // pointer-array mode: the array's address
    return cublasLtMatmul(ctx->lt, plan->op, ab, on, plan->x, on + batch, plan->a, ab + 1, d, plan->c, d, plan->d,
                          &algo, ctx->workspace, kWorkspaceBytes, stream);
  };
  if (!plan->tuned) {
    plan->tuned = true;
    // The candidates are timed on stand-in weights (the product writes the ones it reads), in
    // memory taken from the stream's pool for this once; where none is free, or a capture is on,
    // the heuristic's first choice stays.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ORTHOPT_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    const size_t weight_bytes = (static_cast<size_t>(batch * m * n) * sizeof(float) + 255) / 256 * 256;
    void* stand_in = nullptr;
    if (capture == cudaStreamCaptureStatusNone && plan->candidates.size() > 1) {
      if (cudaMallocAsync(&stand_in, weight_bytes + orthopt_gemm_update_scratch_bytes(batch), stream) != cudaSuccess) {
        (void)cudaGetLastError();  // out of memory: keep the heuristic's choice
        stand_in = nullptr;
      }
    }
    if (stand_in) {
      float* w0 = static_cast<float*>(stand_in);
      std::vector<float*> w(static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) w[b] = w0 + b * m * n;
      const void** on = reinterpret_cast<const void**>(static_cast<char*>(stand_in) + weight_bytes);
      orthopt_status st = cudaMemsetAsync(stand_in, 0, weight_bytes, stream) == cudaSuccess ? ORTHOPT_OK : ORTHOPT_ERR_CUDA;
      if (st == ORTHOPT_OK) st = setup(w.data(), on);
      if (st == ORTHOPT_OK) {
        const bool log = tuning_log_on();
        st = keep_fastest(plan, stream, [&](const cublasLtMatmulAlgo_t& algo) { return run(algo, on); },
                          [&](size_t u, const cublasLtMatmulAlgo_t& algo, float ms, bool chosen) {
                            if (log) log_candidate(batch, m, n, k, a_transposed, x_transposed, true, u, algo, ms, chosen);
                          });
      }
      const cudaError_t freed = cudaFreeAsync(stand_in, stream);
      ORTHOPT_STATUS_TRY(st);
      ORTHOPT_CUDA_TRY(freed);
    }
  }
  ORTHOPT_STATUS_TRY(setup(weight, arrays));
  ORTHOPT_CUBLAS_TRY(run(plan->algo, arrays));
  return ORTHOPT_OK;
}

}  // namespace orthopt_k

using namespace orthopt_k;

extern "C" int orthopt_gemm_update_aligned(int64_t batch, const void* A, int64_t stride_a, const void* X,
                                           int64_t stride_x, float* const* weight, int dtype_bytes) {
  if (batch < 1 || !weight) return 0;
  return update_alignment(batch, A, stride_a, X, stride_x, weight, static_cast<size_t>(dtype_bytes)) >=
         kUpdateMinAlignment;
}

extern "C" size_t orthopt_gemm_update_scratch_bytes(int64_t batch) {
  return batch < 1 ? 0 : static_cast<size_t>(3 * batch) * sizeof(void*) + 2 * sizeof(float);
}

extern "C" orthopt_status orthopt_gemm_update(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                                              const void* A, int64_t stride_a, int a_transposed, const void* X,
                                              int64_t stride_x, int x_transposed, float* const* weight, double factor,
                                              const double* lr, double weight_decay, const uint8_t* keep,
                                              void* scratch, cudaStream_t stream) {
  if (!valid_dtype(dtype))
    return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm_update: argument 'dtype' must be bf16 or fp16");
  if (batch < 1 || m < 1 || n < 1 || k < 1)
    return fail(ORTHOPT_ERR_INVALID,
                "orthopt_gemm_update: sizes must be positive (batch %lld, m %lld, n %lld, k %lld)",
                static_cast<long long>(batch), static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k));
  if (!A || !X || !weight || !lr || !scratch)
    return fail(ORTHOPT_ERR_INVALID,
                "orthopt_gemm_update: arguments 'A', 'X', 'weight', 'lr', 'scratch' must not be NULL");
  for (int64_t b = 0; b < batch; ++b)
    if (!weight[b]) return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm_update: argument 'weight' [%lld] is NULL",
                                static_cast<long long>(b));
  if (reinterpret_cast<uintptr_t>(scratch) % alignof(void*) != 0)
    return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm_update: argument 'scratch' must be %zu-byte aligned",
                alignof(void*));
  if (update_alignment(batch, A, stride_a, X, stride_x, weight, kOperandBytes) < kUpdateMinAlignment)
    return fail(ORTHOPT_ERR_INVALID,
                "orthopt_gemm_update: arguments 'A', 'X', 'weight': every matrix must start at a multiple of %d "
                "bytes (orthopt_gemm_update_aligned)",
                kUpdateMinAlignment);
  return gemm_update_impl(dtype, batch, m, n, k, A, stride_a, a_transposed != 0, X, stride_x, x_transposed != 0,
                          weight, factor, lr, weight_decay, keep, scratch, stream);
}

extern "C" orthopt_status orthopt_gemm(orthopt_dtype dtype, orthopt_dtype out_dtype, int64_t batch, int64_t m,
                                       int64_t n, int64_t k, const void* A, int64_t stride_a, int a_transposed,
                                       const void* X, int64_t stride_x, int x_transposed, float alpha,
                                       const void* C, int64_t stride_c, float beta, void* D, int64_t stride_d,
                                       cudaStream_t stream) {
  if (!valid_dtype(dtype)) return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm: argument 'dtype' must be bf16 or fp16");
  if (out_dtype != dtype && out_dtype != ORTHOPT_FP32)
    return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm: argument 'out_dtype' must be fp32 or equal to 'dtype'");
  if (batch < 1 || m < 1 || n < 1 || k < 1)
    return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm: sizes must be positive (batch %lld, m %lld, n %lld, k %lld)",
                static_cast<long long>(batch), static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k));
  if (!A || !X || !D) return fail(ORTHOPT_ERR_INVALID, "orthopt_gemm: arguments 'A', 'X', 'D' must not be NULL");
  return gemm_impl(dtype, out_dtype, batch, m, n, k, A, stride_a, a_transposed != 0, X, stride_x, x_transposed != 0,
                   alpha, C, stride_c, beta, D, stride_d, stream);
}

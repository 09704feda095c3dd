// Kernel-level timings of the symmetric product D = A·Aᵀ (bf16, fp32 accumulation) on the
// shapes Newton–Schulz produces, against the dense cuBLAS product of the same operands in the
// same run: the dense product (peer), the block path at several panel heights, the native
// kernel. CUDA events, warm-up, median of repeats, random inputs. Prints a markdown table.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../../kernels/src/internal.h"

namespace {

#define CK(x)                                                                                         \
  do {                                                                                                \
    auto e_ = (x);                                                                                    \
    if (e_ != 0) {                                                                                    \
      std::printf("error %d at %s:%d: %s\n", static_cast<int>(e_), __FILE__, __LINE__, orthopt_last_error()); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

__global__ void fill(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __float2bfloat16_rn(scale * ((h & 0xFFFFFF) / 16777216.0f - 0.5f));
  }
}

double median_ms(const std::function<void()>& fn, int warmup, int repeats) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<float> ms;
  for (int i = 0; i < repeats; ++i) {
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  struct Shape { int64_t batch, m, k; };
  std::vector<Shape> shapes = {{1, 1024, 1024}, {1, 2048, 2048}, {1, 4096, 4096}, {1, 8192, 8192},
                               {1, 4096, 14336}, {16, 1536, 2048}, {16, 1536, 1536}, {128, 1536, 2048},
                               {32, 2048, 7168}, {32, 2048, 2048}};
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  cublasHandle_t h;
  CK(cublasCreate(&h));
  std::printf("| batch×m×k | dense cuBLAS ms | blocks b=256 | b=512 | b=1024 | blocks auto | native | best/dense | dense TF/s | best eff. TF/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    __nv_bfloat16 *A, *D;
    const size_t na = s.batch * s.m * s.k, nd = s.batch * s.m * s.m;
    CK(cudaMalloc(&A, na * 2));
    CK(cudaMalloc(&D, nd * 2));
    fill<<<1024, 256>>>(A, na, 17u, 2.0f / std::sqrt(static_cast<float>(s.k)));
    CK(cudaGetLastError());
    const float one = 1.0f, zero = 0.0f;
    auto dense = [&] {
      CK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.m, s.m, s.k, &one, A, CUDA_R_16BF, s.k, s.m * s.k,
                                    A, CUDA_R_16BF, s.k, s.m * s.k, &zero, D, CUDA_R_16BF, s.m, s.m * s.m, s.batch,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    auto blocks = [&](int64_t b) {
      return [&, b] {
        CK(orthopt_k::sym_abt_blocks(ORTHOPT_BF16, s.batch, s.m, s.k, A, s.m * s.k, A, s.m * s.k, 1.0f, nullptr, 0,
                                     0.0f, 0.0f, D, s.m * s.m, b, nullptr));
      };
    };
    auto native = [&] {
      CK(orthopt_sym_abt(ORTHOPT_BF16, s.batch, s.m, s.k, A, s.m * s.k, A, s.m * s.k, 1.0f, nullptr, 0, 0.0f, 0.0f,
                         D, s.m * s.m, ORTHOPT_SYM_NATIVE, nullptr));
    };
    const double t_dense = median_ms(dense, 3, repeats);
    const double t256 = median_ms(blocks(256), 3, repeats);
    const double t512 = median_ms(blocks(512), 3, repeats);
    const double t1024 = median_ms(blocks(1024), 3, repeats);
    const double tauto = median_ms(blocks(0), 3, repeats);
    const double tnat = median_ms(native, 3, repeats);
    const double best = std::min({t256, t512, t1024, tauto, tnat});
    const double flops = 2.0 * s.batch * s.m * s.m * s.k;  // dense count
    std::printf("| %lldx%lldx%lld | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f | %.0f |\n",
                (long long)s.batch, (long long)s.m, (long long)s.k, t_dense, t256, t512, t1024, tauto, tnat,
                best / t_dense, flops / t_dense * 1e-9, flops / best * 1e-9);
    cudaFree(A);
    cudaFree(D);
  }
  std::printf("ms: median of %d CUDA-event timings after 3 warm-ups; TF/s count the dense 2·m²·k FLOPs.\n", repeats);
  return 0;
}

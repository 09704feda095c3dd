// Symmetric product from cuBLAS block products (the path for Hopper's wgmma-backed cuBLAS):
// the m×m result is cut into T row panels of height b; panel i gets its off-diagonal part
// D[i, 0:i] in one product and the diagonal blocks D[i, i] are dense products. That is
// 1/2 + 1/(2T) of the dense FLOPs. A mirror pass then copies the lower triangle onto the
// upper one (making D exactly symmetric) and adds diag·I.
#include <algorithm>
#include <cmath>

#include "internal.h"

namespace orthopt_k {
namespace {

constexpr int kTile = 32;

template <typename T>
__device__ inline float to_float(T v);
template <>
__device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ inline float to_float<__half>(__half v) { return __half2float(v); }
template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ inline __half from_float<__half>(float v) { return __float2half_rn(v); }

// Linear index over the lower-triangle tiles (ti >= tj) of a t×t tile grid.
__device__ inline void lower_tile(int64_t idx, int* ti, int* tj) {
  int i = static_cast<int>((sqrt(8.0 * static_cast<double>(idx) + 1.0) - 1.0) * 0.5);
  while (static_cast<int64_t>(i) * (i + 1) / 2 > idx) --i;
  while (static_cast<int64_t>(i + 1) * (i + 2) / 2 <= idx) ++i;
  *ti = i;
  *tj = static_cast<int>(idx - static_cast<int64_t>(i) * (i + 1) / 2);
}

// One 32×32 lower tile per block: D[upper] = D[lower]ᵀ, D[i,i] += diag.
template <typename T>
__global__ void mirror_lower(T* D, int64_t m, int64_t stride_d, float diag) {
  __shared__ T tile[kTile][kTile + 1];
  int ti, tj;
  lower_tile(blockIdx.x, &ti, &tj);
  T* d = D + static_cast<int64_t>(blockIdx.y) * stride_d;
  const int64_t r0 = static_cast<int64_t>(ti) * kTile, c0 = static_cast<int64_t>(tj) * kTile;
  for (int y = threadIdx.y; y < kTile; y += blockDim.y) {
    const int64_t r = r0 + y, c = c0 + threadIdx.x;
    if (r < m && c < m) {
      T v = d[r * m + c];
      if (r == c && diag != 0.0f) {
        v = from_float<T>(to_float(v) + diag);
        d[r * m + c] = v;
      }
      tile[y][threadIdx.x] = v;
    }
  }
  __syncthreads();
  // Write the transpose into the upper triangle: element (c0+y, r0+x) = tile[x][y].
  for (int y = threadIdx.y; y < kTile; y += blockDim.y) {
    const int64_t r = c0 + y, c = r0 + threadIdx.x;
    if (r < m && c < m && c > r) d[r * m + c] = tile[threadIdx.x][y];
  }
}

template <typename T>
orthopt_status launch_mirror(void* D, int64_t batch, int64_t m, int64_t stride_d, float diag, cudaStream_t stream) {
  const int64_t t = (m + kTile - 1) / kTile;
  dim3 grid(static_cast<unsigned>(t * (t + 1) / 2), static_cast<unsigned>(batch));
  mirror_lower<T><<<grid, dim3(kTile, 8), 0, stream>>>(static_cast<T*>(D), m, stride_d, diag);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

}  // namespace

// Panel heights: 1024 from m = 4096 on (smaller panels add launches and lose cuBLAS
// efficiency), else 512 (bench/results/2026-11-29-h100-sym-products.md).
int64_t auto_sym_block(int64_t m) { return m >= 4096 ? 1024 : 512; }

orthopt_status mirror_lower(orthopt_dtype dtype, int64_t batch, int64_t m, void* D, int64_t stride_d, float diag,
                            cudaStream_t stream) {
  return dtype == ORTHOPT_BF16 ? launch_mirror<__nv_bfloat16>(D, batch, m, stride_d, diag, stream)
                               : launch_mirror<__half>(D, batch, m, stride_d, diag, stream);
}

orthopt_status sym_abt_blocks(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                              int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                              int64_t stride_c, float beta, float diag, void* D, int64_t stride_d, int64_t block,
                              cudaStream_t stream) {
  BlasContext* ctx = nullptr;
  ORTHOPT_STATUS_TRY(blas_context(stream, &ctx));
  ORTHOPT_CUBLAS_TRY(cublasSetStream(ctx->blas, stream));
  const cudaDataType_t type = cuda_type(dtype);
  const size_t es = 2;  // bytes per element (bf16, fp16)
  auto at = [es](const void* p, int64_t off) { return static_cast<const char*>(p) + off * static_cast<int64_t>(es); };
  auto at_mut = [es](void* p, int64_t off) { return static_cast<char*>(p) + off * static_cast<int64_t>(es); };

  // β·C enters through cuBLAS's in-place β: copy C into D first (one pass over m² per matrix).
  float panel_beta = 0.0f;
  if (C && beta != 0.0f) {
    ORTHOPT_CUDA_TRY(cudaMemcpy2DAsync(D, stride_d * es, C, stride_c * es, m * m * es, batch,
                                       cudaMemcpyDeviceToDevice, stream));
    panel_beta = beta;
  }
  const int64_t b = std::min(block > 0 ? block : auto_sym_block(m), m);
  const int64_t tiles = (m + b - 1) / b;
  const int bi = static_cast<int>(batch);
  // Panels below the diagonal: rows [i·b, i·b + r), cols [0, i·b). Column-major view of the
  // row-major block: Dᵀ(c×r, ld m) = B[0:c] (op T, ld k) · A[rows]ᵀ (op N, ld k).
  for (int64_t i = 1; i < tiles; ++i) {
    const int64_t r0 = i * b, r = std::min(b, m - r0), c = r0;
    ORTHOPT_CUBLAS_TRY(cublasGemmStridedBatchedEx(
        ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(c), static_cast<int>(r), static_cast<int>(k), &alpha,
        B, type, static_cast<int>(k), stride_b, at(A, r0 * k), type, static_cast<int>(k), stride_a, &panel_beta,
        at_mut(D, r0 * m), type, static_cast<int>(m), stride_d, bi, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // Diagonal blocks (dense; the mirror pass then keeps their lower halves).
  const int64_t full = m / b;  // equal-sized diagonal blocks
  if (batch == 1 && full > 1) {
    // One call over the diagonal blocks of the single matrix, as a strided batch.
    ORTHOPT_CUBLAS_TRY(cublasGemmStridedBatchedEx(
        ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(b), static_cast<int>(b), static_cast<int>(k), &alpha,
        B, type, static_cast<int>(k), b * k, A, type, static_cast<int>(k), b * k, &panel_beta, D, type,
        static_cast<int>(m), b * m + b, static_cast<int>(full), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    for (int64_t i = 0; i < full; ++i)
      ORTHOPT_CUBLAS_TRY(cublasGemmStridedBatchedEx(
          ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(b), static_cast<int>(b), static_cast<int>(k), &alpha,
          at(B, i * b * k), type, static_cast<int>(k), stride_b, at(A, i * b * k), type, static_cast<int>(k),
          stride_a, &panel_beta, at_mut(D, i * b * m + i * b), type, static_cast<int>(m), stride_d, bi,
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (full * b < m) {  // ragged last diagonal block
    const int64_t r0 = full * b, r = m - r0;
    ORTHOPT_CUBLAS_TRY(cublasGemmStridedBatchedEx(
        ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(r), static_cast<int>(r), static_cast<int>(k), &alpha,
        at(B, r0 * k), type, static_cast<int>(k), stride_b, at(A, r0 * k), type, static_cast<int>(k), stride_a,
        &panel_beta, at_mut(D, r0 * m + r0), type, static_cast<int>(m), stride_d, bi, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }
  return mirror_lower(dtype, batch, m, D, stride_d, diag, stream);
}

}  // namespace orthopt_k

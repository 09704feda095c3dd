// Shared helpers of the kernel library (not part of the C API).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublasLt.h>
#include <cublas_v2.h>

#include "orthopt_kernels.h"

namespace orthopt_k {

#ifdef __CUDACC__
// The divisor of a Newton–Schulz input's scaling, as ATen computes `norm * safety + eps` in fp32:
// two roundings (no fused multiply-add). orthopt_scale_cast and orthopt_momentum_ns_input.
__device__ __forceinline__ float ns_input_divisor(float norm, float safety, float eps) {
  return __fadd_rn(__fmul_rn(norm, safety), eps);
}
#endif

// Records the message for orthopt_last_error() and returns `code`.
orthopt_status fail(orthopt_status code, const char* fmt, ...);

// Checks a CUDA / cuBLAS call and returns an error from the calling function on failure.
#define ORTHOPT_CUDA_TRY(expr)                                                                  \
  do {                                                                                          \
    cudaError_t err_ = (expr);                                                                  \
    if (err_ != cudaSuccess)                                                                    \
      return ::orthopt_k::fail(ORTHOPT_ERR_CUDA, "%s failed: %s (%s:%d)", #expr,                 \
                               cudaGetErrorString(err_), __FILE__, __LINE__);                   \
  } while (0)
#define ORTHOPT_CUBLAS_TRY(expr)                                                                \
  do {                                                                                          \
    cublasStatus_t st_ = (expr);                                                                \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      return ::orthopt_k::fail(ORTHOPT_ERR_CUDA, "%s failed: cuBLAS status %d (%s:%d)", #expr,   \
                               static_cast<int>(st_), __FILE__, __LINE__);                     \
  } while (0)
#define ORTHOPT_STATUS_TRY(expr)            \
  do {                                      \
    orthopt_status s_ = (expr);             \
    if (s_ != ORTHOPT_OK) return s_;        \
  } while (0)

// This thread's cuBLAS / cuBLASLt handles for the current device, created on first use, with a
// workspace of kWorkspaceBytes owned by the handle (fixed, so calls can be graph-captured).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
struct BlasContext {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
};
orthopt_status blas_context(cudaStream_t stream, BlasContext** out);  // per device and stream

inline cudaDataType_t cuda_type(orthopt_dtype t) {
  return t == ORTHOPT_BF16 ? CUDA_R_16BF : (t == ORTHOPT_FP16 ? CUDA_R_16F : CUDA_R_32F);
}
inline bool valid_dtype(orthopt_dtype t) { return t == ORTHOPT_BF16 || t == ORTHOPT_FP16; }

// The decoupled update's constants, rounded once from fp64: the update kernel
// (orthopt_multi_update) and the update folded into a product (orthopt_gemm_update) take the
// same fp32 values.
struct DecayConsts {
  float keep, decay, step;  // 1 − lr·wd, lr·wd, lr·factor
};
__device__ __forceinline__ DecayConsts decay_consts(double lr, double weight_decay, double factor) {
  const double lr_wd = __dmul_rn(lr, weight_decay);
  return {__double2float_rn(__dsub_rn(1.0, lr_wd)), __double2float_rn(lr_wd),
          __double2float_rn(__dmul_rn(lr, factor))};
}

// The implementations of orthopt_sym_abt's paths (arguments already validated).
// block: panel height of the block path (0: automatic).
orthopt_status sym_abt_blocks(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                              int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                              int64_t stride_c, float beta, float diag, void* D, int64_t stride_d, int64_t block,
                              cudaStream_t stream);
// The persistent Hopper kernel (sym_wgmma.cu); persistent_supported first.
orthopt_status sym_abt_persistent(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                                  int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                                  int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                                  cudaStream_t stream);
// Whether the persistent kernel can run these operands on the current device (why not, if not).
bool persistent_supported(int64_t k, const void* A, int64_t stride_a, const void* B, int64_t stride_b,
                          const char** why);
// A path's name, as the benchmarks and checks print it ("auto" for AUTO).
const char* sym_path_name(orthopt_sym_path path);
// Every path but AUTO, in enum order (kernel_check's loop).
inline constexpr orthopt_sym_path kSymPaths[] = {ORTHOPT_SYM_BLOCKS, ORTHOPT_SYM_DENSE, ORTHOPT_SYM_PERSISTENT};
// D = α·op(A)·op(X) + β·C through cuBLASLt, row-major: op(A) = A for A [m, k], or Aᵀ for A
// [k, m] when a_transposed; op(X) = X for X [k, n], or Xᵀ for X [n, k] when x_transposed. A and X
// in dtype, C and D in out_dtype (dtype, or ORTHOPT_FP32). C may be NULL (β ignored) or equal to D.
orthopt_status gemm_impl(orthopt_dtype dtype, orthopt_dtype out_dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
                         const void* A, int64_t stride_a, bool a_transposed, const void* X, int64_t stride_x,
                         bool x_transposed, float alpha, const void* C, int64_t stride_c, float beta, void* D,
                         int64_t stride_d, cudaStream_t stream);
// Copies the lower triangle of each m×m matrix of D onto its upper triangle (D becomes exactly
// symmetric) and adds diag to its diagonal.
orthopt_status mirror_lower(orthopt_dtype dtype, int64_t batch, int64_t m, void* D, int64_t stride_d, float diag,
                            cudaStream_t stream);
// The path AUTO takes for a shape (measured: docs/decisions/symmetric-product-kernels.md) and
// the block path's panel height.
orthopt_sym_path auto_sym_path(int64_t batch, int64_t m, int64_t k);
int64_t auto_sym_block(int64_t m);

}  // namespace orthopt_k

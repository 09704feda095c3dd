// Householder factorization of a narrow panel (orthopt_householder_panel), the latency-bound part
// of orthopt's blocked Householder QR (src/optim/update_math.cpp, householder_q_blocked). The
// rest of that QR is batched products (cuBLAS through ATen). cuSOLVER's geqrf/orgqr, which
// torch's linalg_qr calls once per matrix, spent ≈ 4 ms per 2048×512 matrix on an H200: Dion's
// step with its default QR was the QRs (docs/gpu.md).
//
// One block per matrix. The panel [rows, width] is copied into shared memory (width: cols
// rounded up to a power of two, so that a warp covers 32/width whole rows and every access is
// conflict-free), reduced there column by column, and written out as V. Per column: one reduction
// (the column's norm below the diagonal), one pass forming v and the dots vᵀ·a_k with the columns
// to its right, one reduction of those dots, one pass applying the reflector. Sums of squares are
// fp64 (no overflow or underflow for any fp32 panel), the dots fp32 like LAPACK's.
#include <cmath>

#include "internal.h"

namespace orthopt_k {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;
// Shared memory for the panel: what the device allows a block, less the reduction scratch.
constexpr int64_t kPanelBytes = 200 * 1024;

struct PanelArgs {
  int64_t rows, ld, stride_a;
  int cols, width;  // width = cols rounded up to a power of two (<= 32)
  const float* A;
  float* V;
};

__global__ void __launch_bounds__(kThreads) householder_panel_kernel(const PanelArgs a) {
  extern __shared__ float panel[];  // [rows][width], row-major
  __shared__ double red[kWarps][32];
  __shared__ float col_sum[32];
  __shared__ float s_scale, s_tau;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int W = a.width, col = lane % W, sub = lane / W, S = 32 / W;  // S rows per warp and pass
  const int64_t step = int64_t(kWarps) * S;
  const bool in_panel = col < a.cols;
  const float* A = a.A + static_cast<int64_t>(blockIdx.x) * a.stride_a;
  float* V = a.V + static_cast<int64_t>(blockIdx.x) * a.rows * a.cols;
  const unsigned full = 0xffffffffu;

  // Copy in, and the sum of squares of column 0 below its diagonal.
  double sq = 0.0;
  for (int64_t r = int64_t(warp) * S + sub; r < a.rows; r += step) {
    const float x = in_panel ? A[r * a.ld + col] : 0.0f;
    panel[r * W + col] = x;
    if (col == 0 && r > 0) sq += static_cast<double>(x) * x;
  }

  for (int c = 0; c < a.cols; ++c) {
    // Reflector of column c: H = I − τ·v·vᵀ with v_c = 1, v_r = x_r·scale below; β = −sign(α)·‖x‖
    // (no cancellation in α − β). A zero column takes v = e_c, τ = 2 (H flips row c): τ is
    // 2/‖v‖² for every column, which the T factor of the caller relies on.
    for (int off = W; off < 32; off <<= 1) sq += __shfl_xor_sync(full, sq, off);
    if (sub == 0) red[warp][col] = sq;
    __syncthreads();
    if (threadIdx.x == 0) {
      double sigma = 0.0;
      for (int w = 0; w < kWarps; ++w) sigma += red[w][c];
      const double alpha = panel[int64_t(c) * W + c];
      const double norm = sqrt(alpha * alpha + sigma);
      double scale = 0.0, vv = 1.0;
      if (norm > 0.0) {
        const double beta = alpha < 0.0 ? norm : -norm;
        scale = 1.0 / (alpha - beta);
        vv = 1.0 + sigma * scale * scale;
      }
      s_scale = static_cast<float>(scale);
      s_tau = static_cast<float>(2.0 / vv);
    }
    __syncthreads();
    const float scale = s_scale, tau = s_tau;

    // v into column c; the dots w_k = Σ_{r >= c} v_r·a_rk of the columns k > c.
    // kUnroll rows per thread loaded before they are used: independent loads in flight.
    float w = 0.0f;
    for (int64_t r0 = c + int64_t(warp) * S + sub; r0 - sub < a.rows; r0 += step * kUnroll) {  // warp-uniform
      float x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * step;
        x[u] = r < a.rows ? panel[r * W + col] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * step;
        float v = __shfl_sync(full, x[u], sub * W + c);
        v = r == c ? 1.0f : v * scale;
        if (r < a.rows && col == c) panel[r * W + c] = v;
        if (r < a.rows && col > c && in_panel) w = fmaf(v, x[u], w);
      }
    }
    for (int off = W; off < 32; off <<= 1) w += __shfl_xor_sync(full, w, off);
    if (sub == 0) red[warp][col] = w;
    __syncthreads();
    if (threadIdx.x < W) {
      double s = 0.0;
      for (int k = 0; k < kWarps; ++k) s += red[k][threadIdx.x];
      col_sum[threadIdx.x] = static_cast<float>(s);
    }
    __syncthreads();

    // a_k ← a_k − τ·w_k·v for k > c, and the next column's sum of squares below its diagonal.
    const float tw = tau * col_sum[col];
    sq = 0.0;
    for (int64_t r0 = c + int64_t(warp) * S + sub; r0 - sub < a.rows; r0 += step * kUnroll) {
      float x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * step;
        x[u] = r < a.rows ? panel[r * W + col] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * step;
        const float v = __shfl_sync(full, x[u], sub * W + c);
        if (r < a.rows && col > c && in_panel) {
          const float y = fmaf(-tw, v, x[u]);
          panel[r * W + col] = y;
          if (col == c + 1 && r > c + 1) sq += static_cast<double>(y) * y;
        }
      }
    }
  }
  __syncthreads();

  // V: v_k in column k, zeros above its unit diagonal (the panel there holds R, not needed).
  for (int64_t r = int64_t(warp) * S + sub; r < a.rows; r += step)
    if (in_panel) V[r * a.cols + col] = r < col ? 0.0f : panel[r * W + col];
}

int panel_width(int64_t cols) {
  int w = 1;
  while (w < cols) w <<= 1;
  return w;
}

}  // namespace
}  // namespace orthopt_k

using namespace orthopt_k;

extern "C" int64_t orthopt_householder_panel_max_rows(int64_t cols) {
  if (cols < 1 || cols > 32) return 0;
  return kPanelBytes / (static_cast<int64_t>(sizeof(float)) * panel_width(cols));
}

extern "C" orthopt_status orthopt_householder_panel(int64_t batch, int64_t rows, int64_t cols, const float* A,
                                                    int64_t ld, int64_t stride_a, float* V, cudaStream_t stream) {
  const char* fn = "orthopt_householder_panel";
  if (batch < 0 || rows < 0 || cols < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'batch', 'rows' and 'cols' must be >= 0, got %lld, %lld, %lld", fn,
                (long long)batch, (long long)rows, (long long)cols);
  if (batch == 0 || cols == 0) return ORTHOPT_OK;
  if (cols > 32) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' = %lld exceeds 32", fn, (long long)cols);
  if (rows < cols)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'rows' = %lld is less than 'cols' = %lld", fn, (long long)rows,
                (long long)cols);
  if (rows > orthopt_householder_panel_max_rows(cols))
    return fail(ORTHOPT_ERR_INVALID, "%s: a panel of %lld rows and %lld columns exceeds shared memory (max %lld rows)",
                fn, (long long)rows, (long long)cols, (long long)orthopt_householder_panel_max_rows(cols));
  if (ld < cols) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'ld' = %lld is less than 'cols'", fn, (long long)ld);
  if (batch > int64_t(INT32_MAX))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' = %lld exceeds one launch", fn, (long long)batch);
  if (A == nullptr || V == nullptr) return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'A' and 'V' must not be NULL", fn);
  const int width = panel_width(cols);
  const size_t smem = static_cast<size_t>(rows) * width * sizeof(float);
  ORTHOPT_CUDA_TRY(cudaFuncSetAttribute(householder_panel_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kPanelBytes)));
  const PanelArgs args{rows, ld, stride_a, static_cast<int>(cols), width, A, V};
  householder_panel_kernel<<<static_cast<unsigned>(batch), kThreads, smem, stream>>>(args);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

// Householder factorization of a narrow panel (orthopt_householder_panel), the latency-bound part
// of orthopt's blocked Householder QR (src/optim/update_math.cpp, householder_q_blocked). The
// rest of that QR is batched products (cuBLAS through ATen). cuSOLVER's geqrf/orgqr, which
// torch's linalg_qr calls once per matrix, spent ≈ 4 ms per 2048×512 matrix on an H200: Dion's
// step with its default QR was the QRs (docs/gpu.md).
//
// One block per matrix. The panel [rows, width] is copied into shared memory (width: cols
// rounded up to a power of two, so that a warp covers 32/width whole rows and every access is
// conflict-free), reduced there column by column, and written out as V. Per column: one
// reduction (the column's norm below the diagonal and its products with the columns to its
// right, summed in the previous column's pass) and one pass (form v, apply the reflector, sum
// the next column's products). Sums are fp64: no overflow or underflow for any fp32 panel.
#include <cmath>

#include "internal.h"

namespace orthopt_k {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;
// Shared memory for the panel at most (what the kernel was measured with on an H200); less where
// the device allows less (panel_bytes()).
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
  __shared__ double col_sum[32];
  __shared__ float row_c[32];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int W = a.width, col = lane % W, sub = lane / W, S = 32 / W;  // S rows per warp and pass
  const int64_t step = int64_t(kWarps) * S;
  const bool in_panel = col < a.cols;
  const float* A = a.A + static_cast<int64_t>(blockIdx.x) * a.stride_a;
  float* V = a.V + static_cast<int64_t>(blockIdx.x) * a.rows * a.cols;
  const unsigned full = 0xffffffffu;

  // One pass over the panel per column. Column c's pass applies reflector c and also sums, for
  // the next column x = a_{·,c+1} (already updated), dot_k = Σ_{r > c+1} x_r·a_rk for k > c: so
  // dot_{c+1} is ‖x‖² below the diagonal, and the next reflector's products with the columns to
  // its right are w_k = a_{c+1,k} + scale·dot_k (v = 1 on the diagonal, x·scale below) without a
  // pass of their own. The copy-in pass sums those of column 0.
  double dot = 0.0;
  for (int64_t r0 = int64_t(warp) * S + sub; r0 - sub < a.rows; r0 += step) {  // warp-uniform bound
    const bool row_ok = r0 < a.rows;
    const float y = row_ok && in_panel ? A[r0 * a.ld + col] : 0.0f;
    if (row_ok) panel[r0 * W + col] = y;
    const float x = __shfl_sync(full, y, sub * W);
    if (row_ok && r0 > 0) dot += static_cast<double>(x) * y;
  }

  for (int c = 0; c < a.cols; ++c) {
    for (int off = W; off < 32; off <<= 1) dot += __shfl_xor_sync(full, dot, off);
    if (sub == 0) red[warp][col] = dot;
    __syncthreads();  // also: the previous pass's writes to the panel
    if (threadIdx.x < W) {
      double t = 0.0;
      for (int w = 0; w < kWarps; ++w) t += red[w][threadIdx.x];
      col_sum[threadIdx.x] = t;
      row_c[threadIdx.x] = panel[int64_t(c) * W + threadIdx.x];  // row c before the pass rewrites it
    }
    __syncthreads();
    // Reflector of column c: H = I − τ·v·vᵀ with v_c = 1, v_r = x_r·scale below; β = −sign(α)·‖x‖
    // (no cancellation in α − β); τ = 2/‖v‖² for every column, which the T factor of the caller
    // relies on, so a column with nothing below its diagonal takes v = e_c, τ = 2 (H negates
    // row c). Every thread computes these (fp64) itself: no broadcast, no barrier.
    const double sigma = col_sum[c], alpha = row_c[c];
    const double norm = sqrt(alpha * alpha + sigma);
    double scale = 0.0, vv = 1.0;
    if (norm > 0.0) {
      scale = 1.0 / (alpha - (alpha < 0.0 ? norm : -norm));
      vv = 1.0 + sigma * scale * scale;
    }
    const float scale32 = static_cast<float>(scale);
    const float tw = col > c && in_panel
                         ? static_cast<float>((2.0 / vv) * (row_c[col] + scale * col_sum[col]))
                         : 0.0f;  // τ·w_k
    dot = 0.0;
    // kUnroll rows per thread loaded before they are used: independent loads in flight.
    for (int64_t r0 = c + int64_t(warp) * S + sub; r0 - sub < a.rows; r0 += step * kUnroll) {  // warp-uniform
      float y[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * step;
        y[u] = r < a.rows ? panel[r * W + col] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * step;
        const bool row_ok = r < a.rows;
        const float xc = __shfl_sync(full, y[u], sub * W + c);
        const float v = r == c ? 1.0f : xc * scale32;
        if (col == c) {
          if (row_ok) panel[r * W + c] = v;
        } else if (col > c && in_panel && row_ok) {
          y[u] = fmaf(-tw, v, y[u]);
          panel[r * W + col] = y[u];
        }
        const float x = __shfl_sync(full, y[u], (sub * W + c + 1) % 32);  // the next column, updated
        if (col > c && in_panel && row_ok && r > c + 1) dot += static_cast<double>(x) * y[u];
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

// Dynamic shared memory a panel may take on the current device: kPanelBytes (what the kernel was
// measured with on an H200), or less where the device's opt-in limit per block, less the kernel's
// static shared memory, is lower (A100: 163 KiB); 0 if the device cannot be queried.
int64_t panel_bytes() {
  int device = 0, optin = 0;
  cudaFuncAttributes attr{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attr, householder_panel_kernel) != cudaSuccess) {
    cudaGetLastError();  // not sticky: leave no error for the next call to find
    return 0;
  }
  const int64_t avail = static_cast<int64_t>(optin) - static_cast<int64_t>(attr.sharedSizeBytes);
  return avail < kPanelBytes ? (avail > 0 ? avail : 0) : kPanelBytes;
}

}  // namespace
}  // namespace orthopt_k

using namespace orthopt_k;

static int64_t max_rows(int64_t cols, int64_t bytes) {
  if (cols < 1 || cols > 32) return 0;
  return bytes / (static_cast<int64_t>(sizeof(float)) * panel_width(cols));
}

extern "C" int64_t orthopt_householder_panel_max_rows(int64_t cols) { return max_rows(cols, panel_bytes()); }

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
  const int64_t bytes = panel_bytes();  // one device query for the check and the launch
  if (rows > max_rows(cols, bytes))
    return fail(ORTHOPT_ERR_INVALID, "%s: a panel of %lld rows and %lld columns exceeds shared memory (max %lld rows)",
                fn, (long long)rows, (long long)cols, (long long)max_rows(cols, bytes));
  if (ld < cols) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'ld' = %lld is less than 'cols'", fn, (long long)ld);
  if (batch > int64_t(INT32_MAX))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' = %lld exceeds one launch", fn, (long long)batch);
  if (A == nullptr || V == nullptr) return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'A' and 'V' must not be NULL", fn);
  const int width = panel_width(cols);
  const size_t smem = static_cast<size_t>(rows) * width * sizeof(float);
  ORTHOPT_CUDA_TRY(cudaFuncSetAttribute(householder_panel_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  const PanelArgs args{rows, ld, stride_a, static_cast<int>(cols), width, A, V};
  householder_panel_kernel<<<static_cast<unsigned>(batch), kThreads, smem, stream>>>(args);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

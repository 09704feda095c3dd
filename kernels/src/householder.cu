// Householder factorization of a narrow panel (orthopt_householder_panel), the latency-bound part
// of orthopt's blocked Householder QR (src/optim/update_math.cpp, householder_q_blocked). The
// rest of that QR is batched products (cuBLAS through ATen). cuSOLVER's geqrf/orgqr, which
// torch's linalg_qr calls once per matrix, made Dion's step with its default QR mostly QRs
// (bench/results/2026-12-04-h200-dion-qr.md).
//
// The panel lives in registers: a cluster of C CTAs per matrix (C = 1 where one CTA holds it,
// up to 8), each thread holding RPT whole rows of width W (cols rounded up to a power of two;
// RPT·W = kRegs). Per column c the work is a few fused multiply-adds per row; what costs is the
// column's sums over all rows and the barrier, so a column takes one of each:
//   - reduce, for the current column x = a_{·,c}: σ = Σ_{r>c} x_r² and dot_k = Σ_{r>c} x_r·a_rk
//     for k > c (summed in the previous column's pass) within each warp, then one barrier (the
//     cluster's), after which every warp adds up all warps' partials of the cluster (distributed
//     shared memory) and row c, and computes the reflector's scalars itself in fp64: the same
//     bits everywhere, so no second barrier is needed to share them;
//   - pass: v_r = x_r·scale below the diagonal, a_rk −= τ·w_k·v_r, and the next column's sums.
// The column loop is not unrolled (unrolled over 32 columns, the warps stalled on instruction
// fetch: bench/results/2026-12-04-h200-householder-registers.md). Register indices must be
// constants, so the columns rotate instead: after column c every row shifts left by one and v
// goes last, so the current column is always position 0.
// Sums: fp32 over a thread's rows and across a warp's lanes (a tree), fp64 across warps and CTAs.
// fp32 products and sums cannot overflow or underflow harmfully because every column is first
// scaled by a power of two to a largest magnitude in [0.5, 1): V does not change under positive
// column scaling (QR of A·D has the Q of A), and a power of two changes no rounding, so V is the
// unscaled panel's bit for bit wherever the unscaled sums would have stayed in range.
#include <cooperative_groups.h>

#include <cmath>
#include <mutex>

#include "internal.h"

namespace cg = cooperative_groups;

namespace orthopt_k {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRegs = 128;        // panel floats a thread holds: RPT·W
constexpr int kMaxCluster = 8;    // the portable cluster size
constexpr unsigned kFull = 0xffffffffu;

struct PanelArgs {
  int64_t rows, ld, stride_a, ldv, stride_v;
  int cols, ctas, cta_rows;  // ctas: the cluster's CTAs; cta_rows: rows per CTA (the last may hold fewer)
  const float* A;
  float* V;
};

struct MaxOp {
  __device__ static float apply(float a, float b) { return fmaxf(a, b); }
};
struct SumOp {
  __device__ static float apply(float a, float b) { return a + b; }
};

// Reduce-scatter of N values (a power of two <= 32) across a warp: afterwards each lane holds the
// reduction over all 32 lanes of value lane >> (5 − log2 N), in N − 1 + 5 − log2 N shuffles
// (halving: each step a lane keeps half its values and sends the other half to its partner).
template <typename Op, int N, int Off>
__device__ __forceinline__ float reduce_scatter(float* v, int lane) {
  if constexpr (N == 1) {
    float x = v[0];
#pragma unroll
    for (int o = Off; o >= 1; o >>= 1) x = Op::apply(x, __shfl_xor_sync(kFull, x, o));
    return x;
  } else {
    const bool upper = (lane & Off) != 0;
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      const float send = upper ? v[j] : v[j + N / 2], keep = upper ? v[j + N / 2] : v[j];
      v[j] = Op::apply(keep, __shfl_xor_sync(kFull, send, Off));
    }
    return reduce_scatter<Op, N / 2, Off / 2>(v, lane);
  }
}

template <int W>
__device__ __forceinline__ int scatter_index(int lane) {
  constexpr int shift = W == 32 ? 0 : W == 16 ? 1 : W == 8 ? 2 : W == 4 ? 3 : W == 2 ? 4 : 5;
  return lane >> shift;
}

// The cluster's barrier (with C = 1, the CTA's), and a pointer to another CTA's shared memory.
__device__ __forceinline__ void cluster_barrier(int C) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (C > 1) {
    cg::this_cluster().sync();
    return;
  }
#endif
  __syncthreads();
}

template <typename T>
__device__ __forceinline__ const T* cta_smem(T* p, int C, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (C > 1) return cg::this_cluster().map_shared_rank(p, static_cast<unsigned>(rank));
#endif
  return p;
}

// Rows per thread: kRegs / W, at most 32 (more spill registers at W = 2: the rows' indices).
__host__ __device__ constexpr int rows_per_thread(int width) { return kRegs / width < 32 ? kRegs / width : 32; }

template <int W>
__global__ void __launch_bounds__(kThreads, 1) householder_panel_kernel(const PanelArgs a) {
  constexpr int RPT = rows_per_thread(W);
  // Per-warp partial sums and row c, by column parity: column c + 2 overwrites column c's only
  // after the barrier of column c + 1, which every thread of the cluster reaches after reading
  // column c's.
  __shared__ float red[2][kWarps][32];
  __shared__ float cta_row[2][32];  // row c of the panel (written by the CTA holding it, rank 0)
  __shared__ __align__(16) float tw_warp[kWarps][32];
  const int C = a.ctas;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int rank = static_cast<int>(blockIdx.x) % C;
  const int64_t mat = blockIdx.x / C;
  const float* A = a.A + mat * a.stride_a;
  float* V = a.V + mat * a.stride_v;
  const int64_t row0 = int64_t(rank) * a.cta_rows;
  const int64_t row_end = row0 + a.cta_rows < a.rows ? row0 + a.cta_rows : a.rows;
  const int t = static_cast<int>(threadIdx.x);
  // 16-byte accesses where every row start is 16-byte aligned and the columns are whole float4s.
  const bool vec_a = W >= 4 && a.cols % 4 == 0 && a.ld % 4 == 0 && a.stride_a % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(a.A) % 16 == 0;
  const bool vec_v = W >= 4 && a.cols % 4 == 0 && a.ldv % 4 == 0 && a.stride_v % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(a.V) % 16 == 0;

  // Σ over the cluster's warps of value `lane` of red[par] (fixed order: every warp of every CTA
  // gets the same bits), in fp64.
  auto cluster_total = [&](int par) {
    double s = 0.0;
    if (lane < W)
      for (int q = 0; q < C; ++q) {
        const float* r = cta_smem(&red[par][0][0], C, q);
        for (int w = 0; w < kWarps; ++w) s += static_cast<double>(r[w * 32 + lane]);
      }
    return s;
  };

  // Rows r = row0 + t + i·kThreads of the panel, in registers; rows past the end are zeros (they
  // add nothing). Position j of a row holds column j now; the column loop rotates them.
  float x[RPT][W];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int64_t r = row0 + t + int64_t(i) * kThreads;
    const bool in = r < row_end;
    if (vec_a) {
#pragma unroll
      for (int k = 0; k < W; k += 4) {
        const float4 f = in && k < a.cols ? *reinterpret_cast<const float4*>(A + r * a.ld + k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        x[i][k] = f.x, x[i][k + 1] = f.y, x[i][k + 2] = f.z, x[i][k + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) x[i][k] = in && k < a.cols ? A[r * a.ld + k] : 0.0f;
    }
  }

  // Every column scaled to a largest magnitude in [0.5, 1) by a power of two (see the top).
  {
    float m[W];
#pragma unroll
    for (int k = 0; k < W; ++k) {
      m[k] = 0.0f;
#pragma unroll
      for (int i = 0; i < RPT; ++i) m[k] = fmaxf(m[k], fabsf(x[i][k]));
    }
    const float s = reduce_scatter<MaxOp, W, 16>(m, lane);
    if (lane % (32 / W) == 0) red[1][warp][scatter_index<W>(lane)] = s;
    cluster_barrier(C);
    float mx = 0.0f;
    if (lane < W)
      for (int q = 0; q < C; ++q) {
        const float* r = cta_smem(&red[1][0][0], C, q);
        for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, r[w * 32 + lane]);
      }
    // 2^−e with mx in [2^(e−1), 2^e); e >= −125 keeps 2^−e a float (such a column is all but
    // zero). A zero column keeps 1; NaN or inf stays what it is.
    int e = 0;
    if (mx > 0.0f && mx <= 3.4e38f) frexpf(mx, &e);
    const float sk = ldexpf(1.0f, -(e > -125 ? e : -125));
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float f = __shfl_sync(kFull, sk, k);
#pragma unroll
      for (int i = 0; i < RPT; ++i) x[i][k] *= f;
    }
  }

  // Column 0's sums: dot_j = Σ_{r>0} x_r0·x_rj.
  float dot[W];
#pragma unroll
  for (int j = 0; j < W; ++j) dot[j] = 0.0f;
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const float x0 = row0 + t + int64_t(i) * kThreads > 0 ? x[i][0] : 0.0f;
#pragma unroll
    for (int j = 0; j < W; ++j) dot[j] = fmaf(x0, x[i][j], dot[j]);
  }

  // Column c. Positions: j < W − c holds column c + j, j >= W − c holds v_{c+j−W} (done). Not
  // unrolled: one column's code stays in the instruction cache (see the top).
#pragma unroll 1
  for (int c = 0; c < a.cols; ++c) {
    const int par = c & 1;
    {
      const float s = reduce_scatter<SumOp, W, 16>(dot, lane);
      if (lane % (32 / W) == 0) red[par][warp][scatter_index<W>(lane)] = s;
    }
    // Row c (c < 32 <= kThreads, and every CTA but the last holds >= kThreads rows) is thread
    // c's first row in CTA 0.
    if (rank == 0 && t == c) {
#pragma unroll
      for (int j = 0; j < W; ++j) cta_row[par][j] = x[0][j];
    }
    cluster_barrier(C);
    // Every warp computes the reflector itself (no second barrier). H = I − τ·v·vᵀ with v_c = 1,
    // v_r = x_r·scale below; β = −sign(α)·‖x‖ (no cancellation in α − β); τ = 2/‖v‖² for every
    // column, which the T factor of the caller relies on, so a column with nothing below its
    // diagonal takes v = e_c, τ = 2 (H negates row c).
    const double total = cluster_total(par);
    const float row_j = lane < W ? cta_smem(&cta_row[par][0], C, 0)[lane] : 0.0f;
    const double sigma = __shfl_sync(kFull, total, 0);
    const double alpha = __shfl_sync(kFull, row_j, 0);
    const double norm = sqrt(alpha * alpha + sigma);
    double scale = 0.0, vv = 1.0;
    if (norm > 0.0) {
      scale = 1.0 / (alpha - (alpha < 0.0 ? norm : -norm));
      vv = 1.0 + sigma * scale * scale;
    }
    // τ·w_j for the columns still to reduce (positions 1 .. W − c − 1); 0 leaves the others.
    const float tw_lane =
        lane >= 1 && lane < W - c ? static_cast<float>((2.0 / vv) * (row_j + scale * total)) : 0.0f;
    // To every lane through the warp's own row of shared memory (16-byte reads; the column's
    // barrier above keeps the next column's write behind this one's reads).
    tw_warp[warp][lane] = tw_lane;
    __syncwarp();
    float tw[W < 4 ? 4 : W];
#pragma unroll
    for (int j = 0; j < W; j += 4) {
      const float4 f = *reinterpret_cast<const float4*>(&tw_warp[warp][j]);
      tw[j] = f.x, tw[j + 1] = f.y, tw[j + 2] = f.z, tw[j + 3] = f.w;
    }
    const float scale32 = static_cast<float>(scale);
#pragma unroll
    for (int j = 0; j < W; ++j) dot[j] = 0.0f;  // the reduction above left partial sums there
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
      const int64_t r = row0 + t + int64_t(i) * kThreads;
      const float v = r > c ? x[i][0] * scale32 : 0.0f;  // rows above and on the diagonal: 0
      // Apply the reflector and rotate: position j takes column c + 1 + j; v goes last.
#pragma unroll
      for (int j = 0; j + 1 < W; ++j) x[i][j] = fmaf(-tw[j + 1], v, x[i][j + 1]);
      x[i][W - 1] = v;
      const float xn = r > c + 1 ? x[i][0] : 0.0f;  // column c + 1, below its diagonal
#pragma unroll
      for (int j = 0; j < W; ++j) dot[j] = fmaf(xn, x[i][j], dot[j]);
    }
  }
  // cols < W: v_k sits at position k + W − cols; W − cols more rotations bring it to k.
#pragma unroll 1
  for (int c = a.cols; c < W; ++c) {
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
      const float first = x[i][0];
#pragma unroll
      for (int j = 0; j + 1 < W; ++j) x[i][j] = x[i][j + 1];
      x[i][W - 1] = first;
    }
  }
  // No CTA may leave while another still reads its shared memory.
  cluster_barrier(C);

  // V: v_k in column k, 1 on the diagonal, zeros above (the panel there holds R, not needed).
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int64_t r = row0 + t + int64_t(i) * kThreads;
    if (r < row_end) {
      float o[W];
#pragma unroll
      for (int k = 0; k < W; ++k) o[k] = r < k ? 0.0f : r == k ? 1.0f : x[i][k];
      if (vec_v) {
#pragma unroll
        for (int k = 0; k < W; k += 4)
          if (k < a.cols) *reinterpret_cast<float4*>(V + r * a.ldv + k) = make_float4(o[k], o[k + 1], o[k + 2], o[k + 3]);
      } else {
#pragma unroll
        for (int k = 0; k < W; ++k)
          if (k < a.cols) V[r * a.ldv + k] = o[k];
      }
    }
  }
}

int panel_width(int64_t cols) {
  int w = 1;
  while (w < cols) w <<= 1;
  return w;
}

int64_t cta_rows_max(int width) { return int64_t(kThreads) * rows_per_thread(width); }

template <int W>
const void* kernel_of() {
  return reinterpret_cast<const void*>(householder_panel_kernel<W>);
}

// The kernel instance for a panel width (a power of two <= 32): for the occupancy queries and
// the launch.
const void* kernel_for(int width) {
  switch (width) {
    case 1: return kernel_of<1>();
    case 2: return kernel_of<2>();
    case 4: return kernel_of<4>();
    case 8: return kernel_of<8>();
    case 16: return kernel_of<16>();
    default: return kernel_of<32>();
  }
}

// The largest cluster a panel may take: kMaxCluster where the device launches clusters
// (compute capability 9.0 on) and the kernel running there was compiled for them, else 1 (a
// build for an older architecture, JIT-compiled on a Hopper device, has no cluster code: its
// CTAs would each sum only their own rows); 0 if the device cannot be queried.
// Queried once per thread and device (every launch asks).
int max_cluster() {
  static thread_local int known[64] = {};  // 0: not asked yet, else the answer + 1
  int device = 0, clusters = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // not sticky: leave no error for the next call to find
    return 0;
  }
  if (device < 64 && known[device] > 0) return known[device] - 1;
  cudaFuncAttributes attr{};
  if (cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attr, householder_panel_kernel<32>) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const int n = clusters && attr.ptxVersion >= 90 && attr.binaryVersion >= 90 ? kMaxCluster : 1;
  if (device < 64) known[device] = n + 1;
  return n;
}

// CTAs per panel: the fewest whose registers hold `rows` rows of `width`; 0 if more than `limit`.
int ctas_for(int64_t rows, int width, int limit) {
  const int64_t per = cta_rows_max(width), n = (rows + per - 1) / per;
  return n >= 1 && n <= limit ? static_cast<int>(n) : 0;
}

cudaLaunchConfig_t launch_config(cudaLaunchAttribute* attr, int64_t batch, int ctas, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(batch * ctas));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(ctas);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ctas > 1 ? 1 : 0;
  return cfg;
}

// The T factor of a panel's reflectors from their Gram matrix G = VᵀV: T = U⁻¹ with U = the
// strict upper triangle of G and G's diagonal halved (‖v‖²/2 = 1/τ >= 1/2: v has a unit
// diagonal). One warp per matrix; lane i computes row i of T (rows are independent: T·U = I
// row by row), in fp64 registers, right-looking: once T_ik is final, column k's contribution
// leaves every later column (acc_j −= T_ik·U_kj). Straight-line code over 32 columns (U padded
// with the identity past n), so the 496 multiply-adds form 32 short dependent steps, not one
// long chain per entry (a column at a time, lane i summing T_ik·U_kj over k in a loop, was
// latency-bound: bench/results/2026-12-04-h200-householder-t-factor.md). Replaces a batched
// triangular solve (cuBLAS trsm, with ATen's copies around it) per panel.
constexpr int kTWarps = 4;

__global__ void __launch_bounds__(kTWarps * 32) t_factor_kernel(int64_t batch, int n, const float* G, int64_t ldg,
                                                                int64_t stride_g, float* T, int64_t ldt,
                                                                int64_t stride_t) {
  __shared__ float u[kTWarps][32][33];  // U padded with the identity; also T's rows on the way out
  __shared__ double inv_diag[kTWarps][32];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t mat = int64_t(blockIdx.x) * kTWarps + warp;
  if (mat >= batch) return;  // whole warps: no block-wide barrier below
  const float* g = G + mat * stride_g;
  for (int i = 0; i < 32; ++i) {  // row i, lanes over columns (coalesced); the upper triangle only
    float x = i == lane ? 1.0f : 0.0f;
    if (i < n && lane < n && lane >= i) x = i == lane ? 0.5f * g[int64_t(i) * ldg + lane] : g[int64_t(i) * ldg + lane];
    u[warp][i][lane] = x;
  }
  __syncwarp();
  inv_diag[warp][lane] = 1.0 / static_cast<double>(u[warp][lane][lane]);
  __syncwarp();
  double acc[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j] = j == lane ? 1.0 : 0.0;
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    acc[k] *= inv_diag[warp][k];  // T_ik, final (0 for k < i: nothing reached it)
#pragma unroll
    for (int j = k + 1; j < 32; ++j) acc[j] = fma(-acc[k], static_cast<double>(u[warp][k][j]), acc[j]);
  }
  __syncwarp();  // every lane has read U
#pragma unroll
  for (int j = 0; j < 32; ++j) u[warp][lane][j] = static_cast<float>(acc[j]);  // row i = lane
  __syncwarp();
  float* t = T + mat * stride_t;
  for (int i = 0; i < n; ++i)
    if (lane < n) t[int64_t(i) * ldt + lane] = u[warp][i][lane];
}

}  // namespace
}  // namespace orthopt_k

using namespace orthopt_k;

extern "C" int64_t orthopt_householder_panel_max_rows(int64_t cols) {
  if (cols < 1 || cols > 32) return 0;
  return cta_rows_max(panel_width(cols)) * max_cluster();
}

extern "C" int64_t orthopt_householder_panel_waves(int64_t batch, int64_t rows, int64_t cols) {
  if (batch < 1 || cols < 1 || cols > 32 || rows < cols) return 0;
  const int width = panel_width(cols), ctas = ctas_for(rows, width, max_cluster());
  if (ctas == 0) return 0;
  // Clusters (or CTAs) resident at once, per device, width and cluster size: queried once.
  static std::mutex mutex;
  static int cache[64][6][kMaxCluster + 1] = {};
  int device = 0, lw = 0;
  while ((1 << lw) < width) ++lw;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (device >= 64) return 0;
  std::lock_guard<std::mutex> lock(mutex);
  int& resident = cache[device][lw][ctas];
  if (resident == 0) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = launch_config(&attr, 1, ctas, nullptr);
    int n = 0;
    bool ok = true;
    if (ctas > 1) {
      ok = cudaOccupancyMaxActiveClusters(&n, kernel_for(width), &cfg) == cudaSuccess;
    } else {
      int sms = 0, per_sm = 0;
      ok = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
           cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_for(width), kThreads, 0) == cudaSuccess;
      n = sms * per_sm;
    }
    if (!ok) cudaGetLastError();  // not sticky: leave no error for the next call to find
    if (!ok || n < 1) return 0;
    resident = n;
  }
  return (batch + resident - 1) / resident;
}

extern "C" orthopt_status orthopt_householder_panel(int64_t batch, int64_t rows, int64_t cols, const float* A,
                                                    int64_t ld, int64_t stride_a, float* V, int64_t ldv,
                                                    int64_t stride_v, cudaStream_t stream) {
  const char* fn = "orthopt_householder_panel";
  if (batch < 0 || rows < 0 || cols < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'batch', 'rows' and 'cols' must be >= 0, got %lld, %lld, %lld", fn,
                (long long)batch, (long long)rows, (long long)cols);
  if (batch == 0 || cols == 0) return ORTHOPT_OK;
  if (cols > 32) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' = %lld exceeds 32", fn, (long long)cols);
  if (rows < cols)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'rows' = %lld is less than 'cols' = %lld", fn, (long long)rows,
                (long long)cols);
  const int width = panel_width(cols), limit = max_cluster();
  if (limit == 0)
    return fail(ORTHOPT_ERR_CUDA, "%s: the current device cannot be queried, or this build has no code for it", fn);
  const int ctas = ctas_for(rows, width, limit);
  if (ctas == 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: a panel of %lld rows and %lld columns exceeds the registers of %d CTAs (max %lld rows)",
                fn, (long long)rows, (long long)cols, limit, (long long)(cta_rows_max(width) * limit));
  if (ld < cols) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'ld' = %lld is less than 'cols'", fn, (long long)ld);
  if (ldv < cols) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'ldv' = %lld is less than 'cols'", fn, (long long)ldv);
  if (batch * ctas > int64_t(INT32_MAX))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' = %lld exceeds one launch", fn, (long long)batch);
  if (A == nullptr || V == nullptr) return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'A' and 'V' must not be NULL", fn);
  // Rows split evenly over the cluster; every CTA but the last then holds >= kThreads rows (the
  // kernel finds row c < 32 in CTA 0).
  const int64_t cta_rows = (rows + ctas - 1) / ctas;
  const PanelArgs args{rows, ld, stride_a, ldv, stride_v, static_cast<int>(cols), ctas, static_cast<int>(cta_rows), A, V};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = launch_config(&attr, batch, ctas, stream);
  // cudaLaunchKernelEx's C form on kernel_for()'s pointer (what the typed template does inside).
  PanelArgs launch_args = args;
  void* params[] = {&launch_args};
  ORTHOPT_CUDA_TRY(cudaLaunchKernelExC(&cfg, kernel_for(width), params));
  return ORTHOPT_OK;
}

extern "C" orthopt_status orthopt_householder_t_factor(int64_t batch, int64_t n, const float* G, int64_t ldg,
                                                       int64_t stride_g, float* T, int64_t ldt, int64_t stride_t,
                                                       cudaStream_t stream) {
  const char* fn = "orthopt_householder_t_factor";
  if (batch < 0 || n < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'batch' and 'n' must be >= 0, got %lld, %lld", fn,
                (long long)batch, (long long)n);
  if (batch == 0 || n == 0) return ORTHOPT_OK;
  if (n > 32) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'n' = %lld exceeds 32", fn, (long long)n);
  if (ldg < n || ldt < n)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'ldg' = %lld and 'ldt' = %lld must be >= n = %lld", fn,
                (long long)ldg, (long long)ldt, (long long)n);
  if (G == nullptr || T == nullptr) return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'G' and 'T' must not be NULL", fn);
  const int64_t blocks = (batch + kTWarps - 1) / kTWarps;
  if (blocks > int64_t(INT32_MAX))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' = %lld exceeds one launch", fn, (long long)batch);
  t_factor_kernel<<<static_cast<unsigned>(blocks), kTWarps * 32, 0, stream>>>(batch, static_cast<int>(n), G, ldg,
                                                                              stride_g, T, ldt, stride_t);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

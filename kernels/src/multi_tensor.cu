// Multi-tensor elementwise kernels of the optimizer step (orthopt_multi_*): Muon momentum, the
// decoupled update, AdamW and Lion over lists of tensors. The GPU step was launch-bound with a
// handful of ATen ops per tensor (docs/gpu.md); here a list costs one launch per table.
//
// Layout: a Table (device pointers per role, sizes, per-tensor factors and the first block of
// each tensor) is a kernel argument passed by value, so no host-to-device copy happens and the
// launches can be captured in a CUDA graph. Block b finds its tensor by scanning the cumulative
// block counts and processes one chunk of kChunk elements of it. A list longer than a table's
// capacity is launched in several tables, in order.
//
// Numerics: every fp32 operation is one IEEE operation in the order of the ATen reference
// (src/optim/update_math.cpp). The __f*_rn / __d*_rn intrinsics keep nvcc from contracting
// a·b + c into a fused multiply-add (which rounds once instead of twice and would make the two
// paths differ); hyperparameters are rounded to fp32 once, as ATen does with a Scalar; products
// with lr are fp64, like the reference's 0-d fp64 lr tensor.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "internal.h"

namespace orthopt_k {
namespace {

constexpr int kThreads = 256;
constexpr int kIlp = 4;  // loads per thread and role issued before any is stored (memory parallelism)
// The flat kernels (momentum, update, AdamW, Lion) move kVec consecutive elements per load and
// store: one 16-byte (fp32) or 8-byte (bf16/fp16) access where the tensor's pointers allow
// (vec_aligned), element by element otherwise (scalar 4-byte loads held the update and AdamW
// below the memory bandwidth); the arithmetic per element is unchanged.
constexpr int kVec = 4;
constexpr int64_t kChunk = int64_t(kThreads) * kIlp * kVec * 4;  // elements per block
constexpr int64_t kMaxBlocks = int64_t(1) << 30;             // per launch (grid.x < 2^31)
constexpr int64_t kMaxNumel = kMaxBlocks * kChunk;           // one tensor fits one launch
// A table plus the per-kernel scalars stay within the classic 4 KiB kernel-argument limit.
constexpr size_t kTableBytes = 3840;

template <int R>  // R pointer roles per tensor
struct Table {
  static constexpr int kCapacity =
      static_cast<int>((kTableBytes - 16) / (R * sizeof(void*) + sizeof(int64_t) + sizeof(double) + sizeof(int)));
  void* ptr[R][kCapacity];
  int64_t numel[kCapacity];
  double factor[kCapacity];
  int block_start[kCapacity + 1];  // first block of tensor i; block_start[count] = blocks in all
  int count;
};

__device__ __forceinline__ float load(const void* p, int64_t i, orthopt_dtype dt) {
  switch (dt) {
    case ORTHOPT_FP32: return static_cast<const float*>(p)[i];
    case ORTHOPT_BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return __half2float(static_cast<const __half*>(p)[i]);
  }
}

// Round to nearest even, like ATen's casts.
__device__ __forceinline__ void store(void* p, int64_t i, orthopt_dtype dt, float v) {
  switch (dt) {
    case ORTHOPT_FP32: static_cast<float*>(p)[i] = v; break;
    case ORTHOPT_BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
  }
}

// v as stored in dtype dt, read back.
__device__ __forceinline__ float rounded(float v, orthopt_dtype dt) {
  switch (dt) {
    case ORTHOPT_FP32: return v;
    case ORTHOPT_BF16: return __bfloat162float(__float2bfloat16_rn(v));
    default: return __half2float(__float2half_rn(v));
  }
}

__device__ __forceinline__ bool skipped(const uint8_t* keep) { return keep != nullptr && *keep == 0; }

// Sum over the warp's 32 lanes by a butterfly in a fixed order (deterministic); every lane gets
// the total.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// ---- packs: kVec consecutive elements e .. e + kVec − 1 of a tensor, as fp32.

using Pack = float[kVec];

// Whether p (NULL: an absent role) allows vector access to packs. A block's chunk starts at a
// multiple of kChunk elements, so every pack of it is then aligned too.
__device__ __forceinline__ bool vec_aligned(const void* p, orthopt_dtype dt) {
  const uintptr_t bytes = static_cast<uintptr_t>(kVec) * (dt == ORTHOPT_FP32 ? 4 : 2);
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// One vector access where `vec` and the whole pack lies before end; else element by element
// (0 for elements at or past end).
__device__ __forceinline__ void load_pack(const void* p, int64_t e, int64_t end, orthopt_dtype dt, bool vec,
                                          Pack& v) {
  if (vec && e + kVec <= end) {
    if (dt == ORTHOPT_FP32) {
      const float4 x = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + e);
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + e);
      float2 lo, hi;
      if (dt == ORTHOPT_BF16) {
        lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.x));
        hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x.y));
      } else {
        lo = __half22float2(*reinterpret_cast<const __half2*>(&x.x));
        hi = __half22float2(*reinterpret_cast<const __half2*>(&x.y));
      }
      v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < kVec; ++q) v[q] = e + q < end ? load(p, e + q, dt) : 0.0f;
}

// Stores rounded to nearest even, like store(); elements at or past end are not written.
__device__ __forceinline__ void store_pack(void* p, int64_t e, int64_t end, orthopt_dtype dt, bool vec,
                                           const Pack& v) {
  if (vec && e + kVec <= end) {
    if (dt == ORTHOPT_FP32) {
      *reinterpret_cast<float4*>(static_cast<float*>(p) + e) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      uint2 x;
      if (dt == ORTHOPT_BF16) {
        *reinterpret_cast<__nv_bfloat162*>(&x.x) = __floats2bfloat162_rn(v[0], v[1]);
        *reinterpret_cast<__nv_bfloat162*>(&x.y) = __floats2bfloat162_rn(v[2], v[3]);
      } else {
        *reinterpret_cast<__half2*>(&x.x) = __floats2half2_rn(v[0], v[1]);
        *reinterpret_cast<__half2*>(&x.y) = __floats2half2_rn(v[2], v[3]);
      }
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p) + e) = x;
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < kVec; ++q)
    if (e + q < end) store(p, e + q, dt, v[q]);
}

// The flat kernels' walk over a block's chunk: thread x takes, per round, the kIlp packs
// starting at base + r·kThreads·kVec (r < kIlp), base = begin + x·kVec + round·kStride.
constexpr int64_t kStride = int64_t(kThreads) * kVec * kIlp;
__device__ __forceinline__ int64_t pack_start(int64_t base, int r) { return base + int64_t(r) * kThreads * kVec; }

// This block's tensor and its element range [begin, end).
template <int R>
__device__ __forceinline__ int block_tensor(const Table<R>& t, int64_t* begin, int64_t* end, int64_t chunk = kChunk) {
  const int b = static_cast<int>(blockIdx.x);
  int i = 0;
  while (i + 1 < t.count && b >= t.block_start[i + 1]) ++i;
  *begin = static_cast<int64_t>(b - t.block_start[i]) * chunk;
  *end = *begin + chunk < t.numel[i] ? *begin + chunk : t.numel[i];
  return i;
}

// ---- decoupled weight decay and update (update_math.cpp: decoupled_update)

struct Decay {
  const double* lr;  // device
  double weight_decay;
  int mode;  // 0: no decay (wd == 0), 1: W·(1 − lr·wd), 2: cautious
};

__device__ __forceinline__ DecayConsts decay_consts(const Decay& a, double factor) {
  return orthopt_k::decay_consts(*a.lr, a.weight_decay, factor);
}

// Reference: W·(1 − lr·wd) or, cautious, W − (W·mask)·(lr·wd) with mask = (W·D >= 0); then
// decayed − D·(lr·factor).
__device__ __forceinline__ float decoupled(float w, float d, int mode, const DecayConsts& c) {
  float decayed = w;
  if (mode == 1) {
    decayed = __fmul_rn(w, c.keep);
  } else if (mode == 2) {
    const float mask = __fmul_rn(w, d) >= 0.0f ? 1.0f : 0.0f;
    decayed = __fsub_rn(w, __fmul_rn(__fmul_rn(w, mask), c.decay));
  }
  return __fsub_rn(decayed, __fmul_rn(d, c.step));
}

// ---- kernels. Each first checks the keep flag (skip: write nothing), then walks its chunk
// kIlp packs per thread at a time: all loads of a group, then the math and the stores.

struct MomentumArgs {
  float mu, grad_weight;
  int nesterov;
  orthopt_dtype momentum_dtype, grad_dtype, out_dtype;
  const uint8_t* keep;
};

// The momentum's fp32 arithmetic, shared by both momentum kernels: M_new = μ·M + w·G (w·G
// returned in *wg), and the orthogonalization input, w·G + μ·M_new (Nesterov) or M_new.
__device__ __forceinline__ float momentum_new(float m, float g, float mu, float grad_weight, float* wg) {
  *wg = __fmul_rn(g, grad_weight);
  return __fadd_rn(__fmul_rn(m, mu), *wg);
}
__device__ __forceinline__ float momentum_input(float wg, float m_new, float mu, int nesterov) {
  return nesterov ? __fadd_rn(wg, __fmul_rn(m_new, mu)) : m_new;
}

// roles: 0 momentum (read, written), 1 gradient, 2 orthogonalization input (written)
__global__ void __launch_bounds__(kThreads) momentum_kernel(const __grid_constant__ Table<3> t, const MomentumArgs a) {
  if (skipped(a.keep)) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  void* M = t.ptr[0][i];
  const void* G = t.ptr[1][i];
  void* out = t.ptr[2][i];
  const bool vec =
      vec_aligned(M, a.momentum_dtype) && vec_aligned(G, a.grad_dtype) && vec_aligned(out, a.out_dtype);
  for (int64_t base = begin + threadIdx.x * kVec; base < end; base += kStride) {
    Pack m[kIlp], g[kIlp];
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      load_pack(M, pack_start(base, r), end, a.momentum_dtype, vec, m[r]);
      load_pack(G, pack_start(base, r), end, a.grad_dtype, vec, g[r]);
    }
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e = pack_start(base, r);
      if (e >= end) continue;
      Pack o;
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        float wg;
        const float m_new = momentum_new(m[r][q], g[r][q], a.mu, a.grad_weight, &wg);
        o[q] = momentum_input(wg, m_new, a.mu, a.nesterov);
        m[r][q] = m_new;
      }
      store_pack(M, e, end, a.momentum_dtype, vec, m[r]);
      if (out) store_pack(out, e, end, a.out_dtype, vec, o);
    }
  }
}

// ---- momentum over whole rows with a statistic per row (orthopt_multi_momentum_rows): one
// warp per row, so the statistic is summed in a fixed order (lanes in column order, then a
// fixed butterfly) and the kernel is deterministic; the momentum arithmetic is momentum_kernel's
// (momentum_new, momentum_input).

constexpr int kRowsPerBlock = kThreads / 32;

struct MomentumRowsArgs {
  MomentumArgs momentum;  // as for momentum_kernel
  int64_t cols;
  orthopt_row_stat stat;
};

// One warp's pass over one row of cols elements starting at element row_start: M ← μ·M + w·G
// (M stored unless the step is skipped), and each element's NS input o (M_new, or Nesterov's
// w·G + μ·M_new), rounded to o_dtype, handed to emit(c, o). Returns the lane's part of the row
// statistic: the sum of o² or, with l1, of |M_new| as stored (|M| when skipped). Lane l takes
// columns l, l + 32, ... in order, kLoads of them per role in flight. Skipped: emit_skipped(c)
// for each column instead. Both row kernels use it, so both sum in the same order.
template <int kLoads, class Emit, class EmitSkipped>
__device__ __forceinline__ float momentum_row(void* M, const void* G, int64_t row_start, int64_t cols, int lane,
                                              const MomentumArgs& p, bool skip, bool l1, orthopt_dtype o_dtype,
                                              Emit emit, EmitSkipped emit_skipped) {
  float sum = 0.0f;
  for (int64_t c0 = lane; c0 < cols; c0 += 32 * kLoads) {
    float m[kLoads], g[kLoads];
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      const int64_t c = c0 + r * 32;
      m[r] = c < cols && (!skip || l1) ? load(M, row_start + c, p.momentum_dtype) : 0.0f;
      g[r] = c < cols && !skip ? load(G, row_start + c, p.grad_dtype) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      const int64_t c = c0 + r * 32;
      if (c >= cols) continue;
      if (skip) {
        if (l1) sum = __fadd_rn(sum, fabsf(m[r]));
        emit_skipped(c);
        continue;
      }
      float wg;
      const float m_new = momentum_new(m[r], g[r], p.mu, p.grad_weight, &wg);
      store(M, row_start + c, p.momentum_dtype, m_new);
      if (l1) {
        sum = __fadd_rn(sum, fabsf(rounded(m_new, p.momentum_dtype)));  // the stored value
      } else {
        const float o = rounded(momentum_input(wg, m_new, p.mu, p.nesterov), o_dtype);
        emit(c, o);
        sum = __fadd_rn(sum, __fmul_rn(o, o));
      }
    }
  }
  return sum;
}

// roles: 0 momentum (read, written), 1 gradient, 2 output (written; NULL: none), 3 statistics
// (fp32, one per row, written). Skipped step: M is not written; the statistics are the L1 norms
// of the unchanged M, or 0 for the output's sum of squares, and the output is zeros, so that
// the NS input is finite and a product that folds the update in (orthopt_gemm_update, α = 0,
// β = 1 on a skipped step) leaves the weights as they were, as the one-pass kernel's zeros do.
__global__ void __launch_bounds__(kThreads) momentum_rows_kernel(const __grid_constant__ Table<4> t,
                                                                 const MomentumRowsArgs a) {
  const MomentumArgs& p = a.momentum;
  const bool skip = skipped(p.keep);
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end, kRowsPerBlock * a.cols);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t row_start = begin + warp * a.cols;  // this warp's row, as an element index
  if (row_start >= end) return;
  void* M = t.ptr[0][i];
  const void* G = t.ptr[1][i];
  void* out = t.ptr[2][i];
  float* stats = static_cast<float*>(t.ptr[3][i]);
  const bool l1 = a.stat == ORTHOPT_ROW_L1_MOMENTUM;
  float sum = momentum_row<kIlp>(
      M, G, row_start, a.cols, lane, p, skip, l1, p.out_dtype,
      [&](int64_t c, float o) {
        if (out) store(out, row_start + c, p.out_dtype, o);
      },
      [&](int64_t c) {
        if (out) store(out, row_start + c, p.out_dtype, 0.0f);
      });
  sum = warp_sum(sum);
  // L1: as ATen's norm of a bf16/fp16 tensor, fp32 accumulation and the result in M's dtype.
  if (lane == 0) stats[row_start / a.cols] = l1 ? rounded(sum, p.momentum_dtype) : sum;
}

// ---- momentum and the Newton–Schulz input in one pass (orthopt_momentum_ns_input). The
// two-pass form (momentum_rows_kernel writing the fp32 input, then orthopt_scale_cast) moves the
// fp32 input through memory twice, 8 of its 22 bytes per element, because the scaling needs the
// whole matrix's norm first. Here a block keeps its rows of the fp32 input in shared memory
// until the norms of its matrices are known, so only the 16-bit input is written: one block per
// multiprocessor, launched cooperatively (all resident at once), over rounds of whole matrices
// that fit in the blocks' shared memory together. In a round, block j takes rows
// [j·R/G, (j+1)·R/G) of the round's R rows (G blocks), one warp per row, with
// momentum_rows_kernel's arithmetic and sums of squares (the same order, so the same bits); it
// then counts itself in for each matrix it touched, waits until every block with rows of that
// matrix has, takes the norm from the rows' sums (norm_from_row_sumsq, the order the two-pass
// form's norms kernel uses) and writes its rows of the input scaled and rounded, as
// orthopt_scale_cast does. A block waits only for blocks of its own round, which all run, so
// the waits end.

// 32 warps of 8 loads per lane and role in flight. A bank of 3072-wide rows gives a block only
// 12–18 rows (one warp each), yet 512 threads with 16 loads each were slower
// (bench/results/2026-12-06-h100-one-pass-ns-input.md). A row's sums do not depend on either: a
// lane's columns stay in order. The alternatives measured against this form (16-byte packs, bulk
// copies of the momentum, one fence per block, the momentum stored in the write phase):
// bench/results/2026-12-06-h100-ns-input-flat-loads.md.
constexpr int kNsThreads = 1024;
constexpr int kNsWarps = kNsThreads / 32;
constexpr int kNsIlp = 8;
constexpr int kNsMaxMats = 112;  // matrices per launch: their pointers travel in the arguments

// The Frobenius norm of one matrix from its rows' sums of squares, in a fixed order: thread t
// adds rows t, t + kNsThreads, ... in turn, then a tree over the threads. Deterministic, and
// the same in both kernels that call it (red: kNsThreads floats of shared memory). Rows written
// by other blocks are read from L2 (__ldcg), past the caller's fence.
__device__ float norm_from_row_sumsq(const float* row_sumsq, int64_t rows, float* red) {
  float s = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += kNsThreads) s = __fadd_rn(s, __ldcg(row_sumsq + r));
  red[threadIdx.x] = s;
  __syncthreads();
  for (int off = kNsThreads / 2; off > 0; off /= 2) {
    if (static_cast<int>(threadIdx.x) < off) red[threadIdx.x] = __fadd_rn(red[threadIdx.x], red[threadIdx.x + off]);
    __syncthreads();
  }
  const float total = red[0];
  __syncthreads();  // red is reused by the next call
  return __fsqrt_rn(total);
}

// One block per matrix: norms[b] from the row sums of matrix b (the two-pass form).
__global__ void __launch_bounds__(kNsThreads) norms_from_row_sumsq_kernel(const float* row_sumsq, int64_t rows,
                                                                          float* norms) {
  __shared__ float red[kNsThreads];
  const float n = norm_from_row_sumsq(row_sumsq + static_cast<int64_t>(blockIdx.x) * rows, rows, red);
  if (threadIdx.x == 0) norms[blockIdx.x] = n;
}

struct MomentumNsArgs {
  MomentumArgs momentum;  // out_dtype: the input's, bf16 or fp16
  int64_t rows, cols;
  int batch, mats_per_round;
  float safety, eps;
  float* row_sumsq;         // [batch·rows], written
  unsigned int* arrived;    // [batch], zero on entry
  void* out;                // [batch, rows, cols]
  void* momentum_ptr[kNsMaxMats];
  const void* grad_ptr[kNsMaxMats];
};

// ceil(a / b) for a >= 0, b > 0.
__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__global__ void __launch_bounds__(kNsThreads, 1) momentum_ns_input_kernel(const __grid_constant__ MomentumNsArgs a) {
  extern __shared__ float4 smem_input[];  // this block's rows of the fp32 input, [rows here, cols]
  float* const u = reinterpret_cast<float*>(smem_input);
  __shared__ float red[kNsThreads];
  const MomentumArgs& p = a.momentum;
  const bool skip = skipped(p.keep);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t rows = a.rows, cols = a.cols, blocks = gridDim.x;
  for (int first = 0; first < a.batch; first += a.mats_per_round) {
    const int count = min(a.mats_per_round, a.batch - first);
    const int64_t round_rows = static_cast<int64_t>(count) * rows;  // >= blocks (the host's grid)
    const int64_t r0 = blockIdx.x * round_rows / blocks, r1 = (blockIdx.x + 1) * round_rows / blocks;
    // Momentum, the fp32 input into shared memory, each row's sum of squares (skipped step: no
    // momentum written, the input and its sums 0).
    for (int64_t lr = warp; lr < r1 - r0; lr += kNsWarps) {
      const int64_t gr = r0 + lr;  // row in the round
      const int mat = first + static_cast<int>(gr / rows);
      const int64_t row_start = (gr % rows) * cols;
      void* M = a.momentum_ptr[mat];
      const void* G = a.grad_ptr[mat];
      float* const urow = u + lr * cols;
      // The two-pass form's fp32 input (o_dtype fp32: not rounded), kept in shared memory;
      // skipped: 0.
      float sum = momentum_row<kNsIlp>(
          M, G, row_start, cols, lane, p, skip, /*l1=*/false, ORTHOPT_FP32, [&](int64_t c, float o) { urow[c] = o; },
          [&](int64_t c) { urow[c] = 0.0f; });
      sum = warp_sum(sum);
      if (lane == 0) a.row_sumsq[static_cast<int64_t>(first) * rows + gr] = sum;
    }
    __threadfence();  // the row sums, device-wide, before this block counts itself in
    __syncthreads();
    const int mat_lo = first + static_cast<int>(r0 / rows), mat_hi = first + static_cast<int>((r1 - 1) / rows);
    if (threadIdx.x == 0) {
      for (int q = mat_lo; q <= mat_hi; ++q) atomicAdd(a.arrived + q, 1u);
    }
    for (int q = mat_lo; q <= mat_hi; ++q) {
      const int64_t qs = static_cast<int64_t>(q - first) * rows, qe = qs + rows;  // its rows in the round
      if (threadIdx.x == 0) {
        // Blocks with rows of matrix q: j from ceil((qs+1)·G/R) − 1 to ceil(qe·G/R) − 1 (every
        // block has at least one row, as R >= G).
        const unsigned want =
            static_cast<unsigned>(ceil_div(qe * blocks, round_rows) - ceil_div((qs + 1) * blocks, round_rows) + 1);
        while (atomicAdd(a.arrived + q, 0u) < want) __nanosleep(64);
        __threadfence();
      }
      __syncthreads();
      const float d = ns_input_divisor(norm_from_row_sumsq(a.row_sumsq + static_cast<int64_t>(q) * rows, rows, red),
                                       a.safety, a.eps);
      const int64_t lo = max(r0, qs), hi = min(r1, qe);
      const float* src = u + (lo - r0) * cols;
      const int64_t n = (hi - lo) * cols;  // a multiple of 4 (cols is)
      const int64_t dst = (static_cast<int64_t>(q) * rows + (lo - qs)) * cols;
      for (int64_t i = static_cast<int64_t>(threadIdx.x) * 4; i < n; i += kNsThreads * 4) {
        const float4 x = *reinterpret_cast<const float4*>(src + i);
        const Pack v = {__fdiv_rn(x.x, d), __fdiv_rn(x.y, d), __fdiv_rn(x.z, d), __fdiv_rn(x.w, d)};
        store_pack(a.out, dst + i, dst + n, p.out_dtype, true, v);
      }
    }
    __syncthreads();  // shared memory is refilled by the next round
  }
}

struct UpdateArgs {
  Decay decay;
  orthopt_dtype weight_dtype, direction_dtype, param_dtype;
  int64_t cols;  // row length of the row scales (with row scales only)
  const uint8_t* keep;
};

// The row of element e: 32-bit division where the tensor allows (the kernel is memory-bound
// and a 64-bit division per element costs more than the load).
__device__ __forceinline__ int64_t row_of(int64_t e, int64_t cols, bool narrow) {
  return narrow ? static_cast<int64_t>(static_cast<uint32_t>(e) / static_cast<uint32_t>(cols)) : e / cols;
}

// D ← D · scale[row] for the pack of elements e0 .. e0 + kVec − 1 (rows of cols elements), one
// fp32 product each as ATen's U · factor (NorMuon's Û, update_math.cpp: normuon_normalize); one
// division for the pack's first row, the row advanced where the pack crosses into the next.
__device__ __forceinline__ void scale_rows(Pack& d, int64_t e0, int64_t end, const float* scale, int64_t cols,
                                           bool narrow) {
  if (e0 >= end) return;
  int64_t row = row_of(e0, cols, narrow), col = e0 - row * cols;
#pragma unroll
  for (int q = 0; q < kVec; ++q) {
    if (e0 + q >= end) break;  // past the end: not stored
    d[q] = __fmul_rn(d[q], scale[row]);
    if (++col == cols) {
      col = 0;
      ++row;
    }
  }
}

// The store half of both update kernels: W (and its parameter copy) ← decoupled(w, d) for the
// kIlp packs of this round.
__device__ __forceinline__ void store_updated(void* W, void* P, Pack (&w)[kIlp], const Pack (&d)[kIlp], int64_t base,
                                              int64_t end, bool vec, int mode, const DecayConsts& c,
                                              orthopt_dtype weight_dtype, orthopt_dtype param_dtype) {
#pragma unroll
  for (int r = 0; r < kIlp; ++r) {
    const int64_t e = pack_start(base, r);
    if (e >= end) continue;
#pragma unroll
    for (int q = 0; q < kVec; ++q) w[r][q] = decoupled(w[r][q], d[r][q], mode, c);
    store_pack(W, e, end, weight_dtype, vec, w[r]);
    if (P) store_pack(P, e, end, param_dtype, vec, w[r]);
  }
}

// roles: 0 W (read, written), 1 direction D, 2 parameter copy (written; NULL: none), and with
// kRowScaled 3 row scales (fp32, one per row of a.cols elements). Two instantiations, so that the
// plain update keeps its registers: with the row scales ptxas gives it 76 instead of 57 per
// thread (3 instead of 4 blocks per multiprocessor).
template <bool kRowScaled>
__global__ void __launch_bounds__(kThreads)
    update_kernel(const __grid_constant__ Table<kRowScaled ? 4 : 3> t, const UpdateArgs a) {
  if (skipped(a.keep)) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  const DecayConsts c = decay_consts(a.decay, t.factor[i]);
  void* W = t.ptr[0][i];
  const void* D = t.ptr[1][i];
  void* P = t.ptr[2][i];
  const bool vec =
      vec_aligned(W, a.weight_dtype) && vec_aligned(D, a.direction_dtype) && vec_aligned(P, a.param_dtype);
  const float* scale = kRowScaled ? static_cast<const float*>(t.ptr[kRowScaled ? 3 : 0][i]) : nullptr;
  const bool narrow = t.numel[i] <= int64_t(UINT32_MAX) && a.cols <= int64_t(UINT32_MAX);
  // Packs start at multiples of kVec in the tensor (block chunks are), so with whole packs per
  // row a pack lies in one row: one division and one factor load per pack, issued with the
  // pack's loads rather than after them (NorMuon's rows: 768 to 8192 columns).
  const bool pack_in_row = a.cols % kVec == 0;
  for (int64_t base = begin + threadIdx.x * kVec; base < end; base += kStride) {
    Pack w[kIlp], d[kIlp];
    float row_scale[kIlp];
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e0 = pack_start(base, r);
      load_pack(W, e0, end, a.weight_dtype, vec, w[r]);
      load_pack(D, e0, end, a.direction_dtype, vec, d[r]);
      if (kRowScaled && pack_in_row) row_scale[r] = e0 < end ? scale[row_of(e0, a.cols, narrow)] : 0.0f;
    }
    if constexpr (kRowScaled) {
#pragma unroll
      for (int r = 0; r < kIlp; ++r) {
        if (pack_in_row) {
#pragma unroll
          for (int q = 0; q < kVec; ++q) d[r][q] = __fmul_rn(d[r][q], row_scale[r]);
        } else {
          scale_rows(d[r], pack_start(base, r), end, scale, a.cols, narrow);
        }
      }
    }
    store_updated(W, P, w, d, base, end, vec, a.decay.mode, c, a.weight_dtype, a.param_dtype);
  }
}

struct UpdateSelectedArgs {
  Decay decay;
  orthopt_dtype weight_dtype, direction_dtype, param_dtype;
  int64_t cols;
  const uint8_t* keep;
};

// The update with a row-selected direction (orthopt_multi_update_selected).
// roles: 0 W (read, written), 1 compact direction rows, 2 parameter copy (written; NULL: none),
// 3 row map (int32 per row of W: direction row or -1)
__global__ void __launch_bounds__(kThreads) update_selected_kernel(const __grid_constant__ Table<4> t,
                                                                   const UpdateSelectedArgs a) {
  if (skipped(a.keep)) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  const DecayConsts c = decay_consts(a.decay, t.factor[i]);
  void* W = t.ptr[0][i];
  const void* D = t.ptr[1][i];
  void* P = t.ptr[2][i];
  const int32_t* map = static_cast<const int32_t*>(t.ptr[3][i]);
  const bool narrow = t.numel[i] <= int64_t(UINT32_MAX) && a.cols <= int64_t(UINT32_MAX);
  const bool vec = vec_aligned(W, a.weight_dtype) && vec_aligned(P, a.param_dtype);  // D: per element
  for (int64_t base = begin + threadIdx.x * kVec; base < end; base += kStride) {
    Pack w[kIlp], d[kIlp];
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e0 = pack_start(base, r);
      load_pack(W, e0, end, a.weight_dtype, vec, w[r]);
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        const int64_t e = e0 + q;
        d[r][q] = 0.0f;
        if (e >= end) continue;
        const int64_t row = row_of(e, a.cols, narrow);
        const int32_t s = map[row];
        if (s >= 0) d[r][q] = load(D, static_cast<int64_t>(s) * a.cols + (e - row * a.cols), a.direction_dtype);
      }
    }
    store_updated(W, P, w, d, base, end, vec, a.decay.mode, c, a.weight_dtype, a.param_dtype);
  }
}

struct AdamWArgs {
  Decay decay;
  double beta1, beta2;  // fp64 for the bias corrections
  float b1, one_minus_b1, b2, one_minus_b2, eps;
  orthopt_dtype grad_dtype, state_dtype, weight_dtype, param_dtype;
  const uint8_t* keep;
};

// roles: 0 gradient, 1 exp_avg, 2 exp_avg_sq, 3 step (fp32, only read here), 4 W, 5 parameter copy
__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ Table<6> t, const AdamWArgs a) {
  if (skipped(a.keep)) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  const DecayConsts c = decay_consts(a.decay, 1.0);
  // Bias corrections from the step count after this step (update_math.cpp: adamw_direction).
  const float step_new = __fadd_rn(*static_cast<const float*>(t.ptr[3][i]), 1.0f);
  const double bc1 = __dsub_rn(1.0, pow(a.beta1, static_cast<double>(step_new)));
  const double bc2 = __dsub_rn(1.0, pow(a.beta2, static_cast<double>(step_new)));
  const float bc1_f = __double2float_rn(bc1), bc2_sqrt_f = __double2float_rn(__dsqrt_rn(bc2));
  const void* G = t.ptr[0][i];
  void* M = t.ptr[1][i];
  void* V = t.ptr[2][i];
  void* W = t.ptr[4][i];
  void* P = t.ptr[5][i];
  const bool vec = vec_aligned(G, a.grad_dtype) && vec_aligned(M, a.state_dtype) && vec_aligned(V, a.state_dtype) &&
                   vec_aligned(W, a.weight_dtype) && vec_aligned(P, a.param_dtype);
  for (int64_t base = begin + threadIdx.x * kVec; base < end; base += kStride) {
    Pack g[kIlp], m[kIlp], v[kIlp], w[kIlp];
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e = pack_start(base, r);
      load_pack(G, e, end, a.grad_dtype, vec, g[r]);
      load_pack(M, e, end, a.state_dtype, vec, m[r]);
      load_pack(V, e, end, a.state_dtype, vec, v[r]);
      load_pack(W, e, end, a.weight_dtype, vec, w[r]);
    }
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e = pack_start(base, r);
      if (e >= end) continue;
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        const float gq = g[r][q];
        const float m_new = __fadd_rn(__fmul_rn(m[r][q], a.b1), __fmul_rn(gq, a.one_minus_b1));
        const float v_new = __fadd_rn(__fmul_rn(v[r][q], a.b2), __fmul_rn(__fmul_rn(gq, gq), a.one_minus_b2));
        const float d =
            __fdiv_rn(__fdiv_rn(m_new, bc1_f), __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), bc2_sqrt_f), a.eps));
        m[r][q] = m_new;
        v[r][q] = v_new;
        w[r][q] = decoupled(w[r][q], d, a.decay.mode, c);
      }
      store_pack(M, e, end, a.state_dtype, vec, m[r]);
      store_pack(V, e, end, a.state_dtype, vec, v[r]);
      store_pack(W, e, end, a.weight_dtype, vec, w[r]);
      if (P) store_pack(P, e, end, a.param_dtype, vec, w[r]);
    }
  }
}

// step ← step + 1 for every tensor of an AdamW table; launched after adamw_kernel on the same
// table (every block of that kernel reads the old count, so it cannot write it itself).
__global__ void step_increment_kernel(const __grid_constant__ Table<6> t, const uint8_t* keep) {
  if (skipped(keep)) return;
  const int i = static_cast<int>(threadIdx.x);
  if (i >= t.count) return;
  float* s = static_cast<float*>(t.ptr[3][i]);
  *s = __fadd_rn(*s, 1.0f);
}

struct LionArgs {
  Decay decay;
  float b1, one_minus_b1, b2, one_minus_b2;
  orthopt_dtype grad_dtype, state_dtype, weight_dtype, param_dtype;
  const uint8_t* keep;
};

// roles: 0 gradient, 1 exp_avg, 2 W, 3 parameter copy
__global__ void __launch_bounds__(kThreads) lion_kernel(const __grid_constant__ Table<4> t, const LionArgs a) {
  if (skipped(a.keep)) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  const DecayConsts c = decay_consts(a.decay, 1.0);
  const void* G = t.ptr[0][i];
  void* M = t.ptr[1][i];
  void* W = t.ptr[2][i];
  void* P = t.ptr[3][i];
  const bool vec = vec_aligned(G, a.grad_dtype) && vec_aligned(M, a.state_dtype) &&
                   vec_aligned(W, a.weight_dtype) && vec_aligned(P, a.param_dtype);
  for (int64_t base = begin + threadIdx.x * kVec; base < end; base += kStride) {
    Pack g[kIlp], m[kIlp], w[kIlp];
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e = pack_start(base, r);
      load_pack(G, e, end, a.grad_dtype, vec, g[r]);
      load_pack(M, e, end, a.state_dtype, vec, m[r]);
      load_pack(W, e, end, a.weight_dtype, vec, w[r]);
    }
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e = pack_start(base, r);
      if (e >= end) continue;
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        const float mix = __fadd_rn(__fmul_rn(m[r][q], a.b1), __fmul_rn(g[r][q], a.one_minus_b1));
        const float d = static_cast<float>((0.0f < mix) - (mix < 0.0f));  // ATen's sign: NaN -> 0
        m[r][q] = __fadd_rn(__fmul_rn(m[r][q], a.b2), __fmul_rn(g[r][q], a.one_minus_b2));
        w[r][q] = decoupled(w[r][q], d, a.decay.mode, c);
      }
      store_pack(M, e, end, a.state_dtype, vec, m[r]);
      store_pack(W, e, end, a.weight_dtype, vec, w[r]);
      if (P) store_pack(P, e, end, a.param_dtype, vec, w[r]);
    }
  }
}

// ---- NorMuon's row factors of a bank (orthopt_normuon_factors), update_math.cpp:
// normuon_row_factors, in two launches: the rows' sums of squares, one warp per row (as
// momentum_rows_kernel: lanes in column order, then a fixed butterfly), written into the factor
// buffer; then one block per matrix turns them into the new variances and the factors, with
// the matrix's two sums over its rows taken in a fixed order. Deterministic.

// Row r (of n_rows rows of cols elements) of u: out[r] = Σ_c u[r, c]² in fp32.
__global__ void __launch_bounds__(kThreads) row_sumsq_kernel(const void* u, orthopt_dtype dt, int64_t n_rows,
                                                            int64_t cols, float* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= n_rows) return;
  const int64_t start = row * cols, end = start + cols;
  // Whole packs per row (cols % kVec == 0) keep every pack of every row aligned.
  const bool vec = cols % kVec == 0 && vec_aligned(u, dt);
  constexpr int64_t kWarpPacks = int64_t(32) * kVec;  // elements per pack round of the warp
  float sum = 0.0f;
  for (int64_t base = start + lane * kVec; base < end; base += kWarpPacks * kIlp) {
    Pack x[kIlp];
#pragma unroll
    for (int r = 0; r < kIlp; ++r) load_pack(u, base + r * kWarpPacks, end, dt, vec, x[r]);  // 0 past the end
#pragma unroll
    for (int r = 0; r < kIlp; ++r)
#pragma unroll
      for (int q = 0; q < kVec; ++q) sum = __fadd_rn(sum, __fmul_rn(x[r][q], x[r][q]));
  }
  sum = warp_sum(sum);
  if (lane == 0) out[row] = sum;
}

struct NorMuonArgs {
  int64_t rows;
  float beta2, grad_share, eps;  // β2, (1 − β2)/cols and eps, each rounded to fp32 once
  float* variance;
  const int64_t* variance_rows;  // NULL: row r of matrix b is variance[b·rows + r]
  float* factors;                // in: the rows' sums of squares; out: the factors
  const uint8_t* keep;
};

// Sum of v over the block (kThreads threads) in a fixed order: each warp's butterfly, then the
// warps in order; every thread gets the total. `shared`: kThreads / 32 floats.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total = __fadd_rn(total, shared[w]);
  __syncthreads();  // shared may be reused
  return total;
}

// Matrix blockIdx.x. The reference's operations, one rounding each: V·β2 + s·((1 − β2)/cols),
// 1/(√V + ε), ‖U‖ = √Σ s, ‖Û‖ = √Σ s·inv², factor = inv · (‖U‖ / max(‖Û‖, 1e-8)) (a NaN norm stays
// NaN, as clamp_min keeps it). Skipped step: the variances are not written; the factors are
// still those of the new variances, as the reference computes them before its gated write.
__global__ void __launch_bounds__(kThreads) normuon_factors_kernel(const NorMuonArgs a) {
  __shared__ float partial[kThreads / 32];
  const bool skip = skipped(a.keep);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * a.rows;
  float* f = a.factors + first;
  float sum_sq = 0.0f, sum_hat = 0.0f;
  for (int64_t r = threadIdx.x; r < a.rows; r += kThreads) {
    const int64_t vi = a.variance_rows ? a.variance_rows[first + r] : first + r;
    const float s = f[r];
    const float v = __fadd_rn(__fmul_rn(a.variance[vi], a.beta2), __fmul_rn(s, a.grad_share));
    if (!skip) a.variance[vi] = v;
    const float inv = __frcp_rn(__fadd_rn(__fsqrt_rn(v), a.eps));
    f[r] = inv;
    sum_sq = __fadd_rn(sum_sq, s);
    sum_hat = __fadd_rn(sum_hat, __fmul_rn(s, __fmul_rn(inv, inv)));
  }
  const float norm_u = __fsqrt_rn(block_sum(sum_sq, partial));
  const float norm_hat = __fsqrt_rn(block_sum(sum_hat, partial));
  const float ratio = __fdiv_rn(norm_u, norm_hat < 1e-8f ? 1e-8f : norm_hat);
  for (int64_t r = threadIdx.x; r < a.rows; r += kThreads) f[r] = __fmul_rn(f[r], ratio);
}

// ---- Dion3's selection (orthopt_dion3_take_rows): one warp per selected row copies it out of
// the momentum, scales it there by μ (error feedback) and records where it went.

struct Dion3TakeArgs {
  int64_t rows, cols, k, n_sel;  // n_sel = batch·k
  void* momentum;
  orthopt_dtype dtype;  // of the momentum and the selection
  const int64_t* rows_idx;
  float mu;
  void* selected;
  int64_t* flat;
  int32_t* row_map;  // NULL: none
  const uint8_t* keep;
};

__global__ void __launch_bounds__(kThreads) dion3_take_rows_kernel(const Dion3TakeArgs a) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;  // selected row
  if (i >= a.n_sel) return;
  const bool skip = skipped(a.keep);
  const int64_t src = (i / a.k) * a.rows + a.rows_idx[i];  // its row in [batch·rows]
  if (lane == 0) {
    a.flat[i] = src;
    if (a.row_map) a.row_map[src] = static_cast<int32_t>(i);
  }
  const int64_t m0 = src * a.cols, m_end = m0 + a.cols, s0 = i * a.cols;
  const bool vec = a.cols % kVec == 0 && vec_aligned(a.momentum, a.dtype) && vec_aligned(a.selected, a.dtype);
  constexpr int64_t kWarpPacks = int64_t(32) * kVec;
  for (int64_t c = lane * kVec; c < a.cols; c += kWarpPacks) {
    Pack x;
    load_pack(a.momentum, m0 + c, m_end, a.dtype, vec, x);
    store_pack(a.selected, s0 + c, s0 + a.cols, a.dtype, vec, x);  // the stored values: exact
    if (skip) continue;
#pragma unroll
    for (int q = 0; q < kVec; ++q) x[q] = __fmul_rn(x[q], a.mu);
    store_pack(a.momentum, m0 + c, m_end, a.dtype, vec, x);
  }
}

static_assert(sizeof(Table<3>) <= kTableBytes && sizeof(Table<4>) <= kTableBytes && sizeof(Table<6>) <= kTableBytes,
              "tables must fit the kernel-argument budget");
static_assert(sizeof(Table<6>) + sizeof(AdamWArgs) <= 4096 && sizeof(Table<4>) + sizeof(LionArgs) <= 4096 &&
                  sizeof(Table<4>) + sizeof(UpdateArgs) <= 4096 && sizeof(Table<3>) + sizeof(MomentumArgs) <= 4096,
              "kernel arguments must stay within 4 KiB");
static_assert(Table<6>::kCapacity <= kThreads, "step_increment_kernel: one thread per tensor of a table");

// ---- host side

// Fills tables with the non-empty tensors of the lists, in order, and calls launch(table,
// blocks) for each full table and for the last one. lists[r] may be NULL (role absent).
template <int R, typename Launch>
orthopt_status for_each_table(int64_t count, const int64_t* numel, const std::array<const void* const*, R>& lists,
                              const double* factor, Launch&& launch, int64_t chunk = kChunk) {
  Table<R> t{};
  int64_t blocks = 0;
  for (int64_t j = 0; j < count; ++j) {
    if (numel[j] == 0) continue;
    const int64_t chunks = (numel[j] + chunk - 1) / chunk;
    if (t.count > 0 && (t.count == Table<R>::kCapacity || blocks + chunks > kMaxBlocks)) {
      ORTHOPT_STATUS_TRY(launch(t, blocks));
      t.count = 0;
      blocks = 0;
    }
    const int c = t.count;
    for (int r = 0; r < R; ++r) t.ptr[r][c] = lists[r] ? const_cast<void*>(lists[r][j]) : nullptr;
    t.numel[c] = numel[j];
    t.factor[c] = factor ? factor[j] : 1.0;
    t.block_start[c] = static_cast<int>(blocks);
    blocks += chunks;
    t.block_start[c + 1] = static_cast<int>(blocks);
    t.count = c + 1;
  }
  if (t.count > 0) ORTHOPT_STATUS_TRY(launch(t, blocks));
  return ORTHOPT_OK;
}

// Hyperparameters rounded to fp32 once, as ATen rounds a Scalar.
MomentumArgs momentum_args(double mu, double grad_weight, int nesterov, orthopt_dtype momentum_dtype,
                           orthopt_dtype grad_dtype, orthopt_dtype out_dtype, const uint8_t* keep) {
  return {static_cast<float>(mu), static_cast<float>(grad_weight), nesterov ? 1 : 0, momentum_dtype, grad_dtype,
          out_dtype, keep};
}

bool valid_elementwise_dtype(orthopt_dtype t) { return t == ORTHOPT_FP32 || t == ORTHOPT_BF16 || t == ORTHOPT_FP16; }

orthopt_status check_sizes(const char* fn, int64_t count, const int64_t* numel) {
  if (count < 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'count' must be >= 0, got %lld", fn, (long long)count);
  if (count > 0 && !numel) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'numel' must not be NULL", fn);
  for (int64_t i = 0; i < count; ++i)
    if (numel[i] < 0 || numel[i] > kMaxNumel)
      return fail(ORTHOPT_ERR_INVALID, "%s: argument 'numel' [%lld] = %lld is outside [0, %lld]", fn, (long long)i,
                  (long long)numel[i], (long long)kMaxNumel);
  return ORTHOPT_OK;
}

// Every tensor holds whole rows of cols (> 0) elements (the row kernels and the row scales).
orthopt_status check_whole_rows(const char* fn, int64_t count, const int64_t* numel, int64_t cols) {
  for (int64_t i = 0; i < count; ++i)
    if (numel[i] % cols != 0)
      return fail(ORTHOPT_ERR_INVALID, "%s: argument 'numel' [%lld] = %lld is not a multiple of cols = %lld", fn,
                  (long long)i, (long long)numel[i], (long long)cols);
  return ORTHOPT_OK;
}

// A list: the array must exist and hold a pointer for every non-empty tensor; its dtype valid.
orthopt_status check_list(const char* fn, const char* what, int64_t count, const int64_t* numel,
                          const void* const* list, orthopt_dtype dtype) {
  if (!list) return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s' must not be NULL", fn, what);
  for (int64_t i = 0; i < count; ++i)
    if (numel[i] > 0 && !list[i])
      return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s' has a NULL pointer at index %lld", fn, what, (long long)i);
  if (!valid_elementwise_dtype(dtype))
    return fail(ORTHOPT_ERR_INVALID, "%s: the dtype of argument '%s' must be fp32, bf16 or fp16, got %d", fn, what,
                static_cast<int>(dtype));
  return ORTHOPT_OK;
}

Decay make_decay(const double* lr, double weight_decay, int cautious) {
  return {lr, weight_decay, weight_decay == 0.0 ? 0 : (cautious ? 2 : 1)};
}

}  // namespace
}  // namespace orthopt_k

using namespace orthopt_k;

extern "C" orthopt_status orthopt_multi_momentum(int64_t count, const int64_t* numel, void* const* momentum,
                                                 orthopt_dtype momentum_dtype, const void* const* grad,
                                                 orthopt_dtype grad_dtype, void* const* out, orthopt_dtype out_dtype,
                                                 double mu, double grad_weight, int nesterov, const uint8_t* keep,
                                                 cudaStream_t stream) {
  const char* fn = "orthopt_multi_momentum";
  ORTHOPT_STATUS_TRY(check_sizes(fn, count, numel));
  if (count == 0) return ORTHOPT_OK;
  ORTHOPT_STATUS_TRY(check_list(fn, "momentum", count, numel, momentum, momentum_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", count, numel, grad, grad_dtype));
  if (out) ORTHOPT_STATUS_TRY(check_list(fn, "out", count, numel, out, out_dtype));
  else out_dtype = ORTHOPT_FP32;  // never written
  const MomentumArgs args = momentum_args(mu, grad_weight, nesterov, momentum_dtype, grad_dtype, out_dtype, keep);
  return for_each_table<3>(count, numel, {momentum, grad, out}, nullptr,
                           [&](const Table<3>& t, int64_t blocks) -> orthopt_status {
                             momentum_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, args);
                             ORTHOPT_CUDA_TRY(cudaGetLastError());
                             return ORTHOPT_OK;
                           });
}

extern "C" orthopt_status orthopt_multi_momentum_rows(int64_t count, const int64_t* numel, int64_t cols,
                                                      void* const* momentum, orthopt_dtype momentum_dtype,
                                                      const void* const* grad, orthopt_dtype grad_dtype,
                                                      void* const* out, orthopt_dtype out_dtype, double mu,
                                                      double grad_weight, int nesterov, orthopt_row_stat stat,
                                                      float* const* stats, const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_multi_momentum_rows";
  ORTHOPT_STATUS_TRY(check_sizes(fn, count, numel));
  if (count == 0) return ORTHOPT_OK;
  if (cols < 1 || cols > (int64_t(1) << 30))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be in [1, 2^30], got %lld", fn, (long long)cols);
  ORTHOPT_STATUS_TRY(check_whole_rows(fn, count, numel, cols));
  if (stat != ORTHOPT_ROW_L1_MOMENTUM && stat != ORTHOPT_ROW_SUMSQ_OUT)
    return fail(ORTHOPT_ERR_INVALID, "%s: unknown argument 'stat' %d", fn, int(stat));
  if (stat == ORTHOPT_ROW_L1_MOMENTUM && out)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'out' must be NULL with stat = ORTHOPT_ROW_L1_MOMENTUM", fn);
  ORTHOPT_STATUS_TRY(check_list(fn, "momentum", count, numel, momentum, momentum_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", count, numel, grad, grad_dtype));
  if (out) ORTHOPT_STATUS_TRY(check_list(fn, "out", count, numel, out, out_dtype));
  else out_dtype = ORTHOPT_FP32;  // the statistic of an output that is not stored: fp32 values
  ORTHOPT_STATUS_TRY(check_list(fn, "stats", count, numel, reinterpret_cast<const void* const*>(stats),
                                ORTHOPT_FP32));
  const MomentumRowsArgs args{momentum_args(mu, grad_weight, nesterov, momentum_dtype, grad_dtype, out_dtype, keep),
                              cols, stat};
  return for_each_table<4>(
      count, numel, {momentum, grad, out, reinterpret_cast<const void* const*>(stats)}, nullptr,
      [&](const Table<4>& t, int64_t blocks) -> orthopt_status {
        momentum_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, args);
        ORTHOPT_CUDA_TRY(cudaGetLastError());
        return ORTHOPT_OK;
      },
      kRowsPerBlock * cols);
}

namespace orthopt_k {
namespace {

// One block of momentum_ns_input_kernel per multiprocessor with all the shared memory a block
// may have; blocks = 0 where the device lacks cooperative launch or a query fails.
struct NsLaunch {
  int64_t blocks = 0;
  size_t smem_bytes = 0;  // dynamic, a multiple of 16
};
NsLaunch query_ns_launch() {
  int dev = 0, coop = 0, sms = 0, optin = 0, per_sm = 0;
  cudaFuncAttributes attr{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) ||
      cudaFuncGetAttributes(&attr, momentum_ns_input_kernel) || !coop || sms < 1) {
    (void)cudaGetLastError();
    return {};
  }
  const size_t smem = (static_cast<size_t>(optin) - attr.sharedSizeBytes) / 16 * 16;
  if (cudaFuncSetAttribute(momentum_ns_input_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, momentum_ns_input_kernel, kNsThreads, smem) ||
      per_sm < 1) {
    (void)cudaGetLastError();
    return {};
  }
  return {static_cast<int64_t>(sms) * per_sm, smem};
}

// query_ns_launch() of the current device, once per device (the attribute calls cost host time
// at every step otherwise).
NsLaunch ns_launch() {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static std::array<std::optional<NsLaunch>, kMaxDevices> known;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return query_ns_launch();
  }
  const std::lock_guard<std::mutex> lock(mutex);
  if (!known[dev]) known[dev] = query_ns_launch();
  return *known[dev];
}

// Matrices of one round: as many as the blocks' shared memory holds, spread evenly over the
// fewest rounds. grid <= rows, so every block has rows in every round. 0: a matrix does not fit.
int64_t ns_mats_per_round(int64_t batch, int64_t rows, int64_t cols, int64_t grid, size_t smem_bytes) {
  const int64_t rows_per_block = static_cast<int64_t>(smem_bytes / sizeof(float)) / cols;
  const int64_t most = grid * rows_per_block / rows;
  if (most < 1) return 0;
  return ceil_div(batch, ceil_div(batch, most));
}

// Whether matrices [rows, cols] fit a launch of shape l (orthopt_momentum_ns_input_fits).
bool ns_fits(const NsLaunch& l, int64_t rows, int64_t cols) {
  if (rows < 1 || cols < 4 || cols % 4 != 0 || rows > (int64_t(1) << 30) || cols > (int64_t(1) << 30)) return false;
  return l.blocks > 0 && ns_mats_per_round(1, rows, cols, std::min(l.blocks, rows), l.smem_bytes) >= 1;
}

}  // namespace
}  // namespace orthopt_k

extern "C" int orthopt_momentum_ns_input_fits(int64_t rows, int64_t cols) { return ns_fits(ns_launch(), rows, cols) ? 1 : 0; }

extern "C" orthopt_status orthopt_momentum_ns_input(int64_t batch, int64_t rows, int64_t cols, void* const* momentum,
                                                    orthopt_dtype momentum_dtype, const void* const* grad,
                                                    orthopt_dtype grad_dtype, void* out, orthopt_dtype out_dtype,
                                                    double mu, double grad_weight, int nesterov, float safety,
                                                    float eps, float* row_sumsq, unsigned int* arrived,
                                                    const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_momentum_ns_input";
  if (batch < 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' must be >= 0, got %lld", fn, (long long)batch);
  if (batch == 0) return ORTHOPT_OK;
  const NsLaunch l = ns_launch();
  if (!ns_fits(l, rows, cols))
    return fail(ORTHOPT_ERR_INVALID,
                "%s: matrices [%lld, %lld] do not fit (cols a multiple of 4, one matrix within the blocks' shared "
                "memory, cooperative launch): check orthopt_momentum_ns_input_fits first",
                fn, (long long)rows, (long long)cols);
  std::vector<int64_t> numel(static_cast<size_t>(batch), rows * cols);
  ORTHOPT_STATUS_TRY(check_list(fn, "momentum", batch, numel.data(), momentum, momentum_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", batch, numel.data(), grad, grad_dtype));
  if (out_dtype != ORTHOPT_BF16 && out_dtype != ORTHOPT_FP16)
    return fail(ORTHOPT_ERR_INVALID, "%s: the dtype of argument 'out' must be bf16 or fp16, got %d", fn,
                static_cast<int>(out_dtype));
  if (!out || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'out' must be a 16-byte aligned device pointer", fn);
  if (!row_sumsq || !arrived)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'row_sumsq' and 'arrived' must not be NULL", fn);
  const int64_t grid = std::min(l.blocks, rows);
  MomentumNsArgs args{};
  args.momentum = momentum_args(mu, grad_weight, nesterov, momentum_dtype, grad_dtype, out_dtype, keep);
  args.rows = rows;
  args.cols = cols;
  args.safety = safety;
  args.eps = eps;
  const size_t out_bytes = static_cast<size_t>(rows * cols) * 2;
  for (int64_t first = 0; first < batch; first += kNsMaxMats) {
    const int64_t n = std::min<int64_t>(kNsMaxMats, batch - first);
    args.batch = static_cast<int>(n);
    args.mats_per_round = static_cast<int>(ns_mats_per_round(n, rows, cols, grid, l.smem_bytes));
    args.row_sumsq = row_sumsq + first * rows;
    args.arrived = arrived + first;
    args.out = static_cast<char*>(out) + static_cast<size_t>(first) * out_bytes;
    for (int64_t j = 0; j < n; ++j) {
      args.momentum_ptr[j] = momentum[first + j];
      args.grad_ptr[j] = grad[first + j];
    }
    ORTHOPT_CUDA_TRY(cudaMemsetAsync(args.arrived, 0, static_cast<size_t>(n) * sizeof(unsigned int), stream));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(grid));
    cfg.blockDim = dim3(kNsThreads);
    cfg.dynamicSmemBytes = l.smem_bytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;  // all blocks resident at once: the waits end
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    ORTHOPT_CUDA_TRY(cudaLaunchKernelEx(&cfg, momentum_ns_input_kernel, args));
  }
  return ORTHOPT_OK;
}

extern "C" orthopt_status orthopt_norms_from_row_sumsq(int64_t batch, int64_t rows, const float* row_sumsq,
                                                       float* norms, cudaStream_t stream) {
  const char* fn = "orthopt_norms_from_row_sumsq";
  if (batch < 0 || rows < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'batch' and 'rows' must be >= 0, got %lld and %lld", fn,
                (long long)batch, (long long)rows);
  if (batch == 0) return ORTHOPT_OK;
  if (batch > INT32_MAX) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' must be < 2^31", fn);
  if (!norms || (rows > 0 && !row_sumsq))
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'row_sumsq' and 'norms' must not be NULL", fn);
  norms_from_row_sumsq_kernel<<<static_cast<unsigned>(batch), kNsThreads, 0, stream>>>(row_sumsq, rows, norms);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

extern "C" orthopt_status orthopt_multi_update(int64_t count, const int64_t* numel, void* const* weight,
                                               orthopt_dtype weight_dtype, const void* const* direction,
                                               orthopt_dtype direction_dtype, void* const* param_out,
                                               orthopt_dtype param_dtype, const double* factor,
                                               const float* const* row_scale, int64_t cols, const double* lr,
                                               double weight_decay, int cautious, const uint8_t* keep,
                                               cudaStream_t stream) {
  const char* fn = "orthopt_multi_update";
  ORTHOPT_STATUS_TRY(check_sizes(fn, count, numel));
  if (count == 0) return ORTHOPT_OK;
  ORTHOPT_STATUS_TRY(check_list(fn, "weight", count, numel, weight, weight_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "direction", count, numel, direction, direction_dtype));
  if (param_out) ORTHOPT_STATUS_TRY(check_list(fn, "param_out", count, numel, param_out, param_dtype));
  std::vector<const void*> scales;
  if (row_scale) {
    if (cols <= 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be > 0 with row_scale, got %lld", fn,
                               (long long)cols);
    ORTHOPT_STATUS_TRY(check_whole_rows(fn, count, numel, cols));
    scales.assign(row_scale, row_scale + count);
    ORTHOPT_STATUS_TRY(check_list(fn, "row_scale", count, numel, scales.data(), ORTHOPT_FP32));
  }
  if (!lr) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'lr' must not be NULL", fn);
  const UpdateArgs args{make_decay(lr, weight_decay, cautious), weight_dtype, direction_dtype, param_dtype,
                        row_scale ? cols : 1, keep};
  if (row_scale)
    return for_each_table<4>(count, numel, {weight, direction, param_out, scales.data()}, factor,
                             [&](const Table<4>& t, int64_t blocks) -> orthopt_status {
                               update_kernel<true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, args);
                               ORTHOPT_CUDA_TRY(cudaGetLastError());
                               return ORTHOPT_OK;
                             });
  return for_each_table<3>(count, numel, {weight, direction, param_out}, factor,
                           [&](const Table<3>& t, int64_t blocks) -> orthopt_status {
                             update_kernel<false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, args);
                             ORTHOPT_CUDA_TRY(cudaGetLastError());
                             return ORTHOPT_OK;
                           });
}

extern "C" orthopt_status orthopt_multi_update_selected(int64_t count, const int64_t* numel, void* const* weight,
                                                        orthopt_dtype weight_dtype, const void* const* direction,
                                                        orthopt_dtype direction_dtype, const int32_t* const* row_map,
                                                        int64_t cols, void* const* param_out, orthopt_dtype param_dtype,
                                                        const double* factor, const double* lr, double weight_decay,
                                                        int cautious, const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_multi_update_selected";
  ORTHOPT_STATUS_TRY(check_sizes(fn, count, numel));
  if (count == 0) return ORTHOPT_OK;
  if (cols <= 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be > 0, got %lld", fn, (long long)cols);
  ORTHOPT_STATUS_TRY(check_whole_rows(fn, count, numel, cols));
  ORTHOPT_STATUS_TRY(check_list(fn, "weight", count, numel, weight, weight_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "direction", count, numel, direction, direction_dtype));
  if (!row_map) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'row_map' must not be NULL", fn);
  const std::vector<const void*> maps(row_map, row_map + count);
  ORTHOPT_STATUS_TRY(check_list(fn, "row_map", count, numel, maps.data(), ORTHOPT_FP32));  // pointers only
  if (param_out) ORTHOPT_STATUS_TRY(check_list(fn, "param_out", count, numel, param_out, param_dtype));
  if (!lr) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'lr' must not be NULL", fn);
  const UpdateSelectedArgs args{make_decay(lr, weight_decay, cautious), weight_dtype, direction_dtype, param_dtype,
                                cols, keep};
  return for_each_table<4>(count, numel, {weight, direction, param_out, maps.data()}, factor,
                           [&](const Table<4>& t, int64_t blocks) -> orthopt_status {
                             update_selected_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, args);
                             ORTHOPT_CUDA_TRY(cudaGetLastError());
                             return ORTHOPT_OK;
                           });
}

extern "C" orthopt_status orthopt_multi_adamw(int64_t count, const int64_t* numel, const void* const* grad,
                                              orthopt_dtype grad_dtype, void* const* exp_avg,
                                              void* const* exp_avg_sq, orthopt_dtype state_dtype, float* const* step,
                                              void* const* weight, orthopt_dtype weight_dtype, void* const* param_out,
                                              orthopt_dtype param_dtype, const double* lr, double beta1, double beta2,
                                              double eps, double weight_decay, int cautious, const uint8_t* keep,
                                              cudaStream_t stream) {
  const char* fn = "orthopt_multi_adamw";
  ORTHOPT_STATUS_TRY(check_sizes(fn, count, numel));
  if (count == 0) return ORTHOPT_OK;
  if (!step) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'step' must not be NULL", fn);
  const std::vector<const void*> steps(step, step + count);  // as untyped pointers, like the other lists
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", count, numel, grad, grad_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "exp_avg", count, numel, exp_avg, state_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "exp_avg_sq", count, numel, exp_avg_sq, state_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "step", count, numel, steps.data(), ORTHOPT_FP32));
  ORTHOPT_STATUS_TRY(check_list(fn, "weight", count, numel, weight, weight_dtype));
  if (param_out) ORTHOPT_STATUS_TRY(check_list(fn, "param_out", count, numel, param_out, param_dtype));
  if (!lr) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'lr' must not be NULL", fn);
  const AdamWArgs args{make_decay(lr, weight_decay, cautious),
                       beta1,
                       beta2,
                       static_cast<float>(beta1),
                       static_cast<float>(1.0 - beta1),
                       static_cast<float>(beta2),
                       static_cast<float>(1.0 - beta2),
                       static_cast<float>(eps),
                       grad_dtype,
                       state_dtype,
                       weight_dtype,
                       param_dtype,
                       keep};
  return for_each_table<6>(count, numel,
                           {grad, exp_avg, exp_avg_sq, steps.data(), weight, param_out},
                           nullptr, [&](const Table<6>& t, int64_t blocks) -> orthopt_status {
                             adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, args);
                             ORTHOPT_CUDA_TRY(cudaGetLastError());
                             step_increment_kernel<<<1, kThreads, 0, stream>>>(t, keep);
                             ORTHOPT_CUDA_TRY(cudaGetLastError());
                             return ORTHOPT_OK;
                           });
}

extern "C" orthopt_status orthopt_multi_lion(int64_t count, const int64_t* numel, const void* const* grad,
                                             orthopt_dtype grad_dtype, void* const* exp_avg, orthopt_dtype state_dtype,
                                             void* const* weight, orthopt_dtype weight_dtype, void* const* param_out,
                                             orthopt_dtype param_dtype, const double* lr, double beta1, double beta2,
                                             double weight_decay, int cautious, const uint8_t* keep,
                                             cudaStream_t stream) {
  const char* fn = "orthopt_multi_lion";
  ORTHOPT_STATUS_TRY(check_sizes(fn, count, numel));
  if (count == 0) return ORTHOPT_OK;
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", count, numel, grad, grad_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "exp_avg", count, numel, exp_avg, state_dtype));
  ORTHOPT_STATUS_TRY(check_list(fn, "weight", count, numel, weight, weight_dtype));
  if (param_out) ORTHOPT_STATUS_TRY(check_list(fn, "param_out", count, numel, param_out, param_dtype));
  if (!lr) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'lr' must not be NULL", fn);
  const LionArgs args{make_decay(lr, weight_decay, cautious),
                      static_cast<float>(beta1),
                      static_cast<float>(1.0 - beta1),
                      static_cast<float>(beta2),
                      static_cast<float>(1.0 - beta2),
                      grad_dtype,
                      state_dtype,
                      weight_dtype,
                      param_dtype,
                      keep};
  return for_each_table<4>(count, numel, {grad, exp_avg, weight, param_out}, nullptr,
                           [&](const Table<4>& t, int64_t blocks) -> orthopt_status {
                             lion_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, args);
                             ORTHOPT_CUDA_TRY(cudaGetLastError());
                             return ORTHOPT_OK;
                           });
}

extern "C" orthopt_status orthopt_normuon_factors(int64_t batch, int64_t rows, int64_t cols, const void* u,
                                                  orthopt_dtype u_dtype, float* variance,
                                                  const int64_t* variance_rows, double beta2, double eps,
                                                  float* factors, const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_normuon_factors";
  if (batch < 0 || rows < 0 || cols < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'batch', 'rows' and 'cols' must be >= 0, got %lld, %lld, %lld",
                fn, (long long)batch, (long long)rows, (long long)cols);
  if (batch == 0 || rows == 0) return ORTHOPT_OK;
  if (cols == 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be > 0 (a row of no elements has no norm)", fn);
  if (batch > kMaxBlocks || rows > kMaxNumel / batch || cols > kMaxNumel / (batch * rows))
    return fail(ORTHOPT_ERR_INVALID, "%s: %lld x %lld x %lld elements exceed one launch", fn, (long long)batch,
                (long long)rows, (long long)cols);
  if (!u || !variance || !factors)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'u', 'variance' and 'factors' must not be NULL", fn);
  if (!valid_elementwise_dtype(u_dtype))
    return fail(ORTHOPT_ERR_INVALID, "%s: the dtype of argument 'u' must be fp32, bf16 or fp16, got %d", fn,
                static_cast<int>(u_dtype));
  const int64_t n_rows = batch * rows;
  if (n_rows > kMaxBlocks * kRowsPerBlock)
    return fail(ORTHOPT_ERR_INVALID, "%s: %lld rows exceed one launch", fn, (long long)n_rows);
  row_sumsq_kernel<<<static_cast<unsigned>((n_rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, stream>>>(
      u, u_dtype, n_rows, cols, factors);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  const NorMuonArgs args{rows,          static_cast<float>(beta2), static_cast<float>((1.0 - beta2) / cols),
                         static_cast<float>(eps), variance, variance_rows, factors, keep};
  normuon_factors_kernel<<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(args);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

extern "C" orthopt_status orthopt_dion3_take_rows(int64_t batch, int64_t rows, int64_t cols, int64_t k, void* momentum,
                                                  orthopt_dtype dtype, const int64_t* rows_idx, double mu,
                                                  void* selected, int64_t* flat, int32_t* row_map,
                                                  const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_dion3_take_rows";
  if (batch < 0 || rows < 0 || cols < 0 || k < 0)
    return fail(ORTHOPT_ERR_INVALID,
                "%s: arguments 'batch', 'rows', 'cols' and 'k' must be >= 0, got %lld, %lld, %lld, %lld", fn,
                (long long)batch, (long long)rows, (long long)cols, (long long)k);
  if (batch == 0 || k == 0) return ORTHOPT_OK;
  if (k > rows)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'k' = %lld exceeds 'rows' = %lld", fn, (long long)k,
                (long long)rows);
  if (cols == 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be > 0", fn);
  if (batch > kMaxBlocks || rows > kMaxNumel / batch || cols > kMaxNumel / (batch * rows))
    return fail(ORTHOPT_ERR_INVALID, "%s: %lld x %lld x %lld elements exceed one launch", fn, (long long)batch,
                (long long)rows, (long long)cols);
  const int64_t n_sel = batch * k;
  if (n_sel > int64_t(INT32_MAX))
    return fail(ORTHOPT_ERR_INVALID, "%s: %lld selected rows exceed the int32 row map", fn, (long long)n_sel);
  if (!momentum || !rows_idx || !selected || !flat)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'momentum', 'rows_idx', 'selected' and 'flat' must not be NULL",
                fn);
  if (!valid_elementwise_dtype(dtype))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'dtype' must be fp32, bf16 or fp16, got %d", fn,
                static_cast<int>(dtype));
  const Dion3TakeArgs args{rows,     cols,     k,    n_sel, momentum, dtype, rows_idx, static_cast<float>(mu),
                           selected, flat, row_map, keep};
  dion3_take_rows_kernel<<<static_cast<unsigned>((n_sel + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0,
                           stream>>>(args);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

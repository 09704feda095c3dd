// Multi-tensor elementwise kernels of the optimizer step (orthopt_multi_*): Muon momentum, the
// decoupled update, AdamW and Lion over lists of tensors, as functors of one launcher
// (multi_tensor_apply.cuh: tables, chunks, packs); and the kernels with a parallel structure of
// their own over rows (momentum with row statistics, the one-pass Newton–Schulz input, NorMuon's
// factors, Dion3's row selection), on the same helpers. The GPU step was launch-bound with a
// handful of ATen ops per tensor (docs/gpu.md); here a list costs one launch per table.
//
// Numerics: every fp32 operation is one IEEE operation in the order of the ATen reference
// (src/optim/update_math.cpp). The __f*_rn / __d*_rn intrinsics keep nvcc from contracting
// a·b + c into a fused multiply-add (which rounds once instead of twice and would make the two
// paths differ); hyperparameters are rounded to fp32 once, as ATen does with a Scalar; products
// with lr are fp64, like the reference's 0-d fp64 lr tensor.
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "multi_tensor_apply.cuh"

namespace orthopt_k {
namespace {

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

// The momentum's fp32 arithmetic, shared by the momentum functor and the row kernels: M_new =
// μ·M + w·G (w·G returned in *wg), and the orthogonalization input, w·G + μ·M_new (Nesterov) or
// M_new.
__device__ __forceinline__ float momentum_new(float m, float g, float mu, float grad_weight, float* wg) {
  *wg = __fmul_rn(g, grad_weight);
  return __fadd_rn(__fmul_rn(m, mu), *wg);
}
__device__ __forceinline__ float momentum_input(float wg, float m_new, float mu, int nesterov) {
  return nesterov ? __fadd_rn(wg, __fmul_rn(m_new, mu)) : m_new;
}

// ---- the functors of apply(): roles, then the math of one element

struct NoState {};

// roles: 0 momentum (read, written), 1 gradient, 2 orthogonalization input (written; NULL: none)
struct MomentumOp : FunctorBase {
  static constexpr unsigned kLoad = 0b011, kStore = 0b101, kOptional = 0b100;
  float mu, grad_weight;  // rounded to fp32 once
  int nesterov;
  __device__ __forceinline__ NoState tensor(const Table<3>&, int) const { return {}; }
  __device__ __forceinline__ void operator()(const NoState&, float (&v)[3]) const {
    float wg;
    const float m_new = momentum_new(v[0], v[1], mu, grad_weight, &wg);
    v[2] = momentum_input(wg, m_new, mu, nesterov);
    v[0] = m_new;
  }
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

struct UpdateState {
  DecayConsts c;
  bool narrow;       // 32-bit row division (row_of)
  bool pack_in_row;  // whole packs per row
};

// The decoupled update, W ← decoupled(W, D) and its parameter copy: roles 0 W (read, written),
// 1 D, 2 parameter copy (written; NULL: none); how D is loaded is the derived functor's.
struct DecoupledOp : FunctorBase {
  static constexpr unsigned kStore = 0b101, kOptional = 0b100;
  Decay decay;
  int64_t cols;  // row length of the row scales or row map
  template <int D>
  __device__ __forceinline__ UpdateState tensor(const Table<D>& t, int i) const {
    return {decay_consts(decay, t.factor[i]), t.numel[i] <= int64_t(UINT32_MAX) && cols <= int64_t(UINT32_MAX),
            cols % kVec == 0};
  }
  template <int D>
  __device__ __forceinline__ void operator()(const UpdateState& s, float (&v)[D]) const {
    v[0] = decoupled(v[0], v[1], decay.mode, s.c);
    v[2] = v[0];
  }
};

// orthopt_multi_update; with kRowScaled role 3 holds the row scales (fp32, one per row of cols
// elements). Two instantiations, so that the plain update does not carry the row scales'
// registers (nvcc 13, sm_90a: 54 per thread without, 64 with).
template <bool kRowScaled>
struct UpdateOp : DecoupledOp {
  static constexpr int kDepth = kRowScaled ? 4 : 3;
  static constexpr unsigned kLoad = 0b011;
  // Packs start at multiples of kVec in the tensor (block chunks are), so with whole packs per
  // row a pack lies in one row: one division and one factor load per pack, issued with the
  // pack's loads rather than after them (NorMuon's rows: 768 to 8192 columns); role 3 of the
  // pack holds that factor.
  __device__ __forceinline__ void load(const UpdateState& s, void* const (&p)[kDepth], int64_t e0, int64_t end,
                                       Pack (&x)[kDepth]) const {
    if constexpr (kRowScaled) {
      if (s.pack_in_row) x[3][0] = e0 < end ? static_cast<const float*>(p[3])[row_of(e0, cols, s.narrow)] : 0.0f;
    }
  }
  __device__ __forceinline__ void pack(const UpdateState& s, void* const (&p)[kDepth], int64_t e0, int64_t end,
                                       Pack (&x)[kDepth]) const {
    if constexpr (kRowScaled) {
      if (s.pack_in_row) {
#pragma unroll
        for (int q = 0; q < kVec; ++q) x[1][q] = __fmul_rn(x[1][q], x[3][0]);
      } else {
        scale_rows(x[1], e0, end, static_cast<const float*>(p[3]), cols, s.narrow);
      }
    }
  }
};

// orthopt_multi_update_selected: role 1 holds compact direction rows, role 3 the row map (int32
// per row of W: direction row or -1); D is gathered element by element (not in the packs'
// vector access).
struct UpdateSelectedOp : DecoupledOp {
  static constexpr unsigned kLoad = 0b001;
  __device__ __forceinline__ void load(const UpdateState& s, void* const (&p)[4], int64_t e0, int64_t end,
                                       Pack (&x)[4]) const {
    const int32_t* map = static_cast<const int32_t*>(p[3]);
#pragma unroll
    for (int q = 0; q < kVec; ++q) {
      const int64_t e = e0 + q;
      x[1][q] = 0.0f;
      if (e >= end) continue;
      const int64_t row = row_of(e, cols, s.narrow);
      const int32_t sel = map[row];
      if (sel >= 0)
        x[1][q] = orthopt_k::load(p[1], static_cast<int64_t>(sel) * cols + (e - row * cols), direction_dtype);
    }
  }
  orthopt_dtype direction_dtype;
};

struct AdamWState {
  DecayConsts c;
  float bc1, bc2_sqrt;  // bias corrections 1 − β1^t and √(1 − β2^t), rounded to fp32
};

// roles: 0 gradient, 1 exp_avg, 2 exp_avg_sq, 3 step (fp32; read here, incremented by
// after_table), 4 W, 5 parameter copy (NULL: none)
struct AdamWOp : FunctorBase {
  static constexpr unsigned kLoad = 0b010111, kStore = 0b110110, kOptional = 0b100000;
  static constexpr bool kAfterTable = true;
  // nvcc 13, sm_90a: 120 registers and no spill; pack by pack 128 and 16 bytes spilled.
  static constexpr bool kLoadsByRole = true;
  Decay decay;
  double beta1, beta2;  // fp64 for the bias corrections
  float b1, one_minus_b1, b2, one_minus_b2, eps;
  // Bias corrections from the step count after this step (update_math.cpp: adamw_direction).
  __device__ __forceinline__ AdamWState tensor(const Table<6>& t, int i) const {
    const float step_new = __fadd_rn(*static_cast<const float*>(t.ptr[3][i]), 1.0f);
    const double bc1 = __dsub_rn(1.0, pow(beta1, static_cast<double>(step_new)));
    const double bc2 = __dsub_rn(1.0, pow(beta2, static_cast<double>(step_new)));
    return {decay_consts(decay, 1.0), __double2float_rn(bc1), __double2float_rn(__dsqrt_rn(bc2))};
  }
  __device__ __forceinline__ void operator()(const AdamWState& s, float (&v)[6]) const {
    const float g = v[0];
    const float m_new = __fadd_rn(__fmul_rn(v[1], b1), __fmul_rn(g, one_minus_b1));
    const float v_new = __fadd_rn(__fmul_rn(v[2], b2), __fmul_rn(__fmul_rn(g, g), one_minus_b2));
    const float d = __fdiv_rn(__fdiv_rn(m_new, s.bc1), __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), s.bc2_sqrt), eps));
    v[1] = m_new;
    v[2] = v_new;
    v[4] = decoupled(v[4], d, decay.mode, s.c);
    v[5] = v[4];
  }
  // step ← step + 1, after every block of the table's launch has read the old count.
  __device__ __forceinline__ void after_table(const Table<6>& t, int i) const {
    float* s = static_cast<float*>(t.ptr[3][i]);
    *s = __fadd_rn(*s, 1.0f);
  }
};

// roles: 0 gradient, 1 exp_avg, 2 W, 3 parameter copy (NULL: none)
struct LionOp : FunctorBase {
  static constexpr unsigned kLoad = 0b0111, kStore = 0b1110, kOptional = 0b1000;
  Decay decay;
  float b1, one_minus_b1, b2, one_minus_b2;
  __device__ __forceinline__ DecayConsts tensor(const Table<4>&, int) const { return decay_consts(decay, 1.0); }
  __device__ __forceinline__ void operator()(const DecayConsts& c, float (&v)[4]) const {
    const float mix = __fadd_rn(__fmul_rn(v[1], b1), __fmul_rn(v[0], one_minus_b1));
    const float d = static_cast<float>((0.0f < mix) - (mix < 0.0f));  // ATen's sign: NaN -> 0
    v[1] = __fadd_rn(__fmul_rn(v[1], b2), __fmul_rn(v[0], one_minus_b2));
    v[2] = decoupled(v[2], d, decay.mode, c);
    v[3] = v[2];
  }
};

// ---- the row kernels' momentum arguments

struct MomentumArgs {
  float mu, grad_weight;
  int nesterov;
  orthopt_dtype momentum_dtype, grad_dtype, out_dtype;
  const uint8_t* keep;
};

// ---- momentum over whole rows with a statistic per row (orthopt_multi_momentum_rows): one
// warp per row, so the statistic is summed in a fixed order (lanes in column order, then a
// fixed butterfly) and the kernel is deterministic; the momentum arithmetic is MomentumOp's
// (momentum_new, momentum_input).

constexpr int kRowsPerBlock = kThreads / 32;

struct MomentumRowsArgs {
  MomentumArgs momentum;
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
static_assert(sizeof(Table<4>) + sizeof(MomentumRowsArgs) <= 4096, "kernel arguments must stay within 4 KiB");

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

// Σ of every thread's s in a fixed tree over the threads (red: kNsThreads floats of shared
// memory, free again on return).
__device__ float block_tree_sum(float s, float* red) {
  red[threadIdx.x] = s;
  __syncthreads();
  for (int off = kNsThreads / 2; off > 0; off /= 2) {
    if (static_cast<int>(threadIdx.x) < off) red[threadIdx.x] = __fadd_rn(red[threadIdx.x], red[threadIdx.x + off]);
    __syncthreads();
  }
  const float total = red[0];
  __syncthreads();  // red is reused by the next call
  return total;
}

// The largest of every thread's v (>= 0; NaN is dropped by fmaxf), as block_tree_sum.
__device__ float block_max(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int off = kNsThreads / 2; off > 0; off /= 2) {
    if (static_cast<int>(threadIdx.x) < off) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + off]);
    __syncthreads();
  }
  const float m = red[0];
  __syncthreads();
  return m;
}

// The Frobenius norm of one matrix from its rows' sums of squares, in a fixed order: thread t
// adds rows t, t + kNsThreads, ... in turn, then a tree over the threads. Deterministic, and
// the same in both kernels that call it (red: kNsThreads floats of shared memory). Rows written
// by other blocks are read from L2 (__ldcg), past the caller's fence.
__device__ float norm_from_row_sumsq(const float* row_sumsq, int64_t rows, float* red) {
  float s = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += kNsThreads) s = __fadd_rn(s, __ldcg(row_sumsq + r));
  return __fsqrt_rn(block_tree_sum(s, red));
}

// ---- norms whose fp32 sum of squares overflowed. Finite entries beyond |x| ≈ 1.8e19 (or many
// somewhat smaller ones) make Σx² +Inf in fp32, so the divisor is Inf and the NS input all
// zeros. The reference (src/ortho/orthogonalize.cpp: normalized_input, pow2_scale) divides by a
// power of two p first: X/(‖X‖·s + eps) = (X/p)/(‖X/p‖·s + eps/p) with max|X/p| in [1, 2), whose
// sum cannot overflow. The kernels take that detour only where the plain sum is +Inf, so every
// other result keeps its bits. A NaN entry makes the sum NaN and an Inf entry gives p = 1: both
// keep the plain path's result.

// pow2_scale's p for a matrix whose largest magnitude is amax (>= 0): amax's exponent bits, the
// power of two that brings amax into [1, 2); 2^-126 for zero or subnormal, 1 for Inf or NaN.
__device__ __forceinline__ float pow2_of(float amax) {
  uint32_t e = __float_as_uint(amax) & 0x7f800000u;
  if (e == 0u) e = 0x00800000u;
  if (e == 0x7f800000u) e = 0x3f800000u;
  return __uint_as_float(e);
}

// The norm of matrix x [rows, cols] (dtype dt, contiguous) whose sum of squares overflowed:
// p·√Σ(x/p)², p = pow2_of(max|x|). The rows' sums of (x/p)² are those of momentum_row (one warp
// per row, lane l adding columns l, l + 32, ... in turn, then warp_sum), and they are added in
// norm_from_row_sumsq's order, so that for the two-pass form's fp32 stack the sum is the
// one-pass kernel's (momentum_ns_input_kernel) bit for bit. p·√Σ then equals the reference's
// scaled divisor's terms exactly (scaling by a power of two commutes with rounding: x/(p·n·s +
// eps) is (x/p)/(n·s + eps/p)), unless eps/p underflows, where eps is negligible beside n·s
// anyway. Where p·√Σ itself exceeds the fp32 range (entries ≳ 3.4e38/√(rows·cols)) the result
// is +Inf still: a caller that divides by this norm gets zeros there. red: kNsThreads floats of
// shared memory; every thread returns the norm.
__device__ float rescaled_norm(const void* x, orthopt_dtype dt, int64_t rows, int64_t cols, float* red) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  float m = 0.0f;
  for (int64_t e = threadIdx.x; e < rows * cols; e += kNsThreads) m = fmaxf(m, fabsf(load(x, e, dt)));
  const float p = pow2_of(block_max(m, red));
  float s = 0.0f;  // thread t: rows t, t + kNsThreads, ...
  for (int64_t r0 = 0; r0 < rows; r0 += kNsThreads) {
    for (int64_t lr = warp; lr < kNsThreads && r0 + lr < rows; lr += kNsWarps) {
      const int64_t start = (r0 + lr) * cols;
      float q = 0.0f;
      for (int64_t c = lane; c < cols; c += 32) {
        const float v = __fdiv_rn(load(x, start + c, dt), p);
        q = __fadd_rn(q, __fmul_rn(v, v));
      }
      q = warp_sum(q);
      if (lane == 0) red[lr] = q;
    }
    __syncthreads();
    if (r0 + threadIdx.x < rows) s = __fadd_rn(s, red[threadIdx.x]);
    __syncthreads();
  }
  return __fmul_rn(p, __fsqrt_rn(block_tree_sum(s, red)));
}

// One block per matrix b: norms[b] from the row sums of matrix b (the two-pass form), or, with
// row_sumsq NULL, norms[b] as given (orthopt_repair_norms). Where that norm is +Inf, it is
// recomputed from matrix b of x [batch, rows, cols] (rescaled_norm); the branch is the same for
// the whole block (one value) and costs nothing elsewhere. At least one block per multiprocessor
// in the bounds: without it ptxas held the kernel to 32 registers and spilled.
__global__ void __launch_bounds__(kNsThreads, 1) norms_kernel(const float* row_sumsq, const void* x, orthopt_dtype dt,
                                                              int64_t rows, int64_t cols, float* norms) {
  __shared__ float red[kNsThreads];
  const int64_t b = blockIdx.x;
  float n = row_sumsq ? norm_from_row_sumsq(row_sumsq + b * rows, rows, red) : norms[b];
  const bool overflowed = n == INFINITY;
  if (overflowed) n = rescaled_norm(static_cast<const char*>(x) + b * rows * cols * (dt == ORTHOPT_FP32 ? 4 : 2), dt,
                                    rows, cols, red);
  if (threadIdx.x == 0 && (row_sumsq || overflowed)) norms[b] = n;
}

struct MomentumNsArgs {
  MomentumArgs momentum;  // out_dtype: the input's, bf16 or fp16
  int64_t rows, cols;
  int batch, mats_per_round;
  float safety, eps;
  float* row_sumsq;         // [batch·rows], written
  // [2·batch], zero on entry: per matrix q, [2q] counts the blocks in (phases of q: 1, then
  // 2 and 3 where its norm overflowed) and [2q + 1] receives max|U| as bits (an atomicMax: the
  // bits of non-negative floats order as the floats do).
  unsigned int* arrived;
  void* out;                // [batch, rows, cols]
  void* momentum_ptr[kNsMaxMats];
  const void* grad_ptr[kNsMaxMats];
};


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
      for (int q = mat_lo; q <= mat_hi; ++q) atomicAdd(a.arrived + 2 * q, 1u);
    }
    for (int q = mat_lo; q <= mat_hi; ++q) {
      const int64_t qs = static_cast<int64_t>(q - first) * rows, qe = qs + rows;  // its rows in the round
      // Blocks with rows of matrix q: j from ceil((qs+1)·G/R) − 1 to ceil(qe·G/R) − 1 (every
      // block has at least one row, as R >= G).
      const unsigned want =
          static_cast<unsigned>(ceil_div(qe * blocks, round_rows) - ceil_div((qs + 1) * blocks, round_rows) + 1);
      // Until `phases`·want blocks have counted in for q (each block once per phase).
      auto wait_for = [&](unsigned phases) {
        if (threadIdx.x == 0) {
          while (atomicAdd(a.arrived + 2 * q, 0u) < phases * want) __nanosleep(64);
          __threadfence();
        }
        __syncthreads();
      };
      wait_for(1);
      float* const row_sumsq = a.row_sumsq + static_cast<int64_t>(q) * rows;
      float norm = norm_from_row_sumsq(row_sumsq, rows, red);
      float eps = a.eps;
      const int64_t lo = max(r0, qs), hi = min(r1, qe);
      float* const src = u + (lo - r0) * cols;
      const int64_t n = (hi - lo) * cols;  // a multiple of 4 (cols is)
      if (norm == INFINITY) {
        // The sum overflowed (see rescaled_norm): U/p with pow2_scale's p, which every block
        // of q then divides its rows by in shared memory (exactly, as the reference does), and
        // the norm again from the rows' sums of (U/p)², in phase 1's order. Every block with
        // rows of q read the same sums, so all of them are here, and all read the same max, so
        // all take the same branch below: each phase's count reaches its target. The waits
        // end as phase 1's do: the blocks of a round are all resident (cooperative launch) and
        // visit their matrices in increasing q, so by induction on q every block with rows of
        // q gets to q and through its phases. Phase 2 also keeps the sums below from being
        // overwritten before every block has read the sums above.
        float m = 0.0f;
        for (int64_t i = threadIdx.x; i < n; i += kNsThreads) m = fmaxf(m, fabsf(src[i]));
        m = block_max(m, red);
        if (threadIdx.x == 0) {
          atomicMax(a.arrived + 2 * q + 1, __float_as_uint(m));
          __threadfence();
          atomicAdd(a.arrived + 2 * q, 1u);
        }
        wait_for(2);
        const float scale = pow2_of(__uint_as_float(__ldcg(a.arrived + 2 * q + 1)));
        if (scale != 1.0f) {  // 1: an Inf entry; the norm stays Inf, as on the plain path
          for (int64_t i = threadIdx.x; i < n; i += kNsThreads) src[i] = __fdiv_rn(src[i], scale);
          __syncthreads();
          for (int64_t lr = warp; lr < hi - lo; lr += kNsWarps) {
            const float* const urow = src + lr * cols;
            float sum = 0.0f;
            for (int64_t c = lane; c < cols; c += 32) sum = __fadd_rn(sum, __fmul_rn(urow[c], urow[c]));
            sum = warp_sum(sum);
            if (lane == 0) row_sumsq[lo - qs + lr] = sum;
          }
          __threadfence();
          __syncthreads();
          if (threadIdx.x == 0) atomicAdd(a.arrived + 2 * q, 1u);
          wait_for(3);
          norm = norm_from_row_sumsq(row_sumsq, rows, red);
          eps = __fdiv_rn(eps, scale);
        }
      }
      const float d = ns_input_divisor(norm, a.safety, eps);
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

// ---- host side

// Hyperparameters rounded to fp32 once, as ATen rounds a Scalar.
MomentumArgs momentum_args(const orthopt_momentum_params& p, orthopt_dtype momentum_dtype, orthopt_dtype grad_dtype,
                           orthopt_dtype out_dtype, const uint8_t* keep) {
  return {static_cast<float>(p.mu), static_cast<float>(p.grad_weight), p.nesterov ? 1 : 0, momentum_dtype, grad_dtype,
          out_dtype, keep};
}

bool valid_elementwise_dtype(orthopt_dtype t) { return t == ORTHOPT_FP32 || t == ORTHOPT_BF16 || t == ORTHOPT_FP16; }

// The first list of a call: its count and element counts.
orthopt_status check_sizes(const char* fn, const char* what, const orthopt_tensor_list& first) {
  if (first.count < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s': 'count' must be >= 0, got %lld", fn, what,
                (long long)first.count);
  if (first.count > 0 && !first.numel)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s': 'numel' must not be NULL", fn, what);
  for (int64_t i = 0; i < first.count; ++i)
    if (first.numel[i] < 0 || first.numel[i] > kMaxNumel)
      return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s': 'numel' [%lld] = %lld is outside [0, %lld]", fn, what,
                  (long long)i, (long long)first.numel[i], (long long)kMaxNumel);
  return ORTHOPT_OK;
}

// Every tensor holds whole rows of cols (> 0) elements (the row kernels, row scales, row maps).
orthopt_status check_whole_rows(const char* fn, const orthopt_tensor_list& first, int64_t cols) {
  for (int64_t i = 0; i < first.count; ++i)
    if (first.numel[i] % cols != 0)
      return fail(ORTHOPT_ERR_INVALID, "%s: argument 'numel' [%lld] = %lld is not a multiple of cols = %lld", fn,
                  (long long)i, (long long)first.numel[i], (long long)cols);
  return ORTHOPT_OK;
}

// What a list's element counts must be, given the first list's n (tensor by tensor).
enum class Size {
  kSame,       // n
  kRows,       // n / cols: one per row (statistics, row scales, row maps)
  kOne,        // 1 (step counts)
  kWholeRows,  // any multiple of cols (a compact direction)
};

// A list of a call: present (unless `optional`), the first list's count, a pointer for every
// tensor that is non-empty in the first list, its element counts as `size` says where given, a
// valid dtype where `typed`. An absent optional list passes.
orthopt_status check_list(const char* fn, const char* what, const orthopt_tensor_list& first,
                          const orthopt_tensor_list& l, bool optional = false, Size size = Size::kSame,
                          int64_t cols = 1, bool typed = true) {
  if (!l.data) {
    if (optional) return ORTHOPT_OK;
    return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s' must not be NULL", fn, what);
  }
  if (l.count != first.count)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s' has %lld tensors, expected %lld", fn, what, (long long)l.count,
                (long long)first.count);
  for (int64_t i = 0; i < first.count; ++i) {
    const int64_t n = first.numel[i];
    if (n > 0 && !l.data[i])
      return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s' has a NULL pointer at index %lld", fn, what, (long long)i);
    if (!l.numel || n == 0) continue;
    const int64_t got = l.numel[i];
    const int64_t want = size == Size::kSame ? n : (size == Size::kRows ? n / cols : (size == Size::kOne ? 1 : -1));
    const bool ok = want >= 0 ? got == want : got >= 0 && got % cols == 0;
    if (!ok)
      return fail(ORTHOPT_ERR_INVALID, "%s: argument '%s': 'numel' [%lld] = %lld, expected %s%lld", fn, what,
                  (long long)i, (long long)got, want >= 0 ? "" : "a multiple of ",
                  (long long)(want >= 0 ? want : cols));
  }
  if (typed && !valid_elementwise_dtype(l.dtype))
    return fail(ORTHOPT_ERR_INVALID, "%s: the dtype of argument '%s' must be fp32, bf16 or fp16, got %d", fn, what,
                static_cast<int>(l.dtype));
  return ORTHOPT_OK;
}

orthopt_status check_decay(const char* fn, const orthopt_decay_params& d) {
  if (!d.lr) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'lr' must not be NULL", fn);
  return ORTHOPT_OK;
}

Decay make_decay(const orthopt_decay_params& d) {
  return {d.lr, d.weight_decay, d.weight_decay == 0.0 ? 0 : (d.cautious ? 2 : 1)};
}

}  // namespace
}  // namespace orthopt_k

using namespace orthopt_k;

extern "C" orthopt_status orthopt_multi_momentum(orthopt_tensor_list momentum, orthopt_tensor_list grad,
                                                 orthopt_tensor_list out, orthopt_momentum_params params,
                                                 const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_multi_momentum";
  ORTHOPT_STATUS_TRY(check_sizes(fn, "momentum", momentum));
  if (momentum.count == 0) return ORTHOPT_OK;
  ORTHOPT_STATUS_TRY(check_list(fn, "momentum", momentum, momentum));
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", momentum, grad));
  ORTHOPT_STATUS_TRY(check_list(fn, "out", momentum, out, /*optional=*/true));
  const MomentumOp op{{}, static_cast<float>(params.mu), static_cast<float>(params.grad_weight),
                      params.nesterov ? 1 : 0};
  return apply<3>({momentum, grad, out}, nullptr, op, keep, stream);
}

extern "C" orthopt_status orthopt_multi_momentum_rows(orthopt_tensor_list momentum, orthopt_tensor_list grad,
                                                      orthopt_tensor_list out, orthopt_tensor_list stats, int64_t cols,
                                                      orthopt_momentum_params params, orthopt_row_stat stat,
                                                      const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_multi_momentum_rows";
  ORTHOPT_STATUS_TRY(check_sizes(fn, "momentum", momentum));
  if (momentum.count == 0) return ORTHOPT_OK;
  if (cols < 1 || cols > (int64_t(1) << 30))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be in [1, 2^30], got %lld", fn, (long long)cols);
  ORTHOPT_STATUS_TRY(check_whole_rows(fn, momentum, cols));
  if (stat != ORTHOPT_ROW_L1_MOMENTUM && stat != ORTHOPT_ROW_SUMSQ_OUT)
    return fail(ORTHOPT_ERR_INVALID, "%s: unknown argument 'stat' %d", fn, int(stat));
  if (stat == ORTHOPT_ROW_L1_MOMENTUM && out.data)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'out' must be absent with stat = ORTHOPT_ROW_L1_MOMENTUM", fn);
  ORTHOPT_STATUS_TRY(check_list(fn, "momentum", momentum, momentum));
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", momentum, grad));
  ORTHOPT_STATUS_TRY(check_list(fn, "out", momentum, out, /*optional=*/true));
  ORTHOPT_STATUS_TRY(check_list(fn, "stats", momentum, stats, false, Size::kRows, cols, /*typed=*/false));
  // Without an output, the statistic is that of fp32 values that are not stored.
  const MomentumRowsArgs args{
      momentum_args(params, momentum.dtype, grad.dtype, out.data ? out.dtype : ORTHOPT_FP32, keep), cols, stat};
  return for_each_table<4>(
      {momentum, grad, out, stats}, nullptr,
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

extern "C" int orthopt_momentum_ns_input_fits(int64_t rows, int64_t cols) {
  return ns_fits(ns_launch(), rows, cols) ? 1 : 0;
}

extern "C" orthopt_status orthopt_momentum_ns_input(orthopt_tensor_list momentum, orthopt_tensor_list grad,
                                                    int64_t rows, int64_t cols, void* out, orthopt_dtype out_dtype,
                                                    orthopt_ns_input_params params, float* row_sumsq,
                                                    unsigned int* arrived, const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_momentum_ns_input";
  const int64_t batch = momentum.count;
  if (batch < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'momentum': 'count' must be >= 0, got %lld", fn, (long long)batch);
  if (batch == 0) return ORTHOPT_OK;
  const NsLaunch l = ns_launch();
  if (!ns_fits(l, rows, cols))
    return fail(ORTHOPT_ERR_INVALID,
                "%s: matrices [%lld, %lld] do not fit (cols a multiple of 4, one matrix within the blocks' shared "
                "memory, cooperative launch): check orthopt_momentum_ns_input_fits first",
                fn, (long long)rows, (long long)cols);
  const std::vector<int64_t> numel(static_cast<size_t>(batch), rows * cols);
  const orthopt_tensor_list shape{batch, numel.data(), momentum.data, momentum.dtype};  // every matrix rows·cols
  ORTHOPT_STATUS_TRY(check_list(fn, "momentum", shape, momentum));
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", shape, grad));
  if (out_dtype != ORTHOPT_BF16 && out_dtype != ORTHOPT_FP16)
    return fail(ORTHOPT_ERR_INVALID, "%s: the dtype of argument 'out' must be bf16 or fp16, got %d", fn,
                static_cast<int>(out_dtype));
  if (!out || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'out' must be a 16-byte aligned device pointer", fn);
  if (!row_sumsq || !arrived)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'row_sumsq' and 'arrived' must not be NULL", fn);
  const int64_t grid = std::min(l.blocks, rows);
  MomentumNsArgs args{};
  args.momentum = momentum_args(params.momentum, momentum.dtype, grad.dtype, out_dtype, keep);
  args.rows = rows;
  args.cols = cols;
  args.safety = params.safety;
  args.eps = params.eps;
  const size_t out_bytes = static_cast<size_t>(rows * cols) * 2;
  for (int64_t first = 0; first < batch; first += kNsMaxMats) {
    const int64_t n = std::min<int64_t>(kNsMaxMats, batch - first);
    args.batch = static_cast<int>(n);
    args.mats_per_round = static_cast<int>(ns_mats_per_round(n, rows, cols, grid, l.smem_bytes));
    args.row_sumsq = row_sumsq + first * rows;
    args.arrived = arrived + 2 * first;
    args.out = static_cast<char*>(out) + static_cast<size_t>(first) * out_bytes;
    for (int64_t j = 0; j < n; ++j) {
      args.momentum_ptr[j] = momentum.data[first + j];
      args.grad_ptr[j] = grad.data[first + j];
    }
    ORTHOPT_CUDA_TRY(cudaMemsetAsync(args.arrived, 0, static_cast<size_t>(2 * n) * sizeof(unsigned int), stream));
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

extern "C" orthopt_status orthopt_norms_from_row_sumsq(int64_t batch, int64_t rows, int64_t cols,
                                                       const float* row_sumsq, const float* input, float* norms,
                                                       cudaStream_t stream) {
  const char* fn = "orthopt_norms_from_row_sumsq";
  if (batch < 0 || rows < 0 || cols < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'batch', 'rows' and 'cols' must be >= 0, got %lld, %lld and %lld",
                fn, (long long)batch, (long long)rows, (long long)cols);
  if (batch == 0) return ORTHOPT_OK;
  if (batch > INT32_MAX) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' must be < 2^31", fn);
  if (!norms || (rows > 0 && (!row_sumsq || (cols > 0 && !input))))
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'row_sumsq', 'input' and 'norms' must not be NULL", fn);
  norms_kernel<<<static_cast<unsigned>(batch), kNsThreads, 0, stream>>>(row_sumsq, input, ORTHOPT_FP32, rows, cols,
                                                                        norms);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

extern "C" orthopt_status orthopt_repair_norms(int64_t batch, int64_t rows, int64_t cols, const void* input,
                                               orthopt_dtype dtype, float* norms, cudaStream_t stream) {
  const char* fn = "orthopt_repair_norms";
  if (batch < 0 || rows < 0 || cols < 0)
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'batch', 'rows' and 'cols' must be >= 0, got %lld, %lld and %lld",
                fn, (long long)batch, (long long)rows, (long long)cols);
  if (batch == 0) return ORTHOPT_OK;
  if (batch > INT32_MAX) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' must be < 2^31", fn);
  if (!valid_elementwise_dtype(dtype))
    return fail(ORTHOPT_ERR_INVALID, "%s: the dtype of argument 'input' must be fp32, bf16 or fp16, got %d", fn,
                static_cast<int>(dtype));
  if (!norms || (rows > 0 && cols > 0 && !input))
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'input' and 'norms' must not be NULL", fn);
  norms_kernel<<<static_cast<unsigned>(batch), kNsThreads, 0, stream>>>(nullptr, input, dtype, rows, cols, norms);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

extern "C" orthopt_status orthopt_multi_update(orthopt_tensor_list weight, orthopt_tensor_list direction,
                                               orthopt_tensor_list param_out, orthopt_tensor_list row_scale,
                                               orthopt_update_params params, const uint8_t* keep,
                                               cudaStream_t stream) {
  const char* fn = "orthopt_multi_update";
  ORTHOPT_STATUS_TRY(check_sizes(fn, "weight", weight));
  if (weight.count == 0) return ORTHOPT_OK;
  ORTHOPT_STATUS_TRY(check_list(fn, "weight", weight, weight));
  ORTHOPT_STATUS_TRY(check_list(fn, "direction", weight, direction));
  ORTHOPT_STATUS_TRY(check_list(fn, "param_out", weight, param_out, /*optional=*/true));
  const bool scaled = row_scale.data != nullptr;
  if (scaled) {
    if (params.cols <= 0)
      return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be > 0 with row_scale, got %lld", fn,
                  (long long)params.cols);
    ORTHOPT_STATUS_TRY(check_whole_rows(fn, weight, params.cols));
    ORTHOPT_STATUS_TRY(check_list(fn, "row_scale", weight, row_scale, false, Size::kRows, params.cols, false));
  }
  ORTHOPT_STATUS_TRY(check_decay(fn, params.decay));
  const Decay decay = make_decay(params.decay);
  if (scaled) return apply<4>({weight, direction, param_out, row_scale}, params.factor,
                              UpdateOp<true>{{{}, decay, params.cols}}, keep, stream);
  return apply<3>({weight, direction, param_out}, params.factor, UpdateOp<false>{{{}, decay, 1}}, keep, stream);
}

extern "C" orthopt_status orthopt_multi_update_selected(orthopt_tensor_list weight, orthopt_tensor_list direction,
                                                        orthopt_tensor_list row_map, orthopt_tensor_list param_out,
                                                        orthopt_update_params params, const uint8_t* keep,
                                                        cudaStream_t stream) {
  const char* fn = "orthopt_multi_update_selected";
  ORTHOPT_STATUS_TRY(check_sizes(fn, "weight", weight));
  if (weight.count == 0) return ORTHOPT_OK;
  const int64_t cols = params.cols;
  if (cols <= 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be > 0, got %lld", fn, (long long)cols);
  ORTHOPT_STATUS_TRY(check_whole_rows(fn, weight, cols));
  ORTHOPT_STATUS_TRY(check_list(fn, "weight", weight, weight));
  ORTHOPT_STATUS_TRY(check_list(fn, "direction", weight, direction, false, Size::kWholeRows, cols));
  ORTHOPT_STATUS_TRY(check_list(fn, "row_map", weight, row_map, false, Size::kRows, cols, /*typed=*/false));
  ORTHOPT_STATUS_TRY(check_list(fn, "param_out", weight, param_out, /*optional=*/true));
  ORTHOPT_STATUS_TRY(check_decay(fn, params.decay));
  const UpdateSelectedOp op{{{}, make_decay(params.decay), cols}, direction.dtype};
  return apply<4>({weight, direction, param_out, row_map}, params.factor, op, keep, stream);
}

extern "C" orthopt_status orthopt_multi_adamw(orthopt_tensor_list grad, orthopt_tensor_list exp_avg,
                                              orthopt_tensor_list exp_avg_sq, orthopt_tensor_list step,
                                              orthopt_tensor_list weight, orthopt_tensor_list param_out,
                                              orthopt_adamw_params params, const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_multi_adamw";
  ORTHOPT_STATUS_TRY(check_sizes(fn, "grad", grad));
  if (grad.count == 0) return ORTHOPT_OK;
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", grad, grad));
  ORTHOPT_STATUS_TRY(check_list(fn, "exp_avg", grad, exp_avg));
  ORTHOPT_STATUS_TRY(check_list(fn, "exp_avg_sq", grad, exp_avg_sq));
  ORTHOPT_STATUS_TRY(check_list(fn, "step", grad, step, false, Size::kOne, 1, /*typed=*/false));
  ORTHOPT_STATUS_TRY(check_list(fn, "weight", grad, weight));
  ORTHOPT_STATUS_TRY(check_list(fn, "param_out", grad, param_out, /*optional=*/true));
  ORTHOPT_STATUS_TRY(check_decay(fn, params.decay));
  const AdamWOp op{{},
                   make_decay(params.decay),
                   params.beta1,
                   params.beta2,
                   static_cast<float>(params.beta1),
                   static_cast<float>(1.0 - params.beta1),
                   static_cast<float>(params.beta2),
                   static_cast<float>(1.0 - params.beta2),
                   static_cast<float>(params.eps)};
  return apply<6>({grad, exp_avg, exp_avg_sq, step, weight, param_out}, nullptr, op, keep, stream);
}

extern "C" orthopt_status orthopt_multi_lion(orthopt_tensor_list grad, orthopt_tensor_list exp_avg,
                                             orthopt_tensor_list weight, orthopt_tensor_list param_out,
                                             orthopt_lion_params params, const uint8_t* keep, cudaStream_t stream) {
  const char* fn = "orthopt_multi_lion";
  ORTHOPT_STATUS_TRY(check_sizes(fn, "grad", grad));
  if (grad.count == 0) return ORTHOPT_OK;
  ORTHOPT_STATUS_TRY(check_list(fn, "grad", grad, grad));
  ORTHOPT_STATUS_TRY(check_list(fn, "exp_avg", grad, exp_avg));
  ORTHOPT_STATUS_TRY(check_list(fn, "weight", grad, weight));
  ORTHOPT_STATUS_TRY(check_list(fn, "param_out", grad, param_out, /*optional=*/true));
  ORTHOPT_STATUS_TRY(check_decay(fn, params.decay));
  const LionOp op{{},
                  make_decay(params.decay),
                  static_cast<float>(params.beta1),
                  static_cast<float>(1.0 - params.beta1),
                  static_cast<float>(params.beta2),
                  static_cast<float>(1.0 - params.beta2)};
  return apply<4>({grad, exp_avg, weight, param_out}, nullptr, op, keep, stream);
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

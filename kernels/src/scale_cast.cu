// Scaled cast, optionally transposed, of a batch of matrices (orthopt_scale_cast): the
// Newton–Schulz input X / (‖X‖·safety + eps) in the compute dtype, written in the orientation NS
// works on, in one pass instead of ATen's transpose copy, division and cast (three passes over
// the batch, two of them in fp32); and, without a norm, the cast/transpose alone (the tall NS
// results made contiguous for the update kernel).
//
// Numerics: those of the ATen expression `(X.to(fp32) / (norm * safety + eps)).to(out)`, one IEEE
// operation at a time: norm·safety rounded to fp32, + eps rounded to fp32 (__fmul_rn/__fadd_rn
// keep nvcc from contracting them into a fused multiply-add), x / d correctly rounded
// (__fdiv_rn, what ATen's true division of two fp32 tensors computes), the result rounded to
// nearest even in the output type. Widening bf16/fp16 to fp32 is exact. So the kernel matches
// the ATen reference bit for bit, whatever the layout.
//
// Paths: transpose → 64×64 fp32 tiles through shared memory, global reads and writes coalesced
// along rows of the input and of the output, by one of two kernels:
//   - 16-byte (scale_cast_transpose_vec_kernel), when every row of the input and of the output
//     starts 16-byte aligned (both pointers aligned, cols·sizeof(in) and rows·sizeof(out)
//     multiples of 16): a 16-byte load or store moves 4 to 8 elements, where one element per
//     access leaves the transpose well short of the elementwise cast's bandwidth;
//   - one element per access (scale_cast_transpose_kernel), any shape and alignment.
// No transpose (or a transpose of a single row or column, which does not move anything) →
// elementwise, 16-byte loads and stores when both pointers are aligned and every matrix holds a
// whole number of vectors, scalar otherwise. Nothing is allocated and nothing waits for the
// host, so calls can be captured in a CUDA graph.
#include <climits>
#include <cstdint>

#include "internal.h"

namespace orthopt_k {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // elementwise grid cap (grid-stride loops beyond)
constexpr int kTile = 64;                          // transpose tile, kTile × kTile elements
constexpr int kTx = 32, kTy = 8;                   // transpose block: each thread 2 columns × 8 rows
// 16-byte transpose, blocks of kThreads per multiprocessor: on Hopper 8, the 2048 threads it holds
// (32 registers each, no spills; 8 × 16 KiB of tiles), for up to 128 KiB (fp32 in) or 64 KiB of
// loads in flight; elsewhere 4, which every architecture holds (sm_75: 1024 threads).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
constexpr int kVecBlocksPerSm = 8;
#else
constexpr int kVecBlocksPerSm = 4;
#endif
constexpr int64_t kMaxGridY = 65535;               // batch entries per launch; more: looped or launched again

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }

// The divisor of matrix b (ns_input_divisor).
__device__ __forceinline__ float divisor(const float* norm, int64_t b, float safety, float eps) {
  return ns_input_divisor(norm[b], safety, eps);
}

// V elements moved as one aligned access (16 bytes for the wider of the two types).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Elementwise, V elements per access; each matrix holds mat_vecs whole vectors.
template <typename TIn, typename TOut, int V>
__global__ void __launch_bounds__(kThreads)
    scale_cast_vec_kernel(int64_t vecs, int64_t mat_vecs, const TIn* __restrict__ in, const float* __restrict__ norm,
                          float safety, float eps, TOut* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vecs; i += stride) {
    const Pack<TIn, V> x = reinterpret_cast<const Pack<TIn, V>*>(in)[i];
    Pack<TOut, V> y;
    if (norm) {
      const float d = divisor(norm, i / mat_vecs, safety, eps);
#pragma unroll
      for (int k = 0; k < V; ++k) y.v[k] = narrow<TOut>(__fdiv_rn(widen(x.v[k]), d));
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) y.v[k] = narrow<TOut>(widen(x.v[k]));
    }
    reinterpret_cast<Pack<TOut, V>*>(out)[i] = y;
  }
}

// Elementwise, one element per access (any alignment, any matrix size).
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    scale_cast_scalar_kernel(int64_t n, int64_t mat, const TIn* __restrict__ in, const float* __restrict__ norm,
                             float safety, float eps, TOut* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n; e += stride) {
    const float x = widen(in[e]);
    out[e] = narrow<TOut>(norm ? __fdiv_rn(x, divisor(norm, e / mat, safety, eps)) : x);
  }
}

// out[b] = op(in[b])ᵀ: block (t, y) moves tile t of the matrices b = y, y + gridDim.y, ...
// Tile t covers input rows [r0, r0 + 64) and columns [c0, c0 + 64); thread (tx, ty) reads input
// elements (r0 + ty + 8i, c0 + tx + 32j) and writes output elements (c0 + ty + 8i, r0 + tx + 32j),
// i < 8, j < 2: a warp reads and writes 32 consecutive elements of one row.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kTx* kTy, 4)
    scale_cast_transpose_kernel(int64_t batch, int64_t rows, int64_t cols, int64_t tiles_c,
                                const TIn* __restrict__ in, const float* __restrict__ norm, float safety, float eps,
                                TOut* __restrict__ out) {
  __shared__ float tile[kTile][kTile + 1];  // +1: the column-wise reads hit 32 different banks
  constexpr int kRowsPerThread = kTile / kTy, kColsPerThread = kTile / kTx;
  const int64_t t = blockIdx.x;
  const int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t mat = rows * cols;
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    const TIn* src = in + b * mat;
    TOut* dst = out + b * mat;
    float v[kRowsPerThread][kColsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const int64_t r = r0 + ty + kTy * i, c = c0 + tx + kTx * j;
        v[i][j] = r < rows && c < cols ? widen(src[r * cols + c]) : 0.0f;
      }
    if (norm) {
      const float d = divisor(norm, b, safety, eps);
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) v[i][j] = __fdiv_rn(v[i][j], d);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) tile[ty + kTy * i][tx + kTx * j] = v[i][j];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const int64_t c = c0 + ty + kTy * i, r = r0 + tx + kTx * j;  // output row c, column r
        if (c < cols && r < rows) dst[c * rows + r] = narrow<TOut>(tile[tx + kTx * j][ty + kTy * i]);
      }
    __syncthreads();  // the tile is rewritten for the next matrix
  }
}

// out[b] = op(in[b])ᵀ with 16-byte global accesses; every row of in and out starts 16-byte aligned.
// Block (t, b) moves tile t (input rows [r0, r0 + 64), columns [c0, c0 + 64)) of matrix b, through
// an fp32 tile; the division happens on the way out. One matrix per block: a loop over the batch
// (as in scale_cast_transpose_kernel) would hold its state in registers across the tile and spill.
//   Loads: kIn = 16 / sizeof(TIn) consecutive elements of an input row (4 fp32, 8 bf16/fp16), at
// tile row ltr + kLoadRows·i, columns ltc + [0, kIn); a warp reads 2 or 4 whole 64-element rows.
//   Stores: kOut = 16 / sizeof(TOut) consecutive elements of an output row, i.e. kOut input rows
// of one input column gathered from the tile. Warp w writes output rows (tile columns) 4w + [0, 4)
// and 32 + 4w + [0, 4), lane / 8 picking one, 8 vectors of each (lane % 8 picks one; fp32 out
// takes two passes for the 64 elements): whole 32-byte sectors.
//   Rows or columns past the matrix: whole vectors are skipped (alignment makes every vector all
// in or all out).
//
// The tile is fp32 64×64 unpadded, so its rows stay 16-byte aligned for 16-byte shared stores;
// instead, chunk q (4 floats, 4 banks) of row r is stored at chunk q ^ ((r / kOut) % 8). Bank
// conflicts: none. Column reads: a warp reads 4 adjacent columns (the 4 banks of one chunk) at 8
// rows with distinct (r / kOut) % 8, i.e. in 8 chunks of distinct banks. Row writes, 16-byte
// stores served per quarter warp: 8 lanes store 8 chunks of one row; fp32 in, 8 consecutive
// chunks; bf16/fp16 in, each lane holds two chunks 2v, 2v + 1 and lanes v ≥ 4 store theirs in the
// other order, so that each instruction's chunks (0, 2, 4, 6, 9, 11, 13, 15, then the others) are
// distinct mod 8.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads, kVecBlocksPerSm)
    scale_cast_transpose_vec_kernel(int64_t rows, int64_t cols, int64_t tiles_c, const TIn* __restrict__ in,
                                    const float* __restrict__ norm, float safety, float eps,
                                    TOut* __restrict__ out) {
  constexpr int kIn = 16 / sizeof(TIn), kOut = 16 / sizeof(TOut);  // elements per 16-byte access
  constexpr int kInVecs = kTile / kIn;                               // loads per tile row: 16 or 8
  constexpr int kLoadRows = kThreads / kInVecs;                      // tile rows per block load: 16 or 32
  constexpr int kLoads = kTile / kLoadRows;                          // loads per thread: 4 or 2
  constexpr int kChunks = kIn / 4;                                   // 4-float chunks per load: 1 or 2
  constexpr int kHalves = kTile / kOut / 8;                          // warp passes per tile column: 2 or 1
  constexpr int kStores = 2 * kHalves;                               // stores per thread: 4 or 2
  static_assert(kThreads == 256 && kTile == 64, "the thread layout above");
  __shared__ __align__(16) float tile[kTile][kTile];
  const int64_t t = blockIdx.x, b = blockIdx.y;
  const int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;

  const int ltr = tid / kInVecs, ltc = kIn * (tid % kInVecs);
  const TIn* src = in + b * rows * cols + (r0 + ltr) * cols + c0 + ltc;
  Pack<TIn, kIn> x[kLoads] = {};  // zeros for loads past the matrix (read by no store)
#pragma unroll
  for (int i = 0; i < kLoads; ++i)
    if (c0 + ltc < cols && r0 + ltr + kLoadRows * i < rows)
      x[i] = *reinterpret_cast<const Pack<TIn, kIn>*>(src + kLoadRows * i * cols);
  const int swap = kChunks == 2 && tid % 8 >= 4;  // second chunk first (bank conflicts, above)
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = ltr + kLoadRows * i;
    // The load's first and last 4 elements (the same 4 for fp32).
    const float4 first = make_float4(widen(x[i].v[0]), widen(x[i].v[1]), widen(x[i].v[2]), widen(x[i].v[3]));
    const float4 last =
        make_float4(widen(x[i].v[kIn - 4]), widen(x[i].v[kIn - 3]), widen(x[i].v[kIn - 2]), widen(x[i].v[kIn - 1]));
#pragma unroll
    for (int h = 0; h < kChunks; ++h) {
      const int j = h ^ swap, q = ltc / 4 + j;
      *reinterpret_cast<float4*>(&tile[r][4 * (q ^ (r / kOut % 8))]) = j ? last : first;
    }
  }
  __syncthreads();

  // Store i: tile column oc + dc, tile rows orow + dr + [0, kOut) (dc = 32·(i / kHalves),
  // dr = 32·(i % kHalves)), all in chunk slot (oc / 4) ^ (lane % 8) (+ 8 past column 32): each
  // read is at tile_out plus a constant.
  const int oc = 4 * warp + lane / 8, orow = kOut * (lane % 8);
  const float* tile_out = &tile[orow][4 * ((oc / 4) ^ (lane % 8)) + oc % 4];
  TOut* dst = out + b * rows * cols + (c0 + oc) * rows + r0 + orow;
  const float d = norm ? divisor(norm, b, safety, eps) : 1.0f;
#pragma unroll
  for (int i = 0; i < kStores; ++i) {
    const int dc = 32 * (i / kHalves), dr = 32 * (i % kHalves);
    if (c0 + oc + dc < cols && r0 + orow + dr < rows) {
      Pack<TOut, kOut> y;
#pragma unroll
      for (int k = 0; k < kOut; ++k) {
        const float e = tile_out[(dr + k) * kTile + dc];
        y.v[k] = narrow<TOut>(norm ? __fdiv_rn(e, d) : e);
      }
      // __stwb: a plain 16-byte store; assigning the Pack let nvcc split it into 4-byte stores.
      __stwb(reinterpret_cast<uint4*>(dst + dc * rows + dr), reinterpret_cast<const uint4&>(y));
    }
  }
}

size_t element_size(orthopt_dtype t) { return t == ORTHOPT_FP32 ? 4 : 2; }

bool valid_scale_cast_dtype(orthopt_dtype t) { return t == ORTHOPT_FP32 || t == ORTHOPT_BF16 || t == ORTHOPT_FP16; }

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<C++ type of dt>{}).
template <typename F>
orthopt_status with_type(orthopt_dtype dt, F&& f) {
  switch (dt) {
    case ORTHOPT_FP32: return f(Tag<float>{});
    case ORTHOPT_BF16: return f(Tag<__nv_bfloat16>{});
    default: return f(Tag<__half>{});
  }
}

template <typename TIn, typename TOut>
orthopt_status launch(int64_t batch, int64_t rows, int64_t cols, const void* in_v, const float* norm, float safety,
                      float eps, void* out_v, bool transpose, cudaStream_t stream) {
  const TIn* in = static_cast<const TIn*>(in_v);
  TOut* out = static_cast<TOut*>(out_v);
  const int64_t mat = rows * cols, n = batch * mat;
  // A single row or column is laid out the same way transposed or not.
  if (transpose && rows > 1 && cols > 1) {
    const int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
    if (tiles_r > INT_MAX / tiles_c)
      return fail(ORTHOPT_ERR_INVALID, "orthopt_scale_cast: arguments 'rows' x 'cols' = %lld x %lld are too large "
                  "to transpose in one launch", (long long)rows, (long long)cols);
    const dim3 grid(static_cast<unsigned>(tiles_r * tiles_c), static_cast<unsigned>(batch < kMaxGridY ? batch : kMaxGridY));
    // Every row of in and out starts 16-byte aligned: the pointers, and the row (so also matrix) strides.
    const bool rows_aligned = reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                              cols * sizeof(TIn) % 16 == 0 && rows * sizeof(TOut) % 16 == 0;
    if (rows_aligned) {
      for (int64_t b0 = 0; b0 < batch; b0 += kMaxGridY) {  // one matrix per grid row
        const int64_t nb = batch - b0 < kMaxGridY ? batch - b0 : kMaxGridY;
        scale_cast_transpose_vec_kernel<TIn, TOut>
            <<<dim3(grid.x, static_cast<unsigned>(nb)), kThreads, 0, stream>>>(
                rows, cols, tiles_c, in + b0 * mat, norm ? norm + b0 : nullptr, safety, eps, out + b0 * mat);
        ORTHOPT_CUDA_TRY(cudaGetLastError());
      }
      return ORTHOPT_OK;
    }
    scale_cast_transpose_kernel<TIn, TOut>
        <<<grid, dim3(kTx, kTy), 0, stream>>>(batch, rows, cols, tiles_c, in, norm, safety, eps, out);
    ORTHOPT_CUDA_TRY(cudaGetLastError());
    return ORTHOPT_OK;
  }
  constexpr int V = 16 / (sizeof(TIn) > sizeof(TOut) ? sizeof(TIn) : sizeof(TOut));
  const bool aligned = reinterpret_cast<uintptr_t>(in) % (V * sizeof(TIn)) == 0 &&
                       reinterpret_cast<uintptr_t>(out) % (V * sizeof(TOut)) == 0 && mat % V == 0;
  const int64_t items = aligned ? n / V : n;
  const int64_t blocks_needed = (items + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(blocks_needed < kMaxBlocks ? blocks_needed : kMaxBlocks);
  if (aligned)
    scale_cast_vec_kernel<TIn, TOut, V><<<blocks, kThreads, 0, stream>>>(items, mat / V, in, norm, safety, eps, out);
  else
    scale_cast_scalar_kernel<TIn, TOut><<<blocks, kThreads, 0, stream>>>(n, mat, in, norm, safety, eps, out);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

}  // namespace
}  // namespace orthopt_k

using namespace orthopt_k;

extern "C" orthopt_status orthopt_scale_cast(int64_t batch, int64_t rows, int64_t cols, const void* in,
                                             orthopt_dtype in_dtype, const float* norm, float safety, float eps,
                                             void* out, orthopt_dtype out_dtype, int transpose, cudaStream_t stream) {
  const char* fn = "orthopt_scale_cast";
  if (batch < 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'batch' must be >= 0, got %lld", fn, (long long)batch);
  if (rows < 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'rows' must be >= 0, got %lld", fn, (long long)rows);
  if (cols < 0) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'cols' must be >= 0, got %lld", fn, (long long)cols);
  if (!valid_scale_cast_dtype(in_dtype))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'in_dtype' must be fp32, bf16 or fp16, got %d", fn,
                static_cast<int>(in_dtype));
  if (!valid_scale_cast_dtype(out_dtype))
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'out_dtype' must be fp32, bf16 or fp16, got %d", fn,
                static_cast<int>(out_dtype));
  if (batch == 0 || rows == 0 || cols == 0) return ORTHOPT_OK;  // nothing to write: no launch
  // Element and byte offsets stay within int64 (4 bytes per element at most).
  const int64_t kMaxElements = INT64_MAX / 4;
  if (rows > kMaxElements / cols || batch > kMaxElements / (rows * cols))
    return fail(ORTHOPT_ERR_INVALID, "%s: arguments 'batch' x 'rows' x 'cols' = %lld x %lld x %lld are too large", fn,
                (long long)batch, (long long)rows, (long long)cols);
  if (!in) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'in' must not be NULL", fn);
  if (!out) return fail(ORTHOPT_ERR_INVALID, "%s: argument 'out' must not be NULL", fn);
  const int64_t n = batch * rows * cols;
  const uintptr_t in_begin = reinterpret_cast<uintptr_t>(in), out_begin = reinterpret_cast<uintptr_t>(out);
  const uintptr_t in_end = in_begin + static_cast<uintptr_t>(n) * element_size(in_dtype);
  const uintptr_t out_end = out_begin + static_cast<uintptr_t>(n) * element_size(out_dtype);
  if (in_begin < out_end && out_begin < in_end)
    return fail(ORTHOPT_ERR_INVALID, "%s: argument 'out' overlaps argument 'in'", fn);
  return with_type(in_dtype, [&](auto in_tag) {
    return with_type(out_dtype, [&](auto out_tag) {
      using TIn = typename decltype(in_tag)::type;
      using TOut = typename decltype(out_tag)::type;
      return launch<TIn, TOut>(batch, rows, cols, in, norm, safety, eps, out, transpose != 0, stream);
    });
  });
}

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
// Paths: transpose → 64×64 tiles through shared memory (fp32 tile padded by one column, so both
// the row-wise writes and the column-wise reads of the tile are free of bank conflicts; global
// reads and writes are coalesced along rows of the input and of the output); no transpose (or a
// transpose of a single row or column, which does not move anything) → elementwise, 16-byte
// loads and stores when both pointers are aligned and every matrix holds a whole number of
// vectors, scalar otherwise. Nothing is allocated and nothing waits for the host, so calls can
// be captured in a CUDA graph.
#include <climits>
#include <cstdint>

#include "internal.h"

namespace orthopt_k {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // elementwise grid cap (grid-stride loops beyond)
constexpr int kTile = 64;                          // transpose tile, kTile × kTile elements
constexpr int kTx = 32, kTy = 8;                   // transpose block: each thread 2 columns × 8 rows
constexpr int64_t kMaxGridY = 65535;               // batch entries per launch row; more are looped

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

// The divisor of matrix b, as ATen computes `norm * safety + eps` in fp32: two roundings.
__device__ __forceinline__ float divisor(const float* norm, int64_t b, float safety, float eps) {
  return __fadd_rn(__fmul_rn(norm[b], safety), eps);
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

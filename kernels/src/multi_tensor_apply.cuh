// The launch machinery of the multi-tensor kernels (multi_tensor.cu, its only includer): the
// pointer tables, the packs of kVec elements, and apply(), the one launcher of the flat
// elementwise kernels, in the manner of PyTorch's multi_tensor_apply.
//
// A Table (device pointers per role, sizes, per-tensor factors and the first block of each
// tensor) is a kernel argument passed by value (__grid_constant__), so no host-to-device copy
// happens and the launches can be captured in a CUDA graph. Block b finds its tensor by scanning
// the cumulative block counts and processes one chunk of kChunk elements of it. A list longer
// than a table's capacity is launched in several tables, in order.
//
// apply<Depth>(lists, factor, functor, keep, stream) walks every chunk kIlp packs per thread at
// a time: the loads of all packs of a round (the roles in F::kLoad, then the functor's own
// loads), then per pack the functor's pack step and its per-element operator, then the stores
// (the roles in F::kStore, ascending; those in F::kOptional only where the tensor's pointer is
// not NULL). The functor holds the per-element math only; the arithmetic is whatever it does.
#pragma once
#include <array>
#include <cstdint>

#include "internal.h"

namespace orthopt_k {
namespace {  // one translation unit includes this header

constexpr int kThreads = 256;
constexpr int kIlp = 4;  // loads per thread and role issued before any is stored (memory parallelism)
// The flat kernels move kVec consecutive elements per load and store: one 16-byte (fp32) or
// 8-byte (bf16/fp16) access where the tensor's pointers allow (vec_aligned), element by element
// otherwise (scalar 4-byte loads held the update and AdamW below the memory bandwidth); the
// arithmetic per element is unchanged.
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

// ceil(a / b) for a >= 0, b > 0.
__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// ---- apply: the flat kernels

// A functor of the flat kernels (see the top of this file) provides:
//   kLoad, kStore, kOptional  role bit masks (bit r: role r of the table);
//   kAfterTable               whether after_table() runs after each table's launch;
//   kLoadsByRole              the round's loads issued role by role (all packs of role 0, then
//                             role 1, ...) instead of pack by pack: only the order of the
//                             instructions, which ptxas's register allocation depends on;
//   State tensor(t, i)        per-tensor constants, once per block;
//   load(s, p, e0, end, x)    its own loads of the pack at e0 (p: the tensor's pointers, x: the
//                             pack's values per role; roles outside kLoad are its scratch);
//   pack(s, p, e0, end, x)    a step on the whole pack (e0 < end) before the element operator;
//   operator()(s, v)          the math of one element, v[r] the value of role r, in and out;
//   after_table(t, i)         (kAfterTable) once per tensor of a table, in a second launch.
// FunctorBase gives the empty defaults.
struct FunctorBase {
  static constexpr unsigned kOptional = 0;
  static constexpr bool kAfterTable = false;
  static constexpr bool kLoadsByRole = false;
  template <class S, int D>
  __device__ __forceinline__ void load(const S&, void* const (&)[D], int64_t, int64_t, Pack (&)[D]) const {}
  template <class S, int D>
  __device__ __forceinline__ void pack(const S&, void* const (&)[D], int64_t, int64_t, Pack (&)[D]) const {}
  template <int D>
  __device__ __forceinline__ void after_table(const Table<D>&, int) const {}
};

template <int Depth>
struct Dtypes {
  orthopt_dtype of[Depth];  // per role (unused for roles outside kLoad | kStore)
};

// Each block first checks the keep flag (skip: write nothing).
template <int Depth, class F>
__global__ void __launch_bounds__(kThreads)
    apply_kernel(const __grid_constant__ Table<Depth> t, const Dtypes<Depth> dt, const F f, const uint8_t* keep) {
  if (skipped(keep)) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  const auto s = f.tensor(t, i);
  void* p[Depth];
  bool vec = true;
#pragma unroll
  for (int k = 0; k < Depth; ++k) {
    p[k] = t.ptr[k][i];
    if ((F::kLoad | F::kStore) >> k & 1u) vec = vec && vec_aligned(p[k], dt.of[k]);
  }
  void* const(&ptrs)[Depth] = p;
  for (int64_t base = begin + threadIdx.x * kVec; base < end; base += kStride) {
    Pack x[kIlp][Depth];
    if constexpr (F::kLoadsByRole) {
#pragma unroll
      for (int k = 0; k < Depth; ++k)
#pragma unroll
        for (int r = 0; r < kIlp; ++r)
          if (F::kLoad >> k & 1u) load_pack(p[k], pack_start(base, r), end, dt.of[k], vec, x[r][k]);
    }
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e0 = pack_start(base, r);
      if constexpr (!F::kLoadsByRole) {
#pragma unroll
        for (int k = 0; k < Depth; ++k)
          if (F::kLoad >> k & 1u) load_pack(p[k], e0, end, dt.of[k], vec, x[r][k]);
      }
      f.load(s, ptrs, e0, end, x[r]);
    }
#pragma unroll
    for (int r = 0; r < kIlp; ++r) {
      const int64_t e0 = pack_start(base, r);
      if (e0 >= end) continue;
      f.pack(s, ptrs, e0, end, x[r]);
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        float v[Depth];
#pragma unroll
        for (int k = 0; k < Depth; ++k) v[k] = x[r][k][q];
        f(s, v);
#pragma unroll
        for (int k = 0; k < Depth; ++k) x[r][k][q] = v[k];
      }
#pragma unroll
      for (int k = 0; k < Depth; ++k)
        if ((F::kStore >> k & 1u) && (!(F::kOptional >> k & 1u) || p[k]))
          store_pack(p[k], e0, end, dt.of[k], vec, x[r][k]);
    }
  }
}

// One thread per tensor of the table (kCapacity <= kThreads): the functor's after_table, e.g. a
// per-tensor count that every block of apply_kernel reads and so cannot write itself.
template <int Depth, class F>
__global__ void after_table_kernel(const __grid_constant__ Table<Depth> t, const F f, const uint8_t* keep) {
  if (skipped(keep)) return;
  const int i = static_cast<int>(threadIdx.x);
  if (i >= t.count) return;
  f.after_table(t, i);
}

// ---- host side

// Fills tables with the non-empty tensors of the lists (element counts: lists[0]'s), in order,
// and calls launch(table, blocks) for each full table and for the last one. A list whose data
// is NULL (an absent role) gives NULL pointers; factor: per tensor, NULL for all 1. chunk:
// elements per block.
template <int R, typename Launch>
orthopt_status for_each_table(const std::array<orthopt_tensor_list, R>& lists, const double* factor, Launch&& launch,
                              int64_t chunk = kChunk) {
  const int64_t count = lists[0].count;
  const int64_t* numel = lists[0].numel;
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
    for (int r = 0; r < R; ++r) t.ptr[r][c] = lists[r].data ? lists[r].data[j] : nullptr;
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

// The launcher of the flat kernels: one apply_kernel launch per table of the lists (validated
// by the caller; lists[0] gives the element counts), each followed by after_table_kernel where
// the functor has one. Absent lists (data NULL) have the dtype fp32 here.
template <int Depth, class F>
orthopt_status apply(const std::array<orthopt_tensor_list, Depth>& lists, const double* factor, const F& f,
                     const uint8_t* keep, cudaStream_t stream) {
  static_assert(sizeof(Table<Depth>) <= kTableBytes, "tables must fit the kernel-argument budget");
  static_assert(sizeof(Table<Depth>) + sizeof(Dtypes<Depth>) + sizeof(F) + sizeof(keep) <= 4096,
                "kernel arguments must stay within 4 KiB");
  static_assert(!F::kAfterTable || Table<Depth>::kCapacity <= kThreads, "after_table_kernel: a thread per tensor");
  Dtypes<Depth> dt{};
  for (int k = 0; k < Depth; ++k) dt.of[k] = lists[k].data ? lists[k].dtype : ORTHOPT_FP32;
  return for_each_table<Depth>(lists, factor, [&](const Table<Depth>& t, int64_t blocks) -> orthopt_status {
    apply_kernel<Depth, F><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t, dt, f, keep);
    ORTHOPT_CUDA_TRY(cudaGetLastError());
    if constexpr (F::kAfterTable) {
      after_table_kernel<Depth, F><<<1, kThreads, 0, stream>>>(t, f, keep);
      ORTHOPT_CUDA_TRY(cudaGetLastError());
    }
    return ORTHOPT_OK;
  });
}

}  // namespace
}  // namespace orthopt_k

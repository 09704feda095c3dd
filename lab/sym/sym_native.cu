// Native symmetric product D = α·A·Bᵀ + β·C + diag·I on the tensor cores (mma.sync m16n8k16,
// sm_80+), the lab's Design::Native (not shipped: docs/decisions/symmetric-product-kernels.md).
// Only the lower-triangle 128×128 tiles are computed; each off-diagonal tile is written twice,
// in place and mirrored, through shared memory so that both stores are coalesced.
//
// Per CTA: 8 warps (2×4), each owning a 64×32 block of the 128×128 tile; a 4-stage cp.async
// pipeline over k in steps of 32; operands in shared memory with an 80-byte row pitch, which
// keeps ldmatrix conflict-free (8 rows land on 8 distinct 16-byte bank groups).
#include <cstdint>

#include "sym_tiles.h"

namespace orthopt_lab {
namespace {

constexpr int kBM = 128;             // tile edge (rows = cols)
constexpr int kBK = 32;              // k per pipeline stage
constexpr int kStages = 4;
constexpr int kPitch = kBK + 8;      // shared row pitch in elements (80 bytes)
constexpr int kThreads = 256;
constexpr int kEpiPitch = kBM + 1;   // fp32 epilogue tile pitch: row and column reads conflict-free
constexpr size_t kPipeBytes = size_t(kStages) * 2 * kBM * kPitch * 2;
constexpr size_t kEpiBytes = size_t(kBM) * kEpiPitch * 4;
constexpr size_t kSmemBytes = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;

__device__ inline uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// cp.async and the bf16/fp16 mma need sm_80; builds for older targets (CI's default) get traps,
// and the host refuses such devices before launching.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define ORTHOPT_SM80_ASM(...) __trap()
#else
#define ORTHOPT_SM80_ASM(...) asm volatile(__VA_ARGS__)
#endif

__device__ inline void cp_async_16(void* dst, const void* src, bool valid) {
  // Source size 0 zero-fills the 16 bytes and reads nothing (rows past m, k past its end).
  ORTHOPT_SM80_ASM("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                   "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() { ORTHOPT_SM80_ASM("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() { ORTHOPT_SM80_ASM("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ inline void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

template <typename T>
__device__ inline void mma_16816(float* c, const uint32_t* a, const uint32_t* b);
template <>
__device__ inline void mma_16816<__nv_bfloat16>(float* c, const uint32_t* a, const uint32_t* b) {
  ORTHOPT_SM80_ASM(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ inline void mma_16816<__half>(float* c, const uint32_t* a, const uint32_t* b) {
  ORTHOPT_SM80_ASM(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    sym_abt_kernel(const T* __restrict__ A, int64_t stride_a, const T* __restrict__ B, int64_t stride_b,
                   const T* __restrict__ C, int64_t stride_c, T* __restrict__ D, int64_t stride_d, int m, int k,
                   float alpha, float beta, float diag) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* pipe = reinterpret_cast<T*>(smem);  // [stage][A|B][kBM][kPitch]

  // Which lower tile (ti >= tj) this CTA owns.
  int ti = 0, tj = 0;
  lower_tile(blockIdx.x, &ti, &tj);
  const int row0 = ti * kBM, col0 = tj * kBM;
  const int64_t bz = blockIdx.y;
  A += bz * stride_a;
  B += bz * stride_b;
  D += bz * stride_d;
  if (C) C += bz * stride_c;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;  // warp block: rows wm*64.., cols wn*32..
  const int ktiles = (k + kBK - 1) / kBK;

  auto stage_a = [&](int s) { return pipe + static_cast<size_t>(s) * 2 * kBM * kPitch; };
  auto stage_b = [&](int s) { return stage_a(s) + kBM * kPitch; };

  // Each thread copies 2 chunks of 16 bytes of A and 2 of B per stage.
  auto load_stage = [&](int s, int kt) {
    const int k0 = kt * kBK;
    T* sa = stage_a(s);
    T* sb = stage_b(s);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int chunk = tid + i * kThreads;  // 0..511
      const int r = chunk >> 2, c8 = (chunk & 3) * 8;
      const bool kin = k0 + c8 < k;
      const int ra = row0 + r, rb = col0 + r;
      const bool va = kin && ra < m, vb = kin && rb < m;
      cp_async_16(sa + r * kPitch + c8, va ? A + static_cast<int64_t>(ra) * k + k0 + c8 : A, va);
      cp_async_16(sb + r * kPitch + c8, vb ? B + static_cast<int64_t>(rb) * k + k0 + c8 : B, vb);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is visible to all; stage kt-1 is no longer read by anyone
    const int next = kt + kStages - 1;
    if (next < ktiles) load_stage(next % kStages, next);
    cp_async_commit();

    const T* sa = stage_a(kt % kStages);
    const T* sb = stage_b(kt % kStages);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[4][4], bf[2][4];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
        ldmatrix_x4(af[mi], sa + (wm * 64 + mi * 16 + (lane & 15)) * kPitch + kk + (lane >> 4) * 8);
#pragma unroll
      for (int p = 0; p < 2; ++p)
        ldmatrix_x4(bf[p], sb + (wn * 32 + p * 16 + (lane >> 4) * 8 + (lane & 7)) * kPitch + kk +
                               ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_16816<T>(acc[mi][ni], af[mi], &bf[ni >> 1][(ni & 1) * 2]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the epilogue tile

  float* E = reinterpret_cast<float*>(smem);  // [kBM][kEpiPitch]
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int r = wm * 64 + mi * 16 + (lane >> 2), c = wn * 32 + ni * 8 + (lane & 3) * 2;
      E[r * kEpiPitch + c] = alpha * acc[mi][ni][0];
      E[r * kEpiPitch + c + 1] = alpha * acc[mi][ni][1];
      E[(r + 8) * kEpiPitch + c] = alpha * acc[mi][ni][2];
      E[(r + 8) * kEpiPitch + c + 1] = alpha * acc[mi][ni][3];
    }
  __syncthreads();

  const bool diagonal_tile = ti == tj;
  // Pass 1: the tile in place (diagonal tiles: their lower half), finishing the epilogue.
  for (int e = tid; e < kBM * kBM; e += kThreads) {
    const int r = e / kBM, c = e % kBM;
    const int gr = row0 + r, gc = col0 + c;
    if (gr >= m || gc >= m || (diagonal_tile && c > r)) continue;
    const int64_t off = static_cast<int64_t>(gr) * m + gc;
    float v = E[r * kEpiPitch + c];
    if (C) v += beta * Elem<T>::load(C + off);
    if (gr == gc) v += diag;
    const T out = Elem<T>::make(v);
    D[off] = out;
    E[r * kEpiPitch + c] = static_cast<float>(Elem<T>::load(&out));  // mirror the rounded value
  }
  __syncthreads();
  // Pass 2: the mirror, D[col0 + r][row0 + c] = tile[c][r] (diagonal tiles: strictly upper half).
  for (int e = tid; e < kBM * kBM; e += kThreads) {
    const int r = e / kBM, c = e % kBM;
    const int gr = col0 + r, gc = row0 + c;
    if (gr >= m || gc >= m || (diagonal_tile && c <= r)) continue;
    D[static_cast<int64_t>(gr) * m + gc] = Elem<T>::make(E[c * kEpiPitch + r]);
  }
}

template <typename T>
orthopt_status launch(int64_t batch, int64_t m, int64_t k, const void* A, int64_t stride_a, const void* B,
                      int64_t stride_b, float alpha, const void* C, int64_t stride_c, float beta, float diag,
                      void* D, int64_t stride_d, cudaStream_t stream) {
  static thread_local int configured_device = -1;
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  if (configured_device != device) {
    ORTHOPT_CUDA_TRY(cudaFuncSetAttribute(sym_abt_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kSmemBytes)));
    configured_device = device;
  }
  const int64_t t = (m + kBM - 1) / kBM;
  dim3 grid(static_cast<unsigned>(t * (t + 1) / 2), static_cast<unsigned>(batch));
  sym_abt_kernel<T><<<grid, kThreads, kSmemBytes, stream>>>(
      static_cast<const T*>(A), stride_a, static_cast<const T*>(B), stride_b, static_cast<const T*>(C), stride_c,
      static_cast<T*>(D), stride_d, static_cast<int>(m), static_cast<int>(k), alpha, beta, diag);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

}  // namespace

bool native_supported(int64_t k, const void* A, int64_t stride_a, const void* B, int64_t stride_b,
                      const char** why) {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    *why = "cannot query the current device";
    return false;
  }
  if (major < 8) {
    *why = "needs compute capability 8.0 or newer (mma.sync bf16/fp16)";
    return false;
  }
  return operands_in_16_byte_rows(k, A, stride_a, B, stride_b, why);
}

orthopt_status sym_abt_native(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                              int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                              int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                              cudaStream_t stream) {
  return dtype == ORTHOPT_BF16 ? launch<__nv_bfloat16>(batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c,
                                                       beta, diag, D, stride_d, stream)
                               : launch<__half>(batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta,
                                                diag, D, stride_d, stream);
}

}  // namespace orthopt_lab

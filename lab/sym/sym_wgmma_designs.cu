// The wgmma + TMA designs of the Hopper symmetric product D = α·A·Bᵀ + β·C + diag·I (sm_90a), as
// they were measured against each other (docs/decisions/symmetric-product-kernels.md has the
// numbers and why one ships). Every design computes only the lower-triangle 128×128 tiles and
// writes each off-diagonal tile twice (in place and mirrored), so D is exactly symmetric.
//   Wgmma             one lower tile per CTA (288 threads, two CTAs per multiprocessor): two
//                     consumer warpgroups of 64 rows × 128 columns (wgmma m64n128k16), a producer
//                     warp issuing TMA loads into a 3-stage ring; epilogue through shared memory.
//   PingPong          persistent, one CTA per multiprocessor; the consumer warpgroups take whole
//                     tiles in turn, one's register epilogue under the other's main loop.
//   Coop              persistent; both warpgroups on a 128×256 wide tile sharing the A tile.
//   Pair              ping-pong on clusters of two CTAs, each loading half of a shared operand
//                     tile for both by TMA multicast.
//   Wide              ping-pong with 64×256 warpgroup units, one m64n256k16 per step.
//   PingPongTma(1Buf) ping-pong with the epilogue staged by stmatrix and stored by TMA, through
//                     two buffers (3 stages) or one (4 stages).
//   CoopN256          both warpgroups on one pair of tiles sharing an operand tile, one
//                     m64n256k16 each per step, epilogue staged and stored by TMA.
//   CoopN256Producer  CoopN256 with the TMA stores issued and waited for by the producer thread:
//                     the kernel that ships (kernels/src/sym_wgmma.cu holds its product copy).
// Standalone copy in namespace orthopt_lab (lab/sym/lab_sym.h); timing-only epilogue probes
// (EpilogueProbe) leave D wrong on purpose.
#include <cuda.h>  // CUtensorMap and the cuTensorMapEncodeTiled signature (called via the runtime)

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "sym_tiles.h"

namespace orthopt_lab {
namespace {

constexpr int kBM = 128;       // tile edge
constexpr int kBK = 64;        // k per stage: 64 × 2 bytes = one 128-byte swizzle row
constexpr int kStages = 3;     // 3 × 32 KiB per CTA, two CTAs per multiprocessor
constexpr int kThreads = 288;  // 2 consumer warpgroups + 1 producer warp
constexpr int kTileBytes = kBM * kBK * 2;              // one operand tile per stage (16 KiB)
constexpr int kStageBytes = 2 * kTileBytes;            // A and B
constexpr int kEpiPitch = kBM + 1;
constexpr size_t kPipeBytes = size_t(kStages) * kStageBytes;
constexpr size_t kEpiBytes = size_t(kBM) * kEpiPitch * 4;
constexpr size_t kDataBytes = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
// + 1 KiB: the swizzled tiles need 1024-byte alignment, dynamic shared memory guarantees 16.
constexpr size_t kSmemBytes = kDataBytes + 1024 + 2 * kStages * sizeof(uint64_t);

// wgmma, TMA and mbarrier transaction counts exist only in sm_90a code; other targets (a build
// for another GPU) get traps, and the host refuses to launch there (wgmma_supported).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ORTHOPT_SM90A_ASM(...) __trap()
#else
#define ORTHOPT_SM90A_ASM(...) asm volatile(__VA_ARGS__)
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  ORTHOPT_SM90A_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
// Makes the initialised barriers visible to the other threads (and the copy engine): once, after
// the last mbar_init of a kernel, before the CTA syncs.
__device__ __forceinline__ void fence_mbarrier_init() {
  ORTHOPT_SM90A_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  ORTHOPT_SM90A_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                    : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  ORTHOPT_SM90A_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Waits until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  ORTHOPT_SM90A_ASM(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// TMA: a box {kBK, kBM, 1} at (k0, row0, batch) of the 3-D map [batch][rows][k] into shared memory.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int k0, int row0, int z) {
  ORTHOPT_SM90A_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(k0), "r"(row0), "r"(z)
      : "memory");
}

// TMA store: the box {kBK, box rows, 1} at (c0, row0, batch) of the 3-D map from shared memory,
// in the thread's current bulk group; bulk_commit() closes the group, bulk_wait_read() waits until
// every group of the thread has finished reading shared memory (the buffer may be written
// again). fence_async_shared() makes this thread's shared-memory writes visible to the bulk copy
// engine (each writing thread, before the barrier after which one thread issues the store).
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int c0, int row0, int z) {
  ORTHOPT_SM90A_ASM("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                        reinterpret_cast<uint64_t>(map)),
                    "r"(smem_u32(src)), "r"(c0), "r"(row0), "r"(z)
                    : "memory");
}
__device__ __forceinline__ void bulk_commit() { ORTHOPT_SM90A_ASM("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Pending: how many of the thread's most recent groups may still be reading (0: none).
template <int Pending = 0>
__device__ __forceinline__ void bulk_wait_read() {
  ORTHOPT_SM90A_ASM("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory");
}
__device__ __forceinline__ void fence_async_shared() {
  ORTHOPT_SM90A_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Shared-memory matrix descriptor of a K-major tile with 128-byte swizzle: start address,
// leading-dimension offset (unused for this layout, 16 bytes), stride between 8-row groups
// (1024 bytes), swizzle mode 1 (128 B).
__device__ __forceinline__ uint64_t smem_desc(const void* tile) {
  const uint64_t addr = smem_u32(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(16 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { ORTHOPT_SM90A_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { ORTHOPT_SM90A_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  ORTHOPT_SM90A_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// D[64×128] (+)= A[64×16] · B[128×16]ᵀ, both operands K-major in shared memory (descriptors);
// scale_d = 0 ignores the old accumulator.
template <typename T>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int scale_d);
// The two instantiations differ only in the operand type named in the instruction.
#define ORTHOPT_WGMMA_M64N128K16(TYPE)                                                              \
  ORTHOPT_SM90A_ASM(                                                                               \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                               \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, " \
      "%64, %65, p, 1, 1, 0, 0;\n" \
      "}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "l"(da), "l"(db), "r"(scale_d))

template <>
__device__ __forceinline__ void wgmma_m64n128k16<__nv_bfloat16>(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  ORTHOPT_WGMMA_M64N128K16("bf16");
}
template <>
__device__ __forceinline__ void wgmma_m64n128k16<__half>(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  ORTHOPT_WGMMA_M64N128K16("f16");
}
#undef ORTHOPT_WGMMA_M64N128K16

// D[64×256] (+)= A[64×16] · B[256×16]ᵀ: d[0] holds columns 0..127, d[1] columns 128..255, each
// in the m64n128 accumulator layout (the n256 layout continues the n128 one column block by
// column block).
template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[2][64], uint64_t da, uint64_t db, int scale_d);
#define ORTHOPT_WGMMA_M64N256K16(TYPE)                                                              \
  ORTHOPT_SM90A_ASM(                                                                               \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                               \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " "                               \
      "{" \
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63," \
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95," \
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127" \
      "}, %128, %129, p, 1, 1, 0, 0;\n" \
      "}\n" \
      : \
        "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[0][4]), "+f"(d[0][5]), "+f"(d[0][6]), "+f"(d[0][7]), \
        "+f"(d[0][8]), "+f"(d[0][9]), "+f"(d[0][10]), "+f"(d[0][11]), "+f"(d[0][12]), "+f"(d[0][13]), "+f"(d[0][14]), "+f"(d[0][15]), \
        "+f"(d[0][16]), "+f"(d[0][17]), "+f"(d[0][18]), "+f"(d[0][19]), "+f"(d[0][20]), "+f"(d[0][21]), "+f"(d[0][22]), "+f"(d[0][23]), \
        "+f"(d[0][24]), "+f"(d[0][25]), "+f"(d[0][26]), "+f"(d[0][27]), "+f"(d[0][28]), "+f"(d[0][29]), "+f"(d[0][30]), "+f"(d[0][31]), \
        "+f"(d[0][32]), "+f"(d[0][33]), "+f"(d[0][34]), "+f"(d[0][35]), "+f"(d[0][36]), "+f"(d[0][37]), "+f"(d[0][38]), "+f"(d[0][39]), \
        "+f"(d[0][40]), "+f"(d[0][41]), "+f"(d[0][42]), "+f"(d[0][43]), "+f"(d[0][44]), "+f"(d[0][45]), "+f"(d[0][46]), "+f"(d[0][47]), \
        "+f"(d[0][48]), "+f"(d[0][49]), "+f"(d[0][50]), "+f"(d[0][51]), "+f"(d[0][52]), "+f"(d[0][53]), "+f"(d[0][54]), "+f"(d[0][55]), \
        "+f"(d[0][56]), "+f"(d[0][57]), "+f"(d[0][58]), "+f"(d[0][59]), "+f"(d[0][60]), "+f"(d[0][61]), "+f"(d[0][62]), "+f"(d[0][63]), \
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[1][4]), "+f"(d[1][5]), "+f"(d[1][6]), "+f"(d[1][7]), \
        "+f"(d[1][8]), "+f"(d[1][9]), "+f"(d[1][10]), "+f"(d[1][11]), "+f"(d[1][12]), "+f"(d[1][13]), "+f"(d[1][14]), "+f"(d[1][15]), \
        "+f"(d[1][16]), "+f"(d[1][17]), "+f"(d[1][18]), "+f"(d[1][19]), "+f"(d[1][20]), "+f"(d[1][21]), "+f"(d[1][22]), "+f"(d[1][23]), \
        "+f"(d[1][24]), "+f"(d[1][25]), "+f"(d[1][26]), "+f"(d[1][27]), "+f"(d[1][28]), "+f"(d[1][29]), "+f"(d[1][30]), "+f"(d[1][31]), \
        "+f"(d[1][32]), "+f"(d[1][33]), "+f"(d[1][34]), "+f"(d[1][35]), "+f"(d[1][36]), "+f"(d[1][37]), "+f"(d[1][38]), "+f"(d[1][39]), \
        "+f"(d[1][40]), "+f"(d[1][41]), "+f"(d[1][42]), "+f"(d[1][43]), "+f"(d[1][44]), "+f"(d[1][45]), "+f"(d[1][46]), "+f"(d[1][47]), \
        "+f"(d[1][48]), "+f"(d[1][49]), "+f"(d[1][50]), "+f"(d[1][51]), "+f"(d[1][52]), "+f"(d[1][53]), "+f"(d[1][54]), "+f"(d[1][55]), \
        "+f"(d[1][56]), "+f"(d[1][57]), "+f"(d[1][58]), "+f"(d[1][59]), "+f"(d[1][60]), "+f"(d[1][61]), "+f"(d[1][62]), "+f"(d[1][63]) \
      : "l"(da), "l"(db), "r"(scale_d))

template <>
__device__ __forceinline__ void wgmma_m64n256k16<__nv_bfloat16>(float (&d)[2][64], uint64_t da, uint64_t db,
                                                                 int scale_d) {
  ORTHOPT_WGMMA_M64N256K16("bf16");
}
template <>
__device__ __forceinline__ void wgmma_m64n256k16<__half>(float (&d)[2][64], uint64_t da, uint64_t db, int scale_d) {
  ORTHOPT_WGMMA_M64N256K16("f16");
}
#undef ORTHOPT_WGMMA_M64N256K16

// Stores out[0..1] at p[0..1] where wrote[q]; one 4-byte store when both are written and p is
// 4-byte aligned.
template <typename T>
__device__ __forceinline__ void store_pair(T* p, const T (&out)[2], const bool (&wrote)[2]) {
  if (wrote[0] && wrote[1] && (reinterpret_cast<uintptr_t>(p) & 3) == 0) {
    struct alignas(4) Pair { T v[2]; };
    *reinterpret_cast<Pair*>(p) = Pair{{out[0], out[1]}};
    return;
  }
  if (wrote[0]) p[0] = out[0];
  if (wrote[1]) p[1] = out[1];
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    sym_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const T* __restrict__ C, int64_t stride_c, T* __restrict__ D, int64_t stride_d, int m, int k,
                     float alpha, float beta, float diag) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kDataBytes);
  uint64_t* empty = full + kStages;

  // Which lower tile (ti >= tj) this CTA owns.
  int ti = 0, tj = 0;
  lower_tile(blockIdx.x, &ti, &tj);
  const int row0 = ti * kBM, col0 = tj * kBM;
  const int z = blockIdx.y;
  D += static_cast<int64_t>(z) * stride_d;
  if (C) C += static_cast<int64_t>(z) * stride_c;

  const int tid = threadIdx.x, wg = tid / 128;
  const int ktiles = (k + kBK - 1) / kBK;
  auto tile_a = [&](int s) { return smem + static_cast<size_t>(s) * kStageBytes; };
  auto tile_b = [&](int s) { return smem + static_cast<size_t>(s) * kStageBytes + kTileBytes; };

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 256);  // every consumer thread arrives
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

  if (wg == 2) {
    if (tid == 256) {  // producer: one thread issues every copy
      for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % kStages, round = kt / kStages;
        if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
        mbar_expect_tx(&full[s], kStageBytes);
        tma_load(tile_a(s), &map_a, &full[s], kt * kBK, row0, z);
        tma_load(tile_b(s), &map_b, &full[s], kt * kBK, col0, z);
      }
    }
  } else {
    // Consumer warpgroup c owns rows [64c, 64c + 64) of the tile.
    const int c = wg;
    for (int kt = 0; kt < ktiles; ++kt) {
      const int s = kt % kStages;
      mbar_wait(&full[s], (kt / kStages) & 1);
      const uint64_t da = smem_desc(tile_a(s) + c * 64 * kBK * 2), db = smem_desc(tile_b(s));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)  // 16 elements = 32 bytes = 2 descriptor units
        wgmma_m64n128k16<T>(acc, da + 2 * kk, db + 2 * kk, 1);
      wgmma_commit();
      // The wgmmas of the previous stage have completed: give that stage back to the producer.
      wgmma_wait<1>();
      if (kt > 0) mbar_arrive(&empty[(kt - 1) % kStages]);
    }
    wgmma_wait<0>();
  }
  __syncthreads();  // every copy has landed and every wgmma has read its operands

  // Accumulator layout of wgmma m64nN (fp32): warp w of the warpgroup holds rows 16w..16w+15;
  // lane l holds rows l/4 and l/4 + 8, columns 8j + 2(l%4) + {0, 1} in registers 4j + {0,1,2,3}.
  float* E = reinterpret_cast<float*>(smem);  // [kBM][kEpiPitch]
  if (wg < 2) {
    const int lane = tid & 31, warp = (tid / 32) & 3;
    const int r = wg * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
      E[r * kEpiPitch + col] = alpha * acc[4 * j + 0];
      E[r * kEpiPitch + col + 1] = alpha * acc[4 * j + 1];
      E[(r + 8) * kEpiPitch + col] = alpha * acc[4 * j + 2];
      E[(r + 8) * kEpiPitch + col + 1] = alpha * acc[4 * j + 3];
    }
  }
  __syncthreads();

  const bool diagonal_tile = ti == tj;
  // Pass 1: the tile in place (diagonal tiles: their lower half), finishing the epilogue; two
  // adjacent columns per thread, stored as one 4-byte pair where both are written and m is even.
  for (int e = tid; e < kBM * kBM / 2; e += kThreads) {
    const int r = e / (kBM / 2), c = 2 * (e % (kBM / 2));
    const int gr = row0 + r, gc = col0 + c;
    if (gr >= m) continue;
    T out[2];
    bool wrote[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      wrote[q] = gc + q < m && !(diagonal_tile && c + q > r);
      if (!wrote[q]) continue;
      const int64_t off = static_cast<int64_t>(gr) * m + gc + q;
      float v = E[r * kEpiPitch + c + q];
      if (C) v += beta * Elem<T>::load(C + off);
      if (gr == gc + q) v += diag;
      out[q] = Elem<T>::make(v);
      E[r * kEpiPitch + c + q] = Elem<T>::load(&out[q]);  // mirror the rounded value
    }
    store_pair(D + static_cast<int64_t>(gr) * m + gc, out, wrote);
  }
  __syncthreads();
  // Pass 2: the mirror, D[col0 + r][row0 + c] = tile[c][r] (diagonal tiles: strictly upper half).
  for (int e = tid; e < kBM * kBM / 2; e += kThreads) {
    const int r = e / (kBM / 2), c = 2 * (e % (kBM / 2));
    const int gr = col0 + r, gc = row0 + c;
    if (gr >= m) continue;
    T out[2];
    bool wrote[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      wrote[q] = gc + q < m && !(diagonal_tile && c + q <= r);
      if (wrote[q]) out[q] = Elem<T>::make(E[(c + q) * kEpiPitch + r]);
    }
    store_pair(D + static_cast<int64_t>(gr) * m + gc, out, wrote);
  }
}

// ---- Persistent ping-pong kernel (Design::PingPong) ----
// One CTA per multiprocessor loops over the lower 128×128 tiles (tile t of the flattened
// batch × tiles list goes to CTA t mod grid). The producer runs through the CTA's tiles
// without stopping, so the next tile's first stages load while a tile finishes. Each consumer
// warpgroup owns whole tiles, every other one of the CTA's list (two m64n128k16 per 16-deep
// step, 128 fp32 accumulators per thread), and the two take turns on the tensor cores: a
// warpgroup starts its main loop once the other has issued its last wgmma (named barriers
// 1 and 2), so one warpgroup's epilogue runs under the other's main loop.
// The epilogue works in registers: the rounded pair of each accumulator 8×8 block is stored in
// place, then transposed inside the warp (movmatrix: the mma fragment layout in, the same
// layout of the transpose out) and stored mirrored, with no shared staging buffer.
// β·C: the producer loads each tile's C by TMA into the owning warpgroup's C buffer while the
// tile's main loop runs (read from global memory in the epilogue, C made the epilogue longer
// than the other warpgroup's main loop).
// C that TMA cannot address (m % 8 != 0, misaligned) is read from global memory, in batches.
constexpr size_t kPpStageBytes = size_t(2) * kBM * kBK * 2;

__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ uint32_t transpose_8x8_b16(uint32_t v) {
  uint32_t t = 0;
  ORTHOPT_SM90A_ASM("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(t) : "r"(v));
  return t;
}

template <typename T>
struct alignas(4) PairOf {
  T v[2];
};

template <typename T>
__device__ __forceinline__ uint32_t pair_bits(const PairOf<T>& p) {
  uint32_t b;
  memcpy(&b, &p, 4);
  return b;
}
template <typename T>
__device__ __forceinline__ PairOf<T> pair_from_bits(uint32_t b) {
  PairOf<T> p;
  memcpy(&p, &b, 4);
  return p;
}

// A C tile in shared memory as TMA boxes of BoxRows rows × 64 columns (128-byte rows, 128-byte
// swizzle: 16-byte chunk j of row r sits at chunk j ^ (r % 8)), one box after the other; the
// pair at (r, c), c even. The ping-pong kernels' 128×128 tiles are two boxes of 128 rows.
constexpr size_t kCTileBytes = size_t(kBM) * kBM * 2;
template <typename T, int BoxRows = kBM>
__device__ __forceinline__ PairOf<T> c_tile_pair(const unsigned char* cs, int r, int c) {
  return *reinterpret_cast<const PairOf<T>*>(cs + c_tile_offset<BoxRows>(r, c));
}
// TMA store of a staged 128×128 tile (two boxes of 128 rows, the layout above) to D's rows r0..,
// columns c0.. of matrix z, in the thread's current bulk group.
__device__ __forceinline__ void tma_store_tile(const CUtensorMap* map_d, const unsigned char* buf, int c0, int r0,
                                               int z) {
  tma_store(map_d, buf, c0, r0, z);
  tma_store(map_d, buf + kCTileBytes / 2, c0 + 64, r0, z);
}
// TMA load of C's 128×128 tile at rows r0.., columns c0.. of matrix z into `buf` in that layout,
// completing on `bar`.
__device__ __forceinline__ void tma_load_tile(unsigned char* buf, const CUtensorMap* map_c, uint64_t* bar, int c0,
                                              int r0, int z) {
  tma_load(buf, map_c, bar, c0, r0, z);
  tma_load(buf + kCTileBytes / 2, map_c, bar, c0 + 64, r0, z);
}

// The epilogue of 64 rows × 128 columns of a lower tile held by a warpgroup (one wgmma m64n128
// accumulator; row0, col0: the global position of its first element), per 8×8 accumulator block
// (rows rb.., columns cb..): lane l holds row l/4, columns 2(l%4) + {0, 1}; α, β·C, diag·I and
// the rounding in registers; the rounded pair is stored in place where on or below the
// diagonal, then transposed inside the warp and stored mirrored where the source lies strictly
// below the diagonal. C from the shared tile Cs (boxes of CBoxRows rows, these rows from row
// c_row0 on) when given, else from Cz (this matrix's C in global memory, or NULL); Dz: this
// matrix's D. With MayBeUpper and upper, the accumulator is instead the transpose of a lower
// tile, at its mirrored (upper) place: stored in place on or above the diagonal and mirrored
// where the source lies strictly above it (the wide kernel's tiles of block column 0).
template <typename T, int CBoxRows, bool MayBeUpper = false, bool Mirror = true>
__device__ __forceinline__ void store_half_lower_mirrored(const float (&acc)[64], const unsigned char* Cs, int c_row0,
                                                          const T* __restrict__ Cz, T* __restrict__ Dz, int m, int row0,
                                                          int col0, float alpha, float beta, float diag,
                                                          bool upper = false) {
  // Whether D's (r, c) lies on the side of the diagonal (or on it) that the tile is stored on.
  auto keep = [&](int r, int c) { return MayBeUpper && upper ? c >= r : c <= r; };
  const int lane = threadIdx.x & 31, warp = (threadIdx.x / 32) & 3;
  constexpr int kGroup = 4;  // accumulator column blocks per batch of global C loads
#pragma unroll
  for (int j0 = 0; j0 < 16; j0 += kGroup) {
    // Global β·C: the group's 2·kGroup pairs are loaded before any is used, so their
    // latencies overlap.
    PairOf<T> cpair[2 * kGroup];
#pragma unroll
    for (int j = j0; j < j0 + kGroup; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 16 * warp + 8 * half + lane / 4, c = 8 * j + 2 * (lane % 4);
        const int gr = row0 + r, gc = col0 + c;
        PairOf<T>& cp = cpair[2 * (j - j0) + half];
        if (Cs) {
          cp = c_tile_pair<T, CBoxRows>(Cs, c_row0 + r, c);
        } else if (Cz) {
          const T* src = Cz + static_cast<int64_t>(gr) * m + gc;
          if (gr < m && gc + 1 < m && (reinterpret_cast<uintptr_t>(src) & 3) == 0) {
            cp = *reinterpret_cast<const PairOf<T>*>(src);
          } else {
            cp.v[0] = gr < m && gc < m ? src[0] : Elem<T>::make(0.0f);
            cp.v[1] = gr < m && gc + 1 < m ? src[1] : Elem<T>::make(0.0f);
          }
        }
      }
    }
#pragma unroll
    for (int j = j0; j < j0 + kGroup; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int rb = row0 + 16 * warp + 8 * half, cb = col0 + 8 * j;
        const int gr = rb + lane / 4, gc = cb + 2 * (lane % 4);
        PairOf<T> out;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          float v = alpha * acc[4 * j + 2 * half + q];
          if (Cs || Cz) v += beta * Elem<T>::load(&cpair[2 * (j - j0) + half].v[q]);
          if (gr == gc + q) v += diag;
          out.v[q] = Elem<T>::make(v);
        }
        const bool in_place[2] = {gr < m && gc < m && keep(gr, gc), gr < m && gc + 1 < m && keep(gr, gc + 1)};
        store_pair(Dz + static_cast<int64_t>(gr) * m + gc, out.v, in_place);
        if constexpr (!Mirror) continue;  // the epilogue probe (EpilogueProbe::InPlace): wrong D
        const PairOf<T> t = pair_from_bits<T>(transpose_8x8_b16(pair_bits(out)));
        // t holds the block's elements (mc + q, mr): their mirror is (mr, mc + q), written where
        // the source lies strictly on the stored side (the diagonal is written in place).
        const int mr = cb + lane / 4, mc = rb + 2 * (lane % 4);
        const bool mirrored[2] = {mr < m && mc < m && keep(mc, mr) && mc != mr,
                                  mr < m && mc + 1 < m && keep(mc + 1, mr) && mc + 1 != mr};
        store_pair(Dz + static_cast<int64_t>(mr) * m + mc, t.v, mirrored);
      }
    }
  }
}

// The epilogue of one 128×128 tile held by a warpgroup (acc0: rows 0..63, acc1: rows 64..127),
// C from a 128×128 shared tile Cs (two boxes of 128 rows) or as above.
template <typename T, bool Mirror = true>
__device__ __forceinline__ void store_tile_lower_mirrored(const float (&acc0)[64], const float (&acc1)[64],
                                                          const unsigned char* Cs, const T* __restrict__ Cz,
                                                          T* __restrict__ Dz, int m, int row0, int col0, float alpha,
                                                          float beta, float diag) {
  store_half_lower_mirrored<T, kBM, false, Mirror>(acc0, Cs, 0, Cz, Dz, m, row0, col0, alpha, beta, diag);
  store_half_lower_mirrored<T, kBM, false, Mirror>(acc1, Cs, 64, Cz, Dz, m, row0 + 64, col0, alpha, beta, diag);
}

// Four 8×8 matrices of 16-bit values between shared memory and mma fragments (each thread's
// register k: the pair at row lane/4, columns 2·(lane % 4) + {0, 1} of matrix k; lane L gives
// the address of row L % 8 of matrix L / 8). stmatrix .trans stores each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  ORTHOPT_SM90A_ASM("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                    : "r"(smem_u32(p))
                    : "memory");
}
__device__ __forceinline__ void stmatrix_x4(void* p, const uint32_t (&r)[4]) {
  ORTHOPT_SM90A_ASM("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(p)), "r"(r[0]),
                    "r"(r[1]), "r"(r[2]), "r"(r[3])
                    : "memory");
}
__device__ __forceinline__ void stmatrix_x4_trans(void* p, const uint32_t (&r)[4]) {
  ORTHOPT_SM90A_ASM("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(p)),
                    "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                    : "memory");
}

// One accumulator half (64 rows from tile row h0) of an off-diagonal tile in the TMA-store
// epilogues, four 8×8 blocks per instruction: matrix k = 2·dj + half of step jj is the block at
// rows h0 + 16·warp + 8·half, columns 8·(2·jj + dj) (row addresses: tma_stage_lane, sym_tiles.h;
// lane L gives row L % 8 of matrix L / 8).
//   Both (two buffers, store_tile_tma): its C read from `in` (ldmatrix, the warp's own blocks),
//     α·acc + β·C rounded, stored in place into `in` and transposed into `mirror` (.trans);
//   InPlace (one buffer, first pass): the same into `in` only, the values kept in acc;
//   Mirror (one buffer, second pass): the kept values transposed into `mirror`.
enum class TmaStage { Both, InPlace, Mirror };
template <typename T, TmaStage S>
__device__ __forceinline__ void tma_stage_blocks(float (&acc)[64], int h0, unsigned char* in, unsigned char* mirror,
                                                 bool with_c, float alpha, float beta) {
  const TmaStageLane l = tma_stage_lane(h0, (threadIdx.x / 32) & 3, threadIdx.x & 31);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int in_off = tma_in_offset(l, jj);
    uint32_t c[4] = {0, 0, 0, 0};
    if (S != TmaStage::Mirror && with_c) ldmatrix_x4(c, in + in_off);
    uint32_t packed[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = 2 * jj + (k >> 1), half = k & 1;
      const PairOf<T> cp = pair_from_bits<T>(c[k]);
      PairOf<T> out;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        float v = acc[4 * j + 2 * half + q];
        if (S != TmaStage::Mirror) {
          v = alpha * v;
          if (with_c) v += beta * Elem<T>::load(&cp.v[q]);
          if (S == TmaStage::InPlace) acc[4 * j + 2 * half + q] = v;  // for the Mirror pass
        }
        out.v[q] = Elem<T>::make(v);
      }
      packed[k] = pair_bits(out);
    }
    if (S != TmaStage::Mirror) stmatrix_x4(in + in_off, packed);
    if (S != TmaStage::InPlace) stmatrix_x4_trans(mirror + tma_mirror_offset(l, jj), packed);
  }
}

__device__ __forceinline__ void stmatrix_x1(void* p, uint32_t r) {
  ORTHOPT_SM90A_ASM("stmatrix.sync.aligned.m8n8.x1.shared.b16 [%0], {%1};\n" ::"r"(smem_u32(p)), "r"(r) : "memory");
}
__device__ __forceinline__ void stmatrix_x1_trans(void* p, uint32_t r) {
  ORTHOPT_SM90A_ASM("stmatrix.sync.aligned.m8n8.x1.trans.shared.b16 [%0], {%1};\n" ::"r"(smem_u32(p)), "r"(r)
                    : "memory");
}

// One accumulator half of a diagonal tile in store_tile_tma, one 8×8 block at a time (the
// block's position is the same for the whole warp): α·acc + β·C + diag·I (C from `in`, when
// with_c) rounded; a block below the diagonal goes into `mirror` in place and transposed at
// the mirrored place, a block on it in place below the diagonal and transposed above it (one
// block, combined in registers), a block above it nowhere (a mirror covers it). A warp reads C
// only in its own blocks on or below the diagonal, and writes those and blocks wholly above
// the diagonal, whose C nobody reads: so `in` and `mirror` may be the same buffer. Upper: the
// same with the sides swapped, for a tile computed transposed (its product's upper triangle is
// the wanted lower one's transpose; the cooperative m64n256 kernel's tile (0, 0)).
template <typename T, bool Upper = false>
__device__ __forceinline__ void stage_half_tma_diagonal(const float (&acc)[64], int h0, const unsigned char* in,
                                                        unsigned char* mirror, bool with_c, float alpha, float beta,
                                                        float diag) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x / 32) & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int rb = h0 + 16 * warp + 8 * half, cb = 8 * j;
      if (Upper ? rb > cb + 7 : rb + 7 < cb) continue;  // wholly on the side not kept
      const int r = rb + lane / 4, c = cb + 2 * (lane % 4);
      PairOf<T> cp{};
      if (with_c) cp = c_tile_pair<T>(in, r, c);
      PairOf<T> out;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        float v = alpha * acc[4 * j + 2 * half + q];
        if (with_c) v += beta * Elem<T>::load(&cp.v[q]);
        if (r == c + q) v += diag;
        out.v[q] = Elem<T>::make(v);
      }
      // Lane L gives row L % 8 of the one matrix (lanes 8-31: ignored, kept in range).
      if (rb == cb) {
        // The transpose holds element (c + q, r) at the lane's (r, c + q): the block's value is
        // out on the kept side and on the diagonal, the transposed element on the other.
        const PairOf<T> t = pair_from_bits<T>(transpose_8x8_b16(pair_bits(out)));
        PairOf<T> sym;
        sym.v[0] = (Upper ? c >= r : c <= r) ? out.v[0] : t.v[0];
        sym.v[1] = (Upper ? c + 1 >= r : c + 1 <= r) ? out.v[1] : t.v[1];
        stmatrix_x1(mirror + c_tile_offset(rb + (lane & 7), cb), pair_bits(sym));
      } else {
        stmatrix_x1(mirror + c_tile_offset(rb + (lane & 7), cb), pair_bits(out));
        stmatrix_x1_trans(mirror + c_tile_offset(cb + (lane & 7), rb), pair_bits(out));
      }
    }
}

// The epilogue of one 128×128 tile held by consumer warpgroup w (acc0: rows 0..63, acc1: rows
// 64..127) through its two 32 KiB buffers and TMA stores into D (Design::PingPongTma):
// `in` (the C tile's slot, holding the tile's C when with_c) and `mirror`, both in the layout
// the C tile comes in (two boxes of 128 rows × 64 columns, 128-byte swizzle). Off the diagonal
// the tile goes from `in` to (row0, col0) and its transpose from `mirror` to (col0, row0); on
// the diagonal the one tile from `mirror`. So D is exactly symmetric, as with the register
// epilogue, and TMA clips what lies past m. The buffers are written by stmatrix (four 8×8
// blocks per instruction, .trans for the mirror) and the stores move whole 128-byte rows,
// where each warp-wide pair store of the register epilogue writes 16 bytes into each of 8
// rows. One thread issues the stores and waits until they have read the buffers; the caller's
// next barrier (the C buffer's release, or the turn barrier before the next tile) orders that
// before the buffers' reuse. ptxas (CUDA 13, sm_90a): no spills without C, 48 bytes with C
// (the register epilogue: 148 and 48); a first version that staged the diagonal tiles pair
// by pair spilled 0.5-1.2 KB.
template <typename T>
__device__ __forceinline__ void store_tile_tma(float (&acc0)[64], float (&acc1)[64], unsigned char* in,
                                               unsigned char* mirror, bool with_c, const CUtensorMap* map_d, int z,
                                               int row0, int col0, float alpha, float beta, float diag, int w) {
  const bool on_diag = row0 == col0;
  if (on_diag) {
    stage_half_tma_diagonal<T>(acc0, 0, in, mirror, with_c, alpha, beta, diag);
    stage_half_tma_diagonal<T>(acc1, 64, in, mirror, with_c, alpha, beta, diag);
  } else {
    tma_stage_blocks<T, TmaStage::Both>(acc0, 0, in, mirror, with_c, alpha, beta);
    tma_stage_blocks<T, TmaStage::Both>(acc1, 64, in, mirror, with_c, alpha, beta);
  }
  fence_async_shared();  // this thread's writes, visible to the copy engine
  named_bar_sync(3 + w, 128);
  if (threadIdx.x % 128 == 0) {
    if (!on_diag) tma_store_tile(map_d, in, col0, row0, z);
    tma_store_tile(map_d, mirror, on_diag ? col0 : row0, on_diag ? row0 : col0, z);
    bulk_commit();
    bulk_wait_read();
  }
}

// ---- The one-buffer form (Design::PingPongTma1Buf): the tile and then its mirror
// through the same 32 KiB buffer per consumer warpgroup, which keeps the 4-stage ring. The
// accumulators stay live until the mirror is staged (the consumers have 232 registers after
// setmaxnreg, and ptxas allocates that region with them).

// The staged buffer to D's tile at rows r0.., columns c0..: every thread's writes made visible to
// the copy engine, the warpgroup met, then one thread stores and waits until the engine has
// read the buffer.
__device__ __forceinline__ void tma_store_buffer(const CUtensorMap* map_d, const unsigned char* buf, int c0, int r0,
                                                 int z, int w) {
  fence_async_shared();
  named_bar_sync(3 + w, 128);
  if (threadIdx.x % 128 == 0) {
    tma_store_tile(map_d, buf, c0, r0, z);
    bulk_commit();
    bulk_wait_read();
  }
}

// store_tile_tma through one buffer (the C tile's slot). Off the diagonal: the tile in place
// (each warp reads its own blocks' C and overwrites them), stored at (row0, col0), then, once
// the engine has read the buffer, its transpose at (col0, row0). Diagonal tiles (1/t of a
// t-block-row matrix's tiles) take the register epilogue into Dz (this matrix's D; C from the
// buffer): staged as in store_tile_tma they made ptxas spill 0.7 KB per thread with C in this
// kernel; this way 52 B without C and 112 B with (the register epilogue's kernel: 148 and 48).
template <typename T>
__device__ __forceinline__ void store_tile_tma_one_buffer(float (&acc0)[64], float (&acc1)[64], unsigned char* buf,
                                                          bool with_c, const CUtensorMap* map_d, T* Dz, int m, int z,
                                                          int row0, int col0, float alpha, float beta, float diag,
                                                          int w) {
  if (row0 == col0) {
    store_tile_lower_mirrored<T>(acc0, acc1, with_c ? buf : nullptr, nullptr, Dz, m, row0, col0, alpha, beta, diag);
    return;
  }
  tma_stage_blocks<T, TmaStage::InPlace>(acc0, 0, buf, buf, with_c, alpha, beta);
  tma_stage_blocks<T, TmaStage::InPlace>(acc1, 64, buf, buf, with_c, alpha, beta);
  tma_store_buffer(map_d, buf, col0, row0, z, w);
  named_bar_sync(3 + w, 128);  // the engine has read the buffer (the storing thread waited)
  tma_stage_blocks<T, TmaStage::Mirror>(acc0, 0, buf, buf, false, alpha, beta);
  tma_stage_blocks<T, TmaStage::Mirror>(acc1, 64, buf, buf, false, alpha, beta);
  tma_store_buffer(map_d, buf, row0, col0, z, w);
}

// 3 warpgroups: 2 consumers + 1 producer; the producer gives its registers to the consumers
// (setmaxnreg): 128 accumulators plus the epilogue's addresses and C pairs need more than 168.
// The split, the same in every persistent kernel: each role calls its function first thing.
constexpr int kPpThreads = 384;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "the register split exceeds the register file");
__device__ __forceinline__ void producer_registers() {
  ORTHOPT_SM90A_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
}
__device__ __forceinline__ void consumer_registers() {
  ORTHOPT_SM90A_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
}

// Programmatic dependent launch (launch_one_per_sm): a persistent kernel may start while the
// kernel before it in the stream finishes. Every thread calls this after the prologue (barrier
// set-up) and before its first global-memory access: it waits until that kernel has completed
// and its writes are visible, then lets the next such kernel launch: that happens once every
// CTA of this grid has passed this point, so all of them are resident, and the next kernel's
// CTAs take multiprocessors as ours leave (the last wave's idle ones first) and run their own
// prologue there, under our tail. Without the launch attribute both instructions do nothing.
__device__ __forceinline__ void wait_for_previous_grid() {
  ORTHOPT_SM90A_ASM("griddepcontrol.wait;\n" ::: "memory");
  ORTHOPT_SM90A_ASM("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// The start of every kernel launch_one_per_sm launches: thread 0 sets up the barriers (init),
// the CTA meets, and every thread waits for the previous grid before any global access.
template <typename Init>
__device__ __forceinline__ void persistent_prologue(Init&& init) {
  if (threadIdx.x == 0) init();
  __syncthreads();
  wait_for_previous_grid();
}

// This CTA's share of `items` work items dealt round-robin over the grid (item blockIdx.x, then
// every gridDim.x-th).
__device__ __forceinline__ int64_t items_of_cta(int64_t items) {
  return (items - blockIdx.x + gridDim.x - 1) / gridDim.x;
}

// The main loop of a consumer warpgroup, shared by the persistent kernels: for `ktiles` stages
// of the ring from global k-step g on (g advances), waits until the stage has landed, has
// issue(stage) issue its wgmmas (after the fence), and once the previous stage's wgmmas have
// completed gives that stage back: release(s) (called by every thread; the callable picks the
// thread that arrives). Returns with the last stage's wgmmas in flight: wgmma_wait<0> and that
// stage's release are the caller's.
template <int Stages, typename Issue, typename Release>
__device__ __forceinline__ void consume_ring(uint64_t* full, const unsigned char* ring, size_t stage_bytes, int ktiles,
                                             int64_t& g, Issue&& issue, Release&& release) {
  for (int kt = 0; kt < ktiles; ++kt, ++g) {
    const int s = static_cast<int>(g % Stages);
    mbar_wait(&full[s], static_cast<uint32_t>((g / Stages) & 1));
    issue(ring + static_cast<size_t>(s) * stage_bytes);
    wgmma_commit();
    wgmma_wait<1>();  // the previous stage's wgmmas have completed: give it back
    if (kt > 0) release(static_cast<int>((g - 1) % Stages));
  }
}

// consume_ring on one 128×128 block: zeroes the accumulators (acc0: rows 0..63, acc1: rows
// 64..127), and each stage's wgmmas are both row halves of its A tile against the warpgroup's
// B tile (at b_offset in the stage).
template <typename T, int Stages, typename Release>
__device__ __forceinline__ void consume_block(float (&acc0)[64], float (&acc1)[64], uint64_t* full,
                                              unsigned char* ring, size_t stage_bytes, size_t b_offset, int ktiles,
                                              int64_t& g, Release&& release) {
#pragma unroll
  for (int i = 0; i < 64; ++i) acc0[i] = acc1[i] = 0.0f;
  consume_ring<Stages>(
      full, ring, stage_bytes, ktiles, g,
      [&](const unsigned char* a) {
        const uint64_t da0 = smem_desc(a), da1 = smem_desc(a + 64 * kBK * 2), db = smem_desc(a + b_offset);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          wgmma_m64n128k16<T>(acc0, da0 + 2 * kk, db + 2 * kk, 1);
          wgmma_m64n128k16<T>(acc1, da1 + 2 * kk, db + 2 * kk, 1);
        }
      },
      release);
}

// Producer of a persistent kernel's ring: the stage of global k-step g, once the consumers have
// released it in the previous round, with `bytes` expected on its full barrier.
template <int Stages>
__device__ __forceinline__ int acquire_stage(int64_t g, uint64_t* full, uint64_t* empty, uint32_t bytes) {
  const int s = static_cast<int>(g % Stages);
  const int64_t round = g / Stages;
  if (round > 0) mbar_wait(&empty[s], static_cast<uint32_t>((round - 1) & 1));
  mbar_expect_tx(&full[s], bytes);
  return s;
}

// Barriers of the ping-pong ring (used by the pair kernel too): full[s] (one arrival, the
// producer's, plus the bytes), empty[s] (empty_arrivals per phase), and per consumer warpgroup
// c_full (its C tile has landed) and c_empty (it has read its C tile).
template <int Stages>
__device__ __forceinline__ void init_pingpong_barriers(uint64_t* full, uint64_t* empty, uint64_t* c_full,
                                                       uint64_t* c_empty, int empty_arrivals) {
  for (int s = 0; s < Stages; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], empty_arrivals);
  }
  for (int w = 0; w < 2; ++w) {
    mbar_init(&c_full[w], 1);
    mbar_init(&c_empty[w], 1);
  }
  fence_mbarrier_init();
}

// The C buffers of the ping-pong kernels (pair and wide too), one per consumer warpgroup, the
// CTA's unit n going to warpgroup n mod 2. Producer: takes unit n's buffer once its warpgroup
// has read unit n - 2's, with `bytes` to land on c_full; returns the warpgroup.
__device__ __forceinline__ int acquire_c_buffer(int64_t n, uint64_t* c_full, uint64_t* c_empty, uint32_t bytes) {
  const int w = static_cast<int>(n & 1);
  const int64_t u = n >> 1;
  if (u > 0) mbar_wait(&c_empty[w], static_cast<uint32_t>((u - 1) & 1));
  mbar_expect_tx(&c_full[w], bytes);
  return w;
}
// Consumer warpgroup w: waits until unit n's C has landed.
__device__ __forceinline__ void wait_c_buffer(int64_t n, int w, uint64_t* c_full) {
  mbar_wait(&c_full[w], static_cast<uint32_t>((n >> 1) & 1));
}
// Consumer warpgroup w: gives its buffer back once every thread of the warpgroup has read it.
__device__ __forceinline__ void release_c_buffer(int w, uint64_t* c_empty) {
  named_bar_sync(3 + w, 128);
  if (threadIdx.x % 128 == 0) mbar_arrive(&c_empty[w]);
}

// Producer: the C tile (row0, col0) of the CTA's tile n into the buffer of the warpgroup that
// owns it (n mod 2), once that warpgroup has read tile n - 2's.
__device__ __forceinline__ void load_c_tile(int64_t n, unsigned char* cbuf, const CUtensorMap* map_c, uint64_t* c_full,
                                            uint64_t* c_empty, int row0, int col0, int z) {
  const int w = acquire_c_buffer(n, c_full, c_empty, static_cast<uint32_t>(kCTileBytes));
  tma_load_tile(cbuf + w * kCTileBytes, map_c, &c_full[w], col0, row0, z);
}

// What the persistent kernels' epilogue stores: everything (the product), or, as a timing probe
// that leaves D wrong (lab/sym/sym_designs.cu, LAB_SYM_TABLE=epilogue), only the in-place half of
// each tile, or nothing: then ptxas also drops the wgmmas whose results nobody reads (seen with
// Nsight Compute: tensor pipe idle), so LoadsOnly times the operand loads through the ring.
// Two more for the cooperative m64n256 kernel only (LAB_SYM_TABLE=n256-probes): StageOnly stages every
// tile through shared memory as Full does but issues no TMA store (the staging and the
// warpgroups' meetings without the copy engine's work and waits), MainLoop skips the epilogue
// unless α = 0, which the probe never passes, so that the wgmmas stay (the main loop alone).
enum class EpilogueProbe { Full, InPlace, LoadsOnly, StageOnly, MainLoop };

// Consumer warpgroup w: the epilogue of its tile n at (row0, col0) of matrix z, with C from its
// TMA buffer (c_by_tma), from global memory (C without CTma) or none; store = false skips the
// stores but still takes part in the C buffer's barriers.
template <typename T, bool CTma, EpilogueProbe Epi = EpilogueProbe::Full>
__device__ __forceinline__ void finish_pingpong_tile(const float (&acc0)[64], const float (&acc1)[64], int64_t n, int w,
                                                     bool c_by_tma, unsigned char* cbuf, uint64_t* c_full,
                                                     uint64_t* c_empty, const T* C, int64_t stride_c, T* D,
                                                     int64_t stride_d, int z, int m, int row0, int col0, float alpha,
                                                     float beta, float diag, bool store) {
  const unsigned char* cs = nullptr;
  if (c_by_tma) {
    cs = cbuf + w * kCTileBytes;
    wait_c_buffer(n, w, c_full);
  }
  if (store && Epi != EpilogueProbe::LoadsOnly)
    store_tile_lower_mirrored<T, Epi == EpilogueProbe::Full>(
        acc0, acc1, cs, !CTma && C ? C + static_cast<int64_t>(z) * stride_c : nullptr,
        D + static_cast<int64_t>(z) * stride_d, m, row0, col0, alpha, beta, diag);
  if (c_by_tma) release_c_buffer(w, c_empty);
}

constexpr int kPpStages = 4;  // the fastest of 4 to 7 with this epilogue
// Shared memory of a ping-pong ring of `Stages` stages and `Buffers` 32 KiB tile buffers.
template <int Stages, int Buffers>
constexpr size_t pp_smem_bytes_of() {
  return 1024 + size_t(Stages) * kPpStageBytes + size_t(Buffers) * kCTileBytes + (2 * Stages + 4) * sizeof(uint64_t);
}
// The TMA-store epilogue's ping-pong (Design::PingPongTma): two buffers per consumer
// warpgroup (the tile in place, in its C tile's slot, and the mirrored tile), which leaves room
// for 3 stages in the 227 KiB a block may have.
constexpr int kPpTmaStages = 3;
// The ring and tile buffers of a ping-pong kernel instance (the pair kernel's: TmaBuffers 0),
// what the kernel carves and its launch asks for: with C by TMA one C tile per consumer
// warpgroup; with the TMA-store epilogue TmaBuffers staging buffers per warpgroup (the first
// one being the C tile's slot), and with two of them 3 stages instead of 4.
template <bool CTma, int TmaBuffers = 0>
struct PpLayout {
  static constexpr int stages = TmaBuffers == 2 ? kPpTmaStages : kPpStages;
  static constexpr int buffers = TmaBuffers > 0 ? 2 * TmaBuffers : (CTma ? 2 : 0);
  static constexpr size_t smem_bytes = pp_smem_bytes_of<stages, buffers>();
};
static_assert(PpLayout<true, 2>::smem_bytes <= 227 * 1024, "the TMA-store ping-pong's shared memory exceeds 227 KiB");

// The ping-pong ring's shared memory (the pair kernel's too), from a 1024-byte aligned start:
// Stages stages of A and B tiles, the Buffers tile buffers (with C: one C tile per consumer
// warpgroup first), then the barriers of init_pingpong_barriers.
struct PingPongSmem {
  unsigned char* ring;
  unsigned char* cbuf;
  uint64_t *full, *empty, *c_full, *c_empty;  // [Stages], [Stages], [2], [2]
  // Stage s's A and B tiles.
  __device__ __forceinline__ unsigned char* tile_a(int s) const {
    return ring + static_cast<size_t>(s) * kPpStageBytes;
  }
  __device__ __forceinline__ unsigned char* tile_b(int s) const { return tile_a(s) + kBM * kBK * 2; }
};
template <int Stages, int Buffers>
__device__ __forceinline__ PingPongSmem carve_pingpong_smem_of(unsigned char* smem_raw) {
  PingPongSmem sh;
  sh.ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  sh.cbuf = sh.ring + size_t(Stages) * kPpStageBytes;
  sh.full = reinterpret_cast<uint64_t*>(sh.cbuf + size_t(Buffers) * kCTileBytes);
  sh.empty = sh.full + Stages;
  sh.c_full = sh.empty + Stages;
  sh.c_empty = sh.c_full + 2;
  return sh;
}
template <bool CTma, int TmaBuffers = 0>
__device__ __forceinline__ PingPongSmem carve_pingpong_smem(unsigned char* smem_raw) {
  using L = PpLayout<CTma, TmaBuffers>;
  return carve_pingpong_smem_of<L::stages, L::buffers>(smem_raw);
}

// TmaBuffers 2 (Design::PingPongTma): the epilogue through two buffers per consumer
// warpgroup and TMA stores into D by map_d (store_tile_tma), 3 stages; 1
// (Design::PingPongTma1Buf): through one buffer (store_tile_tma_one_buffer), 4
// stages; 0: the register epilogue, map_d unused.
template <typename T, bool CTma, EpilogueProbe Epi = EpilogueProbe::Full, int TmaBuffers = 0>
__global__ void __launch_bounds__(kPpThreads, 1)
    sym_wgmma_pingpong_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                              const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_d,
                              const T* __restrict__ C, int64_t stride_c, T* __restrict__ D, int64_t stride_d, int m,
                              int k, float alpha, float beta, float diag, int64_t tiles_per_mat, int64_t total_tiles) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int Stages = PpLayout<CTma, TmaBuffers>::stages;
  const PingPongSmem sh = carve_pingpong_smem<CTma, TmaBuffers>(smem_raw);
  unsigned char *smem = sh.ring, *cbuf = sh.cbuf;
  uint64_t *full = sh.full, *empty = sh.empty, *c_full = sh.c_full, *c_empty = sh.c_empty;
  auto locate = [&](int64_t t, int* z, int* row0, int* col0) {
    *z = static_cast<int>(t / tiles_per_mat);
    int ti = 0, tj = 0;
    lower_tile(t % tiles_per_mat, &ti, &tj);
    *row0 = ti * kBM;
    *col0 = tj * kBM;
  };
  const bool c_by_tma = CTma && C != nullptr;  // the launcher sends C that TMA cannot address to CTma = false

  const int tid = threadIdx.x, wg = tid / 128;
  const int ktiles = (k + kBK - 1) / kBK;
  const int64_t my_tiles = items_of_cta(total_tiles);
  persistent_prologue([&] { init_pingpong_barriers<Stages>(full, empty, c_full, c_empty, 1); });

  if (wg == 2) {
    producer_registers();
    if (tid == 256) {
      int64_t g = 0;
      for (int64_t n = 0; n < my_tiles; ++n) {
        int z, row0, col0;
        locate(blockIdx.x + n * gridDim.x, &z, &row0, &col0);
        if (c_by_tma) load_c_tile(n, cbuf, &map_c, c_full, c_empty, row0, col0, z);
        for (int kt = 0; kt < ktiles; ++kt, ++g) {
          const int s = acquire_stage<Stages>(g, full, empty, static_cast<uint32_t>(kPpStageBytes));
          tma_load(sh.tile_a(s), &map_a, &full[s], kt * kBK, row0, z);
          tma_load(sh.tile_b(s), &map_b, &full[s], kt * kBK, col0, z);
        }
      }
    }
    return;
  }

  consumer_registers();
  const int w = wg, lt = tid % 128;
  for (int64_t n = w; n < my_tiles; n += 2) {
    int z, row0, col0;
    locate(blockIdx.x + n * gridDim.x, &z, &row0, &col0);
    // The other warpgroup has issued the last wgmma of tile n - 1: every stage before this
    // tile's has completed its load, so the parity waits below cannot match an older phase.
    if (n > 0) named_bar_sync(1 + w, 256);
    float acc0[64], acc1[64];
    int64_t g = n * ktiles;
    consume_block<T, Stages>(acc0, acc1, full, smem, kPpStageBytes, kBM * kBK * 2, ktiles, g, [&](int s) {
      if (lt == 0) mbar_arrive(&empty[s]);
    });
    if (n + 1 < my_tiles) named_bar_arrive(1 + (1 - w), 256);  // the other warpgroup's turn
    wgmma_wait<0>();
    if (lt == 0) mbar_arrive(&empty[(g - 1) % Stages]);

    if constexpr (TmaBuffers > 0) {
      if (c_by_tma) wait_c_buffer(n, w, c_full);
      if constexpr (TmaBuffers == 2)
        store_tile_tma<T>(acc0, acc1, cbuf + w * kCTileBytes, cbuf + (2 + w) * kCTileBytes, c_by_tma, &map_d, z, row0,
                          col0, alpha, beta, diag, w);
      else
        store_tile_tma_one_buffer<T>(acc0, acc1, cbuf + w * kCTileBytes, c_by_tma, &map_d,
                                     D + static_cast<int64_t>(z) * stride_d, m, z, row0, col0, alpha, beta, diag, w);
      if (c_by_tma) release_c_buffer(w, c_empty);
    } else {
      finish_pingpong_tile<T, CTma, Epi>(acc0, acc1, n, w, c_by_tma, cbuf, c_full, c_empty, C, stride_c, D, stride_d,
                                         z, m, row0, col0, alpha, beta, diag, true);
    }
  }
}

// ---- Persistent cooperative kernel (Design::Coop) ----
// The ping-pong kernel's 128×128 tiles read 32 KiB of operands per 128·128·64 multiply-adds and
// were L2-bound in Nsight Compute (bench/results/2026-12-01-h200-coop.md). Here both consumer
// warpgroups work on one "wide" tile, 128 rows × 256 columns: the lower tiles (i, 2J) and
// (i, 2J + 1) of row i, which share the A tile (rows of block i). A stage holds A and the two
// B tiles, 48 KiB for twice the work: 24 KiB per 128·128·64, as cuBLAS's 256×128 tiles. Wide
// tiles run over the lower triangle row by row (2J <= i); the tile (i, i + 1) of an even row
// lies above the diagonal, so its warpgroup skips it (no loads, no wgmma: the other warpgroup
// has the tensor cores to itself) but still passes through the ring's barriers in step. The
// epilogue is not hidden under another tile's main loop, as in ping-pong; the producer keeps
// loading the next tile's stages meanwhile. β·C by TMA into one C tile per warpgroup, loaded
// once the tile's first stages are queued and the previous tile's C has been read.
constexpr size_t kCoopStageBytes = size_t(3) * kBM * kBK * 2;  // A, B of column block 2J, B of 2J + 1
// 4 × 48 KiB, or 3 × 48 KiB + two 32 KiB C tiles, within 227 KiB.
template <bool CTma>
constexpr int kCoopStages = CTma ? 3 : 4;
template <bool CTma>
constexpr size_t coop_smem_bytes() {
  return 1024 + size_t(kCoopStages<CTma>) * kCoopStageBytes + (CTma ? 2 * kCTileBytes : 0) +
         (2 * kCoopStages<CTma> + 2) * sizeof(uint64_t);
}

// Barriers of the cooperative kernels' ring (both warpgroups consume every stage): full[s] (the
// producer's arrival plus the bytes), empty[s] (one arrival per consumer warpgroup), c_full (the
// block's C tiles have landed) and c_empty (both warpgroups have read them). more(): a kernel's
// other barriers, initialised before the one fence.
struct NoMoreBarriers {
  __device__ void operator()() const {}
};
template <int Stages, typename More = NoMoreBarriers>
__device__ __forceinline__ void init_coop_barriers(uint64_t* full, uint64_t* empty, uint64_t* c_full,
                                                   uint64_t* c_empty, More more = {}) {
  for (int s = 0; s < Stages; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], 2);
  }
  mbar_init(c_full, 1);
  mbar_init(c_empty, 2);
  more();
  fence_mbarrier_init();
}

// Wide tile idx of a matrix, row-major over the rows i of 128×128 blocks, with columns
// J = 0..i/2 in row i: rows 2p and 2p + 1 each hold p + 1 wide tiles, so row 2p starts at
// p(p + 1) and row 2p + 1 at (p + 1)².
__device__ __forceinline__ void lower_wide_tile(int64_t idx, int* ti_out, int* tj2_out) {
  int p = static_cast<int>((sqrt(4.0 * static_cast<double>(idx) + 1.0) - 1.0) * 0.5);
  while (static_cast<int64_t>(p) * (p + 1) > idx) --p;
  while (static_cast<int64_t>(p + 1) * (p + 2) <= idx) ++p;
  const int64_t odd_start = static_cast<int64_t>(p + 1) * (p + 1);
  if (idx < odd_start) {
    *ti_out = 2 * p;
    *tj2_out = static_cast<int>(idx - static_cast<int64_t>(p) * (p + 1));
  } else {
    *ti_out = 2 * p + 1;
    *tj2_out = static_cast<int>(idx - odd_start);
  }
}
// Wide tiles of a matrix with t rows of 128×128 blocks.
inline int64_t wide_tiles(int64_t t) { return t % 2 == 0 ? (t / 2) * (t / 2 + 1) : (t / 2 + 1) * (t / 2 + 1); }

template <typename T, bool CTma, EpilogueProbe Epi = EpilogueProbe::Full>
__global__ void __launch_bounds__(kPpThreads, 1)
    sym_wgmma_coop_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                          const __grid_constant__ CUtensorMap map_c, const T* __restrict__ C, int64_t stride_c,
                          T* __restrict__ D, int64_t stride_d, int m, int k, float alpha, float beta, float diag,
                          int64_t tiles_per_mat, int64_t total_tiles) {
  constexpr int kStagesC = kCoopStages<CTma>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* cbuf = smem + size_t(kStagesC) * kCoopStageBytes;  // CTma: one C tile per consumer warpgroup
  uint64_t* full = reinterpret_cast<uint64_t*>(cbuf + (CTma ? 2 * kCTileBytes : 0));
  uint64_t* empty = full + kStagesC;
  uint64_t* c_full = empty + kStagesC;  // this tile's C tiles have landed
  uint64_t* c_empty = c_full + 1;       // both warpgroups are done with the previous tile's C
  constexpr size_t kTile = size_t(kBM) * kBK * 2;
  auto tile_a = [&](int s) { return smem + static_cast<size_t>(s) * kCoopStageBytes; };
  auto tile_b = [&](int s, int w) { return smem + static_cast<size_t>(s) * kCoopStageBytes + (1 + w) * kTile; };
  auto locate = [&](int64_t t, int* z, int* ti, int* tj2) {
    *z = static_cast<int>(t / tiles_per_mat);
    lower_wide_tile(t % tiles_per_mat, ti, tj2);
  };
  const bool c_by_tma = CTma && C != nullptr;

  const int tid = threadIdx.x, wg = tid / 128;
  const int ktiles = (k + kBK - 1) / kBK;
  const int64_t my_tiles = items_of_cta(total_tiles);
  persistent_prologue([&] { init_coop_barriers<kStagesC>(full, empty, c_full, c_empty); });

  if (wg == 2) {
    producer_registers();
    if (tid == 256) {
      int64_t g = 0;
      for (int64_t n = 0; n < my_tiles; ++n) {
        int z, ti, tj2;
        locate(blockIdx.x + n * gridDim.x, &z, &ti, &tj2);
        const bool second = 2 * tj2 + 1 <= ti;  // the tile's second 128×128 block is on or below the diagonal
        const int row0 = ti * kBM, col0 = 2 * tj2 * kBM;
        const int first_stages = ktiles < kStagesC ? ktiles : kStagesC;
        for (int kt = 0; kt < ktiles; ++kt, ++g) {
          const int s = acquire_stage<kStagesC>(g, full, empty, static_cast<uint32_t>((second ? 3 : 2) * kTile));
          tma_load(tile_a(s), &map_a, &full[s], kt * kBK, row0, z);
          tma_load(tile_b(s, 0), &map_b, &full[s], kt * kBK, col0, z);
          if (second) tma_load(tile_b(s, 1), &map_b, &full[s], kt * kBK, col0 + kBM, z);
          // C once this tile's first stages are queued (they load during the previous tile's
          // epilogue) and both warpgroups have read the previous tile's C.
          if (c_by_tma && kt == first_stages - 1) {
            if (n > 0) mbar_wait(c_empty, static_cast<uint32_t>((n - 1) & 1));
            mbar_expect_tx(c_full, static_cast<uint32_t>((second ? 2 : 1) * kCTileBytes));
            for (int w = 0; w < (second ? 2 : 1); ++w)
              tma_load_tile(cbuf + w * kCTileBytes, &map_c, c_full, col0 + w * kBM, row0, z);
          }
        }
      }
    }
    return;
  }

  consumer_registers();
  const int w = wg, lt = tid % 128;
  int64_t g = 0;
  for (int64_t n = 0; n < my_tiles; ++n) {
    int z, ti, tj2;
    locate(blockIdx.x + n * gridDim.x, &z, &ti, &tj2);
    const int tj = 2 * tj2 + w;
    // Warpgroup-uniform. The two cases are separate loops: with wgmma behind a branch inside
    // the main loop, ptxas serializes the wgmmas (C7518, a warpgroup wait in a divergent path).
    if (tj <= ti) {
      float acc0[64], acc1[64];
      consume_block<T, kStagesC>(acc0, acc1, full, smem, kCoopStageBytes, (1 + w) * kTile, ktiles, g, [&](int s) {
        if (lt == 0) mbar_arrive(&empty[s]);
      });
      wgmma_wait<0>();
      if (lt == 0) mbar_arrive(&empty[(g - 1) % kStagesC]);
      if (c_by_tma) mbar_wait(c_full, static_cast<uint32_t>(n & 1));
      if constexpr (Epi != EpilogueProbe::LoadsOnly)
        store_tile_lower_mirrored<T, Epi == EpilogueProbe::Full>(
            acc0, acc1, c_by_tma ? cbuf + w * kCTileBytes : nullptr,
            !CTma && C ? C + static_cast<int64_t>(z) * stride_c : nullptr, D + static_cast<int64_t>(z) * stride_d, m,
            ti * kBM, tj * kBM, alpha, beta, diag);
    } else {
      // Above the diagonal: one thread passes each stage on in step with the other warpgroup,
      // and waits for this tile's C too, so that the arrival on c_empty below cannot count
      // towards the previous tile's phase. One thread only: nothing else keeps the warps of a
      // warpgroup together here (no wgmma), and a warp left behind by two phases of the ring
      // would wait on a parity that has come round again (the first version, with every thread
      // waiting, hung from 4096²; this is the likely cause, and this version does not hang).
      if (lt == 0) {
        for (int kt = 0; kt < ktiles; ++kt) {
          const int64_t gk = g + kt;
          mbar_wait(&full[gk % kStagesC], static_cast<uint32_t>((gk / kStagesC) & 1));
          mbar_arrive(&empty[gk % kStagesC]);
        }
        if (c_by_tma) mbar_wait(c_full, static_cast<uint32_t>(n & 1));
      }
      g += ktiles;
    }
    // The warpgroup goes on to its next tile together (and, with C, has read its C tile).
    named_bar_sync(3 + w, 128);
    if (c_by_tma && lt == 0) mbar_arrive(c_empty);
  }
}

// ---- Persistent ping-pong kernel on CTA pairs (Design::Pair) ----
// The ping-pong kernel as it is (producer, 4-stage ring, two consumer warpgroups taking whole
// 128×128 tiles in turn, register epilogue), run by clusters of two CTAs on two
// multiprocessors. The two CTAs of a cluster walk one list of tile pairs in step, CTA r taking
// the pair's tile r; the two tiles share one operand tile (the A tile of block row i, or the B
// tile of block column j), and each CTA loads one 64-row half of it by TMA multicast into both
// CTAs' shared memory, and its other operand alone. So each CTA reads 24 KiB per stage from L2
// instead of 32, as COOP does, while keeping ping-pong's hidden epilogue. A stage is given back
// to both producers: its consumer warpgroup arrives on its own CTA's "empty" barrier and on the
// peer's (2 arrivals per phase), because the peer's producer writes into this CTA's stage.
// Pairs of a matrix (t block rows): row 2p holds the tiles (2p, 1..2p) as p pairs sharing A,
// row 2p + 1 the tiles (2p + 1, 0..2p + 1) as p + 1 pairs; the tiles (i, 0) of even rows left
// over are paired down column 0, sharing B: (0, 0) with (2, 0), (4, 0) with (6, 0), ...; when
// their count is odd the last one is paired with itself (both CTAs compute it, one stores).
// Slower than ping-pong (bench/results/2026-12-01-h200-pair.md): the fewer L2 bytes bought nothing.
constexpr int kPairCtas = 2;
constexpr size_t kHalfTileBytes = size_t(kBM / 2) * kBK * 2;  // 64 rows × 64 k

// TilePair, pairs_per_matrix, lower_pair, lower_pair_in_panels: sym_tiles.h (the host checks them).

// A pair (item `item` of the flattened batch × pairs list) as the operands' block rows: matrix
// z, D's rows row .. against the 128 columns col[b] .. of tile b (b = 0, 1), computed from the
// first operand's rows row .. and the second's rows col[b] ..; transposed: the first operand is
// B and the second A (a pair down block column 0, its tiles' mirrors). second: tile 1 is stored
// (a tile paired with itself is computed twice and stored once). row_offset: added to row (the
// wide kernel's 64-row halves). The wide and the cooperative m64n256 kernels work on these.
struct PairUnit {
  int z, row, col[2];
  bool transposed, second;
};
__device__ __forceinline__ PairUnit locate_pair_unit(int64_t item, int64_t pairs_per_mat, int t, int row_offset = 0,
                                                     int panel = 0) {
  const TilePair pr = lower_pair_in_panels(item % pairs_per_mat, t, panel);
  PairUnit u;
  u.z = static_cast<int>(item / pairs_per_mat);
  u.transposed = !pr.share_a;
  u.row = (pr.share_a ? pr.ti[0] : pr.tj[0]) * kBM + row_offset;
  for (int b = 0; b < 2; ++b) u.col[b] = (pr.share_a ? pr.tj[b] : pr.ti[b]) * kBM;
  u.second = pr.ti[0] != pr.ti[1] || pr.tj[0] != pr.tj[1];
  return u;
}

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r = 0;
  ORTHOPT_SM90A_ASM("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of both CTAs: after the barriers are initialized (before any remote arrival or
// multicast) and before exit (a CTA's shared memory must outlive the peer's arrivals on it).
__device__ __forceinline__ void cluster_sync() {
  ORTHOPT_SM90A_ASM("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrival on the barrier at the same shared-memory offset in CTA `rank` of the cluster, with
// PTX's default semantics (release at CTA scope, as CUTLASS's cluster barriers): the stage's
// wgmmas have completed, so the peer's TMA cannot overwrite operands still being read. With
// release at cluster scope (.release.cluster) the kernel took about twice as long
// (bench/results/2026-12-01-h200-pair.md); the 2×2-cluster kernel of bf34eab had that arrival.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  ORTHOPT_SM90A_ASM(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
}
// tma_load into the same offset of every CTA in cta_mask, completing on each one's barrier at
// bar's offset.
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int k0, int row0,
                                                   int z, uint16_t cta_mask) {
  ORTHOPT_SM90A_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(k0), "r"(row0), "r"(z), "h"(cta_mask)
      : "memory");
}

// map_a, map_b: boxes of 64 rows (half tiles); map_c: boxes of 128 rows, as for ping-pong.
template <typename T, bool CTma>
__global__ void __launch_bounds__(kPpThreads, 1)
    sym_wgmma_pair_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                          const __grid_constant__ CUtensorMap map_c, const T* __restrict__ C, int64_t stride_c,
                          T* __restrict__ D, int64_t stride_d, int m, int k, float alpha, float beta, float diag,
                          int64_t pairs_per_mat, int64_t total_pairs) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const PingPongSmem sh = carve_pingpong_smem<CTma>(smem_raw);
  unsigned char *smem = sh.ring, *cbuf = sh.cbuf;
  uint64_t *full = sh.full, *empty = sh.empty, *c_full = sh.c_full, *c_empty = sh.c_empty;
  const int t = (m + kBM - 1) / kBM;
  const uint32_t rank = cluster_ctarank(), peer = rank ^ 1;
  const int64_t cluster = blockIdx.x / kPairCtas, clusters = gridDim.x / kPairCtas;
  auto locate = [&](int64_t n, int* z, TilePair* pr) {
    const int64_t item = cluster + n * clusters;
    *z = static_cast<int>(item / pairs_per_mat);
    *pr = lower_pair(item % pairs_per_mat, t);
  };
  const bool c_by_tma = CTma && C != nullptr;

  const int tid = threadIdx.x, wg = tid / 128;
  const int ktiles = (k + kBK - 1) / kBK;
  const int64_t my_pairs = (total_pairs - cluster + clusters - 1) / clusters;
  // empty: this CTA's consumer warpgroup and the peer's arrive.
  if (tid == 0) init_pingpong_barriers<kPpStages>(full, empty, c_full, c_empty, kPairCtas);
  cluster_sync();

  if (wg == 2) {
    producer_registers();
    if (tid == 256) {
      int64_t g = 0;
      for (int64_t n = 0; n < my_pairs; ++n) {
        int z;
        TilePair pr;
        locate(n, &z, &pr);
        const int row0 = pr.ti[rank] * kBM, col0 = pr.tj[rank] * kBM;
        if (c_by_tma) load_c_tile(n, cbuf, &map_c, c_full, c_empty, row0, col0, z);
        const int half = 64 * static_cast<int>(rank);
        for (int kt = 0; kt < ktiles; ++kt, ++g) {
          // 32 KiB land here: this CTA's own operand tile, its half of the shared one and the
          // peer's half (which may land before this expect_tx: the phase still waits for it).
          const int s = acquire_stage<kPpStages>(g, full, empty, static_cast<uint32_t>(kPpStageBytes));
          if (pr.share_a) {
            tma_load_multicast(sh.tile_a(s) + rank * kHalfTileBytes, &map_a, &full[s], kt * kBK, row0 + half, z, 0x3);
            tma_load(sh.tile_b(s), &map_b, &full[s], kt * kBK, col0, z);
            tma_load(sh.tile_b(s) + kHalfTileBytes, &map_b, &full[s], kt * kBK, col0 + 64, z);
          } else {
            tma_load(sh.tile_a(s), &map_a, &full[s], kt * kBK, row0, z);
            tma_load(sh.tile_a(s) + kHalfTileBytes, &map_a, &full[s], kt * kBK, row0 + 64, z);
            tma_load_multicast(sh.tile_b(s) + rank * kHalfTileBytes, &map_b, &full[s], kt * kBK, col0 + half, z, 0x3);
          }
        }
      }
    }
  } else {
    consumer_registers();
    const int w = wg, lt = tid % 128;
    for (int64_t n = w; n < my_pairs; n += 2) {
      int z;
      TilePair pr;
      locate(n, &z, &pr);
      // As in ping-pong: the other warpgroup has issued the last wgmma of pair n - 1.
      if (n > 0) named_bar_sync(1 + w, 256);
      float acc0[64], acc1[64];
      int64_t g = n * ktiles;
      auto release = [&](int s) {
        if (lt == 0) {
          mbar_arrive(&empty[s]);
          mbar_arrive_cluster(&empty[s], peer);
        }
      };
      consume_block<T, kPpStages>(acc0, acc1, full, smem, kPpStageBytes, kBM * kBK * 2, ktiles, g, release);
      if (n + 1 < my_pairs) named_bar_arrive(1 + (1 - w), 256);
      wgmma_wait<0>();
      release(static_cast<int>((g - 1) % kPpStages));

      // A tile paired with itself is stored by rank 0 only.
      const bool store = rank == 0 || pr.ti[0] != pr.ti[1] || pr.tj[0] != pr.tj[1];
      finish_pingpong_tile<T, CTma>(acc0, acc1, n, w, c_by_tma, cbuf, c_full, c_empty, C, stride_c, D, stride_d, z, m,
                                    pr.ti[rank] * kBM, pr.tj[rank] * kBM, alpha, beta, diag, store);
    }
  }
  cluster_sync();
}

// ---- Persistent ping-pong kernel with 64×256 warpgroup tiles (Design::Wide) ----
// The ping-pong kernel's organization (producer warp, ring of stages, two consumer warpgroups
// taking units in turn on the tensor cores, register epilogue hidden under the other's main
// loop), with the warpgroup's 128 accumulators spent on 64 rows × 256 columns instead of
// 128 × 128: one wgmma m64n256k16 per 16-deep step instead of two m64n128k16, which reads
// 5120 operand elements from shared memory per 64·256·16 multiply-adds instead of 6144
// (Nsight Compute put ping-pong's L1/shared throughput high: bench/results/2026-12-01-h200-wide.md). The 256 columns
// are the two lower 128×128 tiles of a pair of the pair kernel's lower_pair; unit n of a CTA is
// the 64-row half n mod 2 of its pair n / 2, so warpgroup w always takes half w. A pair of one
// block row i, tiles (i, j1) and (i, j2), is A's rows of block i against B's rows of blocks j1
// and j2. A pair down block column 0, tiles (i1, 0) and (i2, 0), is computed transposed, B's
// rows of block 0 against A's rows of blocks i1 and i2: the same products, giving the tiles
// (0, i1) and (0, i2) of the lower triangle's mirror, which the epilogue stores in place above
// the diagonal and mirrored below it (C is symmetric by contract, so C at the upper place is
// C at the lower one). A stage is 40 KiB: the A half (64 rows) and two 128-row B tiles, 25%
// more operand bytes from L2 per multiply-add than ping-pong's 32 KiB per 128·128·64 (the pair
// kernel found fewer L2 bytes did not speed ping-pong up). β·C by TMA as in ping-pong, per
// warpgroup a 64×256 C buffer (four 64×64 boxes).
// Correct and slower than ping-pong everywhere (bench/results/2026-12-01-h200-wide.md).
constexpr int kWideStages = 4;
constexpr int kWideRows = 64;                                    // rows of a warpgroup's unit
constexpr size_t kWideATile = size_t(kWideRows) * kBK * 2;       // 8 KiB
constexpr size_t kWideStageBytes = kWideATile + 2 * kTileBytes;  // + two 128-row B tiles: 40 KiB
constexpr size_t kWideCBytes = size_t(kWideRows) * 2 * kBM * 2;  // 64 × 256 C per warpgroup: 32 KiB
constexpr size_t kWideCHalfBytes = kWideCBytes / 2;              // the C of one of the two tiles
template <bool CTma>
constexpr size_t wide_smem_bytes() {
  return 1024 + size_t(kWideStages) * kWideStageBytes + (CTma ? 2 * kWideCBytes : 0) +
         (2 * kWideStages + 4) * sizeof(uint64_t);
}
static_assert(wide_smem_bytes<true>() <= 227 * 1024, "the wide kernel's shared memory exceeds 227 KiB");

// One warpgroup unit: the 64-row half n mod 2 of the CTA's pair n / 2.
__device__ __forceinline__ PairUnit locate_wide(int64_t n, int64_t pairs_per_mat, int t) {
  return locate_pair_unit(blockIdx.x + (n >> 1) * gridDim.x, pairs_per_mat, t, kWideRows * static_cast<int>(n & 1));
}

// map_a, map_b: boxes of 64 rows; map_a_tiles, map_b_tiles: 128 rows (the 256 columns' operand
// tiles); map_c: 64 rows.
template <typename T, bool CTma>
__global__ void __launch_bounds__(kPpThreads, 1)
    sym_wgmma_wide_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                          const __grid_constant__ CUtensorMap map_a_tiles,
                          const __grid_constant__ CUtensorMap map_b_tiles, const __grid_constant__ CUtensorMap map_c,
                          const T* __restrict__ C, int64_t stride_c, T* __restrict__ D, int64_t stride_d, int m, int k,
                          float alpha, float beta, float diag, int64_t pairs_per_mat, int64_t total_pairs) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* cbuf = ring + size_t(kWideStages) * kWideStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(cbuf + (CTma ? 2 * kWideCBytes : 0));
  uint64_t *empty = full + kWideStages, *c_full = empty + kWideStages, *c_empty = c_full + 2;
  const bool c_by_tma = CTma && C != nullptr;
  const int t = (m + kBM - 1) / kBM;

  const int tid = threadIdx.x, wg = tid / 128;
  const int ktiles = (k + kBK - 1) / kBK;
  const int64_t my_units = 2 * items_of_cta(total_pairs);
  persistent_prologue([&] { init_pingpong_barriers<kWideStages>(full, empty, c_full, c_empty, 1); });

  if (wg == 2) {
    producer_registers();
    if (tid == 256) {
      int64_t g = 0;
      for (int64_t n = 0; n < my_units; ++n) {
        const PairUnit u = locate_wide(n, pairs_per_mat, t);
        // The second half of a ragged last block row can lie wholly past m, a box outside the
        // tensor. Its rows are never stored, so any rows in bounds do (row 0).
        const int row = u.row < m ? u.row : 0;
        if (c_by_tma) {  // unit n's C: four 64×64 boxes
          const int w = acquire_c_buffer(n, c_full, c_empty, static_cast<uint32_t>(kWideCBytes));
          for (int b = 0; b < 2; ++b)
            for (int x = 0; x < 2; ++x)
              tma_load(cbuf + w * kWideCBytes + b * kWideCHalfBytes + x * (kWideCHalfBytes / 2), &map_c, &c_full[w],
                       u.col[b] + 64 * x, row, u.z);
        }
        const CUtensorMap* first = u.transposed ? &map_b : &map_a;
        const CUtensorMap* second = u.transposed ? &map_a_tiles : &map_b_tiles;
        for (int kt = 0; kt < ktiles; ++kt, ++g) {
          const int s = acquire_stage<kWideStages>(g, full, empty, static_cast<uint32_t>(kWideStageBytes));
          unsigned char* a = ring + static_cast<size_t>(s) * kWideStageBytes;
          tma_load(a, first, &full[s], kt * kBK, row, u.z);
          tma_load(a + kWideATile, second, &full[s], kt * kBK, u.col[0], u.z);
          tma_load(a + kWideATile + kTileBytes, second, &full[s], kt * kBK, u.col[1], u.z);
        }
      }
    }
    return;
  }

  consumer_registers();
  const int w = wg, lt = tid % 128;
  for (int64_t n = w; n < my_units; n += 2) {
    const PairUnit u = locate_wide(n, pairs_per_mat, t);
    // As in ping-pong: the other warpgroup has issued the last wgmma of unit n - 1.
    if (n > 0) named_bar_sync(1 + w, 256);
    float acc[2][64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[0][i] = acc[1][i] = 0.0f;
    int64_t g = n * ktiles;
    auto release = [&](int s) {
      if (lt == 0) mbar_arrive(&empty[s]);
    };
    consume_ring<kWideStages>(
        full, ring, kWideStageBytes, ktiles, g,
        [&](const unsigned char* a) {
          const uint64_t da = smem_desc(a), db = smem_desc(a + kWideATile);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kBK / 16; ++kk) wgmma_m64n256k16<T>(acc, da + 2 * kk, db + 2 * kk, 1);
        },
        release);
    if (n + 1 < my_units) named_bar_arrive(1 + (1 - w), 256);  // the other warpgroup's turn
    wgmma_wait<0>();
    release(static_cast<int>((g - 1) % kWideStages));

    const unsigned char* cs = nullptr;
    if (c_by_tma) {
      cs = cbuf + w * kWideCBytes;
      wait_c_buffer(n, w, c_full);
    }
    const T* Cz = !CTma && C ? C + static_cast<int64_t>(u.z) * stride_c : nullptr;
    T* Dz = D + static_cast<int64_t>(u.z) * stride_d;
    store_half_lower_mirrored<T, kWideRows, true>(acc[0], cs, 0, Cz, Dz, m, u.row, u.col[0], alpha, beta, diag,
                                                  u.transposed);
    if (u.second)
      store_half_lower_mirrored<T, kWideRows, true>(acc[1], cs ? cs + kWideCHalfBytes : nullptr, 0, Cz, Dz, m, u.row,
                                                    u.col[1], alpha, beta, diag, u.transposed);
    if (c_by_tma) release_c_buffer(w, c_empty);
  }
}

// ---- Persistent cooperative kernel with m64n256k16 units (Design::CoopN256) ----
// Built as CUTLASS's cooperative Hopper GEMMs are: one CTA works on a 128×256 block with
// both consumer warpgroups at once, each on 64 rows × 256 columns with one m64n256k16 per
// 16-deep step. Against ping-pong (two m64n128k16 per step on a warpgroup's 128×128 tile) that
// cuts the shared-memory traffic per multiply-add twice over: the copy engine writes 24 KiB
// instead of 32 per 128·128·64 (the operand tile is shared by two tiles), and the tensor cores
// read 5120 operand elements instead of 6144 per 64·256·16 (each B row once per 64 rows, not
// per 64 rows of each of two tiles). The epilogue cannot hide under another tile's main loop (it
// is short next to a main loop of k ≥ 2048); the producer loads the next block's first stages
// meanwhile. The 256 columns are the pair kernel's tile pairs (lower_pair; taken in panels of 8
// block rows, lower_pair_in_panels, see pair_panel), so that every wave
// is full where ping-pong's is (4096²: 264 pairs, two waves of 132): a pair of block row i,
// tiles (i, j1) and (i, j2), is A's rows of block i against B's rows of blocks j1 and j2 (one
// stage: A's tile and the two B tiles side by side, the 256 rows m64n256k16 reads); a pair down
// block column 0 is computed transposed (B's block 0 against A's blocks i1 and i2: the mirrors
// (0, i1), (0, i2), stored in place above the diagonal and mirrored below, as in the wide
// kernel; C is symmetric by contract). A tile paired with itself is computed twice, stored
// once. β·C by TMA: the block's two C tiles, loaded once its first stages are queued and both
// warpgroups have read the previous block's. The epilogue goes through the two C tiles' slots
// and TMA stores (store_pair_tma), so D must be addressable by TMA (d_by_tma; elsewhere the
// launcher runs ping-pong). With the register epilogue, as first written, its scattered stores
// were as long as a 4k main loop, exposed (bench/results/2026-12-01-h200-coop-n256.md).
constexpr size_t kCoopN256StageBytes = size_t(3) * kTileBytes;  // first operand's tile, two tiles of the second
constexpr int kCoopN256Stages = 3;                              // 3 × 48 KiB and two 32 KiB tile buffers
// Barriers beside the ring's full[stages] and empty[stages]: c_full, c_empty, and the seven of
// the producer-stores epilogue (CoopN256StoreBarriers).
constexpr int kCoopN256OtherBarriers = 2 + 7;
// The shared memory of `stages` stages and `buffers` 32 KiB tile buffers. The product needs the
// two buffers; 4 stages fit only without them, which the main-loop probes use (does a deeper ring
// help the main loop? SYM_BENCH_N256=2's "4 stages" columns).
constexpr size_t coop_n256_smem_bytes(int stages, int buffers) {
  return 1024 + size_t(stages) * kCoopN256StageBytes + size_t(buffers) * kCTileBytes +
         (2 * size_t(stages) + kCoopN256OtherBarriers) * sizeof(uint64_t);
}
// The tile buffers an instance with `stages` stages has: the product's 2, none for the probes'
// other depths.
__host__ __device__ constexpr int coop_n256_buffers(int stages) { return stages == kCoopN256Stages ? 2 : 0; }
constexpr int kCoopN256DeepStages = 4;     // the probes' deeper ring
constexpr int kCoopN256ShallowStages = 2;  // and shallower one (room for 128 KiB of staging beside it)
static_assert(coop_n256_smem_bytes(kCoopN256Stages, 2) <= 227 * 1024,
              "the cooperative m64n256 kernel's shared memory exceeds 227 KiB");
static_assert(coop_n256_smem_bytes(kCoopN256DeepStages, 0) <= 227 * 1024, "the 4-stage probes' shared memory exceeds 227 KiB");

// The first pass of the m64n256 epilogue for tile b of pair unit u, this warpgroup's rows h0..:
// the tile staged in place in `buf` (its C's slot; a diagonal tile whole, with its transposes,
// stage_half_tma_diagonal), off the diagonal the values kept in acc for the mirror pass. Only
// tile (0, 0) of a pair computed transposed is on the diagonal and transposed (block row i's
// pairs never are); it is tile 0 (the pair (0, 0), (2, 0), or (0, 0) with itself).
template <typename T>
__device__ __forceinline__ void stage_pair_tile_in_place(float (&acc)[64], unsigned char* buf, const PairUnit& u, int b,
                                                         bool with_c, float alpha, float beta, float diag, int h0) {
  if (u.row != u.col[b]) tma_stage_blocks<T, TmaStage::InPlace>(acc, h0, buf, buf, with_c, alpha, beta);
  else if (b == 0 && u.transposed) stage_half_tma_diagonal<T, true>(acc, h0, buf, buf, with_c, alpha, beta, diag);
  else stage_half_tma_diagonal<T>(acc, h0, buf, buf, with_c, alpha, beta, diag);
}

// Tile b of a block is in the product (tile 1 is absent where the pair has one tile only), and
// has a mirror to store (it lies off the diagonal).
__device__ __forceinline__ bool pair_tile_present(const PairUnit& u, int b) { return b == 0 || u.second; }
__device__ __forceinline__ bool pair_tile_mirrored(const PairUnit& u, int b) {
  return pair_tile_present(u, b) && u.row != u.col[b];
}

// The epilogue of a block of the cooperative m64n256 kernel by TMA stores, consumer warpgroup w
// (acc[b]: rows 64w.. of tile b): tile b is staged in buffer b (C's slot, its C read in place
// as in store_tile_tma_one_buffer), rows 64w.. by warpgroup w, so that once both warpgroups have
// written one thread stores whole tiles; then, once the copy engine has read them, the
// off-diagonal tiles' transposes through the same buffers. A diagonal tile is staged whole in
// the first pass (stage_half_tma_diagonal: each warpgroup writes its rows' lower blocks and
// their transposes above the diagonal, which lie in rows the other warpgroup neither reads nor
// writes). Off the diagonal the tile and its mirror are both stored, so a pair computed
// transposed needs nothing else. The warpgroups meet at named barrier 1 (256 threads).
// wait_last: the storing thread waits until the engine has read the transposes and the
// warpgroups meet once more, so that the buffers are free on return (C is loaded into them
// next); otherwise that wait is left to the next block's epilogue (first thing) or the end of
// the kernel, and the stores run under the next main loop.
// Epi: Full; or a timing probe (InPlace: no transposes; StageOnly: no TMA stores).
template <typename T, EpilogueProbe Epi = EpilogueProbe::Full>
__device__ __forceinline__ void store_pair_tma(float (&acc)[2][64], unsigned char* cbuf, bool with_c, bool wait_last,
                                               const CUtensorMap* map_d, const PairUnit& u, float alpha, float beta,
                                               float diag, int w) {
  unsigned char* buf[2] = {cbuf, cbuf + kCTileBytes};
  const bool present[2] = {pair_tile_present(u, 0), pair_tile_present(u, 1)};
  const bool on_diag[2] = {u.row == u.col[0], u.row == u.col[1]};
  const int h0 = 64 * w;
  if (!wait_last) {  // the previous block's transposes have been read
    if (threadIdx.x == 0) bulk_wait_read();
    named_bar_sync(1, 256);
  }
  stage_pair_tile_in_place<T>(acc[0], buf[0], u, 0, with_c, alpha, beta, diag, h0);
  if (present[1]) stage_pair_tile_in_place<T>(acc[1], buf[1], u, 1, with_c, alpha, beta, diag, h0);
  fence_async_shared();
  named_bar_sync(1, 256);
  const bool mirrors = Epi != EpilogueProbe::InPlace && (!on_diag[0] || (present[1] && !on_diag[1]));
  if (threadIdx.x == 0) {
    if constexpr (Epi != EpilogueProbe::StageOnly)
      for (int b = 0; b < 2; ++b)
        if (present[b]) tma_store_tile(map_d, buf[b], u.col[b], u.row, u.z);
    bulk_commit();
    if (mirrors || wait_last) bulk_wait_read();
  }
  if (!mirrors) {
    if (wait_last) named_bar_sync(1, 256);
    return;
  }
  named_bar_sync(1, 256);  // the engine has read the buffers
  if (!on_diag[0]) tma_stage_blocks<T, TmaStage::Mirror>(acc[0], h0, buf[0], buf[0], false, alpha, beta);
  if (present[1] && !on_diag[1]) tma_stage_blocks<T, TmaStage::Mirror>(acc[1], h0, buf[1], buf[1], false, alpha, beta);
  fence_async_shared();
  named_bar_sync(1, 256);
  if (threadIdx.x == 0) {
    if constexpr (Epi != EpilogueProbe::StageOnly)
      for (int b = 0; b < 2; ++b)
        if (present[b] && !on_diag[b]) tma_store_tile(map_d, buf[b], u.row, u.col[b], u.z);
    bulk_commit();
    if (wait_last) bulk_wait_read();
  }
  if (wait_last) named_bar_sync(1, 256);
}

// The producer-stores epilogue of the m64n256 kernel (Design::CoopN256Producer):
// the same staging through the same two tile buffers as store_pair_tma, but the producer thread
// issues the TMA stores and waits for them, so that the consumer warpgroups never meet each other
// or wait for the copy engine at the end of a block: each warpgroup stages its rows and signals
// by an mbarrier, tile by tile, and waits only until the engine has read a tile's in-place
// stores before it writes that tile's mirror. With C, the producer loads the next block's C once
// the last stores have been read (c_full then also says the buffers are free); without C it
// signals buffers_free. Each barrier but in_read completes one phase per block (parity n & 1);
// in_read[b] completes one per mirrored tile b (a diagonal or absent tile has none, and nobody
// waits), its parity counted by each consumer thread (mirror_uses). No side can run a phase ahead
// of the other: a warpgroup stages block n + 1 only once the producer has finished block n,
// which it does only after every arrival of block n.
struct CoopN256StoreBarriers {
  uint64_t* staged_in;      // [2]: tile b staged in place (one arrival per consumer warpgroup)
  uint64_t* staged_mirror;  // [2]: tile b's mirror staged, or none to stage (the same)
  uint64_t* in_read;        // [2]: the engine has read tile b's in-place stores (the producer)
  uint64_t* buffers_free;   // without C: the buffers may take the next block (the producer)
};

// Consumer warpgroup w: stages both tiles of its block in place, then their mirrors (as
// store_pair_tma, without its meetings and waits). mirror_uses[b]: tile b's mirrors staged so far
// by this thread (in_read[b]'s phase).
template <typename T>
__device__ __forceinline__ void stage_pair_for_producer(float (&acc)[2][64], unsigned char* cbuf, bool with_c,
                                                        const PairUnit& u, uint32_t (&mirror_uses)[2], float alpha,
                                                        float beta, float diag, int w,
                                                        const CoopN256StoreBarriers& sb) {
  unsigned char* buf[2] = {cbuf, cbuf + kCTileBytes};
  const int h0 = 64 * w, lt = threadIdx.x % 128;
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    if (pair_tile_present(u, b)) {
      stage_pair_tile_in_place<T>(acc[b], buf[b], u, b, with_c, alpha, beta, diag, h0);
      fence_async_shared();
      named_bar_sync(3 + w, 128);
    }
    if (lt == 0) mbar_arrive(&sb.staged_in[b]);
  }
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    if (pair_tile_mirrored(u, b)) {
      mbar_wait(&sb.in_read[b], mirror_uses[b]++ & 1);
      tma_stage_blocks<T, TmaStage::Mirror>(acc[b], h0, buf[b], buf[b], false, alpha, beta);
      fence_async_shared();
      named_bar_sync(3 + w, 128);
    }
    if (lt == 0) mbar_arrive(&sb.staged_mirror[b]);
  }
}

// The producer thread, block n (unit u): each tile's in-place store once both warpgroups have
// staged it, then (once read) in_read where the tile has a mirror, then the mirrors' stores.
// Returns with the mirrors' stores in flight: the caller waits until they have been read before
// the buffers take anything else.
__device__ __forceinline__ void store_pair_for_consumers(const CUtensorMap* map_d, unsigned char* cbuf,
                                                         const PairUnit& u, int64_t n,
                                                         const CoopN256StoreBarriers& sb) {
  unsigned char* buf[2] = {cbuf, cbuf + kCTileBytes};
  const uint32_t parity = static_cast<uint32_t>(n & 1);
  for (int b = 0; b < 2; ++b) {
    mbar_wait(&sb.staged_in[b], parity);
    if (pair_tile_present(u, b)) tma_store_tile(map_d, buf[b], u.col[b], u.row, u.z);
    bulk_commit();
  }
  bulk_wait_read<1>();  // tile 0's group (tile 1's may still be reading)
  if (pair_tile_mirrored(u, 0)) mbar_arrive(&sb.in_read[0]);
  bulk_wait_read<0>();
  if (pair_tile_mirrored(u, 1)) mbar_arrive(&sb.in_read[1]);
  for (int b = 0; b < 2; ++b) {
    mbar_wait(&sb.staged_mirror[b], parity);
    if (pair_tile_mirrored(u, b)) tma_store_tile(map_d, buf[b], u.row, u.col[b], u.z);
  }
  bulk_commit();
}

// CTma: C is given (and loaded by TMA, as d_by_tma requires). Epi: Full, or a timing probe
// (EpilogueProbe; without C only).
// Stages: kCoopN256Stages with the two tile buffers, or (the MainLoop and LoadsOnly probes only)
// kCoopN256DeepStages or kCoopN256ShallowStages without them.
// ProducerStores: the epilogue's stores issued and waited for by the producer thread
// (stage_pair_for_producer, store_pair_for_consumers; the product only), else by the consumers
// (store_pair_tma).
template <typename T, bool CTma, EpilogueProbe Epi = EpilogueProbe::Full, int Stages = kCoopN256Stages,
          bool ProducerStores = false>
__global__ void __launch_bounds__(kPpThreads, 1)
    sym_wgmma_coop_n256_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                               const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_d,
                               int m, int k, float alpha, float beta, float diag, int64_t pairs_per_mat,
                               int64_t total_pairs, int panel) {
  constexpr int kS = Stages;
  constexpr int kBuffers = coop_n256_buffers(Stages);
  static_assert(kBuffers == 2 || ((Epi == EpilogueProbe::MainLoop || Epi == EpilogueProbe::LoadsOnly) && !CTma),
                "only the main-loop probes run without the tile buffers");
  static_assert(!ProducerStores || (Epi == EpilogueProbe::Full && kBuffers == 2),
                "the producer-stores epilogue has no probes");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* cbuf = ring + size_t(kS) * kCoopN256StageBytes;  // the block's two C tiles, then its staged D tiles
  uint64_t* full = reinterpret_cast<uint64_t*>(cbuf + kBuffers * kCTileBytes);
  uint64_t* empty = full + kS;
  uint64_t* c_full = empty + kS;  // this block's C tiles have landed
  uint64_t* c_empty = c_full + 1;  // both warpgroups have read the previous block's C
  const CoopN256StoreBarriers sb{c_empty + 1, c_empty + 3, c_empty + 5, c_empty + 7};
  constexpr bool c_by_tma = CTma;
  const int t = (m + kBM - 1) / kBM;

  const int tid = threadIdx.x, wg = tid / 128;
  const int ktiles = (k + kBK - 1) / kBK;
  const int64_t my_pairs = items_of_cta(total_pairs);
  persistent_prologue([&] {
    init_coop_barriers<kS>(full, empty, c_full, c_empty, [&] {
      if constexpr (ProducerStores) {
        for (int b = 0; b < 2; ++b) {
          mbar_init(&sb.staged_in[b], 2);
          mbar_init(&sb.staged_mirror[b], 2);
          mbar_init(&sb.in_read[b], 1);
        }
        mbar_init(sb.buffers_free, 1);
      }
    });
  });

  if (wg == 2) {
    producer_registers();
    if (tid == 256) {
      int64_t g = 0;
      const int first_stages = ktiles < kS ? ktiles : kS;
      // ProducerStores: the previous block's stores once this block's first stages are queued
      // (the ring is then full until the consumers are through that epilogue), and the buffers
      // refilled halfway through this block's loads, by when those stores have long been read.
      const int refill_kt = ktiles / 2 > first_stages - 1 ? ktiles / 2 : first_stages - 1;
      PairUnit prev{};
      for (int64_t n = 0; n < my_pairs; ++n) {
        const PairUnit u = locate_pair_unit(blockIdx.x + n * gridDim.x, pairs_per_mat, t, 0, panel);
        const CUtensorMap* first = u.transposed ? &map_b : &map_a;
        const CUtensorMap* second = u.transposed ? &map_a : &map_b;
        auto load_block_c = [&] {
          mbar_expect_tx(c_full, static_cast<uint32_t>(2 * kCTileBytes));
          for (int b = 0; b < 2; ++b) tma_load_tile(cbuf + b * kCTileBytes, &map_c, c_full, u.col[b], u.row, u.z);
        };
        for (int kt = 0; kt < ktiles; ++kt, ++g) {
          const int s = acquire_stage<kS>(g, full, empty, static_cast<uint32_t>(kCoopN256StageBytes));
          unsigned char* a = ring + static_cast<size_t>(s) * kCoopN256StageBytes;
          tma_load(a, first, &full[s], kt * kBK, u.row, u.z);
          tma_load(a + kTileBytes, second, &full[s], kt * kBK, u.col[0], u.z);
          tma_load(a + 2 * kTileBytes, second, &full[s], kt * kBK, u.col[1], u.z);
          if constexpr (ProducerStores) {
            if (n > 0 && kt == first_stages - 1) store_pair_for_consumers(&map_d, cbuf, prev, n - 1, sb);
            if (kt == refill_kt) {
              bulk_wait_read<0>();  // the previous block's mirrors
              if (c_by_tma)
                load_block_c();
              else
                mbar_arrive(sb.buffers_free);
            }
          } else if (c_by_tma && kt == first_stages - 1) {
            if (n > 0) mbar_wait(c_empty, static_cast<uint32_t>((n - 1) & 1));
            load_block_c();
          }
        }
        prev = u;
      }
      if constexpr (ProducerStores) {
        if (my_pairs > 0) store_pair_for_consumers(&map_d, cbuf, prev, my_pairs - 1, sb);
        // Complete (not only read) before the CTA's shared memory goes away.
        ORTHOPT_SM90A_ASM("cp.async.bulk.wait_group 0;\n" ::: "memory");
      }
    }
    return;
  }

  consumer_registers();
  const int w = wg, lt = tid % 128;
  auto release = [&](int s) {
    if (lt == 0) mbar_arrive(&empty[s]);
  };
  int64_t g = 0;
  uint32_t mirror_uses[2] = {0, 0};  // ProducerStores: in_read's phases
  for (int64_t n = 0; n < my_pairs; ++n) {
    const PairUnit u = locate_pair_unit(blockIdx.x + n * gridDim.x, pairs_per_mat, t, 0, panel);
    float acc[2][64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[0][i] = acc[1][i] = 0.0f;
    consume_ring<kS>(
        full, ring, kCoopN256StageBytes, ktiles, g,
        [&](const unsigned char* a) {
          // This warpgroup's 64 rows of the first tile; the two second tiles as 256 rows.
          const uint64_t da = smem_desc(a + w * 64 * kBK * 2), db = smem_desc(a + kTileBytes);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kBK / 16; ++kk) wgmma_m64n256k16<T>(acc, da + 2 * kk, db + 2 * kk, 1);
        },
        release);
    wgmma_wait<0>();
    release(static_cast<int>((g - 1) % kS));
    if constexpr (ProducerStores) {
      // The buffers hold this block's C, or nothing the engine still reads.
      mbar_wait(c_by_tma ? c_full : sb.buffers_free, static_cast<uint32_t>(n & 1));
      stage_pair_for_producer<T>(acc, cbuf, c_by_tma, u, mirror_uses, alpha, beta, diag, w, sb);
      continue;
    }
    if (c_by_tma) mbar_wait(c_full, static_cast<uint32_t>(n & 1));
    if constexpr (Epi == EpilogueProbe::MainLoop) {
      // A branch the probe never takes (alpha != 0) reads the accumulators, so that ptxas keeps
      // the wgmmas: the epilogue where there are tile buffers, else a sum and a trap.
      if constexpr (kBuffers == 2) {
        if (alpha == 0.0f) store_pair_tma<T>(acc, cbuf, c_by_tma, c_by_tma, &map_d, u, alpha, beta, diag, w);
      } else if (alpha == 0.0f && lt == 0) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 64; ++i) sum += acc[0][i] + acc[1][i];
        if (sum == 1.2345f) ORTHOPT_SM90A_ASM("trap;\n");
      }
    } else if constexpr (Epi != EpilogueProbe::LoadsOnly) {
      store_pair_tma<T, Epi>(acc, cbuf, c_by_tma, /*wait_last=*/c_by_tma, &map_d, u, alpha, beta, diag, w);
    }
    // The warpgroup goes on to its next block together (and, with C, has read its C tiles).
    named_bar_sync(3 + w, 128);
    if (c_by_tma && lt == 0) mbar_arrive(c_empty);
  }
  // Stores still in flight (without C) complete before the CTA's shared memory goes away.
  if (!ProducerStores && tid == 0) ORTHOPT_SM90A_ASM("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda, so
// binaries still load on machines without a driver).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

orthopt_status encode_tiled(EncodeTiled* out) {
  static EncodeTiled fn = nullptr;
  if (!fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    ORTHOPT_CUDA_TRY(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !p)
      return fail(ORTHOPT_ERR_CUDA, "lab sym_abt: cuTensorMapEncodeTiled is not available from the driver");
    fn = reinterpret_cast<EncodeTiled>(p);
  }
  *out = fn;
  return ORTHOPT_OK;
}

// The map of a batch of row-major [m, k] operands, boxes of box_rows rows × kBK columns, 128-byte
// swizzle.
orthopt_status make_map(CUtensorMap* map, orthopt_dtype dtype, const void* base, int64_t batch, int64_t m, int64_t k,
                        int64_t stride, int box_rows = kBM) {
  EncodeTiled encode = nullptr;
  ORTHOPT_STATUS_TRY(encode_tiled(&encode));
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(m), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(k) * 2, static_cast<cuuint64_t>(stride) * 2};  // bytes
  const cuuint32_t box[3] = {kBK, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, dtype == ORTHOPT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            3, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return fail(ORTHOPT_ERR_CUDA, "lab sym_abt: cuTensorMapEncodeTiled failed (%d)", int(r));
  return ORTHOPT_OK;
}

// Once per thread, device and kernel (each instantiation has its own statics): allow the kernel's
// dynamic shared memory above the 48 KiB default, and look up the multiprocessor count, which a
// driver query on every launch (one per NS product) would cost on the hot path.
template <auto Kernel>
orthopt_status configure_once(size_t smem_bytes, int* sm_count) {
  static thread_local int configured_device = -1, device_sms = 0;
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  if (configured_device != device) {
    ORTHOPT_CUDA_TRY(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_bytes)));
    ORTHOPT_CUDA_TRY(cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, device));
    configured_device = device;
  }
  if (sm_count) *sm_count = device_sms;
  return ORTHOPT_OK;
}

template <typename T>
orthopt_status launch(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A, int64_t stride_a,
                      const void* B, int64_t stride_b, float alpha, const void* C, int64_t stride_c, float beta,
                      float diag, void* D, int64_t stride_d, cudaStream_t stream) {
  ORTHOPT_STATUS_TRY(configure_once<sym_wgmma_kernel<T>>(kSmemBytes, nullptr));
  CUtensorMap map_a, map_b;
  ORTHOPT_STATUS_TRY(make_map(&map_a, dtype, A, batch, m, k, stride_a));
  ORTHOPT_STATUS_TRY(make_map(&map_b, dtype, B, batch, m, k, stride_b));
  const int64_t t = (m + kBM - 1) / kBM;
  dim3 grid(static_cast<unsigned>(t * (t + 1) / 2), static_cast<unsigned>(batch));
  sym_wgmma_kernel<T><<<grid, kThreads, kSmemBytes, stream>>>(map_a, map_b, static_cast<const T*>(C), stride_c,
                                                               static_cast<T*>(D), stride_d, static_cast<int>(m),
                                                               static_cast<int>(k), alpha, beta, diag);
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

// The cooperative m64n256 kernels' pair order: panels of g_pair_panel block rows
// (lower_pair_in_panels; 8, the shipped kernel's: bench/results/2026-12-02-h200-direct-result.md),
// 0 the row-major order; set_pair_panel changes it (A/B timings).
int g_pair_panel = 8;
int pair_panel() { return g_pair_panel; }

// Whether the persistent kernels are launched as programmatic dependents of the kernel before
// them (wait_for_previous_grid): yes unless ORTHOPT_SYM_PDL=0 (A/B timings).
bool programmatic_launch() {
  static const bool on = [] {
    const char* v = std::getenv("ORTHOPT_SYM_PDL");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// A persistent kernel (kPpThreads threads) on min(work items, SMs) CTAs, each walking a stride
// of the work list, launched as a programmatic dependent (every such kernel starts with
// persistent_prologue, which waits for the previous grid).
template <auto Kernel, typename... Args>
orthopt_status launch_one_per_sm(size_t smem_bytes, int64_t items, cudaStream_t stream, Args... args) {
  int sm_count = 0;
  ORTHOPT_STATUS_TRY(configure_once<Kernel>(smem_bytes, &sm_count));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(items < sm_count ? items : sm_count));
  config.blockDim = dim3(kPpThreads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = programmatic_launch() ? 1 : 0;
  ORTHOPT_CUDA_TRY(cudaLaunchKernelEx(&config, Kernel, args...));
  return ORTHOPT_OK;
}

// C by TMA where TMA can address it (m % 8 == 0, 16-byte aligned base and batch stride): a batch
// of [m, m] operands in boxes of 128 rows × 64 columns, *by_tma set. Otherwise (or without C) the
// kernels read C from global memory, and *map_c is a zeroed, unused parameter.
orthopt_status make_c_map(CUtensorMap* map_c, bool* by_tma, orthopt_dtype dtype, const void* C, int64_t batch,
                          int64_t m, int64_t stride_c, int box_rows = kBM) {
  *by_tma = C && m % 8 == 0 && (reinterpret_cast<uintptr_t>(C) % 16) == 0 && stride_c % 8 == 0;
  if (!*by_tma) {
    *map_c = CUtensorMap{};
    return ORTHOPT_OK;
  }
  return make_map(map_c, dtype, C, batch, m, m, stride_c, box_rows);
}

// Whether the epilogue can store D by TMA (Design::PingPongTma): rows of 16-byte
// multiples, a 16-byte aligned base and batch stride, and C absent or loaded by TMA too.
bool d_by_tma(const void* D, int64_t m, int64_t stride_d, const void* C, bool c_by_tma) {
  return m % 8 == 0 && (reinterpret_cast<uintptr_t>(D) % 16) == 0 && stride_d % 8 == 0 && (!C || c_by_tma);
}

// The persistent kernels (ping-pong over 128×128 tiles, or cooperative over 128×256 wide tiles):
// one grid of min(tiles, SMs) CTAs of the kernel instance for this C path. TmaBuffers (ping-pong
// only, 1 or 2): the epilogue by TMA stores where d_by_tma() allows, the register epilogue
// elsewhere.
template <typename T, bool Coop, EpilogueProbe Epi = EpilogueProbe::Full, int TmaBuffers = 0>
orthopt_status launch_persistent(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                                 int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                                 int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                                 cudaStream_t stream) {
  CUtensorMap map_a, map_b, map_c;
  ORTHOPT_STATUS_TRY(make_map(&map_a, dtype, A, batch, m, k, stride_a));
  ORTHOPT_STATUS_TRY(make_map(&map_b, dtype, B, batch, m, k, stride_b));
  bool c_by_tma = false;
  ORTHOPT_STATUS_TRY(make_c_map(&map_c, &c_by_tma, dtype, C, batch, m, stride_c));
  const int64_t t = (m + kBM - 1) / kBM, per_matrix = Coop ? wide_tiles(t) : t * (t + 1) / 2;
  const int64_t total = per_matrix * batch;
  CUtensorMap map_d{};
  const bool tma_store = TmaBuffers > 0 && d_by_tma(D, m, stride_d, C, c_by_tma);
  if (tma_store) ORTHOPT_STATUS_TRY(make_map(&map_d, dtype, D, batch, m, m, stride_d));
  auto run = [&](auto c_tma, auto by_tma_store) -> orthopt_status {
    constexpr bool kCByTma = decltype(c_tma)::value;
    const T* c = static_cast<const T*>(C);
    T* d = static_cast<T*>(D);
    const int mi = static_cast<int>(m), ki = static_cast<int>(k);
    if constexpr (Coop) {
      return launch_one_per_sm<sym_wgmma_coop_kernel<T, kCByTma, Epi>>(coop_smem_bytes<kCByTma>(), total, stream,
                                                                       map_a, map_b, map_c, c, stride_c, d, stride_d,
                                                                       mi, ki, alpha, beta, diag, per_matrix, total);
    } else {
      constexpr int kBuffers = decltype(by_tma_store)::value ? TmaBuffers : 0;
      return launch_one_per_sm<sym_wgmma_pingpong_kernel<T, kCByTma, Epi, kBuffers>>(
          PpLayout<kCByTma, kBuffers>::smem_bytes, total, stream, map_a, map_b, map_c, map_d, c, stride_c, d, stride_d,
          mi, ki, alpha, beta, diag, per_matrix, total);
    }
  };
  if (tma_store) {
    if constexpr (TmaBuffers > 0 && !Coop)
      ORTHOPT_STATUS_TRY(c_by_tma ? run(std::true_type{}, std::true_type{}) : run(std::false_type{}, std::true_type{}));
  } else {
    ORTHOPT_STATUS_TRY(c_by_tma ? run(std::true_type{}, std::false_type{}) : run(std::false_type{}, std::false_type{}));
  }
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

// The launch configuration of the pair kernel: clusters of kPairCtas CTAs along x (attr holds
// the attribute and must outlive the configuration); gridDim is the caller's.
cudaLaunchConfig_t pair_config(cudaLaunchAttribute* attr, size_t smem_bytes, cudaStream_t stream) {
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = kPairCtas;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(kPpThreads);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// How many clusters of this pair kernel instance fit on the current device at once
// (cudaOccupancyMaxActiveClusters), once per thread, device and instance.
template <auto Kernel>
orthopt_status max_pair_clusters(size_t smem_bytes, int* out) {
  int sm_count = 0;
  ORTHOPT_STATUS_TRY(configure_once<Kernel>(smem_bytes, &sm_count));
  static thread_local int queried_device = -1, clusters = 0;
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  if (queried_device != device) {
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = pair_config(&attr, smem_bytes, nullptr);
    cfg.gridDim = dim3(static_cast<unsigned>(sm_count / kPairCtas * kPairCtas));
    ORTHOPT_CUDA_TRY(cudaOccupancyMaxActiveClusters(&clusters, Kernel, &cfg));
    if (clusters < 1) return fail(ORTHOPT_ERR_CUDA, "lab sym_abt: no cluster of 2 CTAs fits for the pair kernel");
    queried_device = device;
  }
  *out = clusters;
  return ORTHOPT_OK;
}

// The pair kernel: as many clusters as fit at once, each walking a stride of the pair list.
template <typename T, bool CTma>
orthopt_status launch_pair_instance(const CUtensorMap& map_a, const CUtensorMap& map_b, const CUtensorMap& map_c,
                                    const T* C, int64_t stride_c, T* D, int64_t stride_d, int m, int k, float alpha,
                                    float beta, float diag, int64_t per_matrix, int64_t total, cudaStream_t stream) {
  constexpr auto kernel = sym_wgmma_pair_kernel<T, CTma>;
  constexpr size_t smem_bytes = PpLayout<CTma>::smem_bytes;
  int max_clusters = 0;
  ORTHOPT_STATUS_TRY(max_pair_clusters<kernel>(smem_bytes, &max_clusters));
  const int64_t clusters = total < max_clusters ? total : max_clusters;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = pair_config(&attr, smem_bytes, stream);
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * kPairCtas));
  ORTHOPT_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, map_a, map_b, map_c, C, stride_c, D, stride_d, m, k, alpha, beta,
                                      diag, per_matrix, total));
  return ORTHOPT_OK;
}

template <typename T>
orthopt_status launch_pair(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A, int64_t stride_a,
                           const void* B, int64_t stride_b, float alpha, const void* C, int64_t stride_c, float beta,
                           float diag, void* D, int64_t stride_d, cudaStream_t stream) {
  CUtensorMap map_a, map_b, map_c;
  ORTHOPT_STATUS_TRY(make_map(&map_a, dtype, A, batch, m, k, stride_a, kBM / 2));
  ORTHOPT_STATUS_TRY(make_map(&map_b, dtype, B, batch, m, k, stride_b, kBM / 2));
  bool c_by_tma = false;
  ORTHOPT_STATUS_TRY(make_c_map(&map_c, &c_by_tma, dtype, C, batch, m, stride_c));
  const int64_t per_matrix = pairs_per_matrix((m + kBM - 1) / kBM), total = per_matrix * batch;
  const T* c = static_cast<const T*>(C);
  T* d = static_cast<T*>(D);
  const int mi = static_cast<int>(m), ki = static_cast<int>(k);
  if (c_by_tma)
    return launch_pair_instance<T, true>(map_a, map_b, map_c, c, stride_c, d, stride_d, mi, ki, alpha, beta, diag,
                                         per_matrix, total, stream);
  return launch_pair_instance<T, false>(map_a, map_b, map_c, c, stride_c, d, stride_d, mi, ki, alpha, beta, diag,
                                        per_matrix, total, stream);
}

// The wide kernel: one grid of min(pairs, SMs) CTAs, each walking a stride of the pair list.
template <typename T>
orthopt_status launch_wide(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A, int64_t stride_a,
                           const void* B, int64_t stride_b, float alpha, const void* C, int64_t stride_c, float beta,
                           float diag, void* D, int64_t stride_d, cudaStream_t stream) {
  CUtensorMap map_a, map_b, map_a_tiles, map_b_tiles, map_c;
  ORTHOPT_STATUS_TRY(make_map(&map_a, dtype, A, batch, m, k, stride_a, kWideRows));
  ORTHOPT_STATUS_TRY(make_map(&map_b, dtype, B, batch, m, k, stride_b, kWideRows));
  ORTHOPT_STATUS_TRY(make_map(&map_a_tiles, dtype, A, batch, m, k, stride_a));
  ORTHOPT_STATUS_TRY(make_map(&map_b_tiles, dtype, B, batch, m, k, stride_b));
  bool c_by_tma = false;
  ORTHOPT_STATUS_TRY(make_c_map(&map_c, &c_by_tma, dtype, C, batch, m, stride_c, kWideRows));
  const int64_t per_matrix = pairs_per_matrix((m + kBM - 1) / kBM), total = per_matrix * batch;
  auto run = [&](auto c_tma) -> orthopt_status {
    constexpr bool kCByTma = decltype(c_tma)::value;
    return launch_one_per_sm<sym_wgmma_wide_kernel<T, kCByTma>>(
        wide_smem_bytes<kCByTma>(), total, stream, map_a, map_b, map_a_tiles, map_b_tiles, map_c,
        static_cast<const T*>(C), stride_c, static_cast<T*>(D), stride_d, static_cast<int>(m), static_cast<int>(k),
        alpha, beta, diag, per_matrix, total);
  };
  ORTHOPT_STATUS_TRY(c_by_tma ? run(std::true_type{}) : run(std::false_type{}));
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

// The cooperative m64n256 kernel: one grid of min(pairs, SMs) CTAs, each walking a stride of the
// pair list; ping-pong (register epilogue) where D cannot be stored by TMA. Epi: a timing probe
// (without C) or the product. ProducerStores: the epilogue's stores by the producer thread
// (Design::CoopN256Producer).
template <typename T, EpilogueProbe Epi = EpilogueProbe::Full, int Stages = kCoopN256Stages,
          bool ProducerStores = false>
orthopt_status launch_coop_n256(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                                int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                                int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                                cudaStream_t stream) {
  CUtensorMap map_a, map_b, map_c;
  ORTHOPT_STATUS_TRY(make_map(&map_a, dtype, A, batch, m, k, stride_a));
  ORTHOPT_STATUS_TRY(make_map(&map_b, dtype, B, batch, m, k, stride_b));
  bool c_by_tma = false;
  ORTHOPT_STATUS_TRY(make_c_map(&map_c, &c_by_tma, dtype, C, batch, m, stride_c));
  constexpr bool kProbe = Epi != EpilogueProbe::Full;
  if (kProbe && C)
    return fail(ORTHOPT_ERR_INVALID, "sym_epilogue_probe: the m64n256 kernel's probes take no C");
  if (!d_by_tma(D, m, stride_d, C, c_by_tma)) {
    if (kProbe) return fail(ORTHOPT_ERR_INVALID, "sym_epilogue_probe: D is not addressable by TMA");
    return launch_persistent<T, false>(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D,
                                       stride_d, stream);
  }
  const int64_t per_matrix = pairs_per_matrix((m + kBM - 1) / kBM), total = per_matrix * batch;
  CUtensorMap map_d;
  ORTHOPT_STATUS_TRY(make_map(&map_d, dtype, D, batch, m, m, stride_d));
  auto run = [&](auto c_tma) -> orthopt_status {
    constexpr bool kCByTma = decltype(c_tma)::value;
    constexpr size_t kSmem = coop_n256_smem_bytes(Stages, coop_n256_buffers(Stages));
    return launch_one_per_sm<sym_wgmma_coop_n256_kernel<T, kCByTma, Epi, Stages, ProducerStores>>(
        kSmem, total, stream, map_a, map_b, map_c, map_d, static_cast<int>(m), static_cast<int>(k), alpha, beta, diag,
        per_matrix, total, pair_panel());
  };
  if constexpr (kProbe) ORTHOPT_STATUS_TRY(run(std::false_type{}));  // no C-by-TMA instance of the probes
  else ORTHOPT_STATUS_TRY(c_by_tma ? run(std::true_type{}) : run(std::false_type{}));
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

}  // namespace

void set_pair_panel(int rows) { g_pair_panel = rows > 0 ? rows : 0; }

int pair_clusters() {
  int clusters = 0;
  constexpr auto kernel = sym_wgmma_pair_kernel<__nv_bfloat16, false>;
  return max_pair_clusters<kernel>(PpLayout<false>::smem_bytes, &clusters) == ORTHOPT_OK ? clusters : 0;
}

bool wgmma_supported(int64_t k, const void* A, int64_t stride_a, const void* B, int64_t stride_b, const char** why) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    *why = "cannot query the current device";
    return false;
  }
  if (major != 9 || minor != 0) {
    *why = "needs a Hopper GPU (compute capability 9.0: wgmma, TMA)";
    return false;
  }
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, sym_wgmma_kernel<__nv_bfloat16>) != cudaSuccess || attr.binaryVersion != 90) {
    *why = "was not built for sm_90a (CMAKE_CUDA_ARCHITECTURES=90a)";
    return false;
  }
  return operands_in_16_byte_rows(k, A, stride_a, B, stride_b, why);
}

orthopt_status sym_abt_wgmma(orthopt_dtype dtype, Design path, int64_t batch, int64_t m, int64_t k,
                             const void* A, int64_t stride_a, const void* B, int64_t stride_b, float alpha,
                             const void* C, int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                             cudaStream_t stream) {
  auto run = [&](auto launcher) {
    return launcher(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D, stride_d, stream);
  };
  auto by_path = [&](auto elem) {
    using T = decltype(elem);
    if (path == Design::Pair) return run(launch_pair<T>);
    if (path == Design::Wide) return run(launch_wide<T>);
    if (path == Design::Coop) return run(launch_persistent<T, true>);
    if (path == Design::CoopN256) return run(launch_coop_n256<T>);
    if (path == Design::CoopN256Producer)
      return run(launch_coop_n256<T, EpilogueProbe::Full, kCoopN256Stages, /*ProducerStores=*/true>);
    if (path == Design::PingPong) return run(launch_persistent<T, false>);
    if (path == Design::PingPongTma)
      return run(launch_persistent<T, false, EpilogueProbe::Full, /*TmaBuffers=*/2>);
    if (path == Design::PingPongTma1Buf)
      return run(launch_persistent<T, false, EpilogueProbe::Full, /*TmaBuffers=*/1>);
    return run(launch<T>);
  };
  return dtype == ORTHOPT_BF16 ? by_path(__nv_bfloat16{}) : by_path(__half{});
}

orthopt_status sym_epilogue_probe(Design path, int stores, int64_t batch, int64_t m, int64_t k,
                                            const void* A, int64_t stride_a, const void* B, int64_t stride_b,
                                            float alpha, const void* C, int64_t stride_c, float beta, float diag,
                                            void* D, int64_t stride_d, cudaStream_t stream) {
  if (path != Design::PingPong && path != Design::Coop && path != Design::CoopN256)
    return fail(ORTHOPT_ERR_INVALID,
                "sym_epilogue_probe: path must be WGMMA_PINGPONG, WGMMA_COOP or WGMMA_COOP_N256");
  using T = __nv_bfloat16;
  auto run = [&](auto launcher) {
    return launcher(ORTHOPT_BF16, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D, stride_d,
                    stream);
  };
  if (path == Design::CoopN256) {
    switch (stores) {
      case 0: return run(launch_coop_n256<T>);
      case 1: return run(launch_coop_n256<T, EpilogueProbe::InPlace>);
      case 2: return run(launch_coop_n256<T, EpilogueProbe::LoadsOnly>);
      case 3: return run(launch_coop_n256<T, EpilogueProbe::StageOnly>);
      case 4: return run(launch_coop_n256<T, EpilogueProbe::MainLoop>);
      case 5: return run(launch_coop_n256<T, EpilogueProbe::MainLoop, kCoopN256DeepStages>);
      case 6: return run(launch_coop_n256<T, EpilogueProbe::LoadsOnly, kCoopN256DeepStages>);
      case 7: return run(launch_coop_n256<T, EpilogueProbe::MainLoop, kCoopN256ShallowStages>);
      default: return fail(ORTHOPT_ERR_INVALID, "sym_epilogue_probe: stores must be 0 to 7 for WGMMA_COOP_N256");
    }
  }
  const bool coop = path == Design::Coop;
  switch (stores) {
    case 0: return coop ? run(launch_persistent<T, true>) : run(launch_persistent<T, false>);
    case 1:
      return coop ? run(launch_persistent<T, true, EpilogueProbe::InPlace>)
                  : run(launch_persistent<T, false, EpilogueProbe::InPlace>);
    case 2:
      return coop ? run(launch_persistent<T, true, EpilogueProbe::LoadsOnly>)
                  : run(launch_persistent<T, false, EpilogueProbe::LoadsOnly>);
    default: return fail(ORTHOPT_ERR_INVALID, "sym_epilogue_probe: stores must be 0, 1 or 2");
  }
}

}  // namespace orthopt_lab

// The persistent Hopper symmetric product D = α·A·Bᵀ + β·C + diag·I (wgmma + TMA, sm_90a): the
// kernel orthopt_sym_abt's ORTHOPT_SYM_PERSISTENT path runs, and AUTO takes where it is fastest.
// Only the lower-triangle 128×128 tiles are computed; each off-diagonal tile is written twice
// (in place and mirrored), so D is exactly symmetric. The tiles run on Hopper's warpgroup
// tensor-core instructions, fed by the bulk tensor copy engine (TMA), with the 128-byte swizzle
// that TMA writes and wgmma reads (rows of 64 bf16/fp16 = 128 bytes); TMA zero-fills rows past
// m and columns past k, so ragged shapes need no special case.
//
// The kernel (sym_wgmma_coop_n256_kernel): one CTA per multiprocessor walks pairs of lower tiles
// that share an operand tile; both consumer warpgroups work on each pair, each on 64 rows × 256
// columns with one wgmma m64n256k16 per step, and the producer thread issues the TMA loads and
// the epilogue's TMA stores. Where D cannot be stored by TMA (m % 8 != 0, misaligned D) the
// persistent ping-pong kernel with a register epilogue runs instead (sym_wgmma_pingpong_kernel).
// Why this design and the alternatives measured: docs/decisions/symmetric-product-kernels.md;
// the alternatives themselves, runnable: lab/sym.
#include <cuda.h>  // CUtensorMap and the cuTensorMapEncodeTiled signature (called via the runtime)

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "sym_tiles.h"

namespace orthopt_k {
namespace {

constexpr int kBM = 128;       // tile edge
constexpr int kBK = 64;        // k per stage: 64 × 2 bytes = one 128-byte swizzle row
constexpr int kTileBytes = kBM * kBK * 2;  // one operand tile per stage (16 KiB)

// wgmma, TMA and mbarrier transaction counts exist only in sm_90a code; other targets (a build
// for another GPU) get traps, and the host refuses to launch there (persistent_supported).
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

// ---- The fallback: persistent ping-pong kernel with a register epilogue ----
// One CTA per multiprocessor loops over the lower 128×128 tiles (tile t of the flattened
// batch × tiles list goes to CTA t mod grid). The producer runs through the CTA's tiles
// without stopping, so the next tile's first stages load while a tile finishes. Each consumer
// warpgroup owns whole tiles, every other one of the CTA's list (two m64n128k16 per 16-deep
// step, 128 fp32 accumulators per thread), and the two take turns on the tensor cores: a
// warpgroup starts its main loop once the other has issued its last wgmma (named barriers
// 1 and 2), so one warpgroup's epilogue runs under the other's main loop.
// The epilogue works in registers: the rounded pair of each accumulator 8×8 block is stored in
// place, then transposed inside the warp (movmatrix: the mma fragment layout in, the same
// layout of the transpose out) and stored mirrored, with no shared staging buffer, so it needs
// no TMA-addressable D. β·C: the producer loads each tile's C by TMA into the owning
// warpgroup's C buffer while the tile's main loop runs (read from global memory in the
// epilogue, C made the epilogue longer than the other warpgroup's main loop).
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
// pair at (r, c), c even. A 128×128 tile is two boxes of 128 rows.
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
// below the diagonal. C from the shared 128×128 tile Cs (these rows from row c_row0 on) when
// given, else from Cz (this matrix's C in global memory, or NULL); Dz: this matrix's D.
template <typename T>
__device__ __forceinline__ void store_half_lower_mirrored(const float (&acc)[64], const unsigned char* Cs, int c_row0,
                                                          const T* __restrict__ Cz, T* __restrict__ Dz, int m, int row0,
                                                          int col0, float alpha, float beta, float diag) {
  // Whether D's (r, c) lies on or below the diagonal.
  auto keep = [&](int r, int c) { return c <= r; };
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
          cp = c_tile_pair<T>(Cs, c_row0 + r, c);
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
template <typename T>
__device__ __forceinline__ void store_tile_lower_mirrored(const float (&acc0)[64], const float (&acc1)[64],
                                                          const unsigned char* Cs, const T* __restrict__ Cz,
                                                          T* __restrict__ Dz, int m, int row0, int col0, float alpha,
                                                          float beta, float diag) {
  store_half_lower_mirrored<T>(acc0, Cs, 0, Cz, Dz, m, row0, col0, alpha, beta, diag);
  store_half_lower_mirrored<T>(acc1, Cs, 64, Cz, Dz, m, row0 + 64, col0, alpha, beta, diag);
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
// epilogue, four 8×8 blocks per instruction: matrix k = 2·dj + half of step jj is the block at
// rows h0 + 16·warp + 8·half, columns 8·(2·jj + dj) (row addresses: tma_stage_lane, sym_tiles.h;
// lane L gives row L % 8 of matrix L / 8).
//   InPlace (first pass): its C read from `in` (ldmatrix, the warp's own blocks), α·acc + β·C
//     rounded and stored in place into `in`, the values kept in acc;
//   Mirror (second pass): the kept values transposed into `mirror` (stmatrix .trans).
enum class TmaStage { InPlace, Mirror };
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

// One accumulator half of a diagonal tile in the TMA-store epilogue, one 8×8 block at a time (the
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

// Barriers of the ping-pong ring: full[s] (one arrival, the
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

// The C buffers of the ping-pong kernel, one per consumer warpgroup, the
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

// Consumer warpgroup w: the epilogue of its tile n at (row0, col0) of matrix z, with C from its
// TMA buffer (c_by_tma), from global memory (C without CTma) or none.
template <typename T, bool CTma>
__device__ __forceinline__ void finish_pingpong_tile(const float (&acc0)[64], const float (&acc1)[64], int64_t n, int w,
                                                     bool c_by_tma, unsigned char* cbuf, uint64_t* c_full,
                                                     uint64_t* c_empty, const T* C, int64_t stride_c, T* D,
                                                     int64_t stride_d, int z, int m, int row0, int col0, float alpha,
                                                     float beta, float diag) {
  const unsigned char* cs = nullptr;
  if (c_by_tma) {
    cs = cbuf + w * kCTileBytes;
    wait_c_buffer(n, w, c_full);
  }
  store_tile_lower_mirrored<T>(acc0, acc1, cs, !CTma && C ? C + static_cast<int64_t>(z) * stride_c : nullptr,
                               D + static_cast<int64_t>(z) * stride_d, m, row0, col0, alpha, beta, diag);
  if (c_by_tma) release_c_buffer(w, c_empty);
}

constexpr int kPpStages = 4;  // the fastest ring depth with this epilogue
// The ping-pong kernel's shared memory, from a 1024-byte aligned start: kPpStages stages of A and
// B tiles, with C by TMA one C tile per consumer warpgroup, then the barriers of
// init_pingpong_barriers.
template <bool CTma>
struct PpLayout {
  static constexpr int stages = kPpStages;
  static constexpr int buffers = CTma ? 2 : 0;
  static constexpr size_t smem_bytes =
      1024 + size_t(stages) * kPpStageBytes + size_t(buffers) * kCTileBytes + (2 * stages + 4) * sizeof(uint64_t);
};
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
template <bool CTma>
__device__ __forceinline__ PingPongSmem carve_pingpong_smem(unsigned char* smem_raw) {
  using L = PpLayout<CTma>;
  PingPongSmem sh;
  sh.ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  sh.cbuf = sh.ring + size_t(L::stages) * kPpStageBytes;
  sh.full = reinterpret_cast<uint64_t*>(sh.cbuf + size_t(L::buffers) * kCTileBytes);
  sh.empty = sh.full + L::stages;
  sh.c_full = sh.empty + L::stages;
  sh.c_empty = sh.c_full + 2;
  return sh;
}

template <typename T, bool CTma>
__global__ void __launch_bounds__(kPpThreads, 1)
    sym_wgmma_pingpong_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                              const __grid_constant__ CUtensorMap map_c, const T* __restrict__ C, int64_t stride_c,
                              T* __restrict__ D, int64_t stride_d, int m, int k, float alpha, float beta, float diag,
                              int64_t tiles_per_mat, int64_t total_tiles) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int Stages = PpLayout<CTma>::stages;
  const PingPongSmem sh = carve_pingpong_smem<CTma>(smem_raw);
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

    finish_pingpong_tile<T, CTma>(acc0, acc1, n, w, c_by_tma, cbuf, c_full, c_empty, C, stride_c, D, stride_d, z, m,
                                  row0, col0, alpha, beta, diag);
  }
}

// Barriers of the cooperative ring (both warpgroups consume every stage): full[s] (the
// producer's arrival plus the bytes), empty[s] (one arrival per consumer warpgroup), c_full (the
// block's C tiles have landed) and c_empty (both warpgroups have read them). more(): the kernel's
// other barriers, initialised before the one fence.
template <int Stages, typename More>
__device__ __forceinline__ void init_coop_barriers(uint64_t* full, uint64_t* empty, uint64_t* c_full,
                                                   uint64_t* c_empty, More more) {
  for (int s = 0; s < Stages; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], 2);
  }
  mbar_init(c_full, 1);
  mbar_init(c_empty, 2);
  more();
  fence_mbarrier_init();
}

// A pair (item `item` of the flattened batch × pairs list) as the operands' block rows: matrix
// z, D's rows row .. against the 128 columns col[b] .. of tile b (b = 0, 1), computed from the
// first operand's rows row .. and the second's rows col[b] ..; transposed: the first operand is
// B and the second A (a pair down block column 0, its tiles' mirrors). second: tile 1 is stored
// (a tile paired with itself is computed twice and stored once). panel: the pair order
// (lower_pair_in_panels).
struct PairUnit {
  int z, row, col[2];
  bool transposed, second;
};
__device__ __forceinline__ PairUnit locate_pair_unit(int64_t item, int64_t pairs_per_mat, int t, int panel) {
  const TilePair pr = lower_pair_in_panels(item % pairs_per_mat, t, panel);
  PairUnit u;
  u.z = static_cast<int>(item / pairs_per_mat);
  u.transposed = !pr.share_a;
  u.row = (pr.share_a ? pr.ti[0] : pr.tj[0]) * kBM;
  for (int b = 0; b < 2; ++b) u.col[b] = (pr.share_a ? pr.tj[b] : pr.ti[b]) * kBM;
  u.second = pr.ti[0] != pr.ti[1] || pr.tj[0] != pr.tj[1];
  return u;
}

// ---- The kernel: persistent, cooperative, m64n256k16 units, the producer's TMA stores ----
// Built as CUTLASS's cooperative Hopper GEMMs are: one CTA works on a 128×256 block with
// both consumer warpgroups at once, each on 64 rows × 256 columns with one m64n256k16 per
// 16-deep step. Against ping-pong (two m64n128k16 per step on a warpgroup's 128×128 tile) that
// cuts the shared-memory traffic per multiply-add twice over: the copy engine writes 24 KiB
// instead of 32 per 128·128·64 (the operand tile is shared by two tiles), and the tensor cores
// read 5120 operand elements instead of 6144 per 64·256·16 (each B row once per 64 rows, not
// per 64 rows of each of two tiles). The epilogue cannot hide under another tile's main loop (it
// is short next to a main loop of k ≥ 2048); the producer loads the next block's first stages
// meanwhile. The 256 columns are pairs of lower tiles (lower_pair; taken in panels of 8 block
// rows, lower_pair_in_panels, see kPairPanel), so that every wave
// is full where ping-pong's is (4096²: 264 pairs, two waves of 132): a pair of block row i,
// tiles (i, j1) and (i, j2), is A's rows of block i against B's rows of blocks j1 and j2 (one
// stage: A's tile and the two B tiles side by side, the 256 rows m64n256k16 reads); a pair down
// block column 0 is computed transposed (B's block 0 against A's blocks i1 and i2: the mirrors
// (0, i1), (0, i2), stored in place above the diagonal and mirrored below; C is symmetric by
// contract). A tile paired with itself is computed twice, stored once. β·C by TMA: the block's
// two C tiles, loaded into the two tile buffers. The epilogue is staged through those buffers
// and stored by TMA (the producer-stores epilogue below), so D must be addressable by TMA
// (d_by_tma; elsewhere the launcher runs ping-pong): scattered register stores, exposed after
// the main loop, would cost as much as a few k-steps of it per block.
constexpr size_t kCoopN256StageBytes = size_t(3) * kTileBytes;  // first operand's tile, two tiles of the second
constexpr int kCoopN256Stages = 3;                              // 3 × 48 KiB and two 32 KiB tile buffers
constexpr int kCoopN256Buffers = 2;                             // the block's two C / staged D tiles
// Barriers beside the ring's full[stages] and empty[stages]: c_full, c_empty, and the seven of
// the producer-stores epilogue (CoopN256StoreBarriers).
constexpr int kCoopN256OtherBarriers = 2 + 7;
// The kernel's shared memory: a 1024-byte alignment margin, the ring, the tile buffers, the
// barriers.
constexpr size_t kCoopN256SmemBytes = 1024 + size_t(kCoopN256Stages) * kCoopN256StageBytes +
                                      size_t(kCoopN256Buffers) * kCTileBytes +
                                      (2 * size_t(kCoopN256Stages) + kCoopN256OtherBarriers) * sizeof(uint64_t);
static_assert(kCoopN256SmemBytes <= 227 * 1024, "the cooperative m64n256 kernel's shared memory exceeds 227 KiB");

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

// The epilogue of a block: each consumer warpgroup w stages its rows 64w.. of tile b (acc[b]) in
// tile buffer b (C's slot, its C read in place), and the producer thread issues the TMA stores
// and waits for them, so that the consumer warpgroups never meet each other or wait for the
// copy engine at the end of a block: each warpgroup stages its rows and signals
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

// Consumer warpgroup w: stages both tiles of its block in place, then their mirrors (a diagonal
// tile is staged whole in the first pass: stage_half_tma_diagonal writes its rows' lower blocks
// and their transposes above the diagonal, in rows the other warpgroup neither reads nor
// writes). mirror_uses[b]: tile b's mirrors staged so far by this thread (in_read[b]'s phase).
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

// CTma: C is given (and loaded by TMA, as d_by_tma requires).
template <typename T, bool CTma>
__global__ void __launch_bounds__(kPpThreads, 1)
    sym_wgmma_coop_n256_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                               const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_d,
                               int m, int k, float alpha, float beta, float diag, int64_t pairs_per_mat,
                               int64_t total_pairs, int panel) {
  constexpr int kS = kCoopN256Stages;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* cbuf = ring + size_t(kS) * kCoopN256StageBytes;  // the block's two C tiles, then its staged D tiles
  uint64_t* full = reinterpret_cast<uint64_t*>(cbuf + kCoopN256Buffers * kCTileBytes);
  uint64_t* empty = full + kS;
  uint64_t* c_full = empty + kS;   // this block's C tiles have landed (and the buffers are free)
  uint64_t* c_empty = c_full + 1;  // part of the ring's barrier set; the buffers are freed through sb
  const CoopN256StoreBarriers sb{c_empty + 1, c_empty + 3, c_empty + 5, c_empty + 7};
  constexpr bool c_by_tma = CTma;
  const int t = (m + kBM - 1) / kBM;

  const int tid = threadIdx.x, wg = tid / 128;
  const int ktiles = (k + kBK - 1) / kBK;
  const int64_t my_pairs = items_of_cta(total_pairs);
  persistent_prologue([&] {
    init_coop_barriers<kS>(full, empty, c_full, c_empty, [&] {
      for (int b = 0; b < 2; ++b) {
        mbar_init(&sb.staged_in[b], 2);
        mbar_init(&sb.staged_mirror[b], 2);
        mbar_init(&sb.in_read[b], 1);
      }
      mbar_init(sb.buffers_free, 1);
    });
  });

  if (wg == 2) {
    producer_registers();
    if (tid == 256) {
      int64_t g = 0;
      const int first_stages = ktiles < kS ? ktiles : kS;
      // The previous block's stores once this block's first stages are queued (the ring is then
      // full until the consumers are through that epilogue), and the buffers refilled halfway
      // through this block's loads, by when those stores have long been read.
      const int refill_kt = ktiles / 2 > first_stages - 1 ? ktiles / 2 : first_stages - 1;
      PairUnit prev{};
      for (int64_t n = 0; n < my_pairs; ++n) {
        const PairUnit u = locate_pair_unit(blockIdx.x + n * gridDim.x, pairs_per_mat, t, panel);
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
          if (n > 0 && kt == first_stages - 1) store_pair_for_consumers(&map_d, cbuf, prev, n - 1, sb);
          if (kt == refill_kt) {
            bulk_wait_read<0>();  // the previous block's mirrors
            if (c_by_tma)
              load_block_c();
            else
              mbar_arrive(sb.buffers_free);
          }
        }
        prev = u;
      }
      if (my_pairs > 0) store_pair_for_consumers(&map_d, cbuf, prev, my_pairs - 1, sb);
      // Complete (not only read) before the CTA's shared memory goes away.
      ORTHOPT_SM90A_ASM("cp.async.bulk.wait_group 0;\n" ::: "memory");
    }
    return;
  }

  consumer_registers();
  const int w = wg, lt = tid % 128;
  auto release = [&](int s) {
    if (lt == 0) mbar_arrive(&empty[s]);
  };
  int64_t g = 0;
  uint32_t mirror_uses[2] = {0, 0};  // in_read's phases
  for (int64_t n = 0; n < my_pairs; ++n) {
    const PairUnit u = locate_pair_unit(blockIdx.x + n * gridDim.x, pairs_per_mat, t, panel);
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
    // The buffers hold this block's C, or nothing the engine still reads.
    mbar_wait(c_by_tma ? c_full : sb.buffers_free, static_cast<uint32_t>(n & 1));
    stage_pair_for_producer<T>(acc, cbuf, c_by_tma, u, mirror_uses, alpha, beta, diag, w, sb);
  }
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
      return fail(ORTHOPT_ERR_CUDA, "orthopt_sym_abt: cuTensorMapEncodeTiled is not available from the driver");
    fn = reinterpret_cast<EncodeTiled>(p);
  }
  *out = fn;
  return ORTHOPT_OK;
}

// The map of a batch of row-major [m, k] operands, boxes of kBM rows × kBK columns, 128-byte
// swizzle.
orthopt_status make_map(CUtensorMap* map, orthopt_dtype dtype, const void* base, int64_t batch, int64_t m, int64_t k,
                        int64_t stride) {
  EncodeTiled encode = nullptr;
  ORTHOPT_STATUS_TRY(encode_tiled(&encode));
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(m), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(k) * 2, static_cast<cuuint64_t>(stride) * 2};  // bytes
  const cuuint32_t box[3] = {kBK, static_cast<cuuint32_t>(kBM), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, dtype == ORTHOPT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            3, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return fail(ORTHOPT_ERR_CUDA, "orthopt_sym_abt: cuTensorMapEncodeTiled failed (%d)", int(r));
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


// The pair order of the m64n256 kernel: panels of 8 block rows (lower_pair_in_panels; the
// measurements: docs/decisions/symmetric-product-kernels.md).
constexpr int kPairPanel = 8;

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
  config.numAttrs = 1;
  ORTHOPT_CUDA_TRY(cudaLaunchKernelEx(&config, Kernel, args...));
  return ORTHOPT_OK;
}

// C by TMA where TMA can address it (m % 8 == 0, 16-byte aligned base and batch stride): a batch
// of [m, m] operands in boxes of 128 rows × 64 columns, *by_tma set. Otherwise (or without C) the
// kernels read C from global memory, and *map_c is a zeroed, unused parameter.
orthopt_status make_c_map(CUtensorMap* map_c, bool* by_tma, orthopt_dtype dtype, const void* C, int64_t batch,
                          int64_t m, int64_t stride_c) {
  *by_tma = C && m % 8 == 0 && (reinterpret_cast<uintptr_t>(C) % 16) == 0 && stride_c % 8 == 0;
  if (!*by_tma) {
    *map_c = CUtensorMap{};
    return ORTHOPT_OK;
  }
  return make_map(map_c, dtype, C, batch, m, m, stride_c);
}

// Whether the epilogue can store D by TMA: rows of 16-byte
// multiples, a 16-byte aligned base and batch stride, and C absent or loaded by TMA too.
bool d_by_tma(const void* D, int64_t m, int64_t stride_d, const void* C, bool c_by_tma) {
  return m % 8 == 0 && (reinterpret_cast<uintptr_t>(D) % 16) == 0 && stride_d % 8 == 0 && (!C || c_by_tma);
}

// The ping-pong kernel (register epilogue): one grid of min(tiles, SMs) CTAs of the instance for
// this C path.
template <typename T>
orthopt_status launch_pingpong(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                               int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                               int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                               cudaStream_t stream) {
  CUtensorMap map_a, map_b, map_c;
  ORTHOPT_STATUS_TRY(make_map(&map_a, dtype, A, batch, m, k, stride_a));
  ORTHOPT_STATUS_TRY(make_map(&map_b, dtype, B, batch, m, k, stride_b));
  bool c_by_tma = false;
  ORTHOPT_STATUS_TRY(make_c_map(&map_c, &c_by_tma, dtype, C, batch, m, stride_c));
  const int64_t t = (m + kBM - 1) / kBM, per_matrix = t * (t + 1) / 2;
  const int64_t total = per_matrix * batch;
  auto run = [&](auto c_tma) -> orthopt_status {
    constexpr bool kCByTma = decltype(c_tma)::value;
    return launch_one_per_sm<sym_wgmma_pingpong_kernel<T, kCByTma>>(
        PpLayout<kCByTma>::smem_bytes, total, stream, map_a, map_b, map_c, static_cast<const T*>(C), stride_c,
        static_cast<T*>(D), stride_d, static_cast<int>(m), static_cast<int>(k), alpha, beta, diag, per_matrix, total);
  };
  ORTHOPT_STATUS_TRY(c_by_tma ? run(std::true_type{}) : run(std::false_type{}));
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

// The m64n256 kernel: one grid of min(pairs, SMs) CTAs, each walking a stride of the pair list;
// ping-pong where D cannot be stored by TMA.
template <typename T>
orthopt_status launch_coop_n256(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                                int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                                int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                                cudaStream_t stream) {
  CUtensorMap map_a, map_b, map_c;
  ORTHOPT_STATUS_TRY(make_map(&map_a, dtype, A, batch, m, k, stride_a));
  ORTHOPT_STATUS_TRY(make_map(&map_b, dtype, B, batch, m, k, stride_b));
  bool c_by_tma = false;
  ORTHOPT_STATUS_TRY(make_c_map(&map_c, &c_by_tma, dtype, C, batch, m, stride_c));
  if (!d_by_tma(D, m, stride_d, C, c_by_tma))
    return launch_pingpong<T>(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D, stride_d,
                              stream);
  const int64_t per_matrix = pairs_per_matrix((m + kBM - 1) / kBM), total = per_matrix * batch;
  CUtensorMap map_d;
  ORTHOPT_STATUS_TRY(make_map(&map_d, dtype, D, batch, m, m, stride_d));
  auto run = [&](auto c_tma) -> orthopt_status {
    constexpr bool kCByTma = decltype(c_tma)::value;
    return launch_one_per_sm<sym_wgmma_coop_n256_kernel<T, kCByTma>>(
        kCoopN256SmemBytes, total, stream, map_a, map_b, map_c, map_d, static_cast<int>(m), static_cast<int>(k), alpha,
        beta, diag, per_matrix, total, kPairPanel);
  };
  ORTHOPT_STATUS_TRY(c_by_tma ? run(std::true_type{}) : run(std::false_type{}));
  ORTHOPT_CUDA_TRY(cudaGetLastError());
  return ORTHOPT_OK;
}

}  // namespace

bool persistent_supported(int64_t k, const void* A, int64_t stride_a, const void* B, int64_t stride_b,
                          const char** why) {
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
  if (cudaFuncGetAttributes(&attr, sym_wgmma_coop_n256_kernel<__nv_bfloat16, false>) != cudaSuccess ||
      attr.binaryVersion != 90) {
    *why = "was not built for sm_90a (CMAKE_CUDA_ARCHITECTURES=90a)";
    return false;
  }
  return operands_in_16_byte_rows(k, A, stride_a, B, stride_b, why);
}

orthopt_status sym_abt_persistent(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                                  int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                                  int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                                  cudaStream_t stream) {
  return dtype == ORTHOPT_BF16
             ? launch_coop_n256<__nv_bfloat16>(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta,
                                               diag, D, stride_d, stream)
             : launch_coop_n256<__half>(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D,
                                        stride_d, stream);
}

}  // namespace orthopt_k

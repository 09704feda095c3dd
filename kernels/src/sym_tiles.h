// Pieces shared by the two lower-triangle symmetric-product kernels (sym_native.cu: mma.sync;
// sym_wgmma.cu: wgmma + TMA): element conversions, which lower tile a CTA owns, and the operand
// requirements of 16-byte row chunks.
#pragma once
#include <cmath>
#include <cstdint>

#include "internal.h"

namespace orthopt_k {

template <typename T>
struct Elem;
template <>
struct Elem<__nv_bfloat16> {
  static __device__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
  static __device__ __nv_bfloat16 make(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Elem<__half> {
  static __device__ float load(const __half* p) { return __half2float(*p); }
  static __device__ __half make(float v) { return __float2half_rn(v); }
};

// The lower tile (ti >= tj) with row-major index idx over the lower triangle of tiles.
__device__ __forceinline__ void lower_tile(int64_t idx, int* ti_out, int* tj_out) {
  int ti = static_cast<int>((sqrt(8.0 * static_cast<double>(idx) + 1.0) - 1.0) * 0.5);
  while (static_cast<int64_t>(ti) * (ti + 1) / 2 > idx) --ti;
  while (static_cast<int64_t>(ti + 1) * (ti + 2) / 2 <= idx) ++ti;
  *ti_out = ti;
  *tj_out = static_cast<int>(idx - static_cast<int64_t>(ti) * (ti + 1) / 2);
}

// The persistent wgmma kernels' staged C/D tile (sym_wgmma.cu): a 128×128 tile of 16-bit values
// as TMA boxes of BoxRows rows × 64 columns one after the other, 128-byte rows, 128-byte swizzle
// (16-byte chunk j of row r sits at chunk j ^ (r % 8)). Byte offset of element (r, c).
template <int BoxRows = 128>
__host__ __device__ __forceinline__ int c_tile_offset(int r, int c) {
  const int box = c >> 6, cc = c & 63;
  return box * (BoxRows * 128) + r * 128 + ((((cc >> 3) ^ (r & 7)) << 4) | ((cc & 7) * 2));
}

// The stmatrix row addresses of the TMA-store epilogue for lane `lane` of warp `warp` of a
// consumer warpgroup, on the accumulator half from tile row h0 (0 or 64), as byte offsets in the
// staged tile. Step jj (0..7) stores matrices k = 2·dj + half, the 8×8 blocks at rows
// h0 + 16·warp + 8·half, columns 8·(2·jj + dj); lane L gives row L % 8 of matrix L / 8: in place
// (tma_in_offset: that block row, c_tile_offset(row, 8·j)) and transposed into the mirror tile
// (tma_mirror_offset: row 8·j + L % 8 there, at the block's rows as columns). Written as a
// per-lane part plus constants (the XOR of the swizzle split off), so that the kernel keeps two
// registers for them; tests/gpu/tile_layout_check.cu checks them against c_tile_offset.
struct TmaStageLane {
  int in_base, in_chunk, mirror_base;
};
__host__ __device__ __forceinline__ TmaStageLane tma_stage_lane(int h0, int warp, int lane) {
  const int lr = lane & 7, lk = lane >> 3, dj = lk >> 1, lhalf = lk & 1;
  TmaStageLane l;
  // In place: row h0 + 16·warp + 8·lhalf + lr, column block j = 2·jj + dj: box j / 8, chunk
  // (j % 8) XOR (row % 8) = ((2·jj % 8) XOR dj XOR lr).
  l.in_base = (h0 + 16 * warp + 8 * lhalf + lr) * 128;
  l.in_chunk = (dj ^ lr) << 4;
  // Mirror: row 8·j + lr, column block (h0 + 16·warp + 8·lhalf) / 8: box h0 / 64, chunk
  // (2·warp + lhalf) XOR lr.
  l.mirror_base = (h0 >> 6) * 16384 + (8 * dj + lr) * 128 + (((2 * warp + lhalf) ^ lr) << 4);
  return l;
}
__host__ __device__ __forceinline__ int tma_in_offset(const TmaStageLane& l, int jj) {
  return l.in_base + ((2 * jj) >> 3) * 16384 + ((((2 * jj) & 7) << 4) ^ l.in_chunk);
}
__host__ __device__ __forceinline__ int tma_mirror_offset(const TmaStageLane& l, int jj) {
  return l.mirror_base + jj * 2048;
}

// Both kernels move operand rows in 16-byte chunks: k % 8 == 0, 16-byte aligned A, B and batch
// strides. On failure *why says what is missing.
inline bool operands_in_16_byte_rows(int64_t k, const void* A, int64_t stride_a, const void* B, int64_t stride_b,
                                     const char** why) {
  if (k % 8 != 0) {
    *why = "needs k divisible by 8 (16-byte row chunks)";
    return false;
  }
  if ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) % 16 != 0 || (stride_a % 8) != 0 ||
      (stride_b % 8) != 0) {
    *why = "needs 16-byte aligned A, B and batch strides";
    return false;
  }
  return true;
}

}  // namespace orthopt_k

// Pieces of the persistent symmetric-product kernels (sym_wgmma.cu) that the host and
// tests/gpu/tile_layout_check.cu use too: element conversions, which lower tile or pair of tiles
// a CTA owns, the staged tile's layout, and the operand requirements of 16-byte row chunks.
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

// The persistent kernels' staged C/D tile (sym_wgmma.cu): a 128×128 tile of 16-bit values
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

// The kernels move operand rows in 16-byte chunks: k % 8 == 0, 16-byte aligned A, B and batch
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

// Pairs of lower tiles (the cooperative m64n256 kernel, sym_wgmma.cu), in
// lower_pair's row-major order: row 2p holds the tiles (2p, 1..2p) as p pairs sharing A, row
// 2p + 1 the tiles (2p + 1, 0..2p + 1) as p + 1 pairs; the tiles (i, 0) of even rows left over
// are paired down column 0, sharing B: (0, 0) with (2, 0), (4, 0) with (6, 0), ...; when their
// count is odd the last one is paired with itself.
struct TilePair {
  int ti[2], tj[2];  // the pair's two tiles
  bool share_a;      // the tiles share the A tile (same ti) or else the B tile (same tj)
};

// Pairs of a matrix with t block rows: (t/2)² + (t odd ? t/2 : 0) sharing A, then
// ceil(ceil(t/2) / 2) down column 0.
__host__ __device__ inline int64_t pairs_per_matrix(int64_t t) {
  const int64_t p = t / 2, even_rows = (t + 1) / 2;
  return p * p + (t % 2 ? p : 0) + (even_rows + 1) / 2;
}

__host__ __device__ inline TilePair lower_pair(int64_t idx, int t) {
  const int64_t P = t / 2, row_pairs = P * P + (t % 2 ? P : 0);
  TilePair pr;
  if (idx < row_pairs) {  // row 2p starts at p², row 2p + 1 at p² + p
    int p = static_cast<int>(sqrt(static_cast<double>(idx)));
    while (static_cast<int64_t>(p) * p > idx) --p;
    while (static_cast<int64_t>(p + 1) * (p + 1) <= idx) ++p;
    const int q = static_cast<int>(idx - static_cast<int64_t>(p) * p);
    const bool odd_row = q >= p;
    const int i = odd_row ? 2 * p + 1 : 2 * p, j0 = odd_row ? 2 * (q - p) : 2 * q + 1;
    pr.ti[0] = pr.ti[1] = i;
    pr.tj[0] = j0;
    pr.tj[1] = j0 + 1;
    pr.share_a = true;
  } else {
    const int e = static_cast<int>(idx - row_pairs);
    pr.ti[0] = 4 * e;
    pr.ti[1] = 4 * e + 2 < t ? 4 * e + 2 : 4 * e;
    pr.tj[0] = pr.tj[1] = 0;
    pr.share_a = false;
  }
  return pr;
}

// The pairs sharing A (idx < the row pairs' count) in panel order, the others as lower_pair:
// block rows are taken in panels of `panel` rows (panel ≤ 0: row-major, lower_pair's order), and
// within a panel column pair by column pair, each down the panel's rows that hold it. Row i
// holds ceil(i / 2) pairs, pair c covering columns 2c + 1, 2c + 2 (even i) or 2c, 2c + 1 (odd
// i), so column pair c lies in the rows i ≥ 2c + 1. The pairs a panel holds are those of its
// rows in row-major order too, only reordered: a wave of consecutive pairs then reads the A
// tiles of a panel's rows and the B tiles of a band of columns, where row-major order reads a
// few rows' A tiles and the B tiles of every column up to them (for fewer operand reads from
// memory on matrices larger than L2).
__host__ __device__ inline TilePair lower_pair_in_panels(int64_t idx, int t, int panel) {
  TilePair pr = lower_pair(idx, t);
  if (panel <= 0 || !pr.share_a) return pr;
  const int i0 = pr.ti[0] / panel * panel, i1 = i0 + panel < t ? i0 + panel : t;
  const int64_t h = i0 / 2;
  int64_t k = idx - (h * h + (i0 % 2 ? h : 0));  // rank in the panel (row i0 starts at h², or h² + h)
  for (int c = 0;; ++c) {
    const int first = i0 > 2 * c + 1 ? i0 : 2 * c + 1;
    const int64_t n = i1 > first ? i1 - first : 0;  // the panel's rows holding column pair c
    if (k < n) {
      const int i = first + static_cast<int>(k);
      pr.ti[0] = pr.ti[1] = i;
      pr.tj[0] = i % 2 ? 2 * c : 2 * c + 1;
      pr.tj[1] = pr.tj[0] + 1;
      return pr;
    }
    k -= n;
  }
}

}  // namespace orthopt_k

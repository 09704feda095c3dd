// Host-only check (no GPU needed; ctest runs it wherever the kernels are built) of the index
// math of the persistent symmetric kernel's TMA-store epilogue (sym_wgmma.cu, tma_stage_blocks and
// stage_half_tma_diagonal): where each accumulator element of each lane lands in the staged
// 128×128 tile, emulating the warp-wide matrix stores the kernel issues.
//
// stmatrix m8n8 (PTX ISA): lane L gives the shared address of row L % 8 of matrix L / 8; lane
// L's register k holds matrix k's elements (L / 4, 2·(L % 4) + q), q = 0, 1; .trans stores each
// matrix transposed (element (i, j) at row j, column i of the destination). A wgmma accumulator
// half (64 rows from tile row h0) holds in lane L of warp w, element 4j + 2·half + q, the tile
// element (h0 + 16w + 8·half + L / 4, 8j + 2·(L % 4) + q).
//
// Checked against c_tile_offset (the layout the C tile comes in by TMA and D leaves in): off the
// diagonal, every element lands at its own position in place (the first pass) and at the
// mirrored position in the mirror pass, and each pass covers the tile exactly once (the kernel
// runs both passes through one buffer, one after the other); on the diagonal, block by block,
// the tile holds at every position (r, c) the element (max(r, c), min(r, c)), exactly once.
// Also the pair orders of the kernel (check_pair_panels).
#include <cstdio>
#include <vector>

#include "../../kernels/src/sym_tiles.h"

namespace {

using orthopt_k::c_tile_offset;

int g_failures = 0;

void expect(bool ok, const char* what, int a, int b, int c, int d) {
  if (ok) return;
  if (++g_failures <= 20) std::printf("FAIL %s (%d %d %d %d)\n", what, a, b, c, d);
}

constexpr int kSlots = 128 * 128;  // 16-bit slots of a staged tile

// Off-diagonal tiles: stage_half_tma_blocks' stmatrix x4 (in place) and x4 .trans (mirror).
void check_blocks() {
  std::vector<int> in_hits(kSlots, 0), mirror_hits(kSlots, 0);
  for (int h0 : {0, 64})
    for (int warp = 0; warp < 4; ++warp)
      for (int jj = 0; jj < 8; ++jj) {
        int in_addr[32], mirror_addr[32];
        for (int lane = 0; lane < 32; ++lane) {
          const orthopt_k::TmaStageLane l = orthopt_k::tma_stage_lane(h0, warp, lane);
          in_addr[lane] = orthopt_k::tma_in_offset(l, jj);
          mirror_addr[lane] = orthopt_k::tma_mirror_offset(l, jj);
          expect(in_addr[lane] % 16 == 0 && mirror_addr[lane] % 16 == 0, "16-byte aligned row address", h0, warp,
                 jj, lane);
        }
        for (int lane = 0; lane < 32; ++lane)
          for (int k = 0; k < 4; ++k)
            for (int q = 0; q < 2; ++q) {
              // The accumulator element register k, half q of this lane holds.
              const int j = 2 * jj + (k >> 1), half = k & 1;
              const int r = h0 + 16 * warp + 8 * half + lane / 4, c = 8 * j + 2 * (lane % 4) + q;
              // Where stmatrix puts it: element (i, jc) of matrix k.
              const int i = lane / 4, jc = 2 * (lane % 4) + q;
              const int at = in_addr[8 * k + i] + 2 * jc;
              const int mirrored = mirror_addr[8 * k + jc] + 2 * i;  // .trans: row jc, column i
              expect(at == c_tile_offset(r, c), "in-place position", r, c, at, c_tile_offset(r, c));
              expect(mirrored == c_tile_offset(c, r), "mirrored position", r, c, mirrored, c_tile_offset(c, r));
              ++in_hits[at / 2];
              ++mirror_hits[mirrored / 2];
            }
      }
  for (int s = 0; s < kSlots; ++s) {
    expect(in_hits[s] == 1, "in-place buffer covered once", s, in_hits[s], 0, 0);
    expect(mirror_hits[s] == 1, "mirror buffer covered once", s, mirror_hits[s], 0, 0);
  }
}

// Diagonal tiles: stage_half_tma_diagonal's stmatrix x1 stores into the staged tile. Each slot
// records the source element (r, c) whose value it receives.
void check_diagonal() {
  std::vector<int> hits(kSlots, 0), source(kSlots, -1);
  for (int h0 : {0, 64})
    for (int warp = 0; warp < 4; ++warp)
      for (int j = 0; j < 16; ++j)
        for (int half = 0; half < 2; ++half) {
          const int rb = h0 + 16 * warp + 8 * half, cb = 8 * j;
          if (rb + 7 < cb) continue;  // as the kernel: wholly above the diagonal
          int addr[8], addr_t[8];     // lanes 0..7's row addresses (x1)
          for (int lane = 0; lane < 8; ++lane) {
            addr[lane] = c_tile_offset(rb + lane, cb);
            addr_t[lane] = c_tile_offset(cb + lane, rb);
          }
          for (int lane = 0; lane < 32; ++lane)
            for (int q = 0; q < 2; ++q) {
              const int r = rb + lane / 4, c = cb + 2 * (lane % 4) + q;  // the lane's element
              const int i = lane / 4, jc = 2 * (lane % 4) + q;
              if (rb == cb) {
                // The combined block: out where c <= r, else the transposed element (c, r).
                const int at = addr[i] + 2 * jc;
                ++hits[at / 2];
                source[at / 2] = c <= r ? r * 128 + c : c * 128 + r;
                expect(at == c_tile_offset(r, c), "diagonal block position", r, c, at, 0);
              } else {
                const int at = addr[i] + 2 * jc, mirrored = addr_t[jc] + 2 * i;
                ++hits[at / 2];
                ++hits[mirrored / 2];
                source[at / 2] = r * 128 + c;
                source[mirrored / 2] = r * 128 + c;
                expect(at == c_tile_offset(r, c), "below-diagonal position", r, c, at, 0);
                expect(mirrored == c_tile_offset(c, r), "its mirror", r, c, mirrored, 0);
              }
            }
        }
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < 128; ++c) {
      const int s = c_tile_offset(r, c) / 2;
      expect(hits[s] == 1, "diagonal tile covered once", r, c, hits[s], 0);
      const int want = r >= c ? r * 128 + c : c * 128 + r;  // (max, min): the lower element
      expect(source[s] == want, "diagonal tile holds the lower element", r, c, source[s], want);
    }
}

// The m64n256 kernel's pair orders (sym_tiles.h): for every block-row count t and
// panel height, lower_pair_in_panels is a reordering of lower_pair within each panel (the same
// pairs at the same index range: every lower tile covered once, the pairs of a panel's rows
// only), and within a panel its column pairs come in order.
void check_pair_panels() {
  for (int t = 1; t <= 80; ++t)
    for (int panel : {0, 1, 3, 4, 8, 16}) {
      const int64_t n = orthopt_k::pairs_per_matrix(t);
      std::vector<int> hits(static_cast<size_t>(t) * t, 0);
      int last_panel = -1, last_c = -1;
      for (int64_t idx = 0; idx < n; ++idx) {
        const orthopt_k::TilePair rm = orthopt_k::lower_pair(idx, t);
        const orthopt_k::TilePair pr = orthopt_k::lower_pair_in_panels(idx, t, panel);
        expect(pr.share_a == rm.share_a, "pair kind kept", t, panel, static_cast<int>(idx), 0);
        for (int b = 0; b < 2; ++b) {
          const int i = pr.ti[b], j = pr.tj[b];
          expect(i >= 0 && i < t && j >= 0 && j <= i, "a lower tile", t, panel, i, j);
          if (i >= 0 && i < t && j >= 0 && j <= i && (b == 0 || pr.ti[1] != pr.ti[0] || pr.tj[1] != pr.tj[0]))
            ++hits[static_cast<size_t>(i) * t + j];
        }
        if (!pr.share_a || panel <= 0) continue;
        expect(pr.ti[0] / panel == rm.ti[0] / panel, "the pair stays in its panel", t, panel, pr.ti[0], rm.ti[0]);
        const int p = pr.ti[0] / panel, c = pr.tj[0] / 2;  // column pair index (both parities)
        if (p == last_panel) expect(c >= last_c, "column pairs in order within a panel", t, panel, c, last_c);
        last_panel = p;
        last_c = c;
      }
      for (int i = 0; i < t; ++i)
        for (int j = 0; j <= i; ++j) expect(hits[static_cast<size_t>(i) * t + j] == 1, "tile covered once", t, panel, i, j);
    }
}

}  // namespace

int main() {
  check_blocks();
  check_diagonal();
  check_pair_panels();
  std::printf("tile_layout_check: %s (%d failure%s)\n", g_failures ? "FAILED" : "passed", g_failures,
              g_failures == 1 ? "" : "s");
  return g_failures ? 1 : 0;
}

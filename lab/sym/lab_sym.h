// The symmetric-product designs that do not ship (docs/decisions/symmetric-product-kernels.md),
// kept runnable for research: the mma.sync kernel and the wgmma + TMA designs measured against
// the shipped persistent kernel. Self-contained copies of what they need (error helpers, tile
// maps: sym_tiles.h here), in namespace orthopt_lab, so that the shipped library can change
// without breaking them and nothing here is linked into it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "orthopt/kernels/status.h"

namespace orthopt_lab {

enum class Design {
  Native,             // mma.sync m16n8k16 (sm_80+), one lower 128×128 tile per CTA
  Wgmma,              // wgmma + TMA, one lower 128×128 tile per CTA, two CTAs per multiprocessor
  PingPong,           // persistent; two consumer warpgroups take whole tiles in turn (register epilogue)
  Coop,               // persistent; both warpgroups on a 128×256 wide tile (m64n128k16)
  Pair,               // ping-pong on clusters of two CTAs sharing an operand tile by TMA multicast
  Wide,               // ping-pong with 64×256 warpgroup units (one m64n256k16 per step)
  PingPongTma,        // ping-pong, epilogue staged by stmatrix and stored by TMA through two buffers
  PingPongTma1Buf,    // the same through one buffer per warpgroup (4-stage ring)
  CoopN256,           // both warpgroups on a pair of tiles with m64n256k16, consumers' TMA stores
  CoopN256Producer,   // CoopN256 with the producer thread's TMA stores: the kernel that ships
};
inline constexpr Design kDesigns[] = {Design::Native,      Design::Wgmma,       Design::PingPong,
                                      Design::Coop,        Design::Pair,        Design::Wide,
                                      Design::PingPongTma, Design::PingPongTma1Buf, Design::CoopN256,
                                      Design::CoopN256Producer};
inline const char* design_name(Design d) {
  switch (d) {
    case Design::Native: return "native";
    case Design::Wgmma: return "wgmma";
    case Design::PingPong: return "pingpong";
    case Design::Coop: return "coop";
    case Design::Pair: return "pair";
    case Design::Wide: return "wide";
    case Design::PingPongTma: return "pingpong_tma";
    case Design::PingPongTma1Buf: return "pingpong_tma_1buf";
    case Design::CoopN256: return "coop_n256";
    case Design::CoopN256Producer: return "coop_n256_producer_stores";
  }
  return "?";
}

// Records the message (lab_last_error()) and returns `code`.
orthopt_status fail(orthopt_status code, const char* fmt, ...);
const char* lab_last_error();

#define ORTHOPT_CUDA_TRY(expr)                                                                  \
  do {                                                                                          \
    cudaError_t err_ = (expr);                                                                  \
    if (err_ != cudaSuccess)                                                                    \
      return ::orthopt_lab::fail(ORTHOPT_ERR_CUDA, "%s failed: %s (%s:%d)", #expr,               \
                                 cudaGetErrorString(err_), __FILE__, __LINE__);                 \
  } while (0)
#define ORTHOPT_STATUS_TRY(expr)     \
  do {                               \
    orthopt_status s_ = (expr);      \
    if (s_ != ORTHOPT_OK) return s_; \
  } while (0)

// D = α·A·Bᵀ + β·C + diag·I (orthopt_sym_abt's contract: A·Bᵀ symmetric, C symmetric or NULL,
// k % 8 == 0, 16-byte aligned A, B) by one design; an error where the design cannot run.
orthopt_status sym_abt(Design design, orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                       int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C, int64_t stride_c,
                       float beta, float diag, void* D, int64_t stride_d, cudaStream_t stream);

// A timing probe of the persistent kernels' epilogue (bf16; PingPong, Coop or CoopN256): stores =
// 0 the product, 1 only the in-place half of each tile (no mirrored stores), 2 no stores at all
// (ptxas then drops the wgmmas whose accumulators nobody reads: the operand loads alone).
// CoopN256 only (C = NULL): 3 the tiles staged in shared memory but no TMA store issued, 4 the
// main loop alone (wgmmas kept, no epilogue), 5 and 6 the main loop alone and the loads alone
// through a ring of 4 stages instead of 3, 7 the main loop alone through 2 stages.
// With 1 to 7 D is WRONG: timing only.
orthopt_status sym_epilogue_probe(Design design, int stores, int64_t batch, int64_t m, int64_t k, const void* A,
                                  int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                                  int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                                  cudaStream_t stream);

// Clusters of two CTAs of the pair kernel (bf16, without C by TMA) that fit at once on the current
// device (0 when the query fails).
int pair_clusters();

// The cooperative m64n256 kernels' pair order: panels of this many block rows (0: row-major).
// Default 8, the shipped kernel's.
void set_pair_panel(int rows);

// The wgmma designs' and the native kernel's requirements (why not, if not).
bool wgmma_supported(int64_t k, const void* A, int64_t stride_a, const void* B, int64_t stride_b, const char** why);
bool native_supported(int64_t k, const void* A, int64_t stride_a, const void* B, int64_t stride_b, const char** why);

// Implementations (sym_wgmma_designs.cu, sym_native.cu).
orthopt_status sym_abt_wgmma(orthopt_dtype dtype, Design design, int64_t batch, int64_t m, int64_t k, const void* A,
                             int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                             int64_t stride_c, float beta, float diag, void* D, int64_t stride_d, cudaStream_t stream);
orthopt_status sym_abt_native(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                              int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C,
                              int64_t stride_c, float beta, float diag, void* D, int64_t stride_d,
                              cudaStream_t stream);

}  // namespace orthopt_lab

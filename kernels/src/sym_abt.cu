// orthopt_sym_abt: argument checks and the choice between the block path and the native kernel.
#include <cstdlib>
#include <string_view>

#include "internal.h"

using namespace orthopt_k;

namespace {

// ORTHOPT_SYM_PATH=<a path's name> (sym_path_name: blocks, native, dense, wgmma, wgmma_pingpong,
// wgmma_coop, wgmma_pair, wgmma_wide, wgmma_pingpong_tma, wgmma_pingpong_tma_1buf, wgmma_coop_n256,
// wgmma_coop_n256_producer_stores) forces a path
// for AUTO (experiments, A/B timings).
orthopt_sym_path forced_path() {
  static const orthopt_sym_path p = [] {
    const char* v = std::getenv("ORTHOPT_SYM_PATH");
    if (!v) return ORTHOPT_SYM_AUTO;
    for (orthopt_sym_path q : kSymPaths)
      if (std::string_view(v) == sym_path_name(q)) return q;
    return ORTHOPT_SYM_AUTO;
  }();
  return p;
}

// The persistent kernel AUTO takes where it takes one (see auto_sym_path for when and why).
// The m64n256 kernel with the producer's stores since the twenty-second session (NS A/B, H200:
// −1.5 to −2% on 5 of 6 shapes, Llama Muon step −1.6%; 2026-12-02-h200-producer-stores.md).
constexpr orthopt_sym_path kAutoPersistent = ORTHOPT_SYM_WGMMA_COOP_N256_PRODUCER_STORES;

// ORTHOPT_SYM_PERSISTENT=pingpong|coop|pair|wide|tma|tma1|n256: AUTO takes ping-pong with the
// register epilogue, the cooperative m64n128 kernel, the pair or wide kernel, ping-pong with the
// TMA-store epilogue (two buffers, or one), or the m64n256 kernel with the consumers' stores
// instead of the m64n256 kernel with the producer's stores wherever it takes a persistent kernel
// (A/B timings of whole NS runs and steps).
orthopt_sym_path persistent_override() {
  static const orthopt_sym_path p = [] {
    const char* v = std::getenv("ORTHOPT_SYM_PERSISTENT");
    if (v && std::string_view(v) == "pingpong") return ORTHOPT_SYM_WGMMA_PINGPONG;
    if (v && std::string_view(v) == "coop") return ORTHOPT_SYM_WGMMA_COOP;
    if (v && std::string_view(v) == "pair") return ORTHOPT_SYM_WGMMA_PAIR;
    if (v && std::string_view(v) == "wide") return ORTHOPT_SYM_WGMMA_WIDE;
    if (v && std::string_view(v) == "tma") return ORTHOPT_SYM_WGMMA_PINGPONG_TMA;
    if (v && std::string_view(v) == "tma1") return ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF;
    if (v && std::string_view(v) == "n256") return ORTHOPT_SYM_WGMMA_COOP_N256;
    return kAutoPersistent;
  }();
  return p;
}

}  // namespace

namespace orthopt_k {

const char* sym_path_name(orthopt_sym_path path) {
  switch (path) {
    case ORTHOPT_SYM_AUTO: return "auto";
    case ORTHOPT_SYM_BLOCKS: return "blocks";
    case ORTHOPT_SYM_NATIVE: return "native";
    case ORTHOPT_SYM_DENSE: return "dense";
    case ORTHOPT_SYM_WGMMA: return "wgmma";
    case ORTHOPT_SYM_WGMMA_PINGPONG: return "wgmma_pingpong";
    case ORTHOPT_SYM_WGMMA_COOP: return "wgmma_coop";
    case ORTHOPT_SYM_WGMMA_PAIR: return "wgmma_pair";
    case ORTHOPT_SYM_WGMMA_WIDE: return "wgmma_wide";
    case ORTHOPT_SYM_WGMMA_PINGPONG_TMA: return "wgmma_pingpong_tma";
    case ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF: return "wgmma_pingpong_tma_1buf";
    case ORTHOPT_SYM_WGMMA_COOP_N256: return "wgmma_coop_n256";
    case ORTHOPT_SYM_WGMMA_COOP_N256_PRODUCER_STORES: return "wgmma_coop_n256_producer_stores";
  }
  return "?";
}

bool is_wgmma_path(orthopt_sym_path path) {
  switch (path) {
    case ORTHOPT_SYM_WGMMA:
    case ORTHOPT_SYM_WGMMA_PINGPONG:
    case ORTHOPT_SYM_WGMMA_COOP:
    case ORTHOPT_SYM_WGMMA_PAIR:
    case ORTHOPT_SYM_WGMMA_WIDE:
    case ORTHOPT_SYM_WGMMA_PINGPONG_TMA:
    case ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF:
    case ORTHOPT_SYM_WGMMA_COOP_N256:
    case ORTHOPT_SYM_WGMMA_COOP_N256_PRODUCER_STORES: return true;
    case ORTHOPT_SYM_AUTO:
    case ORTHOPT_SYM_BLOCKS:
    case ORTHOPT_SYM_NATIVE:
    case ORTHOPT_SYM_DENSE: return false;
  }
  return false;
}

// Measured on an H200 (2026-12-01, bench/results/2026-12-01-h200-sym-products.md; dense cuBLAS,
// cuBLASLt, blocks, native and both wgmma kernels in one run): the persistent ping-pong kernel
// is the fastest path from m = 4096 (4096² 0.128 ms vs 0.137 one-tile-per-CTA, 0.178 cuBLASLt;
// 8192² 0.918 vs 0.983), for k >= 2m from m = 1536 (32×2048×7168 1.71 vs 1.85; 66×2048×5632
// 2.74 vs 3.06) and for batches of square products from m = 1536 and 7e10 multiply-adds
// (16×1536×2048 0.190 vs 0.207 cuBLASLt; 32×2048×2048 0.612 vs 0.691; 88×2048² 1.71 vs 1.88;
// 128×1536×2048 1.45 vs 1.59); one dense cuBLASLt product for smaller work (single 2048²,
// 12×768²). Without the wgmma kernels (not Hopper, or misaligned operands) orthopt_sym_abt
// falls back to the rule measured on an H100: blocks from m = 4096 or m >= 2048 with k >= 3m.
// Widened on 2026-12-01 (sixth session, bench/results/2026-12-01-h200-coop.md) from m = 1536 and
// 7e10 to m = 1408 and 5e10 multiply-adds: NS with every symmetric product on the ping-pong
// kernel against AUTO, alternated in one run, 44×1408×2048 (Dion3's Llama selections) 6.89 /
// 7.09 ms vs 8.49 / 7.54, 16×1536×2048 (its A² is 16×1536×1536, 5.8e10) 3.01 / 3.05 vs
// 3.10 / 3.11. For k >= 2m at m = 768 the one-tile-per-CTA kernel was AUTO's choice until
// 2026-12-01 (eighth session): ping-pong was faster in three round-robin sym_bench runs at
// 12×768×3072 (0.058–0.063 vs 0.065–0.073 ms), and GPT-2's Muon step with ping-pong there, in 4
// alternated runs, 2.970 / 3.011 ms graph (3.147 / 3.086 eager) vs 3.010 / 3.023 (3.212 / 3.156).
// Thirteenth session (2026-12-01, bench/results/2026-12-01-h200-tma-epilogue.md): where AUTO took
// ping-pong it takes ping-pong with the one-buffer TMA-store epilogue. Round-robin sym_bench,
// without C / with β·C: 8192² 0.886 / 0.890 ms vs 0.988 / 0.993, 4096×14336 0.361 / 0.363 vs
// 0.384 / 0.387, 32×2048×7168 1.603 / 1.584 vs 1.686 / 1.651, 16×1536×2048 0.151 / 0.168 vs
// 0.171 / 0.171; bench ns 4096² 2.23 vs 2.36 ms, 8192² 18.27 vs 19.00, 32×7168×2048 18.19 vs
// 18.76. The two-buffer form (3 stages) was slower than ping-pong on every shape from m = 1536.
// Fourteenth session (2026-12-01, bench/results/2026-12-01-h200-coop-n256.md): AUTO takes the
// cooperative m64n256 kernel instead, faster on every shape measured, round-robin sym_bench
// without C / with β·C against the one-buffer ping-pong: 8192² 0.739 / 0.763 ms vs 0.936 /
// 0.936, 4096² 0.103 / 0.115 vs 0.115 / 0.119, 4096×14336 0.304 / 0.314 vs 0.355 / 0.353,
// 16×1536×2048 0.142 / 0.160 vs 0.145 / 0.164, 88×2048² 1.146 / 1.298 vs 1.244 / 1.346.
// Forty-first session (2026-12-06, bench/results/2026-12-06-h100-m768-persistent.md, H100): GPT-2's
// stacked 36×768² Gram products (1.6e10 multiply-adds) on the m64n256 kernel instead of one
// cuBLASLt product: GPT-2 Muon graph step 3.011–3.054 ms against 3.111–3.132, NorMuon
// 3.184–3.245 against 3.288–3.315, Dion3 unchanged (alternated libraries, one process per run).
// Alone on the H100 (sym_bench, no C) 0.056 ms against 0.066 for the tuned cuBLASLt product;
// 0.082 with β·C, which most of the Gram products have.
// The 12×768² standard bank (5.4e9) stays dense: all m >= 768 on the kernel was 3.018–3.077.
orthopt_sym_path auto_sym_path(int64_t batch, int64_t m, int64_t k) {
  const double work = static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(k);
  if (m >= 4096) return kAutoPersistent;
  if (m >= 768 && k >= 2 * m) return kAutoPersistent;
  if (m >= 768 && work >= 1.5e10) return kAutoPersistent;  // GPT-2's stacked 36×768² Gram products
  if (m >= 1408 && work >= 5e10) return kAutoPersistent;
  return ORTHOPT_SYM_DENSE;
}

}  // namespace orthopt_k

extern "C" orthopt_status orthopt_sym_abt(orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                                          int64_t stride_a, const void* B, int64_t stride_b, float alpha,
                                          const void* C, int64_t stride_c, float beta, float diag, void* D,
                                          int64_t stride_d, orthopt_sym_path path, cudaStream_t stream) {
  if (!valid_dtype(dtype)) return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: argument 'dtype' must be bf16 or fp16");
  if (batch < 1 || m < 1 || k < 1)
    return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: sizes must be positive (batch %lld, m %lld, k %lld)",
                static_cast<long long>(batch), static_cast<long long>(m), static_cast<long long>(k));
  if (m > (1 << 30) || k > (1 << 30) || batch > 65535)
    return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: sizes too large (batch %lld <= 65535, m, k < 2^30)",
                static_cast<long long>(batch));
  if (!A || !B || !D) return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: arguments 'A', 'B', 'D' must not be NULL");
  if (D == A || D == B || (C && D == C))
    return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: argument 'D' must not alias 'A', 'B' or 'C'");
  const bool chosen = path == ORTHOPT_SYM_AUTO;
  if (path == ORTHOPT_SYM_AUTO) path = forced_path();
  if (path == ORTHOPT_SYM_AUTO) {
    path = auto_sym_path(batch, m, k);
    if (path == kAutoPersistent) path = persistent_override();
  }
  if (is_wgmma_path(path)) {
    const char* why = "";
    if (wgmma_supported(k, A, stride_a, B, stride_b, &why))
      return sym_abt_wgmma(dtype, path, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D,
                           stride_d, stream);
    if (!chosen) return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: the wgmma kernel %s", why);
    path = m >= 4096 || (m >= 2048 && k >= 3 * m) ? ORTHOPT_SYM_BLOCKS : ORTHOPT_SYM_DENSE;  // AUTO without wgmma
  }
  if (path == ORTHOPT_SYM_NATIVE) {
    const char* why = "";
    if (!native_supported(k, A, stride_a, B, stride_b, &why))
      return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: the native kernel %s", why);
    return sym_abt_native(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D, stride_d,
                          stream);
  }
  if (path == ORTHOPT_SYM_DENSE) {
    // For B != A (square, symmetric by contract) take the product A·B as stored, like ATen:
    // reading Bᵀ of a B that is symmetric only up to rounding made fp16 Gram NS ten times less
    // accurate (docs/gpu.md). X·Xᵀ (B == A) and non-square operands use the transpose.
    const bool transposed = B == A || k != m;
    ORTHOPT_STATUS_TRY(gemm_impl(dtype, dtype, batch, m, m, k, A, stride_a, false, B, stride_b, transposed, alpha, C,
                                 stride_c, beta, D, stride_d, stream));
    return diag != 0.0f ? mirror_lower(dtype, batch, m, D, stride_d, diag, stream) : ORTHOPT_OK;
  }
  if (path != ORTHOPT_SYM_BLOCKS) return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: unknown argument 'path' %d", path);
  return sym_abt_blocks(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D, stride_d, 0,
                        stream);
}

// orthopt_sym_abt: argument checks and the choice between the paths (AUTO: auto_sym_path).
#include "internal.h"

namespace orthopt_k {

const char* sym_path_name(orthopt_sym_path path) {
  switch (path) {
    case ORTHOPT_SYM_AUTO: return "auto";
    case ORTHOPT_SYM_BLOCKS: return "blocks";
    case ORTHOPT_SYM_DENSE: return "dense";
    case ORTHOPT_SYM_PERSISTENT: return "persistent";
  }
  return "?";
}

// The rule and the measurements behind it: docs/decisions/symmetric-product-kernels.md.
orthopt_sym_path auto_sym_path(int64_t batch, int64_t m, int64_t k) {
  const double work = static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(k);
  if (m >= 4096) return ORTHOPT_SYM_PERSISTENT;
  if (m >= 768 && k >= 2 * m) return ORTHOPT_SYM_PERSISTENT;
  if (m >= 768 && work >= 1.5e10) return ORTHOPT_SYM_PERSISTENT;  // GPT-2's stacked 36×768² Gram products
  if (m >= 1408 && work >= 5e10) return ORTHOPT_SYM_PERSISTENT;
  return ORTHOPT_SYM_DENSE;
}

}  // namespace orthopt_k

using namespace orthopt_k;

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
  if (chosen) path = auto_sym_path(batch, m, k);
  if (path == ORTHOPT_SYM_PERSISTENT) {
    const char* why = "";
    if (persistent_supported(k, A, stride_a, B, stride_b, &why))
      return sym_abt_persistent(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D,
                                stride_d, stream);
    if (!chosen) return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: the persistent kernel %s", why);
    // AUTO where the Hopper kernel cannot run (another GPU, misaligned operands).
    path = m >= 4096 || (m >= 2048 && k >= 3 * m) ? ORTHOPT_SYM_BLOCKS : ORTHOPT_SYM_DENSE;
  }
  if (path == ORTHOPT_SYM_DENSE) {
    // For B != A (square, symmetric by contract) take the product A·B as stored, like ATen:
    // reading Bᵀ of a B that is symmetric only up to rounding made fp16 Gram NS far less
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

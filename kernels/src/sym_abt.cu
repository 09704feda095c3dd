// orthopt_sym_abt: argument checks and the choice between the block path and the native kernel.
#include <cstdlib>
#include <string_view>

#include "internal.h"

using namespace orthopt_k;

namespace {

// AUTO picks the block path (cuBLAS's Hopper kernels over the lower triangle) unless
// ORTHOPT_SYM_PATH=native says otherwise; see docs/gpu.md for the measurements behind it.
orthopt_sym_path auto_path() {
  static const orthopt_sym_path p = [] {
    const char* v = std::getenv("ORTHOPT_SYM_PATH");
    if (v && std::string_view(v) == "native") return ORTHOPT_SYM_NATIVE;
    return ORTHOPT_SYM_BLOCKS;
  }();
  return p;
}

}  // namespace

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
  if (path == ORTHOPT_SYM_AUTO) path = auto_path();
  const char* why = "";
  const bool native_ok = native_supported(k, A, stride_a, B, stride_b, &why);
  if (path == ORTHOPT_SYM_NATIVE && !native_ok)
    return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: the native kernel %s", why);
  if (path == ORTHOPT_SYM_NATIVE)
    return sym_abt_native(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D, stride_d,
                          stream);
  if (path != ORTHOPT_SYM_BLOCKS) return fail(ORTHOPT_ERR_INVALID, "orthopt_sym_abt: unknown argument 'path' %d", path);
  return sym_abt_blocks(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D, stride_d, 0,
                        stream);
}

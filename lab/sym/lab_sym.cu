// The lab's error helpers and the dispatch over the symmetric-product designs (lab_sym.h).
#include <cstdarg>
#include <cstdio>

#include "lab_sym.h"

namespace orthopt_lab {
namespace {
thread_local char g_last_error[512] = "";
}

const char* lab_last_error() { return g_last_error; }

orthopt_status fail(orthopt_status code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(g_last_error, sizeof(g_last_error), fmt, args);
  va_end(args);
  return code;
}

orthopt_status sym_abt(Design design, orthopt_dtype dtype, int64_t batch, int64_t m, int64_t k, const void* A,
                       int64_t stride_a, const void* B, int64_t stride_b, float alpha, const void* C, int64_t stride_c,
                       float beta, float diag, void* D, int64_t stride_d, cudaStream_t stream) {
  if (dtype != ORTHOPT_BF16 && dtype != ORTHOPT_FP16) return fail(ORTHOPT_ERR_INVALID, "lab sym_abt: dtype must be bf16 or fp16");
  if (batch < 1 || m < 1 || k < 1 || batch > 65535 || m > (1 << 30) || k > (1 << 30))
    return fail(ORTHOPT_ERR_INVALID, "lab sym_abt: sizes out of range");
  if (!A || !B || !D || D == A || D == B || (C && D == C))
    return fail(ORTHOPT_ERR_INVALID, "lab sym_abt: A, B, D must be given and D must not alias A, B or C");
  const char* why = "";
  if (design == Design::Native) {
    if (!native_supported(k, A, stride_a, B, stride_b, &why))
      return fail(ORTHOPT_ERR_INVALID, "lab sym_abt: the native kernel %s", why);
    return sym_abt_native(dtype, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D, stride_d,
                          stream);
  }
  if (!wgmma_supported(k, A, stride_a, B, stride_b, &why))
    return fail(ORTHOPT_ERR_INVALID, "lab sym_abt: the %s kernel %s", design_name(design), why);
  return sym_abt_wgmma(dtype, design, batch, m, k, A, stride_a, B, stride_b, alpha, C, stride_c, beta, diag, D,
                       stride_d, stream);
}

}  // namespace orthopt_lab

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

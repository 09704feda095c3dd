// What the bit-identity probes (multi_tensor_bitcheck.cu, ns_input_bitcheck.cu) share: a CUDA
// check, a deterministic generator, element stores in the three dtypes, an FNV-1a hash and the
// output line of one configuration. Built by lab/probes/bitcheck.sh against two trees.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "orthopt_kernels.h"

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      std::printf("CUDA error %s at %d\n", cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

constexpr orthopt_dtype F = ORTHOPT_FP32, B = ORTHOPT_BF16, H = ORTHOPT_FP16;

// splitmix64; reseed through g_state per configuration so each one's inputs stand alone.
inline uint64_t g_state = 1;
inline uint64_t next64() {
  uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline float uni() { return static_cast<float>((next64() >> 40) / 16777216.0) * 2.0f - 1.0f; }  // [-1, 1)
inline size_t es(orthopt_dtype d) { return d == F ? 4 : 2; }
inline const char* nm(orthopt_dtype d) { return d == F ? "f32" : (d == B ? "bf16" : "f16"); }

// Element e of a host buffer of dtype dt set to v (rounded to nearest).
inline void store(std::vector<unsigned char>& host, orthopt_dtype dt, int64_t e, float v) {
  if (dt == F) {
    std::memcpy(host.data() + e * 4, &v, 4);
  } else if (dt == B) {
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    std::memcpy(host.data() + e * 2, &b, 2);
  } else {
    const __half h = __float2half_rn(v);
    std::memcpy(host.data() + e * 2, &h, 2);
  }
}

// FNV-1a of the device buffer dev (host.size() bytes, read back into host).
inline uint64_t device_hash(std::vector<unsigned char>& host, const void* dev) {
  CK(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
  return h;
}

// One configuration's line: its name and the hash of each buffer written, or the error.
inline int g_fail = 0;
template <class Buf>
void out(const std::string& name, orthopt_status st, std::initializer_list<Buf*> written, int width = 90) {
  CK(cudaDeviceSynchronize());
  std::printf("%-*s", width, name.c_str());
  if (st != ORTHOPT_OK) {
    std::printf(" ERROR %s\n", orthopt_last_error());
    ++g_fail;
    return;
  }
  for (Buf* b : written) std::printf(" %016llx", static_cast<unsigned long long>(b->hash()));
  std::printf("\n");
}

// Shared by the kernel tools (nvcc-compiled .cu files): CK(call), the check of a CUDA,
// cuBLAS(Lt) or orthopt call (0 is success), which prints the error code, where, and
// orthopt_last_error(), and exits; require_device; fill_uniform; median_ms.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "orthopt_kernels.h"

#define CK(x)                                                                                         \
  do {                                                                                                \
    auto e_ = (x);                                                                                    \
    if (e_ != 0) {                                                                                    \
      std::printf("error %d at %s:%d: %s\n", static_cast<int>(e_), __FILE__, __LINE__, orthopt_last_error()); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

// Exits with 77 (CTest's "skipped") where there is no CUDA device.
inline void require_device(const char* tool) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("%s: no CUDA device\n", tool);
    std::exit(77);
  }
}

// p[i] = scale·(u − 0.5), u uniform in [0, 1) from a hash of (i, seed): reproducible inputs with
// no generator state; T is float or __nv_bfloat16 (rounded to nearest).
template <class T>
__global__ void fill_uniform(T* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float v = scale * ((h & 0xFFFFFF) / 16777216.0f - 0.5f);
    if constexpr (sizeof(T) == 2) p[i] = __float2bfloat16_rn(v);
    else p[i] = v;
  }
}

// The median time in ms of `launch` on the default stream by CUDA events: 5 warm-ups, then 30
// timed runs, each synchronized.
inline double median_ms(const std::function<void()>& launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < 30; ++i) {
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

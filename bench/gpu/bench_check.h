// CK(call): the kernel tools' check of a CUDA or orthopt call (0 is success): prints the error
// code, where, and orthopt_last_error(), and exits.
#pragma once
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

#include "timing.h"

#include <torch/cuda.h>
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

#include <algorithm>
#include <chrono>
#include <vector>

namespace orthopt::bench {

Timing time_ms(const std::function<void()>& fn, c10::Device device, int warmup, int repeats) {
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? -1 : device.index());
  };
  for (int i = 0; i < warmup; ++i) fn();
  sync();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
#ifdef ORTHOPT_WITH_CUDA
    if (device.is_cuda()) {
      // CUDA events on the current stream: device time of the region, no host clock skew.
      at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
      start.record();
      fn();
      stop.record();
      stop.synchronize();
      ms.push_back(start.elapsed_time(stop));
      continue;
    }
#endif
    auto t0 = std::chrono::steady_clock::now();
    fn();
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

}  // namespace orthopt::bench

#include "timing.h"

#include <torch/cuda.h>

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
    auto t0 = std::chrono::steady_clock::now();
    fn();
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

}  // namespace orthopt::bench

#include "timing.h"

#include <torch/cuda.h>
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

#include <algorithm>
#include <chrono>
#include <vector>

namespace orthopt::bench {

namespace {

void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? -1 : device.index());
}

// One timed run of fn, in ms.
double time_once(const std::function<void()>& fn, c10::Device device) {
#ifdef ORTHOPT_WITH_CUDA
  if (device.is_cuda()) {
    // CUDA events on the current stream: device time of the region, no host clock skew.
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    fn();
    stop.record();
    stop.synchronize();
    return start.elapsed_time(stop);
  }
#endif
  auto t0 = std::chrono::steady_clock::now();
  fn();
  synchronize(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

}  // namespace

std::vector<Timing> time_round_robin(const std::vector<std::function<void()>>& fns, c10::Device device, int warmup,
                                     int repeats) {
  const size_t n = fns.size();
  for (int r = 0; r < warmup; ++r)
    for (const auto& fn : fns) fn();
  synchronize(device);
  std::vector<std::vector<double>> ms(n);
  for (int r = 0; r < repeats; ++r)
    for (size_t j = 0; j < n; ++j) {
      const size_t i = (j + static_cast<size_t>(r)) % n;
      ms[i].push_back(time_once(fns[i], device));
    }
  std::vector<Timing> out;
  for (auto& v : ms) out.push_back(summarize(std::move(v)));
  return out;
}

// One contender: warm-up runs, a synchronization, then the timed runs, as round-robin does.
Timing time_ms(const std::function<void()>& fn, c10::Device device, int warmup, int repeats) {
  return time_round_robin({fn}, device, warmup, repeats).front();
}

}  // namespace orthopt::bench

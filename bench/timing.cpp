#include "timing.h"

#include <torch/cuda.h>
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

namespace orthopt::bench {

namespace {

void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? -1 : device.index());
}

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Run {
  double ms;       // the run, device-synchronized
  double host_ms;  // until fn() returned
};

// One timed run of fn; the device is idle when it starts (the previous run synchronized).
Run time_once(const std::function<void()>& fn, c10::Device device) {
#ifdef ORTHOPT_WITH_CUDA
  if (device.is_cuda()) {
    // CUDA events on the current stream: device time of the region, no host clock skew.
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    const auto t0 = Clock::now();
    fn();
    const double host = ms_since(t0);
    stop.record();
    stop.synchronize();
    return {start.elapsed_time(stop), host};
  }
#endif
  const auto t0 = Clock::now();
  fn();
  const double host = ms_since(t0);
  synchronize(device);
  return {ms_since(t0), host};
}

Timing summarize(const std::vector<Run>& runs) {
  std::vector<double> ms, host;
  for (const auto& r : runs) {
    ms.push_back(r.ms);
    host.push_back(r.host_ms);
  }
  const auto [lo, hi] = std::minmax_element(ms.begin(), ms.end());
  return {median(ms), *lo, *hi, median(host)};
}

}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<Timing> time_round_robin(const std::vector<std::function<void()>>& fns, c10::Device device, int warmup,
                                     int repeats, ClockSummary* clocks) {
  const size_t n = fns.size();
  std::optional<ClockSampler> sampler;  // made before the warm-up: it loads NVML
  if (clocks) sampler.emplace(device);
  for (int r = 0; r < warmup; ++r)
    for (const auto& fn : fns) fn();
  synchronize(device);
  std::vector<std::vector<Run>> runs(n);
  if (sampler) sampler->start();
  for (int r = 0; r < repeats; ++r)
    for (size_t j = 0; j < n; ++j) {
      const size_t i = (j + static_cast<size_t>(r)) % n;
      runs[i].push_back(time_once(fns[i], device));
    }
  if (sampler) *clocks = sampler->stop();
  std::vector<Timing> out;
  for (const auto& v : runs) out.push_back(summarize(v));
  return out;
}

// One contender: warm-up runs, a synchronization, then the timed runs, as round-robin does.
Timing time_ms(const std::function<void()>& fn, c10::Device device, int warmup, int repeats, ClockSummary* clocks) {
  return time_round_robin({fn}, device, warmup, repeats, clocks).front();
}

}  // namespace orthopt::bench

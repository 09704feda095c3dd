#pragma once
// Benchmark timing: warm-up, then the median of repeated runs, device-synchronized.
#include <c10/core/Device.h>

#include <functional>

namespace orthopt::bench {

struct Timing {
  double median_ms;
  double min_ms;
  double max_ms;
};

// Runs fn `warmup` times, then `repeats` times; each run is timed with CUDA events on a CUDA
// device (when the build has CUDA), else with the host clock around a device synchronization.
Timing time_ms(const std::function<void()>& fn, c10::Device device, int warmup, int repeats);

}  // namespace orthopt::bench

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

// Runs fn `warmup` times, then `repeats` times, synchronizing the device around each run.
Timing time_ms(const std::function<void()>& fn, c10::Device device, int warmup, int repeats);

}  // namespace orthopt::bench

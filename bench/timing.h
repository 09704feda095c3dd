#pragma once
// Benchmark timing: warm-up, then the median of repeated runs, device-synchronized.
#include <c10/core/Device.h>

#include <functional>
#include <vector>

#include "gpu_clock.h"

namespace orthopt::bench {

struct Timing {
  double median_ms;
  double min_ms;
  double max_ms;
  // Median host time until fn() returned, every run started on an idle device. On CUDA that is
  // the time to enqueue the work, a lower bound of median_ms: where the two are close, the
  // contender is host-bound (its kernels wait for their launches). On the CPU it is the run
  // itself.
  double host_median_ms;
};

// The median the benchmarks report: the middle element, the upper one of an even count. v non-empty.
double median(std::vector<double> v);

// Runs fn `warmup` times, then `repeats` times; each run is timed with CUDA events on a CUDA
// device (when the build has CUDA), else with the host clock around a device synchronization.
// With `clocks`, the GPU clock is sampled during the timed runs (not the warm-up) and its summary
// written there (not sampled, with the reason, off a CUDA device or without NVML).
Timing time_ms(const std::function<void()>& fn, c10::Device device, int warmup, int repeats,
               ClockSummary* clocks = nullptr);

// Times several contenders round-robin: `warmup` rounds, then `repeats` rounds in which each
// contender runs once, timed as in time_ms, round r starting with contender r mod n. Clock and
// power drift then falls on every contender alike instead of on whichever ran first (timed one
// after another on an H200, the NS method timed right after the dense peer at 8192² read
// 22.0–22.2 ms and the next method, the same products, 19.2–19.4).
// `clocks` as in time_ms: sampled over all timed rounds.
std::vector<Timing> time_round_robin(const std::vector<std::function<void()>>& fns, c10::Device device, int warmup,
                                     int repeats, ClockSummary* clocks = nullptr);

}  // namespace orthopt::bench

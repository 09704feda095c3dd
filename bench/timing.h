#pragma once
// Benchmark timing: warm-up, then the median of repeated runs, device-synchronized.
#include <c10/core/Device.h>

#include <functional>
#include <vector>

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

// Runs fn `warmup` times, then `repeats` times; each run is timed with CUDA events on a CUDA
// device (when the build has CUDA), else with the host clock around a device synchronization.
Timing time_ms(const std::function<void()>& fn, c10::Device device, int warmup, int repeats);

// Times several contenders round-robin: `warmup` rounds, then `repeats` rounds in which each
// contender runs once, timed as in time_ms, round r starting with contender r mod n. Clock and
// power drift then falls on every contender alike instead of on whichever ran first (timed one
// after another on an H200, the NS method timed right after the dense peer at 8192² read
// 22.0–22.2 ms and the next method, the same products, 19.2–19.4).
std::vector<Timing> time_round_robin(const std::vector<std::function<void()>>& fns, c10::Device device, int warmup,
                                     int repeats);

}  // namespace orthopt::bench

#pragma once
// GPU clock and power sampling during benchmark timings. On an H200 the same NS code reads
// 11–16% slower once the board runs at its power cap than right after idle, so a timing means
// little without the SM clock it ran at. NVML is loaded at run time (dlopen), never linked: the
// benchmarks build and run without a GPU, NVML or its header, and then report why they did not
// sample.
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace orthopt::bench {

// How often the benchmarks sample: 50 samples a second, enough for timings of a fraction of a
// second; each sample is three NVML reads on a thread of its own, asleep in between.
constexpr std::chrono::milliseconds kClockPeriod{20};

// The board state over a timed region, from samples taken every period while it ran.
struct ClockSummary {
  bool sampled = false;
  std::string why_not;  // when !sampled: why ("not a CUDA device", "libnvidia-ml.so.1 not found", ...)
  int samples = 0;      // samples in which the SM clock was read
  double sm_mhz_median = std::numeric_limits<double>::quiet_NaN();
  double sm_mhz_min = std::numeric_limits<double>::quiet_NaN();
  // Share of the samples whose clock-event reasons had the software power cap (NVML bit 0x4)
  // set; NaN when the reasons could not be read.
  double power_cap_fraction = std::numeric_limits<double>::quiet_NaN();
  double power_w_median = std::numeric_limits<double>::quiet_NaN();  // NaN: power not readable

  // "  timed rounds: SM clock 1605 MHz median (min 1290), power cap in 93% of 41 samples,
  // 652 W median" (one line, no newline); "  timed rounds: clock not sampled (<why_not>)".
  // A part NVML could not read says so: "power cap not read", "power not read".
  std::string line() const;
  // Sampled: {"sampled": true, "samples", "sm_mhz_median", "sm_mhz_min", "power_cap_fraction",
  // "power_w_median"} (a value not read is null). Not sampled: {"sampled": false, "why_not"}.
  nlohmann::json to_json() const;
  // What line() means, for a benchmark's footer (newline-terminated).
  static std::string legend();
};

// One reading of the board; power and the power cap are optional.
struct ClockReading {
  double sm_mhz = 0;
  double power_w = std::numeric_limits<double>::quiet_NaN();  // NaN: not read
  int power_cap = -1;  // 1: software power cap active, 0: not, -1: reasons not read
};
// Fills *reading; returns false and sets *error when the SM clock could not be read.
using ClockReader = std::function<bool(ClockReading* reading, std::string* error)>;

// Samples the board on a thread of its own from start() to stop(), every `period`. Never throws
// from that thread: a failure there ends up in the summary's why_not. The destructor stops a
// running sampler. Not copyable; one start()/stop() pair at a time.
class ClockSampler {
 public:
  explicit ClockSampler(c10::Device device, std::chrono::milliseconds period = kClockPeriod);
  // Samples `reader` instead of a device's NVML (tests drive the thread and the summary with it).
  explicit ClockSampler(ClockReader reader, std::chrono::milliseconds period = kClockPeriod);
  ~ClockSampler();
  ClockSampler(const ClockSampler&) = delete;
  ClockSampler& operator=(const ClockSampler&) = delete;

  // Starts sampling; where the device cannot be sampled (not CUDA, no NVML, ...; found out by the
  // constructor) no thread starts and stop() reports why. Throws std::logic_error when already started.
  void start();
  // Stops and joins the thread; the summary of the samples since start().
  ClockSummary stop();

 private:
  void sample_loop();
  void join();  // asks the thread to stop and joins it, if running

  std::string unavailable_;  // why the device's NVML reader is empty (declared first: the
                             // constructor's nvml_reader call fills it while making reader_)
  ClockReader reader_;       // as given, or the device's NVML; empty when unavailable
  std::chrono::milliseconds period_;
  bool started_ = false;
  std::string why_not_;  // set by start() when it could not start sampling

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;         // guarded by mutex_
  std::vector<ClockReading> readings_;  // written by the thread, read after join
  std::string last_error_;              // ditto: the last failed reading
  std::string thread_error_;            // ditto: the exception that ended the thread
};

}  // namespace orthopt::bench

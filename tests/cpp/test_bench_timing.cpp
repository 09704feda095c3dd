// bench::time_round_robin (bench/timing.cpp, built into `orthopt bench`): the order in which the
// contenders run (warm-up rounds in list order, then timed rounds each starting one contender
// later, so no contender always runs first) and that each contender's timing is its own (one
// that sleeps reads at least its sleep, the others far less; so does its host time). CPU
// timing: host clock. And the GPU clock sampling (bench/gpu_clock.cpp): not sampled off a CUDA
// device, with the reason; the summary's line and json; the sampling thread, driven here by a
// fake reader since this suite runs without a GPU.
#include <gtest/gtest.h>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gpu_clock.h"
#include "timing.h"

using orthopt::bench::ClockReading;
using orthopt::bench::ClockSampler;
using orthopt::bench::ClockSummary;
using orthopt::bench::time_ms;
using orthopt::bench::time_round_robin;

TEST(BenchTiming, RoundRobinRunsEachContenderOncePerRoundStartingOneLater) {
  std::vector<int> calls;
  std::vector<std::function<void()>> fns;
  for (int i = 0; i < 3; ++i) fns.push_back([&calls, i] { calls.push_back(i); });
  const auto t = time_round_robin(fns, c10::Device("cpu"), /*warmup=*/2, /*repeats=*/4);
  const std::vector<int> expected = {0, 1, 2, 0, 1, 2,  // warm-up
                                     0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2};
  EXPECT_EQ(calls, expected);
  ASSERT_EQ(t.size(), 3u);
  for (const auto& x : t) {
    EXPECT_LE(x.min_ms, x.median_ms);
    EXPECT_LE(x.median_ms, x.max_ms);
  }
}

TEST(BenchTiming, EachContenderIsTimedOnItsOwn) {
  const std::vector<std::function<void()>> fns = {
      [] {}, [] { std::this_thread::sleep_for(std::chrono::milliseconds(3)); }, [] {}};
  const auto t = time_round_robin(fns, c10::Device("cpu"), /*warmup=*/1, /*repeats=*/5);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_GE(t[1].min_ms, 3.0);
  EXPECT_LT(t[0].median_ms, t[1].median_ms);
  EXPECT_LT(t[2].median_ms, t[1].median_ms);
  // The host time is the time until fn() returned: on the CPU the run itself, within its span.
  EXPECT_GE(t[1].host_median_ms, 3.0);
  EXPECT_LT(t[0].host_median_ms, t[1].host_median_ms);
  for (const auto& x : t) EXPECT_LE(x.host_median_ms, x.max_ms);
}

TEST(BenchClock, NotSampledOnTheCpuWithTheReason) {
  ClockSummary clocks;
  clocks.sampled = true;  // must be overwritten
  const auto t = time_round_robin({[] {}, [] {}}, c10::Device("cpu"), /*warmup=*/1, /*repeats=*/3, &clocks);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_FALSE(clocks.sampled);
  EXPECT_EQ(clocks.why_not, "not a CUDA device");
  EXPECT_EQ(clocks.line(), "  timed rounds: clock not sampled (not a CUDA device)");
  EXPECT_EQ(clocks.to_json(), nlohmann::json({{"sampled", false}, {"why_not", "not a CUDA device"}}));

  ClockSummary one;
  one.sampled = true;
  time_ms([] {}, c10::Device("cpu"), 0, 2, &one);
  EXPECT_FALSE(one.sampled);
  EXPECT_FALSE(one.why_not.empty());
}

ClockSummary hand_filled() {
  ClockSummary s;
  s.sampled = true;
  s.samples = 41;
  s.sm_mhz_median = 1605;
  s.sm_mhz_min = 1290;
  s.power_cap_fraction = 38.0 / 41.0;  // 92.7%
  s.power_w_median = 652.4;
  return s;
}

TEST(BenchClock, LineFormat) {
  EXPECT_EQ(hand_filled().line(),
            "  timed rounds: SM clock 1605 MHz median (min 1290), power cap in 93% of 41 samples, 652 W median");
  ClockSummary partial = hand_filled();
  partial.power_cap_fraction = std::numeric_limits<double>::quiet_NaN();
  partial.power_w_median = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(partial.line(),
            "  timed rounds: SM clock 1605 MHz median (min 1290), power cap not read in 41 samples, power not read");
}

TEST(BenchClock, JsonRoundTrip) {
  const auto j = nlohmann::json::parse(hand_filled().to_json().dump());
  EXPECT_EQ(j.at("sampled").get<bool>(), true);
  EXPECT_EQ(j.at("samples").get<int>(), 41);
  EXPECT_DOUBLE_EQ(j.at("sm_mhz_median").get<double>(), 1605);
  EXPECT_DOUBLE_EQ(j.at("sm_mhz_min").get<double>(), 1290);
  EXPECT_DOUBLE_EQ(j.at("power_cap_fraction").get<double>(), 38.0 / 41.0);
  EXPECT_DOUBLE_EQ(j.at("power_w_median").get<double>(), 652.4);
  EXPECT_EQ(j.size(), 6u);
  // A value NVML could not read is null, not NaN (which json has no spelling for).
  ClockSummary partial = hand_filled();
  partial.power_w_median = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(nlohmann::json::parse(partial.to_json().dump()).at("power_w_median").is_null());
}

TEST(BenchClock, SamplerOnTheCpuDoesNotSample) {
  ClockSampler sampler(c10::Device("cpu"));
  sampler.start();
  EXPECT_THROW(sampler.start(), std::logic_error);
  const ClockSummary s = sampler.stop();
  EXPECT_FALSE(s.sampled);
  EXPECT_EQ(s.why_not, "not a CUDA device");
  EXPECT_EQ(sampler.stop().why_not, "sampler not started");
  ClockSampler dropped(c10::Device("cpu"));
  dropped.start();  // destroyed without stop()
}

// The thread: a first reading at once, then one per period until stop(); the summary's median
// (upper, as the timings'), minimum, power-cap share over the readings that had the reasons,
// and power median over those that had power.
TEST(BenchClock, SamplerThreadSummarizesItsReadings) {
  const std::vector<ClockReading> script = {{1980, 300, 0}, {1700, 640, 1}, {1600, 660, 1}, {1500, 650, -1}};
  std::atomic<size_t> calls{0};
  ClockSampler sampler(
      [&](ClockReading* r, std::string*) {
        const size_t i = calls++;
        *r = script[std::min(i, script.size() - 1)];
        return true;
      },
      std::chrono::milliseconds(1));
  sampler.start();
  while (calls < script.size()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const ClockSummary s = sampler.stop();
  ASSERT_TRUE(s.sampled) << s.why_not;
  ASSERT_GE(s.samples, 4);
  const size_t extra = static_cast<size_t>(s.samples) - 4;  // readings past the script repeat its last one
  EXPECT_DOUBLE_EQ(s.sm_mhz_min, 1500);
  EXPECT_DOUBLE_EQ(s.power_cap_fraction, 2.0 / 3.0);  // the last reading has no reasons
  if (extra == 0) {
    EXPECT_DOUBLE_EQ(s.sm_mhz_median, 1700);  // upper median of 1500 1600 1700 1980
    EXPECT_DOUBLE_EQ(s.power_w_median, 650);  // of 300 640 650 660
  }
  EXPECT_EQ(calls.load(), static_cast<size_t>(s.samples));  // no reading after stop()
}

// Stopped at once, a sampler has still taken its first reading: a failed one is the reason it
// reports, so is an exception out of the reader.
TEST(BenchClock, SamplerReportsFailedReadingsAndExceptions) {
  ClockSampler failing([](ClockReading*, std::string* error) {
    *error = "nvmlDeviceGetClockInfo: code 3";
    return false;
  });
  failing.start();
  EXPECT_EQ(failing.stop().why_not, "no samples: nvmlDeviceGetClockInfo: code 3");

  ClockSampler throwing([](ClockReading*, std::string*) -> bool { throw std::runtime_error("boom"); });
  throwing.start();  // stopped at once: the first reading is taken all the same
  const ClockSummary s = throwing.stop();
  EXPECT_FALSE(s.sampled);
  EXPECT_EQ(s.why_not, "sampling thread: boom");
}

// A running sampler destroyed without stop() joins its thread promptly (it sleeps a period
// between readings, and is woken, not waited out).
TEST(BenchClock, DestructorStopsARunningSampler) {
  std::atomic<int> calls{0};
  const auto t0 = std::chrono::steady_clock::now();
  {
    ClockSampler sampler(
        [&](ClockReading* r, std::string*) {
          ++calls;
          r->sm_mhz = 1000;
          return true;
        },
        std::chrono::seconds(60));
    sampler.start();
    while (calls == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(calls.load(), 1);
}

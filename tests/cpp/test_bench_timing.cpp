// bench::time_round_robin (bench/timing.cpp, built into `orthopt bench`): the order in which the
// contenders run (warm-up rounds in list order, then timed rounds each starting one contender
// later, so no contender always runs first) and that each contender's timing is its own (one
// that sleeps reads at least its sleep, the others far less; so does its host time). CPU
// timing: host clock.
#include <gtest/gtest.h>

#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "timing.h"

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

#pragma once
// Learning-rate schedules for the trainer (algorithms.md §8): warmup–stable–decay (default),
// cosine and constant. One definition: the trainer, the CLI and the tests all call lr_factor.

#include <cstdint>
#include <string>

namespace orthopt::train {

struct LrSchedule {
  std::string kind = "wsd";  // wsd | cosine | constant
  double warmup_frac = 0.02;
  double stable_frac = 0.83;  // wsd only
  double decay_frac = 0.15;   // wsd only
  double min_lr_ratio = 0.05; // wsd and cosine end at lr·min_lr_ratio
  std::string decay_shape = "linear";  // wsd: linear | cosine | sqrt | 1-sqrt
};

// Throws c10::Error naming the offending field (unknown kind/shape, fractions outside [0, 1],
// wsd fractions summing to more than 1, min_lr_ratio outside [0, 1]).
void validate(const LrSchedule& schedule);

// Multiplier of the peak lr at step t of total_steps (§8 exactly). t is the optimizer step
// counter + 1 (never the micro-batch counter); t >= total_steps keeps the final value.
//   W = floor(T·warmup_frac); t < W: t/W (W = 0: no warmup).
//   wsd:      S = floor(T·stable_frac), D = floor(T·decay_frac); t < W+S: 1; else
//             p = min(1, (t−W−S)/D) (D = 0: p = 1), factor = m + (1−m)·f(p), f by decay_shape.
//   cosine:   p = min(1, (t−W)/(T−W)), factor = m + (1−m)·0.5·(1 + cos πp).
//   constant: 1 after warmup.
// Validates its arguments (throws c10::Error for total_steps < 1 or t < 0).
double lr_factor(const LrSchedule& schedule, int64_t total_steps, int64_t t);

// The integer phase lengths of §8 for total_steps (warmup, stable, decay); stable and decay are 0
// for kinds other than wsd. Exposed for logs and tests.
struct SchedulePhases {
  int64_t warmup = 0, stable = 0, decay = 0;
};
SchedulePhases schedule_phases(const LrSchedule& schedule, int64_t total_steps);

}  // namespace orthopt::train

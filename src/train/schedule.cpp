#include "orthopt/train/schedule.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace orthopt::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

void check_fraction(double v, const char* field) {
  TORCH_CHECK(std::isfinite(v) && v >= 0.0 && v <= 1.0, "LrSchedule.", field,
              " must be in [0, 1], got ", v);
}

// floor(T·frac) of §8. The fractions are decimal numbers (0.15 is 0.1499999...9944 in binary),
// so T·frac can land a hair below an integer the user meant (57220·0.15 = 8583); a relative
// nudge of 1e-12 keeps floor() on the intended side without moving any genuinely fractional value.
int64_t phase_length(int64_t total_steps, double frac) {
  const double x = static_cast<double>(total_steps) * frac;
  return static_cast<int64_t>(std::floor(x + std::abs(x) * 1e-12));
}

double decay_shape_value(const std::string& shape, double p) {
  if (shape == "linear") return 1.0 - p;
  if (shape == "cosine") return 0.5 * (1.0 + std::cos(kPi * p));
  if (shape == "sqrt") return std::sqrt(1.0 - p);
  if (shape == "1-sqrt") return 1.0 - std::sqrt(p);
  TORCH_CHECK(false, "LrSchedule.decay_shape must be one of linear, cosine, sqrt, 1-sqrt; got '",
              shape, "'");
}

}  // namespace

void validate(const LrSchedule& s) {
  TORCH_CHECK(s.kind == "wsd" || s.kind == "cosine" || s.kind == "constant",
              "LrSchedule.kind must be one of wsd, cosine, constant; got '", s.kind, "'");
  check_fraction(s.warmup_frac, "warmup_frac");
  check_fraction(s.stable_frac, "stable_frac");
  check_fraction(s.decay_frac, "decay_frac");
  check_fraction(s.min_lr_ratio, "min_lr_ratio");
  TORCH_CHECK(s.decay_shape == "linear" || s.decay_shape == "cosine" || s.decay_shape == "sqrt" ||
                  s.decay_shape == "1-sqrt",
              "LrSchedule.decay_shape must be one of linear, cosine, sqrt, 1-sqrt; got '",
              s.decay_shape, "'");
  if (s.kind == "wsd") {
    const double sum = s.warmup_frac + s.stable_frac + s.decay_frac;
    TORCH_CHECK(sum <= 1.0 + 1e-9, "LrSchedule: warmup_frac + stable_frac + decay_frac must be <= 1, got ",
                s.warmup_frac, " + ", s.stable_frac, " + ", s.decay_frac, " = ", sum);
  }
}

SchedulePhases schedule_phases(const LrSchedule& s, int64_t total_steps) {
  validate(s);
  TORCH_CHECK(total_steps >= 1, "lr_factor: total_steps must be >= 1, got ", total_steps);
  SchedulePhases ph;
  ph.warmup = phase_length(total_steps, s.warmup_frac);
  if (s.kind == "wsd") {
    ph.stable = phase_length(total_steps, s.stable_frac);
    ph.decay = phase_length(total_steps, s.decay_frac);
  }
  return ph;
}

double lr_factor(const LrSchedule& s, int64_t total_steps, int64_t t) {
  const SchedulePhases ph = schedule_phases(s, total_steps);
  TORCH_CHECK(t >= 0, "lr_factor: t (optimizer step + 1) must be >= 0, got ", t);
  if (t < ph.warmup) return static_cast<double>(t) / static_cast<double>(ph.warmup);
  if (s.kind == "constant") return 1.0;
  const double m = s.min_lr_ratio;
  if (s.kind == "cosine") {
    const int64_t span = total_steps - ph.warmup;
    const double p = span <= 0 ? 1.0 : std::min(1.0, static_cast<double>(t - ph.warmup) / span);
    return m + (1.0 - m) * 0.5 * (1.0 + std::cos(kPi * p));
  }
  // wsd
  if (t < ph.warmup + ph.stable) return 1.0;
  const double p = ph.decay == 0
                       ? 1.0
                       : std::min(1.0, static_cast<double>(t - ph.warmup - ph.stable) / ph.decay);
  return m + (1.0 - m) * decay_shape_value(s.decay_shape, p);
}

}  // namespace orthopt::train

// LR schedule (algorithms.md §8): the worked example, every decay shape against the formulas
// written out here, cosine/constant, and edge cases. All values are computed in double from small
// integers, so results agree with the references to ~1e-15; 1e-12 leaves room for cos/sqrt ulps.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <string>

#include "orthopt/train/schedule.h"

using orthopt::train::LrSchedule;
using orthopt::train::lr_factor;
using orthopt::train::schedule_phases;

namespace {
constexpr double kTol = 1e-12;
const double kPi = std::acos(-1.0);
}  // namespace

TEST(LrSchedule, WorkedExampleOfSection8) {
  LrSchedule s;  // defaults: wsd 0.02 / 0.83 / 0.15, min 0.05, linear
  const int64_t T = 57220;
  const auto ph = schedule_phases(s, T);
  EXPECT_EQ(ph.warmup, 1144);
  EXPECT_EQ(ph.stable, 47492);
  EXPECT_EQ(ph.decay, 8583);
  EXPECT_NEAR(lr_factor(s, T, 572), 0.5, kTol);
  EXPECT_NEAR(lr_factor(s, T, 1144), 1.0, kTol);
  EXPECT_NEAR(lr_factor(s, T, 48636), 1.0, kTol);
  EXPECT_NEAR(lr_factor(s, T, 57219), 0.05, kTol);
  EXPECT_NEAR(lr_factor(s, T, 57220), 0.05, kTol);  // past the decay: stays at the floor
  EXPECT_NEAR(lr_factor(s, T, 1), 1.0 / 1144, kTol);
  EXPECT_NEAR(lr_factor(s, T, 1143), 1143.0 / 1144, kTol);
  EXPECT_NEAR(lr_factor(s, T, 48635), 1.0, kTol);
  EXPECT_NEAR(lr_factor(s, T, 48637), 0.05 + 0.95 * (1.0 - 1.0 / 8583), kTol);
}

TEST(LrSchedule, EveryDecayShapeMatchesItsFormula) {
  // T = 1000: W = 20, S = 830, D = 150 — decay from t = 850 to 1000.
  const int64_t T = 1000, W = 20, S = 830, D = 150;
  const double m = 0.1;
  struct Shape {
    const char* name;
    double (*f)(double);
  };
  const Shape shapes[] = {
      {"linear", [](double p) { return 1.0 - p; }},
      {"cosine", [](double p) { return 0.5 * (1.0 + std::cos(std::acos(-1.0) * p)); }},
      {"sqrt", [](double p) { return std::sqrt(1.0 - p); }},
      {"1-sqrt", [](double p) { return 1.0 - std::sqrt(p); }},
  };
  for (const Shape& shape : shapes) {
    LrSchedule s;
    s.decay_shape = shape.name;
    s.min_lr_ratio = m;
    for (int64_t t = 0; t <= T + 5; ++t) {
      double expected;
      if (t < W) {
        expected = static_cast<double>(t) / W;
      } else if (t < W + S) {
        expected = 1.0;
      } else {
        const double p = std::min(1.0, static_cast<double>(t - W - S) / D);
        expected = m + (1.0 - m) * shape.f(p);
      }
      ASSERT_NEAR(lr_factor(s, T, t), expected, kTol) << shape.name << " t=" << t;
    }
  }
}

TEST(LrSchedule, CosineAndConstant) {
  const int64_t T = 500, W = 10;  // warmup 0.02·500
  LrSchedule cosine;
  cosine.kind = "cosine";
  cosine.min_lr_ratio = 0.2;
  LrSchedule constant;
  constant.kind = "constant";
  for (int64_t t = 0; t <= T; ++t) {
    const double warm = static_cast<double>(t) / W;
    const double p = std::min(1.0, static_cast<double>(t - W) / (T - W));
    const double cos_expected = t < W ? warm : 0.2 + 0.8 * 0.5 * (1.0 + std::cos(kPi * p));
    ASSERT_NEAR(lr_factor(cosine, T, t), cos_expected, kTol) << "t=" << t;
    ASSERT_NEAR(lr_factor(constant, T, t), t < W ? warm : 1.0, kTol) << "t=" << t;
  }
  EXPECT_NEAR(lr_factor(cosine, T, T), 0.2, kTol);
}

TEST(LrSchedule, EdgeCases) {
  LrSchedule s;
  // No warmup: the first step runs at full lr (never 0/0).
  LrSchedule no_warmup = s;
  no_warmup.warmup_frac = 0.0;
  no_warmup.stable_frac = 0.85;
  EXPECT_EQ(schedule_phases(no_warmup, 100).warmup, 0);
  EXPECT_NEAR(lr_factor(no_warmup, 100, 1), 1.0, kTol);
  EXPECT_NEAR(lr_factor(no_warmup, 100, 0), 1.0, kTol);

  // T small: T = 5 gives W = 0, S = 4, D = 0 -> 1 until t = 4, then the floor (no division by 0).
  const auto ph = schedule_phases(s, 5);
  EXPECT_EQ(ph.warmup, 0);
  EXPECT_EQ(ph.stable, 4);
  EXPECT_EQ(ph.decay, 0);
  for (int64_t t = 1; t <= 5; ++t) {
    const double f = lr_factor(s, 5, t);
    EXPECT_TRUE(std::isfinite(f));
    EXPECT_NEAR(f, t < 4 ? 1.0 : 0.05, kTol) << "t=" << t;
  }
  // Decimal fractions: 100·0.29 is 28.999999999999996 in binary; §8 means floor(29) = 29.
  LrSchedule decimal = s;
  decimal.warmup_frac = 0.29;
  decimal.stable_frac = 0.56;
  EXPECT_EQ(schedule_phases(decimal, 100).warmup, 29);
  // T = 1: everything floors to zero-length phases.
  EXPECT_NEAR(lr_factor(s, 1, 1), 0.05, kTol);
  LrSchedule cosine;
  cosine.kind = "cosine";
  cosine.warmup_frac = 1.0;  // warmup covers everything: T − W = 0 after it
  EXPECT_NEAR(lr_factor(cosine, 10, 5), 0.5, kTol);
  EXPECT_NEAR(lr_factor(cosine, 10, 10), 0.05, kTol);
  // Every shape ends exactly at the floor and starts exactly at 1.
  for (const char* shape : {"linear", "cosine", "sqrt", "1-sqrt"}) {
    LrSchedule t = s;
    t.decay_shape = shape;
    EXPECT_NEAR(lr_factor(t, 57220, 48636), 1.0, kTol) << shape;
    EXPECT_NEAR(lr_factor(t, 57220, 57219), 0.05, kTol) << shape;
  }
}

TEST(LrSchedule, BadInputNamesTheField) {
  auto expect_error = [](LrSchedule s, const std::string& needle, int64_t T = 100, int64_t t = 1) {
    try {
      lr_factor(s, T, t);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  LrSchedule s;
  LrSchedule bad = s;
  bad.kind = "linear_warmup";
  expect_error(bad, "LrSchedule.kind");
  bad = s;
  bad.decay_shape = "exp";
  expect_error(bad, "LrSchedule.decay_shape");
  bad = s;
  bad.warmup_frac = -0.1;
  expect_error(bad, "warmup_frac");
  bad = s;
  bad.min_lr_ratio = 1.5;
  expect_error(bad, "min_lr_ratio");
  bad = s;
  bad.stable_frac = 0.9;  // 0.02 + 0.9 + 0.15 > 1
  expect_error(bad, "stable_frac");
  bad = s;
  bad.decay_frac = std::nan("");
  expect_error(bad, "decay_frac");
  expect_error(s, "total_steps", 0);
  expect_error(s, "t (optimizer step + 1)", 100, -1);
  EXPECT_NO_THROW(orthopt::train::validate(s));
}

// `orthopt bench ns` through the real binary ($ORTHOPT_BIN, set by ctest): the same-run dense
// product and the run floor. The floor FLOPs are recomputed here from algorithms.md §1.1 (5 steps:
// standard 15m²n + 5m³, Gram with the restart before step 2 6m²n + 14m³, per matrix with m ≤ n),
// the dense product's from its shape [B,m,m]·[B,m,n]; the run floor must be those FLOPs at the
// dense row's rate. A tall shape checks the orientation (m is the smaller side).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

struct Shape {
  std::string text;
  double batch, m, n;  // m ≤ n
};

const std::vector<Shape> kShapes = {{"48x80", 1, 48, 80}, {"96x40", 1, 40, 96}, {"2x40x96", 2, 40, 96}};

nlohmann::json run_bench(const std::string& extra, const std::string& name) {
  const auto dir = orthopt::test::scratch_root("orthopt_test_bench_ns");
  const auto json = dir / (name + ".json");
  std::string shapes;
  for (const auto& s : kShapes) shapes += (shapes.empty() ? "" : ",") + s.text;
  const std::string cmd = orthopt::test::orthopt_bin() + " bench ns --shapes " + shapes +
                          " --methods standard,gram --warmup 0 --repeats 2 --no-peer " + extra + " --json " +
                          json.string() + " > " + (dir / (name + ".out")).string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << "\n" << orthopt::test::read_file(dir / (name + ".out"));
  return nlohmann::json::parse(orthopt::test::read_file(json));
}

double plain_floor_flops(const std::string& method, const Shape& s) {
  const double m = s.m, n = s.n;
  return s.batch * (method == "gram" ? 6 * m * m * n + 14 * m * m * m : 15 * m * m * n + 5 * m * m * m);
}

}  // namespace

TEST(BenchNs, DenseProductRowAndRunFloorPerShape) {
  if (!std::getenv("ORTHOPT_BIN")) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)";
  const auto doc = run_bench("", "dense");
  EXPECT_TRUE(doc["blas"].is_string());
  for (const auto& s : kShapes) {
    const nlohmann::json* dense = nullptr;
    std::vector<const nlohmann::json*> methods;
    for (const auto& r : doc["rows"]) {
      if (r["shape"] != s.text) continue;
      if (r["method"] == "dense_product")
        dense = &r;
      else
        methods.push_back(&r);
    }
    ASSERT_NE(dense, nullptr) << s.text;
    ASSERT_EQ(methods.size(), 2u) << s.text;
    EXPECT_DOUBLE_EQ((*dense)["flops"].get<double>(), 2 * s.batch * s.m * s.m * s.n) << s.text;
    const double dense_ms = (*dense)["median_ms"].get<double>();
    ASSERT_GT(dense_ms, 0) << s.text;
    EXPECT_NEAR((*dense)["gflops"].get<double>(), 2 * s.batch * s.m * s.m * s.n / (dense_ms * 1e6),
                1e-9 * (*dense)["gflops"].get<double>());
    for (const auto* r : methods) {
      const std::string method = (*r)["method"];
      const double flops = plain_floor_flops(method, s);
      EXPECT_NEAR((*r)["floor_flops"].get<double>(), flops, 1e-9 * flops) << s.text << " " << method;
      const double expected = flops / (2 * s.batch * s.m * s.m * s.n / dense_ms);
      EXPECT_NEAR((*r)["run_floor_ms"].get<double>(), expected, 1e-9 * expected) << s.text << " " << method;
    }
  }
}

TEST(BenchNs, NoDenseSkipsTheProductAndTheRunFloor) {
  if (!std::getenv("ORTHOPT_BIN")) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)";
  const auto doc = run_bench("--no-dense", "no_dense");
  ASSERT_EQ(doc["rows"].size(), 2 * kShapes.size());
  for (const auto& r : doc["rows"]) {
    EXPECT_NE(r["method"], "dense_product");
    EXPECT_TRUE(r["run_floor_ms"].is_null());
    EXPECT_GT(r["floor_flops"].get<double>(), 0);
  }
}

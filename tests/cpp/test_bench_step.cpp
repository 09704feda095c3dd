// `orthopt bench step --dry-run` through the real binary ($ORTHOPT_BIN, set by ctest): the
// parameter sets of bench/param_sets.h as the step benchmark builds and routes them, against the
// counts docs/performance.md §2 gives (tests/python/test_bench_sets.py checks that the Python
// scripts build the same parameters).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

orthopt::test::CliResult bench_step(const std::vector<std::string>& args) {
  const auto dir = orthopt::test::scratch_root("orthopt_test_bench_step");
  std::vector<std::string> a = {"bench", "step"};
  a.insert(a.end(), args.begin(), args.end());
  return orthopt::test::run_cli(dir, a);
}

}  // namespace

TEST(BenchStep, DryRunListsTheSetsWithTheirRouting) {
  if (!std::getenv("ORTHOPT_BIN")) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)";
  const auto json = orthopt::test::scratch_root("orthopt_test_bench_step") / "sets.json";
  const auto r = bench_step({"--dry-run", "--sets", "gpt2,llama", "--json", json.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto sets = nlohmann::json::parse(orthopt::test::read_file(json)).at("sets");
  struct Expected {
    const char* set;
    int matrices, vectors, embeddings;
  };
  for (const Expected e : {Expected{"gpt2", 48, 50, 1}, Expected{"llama", 154, 45, 2}}) {
    int matrices = 0, vectors = 0, embeddings = 0;
    for (const auto& p : sets.at(e.set)) {
      const bool matrix = p.at("optimizer") == "matrix";
      if (p.at("shape").size() == 1) {
        EXPECT_FALSE(matrix) << p;
        ++vectors;
      } else if (matrix) {
        ++matrices;
      } else {
        EXPECT_EQ(p.at("optimizer"), "adamw") << p;
        ++embeddings;
      }
    }
    EXPECT_EQ(matrices, e.matrices) << e.set;
    EXPECT_EQ(vectors, e.vectors) << e.set;
    EXPECT_EQ(embeddings, e.embeddings) << e.set;
  }
  EXPECT_EQ(sets.at("gpt2").front().at("name"), "h.0.attn.c_attn.weight");
  EXPECT_EQ(sets.at("llama").back().at("name"), "lm_head.weight");
  EXPECT_NE(r.out.find("llama: 201 parameters (154 to the matrix optimizer), 1261529088 elements"), std::string::npos)
      << r.out;
}

TEST(BenchStep, UnknownSetIsRefused) {
  if (!std::getenv("ORTHOPT_BIN")) GTEST_SKIP() << "ORTHOPT_BIN not set (run through ctest)";
  const auto r = bench_step({"--dry-run", "--sets", "gpt3"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--sets"), std::string::npos) << r.err;
}

// `orthopt compare` as an optimizer study, through the real binary ($ORTHOPT_BIN): lr grids, the
// best lr (checked against the per-run results) rerun at more seeds, Dion3's fraction rows with the
// lr transfer, resuming a study run by run, a changed configuration refused, the plot step without
// matplotlib, and usage errors. Micro runs (tiny preset, 32-byte context, 4 sequences, 6 steps).
#include "test_util.h"
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "orthopt/train/config.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using orthopt::test::read_file;

fs::path scratch_root() { return orthopt::test::scratch_root("orthopt_test_compare"); }

fs::path fresh_dir(const std::string& name) { return orthopt::test::fresh_dir(scratch_root(), name); }

std::string corpus_path() {
  static const std::string path = orthopt::test::write_word_corpus(scratch_root() / "corpus.txt", 987654321ULL);
  return path;
}

using Result = orthopt::test::CliResult;
Result run(const std::vector<std::string>& args) { return orthopt::test::run_cli(scratch_root(), args); }


std::vector<std::string> micro(const fs::path& dir, std::vector<std::string> extra) {
  std::vector<std::string> a = {"compare", "--preset", "tiny", "--context", "32", "--batch-size", "4", "--steps", "6",
                                "--eval-every", "3", "--eval-batches", "2", "--data", corpus_path(), "--run-dir",
                                dir.string()};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A CSV file as maps from its header's names to the fields (no quoting in compare's files).
std::vector<std::map<std::string, std::string>> read_csv(const fs::path& p) {
  std::istringstream in(read_file(p));
  std::string line;
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  auto split = [](const std::string& s) {
    std::vector<std::string> f;
    std::string cur;
    for (char ch : s) {
      if (ch == ',') f.push_back(cur), cur.clear();
      else cur += ch;
    }
    f.push_back(cur);
    return f;
  };
  while (std::getline(in, line)) {
    if (header.empty()) {
      header = split(line);
      continue;
    }
    const auto f = split(line);
    EXPECT_EQ(f.size(), header.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < f.size(); ++i) row[header[i]] = f[i];
    rows.push_back(row);
  }
  return rows;
}

json result_of(const fs::path& run) { return json::parse(read_file(run / "result.json")); }

// Modification times of every file under `dir`.
std::map<std::string, fs::file_time_type> mtimes(const fs::path& dir) {
  std::map<std::string, fs::file_time_type> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[e.path().string()] = e.last_write_time();
  return m;
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

double sample_std(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m += x / static_cast<double>(v.size());
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

TEST(Compare, GridBestSeedsResumeAndChangedConfig) {
  const auto dir = fresh_dir("study");
  const std::map<std::string, std::vector<std::string>> grid = {{"adamw", {"0.001", "0.004"}}, {"muon", {"0.005", "0.02"}}};
  const auto args = micro(dir, {"--algorithms", "adamw,muon", "--lrs", "adamw=0.001,0.004", "muon=0.005,0.02",
                                "--best-seeds", "1,2,3", "--no-plot"});
  auto r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  const auto summary = read_csv(dir / "compare.csv");
  const auto grid_csv = read_csv(dir / "grid.csv");
  ASSERT_EQ(summary.size(), 2u);
  ASSERT_EQ(grid_csv.size(), 4u);
  for (const auto& entry : grid) {
    const std::string& alg = entry.first;  // not a structured binding: lambdas below capture it
    const std::vector<std::string>& lrs = entry.second;
    SCOPED_TRACE(alg);
    // The best lr from the per-run results, computed here.
    std::string best;
    double best_loss = INFINITY;
    for (const auto& lr : lrs) {
      const json res = result_of(dir / (alg + "_lr" + lr + "_seed1"));
      EXPECT_EQ(res["status"], "complete");
      EXPECT_EQ(res["config"]["lr"].get<double>(), std::stod(lr));
      EXPECT_EQ(res["config"]["seed"].get<uint64_t>(), 1u);
      const double loss = res["final_val_loss"].get<double>();
      ASSERT_TRUE(std::isfinite(loss));
      if (loss < best_loss) best_loss = loss, best = lr;
      // The written grid holds the same loss (8 significant digits) and marks the best.
      const auto it = std::find_if(grid_csv.begin(), grid_csv.end(), [&](const auto& g) {
        return g.at("optimizer") == alg && std::stod(g.at("lr")) == std::stod(lr);
      });
      ASSERT_NE(it, grid_csv.end());
      EXPECT_NEAR(std::stod(it->at("final_val_loss_mean")), loss, 1e-7 * loss);
      EXPECT_NEAR(std::stod(it->at("final_val_bpb_mean")), loss / std::log(2.0), 1e-7 * loss);
    }
    for (const auto& g : grid_csv)
      if (g.at("optimizer") == alg) EXPECT_EQ(g.at("best"), std::stod(g.at("lr")) == std::stod(best) ? "1" : "0");
    // The best lr ran at seeds 2 and 3, the other lr did not.
    std::vector<double> losses;
    for (int seed : {1, 2, 3}) {
      const json res = result_of(dir / (alg + "_lr" + best + "_seed" + std::to_string(seed)));
      EXPECT_EQ(res["config"]["seed"].get<uint64_t>(), static_cast<uint64_t>(seed));
      losses.push_back(res["final_val_loss"].get<double>());
    }
    for (const auto& lr : lrs)
      if (lr != best) EXPECT_FALSE(fs::exists(dir / (alg + "_lr" + lr + "_seed2")));
    const auto row = std::find_if(summary.begin(), summary.end(), [&](const auto& s) { return s.at("optimizer") == alg; });
    ASSERT_NE(row, summary.end());
    EXPECT_EQ(std::stod(row->at("lr")), std::stod(best));
    EXPECT_EQ(row->at("seeds"), "3");
    const double mean = (losses[0] + losses[1] + losses[2]) / 3.0;
    EXPECT_NEAR(std::stod(row->at("final_val_loss_mean")), mean, 1e-7 * mean);
    EXPECT_NEAR(std::stod(row->at("final_val_loss_std")), sample_std(losses), 1e-6 * mean);
    EXPECT_NEAR(std::stod(row->at("final_val_bpb_std")), sample_std(losses) / std::log(2.0), 1e-6 * mean);
  }
  // One line per run in runs.csv, the grid's seed-1 runs reused by the best-lr phase.
  auto runs = read_csv(dir / "runs.csv");
  EXPECT_EQ(runs.size(), 8u);
  std::set<std::string> names;
  for (const auto& x : runs) names.insert(x.at("name"));
  EXPECT_EQ(names.size(), 8u);
  EXPECT_NE(read_file(dir / "compare.md").find("## lr grid"), std::string::npos);

  // Repeated unchanged: nothing runs again. With one result removed (a study stopped during that
  // run), only that run runs again, from the start, and gives the same loss.
  const fs::path cut = dir / ("muon_lr" + std::string(grid.at("muon")[0]) + "_seed1");
  const double cut_loss = result_of(cut)["final_val_loss"].get<double>();
  auto before = mtimes(dir);
  r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_of(r.out, "done before"), 8u) << r.out;
  EXPECT_NE(r.out.find("ran 0 run(s) and reused 8"), std::string::npos) << r.out;
  for (const auto& [path, t] : before)
    if (path.find("result.json") != std::string::npos || path.find("metrics.jsonl") != std::string::npos) {
      ASSERT_TRUE(fs::exists(path)) << path;
      EXPECT_EQ(fs::last_write_time(path), t) << path;
    }
  fs::remove(cut / "result.json");
  before = mtimes(dir);
  r = run(args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(count_of(r.out, "done before"), 7u) << r.out;
  EXPECT_NE(r.out.find("starts again"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(cut / "result.json"));
  EXPECT_EQ(result_of(cut)["final_val_loss"].get<double>(), cut_loss);  // one thread on the CPU: bit-identical
  for (const auto& [path, t] : before)
    if (path.find("result.json") != std::string::npos) EXPECT_EQ(fs::last_write_time(path), t) << path;
  runs = read_csv(dir / "runs.csv");
  EXPECT_EQ(runs.size(), 9u);  // the rerun appended its line
  EXPECT_EQ(runs.back().at("name"), cut.filename().string());

  // A changed configuration names the run and the key, exits 2 and changes nothing.
  before = mtimes(dir);
  auto changed = args;
  changed.insert(changed.end(), {"--weight-decay", "0.02"});
  r = run(changed);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("run 'adamw_lr0.001_seed1'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("weight_decay 0.01 there, 0.02 now"), std::string::npos) << r.err;
  EXPECT_EQ(mtimes(dir), before);

  // The plot step: a python without matplotlib (plot_compare.py's exit status 3) is reported with
  // the command that draws it later, and the study succeeds; any other failure is an error.
  const auto no_mpl = scratch_root() / "no_matplotlib.py";
  std::ofstream(no_mpl) << "import sys\nsys.exit(3)\n";
  auto plotted = args;
  plotted.pop_back();  // --no-plot
  plotted.insert(plotted.end(), {"--plot-script", no_mpl.string()});
  r = run(plotted);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("plot: not drawn: /usr/bin/python3 has no matplotlib"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(no_mpl.string() + "' '" + dir.string() + "'"), std::string::npos) << r.out;
  const auto broken = scratch_root() / "broken.py";
  std::ofstream(broken) << "import sys\nsys.exit(1)\n";
  plotted.back() = broken.string();
  r = run(plotted);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("the plot command failed"), std::string::npos) << r.err;
}

TEST(Compare, Dion3FractionRowsTransferTheLr) {
  const auto dir = fresh_dir("fractions");
  auto r = run(micro(dir, {"--steps", "4", "--eval-every", "2", "--algorithms", "muon,dion3", "--lrs", "muon=0.005,0.02",
                           "dion3=muon*1", "--dion3-fractions", "0.5,0.25", "--target-loss", "5", "--no-plot"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const double l1 = result_of(dir / "muon_lr0.005_seed1")["final_val_loss"].get<double>();
  const double l2 = result_of(dir / "muon_lr0.02_seed1")["final_val_loss"].get<double>();
  const std::string best = l1 < l2 ? "0.005" : "0.02";
  // f = 0.25 (--fraction's default) runs dion3's grid, muon's best lr times 1; f = 0.5 runs at the
  // same configured lr, which dion3's lr/sqrt(f) turns into the transferred effective lr.
  std::map<std::string, double> loss;
  for (const std::string f : {"0.5", "0.25"}) {
    const json res = result_of(dir / ("dion3_f" + f + "_lr" + best + "_seed1"));
    EXPECT_EQ(res["config"]["fraction"].get<double>(), std::stod(f));
    EXPECT_EQ(res["lr"].get<double>(), std::stod(best));
    EXPECT_NEAR(res["effective_lr"].get<double>(), std::stod(best) / std::sqrt(std::stod(f)), 1e-15);
    loss[f] = res["final_val_loss"].get<double>();
  }
  EXPECT_NE(loss["0.5"], loss["0.25"]);  // the fraction reaches the optimizer
  const auto summary = read_csv(dir / "compare.csv");
  ASSERT_EQ(summary.size(), 3u);
  std::set<std::string> rows;
  for (const auto& s : summary) rows.insert(s.at("optimizer"));
  EXPECT_EQ(rows, (std::set<std::string>{"muon", "dion3 f=0.5", "dion3 f=0.25"}));
  EXPECT_NE(read_file(dir / "compare.md").find("| dion3 f=0.5 | " + best + " | "), std::string::npos);
}

TEST(Compare, UsageErrorsExit2AndWriteNothing) {
  const auto dir = fresh_dir("usage");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--lrs", "0.01"}, "--lrs: expected algorithm=lr before '0.01'"},
      {{"--lrs", "muon=0.01", "muon=0.02"}, "--lrs: muon is given twice"},
      {{"--lrs", "muon=0.01,0.01"}, "muon lists 0.01 twice"},
      {{"--lrs", "muon=0.01,x1"}, "not a row of this study"},
      {{"--lrs", "muon=abc*"}, "--lrs: expected a number"},
      {{"--lrs", "sgd=0.1"}, "'sgd' is not one of the compared algorithms"},
      {{"--lrs", "muon=20"}, "must be in (0, 10]"},
      {{"--algorithms", "adamw,muon", "--lrs", "adamw=muon*0.1", "muon=adamw*10"}, "cycle"},
      {{"--algorithms", "adamw,muon", "--dion3-fractions", "0.5"}, "--dion3-fractions: dion3 is not one of --algorithms"},
      {{"--dion3-fractions", "0.5,0.125"}, "must hold --fraction (0.25)"},
      {{"--dion3-fractions", "0.5,1.5"}, "(0, 1]"},
      {{"--lr-transfer", "cube"}, "--lr-transfer: must be sqrt or grid"},
      {{"--best-seeds", "1,1"}, "--best-seeds: seed 1 is given twice"},
      {{"--fraction", "0"}, "fraction: must be in (0, 1]"},
  };
  for (const auto& [extra, needle] : cases) {
    SCOPED_TRACE(extra[1]);
    const auto r = run(micro(dir, extra));
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << needle << "\n" << r.err;
    EXPECT_FALSE(fs::exists(dir));
  }
}

// The trainer key `fraction` (added for the dion3 rows) is hashed only when not the default 0.25,
// the fraction every dion3 run before it used: their checkpoints still resume.
TEST(Compare, FractionKeyInTheConfigHashOnlyWhenNotTheDefault) {
  using namespace orthopt::train;
  const std::string plain = config_sha256(config_from_json(json::object()), "data");
  EXPECT_EQ(config_sha256(config_from_json(json{{"fraction", 0.25}}), "data"), plain);
  EXPECT_NE(config_sha256(config_from_json(json{{"fraction", 0.5}}), "data"), plain);
  EXPECT_EQ(to_json(config_from_json(json{{"fraction", 0.125}}))["fraction"], 0.125);
}

}  // namespace

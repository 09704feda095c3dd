#pragma once
// Shared by compare.cpp (plans and runs a study) and compare_report.cpp (its tables and plot).

#include <cstdint>
#include <iosfwd>
#include <limits>
#include <string>
#include <vector>

#include "orthopt/train/compare.h"

namespace orthopt::train::compare_detail {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One training run of a study, as <run_dir>/<name>/result.json records it.
struct RunRecord {
  std::string name;
  std::string row;        // the row's label: "muon", "dion3 f=0.25"
  std::string algorithm;
  double fraction = 0.0;  // dion3's f, 0 for the others
  double lr = 0.0;        // as configured
  double effective_lr = 0.0;
  uint64_t seed = 0;
  std::string status;     // complete | diverged (the non-finite firewall gave up)
  double final_val_loss = kNaN;
  std::vector<EvalPoint> evals;
  double optimizer_ms_per_step = kNaN;
  double tokens_per_s = kNaN;
  double wall_s = 0.0;
  bool reused = false;    // read from an earlier invocation's result.json
};

// One lr of a row's grid at the grid seeds.
struct GridPoint {
  double lr = 0.0;
  std::vector<const RunRecord*> runs;  // one per grid seed
  double mean_loss = kNaN;             // +inf when a seed diverged
};

struct RowResult {
  std::string label, algorithm;
  double fraction = 0.0;                    // dion3's f, 0 for the others
  std::vector<GridPoint> grid;
  int best = -1;                            // index into grid; -1: every grid point diverged or not run
  bool edge = false;                        // best at the smallest or largest lr of a grid of >= 2
  std::string not_run;                      // why the row ran nothing, else ""
  std::vector<const RunRecord*> best_runs;  // the best lr at the summary seeds
};

std::string num_text(double x);  // %g with 6 significant digits
double mean_of(const std::vector<double>& v);
double std_of(const std::vector<double>& v);  // sample (n-1); 0 for one value
double effective_lr(const std::string& algorithm, double fraction, double lr);

// Writes grid.csv, compare.csv, curves.csv and compare.md (compare.csv last), logs the tables
// and returns the summary rows.
std::vector<CompareRow> write_report(const CompareConfig& c, const std::vector<RowResult>& rows, size_t ran,
                                     size_t reused, double wall_s, std::ostream& log);

// Runs scripts/plot_compare.py on run_dir. A python without matplotlib (or no python) is said in
// the log with the command that draws the plot later; any other failure throws.
void draw_plot(const CompareConfig& c, std::ostream& log);

}  // namespace orthopt::train::compare_detail

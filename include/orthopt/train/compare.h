#pragma once
// `orthopt compare` as a library function: one optimizer study (docs/training.md "Optimizer
// study"): an lr grid per optimizer, each optimizer's best lr at more seeds, Dion3's fraction as a
// grid axis, resumable run by run.

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "orthopt/train/config.h"
#include "orthopt/train/trainer.h"

namespace orthopt::train {

// One lr of a grid: `value`, or when `relative_to` names a compared algorithm, `factor` times
// that algorithm's best lr (rounded to 6 significant digits, as the run names show it).
struct LrSpec {
  double value = 0.0;
  std::string relative_to;
  double factor = 1.0;
};

struct CompareConfig {
  TrainConfig base;                          // model, data, steps... (algorithm/lr/seed/run_dir overridden)
  std::vector<std::string> algorithms = {"adamw", "muon", "normuon", "dion3"};
  std::map<std::string, std::vector<LrSpec>> lrs;  // per algorithm; missing: default_matrix_lr
  std::vector<uint64_t> seeds = {1};         // every grid point runs at these seeds
  // Empty: the summary is over `seeds`. Else each row's best lr (lowest mean final validation
  // loss over `seeds`) runs at these seeds and the summary is over them.
  std::vector<uint64_t> best_seeds;
  // Empty: dion3 runs at base.fraction. Else one row per fraction ("dion3 f=0.25").
  std::vector<double> dion3_fractions;
  // sqrt: dion3's grid runs at base.fraction and the other fractions at its best lr, which the
  // trainer's lr/sqrt(f) scaling turns into the effective lr η_ref·sqrt(f_ref/f) (§5.7);
  // grid: every fraction runs the whole grid.
  std::string lr_transfer = "sqrt";
  double target_loss = 0.0;                  // 0: AdamW's mean final validation loss
  std::string run_dir = "runs/compare";
  std::string plot_script;                   // empty: no plot; else path of scripts/plot_compare.py
  std::string python = "/usr/bin/python3";
};

struct CompareRow {
  std::string label;                         // "muon", "dion3 f=0.25"
  std::string algorithm;
  double fraction = 0.0;                     // dion3's f; 0 for the others
  double lr = 0.0;                           // the best lr of the row's grid (as configured)
  double effective_lr = 0.0;                 // lr / sqrt(f) for dion3 (the trainer's scaling), else lr
  bool lr_at_grid_edge = false;              // the best is the smallest or largest lr of a grid of >= 2
  std::vector<uint64_t> seeds;
  std::vector<double> final_losses;          // one per seed; NaN: the run diverged
  // One per seed: where the validation curve first reaches the target, linearly interpolated
  // between the two evaluations around the crossing; -1: not reached. With the default target
  // (AdamW's mean final loss) AdamW's own entries are its step budget, by definition.
  std::vector<double> steps_to_target;
  double optimizer_ms_per_step = 0.0;        // mean over seeds
  double tokens_per_s = 0.0;                 // mean over seeds
};

// Runs the study in <run_dir>/<run name>/ (no checkpoints; result.json marks a finished run, which
// a repeated command reuses), appends each run to runs.csv, writes grid.csv, compare.csv,
// compare.md and curves.csv into run_dir and, when plot_script is set, compare.png.
std::vector<CompareRow> run_compare(const CompareConfig& c, std::ostream& log);

}  // namespace orthopt::train

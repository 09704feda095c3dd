// `orthopt compare`: the same model, data and step budget under several optimizers.
#include <c10/util/Exception.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "orthopt/train/data.h"
#include "orthopt/train/trainer.h"

namespace orthopt::train {

namespace fs = std::filesystem;

namespace {

double mean_of(const std::vector<double>& v) {
  return v.empty() ? std::nan("") : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Sample standard deviation (n−1); 0 for a single seed.
double std_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean_of(v);
  double s = 0.0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// An lr as %g with 6 significant digits, whatever the state of the stream it goes into.
std::string lr_text(double lr) {
  std::ostringstream ss;
  ss << lr;
  return ss.str();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

}  // namespace

double steps_to_reach(const std::vector<EvalPoint>& evals, double target) {
  for (size_t i = 0; i < evals.size(); ++i) {
    if (evals[i].val_loss > target) continue;
    if (i == 0 || evals[i - 1].val_loss == evals[i].val_loss) return static_cast<double>(evals[i].step);
    const EvalPoint& a = evals[i - 1];
    const EvalPoint& b = evals[i];
    return static_cast<double>(a.step) +
           (a.val_loss - target) / (a.val_loss - b.val_loss) * static_cast<double>(b.step - a.step);
  }
  return -1.0;
}

std::vector<CompareRow> run_compare(const CompareConfig& c, std::ostream& log) {
  TORCH_CHECK(!c.algorithms.empty(), "--algorithms: at least one algorithm is needed");
  TORCH_CHECK(!c.seeds.empty(), "--seeds: at least one seed is needed");
  for (const auto& a : c.algorithms) {  // every run's configuration, before the first run starts
    TrainConfig t = c.base;
    t.algorithm = a;
    validate(t);
  }
  for (const auto& kv : c.lrs) {
    TORCH_CHECK(std::find(c.algorithms.begin(), c.algorithms.end(), kv.first) != c.algorithms.end(),
                "--lrs: '", kv.first, "' is not one of the compared algorithms");
    TORCH_CHECK(kv.second > 0.0 && kv.second <= 10.0, "--lrs: lr of ", kv.first, " must be in (0, 10], got ", kv.second);
  }
  const bool has_adamw = std::find(c.algorithms.begin(), c.algorithms.end(), "adamw") != c.algorithms.end();
  TORCH_CHECK(c.target_loss > 0.0 || has_adamw, "--target-loss: needed when adamw is not compared (the default target is AdamW's final loss)");
  std::error_code ec;
  TORCH_CHECK(!fs::exists(fs::path(c.run_dir) / "compare.csv", ec), "run_dir '", c.run_dir,
              "' already holds a comparison; choose another --run-dir");
  fs::create_directories(c.run_dir);

  // AdamW first: its final loss is the default target.
  std::vector<std::string> order = c.algorithms;
  if (has_adamw) std::stable_partition(order.begin(), order.end(), [](const std::string& a) { return a == "adamw"; });

  std::vector<CompareRow> rows;
  std::map<std::string, std::vector<std::vector<EvalPoint>>> curves;
  const size_t total_runs = order.size() * c.seeds.size();
  size_t run_index = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& alg : order) {
    CompareRow row;
    row.algorithm = alg;
    row.lr = c.lrs.count(alg) ? c.lrs.at(alg) : default_matrix_lr(alg);
    std::vector<double> opt_ms, tok_s;
    for (uint64_t seed : c.seeds) {
      TrainConfig t = c.base;
      t.algorithm = alg;
      t.lr = row.lr;
      t.seed = seed;
      t.run_dir = (fs::path(c.run_dir) / (alg + "_seed" + std::to_string(seed))).string();
      t.resume = false;
      t.save_checkpoints = false;
      t.stop_after = 0;
      t.inject_nonfinite.clear();
      t.progress = "off";
      const std::string log_path = (fs::path(c.run_dir) / (alg + "_seed" + std::to_string(seed) + ".log")).string();
      std::ostringstream run_log;
      const auto t_run = std::chrono::steady_clock::now();
      TrainResult r;
      try {
        r = train(t, run_log);
      } catch (...) {
        try {
          write_file_atomically(log_path, run_log.str());  // the failed run's log, when the disk takes it
        } catch (const c10::Error&) {
        }
        throw;
      }
      write_file_atomically(log_path, run_log.str());  // checked, like every output of compare
      ++run_index;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count();
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      log << "[" << run_index << "/" << total_runs << "] " << alg << " lr " << lr_text(row.lr) << " seed " << seed
          << ": final val loss " << std::fixed << std::setprecision(4) << r.final_val_loss << " ("
          << std::setprecision(1) << secs << " s; " << elapsed << " s total)" << std::defaultfloat << std::endl;
      row.final_losses.push_back(r.final_val_loss);
      opt_ms.push_back(r.optimizer_ms_per_step);
      tok_s.push_back(r.tokens_per_s);
      curves[alg].push_back(r.evals);
    }
    row.optimizer_ms_per_step = mean_of(opt_ms);
    row.tokens_per_s = mean_of(tok_s);
    rows.push_back(row);
  }

  const double target = c.target_loss > 0.0 ? c.target_loss : mean_of(rows.front().final_losses);
  for (auto& row : rows)
    for (const auto& evals : curves[row.algorithm])
      row.steps_to_target.push_back(row.algorithm == "adamw" && c.target_loss <= 0.0 ? static_cast<double>(c.base.steps)
                                                                                     : steps_to_reach(evals, target));

  // ---- tables ----
  auto reached = [](const CompareRow& r) {
    std::vector<double> v;
    for (double s : r.steps_to_target)
      if (s >= 0) v.push_back(s);
    return v;
  };
  double adamw_steps = std::nan("");
  for (const auto& r : rows)
    if (r.algorithm == "adamw" && reached(r).size() == r.steps_to_target.size()) adamw_steps = mean_of(reached(r));

  std::ostringstream csv, md;
  csv << "algorithm,lr,seeds,final_val_loss_mean,final_val_loss_std,final_val_bpb_mean,target_loss,"
         "steps_to_target_mean,seeds_reaching_target,optimizer_ms_per_step,tokens_per_s\n";
  md << "| optimizer | lr | final val loss (mean ± std) | bits/byte | steps to " << std::fixed << std::setprecision(4)
     << target << " | vs AdamW | optimizer ms/step | tokens/s |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    const auto hit = reached(r);
    const double m = mean_of(r.final_losses), sd = std_of(r.final_losses);
    const double steps = mean_of(hit);
    csv << r.algorithm << "," << lr_text(r.lr) << "," << r.final_losses.size() << "," << std::defaultfloat
        << std::setprecision(6) << m << "," << sd << "," << bits_per_byte(m) << "," << target << ","
        << (hit.empty() ? std::string("") : std::to_string(steps)) << "," << hit.size() << "," << std::fixed
        << std::setprecision(3) << r.optimizer_ms_per_step << "," << std::setprecision(0) << r.tokens_per_s << "\n";
    std::ostringstream steps_cell, vs_cell;
    if (hit.empty()) {
      steps_cell << "not reached";
    } else {
      steps_cell << std::fixed << std::setprecision(0) << steps;
      if (hit.size() < r.steps_to_target.size()) steps_cell << " (" << hit.size() << "/" << r.steps_to_target.size() << " seeds)";
    }
    if (!hit.empty() && std::isfinite(adamw_steps) && hit.size() == r.steps_to_target.size())
      vs_cell << std::showpos << std::fixed << std::setprecision(0) << 100.0 * (steps - adamw_steps) / adamw_steps << "%";
    else
      vs_cell << "–";
    std::ostringstream sd_cell;  // a standard deviation needs two seeds
    if (r.final_losses.size() >= 2) sd_cell << std::fixed << std::setprecision(4) << sd; else sd_cell << "–";
    md << "| " << r.algorithm << " | " << lr_text(r.lr) << " | " << std::fixed << std::setprecision(4) << m
       << " ± " << sd_cell.str() << " | " << std::setprecision(3) << bits_per_byte(m) << " | " << steps_cell.str() << " | "
       << vs_cell.str() << " | " << std::setprecision(2) << r.optimizer_ms_per_step << " | " << std::setprecision(0)
       << r.tokens_per_s << " |\n";
  }
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  md << "\n" << c.base.preset << " preset, " << c.base.steps << " steps of " << c.base.batch_size << "×"
     << (c.base.context ? std::to_string(c.base.context) : std::string("preset-context")) << " bytes (grad_accum "
     << c.base.grad_accum << "), " << c.seeds.size() << " seed(s), evaluation every " << c.base.eval_every
     << " steps (steps to target interpolated between evaluations); target = "
     << (c.target_loss > 0.0 ? "--target-loss" : "AdamW's mean final validation loss") << ". Wall time "
     << std::setprecision(0) << total_s << " s.\n";
  write_file_atomically((fs::path(c.run_dir) / "compare.md").string(), md.str());

  std::ostringstream curve_csv;
  curve_csv << "algorithm,seed,step,val_loss\n" << std::setprecision(8);
  for (const auto& alg : order)
    for (size_t i = 0; i < c.seeds.size(); ++i)
      for (const auto& e : curves[alg][i]) curve_csv << alg << "," << c.seeds[i] << "," << e.step << "," << e.val_loss << "\n";
  write_file_atomically((fs::path(c.run_dir) / "curves.csv").string(), curve_csv.str());
  // compare.csv last: its presence marks a finished comparison.
  write_file_atomically((fs::path(c.run_dir) / "compare.csv").string(), csv.str());
  log << "\n" << md.str();

  if (!c.plot_script.empty()) {
    const std::string png = (fs::path(c.run_dir) / "compare.png").string();
    const std::string cmd = shell_quote(c.python) + " " + shell_quote(c.plot_script) + " " +
                            shell_quote((fs::path(c.run_dir) / "curves.csv").string()) + " " + shell_quote(png) +
                            " --target " + std::to_string(target);
    const int status = std::system(cmd.c_str());
    TORCH_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "compare: the plot command failed (",
                cmd, "); the tables are written");
    log << "plot: " << png << "\n";
  }
  return rows;
}

}  // namespace orthopt::train

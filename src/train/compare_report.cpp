// The tables and the plot of an optimizer study (include/orthopt/train/compare.h).
#include <c10/util/Exception.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "compare_internal.h"
#include "orthopt/train/data.h"

namespace orthopt::train::compare_detail {

namespace fs = std::filesystem;

namespace {

std::string fixed(double x, int digits) {
  std::ostringstream ss;
  ss << std::fixed << std::setprecision(digits) << x;
  return ss.str();
}

// A CSV number: empty when not finite.
std::string csv_num(double x, int digits = 8) {
  std::ostringstream ss;
  if (std::isfinite(x)) ss << std::setprecision(digits) << x;
  return ss.str();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string seed_list(const std::vector<uint64_t>& seeds) {
  std::string s;
  for (uint64_t x : seeds) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// The summary of one row: its best lr at the summary seeds.
struct Summary {
  const RowResult* res;
  CompareRow row;
  std::vector<double> finite;  // final losses of the runs that did not diverge
  std::vector<double> hit;     // steps to target of the runs that reached it
};

}  // namespace

std::vector<CompareRow> write_report(const CompareConfig& c, const std::vector<RowResult>& rows, size_t ran,
                                     size_t reused, double wall_s, std::ostream& log) {
  std::vector<Summary> sums;
  for (const auto& res : rows) {
    Summary s{&res, {}, {}, {}};
    s.row.label = res.label;
    s.row.algorithm = res.algorithm;
    s.row.fraction = res.fraction;
    if (res.best >= 0) {
      s.row.lr = res.grid[res.best].lr;
      s.row.effective_lr = effective_lr(res.algorithm, res.fraction, s.row.lr);
      s.row.lr_at_grid_edge = res.edge;
    }
    std::vector<double> ms, tok;
    for (const RunRecord* r : res.best_runs) {
      s.row.seeds.push_back(r->seed);
      s.row.final_losses.push_back(r->final_val_loss);
      if (!std::isfinite(r->final_val_loss)) continue;
      s.finite.push_back(r->final_val_loss);
      ms.push_back(r->optimizer_ms_per_step);
      tok.push_back(r->tokens_per_s);
    }
    s.row.optimizer_ms_per_step = mean_of(ms);
    s.row.tokens_per_s = mean_of(tok);
    sums.push_back(s);
  }
  const bool default_target = c.target_loss <= 0.0;
  double target = c.target_loss;
  if (default_target)
    for (const auto& s : sums)
      if (s.row.label == "adamw") target = mean_of(s.finite);
  double adamw_steps = kNaN;
  for (auto& s : sums) {
    for (const RunRecord* r : s.res->best_runs) {
      double steps = -1.0;
      if (std::isfinite(target) && std::isfinite(r->final_val_loss))
        steps = s.row.label == "adamw" && default_target ? static_cast<double>(c.base.steps) : steps_to_reach(r->evals, target);
      s.row.steps_to_target.push_back(steps);
      if (steps >= 0) s.hit.push_back(steps);
    }
    if (s.row.label == "adamw" && !s.hit.empty() && s.hit.size() == s.row.steps_to_target.size()) adamw_steps = mean_of(s.hit);
  }
  const bool any_dion3 = std::any_of(rows.begin(), rows.end(), [](const RowResult& r) { return r.algorithm == "dion3"; });
  const std::vector<uint64_t>& summary_seeds = c.best_seeds.empty() ? c.seeds : c.best_seeds;

  // ---- compare.csv and the summary table ----
  std::ostringstream csv, md;
  csv << "optimizer,algorithm,fraction,lr,effective_lr,seeds,final_val_loss_mean,final_val_loss_std,final_val_bpb_mean,"
         "final_val_bpb_std,diverged_seeds,target_loss,steps_to_target_mean,seeds_reaching_target,optimizer_ms_per_step,"
         "tokens_per_s,lr_at_grid_edge\n";
  md << "## Summary: each optimizer's best lr, seeds " << seed_list(summary_seeds) << "\n\n| optimizer | lr |"
     << (any_dion3 ? " effective lr |" : "") << " final val loss (mean ± std) | bits/byte (mean ± std) | steps to "
     << (std::isfinite(target) ? fixed(target, 4) : std::string("target")) << " | vs AdamW | optimizer ms/step | tokens/s |\n|---|---|"
     << (any_dion3 ? "---|" : "") << "---|---|---|---|---|---|\n";
  for (const auto& s : sums) {
    const CompareRow& r = s.row;
    const size_t n = r.final_losses.size(), n_div = n - s.finite.size();
    const double m = mean_of(s.finite), sd = std_of(s.finite);
    const double steps = mean_of(s.hit);
    csv << r.label << "," << r.algorithm << "," << (r.fraction > 0 ? num_text(r.fraction) : "") << ","
        << (s.res->best >= 0 ? num_text(r.lr) : "") << "," << (s.res->best >= 0 ? num_text(r.effective_lr) : "") << ","
        << n << "," << csv_num(m) << "," << csv_num(s.finite.size() >= 2 ? sd : kNaN) << "," << csv_num(bits_per_byte(m))
        << "," << csv_num(s.finite.size() >= 2 ? sd / std::log(2.0) : kNaN) << "," << n_div << "," << csv_num(target) << ","
        << (s.hit.empty() ? std::string() : csv_num(steps)) << "," << s.hit.size() << ","
        << csv_num(r.optimizer_ms_per_step, 5) << "," << csv_num(r.tokens_per_s, 7) << "," << (r.lr_at_grid_edge ? 1 : 0)
        << "\n";
    md << "| " << r.label << " | ";
    if (s.res->best < 0) {
      md << (s.res->not_run.empty() ? "every lr diverged" : s.res->not_run) << " |" << (any_dion3 ? " |" : "")
         << " | | | | | |\n";
      continue;
    }
    md << num_text(r.lr) << (r.lr_at_grid_edge ? " (grid edge)" : "") << " | ";
    if (any_dion3) md << num_text(r.effective_lr) << " | ";
    if (s.finite.empty()) {
      md << "diverged | | | | | |\n";
      continue;
    }
    const std::string sd_text = s.finite.size() >= 2 ? fixed(sd, 4) : "–";  // a standard deviation needs two seeds
    const std::string sd_bpb = s.finite.size() >= 2 ? fixed(sd / std::log(2.0), 4) : "–";
    const std::string div_note = n_div ? " (" + std::to_string(n_div) + "/" + std::to_string(n) + " seeds diverged)" : "";
    std::string steps_cell = "not reached", vs_cell = "–";
    if (!s.hit.empty()) {
      steps_cell = fixed(steps, 0);
      if (s.hit.size() < n) steps_cell += " (" + std::to_string(s.hit.size()) + "/" + std::to_string(n) + " seeds)";
      if (std::isfinite(adamw_steps) && s.hit.size() == n) {
        std::ostringstream v;
        v << std::showpos << std::fixed << std::setprecision(0) << 100.0 * (steps - adamw_steps) / adamw_steps << "%";
        vs_cell = v.str();
      }
    }
    md << fixed(m, 4) << " ± " << sd_text << div_note << " | " << fixed(bits_per_byte(m), 4) << " ± " << sd_bpb << " | "
       << steps_cell << " | " << vs_cell << " | " << fixed(r.optimizer_ms_per_step, 2) << " | "
       << fixed(r.tokens_per_s, 0) << " |\n";
  }

  // ---- grid.csv and the grid table ----
  std::ostringstream grid;
  grid << "optimizer,algorithm,fraction,lr,effective_lr,seeds,final_val_loss_mean,final_val_bpb_mean,diverged_seeds,best\n";
  md << "\n## lr grid, seed" << (c.seeds.size() > 1 ? "s " : " ") << seed_list(c.seeds)
     << (c.seeds.size() > 1 ? " (mean)" : "") << "\n\n| optimizer | lr |" << (any_dion3 ? " effective lr |" : "")
     << " final val loss | bits/byte | |\n|---|---|" << (any_dion3 ? "---|" : "") << "---|---|---|\n";
  for (const auto& res : rows)
    for (size_t k = 0; k < res.grid.size(); ++k) {
      const GridPoint& g = res.grid[k];
      const bool best = static_cast<int>(k) == res.best;
      size_t n_div = 0;
      for (const RunRecord* r : g.runs) n_div += std::isfinite(r->final_val_loss) ? 0 : 1;
      const double m = std::isfinite(g.mean_loss) ? g.mean_loss : kNaN;
      const double eff = effective_lr(res.algorithm, res.fraction, g.lr);
      grid << res.label << "," << res.algorithm << "," << (res.fraction > 0 ? num_text(res.fraction) : "") << ","
           << num_text(g.lr) << "," << num_text(eff) << "," << g.runs.size() << "," << csv_num(m, 8) << ","
           << csv_num(bits_per_byte(m), 8) << "," << n_div << "," << (best ? 1 : 0) << "\n";
      md << "| " << res.label << " | " << num_text(g.lr) << " | " << (any_dion3 ? num_text(eff) + " | " : "")
         << (n_div ? "diverged (" + std::to_string(n_div) + "/" + std::to_string(g.runs.size()) + ")" : fixed(m, 4))
         << " | " << (n_div ? std::string() : fixed(bits_per_byte(m), 4)) << " | "
         << (best ? (res.edge ? "best (at the grid's edge)" : "best") : "") << " |\n";
    }

  // ---- curves.csv: every evaluation of the summary runs ----
  std::ostringstream curves;
  curves << "algorithm,seed,step,val_loss,optimizer,lr\n" << std::setprecision(8);
  for (const auto& res : rows)
    for (const RunRecord* r : res.best_runs)
      for (const auto& e : r->evals)
        curves << r->algorithm << "," << r->seed << "," << e.step << "," << e.val_loss << "," << r->row << ","
               << num_text(r->lr) << "\n";

  const TrainConfig& b = c.base;
  md << "\n" << b.preset << " preset, " << b.steps << " steps of " << b.batch_size << "×"
     << (b.context ? std::to_string(b.context) : std::string("preset-context")) << " bytes (grad_accum " << b.grad_accum
     << "), evaluation every " << b.eval_every << " steps on " << b.eval_batches
     << " batches (steps to target interpolated between evaluations); target = "
     << (default_target ? "AdamW's mean final validation loss at its best lr" : "--target-loss")
     << ". Best lr: the lowest mean final validation loss of the grid"
     << (any_dion3 ? "; dion3's effective lr is lr/sqrt(f) (the trainer's lr transfer, algorithms.md §5.7)" : "")
     << ". This invocation ran " << ran << " run(s) and reused " << reused << " finished one(s) in " << fixed(wall_s, 0)
     << " s.\n";

  const fs::path dir = c.run_dir;
  write_file_atomically((dir / "grid.csv").string(), grid.str());
  write_file_atomically((dir / "curves.csv").string(), curves.str());
  write_file_atomically((dir / "compare.md").string(), md.str());
  write_file_atomically((dir / "compare.csv").string(), csv.str());  // last: its presence marks a finished study
  log << "\n" << md.str();

  std::vector<CompareRow> out;
  for (const auto& s : sums) out.push_back(s.row);
  return out;
}

void draw_plot(const CompareConfig& c, std::ostream& log) {
  const std::string later = "/usr/bin/python3 " + shell_quote(c.plot_script) + " " + shell_quote(c.run_dir);
  const std::string cmd = shell_quote(c.python) + " " + shell_quote(c.plot_script) + " " + shell_quote(c.run_dir);
  const int status = std::system(cmd.c_str());
  const int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  // plot_compare.py exits with 3 when matplotlib cannot be imported; 127: the shell found no python.
  if (code == 3 || code == 127) {
    log << "plot: not drawn: " << c.python << (code == 3 ? " has no matplotlib" : " was not found")
        << "; the tables and curves.csv are written, and on a machine with matplotlib\n  " << later
        << "\ndraws " << (fs::path(c.run_dir) / "compare.png").string() << "\n";
    return;
  }
  TORCH_CHECK(code == 0, "compare: the plot command failed (", cmd, "); the tables are written");
  log << "plot: " << (fs::path(c.run_dir) / "compare.png").string() << "\n";
}

}  // namespace orthopt::train::compare_detail

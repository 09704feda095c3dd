// `orthopt compare`: an optimizer study (include/orthopt/train/compare.h). This file plans the
// runs, runs them or reuses finished ones, and picks each row's best lr; compare_report.cpp
// writes the tables and draws the plot.
#include "orthopt/train/compare.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "compare_internal.h"
#include "orthopt/train/data.h"
#include "orthopt/train/guards.h"
#include "orthopt/train/io.h"
#include "orthopt/version.h"

namespace orthopt::train {

namespace fs = std::filesystem;
using nlohmann::json;

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

namespace compare_detail {

std::string num_text(double x) {
  std::ostringstream ss;
  ss << x;
  return ss.str();
}

double mean_of(const std::vector<double>& v) {
  return v.empty() ? kNaN : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double std_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean_of(v);
  double s = 0.0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// The trainer's dion3 divides its lr by sqrt(f) (scale_lr_by_fraction, algorithms.md §5.7).
double effective_lr(const std::string& algorithm, double fraction, double lr) {
  return algorithm == "dion3" ? lr / std::sqrt(fraction) : lr;
}

}  // namespace compare_detail

namespace {

using namespace compare_detail;

constexpr const char* kResultFormat = "orthopt compare run";
constexpr const char* kRunsCsvHeader =
    "name,optimizer,algorithm,fraction,lr,effective_lr,seed,status,final_val_loss,final_val_bpb,"
    "optimizer_ms_per_step,tokens_per_s,wall_s\n";

// Keys of a run's configuration that change neither what it computes nor what it measures.
json recorded_config(const TrainConfig& t) {
  json j = json::parse(to_json(t).dump());  // numbers as a reread result.json holds them
  for (const char* k : {"run_dir", "log_every", "checkpoint_every", "keep_last"}) j.erase(k);
  return j;
}

// The plan of one row of the study.
struct Row {
  std::string label, algorithm;
  double fraction = 0.0;  // dion3's f (0 for the others)
  std::vector<LrSpec> specs;
  bool single_fixed = false;  // one lr given as a number: run names without _lr (the form before grids)
  std::vector<size_t> depends;
};

double json_number(const json& j, const char* key) {
  const auto it = j.find(key);
  TORCH_CHECK(it != j.end() && (it->is_number() || it->is_null()), "'", key, "' is missing or not a number");
  return it->is_null() ? kNaN : it->get<double>();
}

// The record in `path`, or "" in `why` and nothing when the file is not a finished run's record.
bool read_record(const std::string& path, RunRecord& r, json& config, std::string& why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = "cannot be read";
    return false;
  }
  try {
    const json j = json::parse(in);
    TORCH_CHECK(j.is_object() && j.value("format", "") == kResultFormat, "not a compare run record");
    TORCH_CHECK(j.contains("config") && j.at("config").is_object(), "no 'config' object");
    r.status = j.value("status", "");
    TORCH_CHECK(r.status == "complete" || r.status == "diverged", "status '", r.status, "'");
    r.final_val_loss = json_number(j, "final_val_loss");
    TORCH_CHECK(r.status == "diverged" || std::isfinite(r.final_val_loss), "a complete run without a final loss");
    r.optimizer_ms_per_step = json_number(j, "optimizer_ms_per_step");
    r.tokens_per_s = json_number(j, "tokens_per_s");
    r.wall_s = json_number(j, "wall_s");
    TORCH_CHECK(j.contains("evals") && j.at("evals").is_array(), "no 'evals' array");
    r.evals.clear();
    for (const auto& e : j.at("evals")) {
      TORCH_CHECK(e.is_object() && e.contains("step") && e.at("step").is_number_integer(), "an evaluation without a step");
      r.evals.push_back({e.at("step").get<int64_t>(), json_number(e, "val_loss")});
    }
    config = j.at("config");
  } catch (const json::exception& e) {
    why = std::string("not valid JSON: ") + e.what();
    return false;
  } catch (const c10::Error& e) {
    why = e.msg();
    return false;
  }
  return true;
}

json record_json(const RunRecord& r, const json& config, const TrainResult* t) {
  json evals = json::array();
  for (const auto& e : r.evals) evals.push_back({{"step", e.step}, {"val_loss", e.val_loss}});
  auto num = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };
  json j = {{"format", kResultFormat}, {"orthopt_version", ORTHOPT_VERSION_STRING}, {"name", r.name},
            {"optimizer", r.row}, {"algorithm", r.algorithm}, {"fraction", r.fraction > 0 ? json(r.fraction) : json(nullptr)},
            {"lr", r.lr}, {"effective_lr", r.effective_lr}, {"seed", r.seed}, {"status", r.status},
            {"final_val_loss", num(r.final_val_loss)}, {"final_val_bpb", num(bits_per_byte(r.final_val_loss))},
            {"optimizer_ms_per_step", num(r.optimizer_ms_per_step)}, {"tokens_per_s", num(r.tokens_per_s)},
            {"wall_s", r.wall_s}, {"evals", evals}, {"config", config}};
  if (t) {
    j["n_params"] = t->n_params;
    j["steps_done"] = t->steps_done;
    j["skipped_nonfinite"] = t->skipped_nonfinite;
    j["skipped_spike"] = t->skipped_spike;
  }
  return j;
}

std::string runs_csv_line(const RunRecord& r) {
  auto num = [](double x, int digits) {
    std::ostringstream ss;
    if (std::isfinite(x)) ss << std::setprecision(digits) << x;
    return ss.str();
  };
  std::ostringstream ss;
  ss << r.name << "," << r.row << "," << r.algorithm << "," << (r.fraction > 0 ? num_text(r.fraction) : "") << ","
     << num_text(r.lr) << "," << num_text(r.effective_lr) << "," << r.seed << "," << r.status << ","
     << num(r.final_val_loss, 8) << "," << num(bits_per_byte(r.final_val_loss), 8) << ","
     << num(r.optimizer_ms_per_step, 6) << "," << num(r.tokens_per_s, 6) << "," << num(r.wall_s, 6) << "\n";
  return ss.str();
}

// The validation losses of metrics.jsonl's eval lines (a diverged run leaves no TrainResult).
std::vector<EvalPoint> evals_of_metrics(const std::string& path) {
  std::vector<EvalPoint> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == "eval" && j.contains("step") && j.contains("val_loss") &&
        j.at("val_loss").is_number())
      out.push_back({j.at("step").get<int64_t>(), j.at("val_loss").get<double>()});
  }
  return out;
}

class Study {
 public:
  Study(const CompareConfig& c, std::ostream& log) : c_(c), log_(log) {}

  std::vector<CompareRow> run();

 private:
  void plan();
  TrainConfig run_config(const Row& row, double lr, uint64_t seed) const;
  std::string run_name(const Row& row, double lr, uint64_t seed) const;
  void check_recorded(const std::string& name, const json& recorded, const json& now) const;
  const RunRecord& get_run(const Row& row, double lr, uint64_t seed);
  void run_grid(size_t i);
  void append_csv(const RunRecord& r);

  const CompareConfig& c_;
  std::ostream& log_;
  std::vector<Row> rows_;
  std::vector<RowResult> results_;
  std::map<std::string, RunRecord> records_;  // by run name (stable addresses)
  std::set<std::string> csv_names_;
  size_t total_ = 0, index_ = 0, ran_ = 0, reused_ = 0;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

size_t row_index(const std::vector<Row>& rows, const std::string& label) {
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].label == label) return i;
  return rows.size();
}

void Study::plan() {
  TORCH_CHECK(!c_.algorithms.empty(), "--algorithms: at least one algorithm is needed");
  TORCH_CHECK(!c_.seeds.empty(), "--seeds: at least one seed is needed");
  for (const auto* list : {&c_.seeds, &c_.best_seeds}) {
    std::set<uint64_t> seen;
    for (uint64_t s : *list)
      TORCH_CHECK(seen.insert(s).second, list == &c_.seeds ? "--seeds" : "--best-seeds", ": seed ", s, " is given twice");
  }
  std::set<std::string> algs;
  for (const auto& a : c_.algorithms) TORCH_CHECK(algs.insert(a).second, "--algorithms: '", a, "' is given twice");
  TORCH_CHECK(c_.lr_transfer == "sqrt" || c_.lr_transfer == "grid", "--lr-transfer: must be sqrt or grid, got '",
              c_.lr_transfer, "'");
  const bool fractions = !c_.dion3_fractions.empty();
  if (fractions) {
    TORCH_CHECK(algs.count("dion3"), "--dion3-fractions: dion3 is not one of --algorithms");
    std::set<std::string> seen;
    for (double f : c_.dion3_fractions) {
      TORCH_CHECK(f > 0.0 && f <= 1.0, "--dion3-fractions: each fraction must be in (0, 1], got ", f);
      TORCH_CHECK(seen.insert(num_text(f)).second, "--dion3-fractions: ", num_text(f), " is given twice");
    }
    TORCH_CHECK(c_.lr_transfer == "grid" || seen.count(num_text(c_.base.fraction)),
                "--dion3-fractions: with --lr-transfer sqrt the list must hold --fraction (", num_text(c_.base.fraction),
                "), the fraction dion3's lr grid runs at");
  }
  for (const auto& kv : c_.lrs) {
    TORCH_CHECK(algs.count(kv.first), "--lrs: '", kv.first, "' is not one of the compared algorithms");
    TORCH_CHECK(!kv.second.empty(), "--lrs: no lr for ", kv.first);
    std::set<std::string> seen;
    for (const auto& s : kv.second) {
      if (s.relative_to.empty()) {
        TORCH_CHECK(s.value > 0.0 && s.value <= 10.0, "--lrs: lr of ", kv.first, " must be in (0, 10], got ", s.value);
        TORCH_CHECK(seen.insert(num_text(s.value)).second, "--lrs: ", kv.first, " lists ", num_text(s.value), " twice");
      } else {
        TORCH_CHECK(s.factor > 0.0 && std::isfinite(s.factor), "--lrs: the factor of ", kv.first, "=", s.relative_to,
                    "*F must be > 0, got ", s.factor);
      }
    }
  }
  TORCH_CHECK(c_.target_loss > 0.0 || algs.count("adamw"),
              "--target-loss: needed when adamw is not compared (the default target is AdamW's final loss)");

  // AdamW first: its final loss is the default target.
  std::vector<std::string> order = c_.algorithms;
  std::stable_partition(order.begin(), order.end(), [](const std::string& a) { return a == "adamw"; });
  std::vector<Row> rows;
  for (const auto& alg : order) {
    std::vector<double> fs_ = {alg == "dion3" ? c_.base.fraction : 0.0};
    if (alg == "dion3" && fractions) fs_ = c_.dion3_fractions;
    for (double f : fs_) {
      Row row;
      row.algorithm = alg;
      row.fraction = f;
      row.label = alg == "dion3" && fractions ? "dion3 f=" + num_text(f) : alg;
      const bool transferred = alg == "dion3" && fractions && c_.lr_transfer == "sqrt" && f != c_.base.fraction;
      if (transferred)
        row.specs = {LrSpec{0.0, "dion3 f=" + num_text(c_.base.fraction), 1.0}};
      else if (c_.lrs.count(alg))
        row.specs = c_.lrs.at(alg);
      else
        row.specs = {LrSpec{default_matrix_lr(alg), "", 1.0}};
      row.single_fixed = row.specs.size() == 1 && row.specs[0].relative_to.empty();
      rows.push_back(row);
      TrainConfig t = run_config(rows.back(), row.single_fixed ? row.specs[0].value : default_matrix_lr(alg), 1);
      validate(t);  // every row's configuration, before the first run starts
    }
  }
  for (auto& row : rows)
    for (const auto& s : row.specs) {
      if (s.relative_to.empty()) continue;
      const size_t j = row_index(rows, s.relative_to);
      TORCH_CHECK(j < rows.size(), "--lrs: ", row.algorithm, "=", s.relative_to, "*", num_text(s.factor), ": '",
                  s.relative_to, "' is not a row of this study",
                  fractions && s.relative_to == "dion3" ? " (with --dion3-fractions dion3's rows are 'dion3 f=F')" : "");
      TORCH_CHECK(rows[j].label != row.label, "--lrs: ", row.algorithm, "'s lr refers to itself");
      row.depends.push_back(j);
    }
  // Rows in an order where every row comes after the rows its lrs refer to.
  std::vector<bool> placed(rows.size(), false);
  while (rows_.size() < rows.size()) {
    size_t pick = rows.size();
    for (size_t i = 0; i < rows.size() && pick == rows.size(); ++i)
      if (!placed[i] && std::all_of(rows[i].depends.begin(), rows[i].depends.end(), [&](size_t j) { return placed[j]; }))
        pick = i;
    TORCH_CHECK(pick < rows.size(), "--lrs: the relative lrs refer to each other in a cycle");
    placed[pick] = true;
    rows_.push_back(rows[pick]);
  }
  for (auto& row : rows_) {  // dependencies as indices of the final order
    row.depends.clear();
    for (const auto& s : row.specs)
      if (!s.relative_to.empty()) row.depends.push_back(row_index(rows_, s.relative_to));
  }
  const size_t n_seeds = c_.seeds.size();
  for (const auto& row : rows_) {
    size_t extra = 0;
    for (uint64_t s : c_.best_seeds) extra += std::count(c_.seeds.begin(), c_.seeds.end(), s) ? 0 : 1;
    total_ += row.specs.size() * n_seeds + extra;
  }
}

TrainConfig Study::run_config(const Row& row, double lr, uint64_t seed) const {
  TrainConfig t = c_.base;
  t.algorithm = row.algorithm;
  if (row.algorithm == "dion3") t.fraction = row.fraction;
  t.lr = lr;
  t.seed = seed;
  t.run_dir = (fs::path(c_.run_dir) / run_name(row, lr, seed)).string();
  t.resume = false;
  t.save_checkpoints = false;
  t.stop_after = 0;
  t.inject_nonfinite.clear();
  t.progress = "off";
  return t;
}

std::string Study::run_name(const Row& row, double lr, uint64_t seed) const {
  std::string name = row.algorithm;
  if (!c_.dion3_fractions.empty() && row.algorithm == "dion3") name += "_f" + num_text(row.fraction);
  if (!row.single_fixed) name += "_lr" + num_text(lr);
  return name + "_seed" + std::to_string(seed);
}

void Study::check_recorded(const std::string& name, const json& recorded, const json& now) const {
  if (recorded == now) return;
  std::string diff;
  for (const auto& item : now.items()) {
    const auto it = recorded.find(item.key());
    const std::string before = it == recorded.end() ? "(absent)" : it->dump();
    if (before != item.value().dump()) diff += (diff.empty() ? "" : ", ") + item.key() + " " + before + " there, " + item.value().dump() + " now";
  }
  for (const auto& item : recorded.items())
    if (!now.contains(item.key())) diff += (diff.empty() ? "" : ", ") + item.key() + " " + item.value().dump() + " there, absent now";
  TORCH_CHECK(false, "--run-dir '", c_.run_dir, "' already holds a comparison whose run '", name,
              "' was made with another configuration (", diff,
              "); repeat the study's command unchanged to continue it, or choose another --run-dir");
}

void Study::append_csv(const RunRecord& r) {
  const std::string path = (fs::path(c_.run_dir) / "runs.csv").string();
  std::error_code ec;
  const bool fresh = !fs::exists(path, ec) || fs::file_size(path, ec) == 0;
  AppendFile f(path);
  f.append((fresh ? std::string(kRunsCsvHeader) : std::string()) + runs_csv_line(r));
  f.sync();
  csv_names_.insert(r.name);
}

const RunRecord& Study::get_run(const Row& row, double lr, uint64_t seed) {
  const std::string name = run_name(row, lr, seed);
  if (auto it = records_.find(name); it != records_.end()) return it->second;
  const TrainConfig t = run_config(row, lr, seed);
  const json cfg = recorded_config(t);
  RunRecord r;
  r.name = name;
  r.row = row.label;
  r.algorithm = row.algorithm;
  r.fraction = row.algorithm == "dion3" ? row.fraction : 0.0;
  r.lr = lr;
  r.effective_lr = effective_lr(row.algorithm, t.fraction, lr);
  r.seed = seed;
  const std::string prefix = "[" + std::to_string(++index_) + "/" + std::to_string(total_) + "] " + row.label + " lr " +
                             num_text(lr) + " seed " + std::to_string(seed) + ": ";
  const fs::path dir = t.run_dir;
  const std::string result_path = (dir / "result.json").string();
  std::error_code ec;
  if (fs::exists(result_path, ec)) {
    json recorded;
    std::string why;
    if (read_record(result_path, r, recorded, why)) {
      check_recorded(name, recorded, cfg);
      r.reused = true;
      ++reused_;
      log_ << prefix << "done before, final val loss " << std::fixed << std::setprecision(4) << r.final_val_loss
           << std::defaultfloat << " (" << result_path << ")" << std::endl;
      if (!csv_names_.count(name)) append_csv(r);  // its line was lost when the study stopped in between
      return records_.emplace(name, r).first->second;
    }
    log_ << prefix << result_path << " is not a finished run's record (" << why << "): running it again" << std::endl;
  }
  if (fs::exists(dir, ec)) {
    fs::remove_all(dir);  // an unfinished run of an earlier invocation: it starts again from step 0
    log_ << prefix << "an unfinished run in " << dir.string() << " starts again" << std::endl;
  }
  const std::string log_path = (dir / "train.log").string();
  std::ostringstream run_log;
  const auto t_run = std::chrono::steady_clock::now();
  TrainResult res;
  bool diverged = false;
  try {
    res = train(t, run_log);
  } catch (const NonFiniteAbort& e) {
    diverged = true;
    run_log << "aborted: " << e.what() << "\n";
  } catch (...) {
    try {
      if (fs::exists(dir, ec)) write_file_atomically(log_path, run_log.str());  // the failed run's log, when the disk takes it
    } catch (const c10::Error&) {
    }
    throw;
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count();
  if (diverged) {
    r.status = "diverged";
    r.evals = evals_of_metrics((dir / "metrics.jsonl").string());
  } else {
    r.status = "complete";
    r.evals = res.evals;
    r.final_val_loss = res.final_val_loss;
    r.optimizer_ms_per_step = res.optimizer_ms_per_step;
    r.tokens_per_s = res.tokens_per_s;
    if (!std::isfinite(r.final_val_loss)) r.status = "diverged";  // a non-finite evaluation
  }
  write_file_atomically(log_path, run_log.str());
  write_file_atomically(result_path, record_json(r, cfg, diverged ? nullptr : &res).dump(2) + "\n");  // the run is done
  append_csv(r);
  ++ran_;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  log_ << prefix << (r.status == "diverged" ? "diverged" : "final val loss ") << std::fixed << std::setprecision(4);
  if (r.status != "diverged") log_ << r.final_val_loss;
  log_ << " (" << std::setprecision(1) << r.wall_s << " s; " << elapsed << " s total)" << std::defaultfloat << std::endl;
  return records_.emplace(name, r).first->second;
}

void Study::run_grid(size_t i) {
  const Row& row = rows_[i];
  RowResult& res = results_[i];
  std::vector<double> lrs;
  for (const auto& s : row.specs) {
    double lr = s.value;
    if (!s.relative_to.empty()) {
      const RowResult& ref = results_[row_index(rows_, s.relative_to)];
      if (ref.best < 0) {
        res.not_run = "not run: " + s.relative_to + " has no finite result to take its lr from";
        log_ << row.label << ": " << res.not_run << std::endl;
        index_ += row.specs.size() * c_.seeds.size();
        return;
      }
      lr = std::stod(num_text(ref.grid[ref.best].lr * s.factor));  // as the run name shows it
      TORCH_CHECK(lr > 0.0 && lr <= 10.0, "--lrs: ", row.algorithm, "=", s.relative_to, "*", num_text(s.factor),
                  " gives the lr ", lr, ", outside (0, 10]");
    }
    if (std::any_of(lrs.begin(), lrs.end(), [&](double x) { return num_text(x) == num_text(lr); })) {
      log_ << row.label << ": lr " << num_text(lr) << " is in the grid already" << std::endl;
      index_ += c_.seeds.size();
      continue;
    }
    lrs.push_back(lr);
  }
  for (double lr : lrs) {
    GridPoint gp;
    gp.lr = lr;
    std::vector<double> losses;
    for (uint64_t seed : c_.seeds) {
      gp.runs.push_back(&get_run(row, lr, seed));
      const double v = gp.runs.back()->final_val_loss;
      losses.push_back(std::isfinite(v) ? v : std::numeric_limits<double>::infinity());
    }
    gp.mean_loss = mean_of(losses);
    res.grid.push_back(gp);
  }
  for (size_t k = 0; k < res.grid.size(); ++k)
    if (std::isfinite(res.grid[k].mean_loss) && (res.best < 0 || res.grid[k].mean_loss < res.grid[res.best].mean_loss))
      res.best = static_cast<int>(k);
  if (res.best < 0) {
    log_ << row.label << ": every lr of the grid diverged" << std::endl;
    return;
  }
  const double best = res.grid[res.best].lr;
  res.edge = lrs.size() >= 2 && (best == *std::min_element(lrs.begin(), lrs.end()) ||
                                 best == *std::max_element(lrs.begin(), lrs.end()));
  if (lrs.size() >= 2)
    log_ << row.label << ": best lr " << num_text(best) << " (mean final val loss " << std::fixed << std::setprecision(4)
         << res.grid[res.best].mean_loss << std::defaultfloat << " over " << c_.seeds.size() << " seed(s)"
         << (res.edge ? "; at the edge of the grid" : "") << ")" << std::endl;
}

std::vector<CompareRow> Study::run() {
  plan();
  // Runs whose configuration is known now: a changed configuration stops the study before it runs anything.
  for (const auto& row : rows_)
    for (const auto& s : row.specs) {
      if (!s.relative_to.empty()) continue;
      std::vector<uint64_t> seeds = c_.seeds;
      if (row.single_fixed) seeds.insert(seeds.end(), c_.best_seeds.begin(), c_.best_seeds.end());
      for (uint64_t seed : seeds) {
        const TrainConfig t = run_config(row, s.value, seed);
        const std::string path = (fs::path(t.run_dir) / "result.json").string();
        RunRecord r;
        json recorded;
        std::string why;
        std::error_code ec;
        if (fs::exists(path, ec) && read_record(path, r, recorded, why))
          check_recorded(run_name(row, s.value, seed), recorded, recorded_config(t));
      }
    }
  fs::create_directories(c_.run_dir);
  {  // names already in runs.csv (a run whose line is missing gets it when reused)
    std::ifstream in((fs::path(c_.run_dir) / "runs.csv").string());
    std::string line;
    while (std::getline(in, line)) csv_names_.insert(line.substr(0, line.find(',')));
  }
  results_.resize(rows_.size());
  for (size_t i = 0; i < rows_.size(); ++i) {
    results_[i].label = rows_[i].label;
    results_[i].algorithm = rows_[i].algorithm;
    results_[i].fraction = rows_[i].algorithm == "dion3" ? rows_[i].fraction : 0.0;
    run_grid(i);
  }
  // Each row's best lr at the summary seeds (the grid's runs at those seeds are reused).
  const std::vector<uint64_t>& seeds = c_.best_seeds.empty() ? c_.seeds : c_.best_seeds;
  for (size_t i = 0; i < rows_.size(); ++i) {
    RowResult& res = results_[i];
    if (res.best < 0) {
      for (uint64_t s : c_.best_seeds) index_ += std::count(c_.seeds.begin(), c_.seeds.end(), s) ? 0 : 1;
      continue;
    }
    for (uint64_t s : seeds) res.best_runs.push_back(&get_run(rows_[i], res.grid[res.best].lr, s));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  auto rows = write_report(c_, results_, ran_, reused_, wall, log_);
  if (!c_.plot_script.empty()) draw_plot(c_, log_);
  return rows;
}

}  // namespace

std::vector<CompareRow> run_compare(const CompareConfig& c, std::ostream& log) { return Study(c, log).run(); }

}  // namespace orthopt::train

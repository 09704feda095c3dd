// `orthopt train` and `orthopt compare` (docs/training.md).
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "orthopt/distributed.h"
#include "orthopt/runtime.h"
#include "orthopt/train/checkpoint.h"
#include "orthopt/train/compare.h"
#include "orthopt/train/config.h"
#include "orthopt/train/guards.h"
#include "orthopt/train/trainer.h"

namespace orthopt::cli {

namespace fs = std::filesystem;
using nlohmann::json;
using train::TrainConfig;

namespace {

// Each config key is a flag --<key with '-' for '_'>; its value is converted to the key's JSON
// type after parsing, so one table drives the flags, the config file and the error messages.
enum class Kind { Int, UInt, Double, String, Bool, IntList };

struct FlagSpec {
  const char* key;
  Kind kind;
  const char* help;
};

const std::vector<FlagSpec>& flag_specs() {
  static const std::vector<FlagSpec> specs = {
      {"preset", Kind::String, "model preset: tiny (default, ~1M params), small, gpt2-124m"},
      {"context", Kind::Int, "sequence length in bytes (0: the preset's)"},
      {"n_experts", Kind::Int, "MoE: number of experts per layer (0: dense MLP)"},
      {"top_k", Kind::Int, "MoE: experts per token"},
      {"router_bias_rate", Kind::Double, "MoE: load-balancing bias step per optimizer step"},
      {"router_z_loss", Kind::Double, "MoE: router z-loss coefficient"},
      {"activation_checkpointing", Kind::String, "activations recomputed in the backward pass instead of kept: "
                                                 "none, block (each block keeps its input), selective (SwiGLU "
                                                 "activation, unfused attention scores); same results"},
      {"data", Kind::String, "UTF-8 text file (default: the King James Bible, cached in data/kjv.txt)"},
      {"val_fraction", Kind::Double, "last fraction of the text used for validation"},
      {"algorithm", Kind::String, "optimizer of the block matrices: adamw, muon, normuon, dion3, dion, lion"},
      {"lr", Kind::Double, "peak lr of the matrix optimizer (0: the algorithm's preset)"},
      {"scalar_lr", Kind::Double, "peak AdamW lr of embeddings, head and norms"},
      {"weight_decay", Kind::Double, "weight decay of the matrix group"},
      {"momentum", Kind::Double, "momentum of the matrix optimizers"},
      {"dion_qr", Kind::String, "dion's orthonormalization of P: householder (fp32 QR) or cholesky (fp64 Cholesky QR2, "
                                "Householder where it fails)"},
      {"fraction", Kind::Double, "dion3: fraction f of each matrix's rows updated per step, in (0, 1]; the lr is "
                                 "divided by sqrt(f) (docs/algorithms.md §5)"},
      {"execution", Kind::String, "which implementation each part of the optimizer step takes: auto, or "
                                  "field=value,... (e.g. kernels=off; docs/execution.md)"},
      {"schedule", Kind::String, "lr schedule: wsd, cosine, constant"},
      {"warmup_frac", Kind::Double, "warmup fraction of the steps"},
      {"stable_frac", Kind::Double, "wsd: stable fraction"},
      {"decay_frac", Kind::Double, "wsd: decay fraction"},
      {"min_lr_ratio", Kind::Double, "final lr / peak lr"},
      {"decay_shape", Kind::String, "wsd decay: linear, cosine, sqrt, 1-sqrt"},
      {"steps", Kind::Int, "optimizer steps"},
      {"batch_size", Kind::Int, "sequences per micro-batch"},
      {"grad_accum", Kind::Int, "micro-batches per optimizer step"},
      {"clip", Kind::Double, "global gradient-norm clipping (0: off)"},
      {"eval_every", Kind::Int, "evaluate every N steps (and at the end)"},
      {"eval_batches", Kind::Int, "validation batches per evaluation"},
      {"checkpoint_every", Kind::Int, "checkpoint every N steps (and at the end; 0: only at the end)"},
      {"keep_last", Kind::Int, "checkpoints kept"},
      {"seed", Kind::UInt, "seed of the init and the batch sampler"},
      {"run_dir", Kind::String, "run directory (metrics.jsonl, checkpoints)"},
      {"save_checkpoints", Kind::Bool, "write checkpoints (true/false)"},
      {"inject_nonfinite", Kind::IntList, "fault injection: make the loss NaN at these 1-based steps (e.g. 5,6)"},
      {"max_nonfinite", Kind::Int, "consecutive non-finite steps before the run aborts"},
      {"stop_after", Kind::Int, "stop after this step with a checkpoint, as if interrupted (0: off)"},
      {"spike_window", Kind::Int, "spike guard window"},
      {"spike_sigma", Kind::Double, "spike guard threshold in standard deviations"},
      {"device", Kind::String, "auto, cpu or cuda"},
      {"bf16", Kind::Bool, "bf16 autocast on CUDA (true/false)"},
      {"cuda_graph", Kind::Bool, "replay the optimizer step as a CUDA graph after 10 eager steps (CUDA, one process)"},
      {"deterministic", Kind::Bool, "deterministic kernels (torch's strict mode): bit-reproducible CUDA runs, slower"},
      {"tf32", Kind::Bool, "fp32 matmuls on CUDA with TF32 inputs, as torch's allow_tf32 (Dion's products; the model with --bf16 false)"},
      {"log_every", Kind::Int, "log line interval when stdout is not a terminal"},
      {"progress", Kind::String, "progress bar: auto, on, off"},
  };
  return specs;
}

std::string flag_of(const std::string& key) {
  std::string f = "--" + key;
  for (auto& ch : f) if (ch == '_') ch = '-';
  return f;
}

// A non-negative integer up to 2^64-1 (std::stoull alone would wrap "-1" to 2^64-1).
uint64_t parse_uint(const std::string& flag, const std::string& s) {
  const bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  TORCH_CHECK(digits, flag, ": expected a non-negative integer, got '", s, "'");
  try {
    return std::stoull(s);
  } catch (const std::exception&) {
    TORCH_CHECK(false, flag, ": '", s, "' is out of range (at most 18446744073709551615)");
  }
}

json convert(const FlagSpec& spec, const std::string& text) {
  const std::string flag = flag_of(spec.key);
  auto parse_int = [&](const std::string& s) -> int64_t {
    size_t pos = 0;
    int64_t v = 0;
    try {
      v = std::stoll(s, &pos);
    } catch (const std::out_of_range&) {
      TORCH_CHECK(false, flag, ": '", s, "' is out of range (a 64-bit integer)");
    } catch (const std::exception&) {
      pos = 0;
    }
    TORCH_CHECK(pos == s.size() && !s.empty(), flag, ": expected an integer, got '", s, "'");
    return v;
  };
  switch (spec.kind) {
    case Kind::Int: return parse_int(text);
    case Kind::UInt: return parse_uint(flag, text);
    case Kind::Double: {
      size_t pos = 0;
      double v = 0;
      try { v = std::stod(text, &pos); } catch (const std::exception&) { pos = 0; }
      TORCH_CHECK(pos == text.size() && !text.empty() && std::isfinite(v), flag, ": expected a number, got '", text, "'");
      return v;
    }
    case Kind::String: return text;
    case Kind::Bool:
      if (text == "true" || text == "1" || text == "on") return true;
      if (text == "false" || text == "0" || text == "off") return false;
      TORCH_CHECK(false, flag, ": expected true or false, got '", text, "'");
    case Kind::IntList: {
      json list = json::array();
      size_t start = 0;
      while (start <= text.size()) {
        const size_t comma = text.find(',', start);
        const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (!item.empty()) list.push_back(parse_int(item));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      return list;
    }
  }
  return nullptr;
}

struct TrainArgs {
  std::string config_file;
  bool resume = false;
  int nproc = 1;  // --nproc: local data-parallel ranks
  std::map<std::string, std::string> values;  // key -> text given on the command line
  std::map<std::string, CLI::Option*> options;
};

void add_config_flags(CLI::App* cmd, TrainArgs& args, const std::vector<std::string>& skip) {
  cmd->add_option("--config", args.config_file, "JSON config file (flags override its keys)");
  for (const auto& spec : flag_specs()) {
    if (std::find(skip.begin(), skip.end(), spec.key) != skip.end()) continue;
    // Given twice, the last value wins (like most CLIs; scripts append overrides).
    static const char* type_names[] = {"INT", "UINT", "FLOAT", "TEXT", "BOOL", "INT,..."};
    args.options[spec.key] = cmd->add_option(flag_of(spec.key), args.values[spec.key], spec.help)
                                 ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
                                 ->type_name(type_names[static_cast<int>(spec.kind)]);
  }
}

// Config file, then the flags given, then validation.
TrainConfig build_config(const TrainArgs& args, const json& defaults) {
  json j = defaults;
  if (!args.config_file.empty()) j.merge_patch(train::read_config_file(args.config_file));
  for (const auto& spec : flag_specs()) {
    auto it = args.options.find(spec.key);
    if (it != args.options.end() && it->second->count() > 0) j[spec.key] = convert(spec, args.values.at(spec.key));
  }
  if (args.resume) j["resume"] = true;
  return train::config_from_json(j);
}

// --resume without ORTHOPT_NUM_THREADS / OMP_NUM_THREADS: the intra-op thread count of the newest
// checkpoint instead of the one the load chose now, so that the CPU reductions (split by thread
// count) continue with the same bits. Only a hint: the trainer verifies the checkpoint itself.
void resume_threads(const TrainConfig& cfg) {
  if (!cfg.resume || requested_threads() > 0) return;
  for (const auto& d : train::step_directories(cfg.run_dir)) {
    try {
      std::ifstream f(fs::path(d.path) / "metadata.json");
      const json meta = json::parse(f);
      const json& extra = meta.at("extra");
      if (!extra.contains("intra_op_threads")) return;
      const int n = extra.at("intra_op_threads").get<int>();
      if (n > 0 && n != at::get_num_threads()) {
        std::cout << "threads: " << n << " intra-op threads, as the checkpoint was written with (set "
                  << "ORTHOPT_NUM_THREADS to choose)\n";
        at::set_num_threads(n);
      }
    } catch (const std::exception&) {
      continue;  // not a readable checkpoint: the next older one, as the trainer's own search does
    }
    return;
  }
}

int run_train(const TrainArgs& args) {
  const TrainConfig cfg = build_config(args, json::object());
  resume_threads(cfg);
  TORCH_CHECK(args.nproc <= 1 || !cfg.cuda_graph,
              "--cuda-graph: not available with --nproc (the distributed step's collectives are not captured)");
  // --nproc N: this process becomes the launcher of N ranks (each runs this command without
  // --nproc, with RANK/WORLD_SIZE/MASTER_* set; docs/distributed.md).
  if (args.nproc > 1 && !std::getenv("RANK")) return dist::launch_local(args.nproc, dist::relaunch_argv({"--nproc"}));
  try {
    train::train(cfg, std::cout);
  } catch (const train::NonFiniteAbort& e) {
    std::cout.flush();
    std::cerr << "orthopt train: aborted: " << e.what() << " (see --max-nonfinite)\n";
    return 3;
  }
  return 0;
}

// scripts/plot_compare.py next to the build directory of this binary, or under $ORTHOPT_SOURCE_DIR.
std::string find_plot_script() {
  std::vector<fs::path> candidates;
  if (const char* src = std::getenv("ORTHOPT_SOURCE_DIR")) candidates.push_back(fs::path(src) / "scripts/plot_compare.py");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / "scripts/plot_compare.py");
  candidates.push_back(fs::path("scripts/plot_compare.py"));
  for (const auto& p : candidates)
    if (fs::exists(p, ec)) return p.string();
  return "";
}

struct CompareArgs {
  TrainArgs train;
  std::vector<std::string> algorithms;
  std::vector<std::string> lrs;  // alg=lr[,lr...] [alg=...]
  std::vector<std::string> seeds;  // converted by parse_uint: CLI11 would wrap -1
  std::vector<std::string> best_seeds;
  std::vector<std::string> dion3_fractions;
  std::string lr_transfer = "sqrt";
  double target_loss = 0.0;
  std::string run_dir = "runs/compare";
  bool no_plot = false;
  std::string plot_script;
};

// Defaults of the main job: sized so that the 4-optimizer comparison on the tiny preset fits in
// 10 minutes on a 2-core CPU (docs/training.md).
json compare_defaults() {
  return json{{"steps", 300}, {"batch_size", 16}, {"context", 64}, {"eval_every", 25}, {"eval_batches", 4}};
}

double parse_number(const std::string& flag, const std::string& item, const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try { v = std::stod(text, &pos); } catch (const std::exception&) { pos = 0; }
  TORCH_CHECK(pos == text.size() && !text.empty() && std::isfinite(v), flag, ": expected a number in '", item, "', got '",
              text, "'");
  return v;
}

// --lrs muon=0.005,0.01 adamw=0.0006 dion3=muon*0.5,muon*1: an item with '=' starts an
// algorithm's list, one without continues it; a value is a number or ALG[*FACTOR] (FACTOR times
// ALG's best lr).
std::map<std::string, std::vector<train::LrSpec>> parse_lrs(const std::vector<std::string>& items) {
  std::map<std::string, std::vector<train::LrSpec>> lrs;
  std::string current;
  for (const auto& item : items) {
    std::string value = item;
    const size_t eq = item.find('=');
    if (eq != std::string::npos) {
      current = item.substr(0, eq);
      TORCH_CHECK(!current.empty(), "--lrs: expected algorithm=lr, got '", item, "'");
      TORCH_CHECK(!lrs.count(current), "--lrs: ", current, " is given twice (list its lrs once: ", current,
                  "=0.005,0.01)");
      lrs[current];
      value = item.substr(eq + 1);
    } else {
      TORCH_CHECK(!current.empty(), "--lrs: expected algorithm=lr before '", item, "' (e.g. muon=0.005,0.01 adamw=0.0006)");
    }
    TORCH_CHECK(!value.empty(), "--lrs: an empty lr in the list of ", current);
    train::LrSpec spec;
    if (std::isdigit(static_cast<unsigned char>(value[0])) || value[0] == '.') {
      spec.value = parse_number("--lrs", item, value);
    } else {
      const size_t star = value.find('*');
      spec.relative_to = value.substr(0, star);
      if (star != std::string::npos) spec.factor = parse_number("--lrs", item, value.substr(star + 1));
      TORCH_CHECK(!spec.relative_to.empty(), "--lrs: expected a number or ALGORITHM*FACTOR, got '", value, "'");
    }
    lrs[current].push_back(spec);
  }
  return lrs;
}

int run_compare_cmd(const CompareArgs& args) {
  train::CompareConfig cc;
  json defaults = compare_defaults();
  defaults["run_dir"] = args.run_dir;
  cc.base = build_config(args.train, defaults);
  if (!args.algorithms.empty()) cc.algorithms = args.algorithms;
  if (!args.seeds.empty()) {
    cc.seeds.clear();
    for (const auto& seed : args.seeds) cc.seeds.push_back(parse_uint("--seeds", seed));
  }
  for (const auto& seed : args.best_seeds) cc.best_seeds.push_back(parse_uint("--best-seeds", seed));
  for (const auto& f : args.dion3_fractions) cc.dion3_fractions.push_back(parse_number("--dion3-fractions", f, f));
  cc.lr_transfer = args.lr_transfer;
  cc.lrs = parse_lrs(args.lrs);
  TORCH_CHECK(args.target_loss >= 0.0, "--target-loss: must be > 0 (0: AdamW's final loss)");
  cc.target_loss = args.target_loss;
  cc.run_dir = args.run_dir;
  if (!args.no_plot) {
    cc.plot_script = args.plot_script.empty() ? find_plot_script() : args.plot_script;
    TORCH_CHECK(!cc.plot_script.empty(), "compare: scripts/plot_compare.py not found; pass --plot-script or --no-plot");
  }
  train::run_compare(cc, std::cout);
  return 0;
}

}  // namespace

void register_train(CLI::App& app, Action& action) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train the byte-level transformer (docs/training.md)");
  add_config_flags(cmd, *args, {});
  cmd->add_flag("--resume", args->resume, "continue from the newest valid checkpoint in --run-dir");
  cmd->add_option("--nproc", args->nproc, "data-parallel: run N local ranks (c10d Gloo/NCCL), each on its own "
                                          "micro-batches; the global batch is N x batch_size")
      ->check(CLI::Range(1, 1024));
  cmd->callback([args, &action] { action = [args] { return run_train(*args); }; });

  auto cargs = std::make_shared<CompareArgs>();
  auto* cmp = app.add_subcommand("compare", "Train the same model with several optimizers and compare them");
  // Per-run keys are set by compare itself.
  add_config_flags(cmp, cargs->train, {"algorithm", "lr", "seed", "run_dir", "save_checkpoints", "inject_nonfinite",
                                      "stop_after", "progress"});
  cmp->add_option("--algorithms", cargs->algorithms, "optimizers compared (default adamw,muon,normuon,dion3)")
      ->delimiter(',');
  cmp->add_option("--lrs", cargs->lrs,
                  "lr grid per algorithm, e.g. muon=0.005,0.01,0.02 adamw=0.0003,0.0006 (a single lr: muon=0.02,adamw=0.003); "
                  "ALG*F: F times ALG's best lr, e.g. dion3=muon*0.5,muon*1,muon*2 (default: presets)")
      ->delimiter(',');
  cmp->add_option("--seeds", cargs->seeds, "seeds of every grid point (default 1)")->delimiter(',');
  cmp->add_option("--best-seeds", cargs->best_seeds,
                  "after the grid, run each optimizer's best lr at these seeds; the summary is over them (e.g. 1,2,3)")
      ->delimiter(',');
  cmp->add_option("--dion3-fractions", cargs->dion3_fractions,
                  "one dion3 row per row fraction f, e.g. 0.5,0.25,0.125 (default: --fraction only)")
      ->delimiter(',');
  cmp->add_option("--lr-transfer", cargs->lr_transfer,
                  "dion3 fractions: sqrt (default; the grid at --fraction, the other fractions at its best lr, which "
                  "dion3's lr/sqrt(f) turns into lr_ref*sqrt(f_ref/f)) or grid (the whole grid at every fraction)");
  cmp->add_option("--target-loss", cargs->target_loss, "target validation loss (default: AdamW's final)");
  cmp->add_option("--run-dir", cargs->run_dir, "output directory (default runs/compare)");
  cmp->add_flag("--no-plot", cargs->no_plot, "skip compare.png");
  cmp->add_option("--plot-script", cargs->plot_script, "path of scripts/plot_compare.py");
  cmp->callback([cargs, &action] { action = [cargs] { return run_compare_cmd(*cargs); }; });
}

}  // namespace orthopt::cli

// Trainer configuration: JSON round trip, validation and the config hash.
#include "orthopt/train/config.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "orthopt/optim.h"
#include "orthopt/train/checkpoint.h"
#include "orthopt/train/model.h"

namespace orthopt::train {

using nlohmann::json;
namespace fs = std::filesystem;

double default_matrix_lr(const std::string& algorithm) {
  // Best of a factor-2 grid on the tiny preset, default corpus, compare's 300 steps of 16×64 bytes,
  // seed 1 (docs/training.md "Learning rates" lists the grid and the losses).
  if (algorithm == "adamw") return 7.5e-4;
  if (algorithm == "muon") return 0.01;
  if (algorithm == "normuon") return 0.01;
  if (algorithm == "dion3") return 0.005;  // with scale_lr_by_fraction: 0.005/sqrt(0.25) effective
  if (algorithm == "dion") return 0.01;    // not tuned: Muon's
  if (algorithm == "lion") return 1e-4;    // not tuned: the usual AdamW/Lion ratio of ~1/3-1/10
  TORCH_CHECK(false, "algorithm: unknown '", algorithm, "' (valid: adamw, muon, normuon, dion3, dion, lion)");
}

json to_json(const TrainConfig& c) {
  return json{
      {"preset", c.preset}, {"context", c.context}, {"n_experts", c.n_experts}, {"top_k", c.top_k},
      {"router_bias_rate", c.router_bias_rate}, {"router_z_loss", c.router_z_loss},
      {"activation_checkpointing", c.activation_checkpointing},
      {"data", c.data}, {"val_fraction", c.val_fraction},
      {"algorithm", c.algorithm}, {"lr", c.lr}, {"scalar_lr", c.scalar_lr},
      {"weight_decay", c.weight_decay}, {"momentum", c.momentum},
      {"dion_qr", c.dion_qr}, {"fraction", c.fraction}, {"execution", c.execution},
      {"schedule", c.schedule.kind}, {"warmup_frac", c.schedule.warmup_frac},
      {"stable_frac", c.schedule.stable_frac}, {"decay_frac", c.schedule.decay_frac},
      {"min_lr_ratio", c.schedule.min_lr_ratio}, {"decay_shape", c.schedule.decay_shape},
      {"steps", c.steps}, {"batch_size", c.batch_size}, {"grad_accum", c.grad_accum}, {"clip", c.clip},
      {"eval_every", c.eval_every}, {"eval_batches", c.eval_batches},
      {"checkpoint_every", c.checkpoint_every}, {"keep_last", c.keep_last}, {"seed", c.seed},
      {"run_dir", c.run_dir}, {"resume", c.resume}, {"save_checkpoints", c.save_checkpoints},
      {"inject_nonfinite", c.inject_nonfinite}, {"max_nonfinite", c.max_nonfinite},
      {"stop_after", c.stop_after}, {"spike_window", c.spike_window}, {"spike_sigma", c.spike_sigma},
      {"device", c.device}, {"bf16", c.bf16}, {"cuda_graph", c.cuda_graph}, {"deterministic", c.deterministic},
      {"tf32", c.tf32},
      {"log_every", c.log_every}, {"progress", c.progress},
  };
}

namespace {

// Reads j[key] into `out` when present, with a type error that names the key.
template <typename T>
void read_key(const json& j, const char* key, T& out, std::set<std::string>& seen) {
  auto it = j.find(key);
  if (it == j.end()) return;
  seen.insert(key);
  try {
    if constexpr (std::is_same_v<T, double>) {
      TORCH_CHECK(it->is_number(), "expected a number");
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      TORCH_CHECK(it->is_number_unsigned(), "expected a non-negative integer");
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      TORCH_CHECK(it->is_number_integer(), "expected an integer");
      // nlohmann keeps integers above INT64_MAX unsigned; get<int64_t> would wrap them negative.
      TORCH_CHECK(!it->is_number_unsigned() ||
                      it->template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max()),
                  "out of range (at most ", std::numeric_limits<T>::max(), ")");
    } else if constexpr (std::is_same_v<T, bool>) {
      TORCH_CHECK(it->is_boolean(), "expected true or false");
    } else if constexpr (std::is_same_v<T, std::string>) {
      TORCH_CHECK(it->is_string(), "expected a string");
    }
    out = it->get<T>();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "config key '", key, "': ", e.msg(), ", got ", it->dump());
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "config key '", key, "': wrong type (", e.what(), "), got ", it->dump());
  }
}

}  // namespace

TrainConfig config_from_json(const json& j) {
  TORCH_CHECK(j.is_object(), "config: expected a JSON object, got ", j.type_name());
  TrainConfig c;
  std::set<std::string> seen;
  read_key(j, "preset", c.preset, seen);
  read_key(j, "context", c.context, seen);
  read_key(j, "n_experts", c.n_experts, seen);
  read_key(j, "top_k", c.top_k, seen);
  read_key(j, "router_bias_rate", c.router_bias_rate, seen);
  read_key(j, "router_z_loss", c.router_z_loss, seen);
  read_key(j, "activation_checkpointing", c.activation_checkpointing, seen);
  read_key(j, "data", c.data, seen);
  read_key(j, "val_fraction", c.val_fraction, seen);
  read_key(j, "algorithm", c.algorithm, seen);
  read_key(j, "lr", c.lr, seen);
  read_key(j, "scalar_lr", c.scalar_lr, seen);
  read_key(j, "weight_decay", c.weight_decay, seen);
  read_key(j, "momentum", c.momentum, seen);
  read_key(j, "dion_qr", c.dion_qr, seen);
  read_key(j, "fraction", c.fraction, seen);
  read_key(j, "execution", c.execution, seen);
  read_key(j, "schedule", c.schedule.kind, seen);
  read_key(j, "warmup_frac", c.schedule.warmup_frac, seen);
  read_key(j, "stable_frac", c.schedule.stable_frac, seen);
  read_key(j, "decay_frac", c.schedule.decay_frac, seen);
  read_key(j, "min_lr_ratio", c.schedule.min_lr_ratio, seen);
  read_key(j, "decay_shape", c.schedule.decay_shape, seen);
  read_key(j, "steps", c.steps, seen);
  read_key(j, "batch_size", c.batch_size, seen);
  read_key(j, "grad_accum", c.grad_accum, seen);
  read_key(j, "clip", c.clip, seen);
  read_key(j, "eval_every", c.eval_every, seen);
  read_key(j, "eval_batches", c.eval_batches, seen);
  read_key(j, "checkpoint_every", c.checkpoint_every, seen);
  read_key(j, "keep_last", c.keep_last, seen);
  read_key(j, "seed", c.seed, seen);
  read_key(j, "run_dir", c.run_dir, seen);
  read_key(j, "resume", c.resume, seen);
  read_key(j, "save_checkpoints", c.save_checkpoints, seen);
  if (j.contains("inject_nonfinite")) {
    const auto& v = j.at("inject_nonfinite");
    TORCH_CHECK(v.is_array() && std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number_integer(); }),
                "config key 'inject_nonfinite': expected an array of step numbers, got ", v.dump());
    c.inject_nonfinite = v.get<std::vector<int64_t>>();
    seen.insert("inject_nonfinite");
  }
  read_key(j, "max_nonfinite", c.max_nonfinite, seen);
  read_key(j, "stop_after", c.stop_after, seen);
  read_key(j, "spike_window", c.spike_window, seen);
  read_key(j, "spike_sigma", c.spike_sigma, seen);
  read_key(j, "device", c.device, seen);
  read_key(j, "bf16", c.bf16, seen);
  read_key(j, "cuda_graph", c.cuda_graph, seen);
  read_key(j, "deterministic", c.deterministic, seen);
  read_key(j, "tf32", c.tf32, seen);
  read_key(j, "log_every", c.log_every, seen);
  read_key(j, "progress", c.progress, seen);
  for (const auto& item : j.items())
    TORCH_CHECK(seen.count(item.key()), "config: unknown key '", item.key(), "'");
  validate(c);
  return c;
}

void validate(const TrainConfig& c) {
  model_preset(c.preset);  // throws naming the valid presets
  TORCH_CHECK(c.context >= 0, "context: must be >= 2 (or 0 for the preset's), got ", c.context);
  TORCH_CHECK(c.context == 0 || c.context >= 2, "context: must be >= 2 (or 0 for the preset's), got ", c.context);
  TORCH_CHECK(c.n_experts >= 0 && c.n_experts <= 256, "n_experts: must be in [0, 256], got ", c.n_experts);
  if (c.n_experts > 0)
    TORCH_CHECK(c.top_k >= 1 && c.top_k <= c.n_experts, "top_k: must be in [1, n_experts=", c.n_experts, "], got ", c.top_k);
  TORCH_CHECK(c.router_bias_rate >= 0.0 && c.router_bias_rate <= 1.0, "router_bias_rate: must be in [0, 1], got ", c.router_bias_rate);
  TORCH_CHECK(c.router_z_loss >= 0.0, "router_z_loss: must be >= 0, got ", c.router_z_loss);
  validate_activation_checkpointing(c.activation_checkpointing, c.n_experts);
  TORCH_CHECK(c.val_fraction > 0.0 && c.val_fraction < 0.5, "val_fraction: must be in (0, 0.5), got ", c.val_fraction);
  default_matrix_lr(c.algorithm);  // throws naming the valid algorithms
  TORCH_CHECK(c.lr >= 0.0 && c.lr <= 10.0, "lr: must be in [0, 10] (0: the algorithm's preset), got ", c.lr);
  TORCH_CHECK(c.scalar_lr > 0.0 && c.scalar_lr <= 10.0, "scalar_lr: must be in (0, 10], got ", c.scalar_lr);
  TORCH_CHECK(c.weight_decay >= 0.0 && c.weight_decay < 1.0, "weight_decay: must be in [0, 1), got ", c.weight_decay);
  TORCH_CHECK(c.momentum >= 0.0 && c.momentum < 1.0, "momentum: must be in [0, 1), got ", c.momentum);
  try {
    (void)parse_execution(c.execution);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "execution: ", e.what_without_backtrace());
  }
  TORCH_CHECK(c.dion_qr == "householder" || c.dion_qr == "cholesky",
              "dion_qr: must be householder or cholesky, got '", c.dion_qr, "'");
  TORCH_CHECK(c.fraction > 0.0 && c.fraction <= 1.0, "fraction: must be in (0, 1], got ", c.fraction);
  try {
    orthopt::train::validate(c.schedule);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "schedule options (schedule, warmup_frac, stable_frac, decay_frac, min_lr_ratio, decay_shape): ",
                e.msg());
  }
  TORCH_CHECK(c.steps >= 1 && c.steps <= 100000000, "steps: must be in [1, 1e8], got ", c.steps);
  TORCH_CHECK(c.batch_size >= 1 && c.batch_size <= 65536, "batch_size: must be in [1, 65536], got ", c.batch_size);
  TORCH_CHECK(c.grad_accum >= 1 && c.grad_accum <= 4096, "grad_accum: must be in [1, 4096], got ", c.grad_accum);
  TORCH_CHECK(c.clip >= 0.0, "clip: must be >= 0 (0 disables), got ", c.clip);
  TORCH_CHECK(c.eval_every >= 1, "eval_every: must be >= 1, got ", c.eval_every);
  TORCH_CHECK(c.eval_batches >= 1, "eval_batches: must be >= 1, got ", c.eval_batches);
  TORCH_CHECK(c.checkpoint_every >= 0, "checkpoint_every: must be >= 0 (0: only at the end), got ", c.checkpoint_every);
  TORCH_CHECK(c.keep_last >= 1, "keep_last: must be >= 1, got ", c.keep_last);
  TORCH_CHECK(!c.run_dir.empty(), "run_dir: must not be empty");
  for (int64_t s : c.inject_nonfinite)
    TORCH_CHECK(s >= 1 && s <= c.steps, "inject_nonfinite: step ", s, " is outside [1, steps=", c.steps, "]");
  TORCH_CHECK(c.max_nonfinite >= 1 && c.max_nonfinite <= 1000000, "max_nonfinite: must be >= 1, got ", c.max_nonfinite);
  TORCH_CHECK(c.stop_after >= 0 && c.stop_after <= c.steps, "stop_after: must be in [0, steps=", c.steps, "], got ", c.stop_after);
  TORCH_CHECK(c.spike_window >= 2, "spike_window: must be >= 2, got ", c.spike_window);
  TORCH_CHECK(c.spike_sigma > 0.0, "spike_sigma: must be > 0, got ", c.spike_sigma);
  TORCH_CHECK(c.device == "auto" || c.device == "cpu" || c.device == "cuda", "device: must be auto, cpu or cuda, got '", c.device, "'");
  TORCH_CHECK(!c.cuda_graph || c.device != "cpu", "cuda_graph: needs a CUDA device, but device is 'cpu'");
  TORCH_CHECK(!c.tf32 || c.device != "cpu", "tf32: needs a CUDA device, but device is 'cpu'");
  TORCH_CHECK(c.log_every >= 1, "log_every: must be >= 1, got ", c.log_every);
  TORCH_CHECK(c.progress == "auto" || c.progress == "on" || c.progress == "off", "progress: must be auto, on or off, got '", c.progress, "'");
}

json read_config_file(const std::string& path) {
  std::error_code ec;
  TORCH_CHECK(fs::exists(path, ec), "--config: file '", path, "' does not exist");
  TORCH_CHECK(!fs::is_directory(path, ec), "--config: '", path, "' is a directory, not a JSON file");
  std::ifstream in(path);
  TORCH_CHECK(in, "--config: cannot open '", path, "': ", std::strerror(errno));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "--config '", path, "': not valid JSON: ", e.what());
  } catch (const std::exception& e) {  // a read error of the stream
    TORCH_CHECK(false, "--config '", path, "': cannot read it: ", e.what());
  }
  TORCH_CHECK(j.is_object(), "--config '", path, "': expected a JSON object of config keys, got ", j.type_name());
  // Flags are merged over the file as a JSON merge patch, where null deletes a key: refused here
  // rather than silently meaning the default.
  for (const auto& item : j.items())
    TORCH_CHECK(!item.value().is_null(), "--config '", path, "': config key '", item.key(),
                "' is null (leave the key out for its default)");
  return j;
}

const std::vector<std::string>& resume_volatile_keys() {
  static const std::vector<std::string> keys = {
      "data",  // replaced by the corpus' SHA-256
      "run_dir", "resume", "save_checkpoints", "checkpoint_every", "keep_last", "inject_nonfinite",
      "max_nonfinite", "stop_after", "log_every", "progress",
      // how the step executes, not what it computes: a graph replay is bit-identical to the eager
      // step (docs/cuda_graph.md), deterministic kernels and the execution options are other
      // implementations of the same operations (docs/execution.md)
      "cuda_graph", "deterministic", "execution",
      // recomputing activations in the backward pass runs the same operations again
      "activation_checkpointing"};
  return keys;
}

std::string config_sha256(const TrainConfig& c, const std::string& data_sha256) {
  json j = to_json(c);
  for (const auto& k : resume_volatile_keys()) j.erase(k);
  // Added later: hashed only when set to something else than what runs before it computed, so
  // their checkpoints still resume.
  if (c.dion_qr == "householder") j.erase("dion_qr");
  if (c.fraction == 0.25) j.erase("fraction");
  if (!c.tf32) j.erase("tf32");  // TF32 products compute other bits: a run resumes only as it began
  j["data_sha256"] = data_sha256;
  return sha256_hex(j.dump());  // nlohmann's object keys are sorted: canonical
}

}  // namespace orthopt::train

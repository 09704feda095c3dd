#pragma once
// Configuration of `orthopt train` (and of each run of `orthopt compare`): one flat JSON
// object whose keys are the long CLI flags with '_' for '-'. A config file gives a base,
// flags override it, unknown keys and out-of-range values are errors naming the key.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "orthopt/train/schedule.h"

namespace orthopt::train {

struct TrainConfig {
  // model
  std::string preset = "tiny";   // tiny | small | gpt2-124m
  int64_t context = 0;           // 0: the preset's
  int64_t n_experts = 0;         // > 0: MoE MLPs
  int64_t top_k = 2;
  double router_bias_rate = 1e-3;
  double router_z_loss = 0.0;
  std::string activation_checkpointing = "none";  // none | block | selective (ModelConfig)
  // data
  std::string data;              // empty: the default corpus (King James Bible)
  double val_fraction = 0.05;    // the last 5% of the file is the validation set
  // optimizer: `algorithm` for the matrices inside blocks, AdamW for everything else
  std::string algorithm = "muon";  // adamw | muon | normuon | dion3 | dion | lion
  double lr = 0.0;               // 0: the preset lr of the algorithm (default_matrix_lr)
  double scalar_lr = 3e-3;       // AdamW lr of embeddings, head, norms (and of the routers)
  double weight_decay = 0.01;    // matrix group
  double momentum = 0.95;        // matrix optimizers' μ
  std::string dion_qr = "householder";  // dion's orthonormalization: householder | cholesky
  double fraction = 0.25;        // dion3's row fraction f (the optimizer's `fraction`; lr / sqrt(f))
  std::string execution = "auto";  // ExecutionOptions of every group, "field=value,..." (docs/execution.md)
  // schedule and steps (every counter is in optimizer steps)
  LrSchedule schedule;           // keys: schedule, warmup_frac, stable_frac, decay_frac, min_lr_ratio, decay_shape
  int64_t steps = 600;
  int64_t batch_size = 16;       // sequences per micro-batch
  int64_t grad_accum = 1;        // micro-batches per optimizer step
  double clip = 1.0;             // global grad-norm clipping; 0 disables
  int64_t eval_every = 50;       // also at the last step
  int64_t eval_batches = 8;      // validation batches of batch_size sequences
  int64_t checkpoint_every = 100;  // also at the last step; 0: only at the last step
  int64_t keep_last = 3;
  uint64_t seed = 1;
  std::string run_dir = "runs/train";
  bool resume = false;
  bool save_checkpoints = true;
  std::vector<int64_t> inject_nonfinite;  // 1-based optimizer steps whose loss is made NaN
  int64_t max_nonfinite = 5;     // consecutive non-finite steps before the run aborts
  int64_t stop_after = 0;        // > 0: stop after this step (checkpointed) as if interrupted
  int64_t spike_window = 128;
  double spike_sigma = 6.0;
  std::string device = "auto";   // auto | cpu | cuda
  bool bf16 = true;              // bf16 autocast on CUDA (ignored on CPU)
  bool cuda_graph = false;       // replay the optimizer step as a CUDA graph (CUDA, one process; not dion)
  bool deterministic = false;    // torch's deterministic kernels: bit-reproducible CUDA runs (slower)
  bool tf32 = false;             // fp32 cuBLAS products with TF32 inputs (torch's allow_tf32; CUDA only):
                                 // Dion's four products, the model's matmuls with bf16 false
  int64_t log_every = 10;        // plain log line interval when stdout is not a terminal
  std::string progress = "auto"; // auto (bar on a terminal) | on | off
};

// The lr each algorithm starts from when `lr` is 0, tuned for the tiny preset
// (docs/training.md lists the grid).
double default_matrix_lr(const std::string& algorithm);

nlohmann::json to_json(const TrainConfig& c);
// Starts from the defaults and applies every key of `j`; unknown keys and wrong types throw
// c10::Error naming the key. Calls validate().
TrainConfig config_from_json(const nlohmann::json& j);
// Range checks; throws c10::Error naming the key and the allowed range.
void validate(const TrainConfig& c);
// Reads a JSON config file (c10::Error naming the file on a missing file or a syntax error).
nlohmann::json read_config_file(const std::string& path);

// Keys that may differ between a run and its resumption (paths, checkpoint cadence, fault
// injection, logging, how the step executes: cuda_graph, deterministic): left out of the config hash. Everything else, including the total
// number of steps (the schedule depends on it) and the corpus' SHA-256 instead of its path, is in.
const std::vector<std::string>& resume_volatile_keys();
// SHA-256 of the canonical JSON (sorted keys, no spaces) of to_json(c) minus the volatile
// keys plus {"data_sha256": data_sha256}.
std::string config_sha256(const TrainConfig& c, const std::string& data_sha256);

}  // namespace orthopt::train

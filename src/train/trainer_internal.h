#pragma once
// The steps train() (trainer.cpp) runs a training run in, and the state they share: set-up and
// resume (trainer_setup.cpp), then per optimizer step the update, metrics, evaluation, progress
// and checkpoint (trainer_step.cpp).

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "orthopt/cuda_graph.h"
#include "orthopt/distributed.h"
#include "orthopt/optim.h"
#include "orthopt/train/checkpoint.h"
#include "orthopt/train/data.h"
#include "orthopt/train/guards.h"
#include "orthopt/train/io.h"
#include "orthopt/train/model.h"
#include "orthopt/train/trainer.h"

namespace orthopt::train::trainer_detail {

using Clock = std::chrono::steady_clock;

// One run of train() between its steps. Members are created in declaration order by the set-up
// steps and destroyed in reverse, as the locals of one function would be.
struct TrainRun {
  // Joins the data-parallel group when WORLD_SIZE is set.
  TrainRun(const TrainConfig& config, const ModelConfig& model_config, c10::Device device, std::ostream& rank_log);
  TrainRun(const TrainRun&) = delete;
  TrainRun& operator=(const TrainRun&) = delete;

  TrainConfig c;  // with the lr actually used
  ModelConfig mcfg;
  c10::Device device;
  bool autocast;  // bf16 autocast of the forward passes (CUDA and c.bf16)

  // Data parallel (`--nproc N` or an external launcher setting WORLD_SIZE; docs/distributed.md):
  // every rank holds the model and trains on its own micro-batches; rank 0 ("lead") alone writes
  // the run directory and logs.
  std::shared_ptr<dist::DistContext> ctx;
  bool lead = true;
  int64_t world = 1;
  std::ostream& rank_log;  // every rank's log
  std::ostream null_log{nullptr};
  std::ostream& log;  // the lead's log; other ranks' goes nowhere

  std::string data_path;
  Corpus corpus;
  std::string config_hash;
  std::string metrics_path;
  c10::optional<std::string> resume_from;  // the checkpoint directory to continue
  CheckpointMeta meta;                     // resume_from's

  Transformer model{nullptr};
  std::vector<at::Tensor> params;
  // One of the two: the single-process optimizer, or the distributed one (same math, state
  // sharded over the ranks).
  std::unique_ptr<Optimizer> single;
  std::unique_ptr<dist::DistributedOptimizer> distributed;
  std::optional<BatchSampler> sampler;
  std::optional<SpikeGuard> spike_guard;
  std::optional<NonFiniteFirewall> firewall;
  std::vector<std::pair<at::Tensor, at::Tensor>> val_batches;
  std::set<int64_t> inject;  // --inject-nonfinite steps

  TrainResult result;
  int64_t step = 0;  // optimizer steps consumed (the schedule position)
  int64_t tokens_seen = 0;
  int64_t tokens_per_step = 0;
  int64_t end_step = 0;  // c.stop_after or c.steps

  std::unique_ptr<CudaGraphOptimizer> graph;  // `cuda_graph` (docs/cuda_graph.md)
  std::unique_ptr<AppendFile> metrics;        // the lead's metrics.jsonl
  bool tty = false;                           // progress bar instead of log lines

  // This process's timing.
  double train_seconds = 0.0;
  std::vector<double> opt_ms;  // per optimizer call
  int64_t steps_here = 0;
  Clock::time_point t_start;
};

double seconds_since(Clock::time_point t0);
std::string read_whole_file(const std::string& path);

// ---- set-up (trainer_setup.cpp), in this order ----
// The corpus and the config hash.
void open_data(TrainRun& r);
// Fresh start or resume: decided (and checked) before anything is written; creates the run dir.
void prepare_run_dir(TrainRun& r);
// Seeded model, optimizer, sampler, guards and evaluation batches.
void build_model(TrainRun& r);
// Model, optimizer, guards, RNG, sampler and counters from r.resume_from, or a fresh
// metrics.jsonl; then the CUDA graph, the metrics file and the run's first log line.
void resume_or_start(TrainRun& r);

// ---- the loop (trainer_step.cpp) ----
// One optimizer step with its metrics line, and the evaluation, progress and checkpoint due after it.
void train_step(TrainRun& r);
// Mean validation loss over r.val_batches (nats per byte).
double evaluate(TrainRun& r);
// Writes a checkpoint of step r.step (every rank takes part in a data-parallel run).
void save_checkpoint(TrainRun& r);
// The run's result and its closing log lines.
TrainResult finish(TrainRun& r);

}  // namespace orthopt::train::trainer_detail

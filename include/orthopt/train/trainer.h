#pragma once
// `orthopt train` and `orthopt compare` as library functions.

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "orthopt/train/config.h"
#include "orthopt/train/model.h"

namespace orthopt::train {

struct EvalPoint {
  int64_t step;
  double val_loss;  // nats per byte
};

struct TrainResult {
  int64_t n_params = 0;
  int64_t steps_done = 0;         // optimizer steps of the schedule consumed (skipped ones too)
  int64_t skipped_nonfinite = 0;  // steps skipped by the firewall
  int64_t skipped_spike = 0;      // steps skipped by the spike guard
  double final_val_loss = 0.0;    // at the last evaluation (nan if none)
  std::vector<EvalPoint> evals;   // every evaluation of the run (resumed runs: from the start)
  // clip + optimizer.step(), the median over this process's optimizer calls (not the mean: the
  // first steps' one-time costs, e.g. CUDA module loading, state allocation and a graph
  // capture, would dominate a short run's); every call's time is `opt_ms` in metrics.jsonl
  double optimizer_ms_per_step = 0.0;
  double tokens_per_s = 0.0;           // training tokens / training wall time (this process only)
  bool stopped_early = false;          // stop_after reached
};

// The pieces train() builds a run from, which `orthopt bench train` (bench/bench_train.cpp) reuses
// so that it times the trainer's own model, routing and autocast.
// The model of a config: its preset with context and MoE keys applied (validated).
ModelConfig model_config_of(const TrainConfig& c);
// Matrices inside blocks get `algorithm`; embeddings, head, norms and routers AdamW.
std::vector<ParamGroup> make_param_groups(const Transformer& model, const TrainConfig& c);
// "cpu", "cuda" or "auto"; on CUDA a data-parallel rank takes GPU LOCAL_RANK mod the device count.
c10::Device pick_device(const std::string& device);
// bf16 autocast of the forward pass on CUDA for the object's lifetime when `on`.
class Bf16Autocast {
 public:
  explicit Bf16Autocast(bool on);
  ~Bf16Autocast();
  Bf16Autocast(const Bf16Autocast&) = delete;
  Bf16Autocast& operator=(const Bf16Autocast&) = delete;

 private:
  bool on_;
  bool prev_ = false;
};

// Runs (or with c.resume continues) a training run in c.run_dir, logging to `log`. The corpus
// is the default one (generated and cached on first use) unless c.data names a file.
// Throws c10::Error on bad input and NonFiniteAbort (guards.h) when the firewall gives up.
TrainResult train(const TrainConfig& c, std::ostream& log);

// Step where `evals` first reaches `target` (loss <= target), linearly interpolated between the
// evaluation before and the one at the crossing; -1 if never.
double steps_to_reach(const std::vector<EvalPoint>& evals, double target);

// Bits per byte of a loss in nats per byte.
double bits_per_byte(double loss_nats);

// `orthopt compare`: orthopt/train/compare.h.

}  // namespace orthopt::train

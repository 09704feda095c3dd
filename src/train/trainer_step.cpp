// The loop steps of train() (trainer_internal.h): one optimizer step, evaluation, metrics and
// progress, checkpoints, and the run's result.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <mutex>
#include <sstream>

#include "orthopt/train/schedule.h"
#include "trainer_internal.h"

namespace orthopt::train::trainer_detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void sync_device(c10::Device d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  std::ostringstream ss;
  if (t >= 3600) ss << t / 3600 << "h" << std::setw(2) << std::setfill('0') << (t % 3600) / 60 << "m";
  else if (t >= 60) ss << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else ss << t << "s";
  return ss.str();
}

// A failed write ends the run; what it says next is how to go on.
template <class Write>
void stopping_on_write_error(const TrainRun& r, Write&& write) {
  try {
    write();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, e.msg(), "\nthe run stopped at step ", r.step,
                "; the checkpoints already saved are unchanged: continue with --resume once the disk has room");
  }
}

void log_metrics(TrainRun& r, const json& record) {
  if (r.metrics) r.metrics->append(record.dump() + "\n");
}

// The step's mean LM loss and mean objective (with the router losses) over its micro-batches.
struct StepLoss {
  at::Tensor lm, total;
};

// Forward and backward passes of the c.grad_accum micro-batches of step `s`, gradients
// accumulated; data parallel, the losses averaged over the ranks.
StepLoss forward_backward(TrainRun& r, int64_t s) {
  if (r.distributed) r.distributed->zero_grad();
  else r.single->zero_grad(/*set_to_none=*/!r.graph);  // a graph reads the same gradient buffers every replay
  const double accum = static_cast<double>(r.c.grad_accum);
  StepLoss loss{at::zeros({}, at::TensorOptions().device(r.device)), at::zeros({}, at::TensorOptions().device(r.device))};
  for (int64_t micro = 0; micro < r.c.grad_accum; ++micro) {
    auto batch = r.sampler->next(r.device);
    LossParts parts;
    {
      Bf16Autocast ac(r.autocast);
      parts = r.model->loss(batch.first, batch.second);
    }
    at::Tensor objective = parts.total / accum;
    if (r.inject.count(s))  // fault injection (--inject-nonfinite)
      objective = objective * at::full({}, std::numeric_limits<float>::quiet_NaN()).to(r.device);
    objective.backward();
    loss.lm = loss.lm + parts.lm.detach() / accum;
    loss.total = loss.total + objective.detach();
  }
  if (r.ctx) {  // the global batch's loss: the guards must decide alike on every rank
    at::Tensor both = at::stack({loss.lm, loss.total});
    r.ctx->all_reduce_sum(both);
    both.div_(static_cast<double>(r.world));
    loss.lm = both[0];
    loss.total = both[1];
  }
  return loss;
}

// The guarded update of step `s`: the non-finite firewall, then the spike guard's skip factor,
// clipping and the optimizer step at the schedule's lr `factor`. Returns what was skipped
// ("none", "nonfinite" or "spike"); the optimizer call's time goes into `line`.
std::string guarded_update(TrainRun& r, int64_t s, const StepLoss& loss, const at::Tensor& grad_norm, double factor,
                           json& line) {
  if (!r.firewall->check(loss.total, grad_norm, s)) {
    // Non-finite: no optimizer call at all, so params and every state stay bit-identical.
    ++r.result.skipped_nonfinite;
    r.model->update_router_biases(at::zeros({}, at::TensorOptions().device(r.device)));
    r.log << (r.tty ? "\n" : "") << "step " << s << ": non-finite loss or gradient norm, step skipped ("
          << r.firewall->consecutive() << " in a row, abort at " << r.firewall->max_consecutive() << ")\n";
    return "nonfinite";
  }
  const auto t_opt = Clock::now();
  const at::Tensor apply = r.spike_guard->observe(loss.total, grad_norm);
  if (r.distributed) {
    r.distributed->set_skip_factor(apply);
    clip_grad_norm(r.distributed->owned_params(), r.c.clip, grad_norm);
    r.distributed->set_lr_scale(factor);
    r.distributed->apply_update();
  } else {
    r.single->set_skip_factor(apply);
    clip_grad_norm(r.params, r.c.clip, grad_norm);
    r.single->set_lr_scale(factor);
    if (r.graph) r.graph->step();
    else r.single->step();
  }
  // MoE: the global batch's expert loads (exact: integer counts in fp32), so the router
  // biases, buffers that no optimizer touches, stay identical on every rank.
  if (r.ctx)
    for (at::Tensor& load : r.model->router_loads()) r.ctx->all_reduce_sum(load);
  r.model->update_router_biases(apply);
  sync_device(r.device);
  r.opt_ms.push_back(1e3 * seconds_since(t_opt));
  line["opt_ms"] = r.opt_ms.back();
  if (apply.item<float>() == 0.0f) {
    ++r.result.skipped_spike;
    return "spike";
  }
  return "none";
}

// Evaluation after step `s`: the result, a metrics line and a log line.
void record_evaluation(TrainRun& r, int64_t s) {
  const double v = evaluate(r);
  r.result.evals.push_back({s, v});
  stopping_on_write_error(
      r, [&] { log_metrics(r, json{{"type", "eval"}, {"step", s}, {"val_loss", v}, {"val_bpb", bits_per_byte(v)}}); });
  r.log << (r.tty ? "\r\033[K" : "") << "step " << s << " eval: val loss " << std::fixed << std::setprecision(4) << v
        << ", " << std::setprecision(3) << bits_per_byte(v) << " bits/byte" << std::defaultfloat << "\n";
}

// The progress bar (tty) or, every c.log_every steps and at the end, a log line.
void log_progress(TrainRun& r, int64_t s, double loss, double factor, double elapsed, double tok_s) {
  const TrainConfig& c = r.c;
  const double eta = (elapsed / static_cast<double>(r.steps_here)) * static_cast<double>(r.end_step - s);
  std::ostringstream status;
  status << "step " << s << "/" << c.steps << " loss " << std::fixed << std::setprecision(4) << loss << " lr "
         << std::scientific << std::setprecision(2) << c.lr * factor << std::fixed << std::setprecision(0) << " "
         << tok_s << " tok/s ETA " << format_duration(eta);
  if (r.tty) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * s / std::max<int64_t>(c.steps, 1));
    r.log << "\r\033[K[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] " << status.str()
          << std::flush;
  } else if (s % c.log_every == 0 || s == r.end_step) {
    r.log << status.str() << "\n";
  }
}

}  // namespace

void train_step(TrainRun& r) {
  const int64_t s = r.step + 1;  // 1-based number of the step being taken
  const auto t_step = Clock::now();
  const StepLoss loss = forward_backward(r, s);
  r.tokens_seen += r.tokens_per_step;
  // Distributed: the norm of the rank-averaged gradient, reduced into this rank's shard.
  const at::Tensor grad_norm = r.distributed ? r.distributed->reduce_gradients() : global_grad_norm(r.params);
  json line = {{"type", "train"}, {"step", s}};
  const double factor = lr_factor(r.c.schedule, r.c.steps, s);
  const std::string skipped = guarded_update(r, s, loss, grad_norm, factor, line);
  r.step = s;
  ++r.steps_here;
  r.train_seconds += seconds_since(t_step);
  const double loss_value = loss.lm.item<double>();
  const double elapsed = seconds_since(r.t_start);
  const double tok_s = static_cast<double>(r.steps_here * r.tokens_per_step) / std::max(r.train_seconds, 1e-9);
  line["loss"] = loss_value;
  line["grad_norm"] = grad_norm.item<double>();
  line["lr_factor"] = factor;
  line["lr"] = r.c.lr * factor;
  line["skipped"] = skipped;
  line["tokens"] = r.tokens_seen;
  line["time_s"] = elapsed;
  line["tokens_per_s"] = tok_s;
  stopping_on_write_error(r, [&] { log_metrics(r, line); });

  if (s % r.c.eval_every == 0 || s == r.c.steps) record_evaluation(r, s);
  log_progress(r, s, loss_value, factor, elapsed, tok_s);
  const bool periodic = r.c.checkpoint_every > 0 && s % r.c.checkpoint_every == 0;
  if (r.c.save_checkpoints && (periodic || s == r.end_step)) stopping_on_write_error(r, [&] { save_checkpoint(r); });
}

double evaluate(TrainRun& r) {
  torch::NoGradGuard no_grad;
  r.model->eval();
  double sum = 0.0;
  int64_t rows = 0;
  for (const auto& b : r.val_batches) {
    Bf16Autocast ac(r.autocast);
    auto parts = r.model->loss(b.first.to(r.device), b.second.to(r.device));
    sum += parts.lm.item<double>() * static_cast<double>(b.first.size(0));
    rows += b.first.size(0);
  }
  r.model->train();
  return sum / static_cast<double>(rows);
}

namespace {

// What the checkpoint's meta.json records beyond the step: the sampler, the result so far and
// the schedule position.
CheckpointMeta checkpoint_meta(const TrainRun& r) {
  CheckpointMeta m;
  m.tokens_seen = r.tokens_seen;
  m.config_sha256 = r.config_hash;
  m.optimizer = r.c.algorithm;
  json evals = json::array();
  for (const auto& e : r.result.evals) evals.push_back({e.step, e.val_loss});
  m.extra = {{"sampler", r.sampler->state()}, {"skipped_nonfinite", r.result.skipped_nonfinite},
             {"skipped_spike", r.result.skipped_spike}, {"evals", evals}, {"schedule_t", r.step},
             {"optimizer_steps", r.distributed ? r.distributed->step_count() : r.single->step_count()},
             // CPU reductions split by thread count: a resume reuses it for the same bits (orthopt train).
             {"intra_op_threads", at::get_num_threads()}};
  return m;
}

// The files every checkpoint holds, each with its writer.
std::vector<std::pair<std::string, CheckpointFileWriter>> checkpoint_files(TrainRun& r) {
  return {
      {"model.pt",
       [&r](const std::string& p) {
         torch::serialize::OutputArchive a;
         r.model->save(a);
         write_file_checked(p, archive_bytes(a));
       }},
      {"optimizer.pt",
       [&r](const std::string& p) {
         torch::serialize::OutputArchive a;
         r.single->save(a);
         write_file_checked(p, archive_bytes(a));
       }},
      {"guards.pt",
       [&r](const std::string& p) {
         torch::serialize::OutputArchive a;
         r.spike_guard->save(a);
         r.firewall->save(a);
         auto gen = at::detail::getDefaultCPUGenerator();
         at::Tensor rng;
         {
           std::lock_guard<std::mutex> lock(gen.mutex());
           rng = gen.get_state();
         }
         a.write("torch_cpu_rng", rng);
         write_file_checked(p, archive_bytes(a));
       }},
      {"metrics.jsonl", [&r](const std::string& p) { write_file_checked(p, read_whole_file(r.metrics_path)); }},
  };
}

// Data parallel: every rank's optimizer shard and sampler state go through a staging directory;
// the lead's writer copies them in, so they are checksummed and published with the rest. Returns
// the staging directory.
std::string stage_rank_files(TrainRun& r, std::vector<std::pair<std::string, CheckpointFileWriter>>& files) {
  files.erase(std::find_if(files.begin(), files.end(), [](const auto& f) { return f.first == "optimizer.pt"; }));
  const std::string staging = (fs::path(r.c.run_dir) / fmt::format(".dist_staging_{}", r.step)).string();
  if (r.lead) {
    remove_stale_staging_dirs(r.c.run_dir);
    fs::create_directories(staging);
  }
  r.ctx->barrier();
  r.distributed->save_shard(staging);
  write_file_atomically((fs::path(staging) / fmt::format("sampler_{}.txt", r.ctx->rank())).string(), r.sampler->state());
  r.ctx->barrier();
  for (int64_t rank = 0; rank < r.world; ++rank)
    for (const std::string& name : {fmt::format("optim_shard_{}.pt", rank), fmt::format("optim_shard_{}.json", rank),
                                   fmt::format("sampler_{}.txt", rank)})
      files.push_back({name, [staging, name](const std::string& p) { fs::copy_file(fs::path(staging) / name, p); }});
  return staging;
}

}  // namespace

void save_checkpoint(TrainRun& r) {
  const CheckpointMeta m = checkpoint_meta(r);
  auto files = checkpoint_files(r);
  const std::string staging = r.distributed ? stage_rank_files(r, files) : std::string();
  if (r.lead) {
    write_checkpoint(r.c.run_dir, r.step, files, m);
    prune_checkpoints(r.c.run_dir, static_cast<int>(r.c.keep_last));
    if (!staging.empty()) fs::remove_all(staging);
  }
  if (r.ctx) r.ctx->barrier();  // published before any rank goes on (or exits)
}

TrainResult finish(TrainRun& r) {
  TrainResult& result = r.result;
  if (r.tty) r.log << "\n";
  result.steps_done = r.step;
  result.stopped_early = r.step < r.c.steps;
  result.final_val_loss = result.evals.empty() ? std::nan("") : result.evals.back().val_loss;
  if (!r.opt_ms.empty()) {  // the median: a short run's mean is dominated by its first steps' one-time costs
    std::sort(r.opt_ms.begin(), r.opt_ms.end());
    const size_t n = r.opt_ms.size();
    result.optimizer_ms_per_step = n % 2 ? r.opt_ms[n / 2] : 0.5 * (r.opt_ms[n / 2 - 1] + r.opt_ms[n / 2]);
  }
  result.tokens_per_s =
      r.train_seconds > 0 ? static_cast<double>(r.steps_here * r.tokens_per_step) / r.train_seconds : 0.0;
  if (result.stopped_early) r.log << "stopped after step " << r.step << " (--stop-after); continue with --resume\n";
  r.log << "done: " << r.step << " steps, final val loss " << result.final_val_loss << " ("
        << bits_per_byte(result.final_val_loss) << " bits/byte), skipped " << result.skipped_nonfinite
        << " non-finite and " << result.skipped_spike << " spike steps";
  if (r.single && r.c.algorithm == "dion" && r.c.dion_qr == "cholesky")
    r.log << "; dion_qr cholesky fell back to Householder in " << r.single->dion_qr_fallbacks()
          << " parameter updates of this process";
  r.log << "\n";
  return result;
}

}  // namespace orthopt::train::trainer_detail

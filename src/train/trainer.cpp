// The training loop of `orthopt train` (docs/training.md).
#include "orthopt/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>

#include "core/torch_version.h"
#include "orthopt/cuda_graph.h"
#include "orthopt/optim.h"
#include "orthopt/runtime.h"
#include "orthopt/distributed.h"
#include "orthopt/train/checkpoint.h"
#include "orthopt/train/data.h"
#include "orthopt/train/guards.h"
#include "orthopt/train/io.h"
#include "orthopt/train/model.h"
#include "orthopt/train/schedule.h"

namespace orthopt::train {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

double bits_per_byte(double loss_nats) { return loss_nats / std::log(2.0); }

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Bf16Autocast::Bf16Autocast(bool on) : on_(on) {
  if (!on_) return;
#if ORTHOPT_TORCH_AT_LEAST(2, 4)
  prev_ = at::autocast::is_autocast_enabled(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
  prev_ = at::autocast::is_enabled();
  at::autocast::set_enabled(true);
  at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
  at::autocast::increment_nesting();
}

Bf16Autocast::~Bf16Autocast() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if ORTHOPT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCUDA, prev_);
#else
  at::autocast::set_enabled(prev_);
#endif
}

// On CUDA a data-parallel rank (LOCAL_RANK from `--nproc` or an external launcher) takes GPU
// LOCAL_RANK mod the device count, so the ranks of one host do not all share GPU 0.
c10::Device pick_device(const std::string& d) {
  if (d == "cpu") return c10::kCPU;
  const bool cuda = torch::cuda::is_available();
  TORCH_CHECK(cuda || d != "cuda", "device: cuda requested but this torch has no usable CUDA device");
  if (!cuda) return c10::kCPU;
  const char* local_rank = std::getenv("WORLD_SIZE") ? std::getenv("LOCAL_RANK") : nullptr;
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  const int64_t index = local_rank ? std::strtoll(local_rank, nullptr, 10) % count : 0;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

namespace {

void sync_device(c10::Device d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

// torch's strict deterministic mode for the duration of a run (`deterministic`): an operation
// without a deterministic implementation throws instead of running. cuBLAS needs a fixed
// workspace configuration to be reproducible, which is read when the process first uses it, so
// it is set before the run's first CUDA work (a value the user set is kept).
class DeterministicKernels {
 public:
  explicit DeterministicKernels(bool on) : on_(on) {
    if (!on_) return;
    prev_ = at::globalContext().deterministicAlgorithms();
    prev_warn_only_ = at::globalContext().deterministicAlgorithmsWarnOnly();
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~DeterministicKernels() {
    if (on_) at::globalContext().setDeterministicAlgorithms(prev_, prev_warn_only_);
  }
  DeterministicKernels(const DeterministicKernels&) = delete;
  DeterministicKernels& operator=(const DeterministicKernels&) = delete;

 private:
  bool on_;
  bool prev_ = false, prev_warn_only_ = false;
};

}  // namespace

ModelConfig model_config_of(const TrainConfig& c) {
  ModelConfig m = model_preset(c.preset);
  if (c.context > 0) m.context = c.context;
  m.n_experts = c.n_experts;
  m.top_k = c.top_k;
  m.router_bias_rate = c.router_bias_rate;
  m.router_z_loss = c.router_z_loss;
  validate_model_config(m);
  return m;
}

// Matrices inside blocks get `algorithm`; embeddings, head, norms and routers AdamW.
std::vector<ParamGroup> make_param_groups(const Transformer& model, const TrainConfig& c) {
  RoutingOptions routing;
  routing.scalar.lr = c.scalar_lr;
  GroupOptions& m = routing.matrix;
  const bool matrix_alg = c.algorithm != "adamw" && c.algorithm != "lion";
  m.algorithm = matrix_alg ? parse_algorithm(c.algorithm) : Algorithm::Muon;
  m.lr = c.lr;
  m.weight_decay = c.weight_decay;
  m.momentum = c.momentum;
  m.dion_qr = parse_dion_qr(c.dion_qr);
  m.scale_lr_by_fraction = c.algorithm == "dion3";  // lr transfer across fractions (§5.7)
  m.fraction = c.fraction;
  m.ortho.nonfinite = NonFinitePolicy::Propagate;   // the firewall looks at the grad norm
  auto groups = model->param_groups(routing);
  if (!matrix_alg) {
    // Elementwise baselines: the matrix groups take the scalar optimizer with the matrix lr/wd.
    for (auto& g : groups) {
      if (!is_matrix_algorithm(g.options.algorithm)) continue;
      GroupOptions o = routing.scalar;
      o.algorithm = parse_algorithm(c.algorithm);
      o.lr = c.lr;
      o.weight_decay = c.weight_decay;
      g.options = o;
    }
  }
  return groups;
}

namespace {

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot read '", path, "'");
  std::ostringstream ss;
  if (in.peek() != std::ifstream::traits_type::eof()) ss << in.rdbuf();
  TORCH_CHECK(!in.bad() && ss, "cannot read '", path, "': read error");
  return ss.str();
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

}  // namespace

TrainResult train(const TrainConfig& config, std::ostream& log_arg) {
  validate(config);
  TrainConfig c = config;
  if (c.lr == 0.0) c.lr = default_matrix_lr(c.algorithm);  // the hash sees the lr actually used
  const ModelConfig mcfg = model_config_of(c);
  const DeterministicKernels deterministic(c.deterministic);
  const c10::Device device = pick_device(c.device);
  TORCH_CHECK(!c.cuda_graph || device.is_cuda(), "cuda_graph: needs a CUDA device; device '", c.device,
              "' resolved to ", device);
  TORCH_CHECK(!c.tf32 || device.is_cuda(), "tf32: needs a CUDA device; device '", c.device, "' resolved to ", device);
  const Tf32Products tf32(c.tf32);
  TORCH_CHECK(!c.cuda_graph || !std::getenv("WORLD_SIZE"),
              "cuda_graph: not available in data-parallel runs (WORLD_SIZE is set): the distributed step's "
              "collectives are not captured");

  // ---- data parallel (`--nproc N` or an external launcher setting WORLD_SIZE; docs/distributed.md):
  // every rank holds the model, trains on its own micro-batches; rank 0 ("lead") alone writes
  // the run directory and logs.
  std::shared_ptr<dist::DistContext> ctx;
  if (std::getenv("WORLD_SIZE")) {
    dist::DistOptions o;
    o.device = device;
    ctx = std::make_shared<dist::DistContext>(o);
  }
  const bool lead = !ctx || ctx->rank() == 0;
  const int64_t world = ctx ? ctx->world_size() : 1;
  std::ostream null_stream(nullptr);
  std::ostream& log = lead ? log_arg : null_stream;
  const bool autocast = device.is_cuda() && c.bf16;

  // ---- data ----
  std::string data_path = c.data;
  if (data_path.empty()) {
    data_path = default_corpus_path();
    ensure_default_corpus(data_path);
  }
  const Corpus corpus = load_corpus(data_path, c.val_fraction, mcfg.context);
  const std::string config_hash = config_sha256(c, sha256_file(data_path));

  // ---- run directory: decide fresh start or resume before writing anything ----
  const std::string metrics_path = (fs::path(c.run_dir) / "metrics.jsonl").string();
  const auto existing = step_directories(c.run_dir);  // newest first
  c10::optional<std::string> resume_from;
  CheckpointMeta meta;
  if (c.resume) {
    resume_from = latest_valid_checkpoint(c.run_dir);
    // A newer step directory that is not valid is corruption, not a crash (crashes only leave
    // *.tmp directories): refuse rather than silently go back or overwrite it later.
    if (!existing.empty() && (!resume_from || existing.front().path != fs::path(*resume_from).string())) {
      try {
        verify_checkpoint(existing.front().path);
      } catch (const c10::Error& e) {
        TORCH_CHECK(false, "--resume: checkpoint ", existing.front().path, " is corrupted (",
                    e.what_without_backtrace(), "); move it away to resume from ",
                    resume_from ? *resume_from : std::string("scratch"));
      }
    }
    if (resume_from) meta = read_checkpoint_meta(*resume_from, config_hash);
  } else {
    std::error_code ec;
    TORCH_CHECK(existing.empty() && !fs::exists(metrics_path, ec), "run_dir '", c.run_dir,
                "' already holds a run; pass --resume to continue it or choose another --run-dir");
  }
  if (ctx) ctx->barrier();  // every rank has checked the run directory before the lead writes
  if (lead) {
    fs::create_directories(c.run_dir);
    remove_stale_staging_dirs(c.run_dir);  // left by a data-parallel run killed while saving
  }
  if (lead && !resume_from) write_file_atomically((fs::path(c.run_dir) / "config.json").string(), to_json(c).dump(2) + "\n");

  // ---- model, optimizer, guards, sampler ----
  torch::manual_seed(c.seed);
  Transformer model(mcfg);
  model->to(device);
  std::vector<at::Tensor> params = model->parameters();
  // One of the two: the single-process optimizer, or the distributed one (same math, state
  // sharded over the ranks).
  std::unique_ptr<Optimizer> single;
  std::unique_ptr<dist::DistributedOptimizer> distributed;
  if (ctx) distributed = std::make_unique<dist::DistributedOptimizer>(make_param_groups(model, c), ctx);
  else single = std::make_unique<Optimizer>(make_param_groups(model, c));
  // Rank r draws its own micro-batches (rank 0 the single-process ones).
  BatchSampler sampler(corpus.train, c.batch_size, mcfg.context, c.seed + 1000003ULL * static_cast<uint64_t>(lead ? 0 : ctx->rank()));
  SpikeGuard spike_guard(c.spike_window, c.spike_sigma, device);
  NonFiniteFirewall firewall(static_cast<int>(c.max_nonfinite));
  const auto val_batches = eval_batches(corpus.val, c.batch_size, mcfg.context, c.eval_batches);
  const std::set<int64_t> inject(c.inject_nonfinite.begin(), c.inject_nonfinite.end());

  TrainResult result;
  result.n_params = model->num_parameters();
  int64_t step = 0;        // optimizer steps consumed (the schedule position)
  int64_t tokens_seen = 0;
  const int64_t tokens_per_step = c.batch_size * c.grad_accum * mcfg.context * world;

  if (resume_from) {
    const std::string dir = *resume_from;
    {
      torch::serialize::InputArchive a;
      a.load_from((fs::path(dir) / "model.pt").string(), device);
      model->load(a);
    }
    if (distributed) {
      TORCH_CHECK(fs::exists(fs::path(dir) / "optim_shard_0.json"), "--resume: ", dir,
                  " was written by a single-process run; resume it without --nproc");
      distributed->load_shards(dir);  // any world size: re-shards
    } else {
      TORCH_CHECK(fs::exists(fs::path(dir) / "optimizer.pt"), "--resume: ", dir,
                  " was written by a distributed run; resume it with --nproc");
      torch::serialize::InputArchive a;
      a.load_from((fs::path(dir) / "optimizer.pt").string(), device);
      single->load(a);
    }
    {
      torch::serialize::InputArchive a;
      a.load_from((fs::path(dir) / "guards.pt").string());
      spike_guard.load(a);
      firewall.load(a);
      at::Tensor rng;
      a.read("torch_cpu_rng", rng);
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng);
    }
    const json& x = meta.extra;
    step = meta.step;
    tokens_seen = meta.tokens_seen;
    if (lead) {
      sampler.set_state(x.at("sampler").get<std::string>());
    } else if (fs::exists(fs::path(dir) / fmt::format("sampler_{}.txt", ctx->rank()))) {
      sampler.set_state(read_whole_file((fs::path(dir) / fmt::format("sampler_{}.txt", ctx->rank())).string()));
    } else {
      log_arg << "rank " << ctx->rank() << ": the checkpoint has no sampler state for this rank (other world "
              << "size): its micro-batches start afresh\n";
    }
    result.skipped_nonfinite = x.at("skipped_nonfinite").get<int64_t>();
    result.skipped_spike = x.at("skipped_spike").get<int64_t>();
    for (const auto& e : x.at("evals")) result.evals.push_back({e.at(0).get<int64_t>(), e.at(1).get<double>()});
    // The metrics of the resumed run are those up to the checkpoint: lines written after it by
    // the interrupted process are replaced by what this process recomputes.
    if (lead) write_file_atomically(metrics_path, read_whole_file((fs::path(dir) / "metrics.jsonl").string()));
    log << "resumed from " << dir << " at step " << step << "\n";
  } else {
    // Fresh start (with --resume: a crash before the first checkpoint): no stale lines.
    if (lead) write_file_atomically(metrics_path, "");
    if (c.resume) log << "no valid checkpoint in " << c.run_dir << ": starting from step 0\n";
  }
  // `cuda_graph`: eager warm-up steps, then one capture, then replays (docs/cuda_graph.md). Made
  // after a resume's load(), which replaces the state tensors a graph would have baked in.
  std::unique_ptr<CudaGraphOptimizer> graph;
  if (c.cuda_graph) graph = std::make_unique<CudaGraphOptimizer>(*single);
  // Every line is written whole or the run stops (io.h): a checkpoint never copies a cut file.
  std::unique_ptr<AppendFile> metrics;
  if (lead) metrics = std::make_unique<AppendFile>(metrics_path);
  auto log_metrics = [&](const json& record) {
    if (metrics) metrics->append(record.dump() + "\n");
  };
  // A failed write ends the run; what it says next is how to go on.
  auto stopping_on_write_error = [&](auto&& write) {
    try {
      write();
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, e.msg(), "\nthe run stopped at step ", step,
                  "; the checkpoints already saved are unchanged: continue with --resume once the disk has room");
    }
  };

  const bool tty = c.progress == "on" || (c.progress == "auto" && &log == &std::cout && ::isatty(STDOUT_FILENO));
  const int64_t end_step = c.stop_after > 0 ? c.stop_after : c.steps;
  log << "model " << mcfg.preset << (mcfg.n_experts ? " (MoE)" : "") << ": " << result.n_params
      << " params; data " << data_path << " (" << corpus.train.numel() << " train / " << corpus.val.numel()
      << " val bytes); " << c.algorithm << " lr " << c.lr << ", " << c.steps << " steps of " << tokens_per_step
      << " tokens on " << device << (graph ? ", optimizer step as a CUDA graph" : "")
      << (c.deterministic ? ", deterministic kernels" : "") << (c.tf32 ? ", TF32 products" : "") << "\n";

  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    double sum = 0.0;
    int64_t rows = 0;
    for (const auto& b : val_batches) {
      Bf16Autocast ac(autocast);
      auto parts = model->loss(b.first.to(device), b.second.to(device));
      sum += parts.lm.item<double>() * static_cast<double>(b.first.size(0));
      rows += b.first.size(0);
    }
    model->train();
    return sum / static_cast<double>(rows);
  };

  auto save_checkpoint = [&]() {
    CheckpointMeta m;
    m.tokens_seen = tokens_seen;
    m.config_sha256 = config_hash;
    m.optimizer = c.algorithm;
    json evals = json::array();
    for (const auto& e : result.evals) evals.push_back({e.step, e.val_loss});
    m.extra = {{"sampler", sampler.state()}, {"skipped_nonfinite", result.skipped_nonfinite},
               {"skipped_spike", result.skipped_spike}, {"evals", evals}, {"schedule_t", step},
               {"optimizer_steps", distributed ? distributed->step_count() : single->step_count()}};
    std::vector<std::pair<std::string, CheckpointFileWriter>> files = {
        {"model.pt",
         [&](const std::string& p) {
           torch::serialize::OutputArchive a;
           model->save(a);
           write_file_checked(p, archive_bytes(a));
         }},
        {"optimizer.pt",
         [&](const std::string& p) {
           torch::serialize::OutputArchive a;
           single->save(a);
           write_file_checked(p, archive_bytes(a));
         }},
        {"guards.pt",
         [&](const std::string& p) {
           torch::serialize::OutputArchive a;
           spike_guard.save(a);
           firewall.save(a);
           auto gen = at::detail::getDefaultCPUGenerator();
           at::Tensor rng;
           {
             std::lock_guard<std::mutex> lock(gen.mutex());
             rng = gen.get_state();
           }
           a.write("torch_cpu_rng", rng);
           write_file_checked(p, archive_bytes(a));
         }},
        {"metrics.jsonl", [&](const std::string& p) { write_file_checked(p, read_whole_file(metrics_path)); }},
    };
    std::string staging;
    if (distributed) {
      // Every rank's optimizer shard and sampler state go through a staging directory; the
      // lead's writer copies them in, so they are checksummed and published with the rest.
      files.erase(std::find_if(files.begin(), files.end(), [](const auto& f) { return f.first == "optimizer.pt"; }));
      staging = (fs::path(c.run_dir) / fmt::format(".dist_staging_{}", step)).string();
      if (lead) {
        remove_stale_staging_dirs(c.run_dir);
        fs::create_directories(staging);
      }
      ctx->barrier();
      distributed->save_shard(staging);
      write_file_atomically((fs::path(staging) / fmt::format("sampler_{}.txt", ctx->rank())).string(), sampler.state());
      ctx->barrier();
      for (int64_t r = 0; r < world; ++r)
        for (const std::string& name : {fmt::format("optim_shard_{}.pt", r), fmt::format("optim_shard_{}.json", r),
                                       fmt::format("sampler_{}.txt", r)})
          files.push_back({name, [staging, name](const std::string& p) { fs::copy_file(fs::path(staging) / name, p); }});
    }
    if (lead) {
      write_checkpoint(c.run_dir, step, files, m);
      prune_checkpoints(c.run_dir, static_cast<int>(c.keep_last));
      if (!staging.empty()) fs::remove_all(staging);
    }
    if (ctx) ctx->barrier();  // published before any rank goes on (or exits)
  };

  model->train();
  double train_seconds = 0.0;
  std::vector<double> opt_ms;  // per optimizer call of this process
  int64_t steps_here = 0;
  const auto t_start = Clock::now();
  const auto nan = at::full({}, std::numeric_limits<float>::quiet_NaN());
  while (step < end_step) {
    const int64_t s = step + 1;  // 1-based number of the step being taken
    const auto t_step = Clock::now();
    if (distributed) distributed->zero_grad();
    else single->zero_grad(/*set_to_none=*/!graph);  // a graph reads the same gradient buffers every replay
    at::Tensor loss_lm = at::zeros({}, at::TensorOptions().device(device));
    at::Tensor loss_total = at::zeros({}, at::TensorOptions().device(device));
    for (int64_t micro = 0; micro < c.grad_accum; ++micro) {
      auto batch = sampler.next(device);
      LossParts parts;
      {
        Bf16Autocast ac(autocast);
        parts = model->loss(batch.first, batch.second);
      }
      at::Tensor objective = parts.total / static_cast<double>(c.grad_accum);
      if (inject.count(s)) objective = objective * nan.to(device);  // fault injection (--inject-nonfinite)
      objective.backward();
      loss_lm = loss_lm + parts.lm.detach() / static_cast<double>(c.grad_accum);
      loss_total = loss_total + objective.detach();
    }
    tokens_seen += tokens_per_step;
    if (ctx) {  // the global batch's loss: the guards must decide alike on every rank
      at::Tensor both = at::stack({loss_lm, loss_total});
      ctx->all_reduce_sum(both);
      both.div_(static_cast<double>(world));
      loss_lm = both[0];
      loss_total = both[1];
    }
    // Distributed: the norm of the rank-averaged gradient, reduced into this rank's shard.
    const at::Tensor grad_norm = distributed ? distributed->reduce_gradients() : global_grad_norm(params);
    json line = {{"type", "train"}, {"step", s}};
    std::string skipped = "none";
    const double factor = lr_factor(c.schedule, c.steps, s);
    if (!firewall.check(loss_total, grad_norm, s)) {
      // Non-finite: no optimizer call at all, so params and every state stay bit-identical.
      ++result.skipped_nonfinite;
      skipped = "nonfinite";
      model->update_router_biases(at::zeros({}, at::TensorOptions().device(device)));
      log << (tty ? "\n" : "") << "step " << s << ": non-finite loss or gradient norm, step skipped ("
          << firewall.consecutive() << " in a row, abort at " << firewall.max_consecutive() << ")\n";
    } else {
      const auto t_opt = Clock::now();
      const at::Tensor apply = spike_guard.observe(loss_total, grad_norm);
      if (distributed) {
        distributed->set_skip_factor(apply);
        clip_grad_norm(distributed->owned_params(), c.clip, grad_norm);
        distributed->set_lr_scale(factor);
        distributed->apply_update();
      } else {
        single->set_skip_factor(apply);
        clip_grad_norm(params, c.clip, grad_norm);
        single->set_lr_scale(factor);
        if (graph) graph->step();
        else single->step();
      }
      // MoE: the global batch's expert loads (exact: integer counts in fp32), so the router
      // biases, buffers that no optimizer touches, stay identical on every rank.
      if (ctx)
        for (at::Tensor& load : model->router_loads()) ctx->all_reduce_sum(load);
      model->update_router_biases(apply);
      sync_device(device);
      opt_ms.push_back(1e3 * seconds_since(t_opt));
      line["opt_ms"] = opt_ms.back();
      if (apply.item<float>() == 0.0f) {
        ++result.skipped_spike;
        skipped = "spike";
      }
    }
    step = s;
    ++steps_here;
    train_seconds += seconds_since(t_step);
    const double loss_value = loss_lm.item<double>();
    const double elapsed = seconds_since(t_start);
    const double tok_s = static_cast<double>(steps_here * tokens_per_step) / std::max(train_seconds, 1e-9);
    line["loss"] = loss_value;
    line["grad_norm"] = grad_norm.item<double>();
    line["lr_factor"] = factor;
    line["lr"] = c.lr * factor;
    line["skipped"] = skipped;
    line["tokens"] = tokens_seen;
    line["time_s"] = elapsed;
    line["tokens_per_s"] = tok_s;
    stopping_on_write_error([&] { log_metrics(line); });

    if (s % c.eval_every == 0 || s == c.steps) {
      const double v = evaluate();
      result.evals.push_back({s, v});
      stopping_on_write_error(
          [&] { log_metrics(json{{"type", "eval"}, {"step", s}, {"val_loss", v}, {"val_bpb", bits_per_byte(v)}}); });
      log << (tty ? "\r\033[K" : "") << "step " << s << " eval: val loss " << std::fixed << std::setprecision(4) << v
          << ", " << std::setprecision(3) << bits_per_byte(v) << " bits/byte" << std::defaultfloat << "\n";
    }

    const double eta = (elapsed / static_cast<double>(steps_here)) * static_cast<double>(end_step - s);
    std::ostringstream status;
    status << "step " << s << "/" << c.steps << " loss " << std::fixed << std::setprecision(4) << loss_value
           << " lr " << std::scientific << std::setprecision(2) << c.lr * factor << std::fixed << std::setprecision(0)
           << " " << tok_s << " tok/s ETA " << format_duration(eta);
    if (tty) {
      constexpr int kWidth = 24;
      const int filled = static_cast<int>(kWidth * s / std::max<int64_t>(c.steps, 1));
      log << "\r\033[K[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] " << status.str() << std::flush;
    } else if (s % c.log_every == 0 || s == end_step) {
      log << status.str() << "\n";
    }

    const bool periodic = c.checkpoint_every > 0 && s % c.checkpoint_every == 0;
    if (c.save_checkpoints && (periodic || s == end_step)) stopping_on_write_error(save_checkpoint);
  }
  if (tty) log << "\n";

  result.steps_done = step;
  result.stopped_early = step < c.steps;
  result.final_val_loss = result.evals.empty() ? std::nan("") : result.evals.back().val_loss;
  if (!opt_ms.empty()) {  // the median: a short run's mean is dominated by its first steps' one-time costs
    std::sort(opt_ms.begin(), opt_ms.end());
    const size_t n = opt_ms.size();
    result.optimizer_ms_per_step = n % 2 ? opt_ms[n / 2] : 0.5 * (opt_ms[n / 2 - 1] + opt_ms[n / 2]);
  }
  result.tokens_per_s = train_seconds > 0 ? static_cast<double>(steps_here * tokens_per_step) / train_seconds : 0.0;
  if (result.stopped_early) log << "stopped after step " << step << " (--stop-after); continue with --resume\n";
  log << "done: " << step << " steps, final val loss " << result.final_val_loss << " ("
      << bits_per_byte(result.final_val_loss) << " bits/byte), skipped " << result.skipped_nonfinite
      << " non-finite and " << result.skipped_spike << " spike steps";
  if (single && c.algorithm == "dion" && c.dion_qr == "cholesky")
    log << "; dion_qr cholesky fell back to Householder in " << single->dion_qr_fallbacks()
        << " parameter updates of this process";
  log << "\n";
  return result;
}

}  // namespace orthopt::train

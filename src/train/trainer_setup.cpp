// The set-up steps of train() (trainer_internal.h): data, run directory, model and optimizer, resume.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>

#include "trainer_internal.h"

namespace orthopt::train::trainer_detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::shared_ptr<dist::DistContext> join_data_parallel(c10::Device device) {
  if (!std::getenv("WORLD_SIZE")) return nullptr;
  dist::DistOptions o;
  o.device = device;
  return std::make_shared<dist::DistContext>(o);
}

}  // namespace

TrainRun::TrainRun(const TrainConfig& config, const ModelConfig& model_config, c10::Device d, std::ostream& rank_log_)
    : c(config),
      mcfg(model_config),
      device(d),
      autocast(d.is_cuda() && config.bf16),
      ctx(join_data_parallel(d)),
      lead(!ctx || ctx->rank() == 0),
      world(ctx ? ctx->world_size() : 1),
      rank_log(rank_log_),
      log(lead ? rank_log_ : null_log) {}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot read '", path, "'");
  std::ostringstream ss;
  if (in.peek() != std::ifstream::traits_type::eof()) ss << in.rdbuf();
  TORCH_CHECK(!in.bad() && ss, "cannot read '", path, "': read error");
  return ss.str();
}

void open_data(TrainRun& r) {
  r.data_path = r.c.data;
  if (r.data_path.empty()) {
    r.data_path = default_corpus_path();
    ensure_default_corpus(r.data_path);
  }
  r.corpus = load_corpus(r.data_path, r.c.val_fraction, r.mcfg.context);
  r.config_hash = config_sha256(r.c, sha256_file(r.data_path));
}

void prepare_run_dir(TrainRun& r) {
  const TrainConfig& c = r.c;
  r.metrics_path = (fs::path(c.run_dir) / "metrics.jsonl").string();
  const auto existing = step_directories(c.run_dir);  // newest first
  if (c.resume) {
    r.resume_from = latest_valid_checkpoint(c.run_dir);
    // A newer step directory that is not valid is corruption, not a crash (crashes only leave
    // *.tmp directories): refuse rather than silently go back or overwrite it later.
    if (!existing.empty() && (!r.resume_from || existing.front().path != fs::path(*r.resume_from).string())) {
      try {
        verify_checkpoint(existing.front().path);
      } catch (const c10::Error& e) {
        TORCH_CHECK(false, "--resume: checkpoint ", existing.front().path, " is corrupted (",
                    e.what_without_backtrace(), "); move it away to resume from ",
                    r.resume_from ? *r.resume_from : std::string("scratch"));
      }
    }
    if (r.resume_from) r.meta = read_checkpoint_meta(*r.resume_from, r.config_hash);
  } else {
    std::error_code ec;
    TORCH_CHECK(existing.empty() && !fs::exists(r.metrics_path, ec), "run_dir '", c.run_dir,
                "' already holds a run; pass --resume to continue it or choose another --run-dir");
  }
  if (r.ctx) r.ctx->barrier();  // every rank has checked the run directory before the lead writes
  if (r.lead) {
    fs::create_directories(c.run_dir);
    remove_stale_staging_dirs(c.run_dir);  // left by a data-parallel run killed while saving
  }
  if (r.lead && !r.resume_from)
    write_file_atomically((fs::path(c.run_dir) / "config.json").string(), to_json(c).dump(2) + "\n");
}

void build_model(TrainRun& r) {
  const TrainConfig& c = r.c;
  torch::manual_seed(c.seed);
  r.model = Transformer(r.mcfg);
  r.model->to(r.device);
  r.params = r.model->parameters();
  if (r.ctx) r.distributed = std::make_unique<dist::DistributedOptimizer>(make_param_groups(r.model, c), r.ctx);
  else r.single = std::make_unique<Optimizer>(make_param_groups(r.model, c));
  // Rank r draws its own micro-batches (rank 0 the single-process ones).
  const uint64_t rank = static_cast<uint64_t>(r.lead ? 0 : r.ctx->rank());
  r.sampler.emplace(r.corpus.train, c.batch_size, r.mcfg.context, c.seed + 1000003ULL * rank);
  r.spike_guard.emplace(c.spike_window, c.spike_sigma, r.device);
  r.firewall.emplace(static_cast<int>(c.max_nonfinite));
  r.val_batches = eval_batches(r.corpus.val, c.batch_size, r.mcfg.context, c.eval_batches);
  r.inject = std::set<int64_t>(c.inject_nonfinite.begin(), c.inject_nonfinite.end());
  r.result.n_params = r.model->num_parameters();
  r.tokens_per_step = c.batch_size * c.grad_accum * r.mcfg.context * r.world;
}

namespace {

// Model, optimizer (a distributed run's shards: any world size, re-sharded), guards and the CPU
// generator from checkpoint `dir`.
void load_state(TrainRun& r, const std::string& dir) {
  {
    torch::serialize::InputArchive a;
    a.load_from((fs::path(dir) / "model.pt").string(), r.device);
    r.model->load(a);
  }
  if (r.distributed) {
    TORCH_CHECK(fs::exists(fs::path(dir) / "optim_shard_0.json"), "--resume: ", dir,
                " was written by a single-process run; resume it without --nproc");
    r.distributed->load_shards(dir);
  } else {
    TORCH_CHECK(fs::exists(fs::path(dir) / "optimizer.pt"), "--resume: ", dir,
                " was written by a distributed run; resume it with --nproc");
    torch::serialize::InputArchive a;
    a.load_from((fs::path(dir) / "optimizer.pt").string(), r.device);
    r.single->load(a);
  }
  torch::serialize::InputArchive a;
  a.load_from((fs::path(dir) / "guards.pt").string());
  r.spike_guard->load(a);
  r.firewall->load(a);
  at::Tensor rng;
  a.read("torch_cpu_rng", rng);
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

// Schedule position, token count, sampler, skip counts, evaluations and metrics.jsonl as they
// were at checkpoint `dir`.
void restore_progress(TrainRun& r, const std::string& dir) {
  const json& x = r.meta.extra;
  r.step = r.meta.step;
  r.tokens_seen = r.meta.tokens_seen;
  const fs::path own_sampler = fs::path(dir) / fmt::format("sampler_{}.txt", r.ctx ? r.ctx->rank() : 0);
  if (r.lead) {
    r.sampler->set_state(x.at("sampler").get<std::string>());
  } else if (fs::exists(own_sampler)) {
    r.sampler->set_state(read_whole_file(own_sampler.string()));
  } else {
    r.rank_log << "rank " << r.ctx->rank() << ": the checkpoint has no sampler state for this rank (other world "
               << "size): its micro-batches start afresh\n";
  }
  r.result.skipped_nonfinite = x.at("skipped_nonfinite").get<int64_t>();
  r.result.skipped_spike = x.at("skipped_spike").get<int64_t>();
  for (const auto& e : x.at("evals")) r.result.evals.push_back({e.at(0).get<int64_t>(), e.at(1).get<double>()});
  // The metrics of the resumed run are those up to the checkpoint: lines written after it by
  // the interrupted process are replaced by what this process recomputes.
  if (r.lead) write_file_atomically(r.metrics_path, read_whole_file((fs::path(dir) / "metrics.jsonl").string()));
  r.log << "resumed from " << dir << " at step " << r.step << "\n";
  if (x.contains("intra_op_threads") && x.at("intra_op_threads").get<int>() != at::get_num_threads())
    r.log << "note: the checkpoint was written with " << x.at("intra_op_threads").get<int>()
          << " intra-op threads and this process runs " << at::get_num_threads()
          << ": CPU reductions may round differently from an uninterrupted run\n";
}

// The CUDA graph, the metrics file and the run's first log line.
void open_outputs(TrainRun& r) {
  const TrainConfig& c = r.c;
  // `cuda_graph`: eager warm-up steps, then one capture, then replays (docs/cuda_graph.md). Made
  // after a resume's load(), which replaces the state tensors a graph would have baked in.
  if (c.cuda_graph) r.graph = std::make_unique<CudaGraphOptimizer>(*r.single);
  // Every line is written whole or the run stops (io.h): a checkpoint never copies a cut file.
  if (r.lead) r.metrics = std::make_unique<AppendFile>(r.metrics_path);
  r.tty = c.progress == "on" || (c.progress == "auto" && &r.log == &std::cout && ::isatty(STDOUT_FILENO));
  r.end_step = c.stop_after > 0 ? c.stop_after : c.steps;
  r.log << "model " << r.mcfg.preset << (r.mcfg.n_experts ? " (MoE)" : "") << ": " << r.result.n_params
        << " params; data " << r.data_path << " (" << r.corpus.train.numel() << " train / " << r.corpus.val.numel()
        << " val bytes); " << c.algorithm << " lr " << c.lr << ", " << c.steps << " steps of " << r.tokens_per_step
        << " tokens on " << r.device << (r.graph ? ", optimizer step as a CUDA graph" : "")
        << (c.deterministic ? ", deterministic kernels" : "") << (c.tf32 ? ", TF32 products" : "") << "\n";
}

}  // namespace

void resume_or_start(TrainRun& r) {
  if (r.resume_from) {
    load_state(r, *r.resume_from);
    restore_progress(r, *r.resume_from);
  } else {
    // Fresh start (with --resume: a crash before the first checkpoint): no stale lines.
    if (r.lead) write_file_atomically(r.metrics_path, "");
    if (r.c.resume) r.log << "no valid checkpoint in " << r.c.run_dir << ": starting from step 0\n";
  }
  open_outputs(r);
}

}  // namespace orthopt::train::trainer_detail

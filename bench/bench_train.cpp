// orthopt bench train: tokens/s of the trainer's step (src/train: the model, routing, autocast,
// clipping and optimizer `orthopt train` builds) split into forward, backward, clipping and
// optimizer, with the device synchronized around each part, beside bench/train_peer.py, the same
// model written plainly in PyTorch, run as a subprocess on the same batches.
#include "bench_train.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef ORTHOPT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "orthopt/optim.h"
#include "orthopt/train/config.h"
#include "orthopt/train/data.h"
#include "orthopt/train/guards.h"
#include "orthopt/train/model.h"
#include "orthopt/train/trainer.h"
#include "threads.h"

extern char** environ;

namespace orthopt::cli {

namespace fs = std::filesystem;
using nlohmann::json;

double peak_bf16_flops(const std::string& device_name) {
  std::string n = device_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return std::tolower(ch); });
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  // Dense (no 2:4 sparsity) bf16 tensor-core peaks from NVIDIA's data sheets.
  if (has("h200") || has("gh200")) return 989e12;
  if (has("h100")) {
    if (has("pcie")) return 756e12;
    if (has("nvl")) return 835e12;
    return 989e12;  // SXM ("H100 80GB HBM3")
  }
  if (has("h800")) return has("pcie") ? 756e12 : 989e12;
  if (has("a100") || has("a800")) return 312e12;
  if (has("l40s")) return 362e12;
  if (has("a10g")) return 70e12;
  return 0.0;
}

namespace {

struct TrainBenchArgs {
  std::string preset;   // empty: gpt2-124m on CUDA, tiny on the CPU
  int64_t batch_size = 16;
  int64_t context = 0;  // 0: the preset's
  std::string algorithm = "muon";
  std::string activation_checkpointing = "none";  // orthopt's row only: the peer keeps its activations
  std::string device = "auto";
  int steps = 10;
  int warmup = 3;
  std::string data;     // empty: the trainer's default corpus
  uint64_t seed = 1;
  bool peer = true;
  std::string python;   // empty: the first of python3, /usr/bin/python3 that imports torch
  std::string peer_script;
  bool no_compile = false;
  double peak_tflops = 0.0;  // 0: from the device table
  bool dry_run = false;
  std::string json;
};

struct Row {
  std::string name;
  std::string mode;  // how it ran, one line
  int64_t n_params = 0;
  int threads = 0;
  double tokens_per_s = 0, ms_step = 0, fwd = 0, bwd = 0, clip = 0, opt = 0;
  double peak_memory = 0;   // bytes
  std::string memory_kind;  // "device (max allocated)" or "RSS (max)"
  double final_loss = 0;
  int64_t first_batch_sum = 0;
};

ModelFlops count_flops(const train::Transformer& model, int64_t context) {
  const train::ModelConfig& m = model->config();
  ModelFlops f;
  for (const auto& p : model->named_parameters()) {
    f.n_params += p.value().numel();
    const bool lookup = p.key().rfind("tok_emb.", 0) == 0;
    if (p.value().dim() >= 2 && !lookup) f.n_matmul += p.value().numel();
  }
  f.attention = 12.0 * static_cast<double>(m.n_layers) * static_cast<double>(context) * static_cast<double>(m.d_model);
  f.per_token = 6.0 * static_cast<double>(f.n_matmul) + f.attention;
  f.formula = fmt::format("FLOPs/token = 6·N_matmul + 12·L·T·d = 6·{} + 12·{}·{}·{} = {:.4g}  (N_matmul: every "
                          "parameter but the embedding table and the norm gains; L layers, T context, d width)",
                          f.n_matmul, m.n_layers, context, m.d_model, f.per_token);
  return f;
}

double peak_rss_bytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;  // Linux: KiB
}

std::string device_name_of(c10::Device device) {
#ifdef ORTHOPT_WITH_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return "cpu";
}

void sync(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

std::string format_bytes(double b) {
  if (!(b > 0)) return "-";
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  return fmt::format("{:.0f} MiB", b / (1024.0 * 1024));
}

// The trainer's step, built as train() builds it (model_config_of, make_param_groups, the same
// sampler and seed, Bf16Autocast), each part followed by a device synchronization.
Row run_ours(const TrainBenchArgs& a, const train::TrainConfig& c, c10::Device device, const std::string& data_path,
             ModelFlops* flops) {
  const train::ModelConfig mcfg = train::model_config_of(c);
#ifdef ORTHOPT_WITH_CUDA
  if (device.is_cuda()) {
    // torch 2.x sets up the caching allocator on the first allocation; its statistics refuse
    // a device before that ("Invalid device argument").
    (void)at::empty({1}, at::TensorOptions().device(device));
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#endif
  torch::manual_seed(c.seed);
  train::Transformer model(mcfg);
  *flops = count_flops(model, mcfg.context);
  model->to(device);
  std::vector<at::Tensor> params = model->parameters();
  Optimizer opt(train::make_param_groups(model, c));
  const train::Corpus corpus = train::load_corpus(data_path, c.val_fraction, mcfg.context);
  train::BatchSampler sampler(corpus.train, c.batch_size, mcfg.context, c.seed);
  const bool autocast = device.is_cuda() && c.bf16;
  model->train();

  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point t0, Clock::time_point t1) { return std::chrono::duration<double, std::milli>(t1 - t0).count(); };
  Row r;
  r.name = "orthopt";
  r.n_params = model->num_parameters();
  r.threads = at::get_num_threads();
  r.mode = fmt::format("libtorch {} C++, eager{}; {} for the block matrices + AdamW for the rest (the trainer's routing)",
                       TORCH_VERSION, autocast ? ", bf16 autocast" : ", fp32", c.algorithm);
  double fwd = 0, bwd = 0, clip = 0, step = 0;
  at::Tensor last_loss;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    sync(device);
    const auto t0 = Clock::now();
    auto batch = sampler.next(device);
    if (i == 0) r.first_batch_sum = batch.first.sum().item<int64_t>();
    train::LossParts parts;
    {
      train::Bf16Autocast ac(autocast);
      parts = model->loss(batch.first, batch.second);
    }
    sync(device);
    const auto t1 = Clock::now();
    parts.total.backward();
    sync(device);
    const auto t2 = Clock::now();
    const at::Tensor grad_norm = train::global_grad_norm(params);
    train::clip_grad_norm(params, c.clip, grad_norm);
    sync(device);
    const auto t3 = Clock::now();
    opt.step();
    opt.zero_grad(/*set_to_none=*/true);
    sync(device);
    const auto t4 = Clock::now();
    last_loss = parts.lm.detach();
    if (i < a.warmup) continue;
    fwd += ms(t0, t1), bwd += ms(t1, t2), clip += ms(t2, t3), step += ms(t3, t4);
  }
  r.final_loss = last_loss.item<double>();
  if (!std::isfinite(r.final_loss)) throw std::runtime_error(fmt::format("orthopt's loss is {} after the steps", r.final_loss));
  const double n = static_cast<double>(a.steps);
  r.fwd = fwd / n, r.bwd = bwd / n, r.clip = clip / n, r.opt = step / n;
  r.ms_step = r.fwd + r.bwd + r.clip + r.opt;
  r.tokens_per_s = static_cast<double>(c.batch_size * mcfg.context) / (r.ms_step / 1e3);
#ifdef ORTHOPT_WITH_CUDA
  if (device.is_cuda()) {
    r.peak_memory = static_cast<double>(
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak);  // [0]: aggregate
    r.memory_kind = "device, max allocated";
  }
#endif
  if (!device.is_cuda()) {
    r.peak_memory = peak_rss_bytes();
    r.memory_kind = "process RSS, max";
  }
  return r;
}

// Runs argv (argv[0] looked up on PATH) with `env`; `quiet` sends its output to /dev/null.
// Returns the exit status, -1 when it could not start or died on a signal.
int spawn_wait(const std::vector<std::string>& args, const std::vector<std::string>& env, bool quiet) {
  std::vector<char*> argv, envp;
  for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  for (const auto& s : env) envp.push_back(const_cast<char*>(s.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> current_env() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  return env;
}

fs::path exe_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// The environment of the peer: PYTHONPATH starts with the build's Python package
// (<build>/python, next to this binary) where there is one.
std::vector<std::string> peer_env() {
  std::vector<std::string> env;
  std::string pythonpath;
  for (auto& e : current_env()) {
    if (e.rfind("PYTHONPATH=", 0) == 0) pythonpath = e.substr(11);
    else env.push_back(e);
  }
  std::error_code ec;
  const fs::path pkg = exe_dir() / "python";
  if (fs::exists(pkg / "orthopt" / "__init__.py", ec)) pythonpath = pkg.string() + (pythonpath.empty() ? "" : ":" + pythonpath);
  if (!pythonpath.empty()) env.push_back("PYTHONPATH=" + pythonpath);
  return env;
}

std::string find_python(const std::string& given) {
  if (!given.empty()) return given;
  for (const std::string py : {"python3", "/usr/bin/python3"})
    if (spawn_wait({py, "-c", "import torch"}, current_env(), /*quiet=*/true) == 0) return py;
  throw std::invalid_argument(
      "argument '--python': no python3 on PATH nor /usr/bin/python3 imports torch; pass --python or --no-peer");
}

std::string find_peer_script(const std::string& given) {
  std::vector<fs::path> candidates;
  if (!given.empty()) candidates.push_back(given);
  else {
    if (const char* src = std::getenv("ORTHOPT_SOURCE_DIR")) candidates.push_back(fs::path(src) / "bench/train_peer.py");
    candidates.push_back(exe_dir().parent_path() / "bench/train_peer.py");
    candidates.push_back("bench/train_peer.py");
  }
  std::error_code ec;
  for (const auto& p : candidates)
    if (fs::is_regular_file(p, ec)) return p.string();
  throw std::invalid_argument("argument '--peer-script': " +
                              (given.empty() ? std::string("bench/train_peer.py not found next to the build or under "
                                                           "$ORTHOPT_SOURCE_DIR; pass --peer-script or --no-peer")
                                             : "'" + given + "' is not a file"));
}

Row run_peer(const TrainBenchArgs& a, const train::TrainConfig& c, const train::ModelConfig& m, c10::Device device,
             const std::string& data_path, int threads, json* peer_doc) {
  const std::string python = find_python(a.python);
  const std::string script = find_peer_script(a.peer_script);
  const fs::path out = fs::temp_directory_path() / fmt::format("orthopt-train-peer-{}.json", ::getpid());
  std::vector<std::string> args = {python, script,
      "--d-model", std::to_string(m.d_model), "--n-layers", std::to_string(m.n_layers),
      "--n-heads", std::to_string(m.n_heads), "--d-ff", std::to_string(m.d_ff),
      "--vocab-size", std::to_string(m.vocab_size), "--context", std::to_string(m.context),
      "--rope-base", fmt::format("{}", m.rope_base), "--norm-eps", fmt::format("{}", m.norm_eps),
      "--batch-size", std::to_string(c.batch_size), "--algorithm", c.algorithm,
      "--lr", fmt::format("{}", c.lr), "--scalar-lr", fmt::format("{}", c.scalar_lr),
      "--weight-decay", fmt::format("{}", c.weight_decay), "--momentum", fmt::format("{}", c.momentum),
      "--clip", fmt::format("{}", c.clip), "--device", device.is_cuda() ? "cuda" : "cpu",
      "--steps", std::to_string(a.steps), "--warmup", std::to_string(a.warmup),
      "--data", data_path, "--val-fraction", fmt::format("{}", c.val_fraction), "--seed", std::to_string(c.seed),
      "--threads", std::to_string(threads), "--json", out.string()};
  if (a.no_compile) args.push_back("--no-compile");
  std::error_code ec;
  fs::remove(out, ec);
  std::cout << std::flush;
  const int rc = spawn_wait(args, peer_env(), /*quiet=*/false);
  std::ifstream f(out);
  if (rc != 0 || !f) {
    fs::remove(out, ec);
    throw std::runtime_error(fmt::format("the PyTorch peer ({} {}) failed (exit status {}); its messages are above",
                                         python, script, rc));
  }
  json doc;
  try {
    f >> doc;
  } catch (const json::exception& e) {
    fs::remove(out, ec);
    throw std::runtime_error(std::string("the PyTorch peer wrote unreadable JSON: ") + e.what());
  }
  fs::remove(out, ec);
  *peer_doc = doc;
  Row r;
  r.name = "pytorch-peer";
  r.mode = doc.at("mode").get<std::string>();
  r.n_params = doc.at("n_params").get<int64_t>();
  r.threads = doc.at("threads").get<int>();
  r.fwd = doc.at("fwd_ms").get<double>();
  r.bwd = doc.at("bwd_ms").get<double>();
  r.clip = doc.at("clip_ms").get<double>();
  r.opt = doc.at("opt_ms").get<double>();
  r.ms_step = r.fwd + r.bwd + r.clip + r.opt;
  r.tokens_per_s = doc.at("tokens_per_s").get<double>();
  r.peak_memory = doc.at("peak_memory_bytes").get<double>();
  r.memory_kind = doc.at("peak_memory_kind").get<std::string>();
  r.final_loss = doc.at("final_loss").get<double>();
  r.first_batch_sum = doc.at("first_batch_sum").get<int64_t>();
  return r;
}

json row_json(const Row& r, const ModelFlops& f, double peak) {
  const double achieved = f.per_token * r.tokens_per_s;
  return {{"name", r.name}, {"mode", r.mode}, {"n_params", r.n_params}, {"threads", r.threads},
          {"tokens_per_s", r.tokens_per_s}, {"ms_per_step", r.ms_step}, {"fwd_ms", r.fwd}, {"bwd_ms", r.bwd},
          {"clip_ms", r.clip}, {"opt_ms", r.opt}, {"peak_memory_bytes", r.peak_memory},
          {"peak_memory_kind", r.memory_kind}, {"flops_per_token", f.per_token}, {"achieved_flops", achieved},
          {"mfu", peak > 0 ? json(achieved / peak) : json()}, {"final_loss", r.final_loss},
          {"first_batch_sum", r.first_batch_sum}};
}

int run_train_bench(const TrainBenchArgs& a) {
  const c10::Device device = train::pick_device(a.device);
  train::TrainConfig c;
  c.preset = !a.preset.empty() ? a.preset : device.is_cuda() ? "gpt2-124m" : "tiny";
  c.context = a.context;
  c.batch_size = a.batch_size;
  c.algorithm = a.algorithm;
  c.activation_checkpointing = a.activation_checkpointing;
  c.device = a.device;
  c.seed = a.seed;
  c.data = a.data;
  c.lr = train::default_matrix_lr(c.algorithm);  // what `train` uses when lr is 0
  train::validate(c);
  const train::ModelConfig mcfg = train::model_config_of(c);
  const ThreadChoice& threads = apply_thread_policy();
  const int n_threads = at::get_num_threads();

  std::string data_path = c.data;
  if (data_path.empty()) {
    data_path = train::default_corpus_path();
    train::ensure_default_corpus(data_path);
  }
  const std::string device_name = device_name_of(device);
  const double peak = a.peak_tflops > 0 ? a.peak_tflops * 1e12 : device.is_cuda() ? peak_bf16_flops(device_name) : 0.0;

  std::cout << fmt::format("bench train: preset {}, batch {} x {} bytes, {}, activation checkpointing {}, device {} "
                           "({}), {} CPU threads ({}), OMP_WAIT_POLICY={}\n",
                           mcfg.preset, c.batch_size, mcfg.context, c.algorithm, c.activation_checkpointing,
                           device.str(), device_name, n_threads,
                           threads.reason, threads.wait_policy.empty() ? "(unset)" : threads.wait_policy);
  if (device.is_cuda())
    std::cout << (peak > 0 ? fmt::format("peak bf16 dense: {:.0f} TFLOP/s ({})\n", peak / 1e12,
                                         a.peak_tflops > 0 ? "--peak-tflops" : "table, by device name")
                           : std::string("peak bf16: device not in the table, no MFU (pass --peak-tflops)\n"));

  json doc = {{"benchmark", "train"}, {"preset", mcfg.preset}, {"batch_size", c.batch_size},
              {"context", mcfg.context}, {"algorithm", c.algorithm}, {"device", device.str()},
              {"device_name", device_name}, {"steps", a.steps}, {"warmup", a.warmup}, {"threads", n_threads},
              {"thread_policy", threads.reason}, {"busy_cores", threads.busy},
              {"omp_wait_policy", threads.wait_policy}, {"data", data_path},
              {"model", {{"vocab_size", mcfg.vocab_size}, {"d_model", mcfg.d_model}, {"n_layers", mcfg.n_layers},
                         {"n_heads", mcfg.n_heads}, {"d_ff", mcfg.d_ff}, {"context", mcfg.context}}},
              {"peak_flops", peak > 0 ? json(peak) : json()}, {"rows", json::array()}};
  auto describe = [&](int64_t n_params, const ModelFlops& flops) {
    std::cout << "parameters: " << n_params << "\n" << flops.formula << "\n";
    doc["n_params"] = n_params;
    doc["n_matmul_params"] = flops.n_matmul;
    doc["flops_per_token"] = flops.per_token;
    doc["flops_formula"] = flops.formula;
  };
  auto write_json = [&] {
    if (!a.json.empty()) train::write_file_atomically(a.json, doc.dump(2) + "\n");
  };
  if (a.dry_run) {
    train::Transformer model(mcfg);
    describe(model->num_parameters(), count_flops(model, mcfg.context));
    write_json();
    return 0;
  }

  ModelFlops flops;
  std::vector<Row> rows = {run_ours(a, c, device, data_path, &flops)};
  describe(rows.front().n_params, flops);
  json peer_doc;
  if (a.peer) rows.push_back(run_peer(a, c, mcfg, device, data_path, n_threads, &peer_doc));

  std::cout << fmt::format("{:<13} {:>10} {:>9} {:>8} {:>8} {:>7} {:>8} {:>10} {:>12} {:>9} {:>6}\n", "row", "tokens/s",
                           "ms/step", "fwd", "bwd", "clip", "opt", "peak mem", "FLOPs/token",
                           device.is_cuda() ? "TFLOP/s" : "GFLOP/s", "MFU");
  for (const auto& r : rows) {
    const double achieved = flops.per_token * r.tokens_per_s;
    std::cout << fmt::format("{:<13} {:>10.0f} {:>9.2f} {:>8.2f} {:>8.2f} {:>7.2f} {:>8.2f} {:>10} {:>12.4g} {:>9.1f} {:>6}\n",
                             r.name, r.tokens_per_s, r.ms_step, r.fwd, r.bwd, r.clip, r.opt,
                             format_bytes(r.peak_memory), flops.per_token,
                             achieved / (device.is_cuda() ? 1e12 : 1e9),
                             peak > 0 ? fmt::format("{:.1f}%", 100.0 * achieved / peak) : std::string("-"));
    doc["rows"].push_back(row_json(r, flops, peak));
  }
  for (const auto& r : rows) std::cout << r.name << ": " << r.mode << "; " << r.threads << " threads\n";
  std::cout << fmt::format("ms are means over {} steps after {} warm-up steps, the device synchronized around each "
                           "part (fwd includes drawing the batch; opt includes zero_grad). peak mem: {}.\n",
                           a.steps, a.warmup, rows.front().memory_kind);
  if (rows.size() == 2) {
    std::cout << fmt::format("parameters: orthopt {}, pytorch-peer {}; first batch checksum: orthopt {}, peer {}; "
                             "orthopt / peer tokens/s = {:.3f}\n",
                             rows[0].n_params, rows[1].n_params, rows[0].first_batch_sum, rows[1].first_batch_sum,
                             rows[0].tokens_per_s / rows[1].tokens_per_s);
    doc["peer"] = peer_doc;
    doc["ratio_tokens_per_s"] = rows[0].tokens_per_s / rows[1].tokens_per_s;
  }
  write_json();
  if (rows.size() == 2 && rows[0].n_params != rows[1].n_params) {
    std::cerr << fmt::format("orthopt: error: the peer's model has {} parameters, orthopt's {}: not the same "
                             "architecture\n", rows[1].n_params, rows[0].n_params);
    return 1;
  }
  if (rows.size() == 2 && rows[0].first_batch_sum != rows[1].first_batch_sum) {
    std::cerr << "orthopt: error: the peer's first batch differs from orthopt's: not the same sampling\n";
    return 1;
  }
  return 0;
}

}  // namespace

void register_bench_train(CLI::App& bench, Action& action) {
  auto args = std::make_shared<TrainBenchArgs>();
  auto* cmd = bench.add_subcommand("train", "The trainer's step per part (tokens/s, memory, MFU) beside a plain "
                                            "PyTorch peer of the same model (bench/train_peer.py)");
  cmd->add_option("--preset", args->preset, "model preset: tiny, small, gpt2-124m (default: gpt2-124m on CUDA, tiny on the CPU)")
      ->check(CLI::IsMember(train::model_preset_names()));
  cmd->add_option("--batch-size", args->batch_size, "sequences per step")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--context", args->context, "sequence length in bytes (0: the preset's)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--algorithm", args->algorithm, "matrix optimizer: adamw, muon, normuon, dion3, dion, lion")
      ->check(CLI::IsMember({"adamw", "muon", "normuon", "dion3", "dion", "lion"}));
  cmd->add_option("--activation-checkpointing", args->activation_checkpointing,
                  "orthopt's trainer: none, block or selective (the peer keeps every activation)")
      ->check(CLI::IsMember(train::activation_checkpointing_modes()));
  cmd->add_option("--device", args->device, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option("--steps", args->steps, "timed steps")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", args->warmup, "untimed steps first (the peer's torch.compile happens here)")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--data", args->data, "UTF-8 text file (default: the trainer's default corpus)");
  cmd->add_option("--seed", args->seed, "model and sampler seed");
  cmd->add_flag("!--no-peer", args->peer, "skip the PyTorch peer");
  cmd->add_option("--python", args->python,
                  "python with torch for the peer (default: python3 on PATH, else /usr/bin/python3, whichever imports torch)");
  cmd->add_option("--peer-script", args->peer_script, "path of bench/train_peer.py (default: found next to the build)");
  cmd->add_flag("--no-compile", args->no_compile, "run the peer eagerly also where torch.compile is available");
  cmd->add_option("--peak-tflops", args->peak_tflops, "device peak bf16 TFLOP/s for the MFU (default: by device name)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--dry-run", args->dry_run, "print the model, its FLOPs/token and the thread choice; run nothing");
  cmd->add_option("--json", args->json, "also write the results as JSON to this file");
  cmd->callback([args, &action] { action = [args] { return run_train_bench(*args); }; });
}

}  // namespace orthopt::cli

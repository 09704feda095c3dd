// orthopt bench step: median time of one optimizer step (fp32 parameters, random gradients) on
// the parameter sets of performance.md (bench/param_sets.h), for our optimizer and, in the same run, torch-native
// peers written here: the per-parameter loop of torch.optim.Muon (dense bf16 NS, its momentum,
// lr adjustment and decoupled weight decay) for the matrices plus a plain per-parameter AdamW for
// the rest, and that AdamW alone on every parameter. (The Python peers, torch.optim.Muon itself
// and the fused AdamW kernel, are timed by bench/gpu/step_peers.py.)
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <iostream>
#include <memory>
#include <optional>

#ifdef ORTHOPT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "bench_step.h"
#include "param_sets.h"
#include "orthopt/cuda_graph.h"
#include "orthopt/optim.h"
#include "orthopt/runtime.h"
#include "peers.h"
#include "timing.h"

namespace orthopt::cli {
namespace {

struct StepArgs {
  std::string device = "cpu";
  std::vector<std::string> sets = {"gpt2"};
  std::vector<std::string> algorithms = {"muon", "normuon", "dion3"};
  int warmup = 3;
  int repeats = 10;
  bool peer = true;
  bool graph = true;
  std::optional<double> gram_aspect_threshold;  // unset: the optimizers' default
  std::vector<std::string> dion_qr = {"householder"};  // dion: one row per orthonormalization
  bool tf32 = false;  // torch's TF32 switch for fp32 cuBLAS products (Dion's are fp32)
  bool dry_run = false;
  std::string execution = "auto";  // ExecutionOptions of our optimizer's groups (docs/execution.md)
  std::string json;
};

using Named = std::vector<std::pair<std::string, at::Tensor>>;
using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

using bench::param_set_names;
using bench::param_sets;
using bench::param_shapes;

// A set's parameters, random (and random gradients), on `device`.
Named param_set(const std::string& set, c10::Device device) {
  Named named;
  for (const auto& [name, shape] : param_shapes(set)) {
    auto p = (at::randn(shape, at::TensorOptions().device(device)) * 0.02).requires_grad_(true);
    named.emplace_back(name, p);
  }
  for (auto& [name, p] : named) p.mutable_grad() = at::randn_like(p) * 1e-3;
  return named;
}

// --dry-run: each set's parameters with the optimizer route_params gives them, on the meta
// device (nothing allocated, nothing timed).
int list_sets(const StepArgs& a) {
  nlohmann::json sets = nlohmann::json::object();
  for (const auto& set : a.sets) {
    Named named;
    for (const auto& [name, shape] : param_shapes(set))
      named.emplace_back(name, at::empty(shape, at::TensorOptions().device(at::kMeta)).requires_grad_(true));
    std::map<std::string, std::string> optimizer;
    for (const auto& group : route_params(named, RoutingOptions{}))
      for (const auto& name : group.names)
        optimizer[name] = is_matrix_algorithm(group.options.algorithm) ? "matrix" : to_string(group.options.algorithm);
    nlohmann::json params = nlohmann::json::array();
    int64_t matrices = 0, elements = 0;
    for (const auto& [name, p] : named) {
      params.push_back({{"name", name}, {"shape", p.sizes().vec()}, {"optimizer", optimizer.at(name)}});
      matrices += optimizer.at(name) == "matrix";
      elements += p.numel();
    }
    std::cout << fmt::format("{}: {} parameters ({} to the matrix optimizer), {} elements\n", set, named.size(),
                             matrices, elements);
    sets[set] = params;
  }
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) throw std::runtime_error("argument '--json': cannot write '" + a.json + "'");
    f << nlohmann::json({{"benchmark", "step"}, {"sets", sets}}).dump(2) << "\n";
  }
  return 0;
}

// The peer step: torch.optim.Muon's per-parameter formulation on matrices (momentum 0.95 with
// Nesterov, lerp form; dense bf16 NS, 5 steps; lr·max(1, rows/cols)^0.5; decoupled weight
// decay), and a plain per-parameter AdamW on everything else.
struct PeerStep {
  std::vector<at::Tensor> mats, mat_bufs, others, exp_avg, exp_avg_sq;
  Schedule schedule;
  int64_t step = 0;
  bool muon;

  PeerStep(const Named& named, bool with_muon, const RoutingOptions& routing) : muon(with_muon) {
    schedule = resolve_schedule(routing.matrix.ortho);
    for (const auto& group : route_params(named, routing)) {
      const bool matrix_group = with_muon && is_matrix_algorithm(group.options.algorithm);
      for (const auto& p : group.params) {
        if (matrix_group) {
          mats.push_back(p);
          mat_bufs.push_back(at::zeros_like(p));
        } else {
          others.push_back(p);
          exp_avg.push_back(at::zeros_like(p));
          exp_avg_sq.push_back(at::zeros_like(p));
        }
      }
    }
  }

  void run() {
    at::NoGradGuard no_grad;
    const double lr = 0.02, wd = 0.01, mu = 0.95;
    for (size_t i = 0; i < mats.size(); ++i) {
      auto& p = mats[i];
      const auto& g = p.grad();
      mat_bufs[i].lerp_(g, 1.0 - mu);
      auto update = g.lerp(mat_bufs[i], mu);
      auto O = bench::torch_dense_ns(update, schedule, 5, at::kBFloat16);
      const double adjusted = lr * std::sqrt(std::max(1.0, static_cast<double>(p.size(0)) / p.size(1)));
      p.mul_(1.0 - lr * wd);
      p.add_(O, -adjusted);
    }
    ++step;
    const double alr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, awd = 0.01;
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step)), bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
    for (size_t i = 0; i < others.size(); ++i) {
      auto& p = others[i];
      const auto& g = p.grad();
      exp_avg[i].lerp_(g, 1.0 - b1);
      exp_avg_sq[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
      auto denom = (exp_avg_sq[i].sqrt() / std::sqrt(bc2)).add_(eps);
      p.mul_(1.0 - alr * awd);
      p.addcdiv_(exp_avg[i], denom, -alr / bc1);
    }
  }
};

int run_step(const StepArgs& a) {
  if (a.dry_run) return list_sets(a);
  const c10::Device device(a.device);
  if (device.is_cuda() && !at::hasCUDA())
    throw std::invalid_argument("argument '--device': cuda requested but this torch has no CUDA device");
  at::manual_seed(0);
  // What a user's torch.backends.cuda.matmul.allow_tf32 = True does to our step: fp32 products
  // (Dion's four, the fp32 peers') on the tensor cores with TF32 inputs.
  const Tf32Products tf32(a.tf32);
  nlohmann::json rows = nlohmann::json::array();
  std::cout << fmt::format("{:<7} {:<42} {:>10} {:>10} {:>10} {:>10}\n", "set", "optimizer", "median ms", "min ms",
                           "max ms", "host ms");
  // On CUDA, the SM clock over each round-robin group, printed after its rows and in each json row.
  bench::ClockSummary clocks;
  bench::ClockSummary* const sample_clocks = device.is_cuda() ? &clocks : nullptr;
  auto print_clocks = [&] {
    if (sample_clocks) std::cout << clocks.line() << "\n";
  };
  auto report = [&](const std::string& set, const std::string& what, const bench::Timing& t) {
    std::cout << fmt::format("{:<7} {:<42} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f}\n", set, what, t.median_ms,
                             t.min_ms, t.max_ms, t.host_median_ms);
    rows.push_back({{"set", set},
                    {"optimizer", what},
                    {"median_ms", t.median_ms},
                    {"min_ms", t.min_ms},
                    {"max_ms", t.max_ms},
                    {"host_median_ms", t.host_median_ms},
                    {"gpu_clock", sample_clocks ? clocks.to_json() : nlohmann::json()}});
  };
  for (const auto& set : a.sets) {
    // One configuration per algorithm, dion once per --dion-qr method.
    std::vector<std::pair<std::string, std::string>> configs;
    for (const auto& alg : a.algorithms)
      for (const auto& qr : alg == "dion" ? a.dion_qr : std::vector<std::string>{""}) configs.emplace_back(alg, qr);
    for (const auto& [alg, qr] : configs) {
#ifdef ORTHOPT_WITH_CUDA
      // The previous configuration's memory sits in the caching allocator; a graph capture
      // allocates from a private pool that cannot reuse it (Llama: out of memory without this).
      if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
      RoutingOptions routing;
      routing.matrix.algorithm = parse_algorithm(alg);
      if (a.gram_aspect_threshold) routing.matrix.ortho.gram_aspect_threshold = *a.gram_aspect_threshold;
      if (!qr.empty()) routing.matrix.dion_qr = parse_dion_qr(qr);
      routing.matrix.ortho.execution = routing.scalar.ortho.execution = parse_execution(a.execution);
      Named named = param_set(set, device);
      Optimizer opt(route_params(named, routing));
      const std::string ours =
          "orthopt " + alg + (qr.empty() ? "" : " (" + qr + " QR)") +
          (a.gram_aspect_threshold ? fmt::format(" (gram>={:g})", *a.gram_aspect_threshold) : "") +
          (a.tf32 ? " (tf32)" : "") + " + AdamW";
      std::vector<std::string> names = {ours};
      std::vector<std::function<void()>> steps = {[&] { opt.step(); }};
      int warmup = a.warmup;
      // The same step captured once and replayed (docs/cuda_graph.md), on its own parameters of
      // the same shapes so that eager and graph steps alternate round-robin (under the H200's
      // power limit, one timed after the other reads differently). Two eager warm-up steps and
      // the capture on the third: the warm-up must cover three steps.
      Named graph_named;
      std::unique_ptr<Optimizer> graph_opt;
      std::unique_ptr<CudaGraphOptimizer> graph;
      if (device.is_cuda() && a.graph) {
        graph_named = param_set(set, device);
        graph_opt = std::make_unique<Optimizer>(route_params(graph_named, routing));
        graph = std::make_unique<CudaGraphOptimizer>(*graph_opt, /*warmup_steps=*/2);
        names.push_back(ours + ", graph");
        steps.push_back([&] { graph->step(); });
        warmup = std::max(warmup, 3);
      }
      const auto timings = bench::time_round_robin(steps, device, warmup, a.repeats, sample_clocks);
      for (size_t i = 0; i < names.size(); ++i) report(set, names[i], timings[i]);
      rows.back()["plan"] = nlohmann::json::parse(opt.plan().to_json());  // what the timed steps ran
      if (names.size() > 1) rows[rows.size() - 2]["plan"] = rows.back()["plan"];
      print_clocks();
    }
    if (a.peer) {
#ifdef ORTHOPT_WITH_CUDA
      if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
      Named named = param_set(set, device);
      RoutingOptions routing;
      // Both peers on the same parameters (each with its own state), round-robin.
      PeerStep muon(named, true, routing);
      PeerStep adamw(named, false, routing);
      const auto timings = bench::time_round_robin({[&] { muon.run(); }, [&] { adamw.run(); }}, device, a.warmup,
                                                   a.repeats, sample_clocks);
      report(set, "peer: torch Muon + AdamW", timings[0]);
      report(set, "peer: AdamW (all, loop)", timings[1]);
      print_clocks();
    }
  }
  std::cout << "fp32 parameters, random gradients; median of --repeats after --warmup steps, each configuration's\n"
               "eager and graph steps round-robin, the two peers round-robin. Peers: torch ops\n"
               "written in this benchmark (torch.optim.Muon's per-parameter formulation; per-parameter AdamW).\n"
               "host ms: median host time until step() returned, each step started on an idle device. On CUDA that\n"
               "is the time to enqueue it, and a step takes at least that long: where the two are close, the step\n"
               "is host-bound (its kernels wait for their launches).\n";
  if (device.is_cuda()) std::cout << bench::ClockSummary::legend();
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) throw std::runtime_error("argument '--json': cannot write '" + a.json + "'");
    f << nlohmann::json({{"benchmark", "step"}, {"device", a.device}, {"rows", rows}}).dump(2) << "\n";
  }
  return 0;
}

}  // namespace

void register_bench_step(CLI::App& bench, Action& action) {
  auto args = std::make_shared<StepArgs>();
  auto* step = bench.add_subcommand("step", "Whole optimizer step timings (ours and torch-native peers)");
  step->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  step->add_option("--sets", args->sets,
                   fmt::format("parameter sets (bench/param_sets.h): {}", fmt::join(param_set_names(), ", ")))
      ->delimiter(',')->check(CLI::IsMember(param_set_names()));
  step->add_option("--algorithms", args->algorithms, "matrix optimizers: muon, normuon, dion3, dion")
      ->delimiter(',')->check(CLI::IsMember({"muon", "normuon", "dion3", "dion"}));
  step->add_option("--warmup", args->warmup, "warm-up steps")->check(CLI::Range(0, 1000));
  step->add_option("--repeats", args->repeats, "timed steps (median reported)")->check(CLI::Range(1, 100000));
  step->add_option("--dion-qr", args->dion_qr, "dion's orthonormalizations timed: householder, cholesky")
      ->delimiter(',')->check(CLI::IsMember({"householder", "cholesky"}));
  step->add_flag("!--no-peer", args->peer, "skip the torch-native peers");
  step->add_flag("--tf32", args->tf32,
                 "allow TF32 in fp32 cuBLAS products, as torch.backends.cuda.matmul.allow_tf32 = True (Dion's)");
  step->add_flag("!--no-graph", args->graph, "on CUDA, skip timing the CUDA-graph replay of our step");
  step->add_option("--gram-aspect-threshold", args->gram_aspect_threshold,
                   "ortho method auto: Gram NS when cols >= this * rows (default: the optimizers' 1.5)")
      ->check(CLI::Range(1.0, 1e9));
  step->add_flag("--dry-run", args->dry_run,
                 "time nothing: list each set's parameters and the optimizer route_params gives them (meta device)");
  step->add_option("--execution", args->execution,
                   "which implementation each part of our step takes: auto, or field=value,... (docs/execution.md)")
      ->check(execution_validator());
  step->add_option("--json", args->json, "also write the results as JSON (with each configuration's plan)");
  step->callback([args, &action] { action = [args] { return run_step(*args); }; });
}

namespace {

struct PlanArgs {
  std::string set = "gpt2";
  std::string device = "cpu";
  std::string algorithm = "muon";
  std::string execution = "auto";
  bool json = false;
};

int run_plan(const PlanArgs& a) {
  const c10::Device device(a.device);
  if (device.is_cuda() && !at::hasCUDA())
    throw std::invalid_argument("argument '--device': cuda requested but this torch has no CUDA device");
  RoutingOptions routing;
  routing.matrix.algorithm = parse_algorithm(a.algorithm);
  routing.matrix.ortho.execution = routing.scalar.ortho.execution = parse_execution(a.execution);
  // The parameters only (uninitialized, no gradients): a plan reads shapes, dtypes and devices.
  Named named;
  for (const auto& [name, shape] : param_shapes(a.set))
    named.emplace_back(name, at::empty(shape, at::TensorOptions().device(device)).requires_grad_(true));
  const StepPlan plan = Optimizer(route_params(named, routing)).plan();
  if (a.json) {
    std::cout << nlohmann::json::parse(plan.to_json()).dump(2) << "\n";
  } else {
    std::cout << fmt::format("set {} ({}), {} + AdamW\n", a.set, param_sets().at(a.set).at("about").get<std::string>(),
                             a.algorithm)
              << plan.to_string();
  }
  return 0;
}

}  // namespace

void register_plan(CLI::App& app, Action& action) {
  auto args = std::make_shared<PlanArgs>();
  auto* plan = app.add_subcommand("plan", "Print the execution plan of an optimizer step on a parameter set");
  plan->add_option("--set", args->set, fmt::format("parameter set (bench/param_sets.h): {}", fmt::join(param_set_names(), ", ")))
      ->check(CLI::IsMember(param_set_names()));
  plan->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  plan->add_option("--algorithm", args->algorithm, "matrix optimizer: muon, normuon, dion3, dion2, dion")
      ->check(CLI::IsMember({"muon", "normuon", "dion3", "dion2", "dion"}));
  plan->add_option("--execution", args->execution, "auto, or field=value,... (docs/execution.md)")
      ->check(execution_validator());
  plan->add_flag("--json", args->json, "print the plan as JSON");
  plan->callback([args, &action] { action = [args] { return run_plan(*args); }; });
}

}  // namespace orthopt::cli

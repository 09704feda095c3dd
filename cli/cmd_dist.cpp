// `orthopt launch`: run N local ranks of any command (RANK/WORLD_SIZE/MASTER_* set).
// `orthopt dist-step`: one rank of a data-parallel optimizer-step benchmark on a named
//   parameter set (random gradients); prints per-step timings and bytes per collective.
//   Run it under the launcher: `orthopt launch --nproc 4 -- orthopt dist-step --set gpt2`.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>

#include <torch/cuda.h>

#include "commands.h"
#include "param_sets.h"
#include "orthopt/distributed.h"
#include "orthopt/optim.h"
#include "orthopt/train/data.h"

namespace orthopt::cli {

namespace {

using dist::CommStats;

struct StepArgs {
  std::string set = "gpt2";
  std::string algorithm = "muon";
  double fraction = 0.25;
  std::string device = "cpu";
  int steps = 5;
  int warmup = 1;
  std::string json;
};

// The benchmarks' parameter sets (bench/param_sets.h; shapes only, values random).
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_set(const std::string& name) {
  return bench::param_shapes(name, "--set");
}

int run_dist_step(const StepArgs& a) {
  const c10::Device device(a.device);
  auto ctx = std::make_shared<dist::DistContext>([&] {
    dist::DistOptions o;
    o.device = device;
    return o;
  }());
  std::vector<std::pair<std::string, at::Tensor>> named;
  at::manual_seed(1234);
  for (const auto& [n, shape] : parameter_set(a.set))
    named.push_back({n, at::randn(shape, at::TensorOptions().device(device)).mul_(0.02).requires_grad_(true)});
  RoutingOptions routing;
  routing.matrix.algorithm = parse_algorithm(a.algorithm);
  routing.matrix.fraction = a.fraction;
  auto groups = route_params(named, routing);
  int64_t total_params = 0;
  for (const auto& [n, t] : named) total_params += t.numel();

  dist::DistributedOptimizer opt(groups, ctx);
  at::manual_seed(1000 + ctx->rank());  // different local gradients per rank
  // Host time of device work needs a device synchronization (NCCL's wait() only orders streams).
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto ms_between = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::vector<double> ms, reduce_ms, apply_ms;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    for (auto& g : opt.param_groups())
      for (auto p : g.params) p.mutable_grad() = at::randn_like(p);
    if (s == a.warmup) ctx->reset_comm_stats();
    sync();
    ctx->barrier();
    auto t0 = now();
    opt.reduce_gradients();  // pack + reduce-scatter + global norm
    sync();
    auto t1 = now();
    opt.apply_update();      // local optimizer step + all-gather + unpack
    sync();
    auto t2 = now();
    if (s >= a.warmup) {
      ms.push_back(ms_between(t0, t2));
      reduce_ms.push_back(ms_between(t0, t1));
      apply_ms.push_back(ms_between(t1, t2));
    }
  }
  const CommStats step_stats = ctx->comm_stats();
  // The collectives alone, on buffers of the optimizer's size: the rest of a step is local work.
  std::vector<double> rs_ms, ag_ms;
  {
    const int64_t chunk = opt.flat_elements_per_rank();
    at::Tensor full = at::randn({ctx->world_size() * chunk}, at::TensorOptions().device(device));
    at::Tensor own = at::empty({chunk}, full.options());
    for (int s = 0; s < a.steps; ++s) {
      sync();
      ctx->barrier();
      auto t0 = now();
      ctx->reduce_scatter_sum(full, own);
      sync();
      auto t1 = now();
      ctx->all_gather(own, full);
      sync();
      auto t2 = now();
      rs_ms.push_back(ms_between(t0, t1));
      ag_ms.push_back(ms_between(t1, t2));
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // State bytes of every rank, to rank 0 (one all-reduce of a world-size vector).
  at::Tensor sb = at::zeros({ctx->world_size()}, at::TensorOptions().dtype(at::kDouble).device(device));
  sb[ctx->rank()] = static_cast<double>(opt.state_bytes());
  ctx->all_reduce_sum(sb);
  sb = sb.cpu();

  nlohmann::json out;
  out["set"] = a.set;
  out["algorithm"] = a.algorithm;
  out["world_size"] = ctx->world_size();
  out["backend"] = ctx->backend();
  out["params"] = total_params;
  out["flat_elements_per_rank"] = opt.flat_elements_per_rank();
  out["step_ms_median"] = median(ms);
  out["reduce_gradients_ms_median"] = median(reduce_ms);
  out["apply_update_ms_median"] = median(apply_ms);
  out["reduce_scatter_alone_ms_median"] = median(rs_ms);
  out["all_gather_alone_ms_median"] = median(ag_ms);
  out["state_bytes_per_rank"] = std::vector<double>(sb.data_ptr<double>(), sb.data_ptr<double>() + sb.numel());
  for (const auto& [kind, st] : step_stats) {
    if (kind == "barrier") continue;  // the benchmark's own synchronization
    out["per_step"][kind] = {{"calls", st.calls / a.steps},
                             {"payload_bytes", st.payload_bytes / a.steps},
                             {"wire_bytes", st.wire_bytes / a.steps}};
  }
  if (ctx->rank() == 0) {
    std::cout << out.dump(1) << std::endl;
    if (!a.json.empty()) train::write_file_atomically(a.json, out.dump(1) + "\n");  // checked: names the file
  }
  return 0;
}

struct PlanArgs {
  std::string set = "llama";
  std::string algorithm = "muon";
  double fraction = 0.25;
  std::vector<int> worlds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  int bytes_per_element = 4;  // fp32 gradients and parameters on the wire
  double tflops = 0;          // optional: sustained NS rate for a time estimate
  double gbps = 0;            // optional: per-rank bus bandwidth (GB/s) for a time estimate
};

// Layout, bytes and Newton–Schulz FLOPs per rank for each world size (no communication).
int run_dist_plan(const PlanArgs& a) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& [n, shape] : parameter_set(a.set))
    named.push_back({n, at::empty(shape, at::TensorOptions().device(c10::kMeta)).requires_grad_(true)});
  RoutingOptions routing;
  routing.matrix.algorithm = parse_algorithm(a.algorithm);
  routing.matrix.fraction = a.fraction;
  routing.matrix.ortho.compute_dtype = at::kBFloat16;  // GPU setting (changes no count here)
  auto groups = route_params(named, routing);
  std::cout << fmt::format("set {} ({} matrix groups), algorithm {}{}, {} bytes/element on the wire\n", a.set,
                           groups.size(), a.algorithm,
                           a.algorithm == "dion3" ? fmt::format(" f={}", a.fraction) : std::string(),
                           a.bytes_per_element);
  std::cout << "   N | padding | RS+AG payload MB | wire MB/rank (ring) | NS GFLOP max rank | NS imbalance"
            << (a.tflops > 0 ? " | NS ms" : "") << (a.gbps > 0 ? " | comm ms" : "") << "\n";
  for (int N : a.worlds) {
    auto plan = dist::plan_layout(groups, N);
    const double payload = static_cast<double>(N) * plan.chunk_elements * a.bytes_per_element;
    const double wire = 2.0 * (N - 1) / N * payload;  // reduce-scatter + all-gather
    double mx = 0, sum = 0;
    for (double f : plan.ns_flops) {
      mx = std::max(mx, f);
      sum += f;
    }
    std::cout << fmt::format("{:>4} | {:>6.2f}% | {:>16.1f} | {:>19.1f} | {:>17.2f} | {:>12.2f}", N,
                             100.0 * (static_cast<double>(N) * plan.chunk_elements - plan.real_elements) /
                                 plan.real_elements,
                             2 * payload / 1e6, wire / 1e6, mx / 1e9, sum > 0 ? mx / (sum / N) : 1.0);
    if (a.tflops > 0) std::cout << fmt::format(" | {:>5.2f}", mx / (a.tflops * 1e12) * 1e3);
    if (a.gbps > 0) std::cout << fmt::format(" | {:>7.2f}", wire / (a.gbps * 1e9) * 1e3);
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

void register_dist(CLI::App& app, Action& action) {
  auto nproc = std::make_shared<int>(2);
  auto grace = std::make_shared<double>(5.0);
  auto cmd = std::make_shared<std::vector<std::string>>();
  auto* launch = app.add_subcommand("launch", "Run N local ranks of a command (sets RANK, WORLD_SIZE, MASTER_ADDR, "
                                              "MASTER_PORT); a failing rank stops all, exit code non-zero");
  launch->add_option("--nproc", *nproc, "number of local processes")->check(CLI::Range(1, 1024));
  launch->add_option("--grace-s", *grace, "seconds between SIGTERM and SIGKILL of the other ranks after a failure")
      ->check(CLI::Range(0.0, 3600.0));
  launch->add_option("command", *cmd, "command and its arguments (after --)")->required();
  launch->callback([=, &action] {
    action = [=] {
      return dist::launch_local(*nproc, *cmd, std::chrono::milliseconds(static_cast<int64_t>(*grace * 1000)));
    };
  });

  auto plan = std::make_shared<PlanArgs>();
  auto* pl = app.add_subcommand("dist-plan", "Distributed layout of a parameter set: padding, bytes per step "
                                             "and Newton–Schulz FLOPs per rank for several world sizes");
  pl->add_option("--set", plan->set, fmt::format("parameter set (bench/param_sets.h): {}", fmt::join(bench::param_set_names(), ", ")))
      ->check(CLI::IsMember(bench::param_set_names()));
  pl->add_option("--algorithm", plan->algorithm, "matrix algorithm: muon, normuon, dion3, dion")
      ->check(CLI::IsMember({"muon", "normuon", "dion3", "dion"}));
  pl->add_option("--fraction", plan->fraction, "Dion3 row fraction")->check(CLI::Range(0.0, 1.0));
  pl->add_option("--worlds", plan->worlds, "world sizes")->delimiter(',')->check(CLI::Range(1, 1 << 20));
  pl->add_option("--bytes-per-element", plan->bytes_per_element, "4 (fp32) or 2 (bf16) on the wire")
      ->check(CLI::IsMember({2, 4}));
  pl->add_option("--tflops", plan->tflops, "sustained NS TFLOP/s per rank, for a time estimate");
  pl->add_option("--gbps", plan->gbps, "bus bandwidth GB/s per rank, for a time estimate");
  pl->callback([plan, &action] { action = [plan] { return run_dist_plan(*plan); }; });

  auto args = std::make_shared<StepArgs>();
  auto* step = app.add_subcommand("dist-step", "One rank of the distributed optimizer-step benchmark "
                                               "(run under `orthopt launch`)");
  step->add_option("--set", args->set, fmt::format("parameter set (bench/param_sets.h): {}", fmt::join(bench::param_set_names(), ", ")))
      ->check(CLI::IsMember(bench::param_set_names()));
  step->add_option("--algorithm", args->algorithm, "matrix algorithm: muon, normuon, dion3, dion")
      ->check(CLI::IsMember({"muon", "normuon", "dion3", "dion"}));
  step->add_option("--fraction", args->fraction, "Dion3 row fraction")->check(CLI::Range(0.0, 1.0));
  step->add_option("--device", args->device, "cpu or cuda:<local rank> (cuda uses NCCL)");
  step->add_option("--steps", args->steps, "timed steps")->check(CLI::Range(1, 10000));
  step->add_option("--warmup", args->warmup, "untimed steps first")->check(CLI::Range(0, 1000));
  step->add_option("--json", args->json, "rank 0 also writes the result here");
  step->callback([args, &action] {
    action = [args] {
      StepArgs a = *args;
      if (a.device == "cuda") a.device = "cuda:" + std::string(std::getenv("LOCAL_RANK") ? std::getenv("LOCAL_RANK") : "0");
      return run_dist_step(a);
    };
  });
}

}  // namespace orthopt::cli

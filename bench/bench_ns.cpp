// orthopt bench ns: times orthogonalization per shape and method; reports the median,
// the effective rate (standard dense NS FLOPs / time, the convention of performance.md),
// and the relative error against the same iteration in float64. In the same run it times a
// peer, dense torch Newton–Schulz written below, and on CUDA the FLOP floor of the method
// (its FLOPs with symmetric products at half cost, at --peak-tflops) and our fraction of it.
// It also times, in the same rounds, one dense product of the shape's largest NS product
// ([B,m,m]·[B,m,n], the peer's dtype) and gives the "run floor": the method's floor FLOPs at
// that product's rate. Under sustained load the board sits at its power cap, where cuBLAS's dense
// bf16 rate falls below its rate after idle (bench/results/2026-12-02-h200-sustained-floor.md,
// lab/probes/energy_floor.py): the peak floor then assumes a rate cuBLAS itself does not reach,
// the run floor takes the rate of the board's state in the same rounds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "orthopt/orthogonalize.h"
#include "orthopt/runtime.h"
#include "bench_step.h"
#include "bench_train.h"
#include "peers.h"
#include "timing.h"

namespace orthopt::cli {
namespace {

struct NsArgs {
  std::string device = "cpu";
  std::vector<std::string> shapes;
  std::vector<std::string> methods = {"standard", "gram", "auto"};
  std::string schedule = "polar_express";
  int steps = 5;
  std::string compute_dtype;  // empty: the engine's default for the device and method
  int warmup = 2;
  int repeats = 10;
  uint64_t seed = 0;
  double peak_tflops = 746.0;  // bf16 8192³ product measured on the reference H100 (performance.md)
  bool peer = true;
  bool dense = true;        // also time the dense product and report the run floor
  bool sequential = false;  // time the contenders one after another instead of round-robin
  std::string execution = "auto";  // ExecutionOptions of our contenders (docs/execution.md)
  std::string json;
};

std::vector<int64_t> parse_shape(const std::string& s) {
  std::vector<int64_t> dims;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, 'x')) {
    try {
      size_t pos = 0;
      long long v = std::stoll(tok, &pos);
      if (pos != tok.size() || v <= 0) throw std::invalid_argument(tok);
      dims.push_back(v);
    } catch (const std::exception&) {
      throw std::invalid_argument("argument '--shapes': bad shape '" + s + "' (expected e.g. 1024x1024 or 16x1536x2048)");
    }
  }
  if (dims.size() < 2) throw std::invalid_argument("argument '--shapes': shape '" + s + "' needs at least 2 dims");
  return dims;
}

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "fp64" || s == "float64") return at::kDouble;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  throw std::invalid_argument("argument '--compute-dtype': unknown dtype '" + s + "' (fp32, fp64, bf16, fp16)");
}

// Random input with singular values spread over [1e-3, 1] in log scale, like a gradient.
at::Tensor spread_input(const std::vector<int64_t>& dims, c10::Device device) {
  int64_t m = dims[dims.size() - 2], n = dims.back();
  std::vector<int64_t> batch(dims.begin(), dims.end() - 2);
  int64_t k = std::min(m, n);
  auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  std::vector<int64_t> ushape = batch, vshape = batch;
  ushape.push_back(m); ushape.push_back(k);
  vshape.push_back(n); vshape.push_back(k);
  auto U = std::get<0>(at::linalg_qr(at::randn(ushape, opts)));
  auto V = std::get<0>(at::linalg_qr(at::randn(vshape, opts)));
  auto s = at::pow(10.0, at::linspace(0.0, -3.0, k, opts));
  return at::matmul(U * s, V.transpose(-2, -1));
}

// FLOPs of the method with every symmetric m×m result computed at half cost (the floors of
// performance.md): standard 15m²n + 5m³ per 5 steps; Gram 6m²n + 14m³ with one restart.
double symmetric_floor_flops(int64_t m, int64_t n, int steps, OrthoMethod method, const std::vector<int>& restarts) {
  const double M = static_cast<double>(m), N = static_cast<double>(n);
  if (method != OrthoMethod::Gram) return steps * (3.0 * M * M * N + M * M * M);
  // Dense Gram FLOPs split into the m²n products (R = X·Xᵀ once per (re)start, symmetric: half;
  // Q·X once per restart and at the end: full) and the m³ products (all symmetric: half).
  const double starts = 1.0 + static_cast<double>(restarts.size());
  const double cubic = method_flops(m, n, steps, method, restarts) - 4.0 * M * M * N * starts;
  return 0.5 * cubic + 3.0 * M * M * N * starts;
}

int run_ns(const NsArgs& a) {
  const c10::Device device(a.device);
  if (device.is_cuda() && !at::hasCUDA())
    throw std::invalid_argument("argument '--device': cuda requested but this torch has no CUDA device");
  std::vector<std::string> shapes = a.shapes;
  if (shapes.empty()) {
    shapes = device.is_cuda()
                 ? std::vector<std::string>{"1024x1024", "2048x2048", "4096x4096", "8192x8192", "4096x14336",
                                            "16x1536x2048", "128x1536x2048", "32x7168x2048"}
                 : std::vector<std::string>{"256x256", "512x512", "1024x1024", "512x2048", "2048x512", "8x256x768"};
  }
  at::manual_seed(a.seed);
  nlohmann::json rows = nlohmann::json::array();
  std::cout << fmt::format("{:<16} {:<14} {:>9} {:>10} {:>12} {:>10} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7}  {}\n",
                           "shape", "method", "ms", "eff GF/s", "GF/s (done)", "rel err", "peer ms", "peer/us",
                           "floor ms", "of floor", "run floor", "of run", "compute");
  for (const auto& shape_str : shapes) {
    auto dims = parse_shape(shape_str);
    auto G = spread_input(dims, device);
    const int64_t r = dims[dims.size() - 2], c = dims.back();
    const int64_t m = std::min(r, c), n = std::max(r, c);
    double batch = 1;
    for (size_t i = 0; i + 2 < dims.size(); ++i) batch *= static_cast<double>(dims[i]);

    OrthoOptions ref_opt;
    ref_opt.schedule = a.schedule;
    ref_opt.steps = a.steps;
    ref_opt.method = OrthoMethod::Standard;
    ref_opt.compute_dtype = at::kDouble;
    auto ref = orthogonalize(G.to(at::kDouble), ref_opt);

    // Inputs that fit in L2 (50 MB on an H100) are rotated so repeats do not time the cache.
    auto rotated_sets = [&](double bytes) { return device.is_cuda() && bytes < 64e6 ? 4 : 1; };
    std::vector<at::Tensor> inputs{G};
    for (int i = 1; i < rotated_sets(static_cast<double>(G.numel()) * 4.0); ++i)
      inputs.push_back(spread_input(dims, device));
    size_t turn = 0;
    auto next_input = [&]() -> const at::Tensor& { return inputs[turn++ % inputs.size()]; };

    const Schedule sched = resolve_schedule(ref_opt);
    const at::ScalarType peer_dtype = !a.compute_dtype.empty() ? parse_dtype(a.compute_dtype)
                                                               : (device.is_cuda() ? at::kBFloat16 : at::kFloat);
    auto rel_err = [&](const at::Tensor& out) { return ((out.to(at::kDouble) - ref).norm() / ref.norm()).item<double>(); };

    // The contenders: the peer (unless --no-peer), then each method. Each is checked against the
    // float64 reference once, then all are timed round-robin (--sequential: one after another).
    struct Contender {
      std::string method;  // empty: the peer
      OrthoOptions opt;
      at::Tensor out;
      double err = 0;
    };
    std::vector<Contender> contenders;
    if (a.peer) {
      Contender c;
      c.out = bench::torch_dense_ns(G, sched, a.steps, peer_dtype);
      c.err = rel_err(c.out);
      contenders.push_back(std::move(c));
    }
    for (const auto& method_str : a.methods) {
      Contender c;
      c.method = method_str;
      c.opt.schedule = a.schedule;
      c.opt.steps = a.steps;
      c.opt.method = parse_method(method_str);
      c.opt.nonfinite = NonFinitePolicy::Propagate;
      if (!a.compute_dtype.empty()) c.opt.compute_dtype = parse_dtype(a.compute_dtype);
      c.opt.execution = parse_execution(a.execution);
      c.out = orthogonalize(G, c.opt);
      c.err = rel_err(c.out);
      contenders.push_back(std::move(c));
    }
    // The dense product [B,m,m]·[B,m,n] (B·X of standard NS, Q·X of Gram NS) on random operands
    // in the peer's dtype, rotated like the inputs; its rate makes the run floor.
    std::vector<std::pair<at::Tensor, at::Tensor>> dense_operands;
    at::Tensor dense_out;
    const double dense_flops = 2.0 * batch * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(n);
    if (a.dense) {
      std::vector<int64_t> a_shape(dims.begin(), dims.end() - 2), x_shape(dims.begin(), dims.end() - 2);
      a_shape.insert(a_shape.end(), {m, m});
      x_shape.insert(x_shape.end(), {m, n});
      const auto dopts = at::TensorOptions().dtype(peer_dtype).device(device);
      const double dense_bytes = batch * static_cast<double>(m * m + m * n) * static_cast<double>(c10::elementSize(peer_dtype));
      for (int i = 0; i < rotated_sets(dense_bytes); ++i)
        dense_operands.emplace_back(at::randn(a_shape, dopts.dtype(at::kFloat)).to(peer_dtype),
                                    at::randn(x_shape, dopts.dtype(at::kFloat)).to(peer_dtype));
    }
    size_t dense_turn = 0;
    std::vector<std::function<void()>> runs;
    for (auto& c : contenders)
      runs.push_back(c.method.empty()
                         ? std::function<void()>([&] { c.out = bench::torch_dense_ns(next_input(), sched, a.steps, peer_dtype); })
                         : std::function<void()>([&] { c.out = orthogonalize(next_input(), c.opt); }));
    if (a.dense)  // the last run: index contenders.size()
      runs.push_back([&] {
        const auto& ax = dense_operands[dense_turn++ % dense_operands.size()];
        dense_out = at::matmul(ax.first, ax.second);
      });
    // On CUDA, the SM clock over each timed group: the shape's rounds, or with --sequential each
    // contender's runs. Printed after the group's rows, and in each of its json rows.
    std::vector<bench::ClockSummary> clocks(a.sequential ? runs.size() : 1);
    auto clocks_of = [&](size_t i) { return device.is_cuda() ? &clocks[a.sequential ? i : 0] : nullptr; };
    auto clock_json = [&](size_t i) { return device.is_cuda() ? clocks_of(i)->to_json() : nlohmann::json(); };
    // Rows print in the order peer, dense product, methods; in round-robin the clock line follows
    // the last row, with --sequential each row (the dense product's run is the last run).
    auto print_clock_after = [&](size_t i) {
      if (device.is_cuda() && (a.sequential || i + 1 == contenders.size())) std::cout << clocks_of(i)->line() << "\n";
    };
    const size_t dense_run = contenders.size();
    std::vector<bench::Timing> times;
    if (a.sequential)
      for (size_t i = 0; i < runs.size(); ++i)
        times.push_back(bench::time_ms(runs[i], device, a.warmup, a.repeats, clocks_of(i)));
    else
      times = bench::time_round_robin(runs, device, a.warmup, a.repeats, clocks_of(0));

    double peer_ms = 0;
    const double dense_ms = a.dense ? times[dense_run].median_ms : 0.0;
    auto print_dense_row = [&] {
      if (!a.dense) return;
      const bench::Timing& t = times[dense_run];
      std::cout << fmt::format("{:<16} {:<14} {:>9.3f} {:>10} {:>12.1f} {:>10} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7}  {}\n",
                               shape_str, "dense:product", dense_ms, "", dense_flops / (dense_ms * 1e6), "", "", "", "",
                               "", "", "", c10::toString(peer_dtype));
      rows.push_back({{"shape", shape_str}, {"method", "dense_product"}, {"compute_dtype", c10::toString(peer_dtype)},
                      {"product", fmt::format("[{}, {}, {}]·[{}, {}, {}]", batch, m, m, batch, m, n)},
                      {"flops", dense_flops}, {"median_ms", dense_ms}, {"min_ms", t.min_ms}, {"max_ms", t.max_ms},
                      {"gflops", dense_flops / (dense_ms * 1e6)}, {"gpu_clock", clock_json(dense_run)}});
      if (device.is_cuda() && a.sequential) std::cout << clocks_of(dense_run)->line() << "\n";
    };
    if (!a.peer) print_dense_row();
    for (size_t i = 0; i < contenders.size(); ++i) {
      const Contender& c = contenders[i];
      const bench::Timing& t = times[i];
      if (c.method.empty()) {
        peer_ms = t.median_ms;
        std::cout << fmt::format("{:<16} {:<14} {:>9.3f} {:>10.1f} {:>12} {:>10.2e} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7}  {}\n",
                                 shape_str, "peer:torch", peer_ms,
                                 batch * standard_ns_flops(m, n, a.steps) / (peer_ms * 1e6), "", c.err, "", "", "", "",
                                 "", "", c10::toString(peer_dtype));
        rows.push_back({{"shape", shape_str}, {"method", "peer_torch_dense"}, {"compute_dtype", c10::toString(peer_dtype)},
                        {"median_ms", peer_ms}, {"min_ms", t.min_ms}, {"max_ms", t.max_ms},
                        {"rel_err_vs_fp64", c.err}, {"gpu_clock", clock_json(i)}});
        print_clock_after(i);
        print_dense_row();
        continue;
      }
      const OrthoMethod used = resolve_method(m, n, c.opt);
      const auto compute = resolve_compute_dtype(c.opt, device, used);
      const double eff = batch * standard_ns_flops(m, n, a.steps) / (t.median_ms * 1e6);
      const double done = batch * method_flops(m, n, a.steps, used, c.opt.gram_restarts) / (t.median_ms * 1e6);
      const std::string label = c.method == "auto" ? std::string("auto:") + to_string(used) : c.method;
      const double floor_flops = batch * symmetric_floor_flops(m, n, a.steps, used, c.opt.gram_restarts);
      const double floor_ms = floor_flops / (a.peak_tflops * 1e9);
      const double run_floor_ms = a.dense ? floor_flops * dense_ms / dense_flops : 0.0;
      const std::string peer_col = a.peer ? fmt::format("{:.2f}", peer_ms / t.median_ms) : "-";
      const std::string floor_col = device.is_cuda() ? fmt::format("{:.3f}", floor_ms) : "-";
      const std::string frac_col = device.is_cuda() ? fmt::format("{:.2f}", floor_ms / t.median_ms) : "-";
      std::cout << fmt::format("{:<16} {:<14} {:>9.3f} {:>10.1f} {:>12.1f} {:>10.2e} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7}  {}\n",
                               shape_str, label, t.median_ms, eff, done, c.err,
                               a.peer ? fmt::format("{:.3f}", peer_ms) : "-", peer_col, floor_col, frac_col,
                               a.dense ? fmt::format("{:.3f}", run_floor_ms) : "-",
                               a.dense ? fmt::format("{:.2f}", run_floor_ms / t.median_ms) : "-",
                               c10::toString(compute));
      rows.push_back({{"shape", shape_str}, {"method", c.method}, {"method_used", to_string(used)},
                      {"compute_dtype", c10::toString(compute)}, {"median_ms", t.median_ms}, {"min_ms", t.min_ms},
                      {"max_ms", t.max_ms}, {"effective_gflops", eff}, {"performed_gflops", done},
                      {"rel_err_vs_fp64", c.err}, {"schedule", a.schedule}, {"steps", a.steps},
                      {"peer_ms", a.peer ? nlohmann::json(peer_ms) : nlohmann::json()},
                      {"floor_ms", device.is_cuda() ? nlohmann::json(floor_ms) : nlohmann::json()},
                      {"floor_flops", floor_flops},
                      {"run_floor_ms", a.dense ? nlohmann::json(run_floor_ms) : nlohmann::json()},
                      {"gpu_clock", clock_json(i)}});
      print_clock_after(i);
    }
  }
  std::cout << "eff GF/s counts dense standard NS FLOPs (steps·(4m²n+2m³)) per matrix; GF/s (done) counts the\n"
               "products the method performed. rel err: ‖out − ref‖_F/‖ref‖_F, ref = standard NS in float64.\n"
               "peer: dense torch NS (bmm/baddbmm) in the same run; peer/us = peer ms / our ms (> 1: we are faster).\n"
            << (a.sequential ? "Timed one contender after another (--sequential).\n"
                             : "Timed round-robin: each round runs the peer, every method and the dense product once.\n");
  if (device.is_cuda())
    std::cout << fmt::format("floor: the method's FLOPs with symmetric products at half cost, at {:.0f} TFLOP/s; "
                             "of floor = floor ms / our ms.\n", a.peak_tflops);
  if (a.dense)
    std::cout << "dense:product: one product [B,m,m]·[B,m,n] (B·X, Q·X) in the peer's dtype, timed in the same rounds;\n"
                 "run floor: the method's FLOPs with symmetric products at half cost, at that product's rate (GF/s\n"
                 "(done) of its row); of run = run floor / our ms. On a GPU at its power cap this is the floor the\n"
                 "board allows in the state it is in.\n";
  if (device.is_cuda()) std::cout << bench::ClockSummary::legend();
  if (!a.json.empty()) {
    nlohmann::json doc = {{"benchmark", "ns"}, {"device", a.device}, {"execution", a.execution}, {"threads", at::get_num_threads()},
                          {"blas", blas_threading()}, {"rows", rows}};
    std::ofstream f(a.json);
    if (!f) throw std::runtime_error("argument '--json': cannot write '" + a.json + "'");
    f << doc.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto args = std::make_shared<NsArgs>();
  auto* ns = bench->add_subcommand("ns", "Orthogonalization (Newton–Schulz) timings and accuracy");
  ns->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  ns->add_option("--shapes", args->shapes, "shapes such as 1024x1024 or 16x1536x2048")->delimiter(',');
  ns->add_option("--methods", args->methods, "standard, gram, auto")->delimiter(',')
      ->check(CLI::IsMember({"standard", "gram", "auto"}));
  ns->add_option("--schedule", args->schedule, "coefficient schedule");
  ns->add_option("--steps", args->steps, "Newton–Schulz steps")->check(CLI::Range(1, 100));
  ns->add_option("--compute-dtype", args->compute_dtype, "fp32, fp64, bf16, fp16 (default: per device/method)");
  ns->add_option("--warmup", args->warmup, "warm-up runs")->check(CLI::Range(0, 1000));
  ns->add_option("--repeats", args->repeats, "timed runs (median reported)")->check(CLI::Range(1, 100000));
  ns->add_option("--seed", args->seed, "random seed");
  ns->add_option("--peak-tflops", args->peak_tflops, "matrix-unit rate for the FLOP floor (TFLOP/s)")
      ->check(CLI::PositiveNumber);
  ns->add_flag("!--no-peer", args->peer, "skip the dense torch peer");
  ns->add_flag("!--no-dense", args->dense, "skip the same-run dense product and its run floor");
  ns->add_flag("--sequential", args->sequential,
               "time the peer and the methods one after another (default: round-robin, one run of each per round)");
  ns->add_option("--execution", args->execution,
                 "which implementation each part takes: auto, or field=value,... (e.g. kernels=off; docs/execution.md)")
      ->check(execution_validator());
  ns->add_option("--json", args->json, "also write the results as JSON to this file");
  ns->callback([args, &action] { action = [args] { return run_ns(*args); }; });
  register_bench_step(*bench, action);
  register_bench_train(*bench, action);
}

}  // namespace orthopt::cli

// CUDA-graph optimizer step (algorithms.md §10) on the GPU: not in CI (needs a GPU; run
// tests/gpu/run.sh or build-gpu/tests/gpu/test_gpu_graph).
//
// The gate: two optimizers over identical parameters receive identical random gradients every
// step; one steps eagerly, the other through CudaGraphOptimizer (eager warm-up, capture, replays).
// Parameters and every state tensor must stay bit-identical (at::equal), for a constant and for
// a scheduled lr (set_lr_scale each step), with Muon, NorMuon, Dion3, AdamW and Lion groups in
// one optimizer, and Dion (Householder QR) with AdamW in another. Bitwise equality is the right tolerance: the replay launches the same kernels
// with the same arguments on the same data as the eager step, so any difference is a bug
// (a stale scalar baked into the graph, a missed write, a wrong buffer).
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/torch_version.h"
#include "gpu_test_util.h"
#include "orthopt/cuda_graph.h"
#include "orthopt/optim.h"

namespace {

using orthopt::Algorithm;
using orthopt::CudaGraphOptimizer;
using orthopt::GroupOptions;
using orthopt::Optimizer;
using orthopt::gpu_test::first_mismatch;
using orthopt::ParamGroup;

class GpuGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// Parameter shapes per group; the same seed gives the same values for both optimizers.
struct Spec {
  Algorithm algorithm;
  std::vector<std::vector<int64_t>> shapes;
  at::ScalarType dtype = at::kFloat;
};

const std::vector<Spec>& mixed_specs() {
  static const std::vector<Spec> specs = {
      {Algorithm::Muon, {{64, 96}, {64, 96}, {3, 32, 48}, {96, 40}}},  // two same shapes: one batched call
      {Algorithm::Muon, {{48, 80}}, at::kBFloat16},                    // bf16 parameter and momentum
      {Algorithm::NorMuon, {{80, 40}, {40, 120}}},
      {Algorithm::Dion3, {{96, 64}, {64, 128}}},
      {Algorithm::AdamW, {{96}, {32, 16}}},
      {Algorithm::Lion, {{50}}},
  };
  return specs;
}

GroupOptions options_for(Algorithm a, size_t g) {
  GroupOptions o;
  o.algorithm = a;
  o.lr = a == Algorithm::AdamW ? 3e-3 : (a == Algorithm::Lion ? 1e-4 : 0.02);
  o.weight_decay = 0.05;
  o.cautious_weight_decay = (g % 2) == 0;
  o.nesterov = a == Algorithm::Muon;
  if (a == Algorithm::Dion3) o.scale_lr_by_fraction = true;
  return o;
}

std::vector<ParamGroup> make_groups(const std::vector<Spec>& specs, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<ParamGroup> groups;
  for (size_t g = 0; g < specs.size(); ++g) {
    ParamGroup grp;
    grp.options = options_for(specs[g].algorithm, g);
    for (size_t i = 0; i < specs[g].shapes.size(); ++i) {
      at::Tensor p = at::randn(specs[g].shapes[i], gen, at::kFloat).mul_(0.1).to(specs[g].dtype).cuda();
      p.set_requires_grad(true);
      p.mutable_grad() = at::zeros_like(p);  // persistent gradient buffer, filled in place
      grp.params.push_back(p);
      grp.names.push_back("g" + std::to_string(g) + "_p" + std::to_string(i));
    }
    groups.push_back(std::move(grp));
  }
  return groups;
}

// Fills every gradient buffer of the optimizers in place with the same random values (never zeros).
void fill_grads(const std::vector<Optimizer*>& opts, int64_t step) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  const auto& groups = opts[0]->param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const at::Tensor& p0 = groups[g].params[i];
      at::Tensor grad = at::randn(p0.sizes(), gen, at::kFloat).to(p0.scalar_type()).cuda();
      for (Optimizer* o : opts) {
        const at::Tensor& buffer = o->param_groups()[g].params[i].grad();
        if (buffer.defined()) buffer.copy_(grad);  // parameters without a gradient stay so
      }
    }
}


std::vector<at::Tensor> snapshot_params(const Optimizer& o) {
  std::vector<at::Tensor> out;
  for (const auto& g : o.param_groups())
    for (const auto& p : g.params) out.push_back(p.detach().clone());
  return out;
}

bool params_equal(const Optimizer& o, const std::vector<at::Tensor>& snap) {
  size_t k = 0;
  for (const auto& g : o.param_groups())
    for (const auto& p : g.params)
      if (!at::equal(p, snap[k++])) return false;
  return true;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// Dion with the Householder QR (torch.linalg.qr, cuSOLVER), per bank: a mixed bank (2-D params
// and a 3-D stack), a tall bank, a bf16 bank, next to AdamW.
const std::vector<Spec>& dion_specs() {
  static const std::vector<Spec> specs = {
      {Algorithm::Dion, {{64, 96}, {64, 96}, {2, 64, 96}, {96, 40}}},
      {Algorithm::Dion, {{48, 80}, {48, 80}}, at::kBFloat16},
      {Algorithm::AdamW, {{96}, {32, 16}}},
  };
  return specs;
}

// Runs `steps` steps on an eager and a graphed optimizer, comparing bitwise after each.
void run_gate(bool scheduled_lr, const std::vector<Spec>& specs = mixed_specs()) {
  Optimizer eager(make_groups(specs, 11));
  Optimizer graphed_opt(make_groups(specs, 11));
  ASSERT_EQ(first_mismatch(eager, graphed_opt), "");
  const int warmup = 3, steps = 10;
  CudaGraphOptimizer graphed(graphed_opt, warmup);
  for (int t = 0; t < steps; ++t) {
    if (scheduled_lr) {
      const double scale = 0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * t / steps));  // cosine, never 0
      eager.set_lr_scale(scale);
      graphed_opt.set_lr_scale(scale);
    }
    fill_grads({&eager, &graphed_opt}, t);
    const auto before = snapshot_params(eager);
    eager.step();
    graphed.step();
    EXPECT_EQ(graphed.captured(), t >= warmup) << "step " << t;
    EXPECT_FALSE(params_equal(eager, before)) << "step " << t << " changed nothing";
    const std::string diff = first_mismatch(eager, graphed_opt);
    ASSERT_EQ(diff, "") << "step " << t << (t >= warmup ? " (replay)" : " (eager warm-up)")
                        << ": graphed optimizer differs from eager at " << diff;
  }
  EXPECT_EQ(graphed.eager_steps(), warmup);
  EXPECT_EQ(eager.step_count(), steps);
  EXPECT_EQ(graphed_opt.step_count(), steps);  // the step counter lives in the graph too
}

TEST_F(GpuGraph, ReplayBitIdenticalToEagerConstantLr) { run_gate(false); }

TEST_F(GpuGraph, ReplayBitIdenticalToEagerScheduledLr) { run_gate(true); }

TEST_F(GpuGraph, DionHouseholderReplayBitIdenticalToEager) { run_gate(true, dion_specs()); }

// The skip factor is a device tensor: a skipped replay leaves everything bit-identical and
// matches a skipped eager step. Gating must be enabled before the capture.
TEST_F(GpuGraph, SkipFactorActsInsideTheGraph) {
  Optimizer eager(make_groups(mixed_specs(), 12));
  Optimizer graphed_opt(make_groups(mixed_specs(), 12));
  auto one = at::ones({}, at::kFloat), zero = at::zeros({}, at::kFloat);
  eager.set_skip_factor(one);
  graphed_opt.set_skip_factor(one);
  CudaGraphOptimizer graphed(graphed_opt, 2);
  for (int t = 0; t < 7; ++t) {
    const bool skip = t == 4 || t == 5;  // skipped replays
    eager.set_skip_factor(skip ? zero : one);
    graphed_opt.set_skip_factor(skip ? zero : one);
    fill_grads({&eager, &graphed_opt}, 50 + t);
    const auto before = snapshot_params(graphed_opt);
    eager.step();
    graphed.step();
    EXPECT_EQ(params_equal(graphed_opt, before), skip) << "step " << t;
    ASSERT_EQ(first_mismatch(eager, graphed_opt), "") << "step " << t;
  }
  EXPECT_EQ(graphed_opt.step_count(), 5);
}

TEST_F(GpuGraph, SkipGatingEnabledAfterCaptureIsRefused) {
  Optimizer opt(make_groups(mixed_specs(), 13));
  CudaGraphOptimizer graphed(opt, 1);
  fill_grads({&opt}, 0);
  graphed.step();
  graphed.step();  // captured
  ASSERT_TRUE(graphed.captured());
  opt.set_skip_factor(at::zeros({}, at::kFloat));
  const std::string err = error_of([&] { graphed.step(); });
  EXPECT_NE(err.find("set_skip_factor"), std::string::npos) << err;
}

TEST_F(GpuGraph, RefusesCaptureWhenATrainableParameterHasNoGradient) {
  auto groups = make_groups({{Algorithm::Muon, {{32, 48}, {40, 24}}}, {Algorithm::AdamW, {{16}}}}, 14);
  groups[0].params[1].mutable_grad() = at::Tensor();  // trainable, but no gradient
  at::Tensor frozen = at::randn({8}, at::kFloat).cuda();  // no requires_grad, no grad: fine
  groups[1].params.push_back(frozen);
  groups[1].names.push_back("frozen");
  Optimizer opt(std::move(groups));
  CudaGraphOptimizer graphed(opt, 1);
  fill_grads({&opt}, 0);
  graphed.step();  // eager warm-up is allowed (the parameter is just skipped)
  const auto before = snapshot_params(opt);
  const std::string err = error_of([&] { graphed.step(); });
  EXPECT_NE(err.find("'g0_p1'"), std::string::npos) << err;
  EXPECT_NE(err.find("no gradient"), std::string::npos) << err;
  EXPECT_FALSE(graphed.captured());
  EXPECT_TRUE(params_equal(opt, before)) << "a refused capture must not change anything";
}

TEST_F(GpuGraph, HostHyperparameterChangeRefusedThenReleaseStepsEagerlyAndRecaptures) {
  Optimizer eager(make_groups(mixed_specs(), 15));
  Optimizer graphed_opt(make_groups(mixed_specs(), 15));
  CudaGraphOptimizer graphed(graphed_opt, 2);
  int t = 0;
  auto both_step = [&] {
    fill_grads({&eager, &graphed_opt}, 100 + t++);
    eager.step();
    graphed.step();
  };
  for (int k = 0; k < 4; ++k) both_step();
  ASSERT_TRUE(graphed.captured());

  GroupOptions changed = graphed_opt.param_groups()[2].options;
  changed.lr *= 0.5;
  graphed_opt.set_group_options(2, changed);
  eager.set_group_options(2, changed);
  fill_grads({&eager, &graphed_opt}, 100 + t);
  const auto before = snapshot_params(graphed_opt);
  const std::string err = error_of([&] { graphed.step(); });
  EXPECT_NE(err.find("group 2 option 'lr'"), std::string::npos) << err;
  EXPECT_NE(err.find("set_lr_scale"), std::string::npos) << err;
  EXPECT_TRUE(params_equal(graphed_opt, before)) << "a refused replay must not change anything";

  graphed.release();
  EXPECT_FALSE(graphed.captured());
  EXPECT_EQ(graphed.eager_steps(), 0);
  eager.step();  // the step refused above, now taken eagerly by both
  graphed.step();
  ++t;
  EXPECT_FALSE(graphed.captured());
  EXPECT_EQ(graphed.eager_steps(), 1);
  ASSERT_EQ(first_mismatch(eager, graphed_opt), "");
  for (int k = 0; k < 4; ++k) {
    both_step();
    ASSERT_EQ(first_mismatch(eager, graphed_opt), "") << "after release, step " << k;
  }
  EXPECT_TRUE(graphed.captured());  // re-captured with the new lr after 2 warm-up steps
}

TEST_F(GpuGraph, GradientBuffersMustBeKept) {
  Optimizer opt(make_groups({{Algorithm::Muon, {{32, 48}}}, {Algorithm::AdamW, {{16}}}}, 16));
  CudaGraphOptimizer graphed(opt, 1);
  fill_grads({&opt}, 0);
  graphed.step();
  graphed.step();
  ASSERT_TRUE(graphed.captured());
  opt.zero_grad(/*set_to_none=*/false);  // keeps the buffers: fine
  fill_grads({&opt}, 1);
  graphed.step();

  // Hold the captured buffers so the caching allocator cannot hand the same addresses back
  // to the replacement gradients below (same address = same buffer to the graph).
  std::vector<at::Tensor> held;
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params) held.push_back(p.grad());
  opt.zero_grad(/*set_to_none=*/true);
  std::string err = error_of([&] { graphed.step(); });
  EXPECT_NE(err.find("set_to_none=false"), std::string::npos) << err;

  for (const auto& g : opt.param_groups())
    for (auto p : g.params) p.mutable_grad() = at::randn_like(p);  // new buffers
  err = error_of([&] { graphed.step(); });
  EXPECT_NE(err.find("new buffer"), std::string::npos) << err;

  graphed.release();  // a new capture adopts the new buffers
  graphed.step();
  graphed.step();
  EXPECT_TRUE(graphed.captured());
}

TEST_F(GpuGraph, ReplacedStateIsRefused) {
  Optimizer opt(make_groups({{Algorithm::Muon, {{32, 48}}}, {Algorithm::AdamW, {{16}}}}, 17));
  CudaGraphOptimizer graphed(opt, 1);
  fill_grads({&opt}, 0);
  graphed.step();
  graphed.step();
  ASSERT_TRUE(graphed.captured());
  std::vector<std::vector<Optimizer::StateDict>> states;
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    states.emplace_back();
    for (size_t i = 0; i < opt.param_groups()[g].params.size(); ++i) states.back().push_back(opt.param_state(g, i));
  }
  opt.load_param_states(states);  // copies: new storage
  const std::string err = error_of([&] { graphed.step(); });
  EXPECT_NE(err.find("state was replaced"), std::string::npos) << err;
}

// Dion with dion_qr = cholesky captures: its host part (Optimizer::finish_step()) runs after each
// replay. At one replay a parameter's Q gets a zero column (in place, in both optimizers), so the
// factorization of its bank fails: the replay leaves that bank as it was, and finish_step()
// steps it through the reference path with the Householder QR for that matrix, as the eager
// step does.
TEST_F(GpuGraph, DionCholeskyReplayWithAFallbackBitIdenticalToEager) {
  auto cholesky = [](std::vector<ParamGroup> groups) {
    for (auto& g : groups)
      if (g.options.algorithm == Algorithm::Dion) g.options.dion_qr = orthopt::DionQr::Cholesky;
    return groups;
  };
  Optimizer eager(cholesky(make_groups(dion_specs(), 21)));
  Optimizer graphed_opt(cholesky(make_groups(dion_specs(), 21)));
  const int warmup = 2, steps = 8, failing = 5;
  CudaGraphOptimizer graphed(graphed_opt, warmup);
  for (int t = 0; t < steps; ++t) {
    if (t == failing)
      for (Optimizer* o : {&eager, &graphed_opt}) o->param_state(0, 1).at("Q").select(1, 2).zero_();
    fill_grads({&eager, &graphed_opt}, 60 + t);
    eager.step();
    graphed.step();
    EXPECT_EQ(graphed.captured(), t >= warmup) << "step " << t;
    const std::string diff = first_mismatch(eager, graphed_opt);
    ASSERT_EQ(diff, "") << "step " << t << (t >= warmup ? " (replay)" : " (eager warm-up)") << ": differs at " << diff;
    EXPECT_EQ(graphed_opt.dion_qr_fallbacks(), t >= failing ? 1 : 0) << "step " << t;
  }
  EXPECT_EQ(eager.dion_qr_fallbacks(), 1);
}

// Refused: Dion cholesky on its per-parameter reference path (execution banks=off at
// construction, or set during the warm-up: then at the capture, before anything is captured),
// and CPU parameters.
TEST_F(GpuGraph, DionCholeskyReferencePathAndCpuParametersAreRefused) {
  auto dion = make_groups({{Algorithm::Dion, {{32, 48}}}}, 18);
  dion[0].options.dion_qr = orthopt::DionQr::Cholesky;
  auto reference = dion;
  reference[0].options.ortho.execution.banks = orthopt::Toggle::Off;
  Optimizer ref_opt(std::move(reference));
  std::string err = error_of([&] { CudaGraphOptimizer g(ref_opt); });
  EXPECT_NE(err.find("dion_qr 'cholesky' on the per-parameter reference path (execution banks=off)"),
            std::string::npos)
      << err;

  Optimizer opt(std::move(dion));
  CudaGraphOptimizer warm(opt, 1);  // the bank path: accepted
  fill_grads({&opt}, 0);
  {
    orthopt::GroupOptions o = opt.param_groups()[0].options;
    o.ortho.execution.banks = orthopt::Toggle::Off;
    opt.set_group_options(0, o);
  }
  warm.step();  // the warm-up step, on the reference path
  err = error_of([&] { warm.step(); });
  EXPECT_NE(err.find("dion_qr 'cholesky' on the per-parameter reference path"), std::string::npos) << err;
  EXPECT_FALSE(warm.captured());

  ParamGroup cpu;
  cpu.params.push_back(at::randn({8, 8}));
  cpu.names.push_back("w_cpu");
  Optimizer cpu_opt({cpu});
  err = error_of([&] { CudaGraphOptimizer g(cpu_opt); });
  EXPECT_NE(err.find("'w_cpu'"), std::string::npos) << err;
  EXPECT_NE(err.find("CUDA device"), std::string::npos) << err;
}

// --- Other threads of the process during the capture --------------------------------------
//
// CudaGraphOptimizer captures in CUDA's thread-local mode with torch >= 2.1 (global mode
// before): a capture-unsafe call (cudaMalloc, cudaFree, a device synchronization) of another
// thread, such as a compile or autotune worker, must not fail our capture.

// What CUDA does, without torch in the way: a capture on a fresh stream in `mode`; while it is
// underway another thread calls cudaMalloc (and cudaFree when that succeeded) and is joined, so
// its calls certainly fall inside the capture; then one memset is captured and the capture ends.
struct RawCaptureResult {
  cudaError_t other_malloc, other_free, memset, end_capture;
};

RawCaptureResult capture_while_another_thread_mallocs(cudaStreamCaptureMode mode) {
  int dev = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* buffer = nullptr;
  EXPECT_EQ(cudaMalloc(&buffer, 4096), cudaSuccess);
  RawCaptureResult r{cudaSuccess, cudaSuccess, cudaSuccess, cudaSuccess};
  EXPECT_EQ(cudaStreamBeginCapture(stream, mode), cudaSuccess);
  std::thread other([&] {
    cudaSetDevice(dev);
    void* p = nullptr;
    r.other_malloc = cudaMalloc(&p, 1 << 20);
    if (r.other_malloc == cudaSuccess) r.other_free = cudaFree(p);
  });
  other.join();
  r.memset = cudaMemsetAsync(buffer, 0, 4096, stream);
  cudaGraph_t graph = nullptr;
  r.end_capture = cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();  // the refused calls' errors are not sticky; clear them anyway
  cudaFree(buffer);
  cudaStreamDestroy(stream);
  return r;
}

// The control: a global-mode capture refuses another thread's cudaMalloc and is invalidated at
// once (the next captured call already fails). This is how a failed capture seen in a dion run
// can have happened.
TEST_F(GpuGraph, GlobalCaptureFailsOnAnotherThreadsCudaMalloc) {
  const RawCaptureResult r = capture_while_another_thread_mallocs(cudaStreamCaptureModeGlobal);
  EXPECT_EQ(r.other_malloc, cudaErrorStreamCaptureUnsupported) << cudaGetErrorString(r.other_malloc);
  EXPECT_EQ(r.memset, cudaErrorStreamCaptureInvalidated) << cudaGetErrorString(r.memset);
  EXPECT_NE(r.end_capture, cudaSuccess) << "the capture survived another thread's refused cudaMalloc";
}

TEST_F(GpuGraph, ThreadLocalCaptureIgnoresAnotherThreadsCudaMalloc) {
  const RawCaptureResult r = capture_while_another_thread_mallocs(cudaStreamCaptureModeThreadLocal);
  EXPECT_EQ(r.other_malloc, cudaSuccess) << cudaGetErrorString(r.other_malloc);
  EXPECT_EQ(r.other_free, cudaSuccess) << cudaGetErrorString(r.other_free);
  EXPECT_EQ(r.memset, cudaSuccess) << cudaGetErrorString(r.memset);
  EXPECT_EQ(r.end_capture, cudaSuccess) << cudaGetErrorString(r.end_capture);
}

// Another thread calling `call` in a loop from construction to stop(): counts its calls and
// the ones that failed, and can say how many it made so far.
class OtherThread {
 public:
  explicit OtherThread(std::function<cudaError_t()> call) : call_(std::move(call)) {
    int dev = 0;
    cudaGetDevice(&dev);
    thread_ = std::thread([this, dev] {
      cudaSetDevice(dev);
      while (!stop_.load()) {
        const cudaError_t e = call_();
        if (e != cudaSuccess) {
          failed_.fetch_add(1);
          last_error_.store(static_cast<int>(e));
          (void)cudaGetLastError();
        }
        calls_.fetch_add(1);
      }
    });
    // Wait (at most a second) until the first call returned, so the loop runs before the
    // caller goes on.
    const auto t0 = std::chrono::steady_clock::now();
    while (calls_.load() == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1))
      std::this_thread::yield();
  }
  ~OtherThread() { stop(); }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  long calls() const { return calls_.load(); }
  long failed() const { return failed_.load(); }
  std::string last_error() const {
    return failed() == 0 ? "none" : cudaGetErrorString(static_cast<cudaError_t>(last_error_.load()));
  }

 private:
  std::function<cudaError_t()> call_;
  std::atomic<bool> stop_{false};
  std::atomic<long> calls_{0}, failed_{0};
  std::atomic<int> last_error_{0};
  std::thread thread_;
};

cudaError_t malloc_and_free() {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, 1 << 16);
  return e != cudaSuccess ? e : cudaFree(p);
}

// Larger than the gate's groups, so that the capturing step lasts long enough for many of the
// other thread's calls to fall inside it.
const std::vector<Spec>& larger_specs() {
  static const std::vector<Spec> specs = {
      {Algorithm::Muon, {{512, 768}, {512, 768}, {768, 512}}},
      {Algorithm::Dion3, {{512, 1024}}},
      {Algorithm::AdamW, {{4096}, {512, 64}}},
  };
  return specs;
}

#if ORTHOPT_TORCH_AT_LEAST(2, 1)
TEST_F(GpuGraph, AnotherThreadsCudaMallocDuringTheCaptureIsHarmless) {
  // The test proves something only if some of the other thread's calls fall inside the
  // capturing step. On a loaded machine one step can pass without any (H200, 2026-12-02: 385
  // pairs with the test alone, 0 under `ctest -j 4` beside the CPU tests), so the scenario is
  // run again, with fresh optimizers, until one attempt overlaps, at most kAttempts times.
  // Every attempt must capture, have none of the other thread's calls refused and match the
  // eager steps bit for bit.
  constexpr int kAttempts = 5;
  long overlapping = 0;
  for (int attempt = 0; attempt < kAttempts && overlapping == 0; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt + 1));
    Optimizer eager(make_groups(larger_specs(), 21));
    Optimizer graphed_opt(make_groups(larger_specs(), 21));
    CudaGraphOptimizer graphed(graphed_opt, 2);
    for (int t = 0; t < 6; ++t) {
      fill_grads({&eager, &graphed_opt}, 200 + t);
      eager.step();
      if (t == 2) {  // the capturing step, with cudaMalloc/cudaFree looping in another thread
        OtherThread other(malloc_and_free);
        const long before = other.calls();
        const std::string err = error_of([&] { graphed.step(); });
        const long during = other.calls() - before;
        other.stop();
        ASSERT_EQ(err, "") << "the capture failed with another thread's cudaMalloc/cudaFree running";
        EXPECT_EQ(other.failed(), 0) << "the other thread's calls were refused (" << other.last_error()
                                     << "): the capture is not thread-local";
        std::cout << "  attempt " << attempt + 1 << ", other thread: " << during
                  << " cudaMalloc/cudaFree pairs during the capturing step\n";
        overlapping = during;
      } else {
        graphed.step();
      }
      EXPECT_EQ(graphed.captured(), t >= 2) << "step " << t;
      ASSERT_EQ(first_mismatch(eager, graphed_opt), "") << "step " << t;
    }
  }
  EXPECT_GT(overlapping, 0) << "in " << kAttempts
                            << " attempts the other thread made no call during the capturing step; the test "
                               "proves nothing";
}
#endif

#if ORTHOPT_TORCH_AT_LEAST(2, 3)
size_t reserved_bytes(c10::DeviceIndex device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  return stats.reserved_bytes[0].current;  // [0]: StatType::AGGREGATE (its namespace moved in torch 2.x)
}

// A capture that fails applies nothing, hands its memory pool back to the caching allocator,
// and the next step() captures again and replays bit-identically. The failure is made by
// another thread synchronizing the device in a loop while the capture is underway: CUDA refused
// those synchronizations ("operation not permitted when stream is capturing") and invalidated
// the thread-local capture (CUDA 13). On a loaded machine none of the other thread's calls may
// fall inside the capturing step, and the capture then succeeds, so the scenario is
// run again with fresh optimizers, at most kAttempts times. Where every attempt captured, the
// failure path was not exercised (a driver that lets a thread-local capture survive that, or a
// machine too loaded), and the test is skipped, saying so.
TEST_F(GpuGraph, FailedCaptureAppliesNothingReleasesItsPoolAndTheNextStepRetries) {
  constexpr int kAttempts = 5;
  long calls = 0, refused = 0;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    Optimizer eager(make_groups(larger_specs(), 22));
    Optimizer graphed_opt(make_groups(larger_specs(), 22));
    CudaGraphOptimizer graphed(graphed_opt, 2);
    int t = 0;
    for (; t < 2; ++t) {
      fill_grads({&eager, &graphed_opt}, 300 + t);
      eager.step();
      graphed.step();
    }
    ASSERT_FALSE(graphed.captured());
    fill_grads({&eager, &graphed_opt}, 300 + t);
    const auto params_before = snapshot_params(graphed_opt);
    const int64_t count_before = graphed_opt.step_count();
    const c10::DeviceIndex device = graphed_opt.param_groups()[0].params[0].device().index();
    c10::cuda::CUDACachingAllocator::emptyCache();
    const size_t reserved_before = reserved_bytes(device);
    std::string err;
    {
      OtherThread other([] { return cudaDeviceSynchronize(); });
      err = error_of([&] { graphed.step(); });
      other.stop();
      calls = other.calls();
      refused = other.failed();
      std::cout << "  attempt " << attempt << ", other thread: " << calls << " cudaDeviceSynchronize calls, "
                << refused << " refused (" << other.last_error() << ")\n";
    }
    if (err.empty()) continue;  // the capture succeeded: nothing was exercised; again
    std::cout << "  the failed capture said: " << err.substr(0, 300) << "\n";
    EXPECT_NE(err.find("capturing the optimizer step failed, nothing was applied"), std::string::npos) << err;
    EXPECT_FALSE(graphed.captured());
    EXPECT_TRUE(params_equal(graphed_opt, params_before)) << "the failed capture changed a parameter";
    EXPECT_EQ(graphed_opt.step_count(), count_before);
    c10::cuda::CUDACachingAllocator::emptyCache();
    EXPECT_EQ(reserved_bytes(device), reserved_before) << "the failed capture's memory pool was not handed back";

    // The same gradients again: the eager twin takes that step now, the graphed one captures it.
    for (int k = 0; k < 4; ++k, ++t) {
      if (k > 0) fill_grads({&eager, &graphed_opt}, 300 + t);
      eager.step();
      ASSERT_EQ(error_of([&] { graphed.step(); }), "") << "step " << t;
      EXPECT_TRUE(graphed.captured());
      ASSERT_EQ(first_mismatch(eager, graphed_opt), "") << "step " << t << " after the failed capture";
    }
    return;
  }
  GTEST_SKIP() << "in " << kAttempts << " attempts another thread's cudaDeviceSynchronize loop did not fail the "
               << "thread-local capture (last attempt: " << calls << " calls, " << refused
               << " refused): this driver lets the capture survive it, or no call fell inside the capture; the "
                  "failure path was not exercised";
}
#endif

}  // namespace

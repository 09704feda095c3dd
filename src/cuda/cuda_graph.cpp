// orthopt::CudaGraphOptimizer (algorithms.md §10): warm up eagerly, capture one step, replay.
// The rules and what is checked before each replay are in include/orthopt/cuda_graph.h.
#include "orthopt/cuda_graph.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <string>
#include <vector>

#ifdef ORTHOPT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include "core/torch_version.h"
#include "optim/optimizer_impl.h"
#include "orthopt/runtime.h"

// torch >= 2.1: CUDAGraph::capture_begin takes the capture mode.
#define ORTHOPT_GRAPH_CAPTURE_MODE ORTHOPT_TORCH_AT_LEAST(2, 1)
// torch >= 2.3: the caching allocator's endAllocateToPool / releasePool take a pool id, so a
// failed capture's pool can be handed back (see abandon_pool).
#define ORTHOPT_GRAPH_OWN_POOL ORTHOPT_TORCH_AT_LEAST(2, 3)
#if ORTHOPT_GRAPH_OWN_POOL && __has_include(<ATen/core/CachingHostAllocator.h>)
#include <ATen/core/CachingHostAllocator.h>
#define ORTHOPT_GRAPH_HOST_POOL ORTHOPT_TORCH_AT_LEAST(2, 10)
#else
#define ORTHOPT_GRAPH_HOST_POOL 0
#endif
#endif

namespace orthopt {

#ifdef ORTHOPT_WITH_CUDA

namespace {

// Refuses a group whose step cannot be captured: Dion with the Cholesky QR2 on its per-parameter
// reference path (execution banks=off, or kernels=off with banks auto), which reads on the host
// which factorizations failed in the middle of the step. (Its bank path, the default, captures: it
// leaves that check to Optimizer::finish_step(), which runs after each replay.) Checked at
// construction and again at the capture, since the options may change during the warm-up.
void check_group_capturable(const ParamGroup& group, size_t g) {
  if (group.options.algorithm != Algorithm::Dion || group.options.dion_qr != DionQr::Cholesky ||
      group.params.empty())
    return;
  const KernelsScope kernels(group.options.ortho.execution.kernels);
  TORCH_CHECK(optim_core::use_banks(group.params[0].device(), group.options.ortho.execution),
              "CudaGraphOptimizer: group ", g, " uses 'dion' with dion_qr 'cholesky' on the per-parameter reference "
              "path (execution ", to_string(group.options.ortho.execution), "): that path synchronizes with the host in "
              "the middle of the step (it reads which factorizations failed) and cannot be captured in a CUDA graph; "
              "leave execution banks and kernels at auto, use dion_qr 'householder', or keep the group in a separate "
              "eager optimizer");
}

// The first option in which a and b differ, or nullptr. Every field of GroupOptions and
// OrthoOptions is listed: the graph bakes all of them in (lr and weight decay as kernel
// arguments, the schedule as the captured sequence of products).
const char* first_difference(const GroupOptions& a, const GroupOptions& b) {
  const OrthoOptions& x = a.ortho;
  const OrthoOptions& y = b.ortho;
  if (a.algorithm != b.algorithm) return "algorithm";
  if (a.lr != b.lr) return "lr";
  if (a.weight_decay != b.weight_decay) return "weight_decay";
  if (a.cautious_weight_decay != b.cautious_weight_decay) return "cautious_weight_decay";
  if (a.momentum != b.momentum) return "momentum";
  if (a.momentum_style != b.momentum_style) return "momentum_style";
  if (a.nesterov != b.nesterov) return "nesterov";
  if (a.lr_adjust != b.lr_adjust) return "lr_adjust";
  if (x.schedule != y.schedule) return "ortho.schedule";
  if (x.custom_triples != y.custom_triples) return "ortho.custom_triples";
  if (x.steps != y.steps) return "ortho.steps";
  if (x.method != y.method) return "ortho.method";
  if (x.compute_dtype != y.compute_dtype) return "ortho.compute_dtype";
  if (x.gram_restarts != y.gram_restarts) return "ortho.gram_restarts";
  if (x.gram_aspect_threshold != y.gram_aspect_threshold) return "ortho.gram_aspect_threshold";
  if (x.safety != y.safety) return "ortho.safety";
  if (x.eps != y.eps) return "ortho.eps";
  if (x.split_sizes != y.split_sizes) return "ortho.split_sizes";
  if (x.flatten != y.flatten) return "ortho.flatten";
  if (x.nonfinite != y.nonfinite) return "ortho.nonfinite";
  if (a.normuon_beta2 != b.normuon_beta2) return "normuon_beta2";
  if (a.normuon_eps != b.normuon_eps) return "normuon_eps";
  if (a.fraction != b.fraction) return "fraction";
  if (a.scale_lr_by_fraction != b.scale_lr_by_fraction) return "scale_lr_by_fraction";
  if (a.rank_fraction != b.rank_fraction) return "rank_fraction";
  if (a.dion_qr != b.dion_qr) return "dion_qr";
  if (a.beta1 != b.beta1) return "beta1";
  if (a.beta2 != b.beta2) return "beta2";
  if (a.eps != b.eps) return "eps";
  if (a.master_weights != b.master_weights) return "master_weights";
  for (const std::string& f : execution_fields())
    if (get_field(x.execution, f) != get_field(y.execution, f)) return "execution";
  return nullptr;
}

#if ORTHOPT_GRAPH_HOST_POOL
// Newer torch also routes pinned host allocations made during a capture to the graph's pool
// (CachingHostAllocator memory pools); where the host allocator has that API, undo it too.
template <typename HostAllocator, typename Pool>
auto abandon_host_pool(HostAllocator* host, const Pool& pool, int)
    -> decltype(host->end_allocate_to_pool(pool), host->release_pool(pool), void()) {
  host->end_allocate_to_pool(pool);
  host->release_pool(pool);
}
template <typename HostAllocator, typename Pool>
void abandon_host_pool(HostAllocator*, const Pool&, long) {}
#endif

#if ORTHOPT_GRAPH_OWN_POOL
// After a failed capture: torch's CUDAGraph::capture_end throws as soon as cudaStreamEndCapture
// fails, before it ends the caching allocator's allocation to the graph's pool, and the graph's
// destructor releases a pool only after a capture that ended. Left so, the allocator keeps
// routing to a pool whose filter points at the destroyed graph, and the failed step's memory
// is never returned. This ends the allocation and releases the pool. Never throws: when the pool
// was never registered (capture_begin failed early), there is nothing to undo.
template <typename Pool>
void abandon_pool(c10::DeviceIndex device, const Pool& pool) noexcept {
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (...) {
    return;  // not allocating to this pool: capture_begin stopped before registering it
  }
  try {
    c10::cuda::CUDACachingAllocator::releasePool(device, pool);
  } catch (...) {
  }
#if ORTHOPT_GRAPH_HOST_POOL
  try {
    abandon_host_pool(at::getHostAllocator(at::kCUDA), pool, 0);
  } catch (...) {
  }
#endif
}
#endif

}  // namespace

// What the captured graph depends on, recorded at capture and compared before each replay.
struct CaptureRecord {
  std::vector<GroupOptions> options;           // per group
  std::vector<std::vector<const void*>> param_ptrs, grad_ptrs;  // grad: nullptr = had none
  std::vector<const void*> state_ptrs;         // every state tensor, in map order
  bool skip_gating = false;
};

struct CudaGraphOptimizer::Impl {
  Optimizer& opt;
  const int warmup;
  c10::Device device;
  at::cuda::CUDAStream side;  // capture (and the eager step just before it) runs here
  int eager = 0;              // eager steps since construction / release()
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  CaptureRecord record;

  Impl(Optimizer& o, int w, c10::Device d)
      : opt(o), warmup(w), device(d), side(at::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())) {}

  // Runs `fn` on the side stream, ordered after all work queued so far on the current stream,
  // and makes the current stream wait for it (so the caller sees a normal stream-ordered step).
  template <typename Fn>
  void on_side_stream(Fn&& fn) {
    const at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream(device.index());
    at::cuda::CUDAEvent before, after;
    before.record(current);
    before.block(side);
    {
      const c10::cuda::CUDAStreamGuard guard(side);
      fn();
    }
    after.record(side);
    after.block(current);
  }

  // True when every parameter with a gradient already has its state (created by its first
  // eager step): state created inside the capture would be re-initialized by every replay.
  bool state_ready() const {
    const auto& groups = opt.param_groups();
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i = 0; i < groups[g].params.size(); ++i)
        if (groups[g].params[i].grad().defined() && opt.param_state(g, i).empty()) return false;
    return true;
  }

  void check_capturable() const {
    const auto& groups = opt.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      check_group_capturable(groups[g], g);
      for (size_t i = 0; i < groups[g].params.size(); ++i) {
        const at::Tensor& p = groups[g].params[i];
        TORCH_CHECK(!p.requires_grad() || p.grad().defined(), "CudaGraphOptimizer: ", param_label(groups[g], g, i),
                    " requires grad but has no gradient at capture; the captured step would never update it. Run "
                    "backward() so every trainable parameter has a gradient, or set requires_grad=false for frozen "
                    "ones (or keep them in an eager optimizer)");
      }
    }
  }

  CaptureRecord snapshot() const {
    CaptureRecord r;
    const auto& groups = opt.param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      r.options.push_back(groups[g].options);
      r.param_ptrs.emplace_back();
      r.grad_ptrs.emplace_back();
      for (size_t i = 0; i < groups[g].params.size(); ++i) {
        const at::Tensor& p = groups[g].params[i];
        r.param_ptrs.back().push_back(p.data_ptr());
        r.grad_ptrs.back().push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
        for (const auto& [name, t] : opt.param_state(g, i)) r.state_ptrs.push_back(t.data_ptr());
      }
    }
    r.skip_gating = opt.skip_gating();
    return r;
  }

  // Throws when something the graph baked in has changed since the capture.
  void check_unchanged() const {
    static const char* kHint = " Call release() to drop the graph (the next steps warm up and re-capture).";
    const auto& groups = opt.param_groups();
    TORCH_CHECK(groups.size() == record.options.size(), "CudaGraphOptimizer: the optimizer's groups changed after "
                "capture.", kHint);
    for (size_t g = 0; g < groups.size(); ++g) {
      if (const char* what = first_difference(record.options[g], groups[g].options))
        TORCH_CHECK(false, "CudaGraphOptimizer: group ", g, " option '", what,
                    "' changed after CUDA-graph capture; host-side hyperparameters are baked into the graph. "
                    "Schedule the learning rate with set_lr_scale() (a device tensor, allowed), or call release() "
                    "to re-capture with the new options.");
      for (size_t i = 0; i < groups[g].params.size(); ++i) {
        const at::Tensor& p = groups[g].params[i];
        TORCH_CHECK(p.data_ptr() == record.param_ptrs[g][i], "CudaGraphOptimizer: ", param_label(groups[g], g, i),
                    " was given new storage after capture.", kHint);
        const void* captured_grad = record.grad_ptrs[g][i];
        const at::Tensor& grad = p.grad();
        if (captured_grad == nullptr) {
          TORCH_CHECK(!grad.defined(), "CudaGraphOptimizer: ", param_label(groups[g], g, i),
                      " had no gradient at capture but has one now; the graph does not update it.", kHint);
          continue;
        }
        TORCH_CHECK(grad.defined(), "CudaGraphOptimizer: the gradient of ", param_label(groups[g], g, i),
                    " is gone (zero_grad(set_to_none=true)?); the graph reads the gradient buffers it captured: "
                    "use zero_grad(set_to_none=false) on the captured path.", kHint);
        TORCH_CHECK(grad.data_ptr() == captured_grad, "CudaGraphOptimizer: the gradient of ", param_label(groups[g], g, i),
                    " lives in a new buffer since capture (was .grad set to None or reassigned?); the graph reads "
                    "the buffers it captured: use zero_grad(set_to_none=false) on the captured path.", kHint);
      }
    }
    size_t k = 0;
    bool same_state = true;
    for (size_t g = 0; g < groups.size() && same_state; ++g)
      for (size_t i = 0; i < groups[g].params.size() && same_state; ++i)
        for (const auto& [name, t] : opt.param_state(g, i)) {
          if (k >= record.state_ptrs.size() || t.data_ptr() != record.state_ptrs[k]) same_state = false;
          ++k;
        }
    TORCH_CHECK(same_state && k == record.state_ptrs.size(), "CudaGraphOptimizer: the optimizer state was replaced "
                "after capture (load() or load_param_states()).", kHint);
    TORCH_CHECK(opt.skip_gating() == record.skip_gating, "CudaGraphOptimizer: set_skip_factor() was first called "
                "after capture, so the captured step has no skip gating; call set_skip_factor() before the capture.",
                kHint);
  }

  void capture_and_replay() {
    check_capturable();
    record = snapshot();
    auto g = std::make_unique<at::cuda::CUDAGraph>();
    std::string failure;
    [[maybe_unused]] bool ended = false;  // capture_end returned: the graph owns its pool and releases it itself
#if ORTHOPT_GRAPH_OWN_POOL
    // A pool of our own, so that a failed capture can hand it back (abandon_pool).
    const auto pool = at::cuda::graph_pool_handle();
#endif
    // Like torch.cuda.graph: start from an idle device (a one-time cost), so no pending work
    // or cross-stream wait overlaps the capture.
    c10::cuda::device_synchronize();
    on_side_stream([&] {
      try {
#if ORTHOPT_GRAPH_OWN_POOL
        // Thread-local mode (as torch.compile's CUDA graphs use): only this thread's
        // capture-unsafe calls fail the capture, not those of other threads of the process
        // (a compile or autotune worker, a data loader), which global mode lets break it.
        g->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
#elif ORTHOPT_GRAPH_CAPTURE_MODE
        g->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
#else
        g->capture_begin();
#endif
      } catch (const c10::Error& e) {
        failure = e.what_without_backtrace();
        return;
      }
      try {
        opt.enqueue_step();  // finish_step(), the host part, after each replay
      } catch (const c10::Error& e) {
        failure = e.what_without_backtrace();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      try {
        g->capture_end();  // also when the step threw: ends the stream's capture mode
        ended = true;
      } catch (const c10::Error& e) {
        if (failure.empty()) failure = e.what_without_backtrace();
      }
    });
    if (!failure.empty()) {
      (void)cudaGetLastError();  // capture errors are not sticky; do not leak them to later calls
#if ORTHOPT_GRAPH_OWN_POOL
      if (!ended) abandon_pool(device.index(), pool);
#endif
      g.reset();
      // The cause first: callers that show one line (logs, tables) keep it.
      TORCH_CHECK(false, "CudaGraphOptimizer: capturing the optimizer step failed, nothing was applied: ", failure,
                  " (usual causes: an op of the step that cannot be captured, e.g. a host synchronization or an "
                  "unsupported library call; or another thread of the process synchronizing the device "
                  "(cudaDeviceSynchronize, torch.cuda.synchronize()) during the capture, or, with torch < 2.1, "
                  "whose capture is in CUDA's global mode, making any capture-unsafe CUDA call. The next step() "
                  "tries the capture again.)");
    }
    graph = std::move(g);
    graph->replay();  // the capture itself executed nothing
    opt.finish_step();
  }

  void step() {
    const c10::cuda::CUDAGuard device_guard(device);
    if (graph) {
      check_unchanged();
      graph->replay();
      opt.finish_step();
      return;
    }
    if (eager < warmup || !state_ready()) {
      // Warm-up. The last warm-up step (and an extra one when a parameter got its first
      // gradient only now) runs on the capture stream, so the per-stream resources created
      // lazily (cuBLAS workspace) exist before the capture; the others on the current stream.
      if (eager + 1 >= warmup)
        on_side_stream([&] { opt.step(); });
      else
        opt.step();
      ++eager;
      return;
    }
    capture_and_replay();
  }
};

CudaGraphOptimizer::CudaGraphOptimizer(Optimizer& opt, int warmup_steps) {
  TORCH_CHECK(warmup_steps >= 1, "argument 'warmup_steps': must be >= 1 (the eager steps create the optimizer "
              "state before the capture), got ", warmup_steps);
  const auto& groups = opt.param_groups();
  c10::optional<c10::Device> device;
  for (size_t g = 0; g < groups.size(); ++g) {
    check_group_capturable(groups[g], g);
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const at::Tensor& p = groups[g].params[i];
      TORCH_CHECK(p.is_cuda(), "CudaGraphOptimizer: CUDA graphs need the parameters on a CUDA device, but ",
                  param_label(groups[g], g, i), " is on ", p.device());
      if (!device) device = p.device();
    }
  }
  TORCH_CHECK(device.has_value(), "CudaGraphOptimizer: the optimizer has no parameters, nothing to capture");
  impl_ = std::make_unique<Impl>(opt, warmup_steps, *device);
}

void CudaGraphOptimizer::step() { impl_->step(); }

void CudaGraphOptimizer::release() {
  impl_->graph.reset();
  impl_->eager = 0;
}

bool CudaGraphOptimizer::captured() const { return impl_->graph != nullptr; }

#else  // !ORTHOPT_WITH_CUDA

struct CudaGraphOptimizer::Impl {
  Optimizer& opt;
  int warmup = 0;
  int eager = 0;
};

CudaGraphOptimizer::CudaGraphOptimizer(Optimizer& opt, int warmup_steps) {
  TORCH_CHECK(false, "CudaGraphOptimizer: CUDA graphs need a CUDA build of orthopt (this build has no CUDA support: "
              "ORTHOPT_WITH_CUDA is off) and parameters on a CUDA device; use the optimizer's step() directly");
}

void CudaGraphOptimizer::step() { TORCH_CHECK(false, "CudaGraphOptimizer: CUDA graphs need a CUDA build"); }
void CudaGraphOptimizer::release() {}
bool CudaGraphOptimizer::captured() const { return false; }

#endif  // ORTHOPT_WITH_CUDA

CudaGraphOptimizer::~CudaGraphOptimizer() = default;
int CudaGraphOptimizer::warmup_steps() const { return impl_->warmup; }
int CudaGraphOptimizer::eager_steps() const { return impl_->eager; }
Optimizer& CudaGraphOptimizer::optimizer() { return impl_->opt; }

}  // namespace orthopt

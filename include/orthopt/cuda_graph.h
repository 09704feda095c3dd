#pragma once
// CUDA-graph capture of the optimizer step (algorithms.md §10; docs/cuda_graph.md).
//
// CudaGraphOptimizer wraps an orthopt::Optimizer whose parameters live on one CUDA device:
//   steps 1..warmup_steps      eager (state, cuBLAS handles and workspaces come to exist),
//   step warmup_steps + 1      captured once on a side stream, then replayed at once
//                              (capture alone executes nothing),
//   every later step           one graph replay on the current stream.
//
// What the graph bakes in, and therefore must not change after capture (each is checked
// before every replay; a change throws c10::Error and nothing is applied):
//   - every host-side hyperparameter of every group (GroupOptions): schedule lr through
//     Optimizer::set_lr_scale (a device tensor filled in place) — that is allowed;
//   - the gradient buffers: use zero_grad(/*set_to_none=*/false) on the captured path, so
//     backward() accumulates into the same memory (a freed or reassigned .grad throws);
//   - which parameters have a gradient, the parameters' and the state's storage (load(),
//     load_param_states() replace state tensors: release() first, or re-create the wrapper);
//   - whether skip-factor gating is enabled (call set_skip_factor before capture if the step
//     guards are used; the skip factor's value may change freely).
// Capture is refused with a clear error when a trainable parameter (requires_grad) has no
// gradient (the graph would silently never update it) and for Dion groups with dion_qr
// 'cholesky' on the per-parameter reference path (execution banks=off, or kernels=off), which reads on the host
// which factorizations failed in the middle of the step.
// release() frees the graph: the next steps are eager warm-up steps again, then it re-captures.
//
// On a build without CUDA (ORTHOPT_WITH_CUDA undefined) the class exists but its constructor
// throws c10::Error saying that CUDA graphs need a CUDA build, so callers get an error at run
// time rather than a link failure.

#include <memory>

#include "orthopt/optim.h"

namespace orthopt {

class CudaGraphOptimizer {
 public:
  // `opt` must outlive this object. warmup_steps >= 1: the eager steps before the capture.
  explicit CudaGraphOptimizer(Optimizer& opt, int warmup_steps = 10);
  ~CudaGraphOptimizer();
  CudaGraphOptimizer(const CudaGraphOptimizer&) = delete;
  CudaGraphOptimizer& operator=(const CudaGraphOptimizer&) = delete;

  // One optimizer step: eager during warm-up, then capture + replay, then replay.
  void step();
  // Frees the graph; the following steps warm up again and re-capture.
  void release();

  bool captured() const;
  int warmup_steps() const;
  // Eager steps taken since construction or the last release().
  int eager_steps() const;
  Optimizer& optimizer();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace orthopt

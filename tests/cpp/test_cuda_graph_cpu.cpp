// CudaGraphOptimizer without a GPU: CPU users get a clear error, not a link failure or a crash.
// On a CPU build the constructor refuses because the build has no CUDA; on a CUDA build it
// refuses CPU parameters. The GPU behaviour is tested in tests/gpu/test_gpu_graph.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "orthopt/cuda_graph.h"
#include "orthopt/optim.h"

namespace {

using orthopt::CudaGraphOptimizer;
using orthopt::Optimizer;
using orthopt::ParamGroup;

Optimizer cpu_optimizer() {
  ParamGroup g;
  g.params.push_back(at::randn({8, 12}).requires_grad_());
  g.names.push_back("w");
  return Optimizer({g});
}

std::string construction_error(Optimizer& opt, int warmup) {
  try {
    CudaGraphOptimizer graphed(opt, warmup);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(CudaGraphCpu, ConstructionGivesAClearError) {
  Optimizer opt = cpu_optimizer();
  const std::string err = construction_error(opt, 10);
  ASSERT_FALSE(err.empty()) << "constructing a CudaGraphOptimizer over CPU parameters must throw";
  EXPECT_NE(err.find("CudaGraphOptimizer"), std::string::npos) << err;
#ifdef ORTHOPT_WITH_CUDA
  EXPECT_NE(err.find("parameter 'w'"), std::string::npos) << err;
  EXPECT_NE(err.find("on a CUDA device"), std::string::npos) << err;
#else
  EXPECT_NE(err.find("need a CUDA build"), std::string::npos) << err;
#endif
}

TEST(CudaGraphCpu, BadWarmupIsReportedOnCudaBuilds) {
  Optimizer opt = cpu_optimizer();
  const std::string err = construction_error(opt, 0);
#ifdef ORTHOPT_WITH_CUDA
  EXPECT_NE(err.find("argument 'warmup_steps'"), std::string::npos) << err;
#else
  EXPECT_NE(err.find("need a CUDA build"), std::string::npos) << err;
#endif
}

// The optimizer keeps stepping normally after the refusal.
TEST(CudaGraphCpu, OptimizerStillStepsEagerly) {
  Optimizer opt = cpu_optimizer();
  (void)construction_error(opt, 10);
  at::Tensor w = opt.param_groups()[0].params[0];
  w.mutable_grad() = at::randn({8, 12});
  const at::Tensor before = w.detach().clone();
  opt.step();
  EXPECT_FALSE(at::equal(before, w));
  EXPECT_EQ(opt.step_count(), 1);
}

// The accessor the graph wrapper uses to detect gating switched on after capture.
TEST(CudaGraphCpu, SkipGatingFlagFollowsSetSkipFactor) {
  Optimizer opt = cpu_optimizer();
  EXPECT_FALSE(opt.skip_gating());
  opt.set_skip_factor(at::ones({}));
  EXPECT_TRUE(opt.skip_gating());
}

}  // namespace

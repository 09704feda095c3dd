#ifdef ORTHOPT_WITH_CUDA
#include "cuda/stream_fork.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <memory>

namespace orthopt::cuda {
namespace {

c10::cuda::CUDAStream side_stream(c10::Device device, int index) {
  const c10::cuda::CUDAGuard guard(device);
  cudaStream_t raw = nullptr;
  const orthopt_status st = orthopt_side_stream(index, &raw);
  TORCH_CHECK(st == ORTHOPT_OK, "orthopt_side_stream: ", orthopt_last_error());
  return c10::cuda::getStreamFromExternal(raw, device.index());
}

}  // namespace

SideBranch::SideBranch(c10::Device device, int index)
    : device_(device), main_(c10::cuda::getCurrentCUDAStream(device.index())), side_(side_stream(device, index)) {}

SideBranch::~SideBranch() {
  try {
    join();
  } catch (...) {  // a failed join while unwinding: nothing better to do than to go on unwinding
  }
}

void SideBranch::run(const std::function<void()>& fn, const std::vector<at::Tensor>& uses) {
  const c10::cuda::CUDAGuard guard(device_);
  at::cuda::CUDAEvent fork;
  fork.record(main_);
  fork.block(side_);
  for (const at::Tensor& t : uses)
    if (t.defined()) t.record_stream(side_);
  pending_ = true;
  const c10::cuda::CUDAStreamGuard on(side_);
  fn();
}

void SideBranch::join() {
  if (!pending_) return;
  pending_ = false;
  const c10::cuda::CUDAGuard guard(device_);
  at::cuda::CUDAEvent done;
  done.record(side_);
  done.block(main_);
}

void run_on_parallel_streams(c10::Device device, const std::vector<std::function<void()>>& chains,
                             const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>* outputs) {
  if (chains.empty()) return;
  if (chains.size() == 1) return chains[0]();
  const size_t n_side = std::min<size_t>(chains.size() - 1, kChainSideStreams);
  std::vector<std::unique_ptr<SideBranch>> side;
  for (size_t k = 0; k < n_side; ++k) side.push_back(std::make_unique<SideBranch>(device, static_cast<int>(k)));
  // The side chains are queued first: each forks from the caller's stream before chains[0] is
  // queued there, so none waits for it.
  for (size_t k = 1; k < chains.size(); ++k) side[(k - 1) % n_side]->run(chains[k], inputs);
  chains[0]();
  for (auto& s : side) s->join();
  if (outputs) {
    const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device.index());
    for (const at::Tensor& t : *outputs)
      if (t.defined()) t.record_stream(main);
  }
}

}  // namespace orthopt::cuda
#endif  // ORTHOPT_WITH_CUDA

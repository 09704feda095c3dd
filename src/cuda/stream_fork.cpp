#ifdef ORTHOPT_WITH_CUDA
#include "cuda/stream_fork.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "orthopt/kernels/multi_tensor.h"

namespace orthopt::cuda {

void run_on_parallel_streams(c10::Device device, const std::vector<std::function<void()>>& chains,
                             const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>* outputs) {
  if (chains.empty()) return;
  const c10::cuda::CUDAGuard guard(device);
  const at::cuda::CUDAStream main = at::cuda::getCurrentCUDAStream(device.index());
  if (chains.size() == 1) return chains[0]();
  // The library's side streams (their own cuBLAS workspaces); chains beyond their count share
  // them round-robin, one after another on each.
  const size_t n_side = std::min<size_t>(chains.size() - 1, ORTHOPT_SIDE_STREAMS);
  at::cuda::CUDAEvent fork;
  fork.record(main);
  std::vector<at::cuda::CUDAStream> side;
  for (size_t k = 0; k < n_side; ++k) {
    cudaStream_t raw = nullptr;
    const orthopt_status st = orthopt_side_stream(static_cast<int>(k), &raw);
    TORCH_CHECK(st == ORTHOPT_OK, "orthopt_side_stream: ", orthopt_last_error());
    side.push_back(c10::cuda::getStreamFromExternal(raw, device.index()));
    fork.block(side.back());
    for (const at::Tensor& t : inputs)
      if (t.defined()) t.record_stream(side.back());
  }
  chains[0]();
  for (size_t k = 1; k < chains.size(); ++k) {
    const c10::cuda::CUDAStreamGuard on(side[(k - 1) % n_side]);
    chains[k]();
  }
  for (const at::cuda::CUDAStream& s : side) {
    at::cuda::CUDAEvent done;
    done.record(s);
    done.block(main);
  }
  if (outputs)
    for (const at::Tensor& t : *outputs)
      if (t.defined()) t.record_stream(main);
}

}  // namespace orthopt::cuda
#endif  // ORTHOPT_WITH_CUDA

#pragma once
// Independent chains of GPU work (e.g. the Newton–Schulz iterations of different banks) on
// parallel streams, so a chain of small products fills the multiprocessors another chain leaves
// idle. Compiled only when torch has CUDA (ORTHOPT_WITH_CUDA).
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace orthopt::cuda {

// Runs chains[0] on the caller's current stream and chains[k > 0] on the kernel library's side
// streams (orthopt_side_stream; round-robin when there are more chains), which first wait for
// the work queued so far; then the current stream waits for every chain. `inputs`: tensors
// made before the fork and read by the chains; `outputs`: tensors the chains make and the
// caller uses afterwards; both are recorded on the streams that use them,
// so the caching allocator does not reuse their memory early. Capturable in a CUDA graph (the
// chains become parallel branches) once an eager call has created the side streams and their
// cuBLAS workspaces (kernels/src/blas_context.cu).
void run_on_parallel_streams(c10::Device device, const std::vector<std::function<void()>>& chains,
                             const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>* outputs);

}  // namespace orthopt::cuda
#endif  // ORTHOPT_WITH_CUDA

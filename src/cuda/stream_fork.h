#pragma once
// Independent GPU work on parallel streams: the Newton–Schulz chains of different banks (a chain
// of small products fills the multiprocessors another chain leaves idle), and the elementwise
// optimizer groups (AdamW, Lion: bandwidth-bound) beside the matrix groups' orthogonalization
// (compute-bound). The side streams are the kernel library's (orthopt_side_stream: their own
// cuBLAS handles and workspaces). Everything here can be captured in a CUDA graph (the branches
// become parallel graph branches) once an eager call has created the side streams and their
// cuBLAS handles. Compiled only when torch has CUDA (ORTHOPT_WITH_CUDA).
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <functional>
#include <vector>

#include "orthopt_kernels.h"

namespace orthopt::cuda {

// Side streams [0, kChainSideStreams) take NS chains; the last one takes the elementwise groups.
constexpr int kChainSideStreams = ORTHOPT_SIDE_STREAMS - 1;
constexpr int kGroupSideStream = ORTHOPT_SIDE_STREAMS - 1;

// Work queued on side stream `index` of `device`, ordered after what the caller's current stream
// had queued when run() was called; join() makes the caller's stream wait for all of it.
class SideBranch {
 public:
  SideBranch(c10::Device device, int index);
  SideBranch(const SideBranch&) = delete;
  SideBranch& operator=(const SideBranch&) = delete;
  ~SideBranch();  // joins (a branch is never left dangling, also when an exception unwinds)

  // Runs fn (which queues GPU work) with the side stream current. `uses`: tensors made on the
  // caller's stream that the work reads or writes, recorded on the side stream so the caching
  // allocator does not hand their memory out again before the side stream is done with it.
  void run(const std::function<void()>& fn, const std::vector<at::Tensor>& uses = {});
  void join();
  const c10::cuda::CUDAStream& stream() const { return side_; }

 private:
  c10::Device device_;
  c10::cuda::CUDAStream main_, side_;
  bool pending_ = false;
};

// Runs chains[0] on the caller's current stream and chains[k > 0] on side streams [0,
// kChainSideStreams) (round-robin when there are more chains), each ordered after the work
// queued before the call; then the current stream waits for every chain. `inputs`: tensors made
// before the call and read by the chains; `outputs`: tensors the chains make and the caller uses
// afterwards; both are recorded on the streams that use them, so the caching allocator does not
// reuse their memory early.
void run_on_parallel_streams(c10::Device device, const std::vector<std::function<void()>>& chains,
                             const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>* outputs);

}  // namespace orthopt::cuda
#endif  // ORTHOPT_WITH_CUDA

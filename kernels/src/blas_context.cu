// cuBLAS handles with a fixed workspace, per host thread and device, and the library's side
// streams. Products on the library's side streams (orthopt_side_stream) may run at the same time
// as products on any other stream, so each side stream has its own handles and workspace (a
// shared workspace would be written by both); every other stream shares the device's set, as
// before. All of them are created on first use — before a CUDA-graph capture, where creating
// handles or allocating is not allowed (an eager warm-up step does it) — and live for the
// process (destroying them at exit races the CUDA runtime's own teardown).
#include <array>
#include <map>
#include <mutex>
#include <utility>

#include "internal.h"

namespace orthopt_k {
namespace {

struct SideStreams {
  std::mutex mutex;
  std::map<int, std::array<cudaStream_t, ORTHOPT_SIDE_STREAMS>> by_device;  // null until created
};
SideStreams& side_streams() {
  static SideStreams* s = new SideStreams;  // never destroyed (see above)
  return *s;
}

// The index of `stream` among the device's side streams, or -1.
int side_index(int device, cudaStream_t stream) {
  if (!stream) return -1;
  SideStreams& s = side_streams();
  const std::lock_guard<std::mutex> lock(s.mutex);
  const auto it = s.by_device.find(device);
  if (it == s.by_device.end()) return -1;
  for (int i = 0; i < ORTHOPT_SIDE_STREAMS; ++i)
    if (it->second[i] == stream) return i;
  return -1;
}

}  // namespace

orthopt_status blas_context(cudaStream_t stream, BlasContext** out) {
  thread_local std::map<std::pair<int, int>, BlasContext> contexts;  // (device, side index or -1)
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  const std::pair<int, int> key{device, side_index(device, stream)};
  auto it = contexts.find(key);
  if (it == contexts.end()) {
    BlasContext ctx;
    ORTHOPT_CUBLAS_TRY(cublasCreate(&ctx.blas));
    ORTHOPT_CUBLAS_TRY(cublasLtCreate(&ctx.lt));
    ORTHOPT_CUDA_TRY(cudaMalloc(&ctx.workspace, kWorkspaceBytes));
    ORTHOPT_CUBLAS_TRY(cublasSetWorkspace(ctx.blas, ctx.workspace, kWorkspaceBytes));
    it = contexts.emplace(key, ctx).first;
  }
  *out = &it->second;
  return ORTHOPT_OK;
}

}  // namespace orthopt_k

extern "C" orthopt_status orthopt_side_stream(int index, cudaStream_t* out) {
  using namespace orthopt_k;
  if (index < 0 || index >= ORTHOPT_SIDE_STREAMS)
    return fail(ORTHOPT_ERR_INVALID, "orthopt_side_stream: argument 'index' must be in [0, %d), got %d",
                ORTHOPT_SIDE_STREAMS, index);
  if (!out) return fail(ORTHOPT_ERR_INVALID, "orthopt_side_stream: argument 'out' must not be NULL");
  int device = 0;
  ORTHOPT_CUDA_TRY(cudaGetDevice(&device));
  SideStreams& s = side_streams();
  const std::lock_guard<std::mutex> lock(s.mutex);
  auto& streams = s.by_device.try_emplace(device).first->second;
  if (!streams[index]) {
    // Non-blocking: no implicit synchronization with the legacy default stream (which a
    // CUDA-graph capture forbids); ordering comes from the caller's events.
    ORTHOPT_CUDA_TRY(cudaStreamCreateWithFlags(&streams[index], cudaStreamNonBlocking));
  }
  *out = streams[index];
  return ORTHOPT_OK;
}

#ifdef ORTHOPT_WITH_CUDA
#include "cuda/householder_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "orthopt_kernels.h"

namespace orthopt::cuda {

int64_t householder_panel_max_rows(int64_t cols, const at::Device& device) {
  const c10::cuda::CUDAGuard guard(device);
  return orthopt_householder_panel_max_rows(cols);
}

at::Tensor householder_panel(const at::Tensor& A) {
  const char* fn = "orthopt::cuda::householder_panel";
  TORCH_CHECK(A.defined() && A.is_cuda() && A.scalar_type() == at::kFloat && A.dim() == 3, fn,
              ": argument 'A' must be an fp32 CUDA tensor [B, rows, cols], got ",
              A.defined() ? A.sizes() : at::IntArrayRef{});
  TORCH_CHECK(A.stride(2) == 1 && A.stride(1) >= A.size(2), fn,
              ": argument 'A' must have rows of unit column stride, got strides ", A.strides());
  const int64_t B = A.size(0), rows = A.size(1), cols = A.size(2);
  at::Tensor V = at::empty({B, rows, cols}, A.options().memory_format(at::MemoryFormat::Contiguous));
  if (B == 0 || cols == 0) return V;
  const c10::cuda::CUDAGuard guard(A.device());
  const orthopt_status st =
      orthopt_householder_panel(B, rows, cols, A.data_ptr<float>(), A.stride(1), A.stride(0), V.data_ptr<float>(),
                                at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(st == ORTHOPT_OK, fn, ": ", orthopt_last_error());
  return V;
}

}  // namespace orthopt::cuda
#endif

#ifdef ORTHOPT_WITH_CUDA
#include "cuda/householder_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "orthopt/kernels/householder.h"

namespace orthopt::cuda {

int64_t householder_panel_max_rows(int64_t cols, const at::Device& device) {
  const c10::cuda::CUDAGuard guard(device);
  return orthopt_householder_panel_max_rows(cols);
}

int64_t householder_panel_waves(int64_t batch, int64_t rows, int64_t cols, const at::Device& device) {
  const c10::cuda::CUDAGuard guard(device);
  return orthopt_householder_panel_waves(batch, rows, cols);
}

namespace {

// The kernels' operands: fp32 CUDA [B, rows, cols] (`shape` names the dimensions in the error)
// whose rows have unit column stride (any row and batch strides).
void check_batch(const char* fn, const at::Tensor& X, const char* name, const char* shape) {
  TORCH_CHECK(X.defined() && X.is_cuda() && X.scalar_type() == at::kFloat && X.dim() == 3, fn, ": argument '", name,
              "' must be an fp32 CUDA tensor ", shape, ", got ", X.defined() ? X.sizes() : at::IntArrayRef{});
  TORCH_CHECK(X.stride(2) == 1 && X.stride(1) >= X.size(2), fn, ": argument '", name,
              "' must have rows of unit column stride, got strides ", X.strides());
}

// An output `Y` (named `y`) of the input `X`'s sizes and device.
void check_same(const char* fn, const at::Tensor& X, const char* x, const at::Tensor& Y, const char* y) {
  TORCH_CHECK(Y.sizes() == X.sizes() && Y.device() == X.device(), fn, ": argument '", y, "' must have ", x,
              "'s sizes ", X.sizes(), " and device, got ", Y.sizes());
}

}  // namespace

void householder_panel_into(const at::Tensor& A, at::Tensor& V) {
  const char* fn = "orthopt::cuda::householder_panel";
  check_batch(fn, A, "A", "[B, rows, cols]");
  check_batch(fn, V, "V", "[B, rows, cols]");
  check_same(fn, A, "A", V, "V");
  const int64_t B = A.size(0), rows = A.size(1), cols = A.size(2);
  if (B == 0 || cols == 0) return;
  const c10::cuda::CUDAGuard guard(A.device());
  const orthopt_status st = orthopt_householder_panel(B, rows, cols, A.data_ptr<float>(), A.stride(1), A.stride(0),
                                                      V.data_ptr<float>(), V.stride(1), V.stride(0),
                                                      at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(st == ORTHOPT_OK, fn, ": ", orthopt_last_error());
}

void householder_t_factor_into(const at::Tensor& G, at::Tensor& T) {
  const char* fn = "orthopt::cuda::householder_t_factor";
  check_batch(fn, G, "G", "[B, n, n] with n <= 32");
  TORCH_CHECK(G.size(1) == G.size(2) && G.size(2) <= 32, fn,
              ": argument 'G' must be an fp32 CUDA tensor [B, n, n] with n <= 32, got ", G.sizes());
  check_batch(fn, T, "T", "[B, n, n] with n <= 32");
  check_same(fn, G, "G", T, "T");
  const c10::cuda::CUDAGuard guard(G.device());
  const orthopt_status st =
      orthopt_householder_t_factor(G.size(0), G.size(1), G.data_ptr<float>(), G.stride(1), G.stride(0),
                                   T.data_ptr<float>(), T.stride(1), T.stride(0), at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(st == ORTHOPT_OK, fn, ": ", orthopt_last_error());
}

at::Tensor householder_panel(const at::Tensor& A) {
  TORCH_CHECK(A.defined() && A.dim() == 3, "orthopt::cuda::householder_panel: argument 'A' must be [B, rows, cols], got ",
              A.defined() ? A.sizes() : at::IntArrayRef{});
  at::Tensor V = at::empty(A.sizes(), A.options().memory_format(at::MemoryFormat::Contiguous));
  householder_panel_into(A, V);
  return V;
}

}  // namespace orthopt::cuda
#endif

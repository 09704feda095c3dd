#ifdef ORTHOPT_WITH_CUDA
#include "cuda/products_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "orthopt/runtime.h"
#include "orthopt/kernels/cast.h"
#include "orthopt/kernels/gemm.h"
#include "orthopt/kernels/sym.h"

namespace orthopt::cuda {
namespace {

orthopt_dtype kernel_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? ORTHOPT_BF16 : ORTHOPT_FP16;
}

void check_operand(const at::Tensor& t, c10::Device device, at::ScalarType dtype, const char* what) {
  TORCH_CHECK(t.is_cuda() && t.device() == device, "argument '", what, "': expected a tensor on ", device, ", got ",
              t.device());
  TORCH_CHECK(t.scalar_type() == dtype, "argument '", what, "': expected dtype ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 3, "argument '", what, "': expected a batch [B, rows, cols], got shape ", t.sizes());
}

void check_operand(const at::Tensor& t, const at::Tensor& like, const char* what) {
  check_operand(t, like.device(), like.scalar_type(), what);
}

// The product's result: `out` checked (shape, dtype, device, contiguous), or a new tensor with
// like's device and the given dtype.
at::Tensor output(const at::Tensor& out, const at::Tensor& like, at::ScalarType dtype, at::IntArrayRef sizes) {
  if (!out.defined()) return at::empty(sizes, like.options().dtype(dtype));
  check_operand(out, like.device(), dtype, "out");
  TORCH_CHECK(out.sizes() == sizes, "argument 'out': expected shape ", sizes, ", got ", out.sizes());
  TORCH_CHECK(out.is_contiguous(), "argument 'out': expected a contiguous tensor");
  return out;
}

void check_status(orthopt_status st, const char* fn) {
  TORCH_CHECK(st == ORTHOPT_OK, fn, ": ", orthopt_last_error());
}

bool elementwise_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

orthopt_dtype elementwise_kernel_dtype(at::ScalarType t) {
  return t == at::kFloat ? ORTHOPT_FP32 : (t == at::kBFloat16 ? ORTHOPT_BF16 : ORTHOPT_FP16);
}

}  // namespace

bool is_transposed_view(const at::Tensor& t) {
  return t.dim() == 3 && !t.is_contiguous() && t.transpose(1, 2).is_contiguous();
}

bool handles(const at::Tensor& t) {
  if (!t.is_cuda() || (t.scalar_type() != at::kBFloat16 && t.scalar_type() != at::kHalf)) return false;
  return kernels_enabled();
}

bool scale_cast_handles(const at::Tensor& in, at::ScalarType out_dtype) {
  if (!in.defined() || !in.is_cuda() || !elementwise_dtype(in.scalar_type()) || !elementwise_dtype(out_dtype))
    return false;
  return kernels_enabled();
}

at::Tensor sym_abt(const at::Tensor& A_in, const at::Tensor& B_in, double alpha, const at::Tensor& C_in, double beta,
                   double diag, const at::Tensor& out) {
  // Named in profiles (with the operands' shapes where shapes are recorded), so that a kernel
  // of cuBLAS or ours can be traced to its product; nothing is built while no profiler runs.
  RECORD_FUNCTION("orthopt::sym_abt", std::vector<c10::IValue>({A_in, B_in}));
  check_operand(A_in, A_in, "A");
  check_operand(B_in, A_in, "B");
  TORCH_CHECK(B_in.sizes() == A_in.sizes(), "argument 'B': expected the shape of A ", A_in.sizes(), ", got ",
              B_in.sizes());
  const int64_t batch = A_in.size(0), m = A_in.size(1), k = A_in.size(2);
  const at::Tensor A = A_in.contiguous(), B = B_in.is_same(A_in) ? A : B_in.contiguous();
  at::Tensor C;
  if (C_in.defined()) {
    check_operand(C_in, A_in, "C");
    TORCH_CHECK(C_in.size(0) == batch && C_in.size(1) == m && C_in.size(2) == m, "argument 'C': expected shape [",
                batch, ", ", m, ", ", m, "], got ", C_in.sizes());
    C = C_in.contiguous();
  }
  const c10::cuda::CUDAGuard device_guard(A.device());
  const at::Tensor D = output(out, A, A.scalar_type(), {batch, m, m});
  check_status(orthopt_sym_abt(kernel_dtype(A), batch, m, k, A.data_ptr(), m * k, B.data_ptr(), m * k,
                               static_cast<float>(alpha), C.defined() ? C.data_ptr() : nullptr, m * m,
                               static_cast<float>(beta), static_cast<float>(diag), D.data_ptr(), m * m,
                               ORTHOPT_SYM_AUTO, at::cuda::getCurrentCUDAStream().stream()),
               "orthopt_sym_abt");
  return D;
}

at::Tensor gemm(const at::Tensor& A_in, const at::Tensor& X_in, double alpha, const at::Tensor& C_in, double beta,
                const at::Tensor& out, std::optional<at::ScalarType> out_dtype) {
  RECORD_FUNCTION("orthopt::gemm", std::vector<c10::IValue>({A_in, X_in}));
  check_operand(A_in, A_in, "A");
  check_operand(X_in, A_in, "X");
  const int64_t batch = A_in.size(0), m = A_in.size(1), k = A_in.size(2), n = X_in.size(2);
  TORCH_CHECK(X_in.size(0) == batch && X_in.size(1) == k, "argument 'X': expected shape [", batch, ", ", k,
              ", n], got ", X_in.sizes());
  const at::ScalarType d_dtype = out.defined() ? out.scalar_type() : out_dtype.value_or(A_in.scalar_type());
  TORCH_CHECK(d_dtype == A_in.scalar_type() || d_dtype == at::kFloat, "argument 'out_dtype': expected ",
              A_in.scalar_type(), " (A's) or float, got ", d_dtype);
  // An operand that is the transpose of a contiguous tensor is read as stored (op T).
  const bool a_t = is_transposed_view(A_in), x_t = is_transposed_view(X_in);
  const at::Tensor A = a_t ? A_in : A_in.contiguous(), X = x_t ? X_in : X_in.contiguous();
  at::Tensor C;
  if (C_in.defined()) {
    TORCH_CHECK(C_in.dim() == 3 && C_in.size(0) == batch && C_in.size(1) == m && C_in.size(2) == n,
                "argument 'C': expected shape [", batch, ", ", m, ", ", n, "], got ", C_in.sizes());
    check_operand(C_in, A_in.device(), d_dtype, "C");
    C = C_in.contiguous();
  }
  const c10::cuda::CUDAGuard device_guard(A.device());
  const at::Tensor D = output(out, A, d_dtype, {batch, m, n});
  check_status(orthopt_gemm(kernel_dtype(A), d_dtype == at::kFloat ? ORTHOPT_FP32 : kernel_dtype(A), batch, m, n, k,
                            A.data_ptr(), m * k, a_t ? 1 : 0, X.data_ptr(), k * n, x_t ? 1 : 0,
                            static_cast<float>(alpha), C.defined() ? C.data_ptr() : nullptr, m * n,
                            static_cast<float>(beta), D.data_ptr(), m * n, at::cuda::getCurrentCUDAStream().stream()),
               "orthopt_gemm");
  return D;
}

at::Tensor scale_cast(const at::Tensor& in_arg, const at::Tensor& norm_arg, double safety, double eps,
                      at::ScalarType out_dtype, bool transpose) {
  TORCH_CHECK(in_arg.defined() && in_arg.is_cuda(), "argument 'in': expected a CUDA tensor");
  TORCH_CHECK(in_arg.dim() == 3, "argument 'in': expected a batch [B, rows, cols], got shape ", in_arg.sizes());
  TORCH_CHECK(elementwise_dtype(in_arg.scalar_type()), "argument 'in': expected fp32, bf16 or fp16, got ",
              in_arg.scalar_type());
  TORCH_CHECK(elementwise_dtype(out_dtype), "argument 'out_dtype': expected fp32, bf16 or fp16, got ", out_dtype);
  const int64_t batch = in_arg.size(0), rows = in_arg.size(1), cols = in_arg.size(2);
  at::Tensor norm;
  if (norm_arg.defined()) {
    TORCH_CHECK(norm_arg.is_cuda() && norm_arg.device() == in_arg.device(), "argument 'norm': expected a tensor on ",
                in_arg.device(), ", got ", norm_arg.device());
    TORCH_CHECK(norm_arg.scalar_type() == at::kFloat, "argument 'norm': expected fp32, got ", norm_arg.scalar_type());
    TORCH_CHECK(norm_arg.numel() == batch, "argument 'norm': expected ", batch, " values (one per matrix), got ",
                norm_arg.numel(), " (shape ", norm_arg.sizes(), ")");
    norm = norm_arg.contiguous();
  }
  const at::Tensor in = in_arg.contiguous();
  const c10::cuda::CUDAGuard guard(in.device());
  const std::vector<int64_t> out_sizes =
      transpose ? std::vector<int64_t>{batch, cols, rows} : std::vector<int64_t>{batch, rows, cols};
  at::Tensor out = at::empty(out_sizes, in.options().dtype(out_dtype));
  // Scalars rounded to fp32 as ATen rounds a Scalar in an fp32 kernel (static_cast: to nearest).
  check_status(orthopt_scale_cast(batch, rows, cols, in.data_ptr(), elementwise_kernel_dtype(in.scalar_type()),
                                  norm.defined() ? norm.data_ptr<float>() : nullptr, static_cast<float>(safety),
                                  static_cast<float>(eps), out.data_ptr(), elementwise_kernel_dtype(out_dtype),
                                  transpose ? 1 : 0, at::cuda::getCurrentCUDAStream().stream()),
               "orthopt_scale_cast");
  return out;
}

at::Tensor contiguous(const at::Tensor& t) {
  if (t.is_contiguous() || t.dim() < 2 || !scale_cast_handles(t, t.scalar_type())) return t.contiguous();
  const at::Tensor tt = t.transpose(-2, -1);  // [..., c, r]
  if (!tt.is_contiguous()) return t.contiguous();
  const at::Tensor in = tt.reshape({-1, tt.size(-2), tt.size(-1)});  // a view: tt is contiguous
  return scale_cast(in, at::Tensor(), 1.0, 0.0, t.scalar_type(), /*transpose=*/true).view(t.sizes());
}

at::Tensor cast(const at::Tensor& t, at::ScalarType dtype) {
  if (t.scalar_type() == dtype || t.numel() == 0 || !scale_cast_handles(t, dtype)) return t.to(dtype);
  // The elementwise conversion does not care about the layout, so a transposed view moves as its
  // contiguous storage and the result is the same transposed view of the converted storage.
  const bool transposed = !t.is_contiguous() && t.dim() >= 2 && t.transpose(-2, -1).is_contiguous();
  if (!t.is_contiguous() && !transposed) return t.to(dtype);
  const at::Tensor stored = transposed ? t.transpose(-2, -1) : t;
  const at::Tensor flat = stored.reshape({1, 1, stored.numel()});  // a view: stored is contiguous
  const at::Tensor out = scale_cast(flat, at::Tensor(), 1.0, 0.0, dtype, /*transpose=*/false).view(stored.sizes());
  return transposed ? out.transpose(-2, -1) : out;
}

}  // namespace orthopt::cuda
#endif  // ORTHOPT_WITH_CUDA

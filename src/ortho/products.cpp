#include "ortho/products.h"

#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#include "cuda/products_cuda.h"
#endif

namespace orthopt::detail {

Precision Precision::of(at::ScalarType dtype, c10::Device device) {
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  return {dtype, half && device.is_cpu()};
}

namespace {
at::Tensor wide(const at::Tensor& t, const Precision& p) { return p.emulate ? t.to(at::kFloat) : t; }
at::Tensor narrow(const at::Tensor& t, const Precision& p) { return p.emulate ? t.to(p.dtype) : t; }

// CUDA bf16/fp16 operands go to the kernel library (symmetric products computed over the
// lower triangle only, rectangular ones through cuBLASLt); everything else, and the reference
// for the GPU tests (execution kernels=off), is the ATen path below.
#ifdef ORTHOPT_WITH_CUDA
bool use_kernels(const at::Tensor& t) { return cuda::handles(t); }
#endif
}  // namespace

at::Tensor gram_product(const at::Tensor& X, const Precision& p, const at::Tensor& out) {
#ifdef ORTHOPT_WITH_CUDA
  if (use_kernels(X)) {
    // X kept in a tall matrix's layout (X = Tᵀ, T contiguous): R = Tᵀ·T, one dense product
    // reading both operands as stored (the symmetric kernels take row-major operands only).
    if (cuda::is_transposed_view(X)) return cuda::gemm(X, X.transpose(1, 2), 1.0, at::Tensor(), 0.0, out);
    return cuda::sym_abt(X, X, 1.0, at::Tensor(), 0.0, 0.0, out);
  }
#endif
  auto x = wide(X, p);
  if (!out.defined()) return narrow(at::bmm(x, x.transpose(-2, -1)), p);
  // Into the caller's slice: written in place, or (emulated 16-bit) rounded once by the copy,
  // as .to() would round it.
  if (!p.emulate) {
    at::Tensor o = out;  // a handle on the same storage (bmm_out takes a non-const reference)
    return at::bmm_out(o, x, x.transpose(-2, -1));
  }
  return out.copy_(at::bmm(x, x.transpose(-2, -1)));
}

at::Tensor sym_addmm(const at::Tensor& C, const at::Tensor& A, const at::Tensor& B, double beta,
                     double alpha, const Precision& p, double diag) {
#ifdef ORTHOPT_WITH_CUDA
  // A·B = A·Bᵀ for a symmetric B, which is the form the kernel takes.
  if (use_kernels(A)) return cuda::sym_abt(A, B, alpha, C, beta, diag);
#endif
  at::Tensor D = at::baddbmm(wide(C, p), wide(A, p), wide(B, p), beta, alpha);
  if (diag != 0.0) D.diagonal(0, -2, -1).add_(diag);  // emulated: before the one rounding, as in the kernels
  return narrow(D, p);
}

at::Tensor addmm(const at::Tensor& C, const at::Tensor& A, const at::Tensor& X, double beta,
                 double alpha, const Precision& p) {
#ifdef ORTHOPT_WITH_CUDA
  if (use_kernels(A)) return cuda::gemm(A, X, alpha, C, beta);
#endif
  return narrow(at::baddbmm(wide(C, p), wide(A, p), wide(X, p), beta, alpha), p);
}

at::Tensor mm(const at::Tensor& A, const at::Tensor& X, const Precision& p, bool transposed_result,
              std::optional<at::ScalarType> result_dtype) {
  TORCH_CHECK(!result_dtype || writes_result_dtype(X, *result_dtype), "mm: this path does not write ",
              *result_dtype, " (check writes_result_dtype first)");
#ifdef ORTHOPT_WITH_CUDA
  if (use_kernels(A)) {
    // X = Tᵀ kept in a tall matrix's layout, or a transposed result asked for: (A·X)ᵀ = Xᵀ·Aᵀ,
    // one product reading both operands as stored.
    if (cuda::is_transposed_view(X) || (transposed_result && X.is_contiguous()))
      return cuda::gemm(X.transpose(1, 2), A.transpose(1, 2), 1.0, at::Tensor(), 0.0, at::Tensor(), result_dtype)
          .transpose(1, 2);
    return cuda::gemm(A, X, 1.0, at::Tensor(), 0.0, at::Tensor(), result_dtype);
  }
#endif
  (void)transposed_result;
  return narrow(at::bmm(wide(A, p), wide(X, p)), p);
}

bool takes_update(const at::Tensor& X) {
#ifdef ORTHOPT_WITH_CUDA
  return use_kernels(X);
#else
  (void)X;
  return false;
#endif
}

void mm_update(const at::Tensor& A, const at::Tensor& X, bool transposed_result, const FoldedUpdate& u) {
  TORCH_CHECK(takes_update(X), "mm_update: operands the GPU kernels do not take (check takes_update first)");
#ifdef ORTHOPT_WITH_CUDA
  // The layouts of mm(): (A·X)ᵀ = Xᵀ·Aᵀ written contiguous where X is kept transposed or a
  // transposed result is asked for.
  if (cuda::is_transposed_view(X) || (transposed_result && X.is_contiguous()))
    cuda::update_by_product(X.transpose(1, 2), A.transpose(1, 2), u.weights, u.factor, u.lr, u.weight_decay, u.keep);
  else
    cuda::update_by_product(A, X, u.weights, u.factor, u.lr, u.weight_decay, u.keep);
#else
  (void)A;
  (void)transposed_result;
  (void)u;
#endif
}

bool writes_result_dtype(const at::Tensor& X, at::ScalarType dtype) {
#ifdef ORTHOPT_WITH_CUDA
  return use_kernels(X) && (dtype == at::kFloat || dtype == X.scalar_type());
#else
  (void)X;
  (void)dtype;
  return false;
#endif
}

void add_identity_(const at::Tensor& Z, double a, const Precision& p) {
  if (!p.emulate) {
    Z.diagonal(0, -2, -1).add_(a);
    return;
  }
  auto z = wide(Z, p);
  z.diagonal(0, -2, -1).add_(a);
  Z.copy_(narrow(z, p));
}

}  // namespace orthopt::detail

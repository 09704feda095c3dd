#include "ortho/products.h"

namespace orthopt::detail {

Precision Precision::of(at::ScalarType dtype, c10::Device device) {
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  return {dtype, half && device.is_cpu()};
}

namespace {
at::Tensor wide(const at::Tensor& t, const Precision& p) { return p.emulate ? t.to(at::kFloat) : t; }
at::Tensor narrow(const at::Tensor& t, const Precision& p) { return p.emulate ? t.to(p.dtype) : t; }
}  // namespace

at::Tensor gram_product(const at::Tensor& X, const Precision& p) {
  auto x = wide(X, p);
  return narrow(at::bmm(x, x.transpose(-2, -1)), p);
}

at::Tensor sym_addmm(const at::Tensor& C, const at::Tensor& A, const at::Tensor& B, double beta,
                     double alpha, const Precision& p) {
  return narrow(at::baddbmm(wide(C, p), wide(A, p), wide(B, p), beta, alpha), p);
}

at::Tensor addmm(const at::Tensor& C, const at::Tensor& A, const at::Tensor& X, double beta,
                 double alpha, const Precision& p) {
  return narrow(at::baddbmm(wide(C, p), wide(A, p), wide(X, p), beta, alpha), p);
}

at::Tensor mm(const at::Tensor& A, const at::Tensor& X, const Precision& p) {
  return narrow(at::bmm(wide(A, p), wide(X, p)), p);
}

at::Tensor plus_identity(const at::Tensor& Z, double a, const Precision& p) {
  auto out = wide(Z, p).clone();
  out.diagonal(0, -2, -1).add_(a);
  return narrow(out, p);
}

}  // namespace orthopt::detail

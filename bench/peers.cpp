#include "peers.h"

namespace orthopt::bench {

at::Tensor torch_dense_ns(const at::Tensor& G, const Schedule& s, int steps, at::ScalarType compute) {
  at::Tensor X = G.reshape({-1, G.size(-2), G.size(-1)});
  const bool tall = X.size(1) > X.size(2);
  if (tall) X = X.transpose(1, 2);
  X = X.to(at::kFloat);
  auto norm = at::linalg_vector_norm(X, 2, at::IntArrayRef{1, 2}, /*keepdim=*/true);
  X = (X / (norm * s.safety + s.eps)).to(compute);
  for (int t = 0; t < steps; ++t) {
    const auto& [a, b, c] = s.at_step(t);
    auto A = at::bmm(X, X.transpose(1, 2));
    auto B = at::baddbmm(A, A, A, b, c);
    X = at::baddbmm(X, B, X, a, 1.0);
  }
  if (tall) X = X.transpose(1, 2);
  return X.reshape(G.sizes()).to(G.scalar_type());
}

}  // namespace orthopt::bench

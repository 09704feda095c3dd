// GPU correctness of the orthogonalization engine with the CUDA kernels (not in CI: needs a GPU;
// run tests/gpu/run.sh). References are float64 products written here or the float64
// iteration of the engine on the CPU; inputs are random, never zeros.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "cuda/products_cuda.h"
#include "orthopt/orthogonalize.h"

namespace {

double rel_err(const at::Tensor& got, const at::Tensor& ref) {
  auto g = got.to(at::kCPU).to(at::kDouble), r = ref.to(at::kCPU).to(at::kDouble);
  EXPECT_TRUE(at::isfinite(g).all().item<bool>());
  return ((g - r).norm() / r.norm()).item<double>();
}

// Result rounded once to the 16-bit type: bf16 2^-9, fp16 2^-12 relative per element at most;
// Frobenius-relative errors sit below that, fp32 accumulation adds far less. 2x room.
double bound(at::ScalarType t) { return t == at::kBFloat16 ? 4e-3 : 5e-4; }

// Random input with singular values spread over [1e-3, 1] (log scale), like a gradient.
at::Tensor spread(int64_t batch, int64_t m, int64_t n) {
  const int64_t k = std::min(m, n);
  auto U = std::get<0>(at::linalg_qr(at::randn({batch, m, k}, at::kDouble)));
  auto V = std::get<0>(at::linalg_qr(at::randn({batch, n, k}, at::kDouble)));
  auto s = at::pow(10.0, at::linspace(0.0, -3.0, k, at::kDouble));
  return at::matmul(U * s, V.transpose(-2, -1)).to(at::kFloat);
}

struct KernelsOff {  // the ATen reference path for the rest of the scope
  KernelsOff() { setenv("ORTHOPT_GPU_KERNELS", "0", 1); }
  ~KernelsOff() { unsetenv("ORTHOPT_GPU_KERNELS"); }
};

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    torch::manual_seed(7);
  }
};

TEST_F(Gpu, SymmetricGramProductMatchesFloat64) {
  for (auto dt : {at::kBFloat16, at::kHalf}) {
    auto A = (at::randn({3, 300, 264}, at::kDouble) / std::sqrt(264.0)).to(dt);  // ragged tiles
    auto Ad = A.to(at::kDouble);
    auto D = orthopt::cuda::sym_abt(A.cuda(), A.cuda(), 1.0, at::Tensor(), 0.0, 0.0);
    auto ref = at::bmm(Ad, Ad.transpose(1, 2));
    EXPECT_LE(rel_err(D, ref), bound(dt)) << dt;
    EXPECT_TRUE(at::equal(D, D.transpose(1, 2))) << "result must be exactly symmetric";
  }
}

TEST_F(Gpu, SymmetricCommutingProductWithEpilogueMatchesFloat64) {
  for (auto dt : {at::kBFloat16, at::kHalf}) {
    auto S = at::randn({2, 384, 384}, at::kDouble) / std::sqrt(384.0);
    S = (S + S.transpose(1, 2)) / 2;
    auto I = at::eye(384, at::kDouble).expand({2, 384, 384});
    // P and Q are polynomials of S: symmetric and commuting (up to the rounding to dt).
    auto P = (at::bmm(S, S) + S).to(dt), Q = (2 * S - I).to(dt);
    auto C = (S * 0.5 + I).to(dt);
    const double alpha = 1.5, beta = -0.5, diag = 0.25;
    auto D = orthopt::cuda::sym_abt(P.cuda(), Q.cuda(), alpha, C.cuda(), beta, diag);
    auto ref = alpha * at::bmm(P.to(at::kDouble), Q.to(at::kDouble)) + beta * C.to(at::kDouble) + diag * I;
    // P·Q differs from Q·P by the rounding of P and Q to dt: allow that on top of the output rounding.
    EXPECT_LE(rel_err(D, ref), 2 * bound(dt)) << dt;
  }
}

TEST_F(Gpu, RectangularProductMatchesFloat64) {
  for (auto dt : {at::kBFloat16, at::kHalf}) {
    auto A = (at::randn({2, 200, 136}, at::kDouble) / std::sqrt(136.0)).to(dt);
    auto X = at::randn({2, 136, 520}, at::kDouble).to(dt);
    auto C = at::randn({2, 200, 520}, at::kDouble).to(dt);
    auto D = orthopt::cuda::gemm(A.cuda(), X.cuda(), 0.5, C.cuda(), 3.0);
    auto ref = 0.5 * at::bmm(A.to(at::kDouble), X.to(at::kDouble)) + 3.0 * C.to(at::kDouble);
    EXPECT_LE(rel_err(D, ref), bound(dt)) << dt;
  }
}

TEST_F(Gpu, BadOperandsNameTheArgument) {
  auto A = at::randn({1, 64, 64}, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
  try {
    orthopt::cuda::sym_abt(A, A.to(at::kHalf), 1.0, at::Tensor(), 0.0, 0.0);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'B'"), std::string::npos) << e.what();
  }
}

// Standard NS in bf16 on the GPU: within bf16 noise of the same iteration in float64. The noise
// is measured in the same test by the ATen bf16 path; ours may differ in rounding details only.
TEST_F(Gpu, StandardNsBf16WithinBf16Noise) {
  auto G = spread(2, 640, 1024);  // 5×5 lower tiles, several panels
  orthopt::OrthoOptions opt;
  opt.method = orthopt::OrthoMethod::Standard;
  opt.compute_dtype = at::kBFloat16;
  orthopt::OrthoOptions ref_opt = opt;
  ref_opt.compute_dtype = at::kDouble;
  auto ref = orthopt::orthogonalize(G.to(at::kDouble), ref_opt);
  const double ours = rel_err(orthopt::orthogonalize(G.cuda(), opt), ref);
  double aten = 0;
  {
    KernelsOff off;
    aten = rel_err(orthopt::orthogonalize(G.cuda(), opt), ref);
  }
  std::printf("standard NS bf16 rel err vs float64: kernels %.3e, ATen %.3e\n", ours, aten);
  EXPECT_LE(ours, 1.5 * aten + 1e-3);
  EXPECT_LT(ours, 0.05);
}

// Gram NS in fp16 on the GPU against the standard iteration in float64, within the error the
// same Gram iteration has on the CPU (fp16 emulated: fp32 products rounded once to fp16).
TEST_F(Gpu, GramNsFp16WithinCpuBound) {
  auto G = spread(2, 256, 1024);
  orthopt::OrthoOptions opt;
  opt.method = orthopt::OrthoMethod::Gram;
  opt.compute_dtype = at::kHalf;
  orthopt::OrthoOptions ref_opt = opt;
  ref_opt.method = orthopt::OrthoMethod::Standard;
  ref_opt.compute_dtype = at::kDouble;
  auto ref = orthopt::orthogonalize(G.to(at::kDouble), ref_opt);
  const double gpu = rel_err(orthopt::orthogonalize(G.cuda(), opt), ref);
  const double cpu = rel_err(orthopt::orthogonalize(G, opt), ref);
  std::printf("Gram NS fp16 rel err vs float64 standard NS: GPU kernels %.3e, CPU emulation %.3e\n", gpu, cpu);
  EXPECT_LE(gpu, 1.5 * cpu + 1e-3);
}

}  // namespace

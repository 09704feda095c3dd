// GPU correctness of the orthogonalization engine with the CUDA kernels (not in CI: needs a GPU;
// run tests/gpu/run.sh). References are float64 products written here or the float64
// iteration of the engine on the CPU; inputs are random, never zeros.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "cuda/products_cuda.h"
#include "ortho/orthogonalize_detail.h"
#include "orthopt/orthogonalize.h"
#include "orthopt/runtime.h"

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

// spread() for any shape [..., m, n] (leading dimensions: a batch).
at::Tensor spread_shape(const std::vector<int64_t>& shape) {
  const int64_t m = shape[shape.size() - 2], n = shape.back();
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < shape.size(); ++d) batch *= shape[d];
  return spread(batch, m, n).reshape(shape);
}

struct KernelsOff {  // the ATen reference path for the rest of the scope (ExecutionOptions::kernels = off)
  orthopt::KernelsScope scope{orthopt::Toggle::Off};
};

// `opt` with NS's last product in the compute dtype, then a cast (ExecutionOptions::direct_result = off).
orthopt::OrthoOptions cast_after(orthopt::OrthoOptions opt) {
  opt.execution.direct_result = orthopt::Toggle::Off;
  return opt;
}

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
  // A given output must have the result's shape and be contiguous; a valid one is written.
  const at::Tensor wrong = at::empty({1, 64, 32}, A.options());
  const at::Tensor strided = at::empty({1, 64, 128}, A.options()).narrow(2, 0, 64);
  for (const at::Tensor& out : {wrong, strided}) {
    try {
      orthopt::cuda::gemm(A, A, 1.0, at::Tensor(), 0.0, out);
      FAIL() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("argument 'out'"), std::string::npos) << e.what();
    }
  }
  const at::Tensor out = at::full({2, 64, 64}, NAN, A.options());
  const at::Tensor D = orthopt::cuda::sym_abt(A, A, 1.0, at::Tensor(), 0.0, 0.0, out.narrow(0, 1, 1));
  EXPECT_EQ(D.data_ptr(), out[1].data_ptr());
  EXPECT_TRUE(at::equal(out[1], orthopt::cuda::sym_abt(A, A, 1.0, at::Tensor(), 0.0, 0.0)[0]));
  EXPECT_TRUE(at::isnan(out[0]).all().item<bool>());  // the rest of the buffer untouched
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

// Gram NS of tall matrices in their own layout (m <= 1024: R = Tᵀ·T and T·Qᵀ read T as stored,
// no transposed copies; gram_own_layout=off is the transposing path): the result is
// contiguous in G's shape, and as close to the float64 standard iteration as the transposing path
// (same operations, other product kernels: bf16/fp16 rounding differences only). The transposing
// path's result is contiguous in G's shape too (its last Q·X written as Xᵀ·Qᵀ). With a restart,
// R is formed twice from the own-layout X (and the transposing path's restart product keeps X
// in the NS layout).
TEST_F(Gpu, GramNsInOwnLayoutMatchesTransposingPath) {
  orthopt::OrthoOptions opt;
  opt.method = orthopt::OrthoMethod::Gram;
  orthopt::OrthoOptions ref_opt = opt;
  ref_opt.method = orthopt::OrthoMethod::Standard;
  ref_opt.compute_dtype = at::kDouble;
  for (auto restarts : {std::vector<int>{}, std::vector<int>{2}}) {
    opt.gram_restarts = restarts;
    for (auto shape : {std::vector<int64_t>{3, 512, 128}, {2, 1000, 200}}) {
      const at::Tensor G = spread(shape[0], shape[1], shape[2]).cuda();
      (void)orthopt::orthogonalize(G, opt);  // warm-up (algorithm choice)
      const at::Tensor own = orthopt::detail::orthogonalize_in_compute_dtype(G, opt);
      at::Tensor transposing;
      {
        orthopt::OrthoOptions transposing_opt = opt;
        transposing_opt.execution.gram_own_layout = orthopt::Toggle::Off;
        transposing = orthopt::detail::orthogonalize_in_compute_dtype(G, transposing_opt);
      }
      EXPECT_TRUE(own.is_contiguous());
      EXPECT_TRUE(transposing.is_contiguous());
      ASSERT_EQ(own.sizes(), G.sizes());
      ASSERT_EQ(transposing.sizes(), G.sizes());
      const at::Tensor ref = orthopt::orthogonalize(G.cpu().to(at::kDouble), ref_opt);
      const double e_own = rel_err(own, ref), e_tr = rel_err(transposing, ref);
      std::printf("gram own layout %s restarts %zu: rel err vs float64 %.3e, transposing path %.3e, between %.3e\n",
                  c10::str(at::IntArrayRef(shape)).c_str(), restarts.size(), e_own, e_tr, rel_err(own, transposing));
      EXPECT_LE(e_own, 1.5 * e_tr + 1e-3);
    }
  }
}

// Independent NS chains (each standard input, each Gram group) on the kernel library's side
// streams: every chain runs the same operations as on one stream, with the same product
// algorithms (chosen per shape), so the results are bit-identical to the one-stream run
// (side_streams = on forks every chain but the largest, off none).
TEST_F(Gpu, ChainsOnSideStreamsBitIdentical) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 128, 512}, {2, 512, 128}, {2, 128, 160}, {4, 96, 96},
                                                    {2, 256, 1024}};
  std::vector<at::Tensor> G3s;
  for (const auto& sh : shapes) G3s.push_back(spread(sh[0], sh[1], sh[2]).cuda());
  orthopt::OrthoOptions opt;  // auto: two Gram groups (m = 128, m = 256), two standard inputs
  auto run = [&](orthopt::Toggle streams) {
    orthopt::OrthoOptions o = opt;
    o.execution.side_streams = streams;
    return orthopt::detail::orthogonalize_many_in_compute_dtype(G3s, o);
  };
  (void)run(orthopt::Toggle::Off);  // warm-up: product algorithms chosen, side streams not yet used
  (void)run(orthopt::Toggle::On);   // warm-up of the side streams' cuBLAS handles
  const auto one = run(orthopt::Toggle::Off), forked = run(orthopt::Toggle::On);
  for (size_t i = 0; i < G3s.size(); ++i) {
    EXPECT_TRUE(at::equal(one[i], forked[i])) << "input " << i;
    EXPECT_EQ(one[i].strides(), forked[i].strides()) << "input " << i;
  }
}

// ---- the NS input/output kernel (orthopt_scale_cast) through its ATen glue and the engine

// The kernel against ATen's expression on the same GPU: bit for bit, every dtype pair, with and
// without the norm, transposed and not (the arithmetic is elementwise, so the layout does not
// change a value), ragged shapes.
TEST_F(Gpu, ScaleCastMatchesAtenBitForBit) {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const double safety = 1.02, eps = 1e-7;
  for (auto shape : {std::vector<int64_t>{3, 65, 33}, {2, 40, 128}, {1, 1, 7}}) {
    const at::Tensor x = at::randn(shape, cuda) + 0.01;  // never exactly zero in practice
    const at::Tensor norm = at::rand({shape[0], 1, 1}, cuda) * 10 + 0.1;
    for (auto din : {at::kFloat, at::kBFloat16, at::kHalf})
      for (auto dout : {at::kFloat, at::kBFloat16, at::kHalf})
        for (bool transpose : {false, true})
          for (bool scaled : {false, true}) {
            const at::Tensor in = x.to(din);
            at::Tensor ref = scaled ? (in.to(at::kFloat) / (norm * safety + eps)).to(dout) : in.to(dout);
            if (transpose) ref = ref.transpose(1, 2).contiguous();
            const at::Tensor got =
                orthopt::cuda::scale_cast(in, scaled ? norm : at::Tensor(), safety, eps, dout, transpose);
            EXPECT_EQ(got.sizes(), ref.sizes());
            EXPECT_TRUE(got.is_contiguous());
            EXPECT_TRUE(at::equal(got, ref)) << "in " << din << " out " << dout << " transpose " << transpose
                                             << " scaled " << scaled << " shape " << at::IntArrayRef(shape);
          }
  }
}

TEST_F(Gpu, ContiguousTransposesTransposedViews) {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor base = at::randn({3, 40, 72}, cuda).to(dt);
    for (const at::Tensor& t : {base.transpose(1, 2), base[1].t(), base.narrow(2, 0, 50)}) {
      const at::Tensor c = orthopt::cuda::contiguous(t);
      EXPECT_TRUE(c.is_contiguous());
      EXPECT_EQ(c.scalar_type(), dt);
      EXPECT_TRUE(at::equal(c, t.contiguous())) << dt << " " << t.sizes();
    }
  }
}

// cuda::cast (the NS result's conversion to the input dtype) against ATen's .to(): bit for bit
// and with the same strides, for contiguous tensors, transposed views of them (converted as
// stored), layouts it hands to ATen (a column slice), values beyond fp16's range (rounded to
// inf by both), and with the kernels switched off.
TEST_F(Gpu, CastMatchesAtenTo) {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::Tensor x = at::randn({3, 40, 72}, cuda) + 0.01;
  x.select(1, 5).mul_(4e4);  // one row past fp16's largest finite value (65504) in part
  for (auto din : {at::kFloat, at::kBFloat16, at::kHalf})
    for (auto dout : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const at::Tensor base = x.to(din);
      for (const at::Tensor& t : {base, base.transpose(1, 2), base[1].t(), base.narrow(2, 0, 50), base.reshape({-1}),
                                  base.narrow(0, 1, 2).transpose(1, 2)})
        for (bool off : {false, true}) {
          std::optional<KernelsOff> kernels_off;
          if (off) kernels_off.emplace();
          const at::Tensor ref = t.to(dout), got = orthopt::cuda::cast(t, dout);
          EXPECT_EQ(got.scalar_type(), dout);
          EXPECT_EQ(got.sizes(), ref.sizes());
          EXPECT_EQ(got.strides(), ref.strides()) << din << " -> " << dout << " " << t.sizes();
          EXPECT_TRUE(at::equal(got, ref)) << din << " -> " << dout << " " << t.sizes() << " strides " << t.strides()
                                           << " kernels off " << off;
        }
    }
}

TEST_F(Gpu, ScaleCastArgumentErrorsNameTheArgument) {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({2, 8, 8}, cuda);
  auto error_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "";
  };
  using orthopt::cuda::scale_cast;
  EXPECT_NE(error_of([&] { scale_cast(x[0], at::Tensor(), 1, 0, at::kFloat, false); }).find("argument 'in'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { scale_cast(x.to(at::kDouble), at::Tensor(), 1, 0, at::kFloat, false); })
                .find("argument 'in'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { scale_cast(x, at::ones({3}, cuda), 1, 0, at::kFloat, false); }).find("argument 'norm'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { scale_cast(x, at::ones({2}, cuda.dtype(at::kHalf)), 1, 0, at::kFloat, false); })
                .find("argument 'norm'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { scale_cast(x, at::Tensor(), 1, 0, at::kDouble, false); }).find("argument 'out_dtype'"),
            std::string::npos);
  EXPECT_TRUE(orthopt::cuda::scale_cast_handles(x, at::kBFloat16));
  EXPECT_FALSE(orthopt::cuda::scale_cast_handles(x, at::kDouble));
  EXPECT_FALSE(orthopt::cuda::scale_cast_handles(x.to(at::kDouble), at::kFloat));
  EXPECT_FALSE(orthopt::cuda::scale_cast_handles(x.cpu(), at::kFloat));
  KernelsOff off;
  EXPECT_FALSE(orthopt::cuda::scale_cast_handles(x, at::kBFloat16));
}

// The engine with the kernel-prepared NS input vs the ATen reference path, NS in fp32 (both runs
// then use ATen's fp32 products, so only the input preparation differs). Wide matrices: the same
// fp32 norm and operations, bit-identical. Tall matrices: the kernel path takes the norm over the
// input as stored, the reference over its transposed copy (another reduction order), so the norm
// may differ in its last bit and the results by fp32 rounding only (measured ~1e-7 expected;
// bound 1e-5).
TEST_F(Gpu, KernelNsInputMatchesReferencePath) {
  orthopt::OrthoOptions opt;
  opt.compute_dtype = at::kFloat;
  for (auto shape : {std::vector<int64_t>{3, 96, 160}, {2, 160, 96}, {300, 200}, {64, 64}}) {
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const at::Tensor G = spread_shape(shape).to(dt).cuda();
      const at::Tensor ours = orthopt::orthogonalize(G, opt);
      at::Tensor ref;
      {
        KernelsOff off;
        ref = orthopt::orthogonalize(G, opt);
      }
      ASSERT_EQ(ours.sizes(), ref.sizes());
      EXPECT_EQ(ours.scalar_type(), dt);
      const bool tall = shape[shape.size() - 2] > shape.back();
      if (!tall) {
        EXPECT_TRUE(at::equal(ours, ref)) << "wide " << at::IntArrayRef(shape) << " " << dt;
      } else {
        const double err = rel_err(ours.to(at::kFloat), ref.to(at::kFloat));
        std::printf("tall %s %s: kernel NS input vs reference, fp32 NS: rel diff %.2e\n",
                    c10::str(at::IntArrayRef(shape)).c_str(), c10::toString(dt), err);
        EXPECT_LE(err, dt == at::kFloat ? 1e-5 : 4e-3);  // bf16: one bf16 rounding of the output at most
      }
    }
  }
}

// The internal entry point the fused optimizer step uses: the NS result in the compute dtype,
// G's shape, tall ones as transposed views; orthogonalize() with its last product kept in the
// compute dtype (direct_result=off) is exactly its cast.
TEST_F(Gpu, ResultInComputeDtype) {
  orthopt::OrthoOptions opt;
  opt.method = orthopt::OrthoMethod::Standard;
  for (auto shape : {std::vector<int64_t>{2, 160, 96}, {96, 160}}) {
    const at::Tensor G = spread_shape(shape).cuda();
    (void)orthopt::orthogonalize(G, opt);  // warm-up: the product kernels pick their algorithm on a first call
    const at::Tensor res = orthopt::detail::orthogonalize_in_compute_dtype(G, opt);
    EXPECT_EQ(res.scalar_type(), at::kBFloat16);
    EXPECT_EQ(res.sizes(), G.sizes());
    const bool tall = shape[shape.size() - 2] > shape.back();
    EXPECT_EQ(res.is_contiguous(), !tall);
    if (tall) {
      EXPECT_TRUE(res.transpose(-2, -1).is_contiguous());
    }
    EXPECT_TRUE(at::equal(res.to(at::kFloat), orthopt::orthogonalize(G, cast_after(opt))));
  }
}

// orthogonalize() of an fp32 G on the kernels' path: NS's last product writes fp32 itself
// (standard NS: (a·I + b·A + c·A·A)·X, a·I fused into the symmetric product; Gram NS: Q·X),
// instead of the compute dtype and a cast pass after it. Same dtype, shape and strides as the
// cast of the compute-dtype result; no bf16/fp16 rounding of the output, so about as close to
// the float64 iteration as that cast (whose error, ≈ 1e-2, is the iteration's; bound 1.1×).
// Between the two (standard NS, bf16): the off-diagonal entries of B and of a·I + B are the same
// bf16 numbers, so they differ by the rounding of B's diagonal, of the fused diagonal and of the
// cast's output, ≈ 1.6e-3 Frobenius-relative each (half an ulp of 2^-7, spread), ≈ 3e-3 together;
// bound 8e-3. Gram NS (fp16): the output rounding only.
TEST_F(Gpu, LastProductWritesCallersDtype) {
  for (auto method : {orthopt::OrthoMethod::Standard, orthopt::OrthoMethod::Gram}) {
    orthopt::OrthoOptions opt;
    opt.method = method;
    orthopt::OrthoOptions ref_opt = opt;
    ref_opt.method = orthopt::OrthoMethod::Standard;
    ref_opt.compute_dtype = at::kDouble;
    // wide and tall; Gram: m = 200 (own layout when tall) and m = 1100 (transposed, result
    // written back in the tall layout)
    for (auto shape : {std::vector<int64_t>{2, 200, 456}, {2, 456, 200}, {1100, 2400}, {2400, 1100}}) {
      const at::Tensor G = spread_shape(shape).cuda();
      (void)orthopt::orthogonalize(G, opt);  // warm-up (algorithm choice)
      const at::Tensor direct = orthopt::orthogonalize(G, opt);
      at::Tensor cast;
      cast = orthopt::orthogonalize(G, cast_after(opt));
      EXPECT_EQ(direct.scalar_type(), at::kFloat);
      EXPECT_EQ(direct.sizes(), G.sizes());
      EXPECT_EQ(direct.strides(), cast.strides()) << at::IntArrayRef(shape);
      const at::Tensor ref = orthopt::orthogonalize(G.cpu().to(at::kDouble), ref_opt);
      const double e_direct = rel_err(direct, ref), e_cast = rel_err(cast, ref), between = rel_err(direct, cast);
      std::printf("%s %s: rel err vs float64 %.3e direct, %.3e cast; between %.3e\n", orthopt::to_string(method),
                  c10::str(at::IntArrayRef(shape)).c_str(), e_direct, e_cast, between);
      EXPECT_LE(e_direct, 1.1 * e_cast);
      EXPECT_LE(between, 8e-3);
    }
  }
}

// The fused Muon step's entry point for several banks: Gram inputs sharing m after orientation
// run one Gram iteration (their m×m products as one batch). On the GPU the batched products may
// pick other cuBLAS algorithms for the larger batch than per input, so the results are not
// expected to be bit-identical to per-input calls (on the CPU they are: test_orthogonalize);
// each must be as close to the float64 standard iteration as the per-input result is, and have
// its dtype, shape and strides (tall ones as transposed views).
TEST_F(Gpu, ManyGramBanksMatchPerInput) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 128, 512}, {2, 512, 128}, {2, 128, 384}, {2, 128, 160}};
  std::vector<at::Tensor> G3s;
  for (const auto& sh : shapes) G3s.push_back(spread(sh[0], sh[1], sh[2]).cuda());
  orthopt::OrthoOptions opt;  // auto: fp16 Gram for the first three, bf16 standard for the last
  for (const auto& G : G3s) (void)orthopt::orthogonalize(G, opt);  // warm-up (algorithm choice)
  const auto many = orthopt::detail::orthogonalize_many_in_compute_dtype(G3s, opt);
  ASSERT_EQ(many.size(), G3s.size());
  orthopt::OrthoOptions ref_opt;
  ref_opt.method = orthopt::OrthoMethod::Standard;
  ref_opt.compute_dtype = at::kDouble;
  for (size_t i = 0; i < G3s.size(); ++i) {
    const at::Tensor single = orthopt::detail::orthogonalize_in_compute_dtype(G3s[i], opt);
    EXPECT_EQ(many[i].scalar_type(), single.scalar_type()) << i;
    EXPECT_EQ(many[i].sizes(), G3s[i].sizes()) << i;
    EXPECT_EQ(many[i].strides(), single.strides()) << i;
    const at::Tensor ref = orthopt::orthogonalize(G3s[i].cpu().to(at::kDouble), ref_opt);
    const double err_many = rel_err(many[i], ref), err_single = rel_err(single, ref);
    std::printf("input %zu %s: rel err vs float64 standard NS: many %.3e, per input %.3e, many vs per input %.3e\n",
                i, orthopt::to_string(orthopt::resolve_method(std::min(shapes[i][1], shapes[i][2]),
                                                              std::max(shapes[i][1], shapes[i][2]), opt)),
                err_many, err_single, rel_err(many[i], single));
    EXPECT_LE(err_many, 1.5 * err_single + 1e-3) << i;
  }
}

// NonFinitePolicy::Error (the default) on the kernels' path: G is flagged by the NS input's own
// norms instead of a separate isfinite pass over G. NaN and ±Inf entries are refused, naming
// G; finite entries whose squares overflow fp32 are not; a finite G gets the same result as
// with the check off, bit for bit (the same norms scale the input). Finite entries times 1e20
// (the fp32 sum of squares is Inf; the norms are taken again over G divided by a power of two,
// on the device): the same result with the check on and off (nonfinite=propagate, no host
// sync to find the overflow), as close to float64 NS of G as G's own result is (within twice
// its error: the polar factor does not depend on the scale, but bf16/fp16 NS rounds the two
// inputs differently), not zeros. Entries
// near the fp32 maximum, whose norm itself is beyond the fp32 range: the check still recomputes
// on G divided by a power of two (with the check off such inputs still scale to zeros).
TEST_F(Gpu, NonFiniteInputFlaggedByNorms) {
  auto refuses = [](const at::Tensor& B, const orthopt::OrthoOptions& o) {
    try {
      (void)orthopt::orthogonalize(B, o);
    } catch (const c10::Error& e) {
      return std::string(e.what()).find("argument 'G'") != std::string::npos;
    }
    return false;
  };
  for (auto method : {orthopt::OrthoMethod::Standard, orthopt::OrthoMethod::Gram}) {
    orthopt::OrthoOptions check;
    check.method = method;
    orthopt::OrthoOptions off = check;
    off.nonfinite = orthopt::NonFinitePolicy::Propagate;
    for (auto shape : {std::vector<int64_t>{3, 96, 160}, {3, 160, 96}}) {
      for (auto dt : {at::kFloat, at::kBFloat16}) {
        const at::Tensor G = spread_shape(shape).to(dt).cuda();
        EXPECT_TRUE(at::equal(orthopt::orthogonalize(G, check), orthopt::orthogonalize(G, off)));
        // A strided G (a transposed view): made contiguous once for both the norms and the input.
        const at::Tensor Gt = spread_shape({shape[0], shape[2], shape[1]}).to(dt).cuda().transpose(1, 2);
        EXPECT_FALSE(Gt.is_contiguous());
        EXPECT_TRUE(at::equal(orthopt::orthogonalize(Gt, check), orthopt::orthogonalize(Gt, off)));
        EXPECT_TRUE(at::equal(orthopt::orthogonalize(Gt, check), orthopt::orthogonalize(Gt.contiguous(), check)));
        for (float bad : {NAN, INFINITY, -INFINITY}) {
          at::Tensor B = G.clone();
          B[1][3][5] = bad;
          EXPECT_TRUE(refuses(B, check)) << bad << " " << at::IntArrayRef(shape) << " " << dt;
        }
        if (dt == at::kFloat) {
          const at::Tensor huge = G * 1e20;  // finite, ‖·‖² overflows fp32
          EXPECT_TRUE(at::isfinite(huge).all().item<bool>());
          EXPECT_TRUE(at::isinf(huge.square().sum()).item<bool>());
          at::Tensor checked;
          EXPECT_NO_THROW(checked = orthopt::orthogonalize(huge, check)) << at::IntArrayRef(shape);
          const at::Tensor propagated = orthopt::orthogonalize(huge, off);
          EXPECT_TRUE(at::equal(checked, propagated)) << at::IntArrayRef(shape);
          // Against float64 standard NS of G (the scale drops out): within the error G's own
          // result has (bf16/fp16 NS rounds the two inputs differently, so they differ by that
          // error, not by bf16 rounding); zeros would give 1.
          orthopt::OrthoOptions ref_opt;
          ref_opt.method = orthopt::OrthoMethod::Standard;
          ref_opt.compute_dtype = at::kDouble;
          const at::Tensor ref = orthopt::orthogonalize(G.cpu().to(at::kDouble), ref_opt);
          const double err_plain = rel_err(orthopt::orthogonalize(G, off), ref);
          const double err = rel_err(propagated, ref);
          std::printf("[ %s %s ] rel err vs float64: G %.3e, G*1e20 %.3e\n", orthopt::to_string(method),
                      shape[1] < shape[2] ? "wide" : "tall", err_plain, err);
          EXPECT_LE(err, 2 * err_plain + 5e-3) << at::IntArrayRef(shape) << " " << orthopt::to_string(method);
          const at::Tensor vast = G / G.abs().max() * 3e38;  // finite; ‖·‖ beyond fp32
          EXPECT_TRUE(at::isfinite(vast).all().item<bool>());
          at::Tensor vast_checked;
          EXPECT_NO_THROW(vast_checked = orthopt::orthogonalize(vast, check)) << at::IntArrayRef(shape);
          EXPECT_LE(rel_err(vast_checked, ref), 2 * err_plain + 5e-3)
              << at::IntArrayRef(shape) << " " << orthopt::to_string(method);
        }
      }
    }
  }
}

}  // namespace

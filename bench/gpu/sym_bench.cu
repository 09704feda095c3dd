// Kernel-level timings of the symmetric product D = A·Aᵀ (bf16, fp32 accumulation) on the
// shapes Newton–Schulz produces, against the dense cuBLAS product of the same operands in the
// same run: the dense product (peer) and every shipped path (the block path at two panel heights,
// the dense cuBLASLt path, the persistent Hopper kernel, AUTO). CUDA events, warm-up, median of
// repeats timed round-robin over the paths of a shape, random inputs. Prints a markdown table.
// The designs that do not ship, and the persistent kernels' epilogue probes: lab/sym.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../../kernels/src/internal.h"
#include "bench_check.h"

namespace {

// Median ms of each function, timed round-robin: after every function's warm-up, round r times
// each function once, starting at function r mod n. Clock and thermal drift over a shape's
// sequence, and the place in it, then fall on all of them alike (timed one after another, later
// columns read slower than the same path timed earlier: docs/gpu.md).
std::vector<double> interleaved_median_ms(const std::vector<std::function<void()>>& fns, int warmup, int repeats) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const size_t n = fns.size();
  for (const auto& fn : fns)
    for (int i = 0; i < warmup; ++i) fn();
  std::vector<std::vector<float>> ms(n);
  for (int r = 0; r < repeats; ++r) {
    for (size_t j = 0; j < n; ++j) {
      const size_t f = (j + static_cast<size_t>(r)) % n;
      CK(cudaEventRecord(a));
      fns[f]();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float t = 0;
      CK(cudaEventElapsedTime(&t, a, b));
      ms[f].push_back(t);
    }
  }
  CK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::vector<double> median(n);
  for (size_t f = 0; f < n; ++f) {
    std::sort(ms[f].begin(), ms[f].end());
    median[f] = ms[f][ms[f].size() / 2];
  }
  return median;
}

struct Shape { int64_t batch, m, k; };

// A table's header row and separator, one entry per column.
void print_table_head(const std::vector<std::string>& columns) {
  std::string head = "|", rule = "|";
  for (const auto& c : columns) {
    head += " " + c + " |";
    rule += "---|";
  }
  std::printf("%s\n%s\n", head.c_str(), rule.c_str());
}

// The operands of a shape's products: A [batch, m, k] (random, scaled like an NS input), D
// [batch, m, m], and with `with_c` a C like D (random; timing only, the kernels do not need a
// symmetric C); `dense` is the peer, cuBLAS's dense D = A·Aᵀ.
struct Operands {
  __nv_bfloat16 *A = nullptr, *C = nullptr, *D = nullptr;
  Operands(const Shape& s, bool with_c) {
    const size_t na = s.batch * s.m * s.k, nd = s.batch * s.m * s.m;
    CK(cudaMalloc(&A, na * 2));
    CK(cudaMalloc(&D, nd * 2));
    fill_uniform<<<1024, 256>>>(A, na, 17u, 2.0f / std::sqrt(static_cast<float>(s.k)));
    if (with_c) {
      CK(cudaMalloc(&C, nd * 2));
      fill_uniform<<<1024, 256>>>(C, nd, 29u, 1.0f);
    }
    CK(cudaGetLastError());
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;
  ~Operands() {
    cudaFree(A);
    cudaFree(C);
    cudaFree(D);
  }
  // D = A·Aᵀ (+ 0.5·C with with_c) by `path`, as a contender of interleaved_median_ms.
  std::function<void()> product(const Shape& s, orthopt_sym_path path, bool with_c = false) const {
    return [this, s, path, with_c] {
      CK(orthopt_sym_abt(ORTHOPT_BF16, s.batch, s.m, s.k, A, s.m * s.k, A, s.m * s.k, 1.0f, with_c ? C : nullptr,
                         s.m * s.m, with_c ? 0.5f : 0.0f, 0.0f, D, s.m * s.m, path, nullptr));
    };
  }
  void dense(cublasHandle_t h, const Shape& s) const {
    const float one = 1.0f, zero = 0.0f;
    CK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.m, s.m, s.k, &one, A, CUDA_R_16BF, s.k, s.m * s.k, A,
                                  CUDA_R_16BF, s.k, s.m * s.k, &zero, D, CUDA_R_16BF, s.m, s.m * s.m, s.batch,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes = {{1, 1024, 1024}, {1, 2048, 2048}, {1, 4096, 4096}, {1, 8192, 8192},
                               {1, 4096, 14336}, {16, 1536, 2048}, {16, 1536, 1536}, {128, 1536, 2048},
                               {32, 2048, 7168}, {32, 2048, 2048},
                               // the step's banks: GPT-2 124M (768-row, standard and Gram), Llama 1.26B
                               {12, 768, 768}, {12, 768, 3072}, {88, 2048, 2048}, {66, 2048, 5632},
                               // GPT-2's Gram iteration: the m×m products of its three Gram banks stacked
                               {24, 768, 768}, {36, 768, 768}, {48, 768, 768}};
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line per shape, also when stopped by a timeout
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  cublasHandle_t h;
  CK(cublasCreate(&h));
  int device = 0, major = 0, minor = 0;
  CK(cudaGetDevice(&device));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const bool hopper = major == 9 && minor == 0;  // the persistent kernel's devices
  // SYM_BENCH_SHAPE=i: only shape i (profiling one shape).
  const char* only = std::getenv("SYM_BENCH_SHAPE");
  if (only) shapes = {shapes.at(std::atoi(only))};
  print_table_head({"batch×m×k", "dense cuBLAS ms (peer)", "blocks b=512", "blocks b=1024", "dense cuBLASLt",
                    "persistent", "persistent +β·C", "AUTO", "AUTO +β·C", "AUTO path", "AUTO/peer", "peer TF/s",
                    "AUTO eff. TF/s"});
  for (const auto& s : shapes) {
    const Operands ops(s, /*with_c=*/true);
    __nv_bfloat16 *A = ops.A, *D = ops.D;
    auto dense = [&] { ops.dense(h, s); };
    auto blocks = [&](int64_t b) {
      return [&, b] {
        CK(orthopt_k::sym_abt_blocks(ORTHOPT_BF16, s.batch, s.m, s.k, A, s.m * s.k, A, s.m * s.k, 1.0f, nullptr, 0,
                                     0.0f, 0.0f, D, s.m * s.m, b, nullptr));
      };
    };
    auto path = [&](orthopt_sym_path p, bool with_c = false) { return ops.product(s, p, with_c); };
    std::vector<std::function<void()>> fns = {dense, blocks(512), blocks(1024), path(ORTHOPT_SYM_DENSE)};
    if (hopper) {
      fns.push_back(path(ORTHOPT_SYM_PERSISTENT));
      fns.push_back(path(ORTHOPT_SYM_PERSISTENT, true));
    }
    fns.push_back(path(ORTHOPT_SYM_AUTO));
    fns.push_back(path(ORTHOPT_SYM_AUTO, true));
    std::vector<double> t = interleaved_median_ms(fns, 3, repeats);
    if (!hopper) t.insert(t.begin() + 4, {NAN, NAN});  // no persistent kernel off Hopper
    const double t_dense = t[0], tauto = t[6];
    const double flops = 2.0 * s.batch * s.m * s.m * s.k;  // dense count
    std::printf("| %lldx%lldx%lld |", (long long)s.batch, (long long)s.m, (long long)s.k);
    for (int i = 0; i < 8; ++i) std::printf(" %.3f |", t[i]);
    std::printf(" %s | %.2f | %.0f | %.0f |\n", orthopt_k::sym_path_name(orthopt_k::auto_sym_path(s.batch, s.m, s.k)),
                tauto / t_dense, flops / t_dense * 1e-9, flops / tauto * 1e-9);
  }
  std::printf("ms: median of %d CUDA-event timings after 3 warm-ups, the paths of a shape timed round-robin; bf16; "
              "β·C with β = 0.5; AUTO path: the rule's choice (off Hopper its fallback runs); TF/s count the dense "
              "2·m²·k FLOPs.\n\n",
              repeats);

  // Rectangular products a·X + B·X / Q·X: ours (cuBLASLt, β·C epilogue from a separate C, as NS
  // uses it) vs cublasGemmStridedBatchedEx with β·C in place (at::baddbmm also copies C first;
  // the peer here is spared that copy).
  struct Rect { int64_t batch, m, n, k; };
  std::vector<Rect> rects = {{1, 4096, 4096, 4096}, {1, 8192, 8192, 8192}, {1, 4096, 14336, 4096},
                             {16, 1536, 2048, 1536}, {32, 2048, 7168, 2048}};
  std::printf("| batch×m×n×k (D = A·X + C) | cuBLAS ms (peer) | ours cuBLASLt ms | ours/peer | ours TF/s |\n|---|---|---|---|---|\n");
  for (const auto& r : rects) {
    __nv_bfloat16 *A, *X, *D, *C;
    CK(cudaMalloc(&C, r.batch * r.m * r.n * 2));
    CK(cudaMalloc(&A, r.batch * r.m * r.k * 2));
    CK(cudaMalloc(&X, r.batch * r.k * r.n * 2));
    CK(cudaMalloc(&D, r.batch * r.m * r.n * 2));
    fill_uniform<<<1024, 256>>>(A, r.batch * r.m * r.k, 5u, 0.05f);
    fill_uniform<<<1024, 256>>>(X, r.batch * r.k * r.n, 9u, 1.0f);
    fill_uniform<<<1024, 256>>>(D, r.batch * r.m * r.n, 3u, 1.0f);
    fill_uniform<<<1024, 256>>>(C, r.batch * r.m * r.n, 4u, 1.0f);
    const float one = 1.0f;
    auto peer = [&] {
      CK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, r.n, r.m, r.k, &one, X, CUDA_R_16BF, r.n,
                                    r.k * r.n, A, CUDA_R_16BF, r.k, r.m * r.k, &one, D, CUDA_R_16BF, r.n,
                                    r.m * r.n, r.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    auto ours = [&] {
      CK(orthopt_gemm(ORTHOPT_BF16, ORTHOPT_BF16, r.batch, r.m, r.n, r.k, A, r.m * r.k, 0, X, r.k * r.n, 0, 1.0f, C,
                      r.m * r.n, 1.0f, D, r.m * r.n, nullptr));
    };
    const std::vector<double> t = interleaved_median_ms({peer, ours}, 3, repeats);
    const double tp = t[0], to = t[1];
    const double flops = 2.0 * r.batch * r.m * r.n * r.k;
    std::printf("| %lldx%lldx%lldx%lld | %.3f | %.3f | %.2f | %.0f |\n", (long long)r.batch, (long long)r.m,
                (long long)r.n, (long long)r.k, tp, to, to / tp, flops / to * 1e-9);
    cudaFree(A);
    cudaFree(X);
    cudaFree(D);
    cudaFree(C);
  }
  return 0;
}

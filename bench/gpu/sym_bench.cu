// Kernel-level timings of the symmetric product D = A·Aᵀ (bf16, fp32 accumulation) on the
// shapes Newton–Schulz produces, against the dense cuBLAS product of the same operands in the
// same run: the dense product (peer), the block path at several panel heights, the native
// kernel, the wgmma kernels. CUDA events, warm-up, median of repeats timed round-robin over the
// paths of a shape, random inputs. Prints a markdown table.
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
// sequence, and the place in it, then fall on all of them alike: timed one after another, the
// later columns read 5–25% slower than the same path timed earlier (docs/gpu.md).
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

// A table row: the shape, then times in ms (3 decimals), then ratios (2 decimals).
void print_table_row(const Shape& s, const std::vector<double>& ms, const std::vector<double>& ratios = {}) {
  std::printf("| %lldx%lldx%lld |", (long long)s.batch, (long long)s.m, (long long)s.k);
  for (double v : ms) std::printf(" %.3f |", v);
  for (double v : ratios) std::printf(" %.2f |", v);
  std::printf("\n");
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
  // The epilogue probe `stores` of a persistent path, without C (sym_abt_wgmma_epilogue_probe;
  // D is wrong but for stores = 0).
  std::function<void()> probe(const Shape& s, orthopt_sym_path path, int stores) const {
    return [this, s, path, stores] {
      CK(orthopt_k::sym_abt_wgmma_epilogue_probe(path, stores, s.batch, s.m, s.k, A, s.m * s.k, A, s.m * s.k, 1.0f,
                                                 nullptr, 0, 0.0f, 0.0f, D, s.m * s.m, nullptr));
    };
  }
  void dense(cublasHandle_t h, const Shape& s) const {
    const float one = 1.0f, zero = 0.0f;
    CK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.m, s.m, s.k, &one, A, CUDA_R_16BF, s.k, s.m * s.k, A,
                                  CUDA_R_16BF, s.k, s.m * s.k, &zero, D, CUDA_R_16BF, s.m, s.m * s.m, s.batch,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
};

// The epilogue probe: the ping-pong and cooperative kernels (bf16, no C) timed with their
// full epilogue, with only the in-place half of each tile stored (no mirrored stores) and with
// no stores at all (sym_abt_wgmma_epilogue_probe: D is wrong in the last two; timing only),
// round-robin with the dense cuBLAS product of the same operands and the TMA-store kernels.
// Without stores ptxas drops the wgmmas too (their accumulators are never read), so that
// column times the operand loads through the ring alone: the kernel's load bound. The ratios
// say how close the TMA-store kernel is to ping-pong's load bound, and how much faster the
// cooperative kernel's 128×256 tiles (24 KiB per 128·128·64 instead of 32) load.
int epilogue_probe(cublasHandle_t h, const std::vector<Shape>& shapes, int repeats) {
  print_table_head({"batch×m×k", "dense cuBLAS ms", "pingpong", "pp in-place only", "pp loads only", "coop",
                    "coop in-place only", "coop loads only", "pp TMA-store epilogue", "pp TMA 1 buffer",
                    "pp TMA 1 buffer / pp loads only", "coop loads only / pp loads only"});
  for (const auto& s : shapes) {
    const Operands ops(s, /*with_c=*/false);
    auto dense = [&] { ops.dense(h, s); };
    auto probe = [&](orthopt_sym_path p, int stores) { return ops.probe(s, p, stores); };
    constexpr orthopt_sym_path PP = ORTHOPT_SYM_WGMMA_PINGPONG, CO = ORTHOPT_SYM_WGMMA_COOP;
    auto tma = [&](orthopt_sym_path p) { return ops.product(s, p); };
    const std::vector<double> t = interleaved_median_ms({dense, probe(PP, 0), probe(PP, 1), probe(PP, 2), probe(CO, 0),
                                                         probe(CO, 1), probe(CO, 2),
                                                         tma(ORTHOPT_SYM_WGMMA_PINGPONG_TMA),
                                                         tma(ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF)},
                                                        3, repeats);
    print_table_row(s, t, {t[8] / t[3], t[6] / t[3]});
  }
  std::printf("ms: median of %d CUDA-event timings after 3 warm-ups, round-robin; bf16, no C. The probe columns "
              "leave D wrong (timing only); 'loads only': no stores, and ptxas then drops the wgmmas too.\n",
              repeats);
  return 0;
}

// The cooperative m64n256 kernel against AUTO's one-buffer TMA-store ping-pong, with and without
// β·C, and both kernels' loads-only probes (ping-pong's, and the cooperative m64n128 kernel's,
// which loads the same 48 KiB stages), round-robin: the shorter table of SYM_BENCH_N256=1.
int coop_n256_table(cublasHandle_t h, const std::vector<Shape>& shapes, int repeats) {
  print_table_head({"batch×m×k", "dense cuBLAS ms", "pp TMA 1 buffer", "pp TMA 1 buffer +β·C", "coop", "coop n256",
                    "coop n256 +β·C", "pp loads only", "coop loads only", "n256 / pp TMA 1 buffer", "same, +β·C"});
  for (const auto& s : shapes) {
    const Operands ops(s, /*with_c=*/true);
    auto dense = [&] { ops.dense(h, s); };
    auto path = [&](orthopt_sym_path p, bool with_c = false) { return ops.product(s, p, with_c); };
    auto loads_only = [&](orthopt_sym_path p) { return ops.probe(s, p, 2); };
    const std::vector<double> t = interleaved_median_ms(
        {dense, path(ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF), path(ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF, true),
         path(ORTHOPT_SYM_WGMMA_COOP), path(ORTHOPT_SYM_WGMMA_COOP_N256), path(ORTHOPT_SYM_WGMMA_COOP_N256, true),
         loads_only(ORTHOPT_SYM_WGMMA_PINGPONG), loads_only(ORTHOPT_SYM_WGMMA_COOP)},
        3, repeats);
    print_table_row(s, t, {t[4] / t[1], t[5] / t[2]});
  }
  std::printf("ms: median of %d CUDA-event timings after 3 warm-ups, round-robin; bf16; β·C with β = 0.5. The "
              "loads-only columns leave D wrong (timing only).\n",
              repeats);
  return 0;
}

// The cooperative m64n256 kernel's pair orders (SYM_BENCH_N256=3): row-major against panels of
// 4, 8 (the default) and 16 block rows (ORTHOPT_SYM_PAIR_PANEL, set before each call; the
// library reads it at each call), round-robin in one process, without and with β·C.
int coop_n256_panel_table(cublasHandle_t h, const std::vector<Shape>& shapes, int repeats) {
  const std::vector<int> panels = {0, 4, 8, 16};
  print_table_head({"batch×m×k", "dense cuBLAS ms", "row-major", "panel 4", "panel 8", "panel 16", "row-major +β·C",
                    "panel 4 +β·C", "panel 8 +β·C", "panel 16 +β·C"});
  for (const auto& s : shapes) {
    const Operands ops(s, /*with_c=*/true);
    std::vector<std::function<void()>> fns = {[&] { ops.dense(h, s); }};
    for (bool with_c : {false, true})
      for (int p : panels) {
        const std::function<void()> product = ops.product(s, ORTHOPT_SYM_WGMMA_COOP_N256, with_c);
        fns.push_back([p, product] {
          setenv("ORTHOPT_SYM_PAIR_PANEL", std::to_string(p).c_str(), 1);
          product();
        });
      }
    const std::vector<double> t = interleaved_median_ms(fns, 3, repeats);
    print_table_row(s, t);
  }
  unsetenv("ORTHOPT_SYM_PAIR_PANEL");
  std::printf("ms: median of %d CUDA-event timings after 3 warm-ups, round-robin; bf16; β·C with β = 0.5.\n", repeats);
  return 0;
}

// Where the cooperative m64n256 kernel's time goes (SYM_BENCH_N256=2), round-robin, bf16, no C
// unless said: the product, then its probes (sym_abt_wgmma_epilogue_probe, D wrong): the
// in-place tiles only (no transposes), every tile staged in shared memory but no TMA store, the
// main loop alone (wgmmas, no epilogue), the operand loads alone. full − stage only: what the
// copy engine's stores and their waits add; stage only − main loop: staging and the warpgroups'
// meetings; main loop − loads only: what the tensor cores add to the operand stream. The "4
// stages" columns: the main loop alone and the loads alone through a ring one stage deeper than
// the product's (which has no room for it beside its tile buffers); "2 stages": the main loop
// through a ring one stage shallower (which would leave room for 128 KiB of staging). "producer
// stores": the product with the producer thread's stores (WGMMA_COOP_N256_PRODUCER_STORES).
int coop_n256_probe_table(cublasHandle_t h, const std::vector<Shape>& shapes, int repeats) {
  print_table_head({"batch×m×k", "dense cuBLAS ms", "n256", "n256 +β·C", "producer stores", "producer stores +β·C",
                    "n256 in-place only", "n256 stage only",
                    "n256 main loop", "n256 loads only", "main loop, 4 stages", "loads only, 4 stages",
                    "main loop, 2 stages", "full − stage only", "stage only − main loop",
                    "main loop − loads only"});
  for (const auto& s : shapes) {
    const Operands ops(s, /*with_c=*/true);
    auto dense = [&] { ops.dense(h, s); };
    auto full = [&](bool with_c) { return ops.product(s, ORTHOPT_SYM_WGMMA_COOP_N256, with_c); };
    auto probe = [&](int stores) { return ops.probe(s, ORTHOPT_SYM_WGMMA_COOP_N256, stores); };
    auto producer_stores = [&](bool with_c) {
      return ops.product(s, ORTHOPT_SYM_WGMMA_COOP_N256_PRODUCER_STORES, with_c);
    };
    const std::vector<double> t =
        interleaved_median_ms({dense, full(false), full(true), producer_stores(false), producer_stores(true), probe(1),
                               probe(3), probe(4), probe(2), probe(5), probe(6), probe(7)}, 3, repeats);
    std::vector<double> row = t;  // then the differences, in ms too
    row.insert(row.end(), {t[1] - t[6], t[6] - t[7], t[7] - t[8]});
    print_table_row(s, row);
  }
  std::printf("ms: median of %d CUDA-event timings after 3 warm-ups, round-robin; bf16; β·C with β = 0.5. The probe "
              "columns leave D wrong (timing only).\n",
              repeats);
  return 0;
}

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
  // SYM_BENCH_SHAPE=i: only shape i (profiling one shape; the probe's tables too).
  const char* only = std::getenv("SYM_BENCH_SHAPE");
  if (only) shapes = {shapes.at(std::atoi(only))};
  // SYM_BENCH_EPILOGUE=1: only the epilogue probe (what the persistent kernels' stores cost).
  if (const char* probe = std::getenv("SYM_BENCH_EPILOGUE"); probe && std::string(probe) == "1")
    return epilogue_probe(h, shapes, repeats);
  // SYM_BENCH_N256=1: only the cooperative m64n256 kernel's table.
  // SYM_BENCH_N256=2: where its time goes (its probes).
  if (const char* n256 = std::getenv("SYM_BENCH_N256"); n256 && std::string(n256) == "1")
    return coop_n256_table(h, shapes, repeats);
  else if (n256 && std::string(n256) == "2")
    return coop_n256_probe_table(h, shapes, repeats);
  else if (n256 && std::string(n256) == "3")  // its pair orders
    return coop_n256_panel_table(h, shapes, repeats);
  std::printf("| batch×m×k | dense cuBLAS ms (peer) | blocks b=512 | blocks b=1024 | native mma.sync | wgmma | wgmma pingpong | wgmma coop | pingpong +β·C | coop +β·C | wgmma pair | pair +β·C | wgmma wide | wide +β·C | pp TMA store | pp TMA +β·C | pp TMA 1 buf | pp TMA 1 buf +β·C | coop n256 | coop n256 +β·C | dense cuBLASLt | AUTO | AUTO path | AUTO/peer | peer TF/s | AUTO eff. TF/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
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
    const auto native = ops.product(s, ORTHOPT_SYM_NATIVE);
    auto path = [&](orthopt_sym_path p, bool with_c = false) { return ops.product(s, p, with_c); };
    const std::vector<double> t = interleaved_median_ms(
        {dense, blocks(512), blocks(1024), native, path(ORTHOPT_SYM_WGMMA), path(ORTHOPT_SYM_WGMMA_PINGPONG),
         path(ORTHOPT_SYM_WGMMA_COOP), path(ORTHOPT_SYM_WGMMA_PINGPONG, true), path(ORTHOPT_SYM_WGMMA_COOP, true),
         path(ORTHOPT_SYM_DENSE), path(ORTHOPT_SYM_AUTO), path(ORTHOPT_SYM_WGMMA_PAIR),
         path(ORTHOPT_SYM_WGMMA_PAIR, true), path(ORTHOPT_SYM_WGMMA_WIDE), path(ORTHOPT_SYM_WGMMA_WIDE, true),
         path(ORTHOPT_SYM_WGMMA_PINGPONG_TMA), path(ORTHOPT_SYM_WGMMA_PINGPONG_TMA, true),
         path(ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF), path(ORTHOPT_SYM_WGMMA_PINGPONG_TMA_1BUF, true),
         path(ORTHOPT_SYM_WGMMA_COOP_N256), path(ORTHOPT_SYM_WGMMA_COOP_N256, true)},
        3, repeats);
    const double t_dense = t[0], t512 = t[1], t1024 = t[2], tnat = t[3], twg = t[4], tpp = t[5], tco = t[6],
                 tppc = t[7], tcoc = t[8], tlt = t[9], tauto = t[10], tpair = t[11], tpairc = t[12], twide = t[13],
                 twidec = t[14], ttma = t[15], ttmac = t[16], ttma1 = t[17], ttma1c = t[18], tn256 = t[19], tn256c = t[20];
    const orthopt_sym_path ap = orthopt_k::auto_sym_path(s.batch, s.m, s.k);
    const double flops = 2.0 * s.batch * s.m * s.m * s.k;  // dense count
    const char* ap_name = orthopt_k::sym_path_name(ap);
    std::printf("| %lldx%lldx%lld | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f "
                "| %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s | %.2f | %.0f | %.0f |\n",
                (long long)s.batch, (long long)s.m, (long long)s.k, t_dense, t512, t1024, tnat, twg, tpp, tco, tppc, tcoc,
                tpair, tpairc, twide, twidec, ttma, ttmac, ttma1, ttma1c, tn256, tn256c, tlt, tauto, ap_name, tauto / t_dense, flops / t_dense * 1e-9,
                flops / tauto * 1e-9);
  }
  std::printf("pair kernel: %d clusters of 2 CTAs fit at once.\n", orthopt_k::sym_wgmma_pair_clusters());
  std::printf("ms: median of %d CUDA-event timings after 3 warm-ups, the paths of a shape timed round-robin; TF/s "
              "count the dense 2·m²·k FLOPs.\n\n",
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

// The symmetric-product designs of lab/sym (lab_sym.h), each checked against a float64 host
// reference and timed against cuBLAS's dense product and the shipped library (orthopt_sym_abt).
//   build/lab/lab_sym_designs [repeats] [--check-only | --no-check]
// Env: LAB_SYM_DESIGNS="pingpong coop ..." (design names; default: all), LAB_SYM_SHAPE=i (one
// shape of the timing list), LAB_SYM_TABLE=designs (default) | epilogue | n256 | n256-probes |
// panels: the epilogue probes of the persistent kernels, the cooperative m64n256 kernel against
// the one-buffer TMA ping-pong, where the m64n256 kernel's time goes (its probes), its pair
// orders. Probe columns leave D wrong on purpose (timing only). Exits 1 on a failed check, 77
// without a GPU.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lab_sym.h"
#include "orthopt/kernels/sym.h"
#include "bench_check.h"

using orthopt_lab::Design;

namespace {

#define LAB_CK(x)                                                                                    \
  do {                                                                                               \
    orthopt_status s_ = (x);                                                                         \
    if (s_ != ORTHOPT_OK) {                                                                          \
      std::printf("error at %s:%d: %s\n", __FILE__, __LINE__, orthopt_lab::lab_last_error());        \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

bool hopper() {
  int device = 0, major = 0, minor = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
         minor == 0;
}

std::vector<Design> chosen_designs() {
  std::vector<Design> out;
  const char* env = std::getenv("LAB_SYM_DESIGNS");
  for (Design d : orthopt_lab::kDesigns) {
    if (d != Design::Native && !hopper()) continue;  // the wgmma designs need compute capability 9.0
    if (!env) {
      out.push_back(d);
      continue;
    }
    std::istringstream names(env);
    std::string name;
    while (names >> name)
      if (name == orthopt_lab::design_name(d)) out.push_back(d);
  }
  return out;
}

// ---- Correctness: D against a float64 host reference of α·A·Bᵀ + β·C + diag·I ----

uint16_t to_bits(float v, orthopt_dtype dt) {
  uint16_t b;
  if (dt == ORTHOPT_BF16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    std::memcpy(&b, &h, 2);
  } else {
    const __half h = __float2half_rn(v);
    std::memcpy(&b, &h, 2);
  }
  return b;
}
double from_bits(uint16_t b, orthopt_dtype dt) {
  if (dt == ORTHOPT_BF16) {
    __nv_bfloat16 h;
    std::memcpy(&h, &b, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, &b, 2);
  return __half2float(h);
}

struct Buf {
  std::vector<uint16_t> host;
  uint16_t* dev = nullptr;
  explicit Buf(size_t n) : host(n) { CK(cudaMalloc(&dev, n * 2 + 16)); }
  ~Buf() { cudaFree(dev); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void upload() { CK(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice)); }
  void download() { CK(cudaMemcpy(host.data(), dev, host.size() * 2, cudaMemcpyDeviceToHost)); }
  void poison() { CK(cudaMemset(dev, 0xFF, host.size() * 2)); }  // NaN in bf16 and fp16
};

// Relative Frobenius error bound: one rounding of the result to the 16-bit type (bf16 2^-9, fp16
// 2^-12 relative per element; the Frobenius-relative error of a correctly rounded result sits
// near 0.6 of that), with 2x room; fp32 accumulation adds far less.
double bound(orthopt_dtype dt) { return dt == ORTHOPT_BF16 ? 4e-3 : 5e-4; }

int g_failures = 0;

void check(Design design, orthopt_dtype dt, int64_t batch, int64_t m, int64_t k, bool same_ab, bool with_c,
           std::mt19937& rng) {
  const float alpha = 1.25f, beta = with_c ? -0.75f : 0.0f, diag = 0.5f;
  Buf A(batch * m * k), B(batch * m * k), C(batch * m * m), D(batch * m * m);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(k));
  for (auto& v : A.host) v = to_bits(scale * normal(rng), dt);
  for (auto& v : B.host) v = to_bits(scale * normal(rng), dt);
  for (int64_t z = 0; z < batch; ++z)  // C symmetric, as the contract asks
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j <= i; ++j) C.host[(z * m + i) * m + j] = C.host[(z * m + j) * m + i] = to_bits(normal(rng), dt);
  A.upload();
  B.upload();
  C.upload();
  D.poison();
  const Buf& Bh = same_ab ? A : B;
  const orthopt_status st = orthopt_lab::sym_abt(design, dt, batch, m, k, A.dev, m * k, Bh.dev, m * k, alpha,
                                                 with_c ? C.dev : nullptr, m * m, beta, diag, D.dev, m * m, nullptr);
  const cudaError_t sync = cudaDeviceSynchronize();
  const char* dname = dt == ORTHOPT_BF16 ? "bf16" : "fp16";
  if (st != ORTHOPT_OK || sync != cudaSuccess) {
    std::printf("FAIL %-26s %s b=%lld m=%lld k=%lld: %s %s\n", orthopt_lab::design_name(design), dname,
                (long long)batch, (long long)m, (long long)k, orthopt_lab::lab_last_error(), cudaGetErrorString(sync));
    ++g_failures;
    if (sync != cudaSuccess) std::exit(1);  // the context is gone
    return;
  }
  D.download();
  // Rows split over the host's cores; the lower triangle is compared with the reference and the
  // upper one must equal it bit for bit (every design mirrors).
  const int64_t rows = batch * m;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<double> num(threads, 0.0), den(threads, 0.0);
  std::vector<char> finite(threads, 1), symmetric(threads, 1);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t row = t; row < rows; row += threads) {
        const int64_t z = row / m, i = row % m;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += from_bits(A.host[(z * m + i) * k + p], dt) * from_bits(Bh.host[(z * m + j) * k + p], dt);
          const double ref = alpha * s + (with_c ? beta * from_bits(C.host[(z * m + i) * m + j], dt) : 0.0) +
                             (i == j ? diag : 0.0);
          const uint16_t lo = D.host[(z * m + i) * m + j], up = D.host[(z * m + j) * m + i];
          const double got = from_bits(lo, dt);
          finite[t] &= std::isfinite(got) && std::isfinite(from_bits(up, dt));
          symmetric[t] &= lo == up;
          const double w = i == j ? 1.0 : 2.0;
          num[t] += w * (got - ref) * (got - ref);
          den[t] += w * ref * ref;
        }
      }
    });
  for (auto& th : pool) th.join();
  double n = 0, d = 0;
  bool fin = true, sym = true;
  for (unsigned t = 0; t < threads; ++t) {
    n += num[t];
    d += den[t];
    fin &= finite[t] != 0;
    sym &= symmetric[t] != 0;
  }
  const double err = std::sqrt(n / d);
  const bool ok = fin && sym && err <= bound(dt);
  if (!ok) ++g_failures;
  std::printf("%s %-26s %s batch=%-2lld m=%-4lld k=%-4lld %s%s rel_err=%.2e (bound %.0e)%s%s\n", ok ? "ok  " : "FAIL",
              orthopt_lab::design_name(design), dname, (long long)batch, (long long)m, (long long)k,
              same_ab ? "A·Aᵀ" : "A·Bᵀ", with_c ? "+βC" : "   ", err, bound(dt), fin ? "" : " NON-FINITE/UNWRITTEN",
              sym ? "" : " NOT-SYMMETRIC");
}

void check_all(const std::vector<Design>& designs) {
  std::mt19937 rng(1234);
  for (orthopt_dtype dt : {ORTHOPT_BF16, ORTHOPT_FP16})
    for (Design d : designs) {
      check(d, dt, 1, 200, 72, true, false, rng);    // ragged tiles
      check(d, dt, 2, 136, 584, false, true, rng);   // the ring wraps
      check(d, dt, 3, 256, 64, false, true, rng);    // batched, A ≠ B, β·C
      check(d, dt, 1, 201, 96, false, false, rng);   // odd m (the m64n256 kernels hand over to ping-pong)
      check(d, dt, 2, 300, 136, true, true, rng);    // 3 block rows, tiles past m
      check(d, dt, 48, 264, 64, true, true, rng);    // several tiles per CTA
      check(d, dt, 48, 264, 200, false, true, rng);  // several k-steps and tiles per CTA
      check(d, dt, 3, 512, 328, true, true, rng);    // pairs sharing A and down column 0
      check(d, dt, 2, 904, 136, false, true, rng);   // 8 block rows, ragged
      check(d, dt, 64, 512, 64, false, true, rng);   // 2-3 blocks per CTA, one k-step each
    }
}

// ---- Timing ----

// Median ms of each function, timed round-robin (round r starts at function r mod n), after
// every function's warm-up: drift over a shape's sequence falls on all of them alike.
std::vector<double> interleaved_median_ms(const std::vector<std::function<void()>>& fns, int warmup, int repeats) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const size_t n = fns.size();
  for (const auto& fn : fns)
    for (int i = 0; i < warmup; ++i) fn();
  std::vector<std::vector<float>> ms(n);
  for (int r = 0; r < repeats; ++r)
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

struct Shape {
  int64_t batch, m, k;
};

void print_head(const std::vector<std::string>& columns) {
  std::string head = "| batch×m×k |", rule = "|---|";
  for (const auto& c : columns) {
    head += " " + c + " |";
    rule += "---|";
  }
  std::printf("%s\n%s\n", head.c_str(), rule.c_str());
}
void print_row(const Shape& s, const std::vector<double>& ms) {
  std::printf("| %lldx%lldx%lld |", (long long)s.batch, (long long)s.m, (long long)s.k);
  for (double v : ms) std::printf(" %.3f |", v);
  std::printf("\n");
}

// A [batch, m, k] random bf16 (scaled like an NS input), D [batch, m, m], C like D.
struct Operands {
  __nv_bfloat16 *A = nullptr, *C = nullptr, *D = nullptr;
  Shape s;
  explicit Operands(const Shape& shape) : s(shape) {
    const size_t na = s.batch * s.m * s.k, nd = s.batch * s.m * s.m;
    CK(cudaMalloc(&A, na * 2));
    CK(cudaMalloc(&D, nd * 2));
    CK(cudaMalloc(&C, nd * 2));
    fill_uniform<<<1024, 256>>>(A, na, 17u, 2.0f / std::sqrt(static_cast<float>(s.k)));
    fill_uniform<<<1024, 256>>>(C, nd, 29u, 1.0f);
    CK(cudaGetLastError());
  }
  ~Operands() {
    cudaFree(A);
    cudaFree(C);
    cudaFree(D);
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;
  std::function<void()> design(Design d, bool with_c = false) const {
    return [this, d, with_c] {
      LAB_CK(orthopt_lab::sym_abt(d, ORTHOPT_BF16, s.batch, s.m, s.k, A, s.m * s.k, A, s.m * s.k, 1.0f,
                                  with_c ? C : nullptr, s.m * s.m, with_c ? 0.5f : 0.0f, 0.0f, D, s.m * s.m, nullptr));
    };
  }
  std::function<void()> probe(Design d, int stores) const {
    return [this, d, stores] {
      LAB_CK(orthopt_lab::sym_epilogue_probe(d, stores, s.batch, s.m, s.k, A, s.m * s.k, A, s.m * s.k, 1.0f, nullptr,
                                             0, 0.0f, 0.0f, D, s.m * s.m, nullptr));
    };
  }
  // The shipped library's path (AUTO, PERSISTENT, ...).
  std::function<void()> shipped(orthopt_sym_path p, bool with_c = false) const {
    return [this, p, with_c] {
      CK(orthopt_sym_abt(ORTHOPT_BF16, s.batch, s.m, s.k, A, s.m * s.k, A, s.m * s.k, 1.0f, with_c ? C : nullptr,
                         s.m * s.m, with_c ? 0.5f : 0.0f, 0.0f, D, s.m * s.m, p, nullptr));
    };
  }
  std::function<void()> dense(cublasHandle_t h) const {
    return [this, h] {
      const float one = 1.0f, zero = 0.0f;
      CK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.m, s.m, s.k, &one, A, CUDA_R_16BF, s.k, s.m * s.k,
                                    A, CUDA_R_16BF, s.k, s.m * s.k, &zero, D, CUDA_R_16BF, s.m, s.m * s.m, s.batch,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
  }
};

// Every design without and with β·C, next to cuBLAS's dense product and the shipped AUTO.
void designs_table(cublasHandle_t h, const std::vector<Shape>& shapes, const std::vector<Design>& designs,
                   int repeats) {
  std::vector<std::string> cols = {"dense cuBLAS ms", "shipped AUTO", "shipped AUTO +β·C"};
  for (Design d : designs) {
    cols.push_back(orthopt_lab::design_name(d));
    cols.push_back(std::string(orthopt_lab::design_name(d)) + " +β·C");
  }
  print_head(cols);
  for (const auto& s : shapes) {
    const Operands ops(s);
    std::vector<std::function<void()>> fns = {ops.dense(h), ops.shipped(ORTHOPT_SYM_AUTO),
                                              ops.shipped(ORTHOPT_SYM_AUTO, true)};
    for (Design d : designs) {
      fns.push_back(ops.design(d));
      fns.push_back(ops.design(d, true));
    }
    print_row(s, interleaved_median_ms(fns, 3, repeats));
  }
}

// The persistent kernels' epilogue probes (bf16, no C): full epilogue, in-place half only, no
// stores (ptxas then drops the wgmmas: the operand loads alone), with the TMA-store ping-pongs.
void epilogue_table(cublasHandle_t h, const std::vector<Shape>& shapes, int repeats) {
  print_head({"dense cuBLAS ms", "pingpong", "pp in-place only", "pp loads only", "coop", "coop in-place only",
              "coop loads only", "pp TMA-store", "pp TMA 1 buffer"});
  for (const auto& s : shapes) {
    const Operands ops(s);
    print_row(s, interleaved_median_ms({ops.dense(h), ops.probe(Design::PingPong, 0), ops.probe(Design::PingPong, 1),
                                        ops.probe(Design::PingPong, 2), ops.probe(Design::Coop, 0),
                                        ops.probe(Design::Coop, 1), ops.probe(Design::Coop, 2),
                                        ops.design(Design::PingPongTma), ops.design(Design::PingPongTma1Buf)},
                                       3, repeats));
  }
}

// The cooperative m64n256 kernel against the one-buffer TMA ping-pong, with and without β·C, and
// the loads-only probes of ping-pong and of the cooperative m64n128 kernel (same 48 KiB stages).
void n256_table(cublasHandle_t h, const std::vector<Shape>& shapes, int repeats) {
  print_head({"dense cuBLAS ms", "pp TMA 1 buffer", "pp TMA 1 buffer +β·C", "coop", "coop n256", "coop n256 +β·C",
              "pp loads only", "coop loads only"});
  for (const auto& s : shapes) {
    const Operands ops(s);
    print_row(s, interleaved_median_ms({ops.dense(h), ops.design(Design::PingPongTma1Buf),
                                        ops.design(Design::PingPongTma1Buf, true), ops.design(Design::Coop),
                                        ops.design(Design::CoopN256), ops.design(Design::CoopN256, true),
                                        ops.probe(Design::PingPong, 2), ops.probe(Design::Coop, 2)},
                                       3, repeats));
  }
}

// Where the m64n256 kernel's time goes (bf16, no C unless said): the product (consumers' and
// producer's stores), then its probes: in-place tiles only, staged but not stored, the main loop
// alone, the loads alone, the main loop and loads through 4 stages, the main loop through 2.
void n256_probe_table(cublasHandle_t h, const std::vector<Shape>& shapes, int repeats) {
  print_head({"dense cuBLAS ms", "n256", "n256 +β·C", "producer stores", "producer stores +β·C", "in-place only",
              "stage only", "main loop", "loads only", "main loop, 4 stages", "loads only, 4 stages",
              "main loop, 2 stages"});
  for (const auto& s : shapes) {
    const Operands ops(s);
    const Design n = Design::CoopN256;
    print_row(s, interleaved_median_ms({ops.dense(h), ops.design(n), ops.design(n, true),
                                        ops.design(Design::CoopN256Producer),
                                        ops.design(Design::CoopN256Producer, true), ops.probe(n, 1), ops.probe(n, 3),
                                        ops.probe(n, 4), ops.probe(n, 2), ops.probe(n, 5), ops.probe(n, 6),
                                        ops.probe(n, 7)},
                                       3, repeats));
  }
}

// The m64n256 kernel's pair orders: row-major against panels of 4, 8 and 16 block rows.
void panel_table(cublasHandle_t h, const std::vector<Shape>& shapes, int repeats) {
  const std::vector<int> panels = {0, 4, 8, 16};
  print_head({"dense cuBLAS ms", "row-major", "panel 4", "panel 8", "panel 16", "row-major +β·C", "panel 4 +β·C",
              "panel 8 +β·C", "panel 16 +β·C"});
  for (const auto& s : shapes) {
    const Operands ops(s);
    std::vector<std::function<void()>> fns = {ops.dense(h)};
    for (bool with_c : {false, true})
      for (int p : panels) {
        const std::function<void()> product = ops.design(Design::CoopN256Producer, with_c);
        fns.push_back([p, product] {
          orthopt_lab::set_pair_panel(p);
          product();
        });
      }
    print_row(s, interleaved_median_ms(fns, 3, repeats));
  }
  orthopt_lab::set_pair_panel(8);
}

}  // namespace

int main(int argc, char** argv) {
  require_device("lab_sym_designs");
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int repeats = 20;
  bool do_check = true, do_time = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check-only") do_time = false;
    else if (arg == "--no-check") do_check = false;
    else if (std::atoi(arg.c_str()) > 0) repeats = std::atoi(arg.c_str());
    else {
      std::fprintf(stderr, "lab_sym_designs: unknown argument '%s' (repeats, --check-only, --no-check)\n", arg.c_str());
      return 2;
    }
  }
  const std::vector<Design> designs = chosen_designs();
  if (!hopper()) std::printf("not a compute capability 9.0 device: the native kernel only\n");
  if (do_check) {
    check_all(designs);
    std::printf("lab_sym_designs check: %s (%d failure%s)\n\n", g_failures ? "FAILED" : "passed", g_failures,
                g_failures == 1 ? "" : "s");
  }
  if (do_time) {
    std::vector<Shape> shapes = {{1, 2048, 2048},  {1, 4096, 4096},  {1, 8192, 8192},   {1, 4096, 14336},
                                 {16, 1536, 2048}, {32, 2048, 7168}, {88, 2048, 2048},  {66, 2048, 5632},
                                 {12, 768, 3072},  {36, 768, 768}};
    if (const char* only = std::getenv("LAB_SYM_SHAPE")) shapes = {shapes.at(std::atoi(only))};
    cublasHandle_t h;
    CK(cublasCreate(&h));
    const char* table_env = std::getenv("LAB_SYM_TABLE");
    const std::string table = table_env ? table_env : "designs";
    const bool needs_hopper = table != "designs";
    if (needs_hopper && !hopper()) {
      std::printf("LAB_SYM_TABLE=%s needs a compute capability 9.0 device\n", table.c_str());
      return 77;
    }
    if (table == "designs") designs_table(h, shapes, designs, repeats);
    else if (table == "epilogue") epilogue_table(h, shapes, repeats);
    else if (table == "n256") n256_table(h, shapes, repeats);
    else if (table == "n256-probes") n256_probe_table(h, shapes, repeats);
    else if (table == "panels") panel_table(h, shapes, repeats);
    else {
      std::fprintf(stderr, "lab_sym_designs: unknown LAB_SYM_TABLE '%s'\n", table.c_str());
      return 2;
    }
    if (hopper()) std::printf("pair kernel: %d clusters of 2 CTAs fit at once.\n", orthopt_lab::pair_clusters());
    std::printf("ms: median of %d CUDA-event timings after 3 warm-ups, round-robin per shape; bf16; β·C with "
                "β = 0.5; probe columns leave D wrong (timing only).\n",
                repeats);
    cublasDestroy(h);
  }
  return g_failures ? 1 : 0;
}

// Correctness of the CUDA kernel library against float64 references computed on the host,
// on random inputs, with outputs poisoned (NaN) before every call so that an unwritten element
// fails. Needs a GPU; exits 77 (skip) without one. `--quick` keeps sizes small for
// compute-sanitizer (memcheck / racecheck), see tests/gpu/run.sh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "orthopt_kernels.h"

namespace {

int g_failures = 0;

#define CHECK_CUDA(x)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// 16-bit storage and exact conversions through the CUDA host-side intrinsics.
uint16_t to_bits(float v, orthopt_dtype dt) {
  uint16_t b;
  if (dt == ORTHOPT_BF16) {
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    std::memcpy(&b, &h, 2);
  } else {
    __half h = __float2half_rn(v);
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
  explicit Buf(size_t n) : host(n) { CHECK_CUDA(cudaMalloc(&dev, n * 2 + 16)); }
  ~Buf() { cudaFree(dev); }
  void upload() { CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice)); }
  void download() { CHECK_CUDA(cudaMemcpy(host.data(), dev, host.size() * 2, cudaMemcpyDeviceToHost)); }
  void poison() { CHECK_CUDA(cudaMemset(dev, 0xFF, host.size() * 2)); }  // 0xFFFF is NaN in bf16 and fp16
  double at(size_t i, orthopt_dtype dt) const { return from_bits(host[i], dt); }
};

void fill_random(Buf& b, orthopt_dtype dt, std::mt19937& rng, double scale) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& v : b.host) v = to_bits(static_cast<float>(scale) * n(rng), dt);
}

// Symmetric random C (batch of m×m).
void fill_symmetric(Buf& b, orthopt_dtype dt, std::mt19937& rng, int64_t batch, int64_t m) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        uint16_t v = to_bits(n(rng), dt);
        b.host[z * m * m + i * m + j] = v;
        b.host[z * m * m + j * m + i] = v;
      }
}

const char* name(orthopt_dtype dt) { return dt == ORTHOPT_BF16 ? "bf16" : "fp16"; }
const char* name(orthopt_sym_path p) {
  return p == ORTHOPT_SYM_NATIVE ? "native" : (p == ORTHOPT_SYM_DENSE ? "dense" : "blocks");
}

// Relative error bound: the result is rounded once to the 16-bit type (bf16: 2^-9 relative per
// element, fp16: 2^-12); fp32 accumulation adds far less. Frobenius-relative errors of a
// correctly rounded result sit near 0.6 of those; the bounds leave 2x room over the maximum.
double bound(orthopt_dtype dt) { return dt == ORTHOPT_BF16 ? 4e-3 : 5e-4; }

void check_sym(orthopt_dtype dt, orthopt_sym_path path, int64_t batch, int64_t m, int64_t k, bool same_ab,
               bool with_c, std::mt19937& rng) {
  const float alpha = 1.25f, beta = with_c ? -0.75f : 0.0f, diag = 0.5f;
  // The dense path multiplies by B as stored when B != A: B must be square and symmetric there
  // (the contract), which makes A·B = A·Bᵀ; the other paths take any B.
  if (path == ORTHOPT_SYM_DENSE && !same_ab) k = m;
  Buf A(batch * m * k), B(batch * m * k), C(batch * m * m), D(batch * m * m);
  fill_random(A, dt, rng, 1.0 / std::sqrt(static_cast<double>(k)));
  if (path == ORTHOPT_SYM_DENSE && !same_ab)
    fill_symmetric(B, dt, rng, batch, m);
  else
    fill_random(B, dt, rng, 1.0 / std::sqrt(static_cast<double>(k)));
  fill_symmetric(C, dt, rng, batch, m);
  A.upload();
  B.upload();
  C.upload();
  D.poison();
  const Buf& Bh = same_ab ? A : B;
  orthopt_status st = orthopt_sym_abt(dt, batch, m, k, A.dev, m * k, Bh.dev, m * k, alpha, with_c ? C.dev : nullptr,
                                      m * m, beta, diag, D.dev, m * m, path, nullptr);
  cudaError_t sync = cudaDeviceSynchronize();
  if (st != ORTHOPT_OK || sync != cudaSuccess) {
    std::printf("FAIL sym %s %s b=%lld m=%lld k=%lld: %s %s\n", name(dt), name(path), (long long)batch, (long long)m,
                (long long)k, orthopt_last_error(), cudaGetErrorString(sync));
    ++g_failures;
    return;
  }
  D.download();
  double num = 0, den = 0;
  bool symmetric = true, finite = true;
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += A.at(z * m * k + i * k + p, dt) * Bh.at(z * m * k + j * k + p, dt);
        double ref = alpha * s + (with_c ? beta * C.at(z * m * m + i * m + j, dt) : 0.0) + (i == j ? diag : 0.0);
        const double lo = D.at(z * m * m + i * m + j, dt), up = D.at(z * m * m + j * m + i, dt);
        finite = finite && std::isfinite(lo) && std::isfinite(up);
        symmetric = symmetric && D.host[z * m * m + i * m + j] == D.host[z * m * m + j * m + i];
        const double w = i == j ? 1.0 : 2.0;  // both triangles
        num += w * (lo - ref) * (lo - ref);
        den += w * ref * ref;
      }
  const double err = std::sqrt(num / den);
  // BLOCKS and NATIVE mirror the lower triangle (bit-exact symmetry); DENSE computes both.
  const bool ok = finite && (symmetric || path == ORTHOPT_SYM_DENSE) && err <= bound(dt);
  if (!ok) ++g_failures;
  std::printf("%s sym %-4s %-6s batch=%-2lld m=%-5lld k=%-5lld %s%s rel_err=%.2e (bound %.0e)%s%s\n", ok ? "ok  " : "FAIL",
              name(dt), name(path), (long long)batch, (long long)m, (long long)k, same_ab ? "A·Aᵀ" : "A·Bᵀ",
              with_c ? "+βC" : "   ", err, bound(dt), finite ? "" : " NON-FINITE/UNWRITTEN",
              symmetric ? "" : (path == ORTHOPT_SYM_DENSE ? " (dense: symmetric up to rounding)" : " NOT-SYMMETRIC"));
}

void check_gemm(orthopt_dtype dt, int64_t batch, int64_t m, int64_t n, int64_t k, int c_mode, std::mt19937& rng) {
  // c_mode: 0 no C, 1 separate C, 2 C == D (in place)
  const float alpha = 0.75f, beta = c_mode ? 1.5f : 0.0f;
  Buf A(batch * m * k), X(batch * k * n), C(batch * m * n), D(batch * m * n);
  fill_random(A, dt, rng, 1.0 / std::sqrt(static_cast<double>(k)));
  fill_random(X, dt, rng, 1.0);
  fill_random(C, dt, rng, 1.0);
  A.upload();
  X.upload();
  C.upload();
  if (c_mode == 2) {
    D.host = C.host;
    D.upload();
  } else {
    D.poison();
  }
  const void* cptr = c_mode == 1 ? C.dev : (c_mode == 2 ? D.dev : nullptr);
  orthopt_status st = orthopt_gemm(dt, batch, m, n, k, A.dev, m * k, X.dev, k * n, alpha, cptr, m * n, beta, D.dev,
                                   m * n, nullptr);
  cudaError_t sync = cudaDeviceSynchronize();
  if (st != ORTHOPT_OK || sync != cudaSuccess) {
    std::printf("FAIL gemm: %s %s\n", orthopt_last_error(), cudaGetErrorString(sync));
    ++g_failures;
    return;
  }
  D.download();
  double num = 0, den = 0;
  bool finite = true;
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += A.at(z * m * k + i * k + p, dt) * X.at(z * k * n + p * n + j, dt);
        const double ref = alpha * s + (c_mode ? beta * C.at(z * m * n + i * n + j, dt) : 0.0);
        const double got = D.at(z * m * n + i * n + j, dt);
        finite = finite && std::isfinite(got);
        num += (got - ref) * (got - ref);
        den += ref * ref;
      }
  const double err = std::sqrt(num / den);
  const bool ok = finite && err <= bound(dt);
  if (!ok) ++g_failures;
  std::printf("%s gemm %-4s batch=%-2lld m=%-4lld n=%-4lld k=%-4lld C=%-8s rel_err=%.2e (bound %.0e)%s\n",
              ok ? "ok  " : "FAIL", name(dt), (long long)batch, (long long)m, (long long)n, (long long)k,
              c_mode == 0 ? "none" : (c_mode == 1 ? "separate" : "in-place"), err, bound(dt),
              finite ? "" : " NON-FINITE/UNWRITTEN");
}

void check_errors() {
  // Bad arguments come back as errors naming the argument, never a crash.
  orthopt_status st = orthopt_sym_abt(ORTHOPT_BF16, 1, 0, 8, nullptr, 0, nullptr, 0, 1, nullptr, 0, 0, 0, nullptr, 0,
                                      ORTHOPT_SYM_AUTO, nullptr);
  const bool ok1 = st == ORTHOPT_ERR_INVALID && std::strstr(orthopt_last_error(), "sizes") != nullptr;
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));
  st = orthopt_sym_abt(ORTHOPT_BF16, 1, 8, 12, p, 96, p, 96, 1, nullptr, 0, 0, 0,
                       static_cast<char*>(p) + 2048, 64, ORTHOPT_SYM_NATIVE, nullptr);
  const bool ok2 = st == ORTHOPT_ERR_INVALID && std::strstr(orthopt_last_error(), "divisible by 8") != nullptr;
  st = orthopt_sym_abt(ORTHOPT_BF16, 1, 8, 8, p, 64, p, 64, 1, nullptr, 0, 0, 0, p, 64, ORTHOPT_SYM_AUTO, nullptr);
  const bool ok3 = st == ORTHOPT_ERR_INVALID && std::strstr(orthopt_last_error(), "'D'") != nullptr;
  cudaFree(p);
  const bool ok = ok1 && ok2 && ok3;
  if (!ok) ++g_failures;
  std::printf("%s argument errors (%d %d %d)\n", ok ? "ok  " : "FAIL", ok1, ok2, ok3);
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("kernel_check: no CUDA device, skipped\n");
    return 77;
  }
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  std::mt19937 rng(1234);
  check_errors();
  for (orthopt_dtype dt : {ORTHOPT_BF16, ORTHOPT_FP16}) {
    for (orthopt_sym_path path : {ORTHOPT_SYM_BLOCKS, ORTHOPT_SYM_NATIVE, ORTHOPT_SYM_DENSE}) {
      check_sym(dt, path, 1, 200, 72, true, false, rng);    // ragged tiles, k not a multiple of 32
      check_sym(dt, path, 3, 256, 64, false, true, rng);    // batched, A≠B, β·C
      check_sym(dt, path, 2, 130, 40, true, true, rng);     // one row past a tile edge
      check_sym(dt, path, 1, 201, 96, false, false, rng);   // odd m
      if (!quick) {
        check_sym(dt, path, 1, 1000, 520, false, true, rng);  // several panels / many tiles, ragged
        check_sym(dt, path, 2, 768, 1024, true, false, rng);
      }
    }
    check_gemm(dt, 2, 96, 200, 72, 0, rng);
    check_gemm(dt, 1, 128, 136, 128, 1, rng);
    check_gemm(dt, 3, 64, 80, 64, 2, rng);
    if (!quick) check_gemm(dt, 2, 512, 1000, 512, 1, rng);
  }
  std::printf("kernel_check: %s (%d failure%s)\n", g_failures ? "FAILED" : "passed", g_failures,
              g_failures == 1 ? "" : "s");
  return g_failures ? 1 : 0;
}

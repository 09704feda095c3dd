// Correctness of the CUDA kernel library against float64 references computed on the host,
// on random inputs, with outputs poisoned (NaN) before every call so that an unwritten element
// fails. Covers the products (orthopt_sym_abt, orthopt_gemm), the multi-tensor elementwise
// kernels of the optimizer step (orthopt_multi_*, orthopt_normuon_factors, orthopt_dion3_take_rows) and the scaled cast/transpose of the
// Newton–Schulz input (orthopt_scale_cast, bit-exact against a host emulation). Needs a GPU;
// exits 77 (skip) without one.
// `--quick` keeps sizes small for compute-sanitizer (memcheck / racecheck), see tests/gpu/run.sh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "orthopt_kernels.h"
#include "../../kernels/src/internal.h"  // sym_path_name, kSymPaths, auto_sym_path

bool hopper();  // compute capability 9.0 (the persistent kernel's devices)

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

// A host array and its device copy (16 bytes of slack past the end).
template <typename E>
struct DeviceArray {
  std::vector<E> host;
  E* dev = nullptr;
  explicit DeviceArray(size_t n) : host(n) { CHECK_CUDA(cudaMalloc(&dev, n * sizeof(E) + 16)); }
  ~DeviceArray() { cudaFree(dev); }
  void upload() { CHECK_CUDA(cudaMemcpy(dev, host.data(), host.size() * sizeof(E), cudaMemcpyHostToDevice)); }
  void download() { CHECK_CUDA(cudaMemcpy(host.data(), dev, host.size() * sizeof(E), cudaMemcpyDeviceToHost)); }
  // All bits set: NaN in bf16, fp16 and fp32 alike.
  void poison() { CHECK_CUDA(cudaMemset(dev, 0xFF, host.size() * sizeof(E))); }
};

struct Buf : DeviceArray<uint16_t> {  // bf16 or fp16 storage
  using DeviceArray::DeviceArray;
  double at(size_t i, orthopt_dtype dt) const { return from_bits(host[i], dt); }
  // Every element decoded once, for the products' reference loops.
  std::vector<double> decoded(orthopt_dtype dt) const {
    std::vector<double> d(host.size());
    for (size_t i = 0; i < host.size(); ++i) d[i] = from_bits(host[i], dt);
    return d;
  }
};

// body(r) for every r in [0, rows), spread over the host's cores: the products' float64
// references (up to 10^9 multiply-adds a case) took the full check past five minutes on one
// core. Callers keep one result per row and sum them in row order afterwards, so what they
// print does not depend on the number of threads.
template <typename Body>
void for_each_row(int64_t rows, const Body& body) {
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 64);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t r = next.fetch_add(1); r < rows; r = next.fetch_add(1)) body(r);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < std::min(threads, rows); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

// One row's share of a relative Frobenius error, and whether its entries were finite (and,
// for the symmetric products, mirrored).
struct RowError {
  double num = 0, den = 0;
  bool finite = true, symmetric = true;
};

// The rows' shares summed in row order.
RowError sum_rows(const std::vector<RowError>& rows) {
  RowError all;
  for (const RowError& e : rows) {
    all.num += e.num;
    all.den += e.den;
    all.finite = all.finite && e.finite;
    all.symmetric = all.symmetric && e.symmetric;
  }
  return all;
}

using Buf32 = DeviceArray<float>;  // fp32 storage (orthopt_gemm's fp32 C and D)

void fill_random(Buf& b, orthopt_dtype dt, std::mt19937& rng, double scale) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& v : b.host) v = to_bits(static_cast<float>(scale) * n(rng), dt);
}

// Symmetric random C (batch of m×m), entries of standard deviation `scale`.
void fill_symmetric(Buf& b, orthopt_dtype dt, std::mt19937& rng, int64_t batch, int64_t m, float scale = 1.0f) {
  std::normal_distribution<float> n(0.0f, scale);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        uint16_t v = to_bits(n(rng), dt);
        b.host[z * m * m + i * m + j] = v;
        b.host[z * m * m + j * m + i] = v;
      }
}

const char* name(orthopt_dtype dt) { return dt == ORTHOPT_BF16 ? "bf16" : (dt == ORTHOPT_FP16 ? "fp16" : "fp32"); }
const char* name(orthopt_sym_path p) { return orthopt_k::sym_path_name(p); }

// The path a call takes: AUTO's choice (orthopt_sym_abt's rule, and its fallback where the
// persistent kernel cannot run: every operand here is aligned), else the path given.
orthopt_sym_path effective_path(orthopt_sym_path path, int64_t batch, int64_t m, int64_t k) {
  if (path != ORTHOPT_SYM_AUTO) return path;
  const orthopt_sym_path p = orthopt_k::auto_sym_path(batch, m, k);
  if (p != ORTHOPT_SYM_PERSISTENT || (hopper() && k % 8 == 0)) return p;
  return m >= 4096 || (m >= 2048 && k >= 3 * m) ? ORTHOPT_SYM_BLOCKS : ORTHOPT_SYM_DENSE;
}

// Relative error bound: the result is rounded once to the 16-bit type (bf16: 2^-9 relative per
// element, fp16: 2^-12); fp32 accumulation adds far less. Frobenius-relative errors of a
// correctly rounded result sit near 0.6 of those; the bounds leave 2x room over the maximum.
double bound(orthopt_dtype dt) { return dt == ORTHOPT_BF16 ? 4e-3 : 5e-4; }

// c_alias: C is not a buffer of its own but A (1) or B (2) as stored, as in the NS products
// b·A + c·A·A, Q·Z + a·Q and Z·RZ + a·RZ: k = m and that operand symmetric, its entries of
// deviation k^-1/4 so that β·C is as large as the product's entries (a C added from the wrong
// place, or not at all, is then far outside the bound).
void check_sym(orthopt_dtype dt, orthopt_sym_path path, int64_t batch, int64_t m, int64_t k, bool same_ab,
               bool with_c, std::mt19937& rng, int c_alias = 0) {
  if (c_alias) {
    k = m;
    with_c = true;
  }
  const float alpha = 1.25f, beta = with_c ? -0.75f : 0.0f, diag = 0.5f;
  // The dense path multiplies by B as stored when B != A: B must be square and symmetric there
  // (the contract), which makes A·B = A·Bᵀ; the other paths take any B.
  if (effective_path(path, batch, m, k) == ORTHOPT_SYM_DENSE && !same_ab) k = m;
  const bool dense = effective_path(path, batch, m, k) == ORTHOPT_SYM_DENSE;
  Buf A(batch * m * k), B(batch * m * k), C(batch * m * m), D(batch * m * m);
  const float alias_scale = static_cast<float>(std::pow(static_cast<double>(k), -0.25));
  if (c_alias == 1 || (c_alias == 2 && same_ab))
    fill_symmetric(A, dt, rng, batch, m, alias_scale);
  else
    fill_random(A, dt, rng, 1.0 / std::sqrt(static_cast<double>(k)));
  if (c_alias == 2 && !same_ab)
    fill_symmetric(B, dt, rng, batch, m, alias_scale);
  else if (dense && !same_ab)
    fill_symmetric(B, dt, rng, batch, m);
  else
    fill_random(B, dt, rng, 1.0 / std::sqrt(static_cast<double>(k)));
  const bool own_c = with_c && !c_alias;  // C's own buffer is read only then
  if (own_c) fill_symmetric(C, dt, rng, batch, m);
  A.upload();
  B.upload();
  if (own_c) C.upload();
  D.poison();
  const Buf& Bh = same_ab ? A : B;
  const Buf& Ch = c_alias == 1 ? A : (c_alias == 2 ? Bh : C);
  orthopt_status st = orthopt_sym_abt(dt, batch, m, k, A.dev, m * k, Bh.dev, m * k, alpha, with_c ? Ch.dev : nullptr,
                                      m * m, beta, diag, D.dev, m * m, path, nullptr);
  cudaError_t sync = cudaDeviceSynchronize();
  if (st != ORTHOPT_OK || sync != cudaSuccess) {
    std::printf("FAIL sym %s %s b=%lld m=%lld k=%lld: %s %s\n", name(dt), name(path), (long long)batch, (long long)m,
                (long long)k, orthopt_last_error(), cudaGetErrorString(sync));
    ++g_failures;
    return;
  }
  D.download();
  const std::vector<double> a = A.decoded(dt), b = Bh.decoded(dt), d = D.decoded(dt);
  const std::vector<double> c = with_c ? Ch.decoded(dt) : std::vector<double>();
  std::vector<RowError> rows(static_cast<size_t>(batch * m));
  for_each_row(batch * m, [&](int64_t row) {
    const int64_t z = row / m, i = row % m;
    RowError& e = rows[static_cast<size_t>(row)];
    const double* ai = a.data() + z * m * k + i * k;
    for (int64_t j = 0; j <= i; ++j) {
      const double* bj = b.data() + z * m * k + j * k;
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += ai[p] * bj[p];
      double ref = alpha * s + (with_c ? beta * c[z * m * m + i * m + j] : 0.0) + (i == j ? diag : 0.0);
      const double lo = d[z * m * m + i * m + j], up = d[z * m * m + j * m + i];
      e.finite = e.finite && std::isfinite(lo) && std::isfinite(up);
      e.symmetric = e.symmetric && D.host[z * m * m + i * m + j] == D.host[z * m * m + j * m + i];
      const double w = i == j ? 1.0 : 2.0;  // both triangles
      e.num += w * (lo - ref) * (lo - ref);
      e.den += w * ref * ref;
    }
  });
  const RowError all = sum_rows(rows);
  const bool finite = all.finite, symmetric = all.symmetric;
  const double err = std::sqrt(all.num / all.den);
  // BLOCKS and PERSISTENT mirror the lower triangle (bit-exact symmetry); DENSE computes both.
  const bool ok = finite && (symmetric || dense) && err <= bound(dt);
  if (!ok) ++g_failures;
  std::printf("%s sym %-4s %-6s batch=%-2lld m=%-5lld k=%-5lld %s%s%s rel_err=%.2e (bound %.0e)%s%s\n",
              ok ? "ok  " : "FAIL", name(dt), name(path), (long long)batch, (long long)m, (long long)k,
              same_ab ? "A·Aᵀ" : "A·Bᵀ", with_c ? "+βC" : "   ", c_alias == 1 ? " C=A" : (c_alias == 2 ? " C=B" : ""),
              err, bound(dt), finite ? "" : " NON-FINITE/UNWRITTEN",
              symmetric ? "" : (dense ? " (dense: symmetric up to rounding)" : " NOT-SYMMETRIC"));
}

void check_gemm(orthopt_dtype dt, int64_t batch, int64_t m, int64_t n, int64_t k, int c_mode, std::mt19937& rng,
                bool a_t = false, bool x_t = false, bool fp32_out = false) {
  // c_mode: 0 no C, 1 separate C, 2 C == D (in place); a_t: A stored [k, m]; x_t: X stored [n, k];
  // fp32_out: C and D in fp32 (out_dtype ORTHOPT_FP32), else in dt
  const float alpha = 0.75f, beta = c_mode ? 1.5f : 0.0f;
  const int64_t cd = batch * m * n;
  Buf A(batch * m * k), X(batch * k * n), C(fp32_out ? 0 : cd), D(fp32_out ? 0 : cd);
  Buf32 C32(fp32_out ? cd : 0), D32(fp32_out ? cd : 0);
  fill_random(A, dt, rng, 1.0 / std::sqrt(static_cast<double>(k)));
  fill_random(X, dt, rng, 1.0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (fp32_out)
    for (auto& v : C32.host) v = normal(rng);
  else
    fill_random(C, dt, rng, 1.0);
  auto c_at = [&](int64_t i) { return fp32_out ? static_cast<double>(C32.host[i]) : C.at(i, dt); };
  auto d_at = [&](int64_t i) { return fp32_out ? static_cast<double>(D32.host[i]) : D.at(i, dt); };
  A.upload();
  X.upload();
  fp32_out ? C32.upload() : C.upload();
  if (c_mode == 2) {
    D.host = C.host;
    D32.host = C32.host;
    fp32_out ? D32.upload() : D.upload();
  } else {
    fp32_out ? D32.poison() : D.poison();
  }
  void* const cdev = fp32_out ? static_cast<void*>(C32.dev) : static_cast<void*>(C.dev);
  void* const ddev = fp32_out ? static_cast<void*>(D32.dev) : static_cast<void*>(D.dev);
  const void* cptr = c_mode == 1 ? cdev : (c_mode == 2 ? ddev : nullptr);
  orthopt_status st = orthopt_gemm(dt, fp32_out ? ORTHOPT_FP32 : dt, batch, m, n, k, A.dev, m * k, a_t ? 1 : 0, X.dev,
                                   k * n, x_t ? 1 : 0, alpha, cptr, m * n, beta, ddev, m * n, nullptr);
  cudaError_t sync = cudaDeviceSynchronize();
  if (st != ORTHOPT_OK || sync != cudaSuccess) {
    std::printf("FAIL gemm: %s %s\n", orthopt_last_error(), cudaGetErrorString(sync));
    ++g_failures;
    return;
  }
  fp32_out ? D32.download() : D.download();
  const std::vector<double> a = A.decoded(dt), x = X.decoded(dt);
  std::vector<RowError> rows(static_cast<size_t>(batch * m));
  for_each_row(batch * m, [&](int64_t row) {
    const int64_t z = row / m, i = row % m;
    RowError& e = rows[static_cast<size_t>(row)];
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += a[z * m * k + (a_t ? p * m + i : i * k + p)] * x[z * k * n + (x_t ? j * k + p : p * n + j)];
      const double ref = alpha * s + (c_mode ? beta * c_at(z * m * n + i * n + j) : 0.0);
      const double got = d_at(z * m * n + i * n + j);
      e.finite = e.finite && std::isfinite(got);
      e.num += (got - ref) * (got - ref);
      e.den += ref * ref;
    }
  });
  const RowError all = sum_rows(rows);
  const bool finite = all.finite;
  const double err = std::sqrt(all.num / all.den);
  // fp32 out: no 16-bit rounding of the result, only fp32 accumulation and one fp32 rounding
  // (≈ 2^-24·sqrt(k) relative, < 2e-6 for k ≤ 1000); 1e-5 leaves room for split-k reductions.
  const double limit = fp32_out ? 1e-5 : bound(dt);
  const bool ok = finite && err <= limit;
  if (!ok) ++g_failures;
  std::printf("%s gemm %-4s→%-4s %s·%s batch=%-2lld m=%-4lld n=%-4lld k=%-4lld C=%-8s rel_err=%.2e (bound %.0e)%s\n",
              ok ? "ok  " : "FAIL", name(dt), name(fp32_out ? ORTHOPT_FP32 : dt), a_t ? "Aᵀ" : "A ", x_t ? "Xᵀ" : "X ",
              (long long)batch, (long long)m, (long long)n, (long long)k,
              c_mode == 0 ? "none" : (c_mode == 1 ? "separate" : "in-place"), err, limit,
              finite ? "" : " NON-FINITE/UNWRITTEN");
}

void check_errors() {
  // Bad arguments come back as errors naming the argument, never a crash.
  orthopt_status st = orthopt_sym_abt(ORTHOPT_BF16, 1, 0, 8, nullptr, 0, nullptr, 0, 1, nullptr, 0, 0, 0, nullptr, 0,
                                      ORTHOPT_SYM_AUTO, nullptr);
  const bool ok1 = st == ORTHOPT_ERR_INVALID && std::strstr(orthopt_last_error(), "sizes") != nullptr;
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));
  // The persistent kernel asked for where it cannot run: refused, saying why (k % 8 on a Hopper
  // GPU, the device elsewhere).
  st = orthopt_sym_abt(ORTHOPT_BF16, 1, 8, 12, p, 96, p, 96, 1, nullptr, 0, 0, 0,
                       static_cast<char*>(p) + 2048, 64, ORTHOPT_SYM_PERSISTENT, nullptr);
  const bool ok2 = st == ORTHOPT_ERR_INVALID &&
                   std::strstr(orthopt_last_error(), hopper() ? "divisible by 8" : "Hopper") != nullptr;
  st = orthopt_sym_abt(ORTHOPT_BF16, 1, 8, 8, p, 64, p, 64, 1, nullptr, 0, 0, 0, p, 64, ORTHOPT_SYM_AUTO, nullptr);
  const bool ok3 = st == ORTHOPT_ERR_INVALID && std::strstr(orthopt_last_error(), "'D'") != nullptr;
  cudaFree(p);
  // Side streams: an index out of range is refused naming it; a valid one is created once.
  cudaStream_t s0 = nullptr, s0_again = nullptr, s1 = nullptr;
  st = orthopt_side_stream(ORTHOPT_SIDE_STREAMS, &s0);
  const bool ok4 = st == ORTHOPT_ERR_INVALID && std::strstr(orthopt_last_error(), "'index'") != nullptr;
  const bool ok5 = orthopt_side_stream(0, &s0) == ORTHOPT_OK && orthopt_side_stream(0, &s0_again) == ORTHOPT_OK &&
                   orthopt_side_stream(1, &s1) == ORTHOPT_OK && s0 && s0 == s0_again && s1 != s0;
  // orthopt_gemm writes D in its inputs' dtype or fp32, nothing else.
  st = orthopt_gemm(ORTHOPT_BF16, ORTHOPT_FP16, 1, 8, 8, 8, &s0, 64, 0, &s0, 64, 0, 1, nullptr, 0, 0, &s0, 64,
                    nullptr);
  const bool ok6 = st == ORTHOPT_ERR_INVALID && std::strstr(orthopt_last_error(), "'out_dtype'") != nullptr;
  const bool ok = ok1 && ok2 && ok3 && ok4 && ok5 && ok6;
  if (!ok) ++g_failures;
  std::printf("%s argument errors (%d %d %d %d %d %d)\n", ok ? "ok  " : "FAIL", ok1, ok2, ok3, ok4, ok5, ok6);
}

// ---- multi-tensor elementwise kernels (orthopt_multi_*) against float64 references.
// Each list of tensors lives in one allocation, tensors back to back with kGap elements between
// them (odd offsets: the kernels may not assume alignment, and take their element-by-element
// path); the gaps must come back unchanged. With g_aligned_lists every tensor starts at a
// multiple of 8 elements instead (16 bytes or more: the vector path of the flat kernels).
// Outputs that are separate buffers are poisoned with NaN (0xFF bytes) before the call.

constexpr int64_t kGap = 3;
bool g_aligned_lists = false;
constexpr double kU32 = 1.0 / 16777216.0;  // 2^-24: fp32 rounding, relative

// Rounding of a result stored in dt, relative: one unit in the last place, twice the bound of
// round-to-nearest (fp32 2^-23, bf16 2^-7, fp16 2^-10); absolute floor: fp16 subnormals (2^-24,
// twice their rounding). The fp32 arithmetic before the store adds a few 2^-24 of the terms'
// magnitudes (the c·kU32·mag terms below: c counts the roundings, with room). An fp32
// emulation of the kernels stayed at or below 0.5 of these tolerances on 2M random elements.
double unit(orthopt_dtype dt) { return dt == ORTHOPT_FP32 ? 2 * kU32 : (dt == ORTHOPT_BF16 ? 1.0 / 128 : 1.0 / 1024); }
double floor_of(orthopt_dtype dt) { return dt == ORTHOPT_FP16 ? 1.0 / 16777216.0 : 1e-30; }
size_t esize(orthopt_dtype dt) { return dt == ORTHOPT_FP32 ? 4 : 2; }

double decode(const std::vector<unsigned char>& bytes, orthopt_dtype dt, int64_t e) {
  if (dt == ORTHOPT_FP32) {
    float f;
    std::memcpy(&f, bytes.data() + e * 4, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, bytes.data() + e * 2, 2);
  return from_bits(b, dt);
}

void encode(std::vector<unsigned char>& bytes, orthopt_dtype dt, int64_t e, float v) {
  if (dt == ORTHOPT_FP32) {
    std::memcpy(bytes.data() + e * 4, &v, 4);
    return;
  }
  const uint16_t b = to_bits(v, dt);
  std::memcpy(bytes.data() + e * 2, &b, 2);
}

struct List {
  orthopt_dtype dt;
  std::vector<int64_t> numel, offset;
  int64_t total = 0;
  std::vector<unsigned char> bytes;  // host mirror of the device bytes
  unsigned char* dev = nullptr;
  List(orthopt_dtype dt_, const std::vector<int64_t>& numel_) : dt(dt_), numel(numel_) {
    auto place = [](int64_t at) { return g_aligned_lists ? (at + 7) / 8 * 8 : at; };
    int64_t at = place(kGap);
    for (int64_t n : numel) {
      offset.push_back(at);
      at = place(at + n + kGap);
    }
    total = at;
    bytes.assign(total * esize(dt), 0);
    CHECK_CUDA(cudaMalloc(&dev, bytes.size()));
  }
  List(const List&) = delete;
  List& operator=(const List&) = delete;
  ~List() { cudaFree(dev); }
  std::vector<void*> ptrs_;  // desc()'s pointers
  double get(int64_t e) const { return decode(bytes, dt, e); }
  void set(int64_t e, double v) { encode(bytes, dt, e, static_cast<float>(v)); }
  void fill(std::mt19937& rng, double scale, bool positive = false) {
    std::normal_distribution<double> n(0.0, 1.0);
    for (int64_t e = 0; e < total; ++e) set(e, scale * (positive ? std::fabs(n(rng)) : n(rng)));
  }
  void upload() { CHECK_CUDA(cudaMemcpy(dev, bytes.data(), bytes.size(), cudaMemcpyHostToDevice)); }
  void download() { CHECK_CUDA(cudaMemcpy(bytes.data(), dev, bytes.size(), cudaMemcpyDeviceToHost)); }
  void poison() {
    std::fill(bytes.begin(), bytes.end(), 0xFF);
    upload();
  }
  std::vector<void*> ptrs() {
    std::vector<void*> p;
    for (int64_t o : offset) p.push_back(dev + o * esize(dt));
    return p;
  }
  // The list as the C API's descriptor (valid while this List lives); absent: data NULL.
  orthopt_tensor_list desc(bool present = true) {
    ptrs_ = ptrs();
    return {static_cast<int64_t>(numel.size()), numel.data(), present ? ptrs_.data() : nullptr, dt};
  }
  // Whether every gap element still holds its bytes of `before`.
  bool gaps_unchanged(const std::vector<unsigned char>& before) const {
    const size_t es = esize(dt);
    int64_t start = 0;
    for (size_t i = 0; i <= offset.size(); ++i) {
      const int64_t stop = i < offset.size() ? offset[i] : total;
      if (std::memcmp(bytes.data() + start * es, before.data() + start * es, (stop - start) * es) != 0) return false;
      if (i < offset.size()) start = offset[i] + numel[i];
    }
    return true;
  }
};

// A device scalar.
template <typename T>
struct DevScalar {
  T* dev = nullptr;
  explicit DevScalar(T v) {
    CHECK_CUDA(cudaMalloc(&dev, sizeof(T)));
    set(v);
  }
  ~DevScalar() { cudaFree(dev); }
  void set(T v) {  // complete before any stream reads it
    CHECK_CUDA(cudaMemcpy(dev, &v, sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
};

// keep flag: 0 none (NULL), 1 a device byte holding 1, 2 a device byte holding 0 (skip).
struct Keep {
  DevScalar<uint8_t> flag;
  int mode;
  explicit Keep(int m) : flag(m == 2 ? 0 : 1), mode(m) {}
  const uint8_t* ptr() const { return mode == 0 ? nullptr : flag.dev; }
};
const char* keep_name(int mode) { return mode == 0 ? "keep=none" : (mode == 1 ? "keep=1" : "keep=0 (skip)"); }

// Worst |got − ref| / tol over the elements; NaN (an unwritten output) counts as infinite.
struct Worst {
  double value = 0;
  void add(double got, double ref, double tol) {
    const double r = std::fabs(got - ref) / tol;
    if (!(r <= value)) value = std::isnan(r) ? INFINITY : r;
  }
};

std::vector<int64_t> sizes_basic() { return {1, 7, 256, 1000, 16384, 16385, 0, 50001, 3}; }  // chunk: 16384
std::vector<int64_t> sizes_many(int n) {  // more tensors than any table holds (at most 86)
  std::vector<int64_t> s;
  for (int i = 0; i < n; ++i) s.push_back(i % 17 == 5 ? 0 : (i * 37) % 300 + 1);
  return s;
}
std::vector<int64_t> sizes_large() { return {(int64_t(1) << 20) + 3, 300001, 5}; }

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// The step failed (error or launch failure) or skipped; prints and counts. Returns true on error.
bool call_failed(orthopt_status st, const char* what) {
  const cudaError_t sync = cudaDeviceSynchronize();
  if (st == ORTHOPT_OK && sync == cudaSuccess) return false;
  std::printf("FAIL %s: %s %s\n", what, st == ORTHOPT_OK ? "" : orthopt_last_error(), cudaGetErrorString(sync));
  ++g_failures;
  return true;
}

void report(bool ok, const char* kernel, const std::string& config, const std::vector<int64_t>& numel, double worst,
            bool gaps) {
  if (!ok) ++g_failures;
  std::printf("%s multi %-8s %-44s tensors=%-3zu elements=%-8lld %s worst err/tol=%.2f%s\n", ok ? "ok  " : "FAIL",
              kernel, config.c_str(), numel.size(), (long long)sum(numel), g_aligned_lists ? "aligned" : "odd    ",
              worst, gaps ? "" : " GAPS-OVERWRITTEN");
}

std::string dts(std::initializer_list<std::pair<const char*, orthopt_dtype>> l) {
  std::string s;
  for (const auto& [k, dt] : l) s += std::string(k) + "=" + name(dt) + " ";
  return s;
}

// fp64 reference of one momentum element with the tolerances of M_new (stored in dm) and of the
// orthogonalization input (stored in dout): both momentum checks judge by it.
struct MomentumRef {
  double m, m_tol, out, out_tol;
};
MomentumRef momentum_ref(double m, double g, double mu, double w, bool nesterov, orthopt_dtype dm,
                         orthopt_dtype dout) {
  const double m_ref = mu * m + w * g, mag = mu * std::fabs(m) + w * std::fabs(g);
  const double o_ref = nesterov ? w * g + mu * m_ref : m_ref;
  const double o_mag = nesterov ? w * std::fabs(g) + mu * mag : mag;
  return {m_ref, unit(dm) * std::fabs(m_ref) + 6 * kU32 * mag + floor_of(dm), o_ref,
          unit(dout) * std::fabs(o_ref) + 8 * kU32 * o_mag + floor_of(dout)};
}

// no_out: out == NULL (M ← μ·M + w·G only; the poisoned out buffers must stay untouched).
void check_momentum(const std::vector<int64_t>& numel, orthopt_dtype dm, orthopt_dtype dg, orthopt_dtype dout,
                    bool nesterov, bool ema, int keep_mode, std::mt19937& rng, bool no_out = false) {
  const double mu = 0.95, w = ema ? 1.0 - mu : 1.0;
  List M(dm, numel), G(dg, numel), O(dout, numel);
  M.fill(rng, 1.0);
  G.fill(rng, 1.0);
  if (keep_mode == 2) G.set(G.offset[0], NAN);  // a skipped step must not care
  M.upload();
  G.upload();
  O.poison();
  const auto M0 = M.bytes, O0 = O.bytes;
  const Keep keep(keep_mode);
  const orthopt_status st =
      orthopt_multi_momentum(M.desc(), G.desc(), O.desc(!no_out), {mu, w, nesterov ? 1 : 0}, keep.ptr(), nullptr);
  if (call_failed(st, "multi momentum")) return;
  M.download();
  O.download();
  const std::string config = dts({{"M", dm}, {"G", dg}, {"out", dout}}) + (nesterov ? "nesterov " : "") +
                             (ema ? "ema " : "") + (no_out ? "out=NULL " : "") + keep_name(keep_mode);
  if (keep_mode == 2) {
    report(M.bytes == M0 && O.bytes == O0, "momentum", config, numel, 0.0, true);
    return;
  }
  Worst worst;
  for (size_t i = 0; i < numel.size(); ++i)
    for (int64_t e = M.offset[i]; e < M.offset[i] + numel[i]; ++e) {
      const MomentumRef r = momentum_ref(decode(M0, dm, e), G.get(e), mu, w, nesterov, dm, dout);
      worst.add(M.get(e), r.m, r.m_tol);
      if (no_out) continue;
      worst.add(O.get(e), r.out, r.out_tol);
    }
  const bool gaps = M.gaps_unchanged(M0) && O.gaps_unchanged(O0) && (!no_out || O.bytes == O0);
  report(worst.value <= 1.0 && gaps, "momentum", config, numel, worst.value, gaps);
}

// orthopt_multi_momentum_rows: tensors of R_j rows of cols; M and out as check_momentum, and
// each row's statistic (L1 of M_new, or the sum of squares of out) against the fp64 value with
// the bound of an fp32 sum of cols terms plus the rounding of the terms themselves (and, for
// L1, of the score to M's dtype). Skipped: M untouched, out exactly zero (a finite NS input
// for the folded update), the statistic of the unchanged M (L1) or 0.
void check_momentum_rows(const std::vector<int64_t>& R, int64_t cols, orthopt_dtype dm, orthopt_dtype dg,
                         orthopt_dtype dout, orthopt_row_stat stat, bool nesterov, double mu, double w, int keep_mode,
                         std::mt19937& rng, bool no_out = false) {
  const bool l1 = stat == ORTHOPT_ROW_L1_MOMENTUM, skip = keep_mode == 2;
  if (l1) no_out = true;
  std::vector<int64_t> numel;
  for (int64_t r : R) numel.push_back(r * cols);
  List M(dm, numel), G(dg, numel), O(dout, numel), S(ORTHOPT_FP32, R);
  M.fill(rng, 1.0);
  G.fill(rng, 1.0);
  if (skip) G.set(G.offset[0], NAN);  // a skipped step must not read G
  M.upload();
  G.upload();
  O.poison();
  S.poison();
  const auto M0 = M.bytes, O0 = O.bytes, S0 = S.bytes;
  const Keep keep(keep_mode);
  const orthopt_status st = orthopt_multi_momentum_rows(M.desc(), G.desc(), O.desc(!no_out), S.desc(), cols,
                                                        {mu, w, nesterov ? 1 : 0}, stat, keep.ptr(), nullptr);
  if (call_failed(st, "multi momentum_rows")) return;
  M.download();
  O.download();
  S.download();
  const std::string config = dts({{"M", dm}, {"G", dg}}) + (no_out ? "out=NULL " : dts({{"out", dout}})) +
                             (l1 ? "stat=L1(M) " : "stat=sumsq(out) ") + (nesterov ? "nesterov " : "") +
                             "cols=" + std::to_string(cols) + " mu=" + std::to_string(mu).substr(0, 4) + " " +
                             keep_name(keep_mode);
  const orthopt_dtype dterm = no_out ? ORTHOPT_FP32 : dout;  // the dtype of the summed out values
  Worst worst;
  for (size_t j = 0; j < R.size(); ++j)
    for (int64_t row = 0; row < R[j]; ++row) {
      double stat_ref = 0, tol = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t e = M.offset[j] + row * cols + c;
        const double m = decode(M0, dm, e);
        if (skip) {
          stat_ref += l1 ? std::fabs(m) : 0.0;
          if (!no_out && O.get(e) != 0.0) worst.value = INFINITY;  // poisoned or stale: not zeroed
          continue;
        }
        const MomentumRef r = momentum_ref(m, G.get(e), mu, w, nesterov, dm, dterm);
        worst.add(M.get(e), r.m, r.m_tol);
        if (l1) {
          stat_ref += std::fabs(r.m);
          tol += r.m_tol;
          continue;
        }
        if (!no_out) worst.add(O.get(e), r.out, r.out_tol);
        stat_ref += r.out * r.out;
        tol += 2 * std::fabs(r.out) * r.out_tol + r.out_tol * r.out_tol + kU32 * r.out * r.out;  // the term, squared
      }
      tol += static_cast<double>(cols) * kU32 * stat_ref;  // the fp32 sum
      if (l1) tol += unit(dm) * stat_ref;                  // the score in M's dtype
      worst.add(S.get(S.offset[j] + row), stat_ref, tol + 1e-30);
    }
  const bool gaps = M.gaps_unchanged(M0) && O.gaps_unchanged(O0) && S.gaps_unchanged(S0) &&
                    (!skip || M.bytes == M0) && (!no_out || O.bytes == O0);
  report(worst.value <= 1.0 && gaps, "momentum_rows", config, numel, worst.value, gaps);
}

// fp64 reference of the decoupled update (update_math.cpp: decoupled_update); flip inverts the
// cautious mask (for a direction whose sign is within rounding of zero).
double decoupled_ref(double w, double d, double lr, double wd, double factor, bool cautious, bool flip = false) {
  const bool mask = (w * d >= 0) != flip;
  const double decayed = wd == 0.0 ? w : (cautious ? (mask ? w - w * lr * wd : w) : w * (1.0 - lr * wd));
  return decayed - lr * factor * d;
}

// Checks the parameter copy: exactly the rounding of the fp32 W the kernel wrote (W fp32), or
// within the copy's rounding of the reference.
void check_copy(const List& P, const List& W, int64_t e, double w_ref, double tol32, Worst& worst) {
  if (W.dt == ORTHOPT_FP32) {
    std::vector<unsigned char> expect(esize(P.dt));
    encode(expect, P.dt, 0, static_cast<float>(W.get(e)));
    const bool same = std::memcmp(expect.data(), P.bytes.data() + e * esize(P.dt), esize(P.dt)) == 0;
    worst.add(same ? 0.0 : INFINITY, 0.0, 1.0);
  } else {
    worst.add(P.get(e), w_ref, unit(P.dt) * std::fabs(w_ref) + unit(W.dt) * std::fabs(w_ref) + tol32);
  }
}

// The frame both update checks share: W and a direction D filled at random (D poisoned with a
// NaN when the step is to be skipped), the copy P poisoned; then every element judged against
// decoupled_ref, the gaps between tensors untouched, and a skipped step writing nothing.
struct UpdateCase {
  static constexpr double lr = 0.037;
  List W, D, P;
  std::vector<unsigned char> W0, P0;
  Worst worst;
  UpdateCase(orthopt_dtype dw, const std::vector<int64_t>& wnumel, orthopt_dtype dd,
             const std::vector<int64_t>& dnumel, orthopt_dtype dp, int keep_mode, std::mt19937& rng)
      : W(dw, wnumel), D(dd, dnumel), P(dp, wnumel) {
    W.fill(rng, 0.5);
    D.fill(rng, 1.0);
    if (keep_mode == 2) D.set(D.offset[0], NAN);
    W.upload();
    D.upload();
    P.poison();
    W0 = W.bytes;
    P0 = P.bytes;
  }
  // Element e of W after the call, whose direction entry is d (0 where none).
  void check(int64_t e, double d, double wd, double factor, bool cautious, bool copy) {
    const double w = decode(W0, W.dt, e);
    const double ref = decoupled_ref(w, d, lr, wd, factor, cautious);
    const double tol32 = 8 * kU32 * (std::fabs(w) + lr * factor * std::fabs(d)) + floor_of(W.dt);
    worst.add(W.get(e), ref, unit(W.dt) * std::fabs(ref) + tol32);
    if (copy) check_copy(P, W, e, ref, tol32, worst);
  }
  // Downloads the results; a skipped step is judged at once (nothing written). Returns whether
  // the elements are still to be checked.
  bool download(const char* what, const std::string& config, const std::vector<int64_t>& numel, int keep_mode) {
    W.download();
    P.download();
    if (keep_mode != 2) return true;
    report(W.bytes == W0 && P.bytes == P0, what, config, numel, 0.0, true);
    return false;
  }
  void finish(const char* what, const std::string& config, const std::vector<int64_t>& numel, bool copy) const {
    const bool gaps = W.gaps_unchanged(W0) && P.gaps_unchanged(P0);
    report(worst.value <= 1.0 && gaps && (copy || P.bytes == P0), what, config, numel, worst.value, gaps);
  }
};

// orthopt_multi_update; with row_cols > 0 also per-row scales of the direction (NorMuon's row
// factors: every tensor holds rows of row_cols elements, each row a random factor in [0.5, 2),
// and element e is judged with the direction D·scale[row]).
void check_update(const std::vector<int64_t>& numel, orthopt_dtype dw, orthopt_dtype dd, bool copy, orthopt_dtype dp,
                  bool cautious, double wd, int keep_mode, std::mt19937& rng, int64_t row_cols = 0) {
  UpdateCase u(dw, numel, dd, numel, dp, keep_mode, rng);
  std::vector<double> factor;
  for (size_t i = 0; i < numel.size(); ++i) factor.push_back(0.5 + 0.25 * static_cast<double>(i % 7));
  std::vector<std::vector<float>> scales;
  std::vector<float*> scales_dev;
  if (row_cols > 0) {
    std::uniform_real_distribution<float> s(0.5f, 2.0f);
    for (int64_t n : numel) {
      scales.emplace_back(static_cast<size_t>(n / row_cols));
      for (float& v : scales.back()) v = s(rng);
      float* d = nullptr;
      CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(1, scales.back().size()) * sizeof(float)));
      CHECK_CUDA(cudaMemcpy(d, scales.back().data(), scales.back().size() * sizeof(float), cudaMemcpyHostToDevice));
      scales_dev.push_back(d);
    }
  }
  const DevScalar<double> lr_dev(UpdateCase::lr);
  const Keep keep(keep_mode);
  std::vector<int64_t> scale_numel;
  for (const auto& v : scales) scale_numel.push_back(static_cast<int64_t>(v.size()));
  std::vector<void*> scale_ptrs(scales_dev.begin(), scales_dev.end());
  const orthopt_tensor_list row_scale{static_cast<int64_t>(numel.size()), scale_numel.data(),
                                      row_cols > 0 ? scale_ptrs.data() : nullptr, ORTHOPT_FP32};
  const orthopt_status st =
      orthopt_multi_update(u.W.desc(), u.D.desc(), u.P.desc(copy), row_scale,
                           {{lr_dev.dev, wd, cautious ? 1 : 0}, factor.data(), row_cols}, keep.ptr(), nullptr);
  for (float* d : scales_dev) cudaFree(d);
  if (call_failed(st, "multi update")) return;
  const std::string config = dts({{"W", dw}, {"D", dd}}) + (copy ? std::string("copy=") + name(dp) + " " : "") +
                             (cautious ? "cautious " : "") + "wd=" + std::to_string(wd).substr(0, 4) + " " +
                             (row_cols > 0 ? "row scales, cols=" + std::to_string(row_cols) + " " : "") +
                             keep_name(keep_mode);
  if (!u.download("update", config, numel, keep_mode)) return;
  for (size_t i = 0; i < numel.size(); ++i)
    for (int64_t e = u.W.offset[i]; e < u.W.offset[i] + numel[i]; ++e) {
      const double d = u.D.get(e);
      const double scale = row_cols > 0 ? scales[i][static_cast<size_t>((e - u.W.offset[i]) / row_cols)] : 1.0;
      u.check(e, d * scale, wd, factor[i], cautious, copy);
    }
  u.finish("update", config, numel, copy);
}

// check_update with row scales on tensors of R_j whole rows of cols elements.
void check_update_rows(int64_t cols, orthopt_dtype dw, orthopt_dtype dd, bool copy, orthopt_dtype dp, bool cautious,
                       int keep_mode, std::mt19937& rng) {
  std::vector<int64_t> numel;
  for (int64_t r : {5, 1, 64, 300, 17}) numel.push_back(r * cols);
  check_update(numel, dw, dd, copy, dp, cautious, 0.1, keep_mode, rng, cols);
}

// orthopt_multi_update_selected: per tensor a weight of R_j rows × cols, k_j distinct random rows
// mapped (int32 row map) to the rows of a compact direction. Selected rows must get
// decoupled_ref(w, d), every other row decoupled_ref(w, 0) (the decay), the copy the same; gaps
// untouched; skipped: nothing written.
void check_update_selected(int64_t cols, orthopt_dtype dw, orthopt_dtype dd, bool copy, orthopt_dtype dp,
                           bool cautious, int keep_mode, std::mt19937& rng) {
  const double wd = 0.1;
  const std::vector<int64_t> R = {5, 1, 64, 300, 17};  // rows per weight
  std::vector<int64_t> wnumel, dnumel;
  std::vector<std::vector<int32_t>> map;  // per weight: compact row or -1
  for (int64_t r : R) {
    std::vector<int32_t> all(r);
    for (int64_t i = 0; i < r; ++i) all[i] = static_cast<int32_t>(i);
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t k = std::max<int64_t>(1, r / 4);
    map.emplace_back(r, -1);
    for (int64_t s = 0; s < k; ++s) map.back()[all[s]] = static_cast<int32_t>(s);
    wnumel.push_back(r * cols);
    dnumel.push_back(k * cols);
  }
  UpdateCase u(dw, wnumel, dd, dnumel, dp, keep_mode, rng);
  std::vector<int32_t*> maps_dev;
  for (const auto& m : map) {
    int32_t* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, m.size() * sizeof(int32_t)));
    CHECK_CUDA(cudaMemcpy(d, m.data(), m.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    maps_dev.push_back(d);
  }
  std::vector<void*> map_ptrs(maps_dev.begin(), maps_dev.end());
  const orthopt_tensor_list maps{static_cast<int64_t>(R.size()), R.data(), map_ptrs.data(), ORTHOPT_FP32};
  std::vector<double> factor;
  for (size_t j = 0; j < R.size(); ++j) factor.push_back(0.5 + 0.25 * static_cast<double>(j));
  const DevScalar<double> lr_dev(UpdateCase::lr);
  const Keep keep(keep_mode);
  const orthopt_status st =
      orthopt_multi_update_selected(u.W.desc(), u.D.desc(), maps, u.P.desc(copy),
                                    {{lr_dev.dev, wd, cautious ? 1 : 0}, factor.data(), cols}, keep.ptr(), nullptr);
  for (int32_t* d : maps_dev) cudaFree(d);
  if (call_failed(st, "multi update selected")) return;
  const std::string config = dts({{"W", dw}, {"D", dd}}) + "cols=" + std::to_string(cols) + " " +
                             (copy ? std::string("copy=") + name(dp) + " " : "") + (cautious ? "cautious " : "") +
                             keep_name(keep_mode);
  if (!u.download("update_selected", config, wnumel, keep_mode)) return;
  for (size_t j = 0; j < R.size(); ++j)
    for (int64_t row = 0; row < R[j]; ++row)
      for (int64_t c = 0; c < cols; ++c) {
        const int32_t s = map[j][row];
        const double d = s >= 0 ? u.D.get(u.D.offset[j] + s * cols + c) : 0.0;
        u.check(u.W.offset[j] + row * cols + c, d, wd, factor[j], cautious, copy);
      }
  u.finish("update_selected", config, wnumel, copy);
}

// All buffers of an AdamW call; `steps` holds one fp32 count per tensor.
struct AdamWLists {
  List G, M, V, S, W, P;
  AdamWLists(const std::vector<int64_t>& numel, orthopt_dtype dg, orthopt_dtype ds, orthopt_dtype dw, orthopt_dtype dp)
      : G(dg, numel), M(ds, numel), V(ds, numel), S(ORTHOPT_FP32, std::vector<int64_t>(numel.size(), 1)),
        W(dw, numel), P(dp, numel) {}
  void fill(std::mt19937& rng) {
    G.fill(rng, 1.0);
    M.fill(rng, 0.1);
    V.fill(rng, 0.01, /*positive=*/true);
    W.fill(rng, 0.5);
    static const double counts[] = {0, 1, 2, 9, 999};  // bias corrections from strong to none
    for (size_t i = 0; i < S.offset.size(); ++i) S.set(S.offset[i], counts[i % 5]);
  }
  void upload() {
    for (List* l : {&G, &M, &V, &S, &W}) l->upload();
    P.poison();
  }
  void download() {
    for (List* l : {&G, &M, &V, &S, &W, &P}) l->download();
  }
  orthopt_status run(bool copy, const double* lr, double wd, bool cautious, const uint8_t* keep, cudaStream_t stream) {
    return orthopt_multi_adamw(G.desc(), M.desc(), V.desc(), S.desc(), W.desc(), P.desc(copy),
                               {{lr, wd, cautious ? 1 : 0}, 0.9, 0.95, 1e-8}, keep, stream);
  }
};

void check_adamw(const std::vector<int64_t>& numel, orthopt_dtype dg, orthopt_dtype ds, orthopt_dtype dw, bool copy,
                 orthopt_dtype dp, bool cautious, double wd, int keep_mode, std::mt19937& rng) {
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  AdamWLists L(numel, dg, ds, dw, dp);
  L.fill(rng);
  if (keep_mode == 2) L.G.set(L.G.offset[0], NAN);
  L.upload();
  const auto M0 = L.M.bytes, V0 = L.V.bytes, S0 = L.S.bytes, W0 = L.W.bytes, P0 = L.P.bytes;
  const DevScalar<double> lr_dev(lr);
  const Keep keep(keep_mode);
  if (call_failed(L.run(copy, lr_dev.dev, wd, cautious, keep.ptr(), nullptr), "multi adamw")) return;
  L.download();
  const std::string config = dts({{"G", dg}, {"state", ds}, {"W", dw}}) +
                             (copy ? std::string("copy=") + name(dp) + " " : "") + (cautious ? "cautious " : "") +
                             "wd=" + std::to_string(wd).substr(0, 4) + " " + keep_name(keep_mode);
  if (keep_mode == 2) {
    report(L.M.bytes == M0 && L.V.bytes == V0 && L.S.bytes == S0 && L.W.bytes == W0 && L.P.bytes == P0, "adamw",
           config, numel, 0.0, true);
    return;
  }
  Worst worst;
  bool steps_ok = true;
  for (size_t i = 0; i < numel.size(); ++i) {
    const double step = decode(S0, ORTHOPT_FP32, L.S.offset[i]);
    const double t = step + (numel[i] > 0 ? 1 : 0);  // empty tensors are skipped entirely
    steps_ok = steps_ok && L.S.get(L.S.offset[i]) == t;
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    for (int64_t e = L.W.offset[i]; e < L.W.offset[i] + numel[i]; ++e) {
      const double g = L.G.get(e), m = decode(M0, ds, e), v = decode(V0, ds, e), w = decode(W0, dw, e);
      const double m_ref = b1 * m + (1 - b1) * g, m_mag = b1 * std::fabs(m) + (1 - b1) * std::fabs(g);
      const double v_ref = b2 * v + (1 - b2) * g * g;
      const double denom = std::sqrt(v_ref) / std::sqrt(bc2) + eps;
      const double d = (m_ref / bc1) / denom, d_mag = (m_mag / bc1) / denom;
      double ref = decoupled_ref(w, d, lr, wd, 1.0, cautious);
      if (cautious && std::fabs(m_ref) <= 8 * kU32 * m_mag) {  // sign of D within rounding: either mask
        const double alt = decoupled_ref(w, d, lr, wd, 1.0, cautious, /*flip=*/true);
        if (std::fabs(L.W.get(e) - alt) < std::fabs(L.W.get(e) - ref)) ref = alt;
      }
      const double tol32 = 32 * kU32 * (std::fabs(w) + lr * d_mag) + floor_of(dw);
      worst.add(L.M.get(e), m_ref, unit(ds) * std::fabs(m_ref) + 6 * kU32 * m_mag + floor_of(ds));
      worst.add(L.V.get(e), v_ref, (unit(ds) + 8 * kU32) * v_ref + floor_of(ds));
      worst.add(L.W.get(e), ref, unit(dw) * std::fabs(ref) + tol32);
      if (copy) check_copy(L.P, L.W, e, ref, tol32, worst);
    }
  }
  const bool gaps = L.M.gaps_unchanged(M0) && L.V.gaps_unchanged(V0) && L.S.gaps_unchanged(S0) &&
                    L.W.gaps_unchanged(W0) && L.P.gaps_unchanged(P0);
  report(worst.value <= 1.0 && gaps && steps_ok && (copy || L.P.bytes == P0), "adamw",
         config + (steps_ok ? "" : " STEP-COUNTS-WRONG"), numel, worst.value, gaps);
}

void check_lion(const std::vector<int64_t>& numel, orthopt_dtype dg, orthopt_dtype ds, orthopt_dtype dw, bool copy,
                orthopt_dtype dp, bool cautious, double wd, int keep_mode, std::mt19937& rng) {
  const double lr = 1e-3, b1 = 0.9, b2 = 0.99;
  List G(dg, numel), M(ds, numel), W(dw, numel), P(dp, numel);
  G.fill(rng, 1.0);
  M.fill(rng, 0.3);
  W.fill(rng, 0.5);
  if (keep_mode == 2) G.set(G.offset[0], NAN);
  for (List* l : {&G, &M, &W}) l->upload();
  P.poison();
  const auto M0 = M.bytes, W0 = W.bytes, P0 = P.bytes;
  const DevScalar<double> lr_dev(lr);
  const Keep keep(keep_mode);
  const orthopt_status st = orthopt_multi_lion(G.desc(), M.desc(), W.desc(), P.desc(copy),
                                               {{lr_dev.dev, wd, cautious ? 1 : 0}, b1, b2}, keep.ptr(), nullptr);
  if (call_failed(st, "multi lion")) return;
  for (List* l : {&M, &W, &P}) l->download();
  const std::string config = dts({{"G", dg}, {"state", ds}, {"W", dw}}) +
                             (copy ? std::string("copy=") + name(dp) + " " : "") + (cautious ? "cautious " : "") +
                             "wd=" + std::to_string(wd).substr(0, 4) + " " + keep_name(keep_mode);
  if (keep_mode == 2) {
    report(M.bytes == M0 && W.bytes == W0 && P.bytes == P0, "lion", config, numel, 0.0, true);
    return;
  }
  Worst worst;
  int64_t ambiguous = 0;  // sign of a value within fp32 rounding of zero: either update is right
  for (size_t i = 0; i < numel.size(); ++i)
    for (int64_t e = W.offset[i]; e < W.offset[i] + numel[i]; ++e) {
      const double g = G.get(e), m = decode(M0, ds, e), w = decode(W0, dw, e);
      const double mix = b1 * m + (1 - b1) * g, mix_mag = b1 * std::fabs(m) + (1 - b1) * std::fabs(g);
      const double m_ref = b2 * m + (1 - b2) * g, m_mag = b2 * std::fabs(m) + (1 - b2) * std::fabs(g);
      worst.add(M.get(e), m_ref, unit(ds) * std::fabs(m_ref) + 6 * kU32 * m_mag + floor_of(ds));
      if (std::fabs(mix) <= 8 * kU32 * mix_mag) {
        ++ambiguous;
        continue;
      }
      const double ref = decoupled_ref(w, mix > 0 ? 1.0 : -1.0, lr, wd, 1.0, cautious);
      const double tol32 = 8 * kU32 * (std::fabs(w) + lr) + floor_of(dw);
      worst.add(W.get(e), ref, unit(dw) * std::fabs(ref) + tol32);
      if (copy) check_copy(P, W, e, ref, tol32, worst);
    }
  const bool gaps = M.gaps_unchanged(M0) && W.gaps_unchanged(W0) && P.gaps_unchanged(P0);
  report(worst.value <= 1.0 && gaps && (copy || P.bytes == P0), "lion",
         config + (ambiguous ? " (" + std::to_string(ambiguous) + " sign ties)" : ""), numel, worst.value, gaps);
}

// The calls are capturable: an AdamW call over more tensors than one table holds, captured in a
// CUDA graph and replayed twice with the lr changed in device memory in between, matches two
// eager calls bit for bit (the lr is read at run time, nothing is baked in but pointers).
void check_graph_capture(std::mt19937& rng) {
  const auto numel = sizes_many(150);
  AdamWLists eager(numel, ORTHOPT_BF16, ORTHOPT_FP32, ORTHOPT_FP32, ORTHOPT_BF16);
  AdamWLists graphed(numel, ORTHOPT_BF16, ORTHOPT_FP32, ORTHOPT_FP32, ORTHOPT_BF16);
  eager.fill(rng);
  for (auto [a, b] : {std::pair<List*, List*>{&eager.G, &graphed.G}, {&eager.M, &graphed.M}, {&eager.V, &graphed.V},
                      {&eager.S, &graphed.S}, {&eager.W, &graphed.W}})
    b->bytes = a->bytes;
  eager.upload();
  graphed.upload();
  DevScalar<double> lr_eager(1e-3), lr_graph(1e-3);
  const Keep keep(1);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const orthopt_status st = graphed.run(true, lr_graph.dev, 0.1, true, keep.ptr(), stream);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  bool ok = st == ORTHOPT_OK;
  if (!ok) std::printf("capture: %s\n", orthopt_last_error());
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (double lr : {1e-3, 2.5e-3}) {
    lr_eager.set(lr);
    lr_graph.set(lr);
    ok = ok && eager.run(true, lr_eager.dev, 0.1, true, keep.ptr(), nullptr) == ORTHOPT_OK;
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  eager.download();
  graphed.download();
  for (auto [a, b] : {std::pair<List*, List*>{&eager.M, &graphed.M}, {&eager.V, &graphed.V}, {&eager.S, &graphed.S},
                      {&eager.W, &graphed.W}, {&eager.P, &graphed.P}})
    ok = ok && a->bytes == b->bytes;
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
  if (!ok) ++g_failures;
  std::printf("%s multi adamw captured in a CUDA graph (%zu tensors), 2 replays == 2 eager calls bit for bit\n",
              ok ? "ok  " : "FAIL", numel.size());
}

// orthopt_normuon_factors against an fp64 reference of update_math.cpp's normuon_row_factors,
// computed from the stored inputs. U: `batch` matrices [rows, cols] in dt, one tensor of a List
// (odd offset: the row kernel's element path; aligned: its vector path where cols % 4 == 0). V:
// fp32 with `extra` rows more than the matrices have; with `selected`, the rows of the matrices
// take a random set of distinct V rows (variance_rows, Dion3), and every other V row must keep
// its bytes. The factors are poisoned. Skipped step: V bit-identical, the factors still those of
// the new variances.
// Tolerances, relative (u = 2^-24, every quantity positive): a row's fp32 sum of cols rounded
// squares errs by at most (cols + 1)·u; the new variance adds 3 roundings, 1/(√V + ε) halves the
// variance's error and adds 3; each sum over the rows adds (rows + 1)·u, the ratio of the two
// norms halves those and adds 3, the factor adds 1: in all below (2·cols + rows + 20)·u, taken
// twice for room; the variance (cols + 5)·u, twice.
void check_normuon_factors(int64_t batch, int64_t rows, int64_t cols, orthopt_dtype dt, bool selected, int64_t extra,
                           int keep_mode, std::mt19937& rng) {
  const double beta2 = 0.95, eps = 1e-8;
  const bool skip = keep_mode == 2;
  const int64_t n = batch * rows, v_rows = n + extra;
  List U(dt, {n * cols}), V(ORTHOPT_FP32, {v_rows}), F(ORTHOPT_FP32, {n});
  U.fill(rng, 0.05);
  V.fill(rng, 1e-3, /*positive=*/true);
  if (v_rows > 1) V.set(V.offset[0] + 1, 0.0);  // a zero variance (first step) among them
  std::vector<int64_t> map(n);
  for (int64_t i = 0; i < n; ++i) map[i] = i;
  if (selected) {
    std::vector<int64_t> all(v_rows);
    for (int64_t i = 0; i < v_rows; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    std::copy(all.begin(), all.begin() + n, map.begin());
  }
  int64_t* map_dev = nullptr;
  if (selected) {
    CHECK_CUDA(cudaMalloc(&map_dev, n * sizeof(int64_t)));
    CHECK_CUDA(cudaMemcpy(map_dev, map.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
  }
  U.upload();
  V.upload();
  F.poison();
  const auto U0 = U.bytes, V0 = V.bytes, F0 = F.bytes;
  const Keep keep(keep_mode);
  float* v_ptr = static_cast<float*>(V.ptrs()[0]);
  const orthopt_status st = orthopt_normuon_factors(batch, rows, cols, U.ptrs()[0], dt, v_ptr, map_dev, beta2, eps,
                                                    static_cast<float*>(F.ptrs()[0]), keep.ptr(), nullptr);
  cudaFree(map_dev);
  if (call_failed(st, "normuon_factors")) return;
  U.download();
  V.download();
  F.download();
  Worst worst;
  std::vector<bool> touched(v_rows, false);
  const double u = kU32;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> s(rows), inv(rows);
    double sum_sq = 0, sum_hat = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = b * rows + r;
      for (int64_t c = 0; c < cols; ++c) {
        const double x = decode(U0, dt, U.offset[0] + row * cols + c);
        s[r] += x * x;
      }
      const int64_t vi = V.offset[0] + map[row];
      const double v_new = decode(V0, ORTHOPT_FP32, vi) * beta2 + s[r] * ((1.0 - beta2) / cols);
      inv[r] = 1.0 / (std::sqrt(v_new) + eps);
      sum_sq += s[r];
      sum_hat += s[r] * inv[r] * inv[r];
      touched[map[row]] = true;
      if (!skip) worst.add(V.get(vi), v_new, 2 * (cols + 5) * u * v_new + 1e-30);
    }
    const double ratio = std::sqrt(sum_sq) / std::max(std::sqrt(sum_hat), 1e-8);
    for (int64_t r = 0; r < rows; ++r) {
      const double ref = inv[r] * ratio;
      worst.add(F.get(F.offset[0] + b * rows + r), ref, 2 * (2 * cols + rows + 20) * u * ref + 1e-30);
    }
  }
  // V rows outside the selection, and all of V on a skipped step, keep their bytes.
  bool v_kept = true;
  for (int64_t i = 0; i < v_rows; ++i)
    if (skip || !touched[i]) v_kept = v_kept && std::memcmp(V.bytes.data() + (V.offset[0] + i) * 4,
                                                            V0.data() + (V.offset[0] + i) * 4, 4) == 0;
  const bool gaps = U.bytes == U0 && V.gaps_unchanged(V0) && F.gaps_unchanged(F0) && v_kept;
  const std::string config = dts({{"U", dt}}) + "batch=" + std::to_string(batch) + " rows=" + std::to_string(rows) +
                             " cols=" + std::to_string(cols) + (selected ? " selected" : "") + " " +
                             keep_name(keep_mode);
  report(worst.value <= 1.0 && gaps, "normuon", config, {n * cols}, worst.value, gaps);
}

// orthopt_dion3_take_rows, bit for bit: the selection is a copy of the stored rows, the error
// feedback one fp32 product rounded to the momentum's dtype (emulated on the host: the product
// of two fp32 values in double is exact, then rounded to fp32 and to dt), flat and the row map
// are integers. M: `batch` matrices of one List tensor (odd offset, or aligned: the vector path
// where cols % 4 == 0); unselected rows of M, the map's unselected entries (pre-filled -1) and
// all of M on a skipped step keep their bytes; the selection is poisoned before the call.
void check_dion3_take_rows(int64_t batch, int64_t rows, int64_t cols, int64_t k, orthopt_dtype dt, bool map,
                           int keep_mode, std::mt19937& rng) {
  const double mu = 0.95;
  const bool skip = keep_mode == 2;
  const int64_t n_sel = batch * k;
  List M(dt, {batch * rows * cols}), S(dt, {n_sel * cols});
  M.fill(rng, 1.0);
  std::vector<int64_t> idx(n_sel);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> perm(rows);
    for (int64_t r = 0; r < rows; ++r) perm[r] = r;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + k, idx.begin() + b * k);
  }
  int64_t *idx_dev = nullptr, *flat_dev = nullptr;
  int32_t* map_dev = nullptr;
  CHECK_CUDA(cudaMalloc(&idx_dev, n_sel * 8));
  CHECK_CUDA(cudaMalloc(&flat_dev, n_sel * 8));
  CHECK_CUDA(cudaMalloc(&map_dev, batch * rows * 4));
  CHECK_CUDA(cudaMemcpy(idx_dev, idx.data(), n_sel * 8, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(flat_dev, 0xFF, n_sel * 8));
  CHECK_CUDA(cudaMemset(map_dev, 0xFF, batch * rows * 4));  // -1
  M.upload();
  S.poison();
  const auto M0 = M.bytes, S0 = S.bytes;
  const Keep keep(keep_mode);
  const orthopt_status st = orthopt_dion3_take_rows(batch, rows, cols, k, M.ptrs()[0], dt, idx_dev, mu, S.ptrs()[0],
                                                    flat_dev, map ? map_dev : nullptr, keep.ptr(), nullptr);
  std::vector<int64_t> flat(n_sel);
  std::vector<int32_t> row_map(batch * rows);
  const bool failed = call_failed(st, "dion3_take_rows");
  if (!failed) {
    CHECK_CUDA(cudaMemcpy(flat.data(), flat_dev, n_sel * 8, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(row_map.data(), map_dev, batch * rows * 4, cudaMemcpyDeviceToHost));
  }
  cudaFree(idx_dev);
  cudaFree(flat_dev);
  cudaFree(map_dev);
  if (failed) return;
  M.download();
  S.download();
  const float mu32 = static_cast<float>(mu);
  int64_t bad = 0;
  std::vector<int32_t> map_ref(batch * rows, -1);
  std::vector<bool> chosen(batch * rows, false);
  for (int64_t i = 0; i < n_sel; ++i) {
    const int64_t src = (i / k) * rows + idx[i];
    chosen[src] = true;
    map_ref[src] = static_cast<int32_t>(i);
    bad += flat[i] != src;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t e = M.offset[0] + src * cols + c;
      const double x = decode(M0, dt, e);
      bad += std::memcmp(S.bytes.data() + (S.offset[0] + i * cols + c) * esize(dt), M0.data() + e * esize(dt),
                         esize(dt)) != 0;
      const float prod = static_cast<float>(static_cast<double>(static_cast<float>(x)) * mu32);  // exact, then fp32
      std::vector<unsigned char> want(esize(dt));
      encode(want, dt, 0, skip ? static_cast<float>(x) : prod);
      bad += std::memcmp(M.bytes.data() + e * esize(dt), want.data(), esize(dt)) != 0;
    }
  }
  for (int64_t r = 0; r < batch * rows; ++r) {
    if (map) bad += row_map[r] != map_ref[r];
    else bad += row_map[r] != -1;  // no map: untouched
    if (!chosen[r])
      bad += std::memcmp(M.bytes.data() + (M.offset[0] + r * cols) * esize(dt),
                         M0.data() + (M.offset[0] + r * cols) * esize(dt), cols * esize(dt)) != 0;
  }
  const bool gaps = M.gaps_unchanged(M0) && S.gaps_unchanged(S0);
  const std::string config = dts({{"M", dt}}) + "batch=" + std::to_string(batch) + " rows=" + std::to_string(rows) +
                             " cols=" + std::to_string(cols) + " k=" + std::to_string(k) + (map ? " map " : " ") +
                             keep_name(keep_mode);
  report(bad == 0 && gaps, "take", config, {batch * rows * cols}, static_cast<double>(bad), gaps);
}

void check_multi_errors() {
  const int64_t numel[2] = {3, 4};
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 64));
  void* list[2] = {p, nullptr};
  void* full[2] = {p, p};
  auto has = [](const char* s) { return std::strstr(orthopt_last_error(), s) != nullptr; };
  auto L = [&](void** data, orthopt_dtype dt = ORTHOPT_FP32, const int64_t* n = nullptr, int64_t count = 2) {
    return orthopt_tensor_list{count, n, data, dt};
  };
  const orthopt_tensor_list absent{};
  const orthopt_momentum_params mp{0.9, 1.0, 0};
  const double* lr = reinterpret_cast<const double*>(p);
  orthopt_status st = orthopt_multi_momentum(L(full, ORTHOPT_FP32, numel, -1), L(full), L(full), mp, nullptr, nullptr);
  bool ok1 = st == ORTHOPT_ERR_INVALID && has("'count'");
  st = orthopt_multi_momentum(L(full, ORTHOPT_FP32, numel), L(full, ORTHOPT_FP32, nullptr, 1), absent, mp, nullptr,
                              nullptr);
  ok1 = ok1 && st == ORTHOPT_ERR_INVALID && has("'grad' has 1 tensors, expected 2");
  st = orthopt_multi_momentum(L(full), L(full), absent, mp, nullptr, nullptr);  // the first list without numel
  ok1 = ok1 && st == ORTHOPT_ERR_INVALID && has("'numel' must not be NULL");
  st = orthopt_multi_momentum(L(full, ORTHOPT_FP32, numel), L(list), L(full), mp, nullptr, nullptr);
  const bool ok2 = st == ORTHOPT_ERR_INVALID && has("'grad' has a NULL pointer at index 1");
  orthopt_update_params up{{lr, 0.1, 0}, nullptr, 0};
  st = orthopt_multi_update(L(full, ORTHOPT_FP32, numel), L(full, static_cast<orthopt_dtype>(7)), absent, absent, up,
                            nullptr, nullptr);
  bool ok3 = st == ORTHOPT_ERR_INVALID && has("'direction'") && has("fp32, bf16 or fp16");
  up.cols = 3;
  st = orthopt_multi_update(L(full, ORTHOPT_FP32, numel), L(full), absent, L(full), up, nullptr,
                            nullptr);  // 4 is not whole rows of 3
  ok3 = ok3 && st == ORTHOPT_ERR_INVALID && has("'numel' [1]") && has("cols");
  const int64_t wrong[2] = {3, 5};
  st = orthopt_multi_update(L(full, ORTHOPT_FP32, numel), L(full, ORTHOPT_FP32, wrong), absent, absent, up, nullptr,
                            nullptr);  // the direction's element counts differ from the weight's
  ok3 = ok3 && st == ORTHOPT_ERR_INVALID && has("'direction': 'numel' [1] = 5, expected 4");
  st = orthopt_multi_lion(L(full, ORTHOPT_FP32, numel), L(full), L(full), absent, {{nullptr, 0.0, 0}, 0.9, 0.99},
                          nullptr, nullptr);
  const bool ok4 = st == ORTHOPT_ERR_INVALID && has("'lr'");
  st = orthopt_multi_adamw(L(nullptr, ORTHOPT_FP32, nullptr, 0), absent, absent, absent, absent, absent,
                           {{nullptr, 0.0, 0}, 0.9, 0.95, 1e-8}, nullptr, nullptr);
  bool ok5 = st == ORTHOPT_OK;  // an empty list is a no-op
  st = orthopt_multi_adamw(L(full, ORTHOPT_FP32, numel), L(full), L(full), L(full, ORTHOPT_FP32, numel), L(full),
                           absent, {{lr, 0.0, 0}, 0.9, 0.95, 1e-8}, nullptr, nullptr);  // steps hold one count each
  ok5 = ok5 && st == ORTHOPT_ERR_INVALID && has("'step': 'numel' [0] = 3, expected 1");
  const int64_t rows_of_2[2] = {2, 4}, stat_rows[2] = {1, 3};
  st = orthopt_multi_momentum_rows(L(full, ORTHOPT_FP32, numel), L(full), absent, L(full), 3, {1.0, 1.0, 0},
                                   ORTHOPT_ROW_L1_MOMENTUM, nullptr, nullptr);  // 4 is not whole rows of 3
  bool ok6 = st == ORTHOPT_ERR_INVALID && has("'numel' [1]") && has("cols");
  st = orthopt_multi_momentum_rows(L(full, ORTHOPT_FP32, rows_of_2), L(full), L(full), L(full), 2, {1.0, 1.0, 0},
                                   ORTHOPT_ROW_L1_MOMENTUM, nullptr, nullptr);  // L1 takes no output
  ok6 = ok6 && st == ORTHOPT_ERR_INVALID && has("'out'");
  st = orthopt_multi_momentum_rows(L(full, ORTHOPT_FP32, rows_of_2), L(full), absent, L(full, ORTHOPT_FP32, stat_rows),
                                   2, {1.0, 1.0, 0}, ORTHOPT_ROW_SUMSQ_OUT, nullptr, nullptr);  // rows: 1 and 2
  ok6 = ok6 && st == ORTHOPT_ERR_INVALID && has("'stats': 'numel' [1] = 3, expected 2");
  up.cols = 3;
  st = orthopt_multi_update_selected(L(full, ORTHOPT_FP32, numel), L(full), L(full), absent, up, nullptr, nullptr);
  ok6 = ok6 && st == ORTHOPT_ERR_INVALID && has("'numel' [1]") && has("cols");  // 4 is not whole rows of 3
  float* fp = static_cast<float*>(p);
  st = orthopt_normuon_factors(2, 3, 0, p, ORTHOPT_BF16, fp, nullptr, 0.95, 1e-8, fp, nullptr, nullptr);
  bool ok7 = st == ORTHOPT_ERR_INVALID && has("'cols'");
  st = orthopt_normuon_factors(2, 3, 4, p, ORTHOPT_BF16, nullptr, nullptr, 0.95, 1e-8, fp, nullptr, nullptr);
  ok7 = ok7 && st == ORTHOPT_ERR_INVALID && has("'variance'");
  st = orthopt_normuon_factors(1, 2, 4, p, static_cast<orthopt_dtype>(9), fp, nullptr, 0.95, 1e-8, fp, nullptr,
                               nullptr);
  ok7 = ok7 && st == ORTHOPT_ERR_INVALID && has("'u'") && has("fp32, bf16 or fp16");
  st = orthopt_normuon_factors(0, 3, 4, nullptr, ORTHOPT_BF16, nullptr, nullptr, 0.95, 1e-8, nullptr, nullptr, nullptr);
  ok7 = ok7 && st == ORTHOPT_OK;  // no matrices: a no-op
  const int64_t* ip = static_cast<const int64_t*>(p);
  st = orthopt_dion3_take_rows(2, 3, 4, 5, p, ORTHOPT_FP32, ip, 0.9, p, static_cast<int64_t*>(p), nullptr, nullptr,
                               nullptr);
  ok7 = ok7 && st == ORTHOPT_ERR_INVALID && has("'k'") && has("'rows'");
  st = orthopt_dion3_take_rows(2, 3, 4, 1, p, ORTHOPT_FP32, nullptr, 0.9, p, static_cast<int64_t*>(p), nullptr,
                               nullptr, nullptr);
  ok7 = ok7 && st == ORTHOPT_ERR_INVALID && has("'rows_idx'");
  cudaFree(p);
  const bool ok = ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7;
  if (!ok) ++g_failures;
  std::printf("%s multi argument errors (%d %d %d %d %d %d %d)\n", ok ? "ok  " : "FAIL", ok1, ok2, ok3, ok4, ok5, ok6,
              ok7);
}

void check_multi(bool quick, std::mt19937& rng) {
  check_multi_errors();
  std::vector<std::vector<int64_t>> sets = {sizes_basic(), sizes_many(quick ? 150 : 300)};
  if (!quick) sets.push_back(sizes_large());
  constexpr orthopt_dtype F32 = ORTHOPT_FP32, B16 = ORTHOPT_BF16, F16 = ORTHOPT_FP16;
  for (bool aligned : {false, true}) {  // element-by-element path, vector path
    g_aligned_lists = aligned;
    for (const auto& sz : sets) {
      check_momentum(sz, F32, F32, F32, true, false, 0, rng);
      check_momentum(sz, F32, B16, B16, false, true, 1, rng);
      check_momentum(sz, B16, B16, F16, true, true, 0, rng);
      check_momentum(sz, F16, F16, F32, false, false, 1, rng);
      check_update(sz, F32, F32, false, F32, false, 0.1, 0, rng);
      check_update(sz, F32, B16, true, B16, true, 0.1, 1, rng);
      check_update(sz, B16, F16, false, F32, false, 0.0, 0, rng);
      check_update(sz, F32, F32, true, F16, true, 0.05, 0, rng);
      check_momentum(sz, F32, B16, F32, false, false, 1, rng, /*no_out=*/true);  // Dion3's M ← M + G
      check_adamw(sz, F32, F32, F32, false, F32, false, 0.01, 0, rng);
      check_adamw(sz, B16, F32, F32, true, B16, true, 0.1, 1, rng);
      check_adamw(sz, B16, B16, B16, false, F32, false, 0.0, 0, rng);
      check_lion(sz, F32, F32, F32, false, F32, true, 0.1, 0, rng);
      check_lion(sz, B16, F32, F32, true, B16, false, 0.1, 1, rng);
      check_lion(sz, F16, F16, F16, false, F32, false, 0.0, 0, rng);
    }
    for (const auto& sz : {sizes_basic(), sizes_many(150)}) {  // skip: nothing written, NaN gradients too
      check_momentum(sz, F32, F32, B16, true, false, 2, rng);
      check_update(sz, F32, F32, true, B16, true, 0.1, 2, rng);
      check_adamw(sz, F32, F32, F32, true, B16, true, 0.1, 2, rng);
      check_lion(sz, F32, F32, F32, true, B16, false, 0.1, 2, rng);
    }
    for (int64_t cols : {1, 7, 768, 2051}) {  // Dion3's row-selected direction
      check_update_selected(cols, F32, F32, false, F32, false, 0, rng);
      check_update_selected(cols, F32, F32, true, B16, true, 1, rng);
      check_update_selected(cols, B16, F16, false, F32, true, 0, rng);
    }
    check_update_selected(768, F32, F32, true, B16, true, 2, rng);  // skip: nothing written
    for (int64_t cols : {1, 7, 768, 2051}) {  // NorMuon's row factors applied by the update
      check_update_rows(cols, F32, B16, false, F32, false, 0, rng);
      check_update_rows(cols, F32, F16, true, B16, true, 1, rng);
      check_update_rows(cols, B16, F32, false, F32, false, 0, rng);
    }
    check_update_rows(768, F32, B16, true, B16, false, 2, rng);  // skip: nothing written
    // NorMuon's row factors: GPT-2-like and ragged shapes, Dion3's selected variance rows, more
    // rows than a block has threads (the strided loops), a skipped step.
    for (orthopt_dtype dt : {F32, B16, F16}) {
      check_normuon_factors(3, 40, 120, dt, false, 0, 0, rng);
      check_normuon_factors(2, 7, 1, dt, true, 5, 1, rng);
      check_normuon_factors(4, 192, 768, dt, true, 300, 1, rng);
      check_normuon_factors(1, 300, 2051, dt, false, 0, 0, rng);
    }
    check_normuon_factors(2, 1000, 64, B16, false, 0, 1, rng);
    check_normuon_factors(3, 96, 768, B16, true, 40, 2, rng);  // skip: V unchanged
    check_normuon_factors(2, 96, 768, F32, false, 0, 2, rng);
    // Dion3's selection: one row, ragged and GPT-2-like shapes, all rows selected, no map, skip.
    for (orthopt_dtype dt : {F32, B16, F16}) {
      check_dion3_take_rows(1, 5, 1, 1, dt, true, 0, rng);
      check_dion3_take_rows(3, 40, 7, 10, dt, true, 1, rng);
      check_dion3_take_rows(12, 768, 768, 192, dt, true, 1, rng);
      check_dion3_take_rows(2, 33, 2051, 33, dt, false, 0, rng);
    }
    check_dion3_take_rows(4, 300, 128, 75, F32, true, 2, rng);  // skip: M unchanged, the rest written
  }
  g_aligned_lists = false;
  constexpr orthopt_row_stat L1 = ORTHOPT_ROW_L1_MOMENTUM, SQ = ORTHOPT_ROW_SUMSQ_OUT;
  for (int64_t cols : {1, 7, 768, 2051}) {  // momentum with per-row statistics (Dion3's scores, NS input norms)
    const std::vector<int64_t> R = {5, 1, 64, 300, 17, 9};
    check_momentum_rows(R, cols, F32, F32, F32, L1, false, 1.0, 1.0, 0, rng);
    check_momentum_rows(R, cols, F32, B16, F32, L1, false, 0.95, 0.05, 1, rng);
    check_momentum_rows(R, cols, B16, B16, F32, L1, false, 1.0, 1.0, 0, rng);
    check_momentum_rows(R, cols, F16, F32, F32, L1, false, 0.9, 1.0, 1, rng);
    check_momentum_rows(R, cols, F32, F32, F32, SQ, true, 0.95, 1.0, 0, rng);
    check_momentum_rows(R, cols, F32, B16, B16, SQ, false, 0.95, 0.05, 1, rng);
    check_momentum_rows(R, cols, B16, F32, F16, SQ, true, 0.9, 0.1, 0, rng);
    check_momentum_rows(R, cols, F32, F32, F32, SQ, true, 0.95, 1.0, 1, rng, /*no_out=*/true);
  }
  check_momentum_rows({5, 64, 300}, 768, F32, F32, F32, L1, false, 1.0, 1.0, 2, rng);  // skip: scores of the old M
  check_momentum_rows({5, 64, 300}, 768, F32, F32, F32, SQ, true, 0.95, 1.0, 2, rng);   // skip: zeros as out and stats
  check_momentum_rows({4096}, 2048, F32, F32, F32, L1, false, 1.0, 1.0, 1, rng);       // many blocks
  check_momentum_rows({4096}, 2048, F32, F32, F32, SQ, true, 0.95, 1.0, 1, rng);
  check_graph_capture(rng);
}

// ---- orthopt_scale_cast (the Newton–Schulz input: scaled cast, optionally transposed) against
// a host emulation of the same fp32 operations. The expected output is BIT-EXACT: the host does
// what the kernel and ATen's reference `(x.to(fp32) / (norm * safety + eps)).to(out)` do, one
// IEEE fp32 operation at a time (volatile: no contraction into a fused multiply-add; x86-64 SSE
// single precision, correctly rounded division), then rounds to nearest even in the output type
// with the CUDA host conversions. Any byte difference fails, an unwritten (NaN-poisoned) element
// included, and so does a write into the guard elements around the output.

constexpr int64_t kGuard = 16;  // output elements before and after, poisoned, must stay so

float host_divisor(float norm, float safety, float eps) {
  volatile float p = norm * safety;
  volatile float d = p + eps;
  return d;
}
float host_div(float x, float d) {
  volatile float y = x / d;
  return y;
}

// Device bytes with kGuard poisoned elements on both sides and an optional one-element shift
// (so the pointer is not 16-byte aligned and the kernel takes its scalar path).
struct GuardedBuf {
  orthopt_dtype dt;
  int64_t n, shift;
  std::vector<unsigned char> bytes;  // whole allocation, host mirror
  unsigned char* dev = nullptr;
  GuardedBuf(orthopt_dtype dt_, int64_t n_, bool misalign) : dt(dt_), n(n_), shift(misalign ? 1 : 0) {
    bytes.assign((n + 2 * kGuard + 1) * esize(dt), 0xFF);
    CHECK_CUDA(cudaMalloc(&dev, bytes.size()));
  }
  GuardedBuf(const GuardedBuf&) = delete;
  GuardedBuf& operator=(const GuardedBuf&) = delete;
  ~GuardedBuf() { cudaFree(dev); }
  int64_t first() const { return kGuard + shift; }  // element index of data[0] in the allocation
  void* data() { return dev + first() * esize(dt); }
  void upload() { CHECK_CUDA(cudaMemcpy(dev, bytes.data(), bytes.size(), cudaMemcpyHostToDevice)); }
  void download() { CHECK_CUDA(cudaMemcpy(bytes.data(), dev, bytes.size(), cudaMemcpyDeviceToHost)); }
  void poison() {
    std::fill(bytes.begin(), bytes.end(), 0xFF);  // NaN in fp32, bf16 and fp16
    upload();
  }
  const unsigned char* element(int64_t e) const { return bytes.data() + (first() + e) * esize(dt); }
  bool guards_poisoned() const {
    auto poisoned = [&](size_t lo, size_t hi) {
      for (size_t k = lo; k < hi; ++k)
        if (bytes[k] != 0xFF) return false;
      return true;
    };
    return poisoned(0, first() * esize(dt)) && poisoned((first() + n) * esize(dt), bytes.size());
  }
};

// All 9 dtype pairs × transpose on/off × with/without norm on one shape; note ends the line.
void check_scale_cast(int64_t batch, int64_t rows, int64_t cols, bool misalign, std::mt19937& rng,
                      const char* note = "") {
  const int64_t n = batch * rows * cols, mat = rows * cols;
  const float safety = static_cast<float>(1.02), eps = static_cast<float>(1e-7);
  // Per-matrix norms, log-uniform over [1e-2, 1e2]; one tiny (eps matters, fp16 outputs overflow).
  std::vector<float> norm(batch);
  std::uniform_real_distribution<double> logu(-2.0, 2.0);
  for (auto& v : norm) v = static_cast<float>(std::pow(10.0, logu(rng)));
  if (batch >= 3) norm[1] = 3e-7f;
  float* norm_dev = nullptr;
  CHECK_CUDA(cudaMalloc(&norm_dev, batch * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(norm_dev, norm.data(), batch * sizeof(float), cudaMemcpyHostToDevice));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int combos = 0, failed = 0;
  std::string first_failure;
  for (orthopt_dtype din : {ORTHOPT_FP32, ORTHOPT_BF16, ORTHOPT_FP16}) {
    GuardedBuf in(din, n, misalign);
    std::vector<float> x(n);  // the input values, exactly as stored
    for (int64_t e = 0; e < n; ++e) {
      float v = 0.0f;
      while (v == 0.0f) {  // never zeros
        encode(in.bytes, din, in.first() + e, normal(rng));
        v = static_cast<float>(decode(in.bytes, din, in.first() + e));
      }
      x[e] = v;
    }
    in.upload();
    for (orthopt_dtype dout : {ORTHOPT_FP32, ORTHOPT_BF16, ORTHOPT_FP16})
      for (int transpose : {0, 1})
        for (bool with_norm : {false, true}) {
          ++combos;
          GuardedBuf out(dout, n, misalign);
          out.poison();
          const orthopt_status st = orthopt_scale_cast(batch, rows, cols, in.data(), din, with_norm ? norm_dev : nullptr,
                                                       safety, eps, out.data(), dout, transpose, nullptr);
          const cudaError_t sync = cudaDeviceSynchronize();
          char config[160];
          std::snprintf(config, sizeof(config), "in=%s out=%s %s %s", name(din), name(dout),
                        transpose ? "transposed" : "as-is", with_norm ? "scaled" : "unscaled");
          if (st != ORTHOPT_OK || sync != cudaSuccess) {
            if (failed++ == 0)
              first_failure = std::string(config) + ": " + (st == ORTHOPT_OK ? "" : orthopt_last_error()) + " " +
                              cudaGetErrorString(sync);
            continue;
          }
          out.download();
          int64_t mismatches = 0, first_bad = -1;
          std::vector<unsigned char> expect(esize(dout) + 4);
          for (int64_t b = 0; b < batch; ++b) {
            const float d = host_divisor(norm[b], safety, eps);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < cols; ++c) {
                const int64_t src = b * mat + r * cols + c;
                const int64_t dst = b * mat + (transpose ? c * rows + r : r * cols + c);
                encode(expect, dout, 0, with_norm ? host_div(x[src], d) : x[src]);
                if (std::memcmp(expect.data(), out.element(dst), esize(dout)) != 0) {
                  if (first_bad < 0) first_bad = dst;
                  ++mismatches;
                }
              }
          }
          const bool guards = out.guards_poisoned();
          if (mismatches == 0 && guards) continue;
          if (failed++ == 0) {
            char detail[200];
            std::snprintf(detail, sizeof(detail), ": %lld of %lld elements differ (first at output element %lld)%s",
                          (long long)mismatches, (long long)n, (long long)first_bad,
                          guards ? "" : ", GUARD ELEMENTS OVERWRITTEN");
            first_failure = std::string(config) + detail;
          }
        }
  }
  cudaFree(norm_dev);
  if (failed) ++g_failures;
  std::printf("%s scale_cast batch=%-6lld rows=%-5lld cols=%-5lld %s %d/%d configurations bit-exact%s%s%s\n",
              failed ? "FAIL" : "ok  ", (long long)batch, (long long)rows, (long long)cols,
              misalign ? "misaligned" : "aligned   ", combos - failed, combos, note, failed ? "; first: " : "",
              first_failure.c_str());
}

// Captured in a CUDA graph and replayed: the same bytes as an eager call.
void check_scale_cast_graph(std::mt19937& rng) {
  const int64_t batch = 2, rows = 96, cols = 72, n = batch * rows * cols;
  std::vector<float> x(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng) + 4.0f;
  const float norm[2] = {3.5f, 0.25f};
  float *x_dev = nullptr, *norm_dev = nullptr;
  void *eager = nullptr, *graphed = nullptr;
  CHECK_CUDA(cudaMalloc(&x_dev, n * 4));
  CHECK_CUDA(cudaMalloc(&norm_dev, sizeof(norm)));
  CHECK_CUDA(cudaMalloc(&eager, n * 2));
  CHECK_CUDA(cudaMalloc(&graphed, n * 2));
  CHECK_CUDA(cudaMemcpy(x_dev, x.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(norm_dev, norm, sizeof(norm), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(eager, 0xFF, n * 2));
  CHECK_CUDA(cudaMemset(graphed, 0xFF, n * 2));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const orthopt_status st = orthopt_scale_cast(batch, rows, cols, x_dev, ORTHOPT_FP32, norm_dev, 1.02f, 1e-7f, graphed,
                                               ORTHOPT_BF16, 1, stream);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  bool ok = st == ORTHOPT_OK;
  if (!ok) std::printf("capture: %s\n", orthopt_last_error());
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));
  ok = ok && orthopt_scale_cast(batch, rows, cols, x_dev, ORTHOPT_FP32, norm_dev, 1.02f, 1e-7f, eager, ORTHOPT_BF16, 1,
                                nullptr) == ORTHOPT_OK;
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<unsigned char> a(n * 2), b(n * 2);
  CHECK_CUDA(cudaMemcpy(a.data(), eager, n * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.data(), graphed, n * 2, cudaMemcpyDeviceToHost));
  ok = ok && a == b;
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
  for (void* p : {static_cast<void*>(x_dev), static_cast<void*>(norm_dev), eager, graphed}) cudaFree(p);
  if (!ok) ++g_failures;
  std::printf("%s scale_cast captured in a CUDA graph, replay == eager call bit for bit\n", ok ? "ok  " : "FAIL");
}

void check_scale_cast_errors() {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));
  char* c = static_cast<char*>(p);
  auto has = [](const char* s) { return std::strstr(orthopt_last_error(), s) != nullptr; };
  auto invalid = [&](orthopt_status st, const char* what) { return st == ORTHOPT_ERR_INVALID && has(what); };
  constexpr orthopt_dtype F32 = ORTHOPT_FP32, B16 = ORTHOPT_BF16;
  const orthopt_dtype bad = static_cast<orthopt_dtype>(7);
  const bool oks[] = {
      invalid(orthopt_scale_cast(-1, 4, 4, p, F32, nullptr, 1, 0, c + 2048, F32, 0, nullptr), "'batch'"),
      invalid(orthopt_scale_cast(1, -4, 4, p, F32, nullptr, 1, 0, c + 2048, F32, 0, nullptr), "'rows'"),
      invalid(orthopt_scale_cast(1, 4, -4, p, F32, nullptr, 1, 0, c + 2048, F32, 0, nullptr), "'cols'"),
      invalid(orthopt_scale_cast(1, 4, 4, p, bad, nullptr, 1, 0, c + 2048, F32, 0, nullptr), "'in_dtype'"),
      invalid(orthopt_scale_cast(1, 4, 4, p, F32, nullptr, 1, 0, c + 2048, bad, 1, nullptr), "'out_dtype'"),
      invalid(orthopt_scale_cast(1, 4, 4, nullptr, F32, nullptr, 1, 0, c + 2048, F32, 0, nullptr), "'in'"),
      invalid(orthopt_scale_cast(1, 4, 4, p, F32, nullptr, 1, 0, nullptr, B16, 0, nullptr), "'out'"),
      invalid(orthopt_scale_cast(2, 8, 8, p, F32, nullptr, 1, 0, c + 256, B16, 1, nullptr), "overlaps"),
      invalid(orthopt_scale_cast(int64_t(1) << 40, int64_t(1) << 20, 1 << 10, p, F32, nullptr, 1, 0, c + 2048, F32, 0,
                                 nullptr),
              "too large"),
      // Empty batches are no-ops (no launch, pointers not needed).
      orthopt_scale_cast(0, 4, 4, nullptr, F32, nullptr, 1, 0, nullptr, F32, 1, nullptr) == ORTHOPT_OK,
      orthopt_scale_cast(3, 0, 4, nullptr, B16, nullptr, 1, 0, nullptr, F32, 0, nullptr) == ORTHOPT_OK,
  };
  cudaFree(p);
  std::string flags;
  bool ok = true;
  for (bool b : oks) {
    flags += b ? '1' : '0';
    ok = ok && b;
  }
  if (!ok) ++g_failures;
  std::printf("%s scale_cast argument errors (%s)\n", ok ? "ok  " : "FAIL", flags.c_str());
}

void check_scale_casts(bool quick, std::mt19937& rng) {
  check_scale_cast_errors();
  struct Shape {
    int64_t batch, rows, cols;
    bool misalign;
  };
  // Transposed, the 16-byte kernel takes a shape when cols·sizeof(in) and rows·sizeof(out) are
  // multiples of 16 and the buffers are aligned (all but the misaligned ones are), the
  // one-element kernel the others. 16-byte kernel for every dtype pair: 64×64 (full tiles),
  // 64×96 (ragged columns), 200×136 and 1000×520 (ragged both ways), 8×8 (less than a tile),
  // 64×4096, and 66000×8×8 (batch past one launch); for fp32 → fp32 only: 12×20. One-element
  // kernel: 33×65, 129×31, 7×5, 3×5, 2×8 and the misaligned shapes. 1×1, 1×40 and 40×1 move
  // nothing. The graph check (96×72, fp32 → bf16) takes the 16-byte kernel.
  std::vector<Shape> shapes = {
      {1, 1, 1, false},    {3, 33, 65, false}, {2, 129, 31, false}, {3, 64, 96, false},  // 16-byte path when as-is
      {3, 64, 96, true},   {1, 1, 40, false},  {2, 40, 1, false},   {2, 7, 5, false},    // scalar path
      {2, 64, 64, false},  {1, 65, 63, true},  {2, 200, 136, false}, {3, 12, 20, false},
      {1, 8, 8, false},
  };
  if (!quick) {
    shapes.push_back({3, 64, 4096, false});
    shapes.push_back({2, 1000, 520, false});
    shapes.push_back({1, 4096, 72, true});
    shapes.push_back({70000, 3, 5, false});  // batch > 65535: the transposed launch loops over the batch
    shapes.push_back({66000, 2, 8, false});
    shapes.push_back({66000, 8, 8, false});  // the 16-byte transpose, in two launches
  }
  for (const Shape& s : shapes) check_scale_cast(s.batch, s.rows, s.cols, s.misalign, rng);
  check_scale_cast_graph(rng);
}

}  // namespace

bool hopper() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

// orthopt_householder_panel against a float64 host reduction of the same panel (the same
// reflectors: β = −sign(α)·‖x‖, v_c = 1, a zero column takes v = e_c). V is poisoned and written
// with a row stride ldv (> cols: the gaps must keep their poison); A, a strided view (ld > cols),
// must keep its bytes. `wide_range` scales the columns by 1e30, 1e-30, 1, ...: V does not change
// under column scaling, and the kernel's fp32 sums must neither overflow nor underflow. V's
// entries are <= 1 and each comes from at most `cols` reflectors, each a dot of `rows` fp32
// products (≈ √rows·2^-24 relative): ≈ 1e-5 at 5632 rows; 1e-4 leaves a factor 10, a wrong
// entry is O(0.1). Panels taller than one CTA's registers run as a cluster of CTAs.
void check_householder_panel(int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t ldv, bool zero_col,
                             bool wide_range, std::mt19937& rng) {
  Buf32 A(batch * rows * ld), V(batch * rows * ldv);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& x : A.host) x = n(rng);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float& x = A.host[(b * rows + r) * ld + c];
        if (zero_col && c == cols / 2) x = 0.0f;
        if (wide_range) x *= c % 3 == 0 ? 1e30f : c % 3 == 1 ? 1e-30f : 1.0f;
      }
  const std::vector<float> A0 = A.host;
  A.upload();
  V.poison();  // 0xFF bytes on the device
  const orthopt_status st =
      orthopt_householder_panel(batch, rows, cols, A.dev, ld, rows * ld, V.dev, ldv, rows * ldv, nullptr);
  if (call_failed(st, "householder_panel")) return;
  A.download();
  V.download();
  double worst = 0.0;
  bool gaps_kept = true;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> P(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) P[r * cols + c] = A0[(b * rows + r) * ld + c];
    for (int64_t c = 0; c < cols; ++c) {
      double sigma = 0.0;
      for (int64_t r = c + 1; r < rows; ++r) sigma += P[r * cols + c] * P[r * cols + c];
      const double alpha = P[c * cols + c], norm = std::sqrt(alpha * alpha + sigma);
      const double scale = norm > 0.0 ? 1.0 / (alpha - (alpha < 0.0 ? norm : -norm)) : 0.0;
      for (int64_t r = c; r < rows; ++r) P[r * cols + c] = r == c ? 1.0 : P[r * cols + c] * scale;
      double vv = 0.0;
      for (int64_t r = c; r < rows; ++r) vv += P[r * cols + c] * P[r * cols + c];
      for (int64_t k = c + 1; k < cols; ++k) {
        double w = 0.0;
        for (int64_t r = c; r < rows; ++r) w += P[r * cols + c] * P[r * cols + k];
        for (int64_t r = c; r < rows; ++r) P[r * cols + k] -= (2.0 / vv) * w * P[r * cols + c];
      }
      for (int64_t r = 0; r < c; ++r) P[r * cols + c] = 0.0;
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const double got = V.host[(b * rows + r) * ldv + c];
        worst = std::max(worst, std::isfinite(got) ? std::fabs(got - P[r * cols + c]) / 1e-4 : 1e30);
      }
      for (int64_t c = cols; c < ldv; ++c) {
        uint32_t bits = 0;
        std::memcpy(&bits, &V.host[(b * rows + r) * ldv + c], sizeof(bits));
        gaps_kept &= bits == 0xFFFFFFFFu;
      }
    }
  }
  const bool a_kept = std::memcmp(A.host.data(), A0.data(), A0.size() * sizeof(float)) == 0;
  const bool ok = worst <= 1.0 && a_kept && gaps_kept;
  if (!ok) ++g_failures;
  std::printf("%s householder panel batch=%lld rows=%lld cols=%lld ld=%lld ldv=%lld%s%s worst err/tol=%.3f%s%s\n",
              ok ? "ok  " : "FAIL", (long long)batch, (long long)rows, (long long)cols, (long long)ld, (long long)ldv,
              zero_col ? " zero column" : "", wide_range ? " columns scaled 1e30/1e-30" : "", worst,
              a_kept ? "" : " INPUT-OVERWRITTEN", gaps_kept ? "" : " V-GAPS-WRITTEN");
}

// orthopt_householder_t_factor against a float64 back substitution of U = upper(G), diagonal
// halved, from the same fp32 G = VᵀV of random reflectors (unit diagonal, zeros above, entries
// ≈ 1/√rows below, as a panel's). G's lower triangle is NaN (it must not be read); T is poisoned
// and written with a row stride ldt (> n: the gaps must keep their poison). U's diagonal is >= 1/2
// and the reflectors are near orthogonal, so T's entries are O(1) and the fp32 rounding of each
// stored entry (2^-24 relative) carries through at most n terms: 1e-5 absolute is ≈ 5× that
// at n = 32; a wrong entry is O(0.1).
void check_householder_t_factor(int64_t batch, int64_t n, int64_t ldg, int64_t ldt, int64_t rows, std::mt19937& rng) {
  Buf32 G(batch * n * ldg), T(batch * n * ldt);
  std::normal_distribution<double> nd(0.0, 1.0 / std::sqrt(double(rows)));
  std::vector<double> ref(batch * n * n);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> V(rows * n, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n; ++c) V[r * n + c] = r < c ? 0.0 : r == c ? 1.0 : nd(rng);
    std::vector<double> U(n * n, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double g = 0.0;
        for (int64_t r = 0; r < rows; ++r) g += V[r * n + i] * V[r * n + j];
        const float g32 = static_cast<float>(g);
        G.host[(b * n + i) * ldg + j] = i > j ? std::numeric_limits<float>::quiet_NaN() : g32;
        if (i <= j) U[i * n + j] = i == j ? 0.5 * double(g32) : double(g32);
      }
    for (int64_t j = 0; j < n; ++j)  // T·U = I, column j from T's columns < j
      for (int64_t i = 0; i < n; ++i) {
        double s = i == j ? 1.0 : 0.0;
        for (int64_t k = i; k < j; ++k) s -= ref[(b * n + i) * n + k] * U[k * n + j];
        ref[(b * n + i) * n + j] = i <= j ? s / U[j * n + j] : 0.0;
      }
  }
  G.upload();
  T.poison();
  const orthopt_status st =
      orthopt_householder_t_factor(batch, n, G.dev, ldg, n * ldg, T.dev, ldt, n * ldt, nullptr);
  if (call_failed(st, "householder_t_factor")) return;
  T.download();
  double worst = 0.0;
  bool gaps_kept = true;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const double got = T.host[(b * n + i) * ldt + j];
        worst = std::max(worst, std::isfinite(got) ? std::fabs(got - ref[(b * n + i) * n + j]) / 1e-5 : 1e30);
      }
      for (int64_t j = n; j < ldt; ++j) {
        uint32_t bits = 0;
        std::memcpy(&bits, &T.host[(b * n + i) * ldt + j], sizeof(bits));
        gaps_kept &= bits == 0xFFFFFFFFu;
      }
    }
  const bool ok = worst <= 1.0 && gaps_kept;
  if (!ok) ++g_failures;
  std::printf("%s householder T factor batch=%lld n=%lld ldg=%lld ldt=%lld rows=%lld worst err/tol=%.3f%s\n",
              ok ? "ok  " : "FAIL", (long long)batch, (long long)n, (long long)ldg, (long long)ldt, (long long)rows,
              worst, gaps_kept ? "" : " T-GAPS-WRITTEN");
}

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("kernel_check: no CUDA device, skipped\n");
    return 77;
  }
  // --quick: the short list. --library-kernels-only: leave out the checks whose products run in
  // cuBLAS/cuBLASLt (the blocks and dense symmetric paths, orthopt_gemm), for racecheck: racecheck
  // 2025.3 dies at cuBLASLt's pointer-array products ("failed to handle a hardware exception")
  // and would end the run before our kernels are checked.
  bool quick = false, ours_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--library-kernels-only") {
      ours_only = true;
    } else {
      std::fprintf(stderr, "kernel_check: unknown argument '%s' (known: --quick, --library-kernels-only)\n",
                   arg.c_str());
      return 2;
    }
  }
  std::mt19937 rng(1234);
  check_errors();
  for (orthopt_dtype dt : {ORTHOPT_BF16, ORTHOPT_FP16}) {
    for (orthopt_sym_path path : orthopt_k::kSymPaths) {
      // KERNEL_CHECK_SYM_PATH=<name>: only that path's products (a sanitizer run on one kernel).
      if (const char* only = std::getenv("KERNEL_CHECK_SYM_PATH"); only && std::string(only) != name(path)) continue;
      if (ours_only && (path == ORTHOPT_SYM_BLOCKS || path == ORTHOPT_SYM_DENSE)) {
        std::printf("skip sym %s: its products run in cuBLAS (--library-kernels-only)\n", name(path));
        continue;
      }
      const bool persistent = path == ORTHOPT_SYM_PERSISTENT;
      if (persistent && !hopper()) {
        std::printf("skip sym %s: not a compute capability 9.0 device\n", name(path));
        continue;
      }
      check_sym(dt, path, 1, 200, 72, true, false, rng);    // ragged tiles, k not a multiple of 32
      check_sym(dt, path, 2, 136, 584, false, true, rng);   // k over many pipeline stages (ring wraps twice)
      check_sym(dt, path, 3, 256, 64, false, true, rng);    // batched, A≠B, β·C
      check_sym(dt, path, 2, 130, 40, true, true, rng);     // one row past a tile edge
      check_sym(dt, path, 1, 201, 96, false, false, rng);   // odd m
      check_sym(dt, path, 2, 300, 136, true, true, rng);    // 3 row blocks, tiles past m
      // The persistent kernel takes pairs of lower tiles (pairs sharing A, and pairs down column 0
      // computed transposed, a tile paired with itself where their count is odd), both
      // warpgroups on each; at m % 8 != 0 (130, 201 above) it hands over to its ping-pong
      // fallback, whose warpgroups take several tiles each (48×264: 288 tiles, 192 pairs on 132
      // multiprocessors), reusing their stages and C buffers. Several k-steps and pairs per CTA
      // (the ring wraps), with C and without, 4 and 8 block rows (ragged), and the producer-stores
      // epilogue's barriers over 2-3 blocks per CTA (320 pairs) with one k-step per block (its
      // stores and the buffers' refill at the same k-step), and (full list) 9 k-steps per block.
      if (persistent) {
        check_sym(dt, path, 48, 264, 64, true, true, rng);
        check_sym(dt, path, 48, 264, 200, false, true, rng);
        check_sym(dt, path, 48, 264, 456, true, false, rng);
        check_sym(dt, path, 48, 258, 64, true, true, rng);   // m % 8 != 0: the ping-pong fallback, several tiles each
        check_sym(dt, path, 3, 512, 328, true, true, rng);
        check_sym(dt, path, 2, 904, 136, false, true, rng);  // 8 block rows, ragged
        check_sym(dt, path, 64, 512, 64, false, true, rng);
        check_sym(dt, path, 64, 512, 64, true, false, rng);
        if (!quick) check_sym(dt, path, 40, 512, 520, false, true, rng);
      }
      // C is an operand as stored (the NS products' form): A = B = C, C = A ≠ B, C = B ≠ A, several
      // pairs per CTA with the ring wrapping (80×256: 160 pairs), and m % 128 != 0.
      check_sym(dt, path, 2, 256, 0, true, true, rng, /*c_alias=*/1);
      check_sym(dt, path, 3, 512, 0, false, true, rng, 1);
      check_sym(dt, path, 3, 512, 0, false, true, rng, 2);
      check_sym(dt, path, 2, 200, 0, false, true, rng, 1);
      if (persistent) check_sym(dt, path, 80, 256, 0, true, true, rng, 1);
      if (!quick) {
        check_sym(dt, path, 2, 1024, 0, false, true, rng, 2);
        check_sym(dt, path, 1, 1000, 520, false, true, rng);  // several panels / many tiles, ragged
        check_sym(dt, path, 2, 768, 1024, true, false, rng);
        check_sym(dt, path, 1, 520, 200, false, true, rng);  // 5 row blocks, the last one ragged
      }
    }
    // AUTO (its products may run in cuBLAS: not with --library-kernels-only): a small product
    // (dense) and one it gives the persistent kernel (m >= 768, k >= 2m; blocks or dense off Hopper).
    const char* only = std::getenv("KERNEL_CHECK_SYM_PATH");
    if (!ours_only && (!only || std::string(only) == name(ORTHOPT_SYM_AUTO))) {
      check_sym(dt, ORTHOPT_SYM_AUTO, 2, 200, 72, true, true, rng);
      check_sym(dt, ORTHOPT_SYM_AUTO, 1, 768, 1536, true, true, rng);
      check_sym(dt, ORTHOPT_SYM_AUTO, 2, 256, 0, true, true, rng, /*c_alias=*/1);
    }
    if (ours_only) {
      std::printf("skip gemm %s: orthopt_gemm runs in cuBLASLt (--library-kernels-only)\n", dt == ORTHOPT_BF16 ? "bf16" : "fp16");
      continue;
    }
    check_gemm(dt, 2, 96, 200, 72, 0, rng);
    check_gemm(dt, 1, 128, 136, 128, 1, rng);
    check_gemm(dt, 3, 64, 80, 64, 2, rng);
    // Operands stored transposed (Newton–Schulz in a tall matrix's own layout): Tᵀ·T, T·Qᵀ.
    check_gemm(dt, 2, 96, 96, 200, 0, rng, /*a_t=*/true, /*x_t=*/false);
    check_gemm(dt, 2, 72, 96, 96, 1, rng, /*a_t=*/false, /*x_t=*/true);
    check_gemm(dt, 3, 64, 80, 48, 2, rng, /*a_t=*/true, /*x_t=*/true);
    // fp32 C and D (Newton–Schulz's last product in the caller's dtype)
    check_gemm(dt, 2, 96, 200, 72, 0, rng, false, false, /*fp32_out=*/true);
    check_gemm(dt, 1, 128, 136, 128, 1, rng, false, false, true);
    check_gemm(dt, 3, 64, 80, 64, 2, rng, false, false, true);
    check_gemm(dt, 2, 96, 96, 200, 0, rng, /*a_t=*/true, /*x_t=*/true, true);
    if (!quick) check_gemm(dt, 2, 512, 1000, 512, 1, rng);
  }
  check_multi(quick, rng);
  check_scale_casts(quick, rng);
  // Householder panels: power-of-two widths and not, one row more than columns, a zero column,
  // columns 60 orders of magnitude apart, strided V; one CTA and clusters of 2, 6 and 8 (the
  // tallest panel of 32 columns), Llama's heights (full list).
  check_householder_panel(2, 50, 5, 7, 5, false, false, rng);
  check_householder_panel(1, 33, 32, 32, 35, true, false, rng);
  check_householder_panel(3, 200, 16, 20, 16, true, true, rng);
  check_householder_panel(2, 9, 9, 9, 9, false, false, rng);
  check_householder_panel(2, 1500, 32, 32, 33, false, true, rng);  // a cluster of 2
  if (!quick) {
    check_householder_panel(2, 2048, 16, 16, 16, false, false, rng);
    check_householder_panel(1, 5632, 8, 8, 8, true, false, rng);
    check_householder_panel(2, 5632, 32, 40, 32, true, false, rng);  // a cluster of 6
    check_householder_panel(1, 8192, 32, 32, 32, false, true, rng);  // 8: the largest
    check_householder_panel(1, 30000, 1, 1, 1, false, false, rng);
  }
  // T factors: one column, odd sizes, the full 32; batches not a multiple of the block's 4
  // warps; strided G and T.
  check_householder_t_factor(3, 1, 1, 2, 40, rng);
  check_householder_t_factor(7, 17, 20, 17, 300, rng);
  check_householder_t_factor(5, 32, 32, 36, 2048, rng);
  check_householder_t_factor(1, 9, 9, 9, 9, rng);
  std::printf("kernel_check: %s (%d failure%s)\n", g_failures ? "FAILED" : "passed", g_failures,
              g_failures == 1 ? "" : "s");
  return g_failures ? 1 : 0;
}

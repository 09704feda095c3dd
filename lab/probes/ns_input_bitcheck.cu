// Bit-identity harness for the Newton–Schulz input kernels (orthopt_momentum_ns_input, the
// one-pass form, and orthopt_norms_from_row_sumsq, the two-pass form's norms) between two trees:
// deterministic inputs over batches, shapes, dtypes, Nesterov and the skip flag, one FNV-1a hash
// per buffer written. The overflow handling of the NS input norms must leave every result whose
// sum of squares does not overflow as it was. lab/probes/bitcheck.sh ns_input builds it with
// -DPREV_NORMS_API against a tree whose orthopt_norms_from_row_sumsq takes (batch, rows, row_sumsq,
// norms, stream).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bitcheck_util.h"

// `count` tensors of `numel` elements each, 16-byte aligned, 0xFF between them.
struct Buf {
  orthopt_dtype dt;
  int64_t numel, stride;
  std::vector<unsigned char> host;
  unsigned char* dev = nullptr;
  std::vector<void*> p;
  std::vector<int64_t> sizes;
  Buf(orthopt_dtype d, int64_t count, int64_t n, bool poison, float scale = 1.0f, bool positive = false)
      : dt(d), numel(n), stride((n + 16) / 8 * 8) {
    host.assign(count * stride * es(dt), 0xFF);
    if (!poison)
      for (int64_t i = 0; i < count; ++i)
        for (int64_t e = 0; e < n; ++e) set(i * stride + e, (positive ? std::fabs(uni()) : uni()) * scale);
    CK(cudaMalloc(&dev, host.size()));
    CK(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
    for (int64_t i = 0; i < count; ++i) p.push_back(dev + i * stride * es(dt));
    sizes.assign(count, n);
  }
  ~Buf() { cudaFree(dev); }
  void set(int64_t e, float v) { store(host, dt, e, v); }
  uint64_t hash() { return device_hash(host, dev); }
  orthopt_tensor_list list() { return {static_cast<int64_t>(p.size()), sizes.data(), p.data(), dt}; }
};

int main() {
  uint8_t* keep = nullptr;
  CK(cudaMalloc(&keep, 2));
  const uint8_t k[2] = {1, 0};
  CK(cudaMemcpy(keep, k, 2, cudaMemcpyHostToDevice));
  unsigned int* arrived = nullptr;
  CK(cudaMalloc(&arrived, 2 * 512 * sizeof(unsigned int)));
  struct Shape { int64_t batch, rows, cols; };
  const Shape shapes[] = {{1, 64, 64}, {3, 130, 64}, {12, 768, 768}, {5, 256, 1024}, {40, 96, 128}, {2, 2304, 768}};
  struct Types { orthopt_dtype m, g, o; };
  const Types types[] = {{F, F, B}, {F, B, B}, {B, B, B}, {F, F, H}};
  int cfg = 0;
  for (const Shape s : shapes) {
    if (orthopt_momentum_ns_input_fits(s.rows, s.cols) != 1) {
      std::printf("%lldx%lldx%lld: does not fit the one-pass kernel here\n", (long long)s.batch, (long long)s.rows,
                  (long long)s.cols);
      continue;
    }
    const int64_t n = s.rows * s.cols;
    for (const Types t : types)
      for (int nest : {0, 1})
        for (int km : {0, 1, 2})
          for (float scale : {1.0f, 3e-4f}) {
            g_state = ++cfg;
            Buf M(t.m, s.batch, n, false, scale), G(t.g, s.batch, n, false, scale);
            Buf O(t.o, 1, s.batch * n, true), S(F, 1, s.batch * s.rows, true);
            const orthopt_ns_input_params prm{{nest ? 0.95 : 0.9, nest ? 1.0 : 0.1, nest}, 1.02f, 1e-7f};
            const orthopt_status st =
                orthopt_momentum_ns_input(M.list(), G.list(), s.rows, s.cols, O.p[0], t.o, prm,
                                          static_cast<float*>(S.p[0]), arrived,
                                          km == 0 ? nullptr : keep + (km - 1), nullptr);
            out("ns_input " + std::to_string(s.batch) + "x" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                    " " + nm(t.m) + "/" + nm(t.g) + "->" + nm(t.o) + " nest" + std::to_string(nest) + " keep" +
                    std::to_string(km) + " scale" + std::to_string(scale),
                st, {&M, &O, &S}, 70);
          }
    // The two-pass form's norms from row sums (positive, with zeros and tiny and large ones).
    for (float scale : {1.0f, 1e-30f, 1e30f}) {
      g_state = ++cfg;
      Buf S(F, 1, s.batch * s.rows, false, scale, true), X(F, 1, s.batch * n, false), N(F, 1, s.batch, true);
#ifdef PREV_NORMS_API
      const orthopt_status st = orthopt_norms_from_row_sumsq(s.batch, s.rows, static_cast<const float*>(S.p[0]),
                                                             static_cast<float*>(N.p[0]), nullptr);
#else
      const orthopt_status st =
          orthopt_norms_from_row_sumsq(s.batch, s.rows, s.cols, static_cast<const float*>(S.p[0]),
                                       static_cast<const float*>(X.p[0]), static_cast<float*>(N.p[0]), nullptr);
#endif
      out("norms " + std::to_string(s.batch) + "x" + std::to_string(s.rows) + " scale" + std::to_string(scale), st,
          {&N}, 70);
    }
  }
  std::printf("%d configurations, %d errors\n", cfg, g_fail);
  return g_fail ? 1 : 0;
}

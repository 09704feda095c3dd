// Bit-identity harness for the multi-tensor kernels: runs every flat operation (and
// momentum_rows) on deterministic inputs over many configurations and prints, per
// configuration, one FNV-1a hash of every buffer the call may write (gaps between tensors
// included). Build once against the previous C API (-DOLD_API, kernels of 0cfd7e1) and once
// against the new one; identical output = bit-identical results.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bitcheck_util.h"

static bool g_aligned = false;

enum Kind { kNormal, kPositive, kSteps, kPoison };

struct Buf {
  orthopt_dtype dt;
  std::vector<int64_t> numel, off;
  int64_t total = 0;
  std::vector<unsigned char> host;
  unsigned char* dev = nullptr;
  std::vector<void*> p;
  Buf(orthopt_dtype d, const std::vector<int64_t>& n, Kind kind, double scale = 1.0) : dt(d), numel(n) {
    auto place = [](int64_t at) { return g_aligned ? (at + 7) / 8 * 8 : at; };
    int64_t at = place(3);
    for (int64_t x : numel) {
      off.push_back(at);
      at = place(at + x + 3);
    }
    total = at;
    host.assign(total * es(dt), 0xFF);
    if (kind != kPoison) {
      std::vector<int64_t> local(total, -1);
      for (size_t i = 0; i < numel.size(); ++i)
        for (int64_t e = 0; e < numel[i]; ++e) local[off[i] + e] = e;
      for (int64_t e = 0; e < total; ++e) {
        float v = kind == kPositive ? std::fabs(uni()) * float(scale) : uni() * float(scale);
        if (local[e] >= 0 && local[e] % 16 == 5) v = 0.0f;  // zeros at the same place in every list
        set(e, v);
      }
      if (kind == kSteps) {
        static const float counts[] = {0, 1, 2, 9, 999};
        for (size_t i = 0; i < off.size(); ++i) set(off[i], counts[i % 5]);
      }
    }
    CK(cudaMalloc(&dev, host.size()));
    CK(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
    for (int64_t o : off) p.push_back(dev + o * es(dt));
  }
  ~Buf() { cudaFree(dev); }
  void set(int64_t e, float v) { store(host, dt, e, v); }
  uint64_t hash() { return device_hash(host, dev); }
#ifndef OLD_API
  orthopt_tensor_list desc(bool present = true) {
    return {static_cast<int64_t>(numel.size()), numel.data(), present ? p.data() : nullptr, dt};
  }
#endif
};

struct Dev {
  double* lr = nullptr;
  uint8_t* keep = nullptr;
  Dev() {
    const double v = 0.037;
    CK(cudaMalloc(&lr, 8));
    CK(cudaMemcpy(lr, &v, 8, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&keep, 2));
    const uint8_t k[2] = {1, 0};
    CK(cudaMemcpy(keep, k, 2, cudaMemcpyHostToDevice));
  }
  const uint8_t* keep_ptr(int mode) const { return mode == 0 ? nullptr : (mode == 1 ? keep : keep + 1); }
};

static std::string sizes_name(const std::vector<int64_t>& n) { return "n" + std::to_string(n.size()); }

int main() {
  const Dev dev;
  std::vector<std::vector<int64_t>> sets = {{0, 1, 3, 4, 5, 17, 4095, 16384, 16385, 70001, 262147}};
  {
    std::vector<int64_t> many;
    for (int i = 0; i < 150; ++i) many.push_back(i % 23 == 7 ? 0 : (int64_t(i) * 7919) % 3000 + 1);
    sets.push_back(many);
  }
  int cfg = 0;
  for (bool aligned : {false, true}) {
    g_aligned = aligned;
    const std::string al = aligned ? "al " : "un ";
    for (const auto& sz : sets) {
      // momentum
      struct MC { orthopt_dtype m, g, o; bool has_out; };
      for (MC c : {MC{F, F, F, true}, MC{F, B, B, true}, MC{B, B, H, true}, MC{H, F, B, true}, MC{F, B, F, false}})
        for (int nest : {0, 1})
          for (int keep : {0, 1, 2}) {
            g_state = ++cfg;
            Buf M(c.m, sz, kNormal), G(c.g, sz, kNormal), O(c.o, sz, kPoison);
            const double mu = nest ? 0.95 : 0.9, w = nest ? 1.0 : 0.1;
#ifdef OLD_API
            const orthopt_status st = orthopt_multi_momentum(
                int64_t(sz.size()), sz.data(), M.p.data(), c.m, G.p.data(), c.g, c.has_out ? O.p.data() : nullptr, c.o,
                mu, w, nest, dev.keep_ptr(keep), nullptr);
#else
            const orthopt_status st =
                orthopt_multi_momentum(M.desc(), G.desc(), O.desc(c.has_out), {mu, w, nest}, dev.keep_ptr(keep), nullptr);
#endif
            out(al + "momentum " + sizes_name(sz) + " " + nm(c.m) + nm(c.g) + (c.has_out ? nm(c.o) : "-") + " nest" +
                    std::to_string(nest) + " keep" + std::to_string(keep),
                st, {&M, &O});
          }
      // update (plain)
      struct UC { orthopt_dtype w, d, p; bool copy; };
      struct DC { double wd; int cautious; };
      for (UC c : {UC{F, F, F, false}, UC{F, B, B, true}, UC{B, H, F, false}, UC{F, F, H, true}})
        for (DC d : {DC{0.0, 0}, DC{0.1, 0}, DC{0.1, 1}})
          for (int keep : {0, 2}) {
            g_state = ++cfg;
            Buf W(c.w, sz, kNormal, 0.5), D(c.d, sz, kNormal), P(c.p, sz, kPoison);
            std::vector<double> factor;
            for (size_t i = 0; i < sz.size(); ++i) factor.push_back(0.5 + 0.25 * double(i % 7));
#ifdef OLD_API
            const orthopt_status st = orthopt_multi_update(int64_t(sz.size()), sz.data(), W.p.data(), c.w, D.p.data(),
                                                           c.d, c.copy ? P.p.data() : nullptr, c.p, factor.data(),
                                                           nullptr, 0, dev.lr, d.wd, d.cautious, dev.keep_ptr(keep),
                                                           nullptr);
#else
            const orthopt_status st =
                orthopt_multi_update(W.desc(), D.desc(), P.desc(c.copy), orthopt_tensor_list{},
                                     {{dev.lr, d.wd, d.cautious}, factor.data(), 0}, dev.keep_ptr(keep), nullptr);
#endif
            out(al + "update " + sizes_name(sz) + " " + nm(c.w) + nm(c.d) + (c.copy ? nm(c.p) : "-") + " wd" +
                    std::to_string(d.wd) + " c" + std::to_string(d.cautious) + " keep" + std::to_string(keep),
                st, {&W, &P});
          }
      // AdamW (exp_avg and exp_avg_sq of one dtype: the old API's state_dtype)
      struct AC { orthopt_dtype g, s, w, p; bool copy; };
      for (AC c : {AC{F, F, F, F, false}, AC{B, F, F, B, true}, AC{B, B, B, F, false}, AC{H, F, B, H, true}})
        for (DC d : {DC{0.0, 0}, DC{0.1, 0}, DC{0.1, 1}})
          for (int keep : {0, 2}) {
            g_state = ++cfg;
            Buf G(c.g, sz, kNormal), M(c.s, sz, kNormal, 0.1), V(c.s, sz, kPositive, 0.01),
                S(F, std::vector<int64_t>(sz.size(), 1), kSteps), W(c.w, sz, kNormal, 0.5), P(c.p, sz, kPoison);
#ifdef OLD_API
            std::vector<float*> steps;
            for (void* q : S.p) steps.push_back(static_cast<float*>(q));
            const orthopt_status st = orthopt_multi_adamw(
                int64_t(sz.size()), sz.data(), G.p.data(), c.g, M.p.data(), V.p.data(), c.s, steps.data(), W.p.data(),
                c.w, c.copy ? P.p.data() : nullptr, c.p, dev.lr, 0.9, 0.95, 1e-8, d.wd, d.cautious, dev.keep_ptr(keep),
                nullptr);
#else
            const orthopt_status st =
                orthopt_multi_adamw(G.desc(), M.desc(), V.desc(), S.desc(), W.desc(), P.desc(c.copy),
                                    {{dev.lr, d.wd, d.cautious}, 0.9, 0.95, 1e-8}, dev.keep_ptr(keep), nullptr);
#endif
            out(al + "adamw " + sizes_name(sz) + " " + nm(c.g) + nm(c.s) + nm(c.w) + (c.copy ? nm(c.p) : "-") + " wd" +
                    std::to_string(d.wd) + " c" + std::to_string(d.cautious) + " keep" + std::to_string(keep),
                st, {&M, &V, &S, &W, &P});
          }
      // Lion
      struct LC { orthopt_dtype g, s, w, p; bool copy; };
      for (LC c : {LC{F, F, F, F, false}, LC{B, F, F, B, true}, LC{H, H, H, F, false}})
        for (DC d : {DC{0.0, 0}, DC{0.1, 0}, DC{0.1, 1}})
          for (int keep : {0, 2}) {
            g_state = ++cfg;
            Buf G(c.g, sz, kNormal), M(c.s, sz, kNormal, 0.3), W(c.w, sz, kNormal, 0.5), P(c.p, sz, kPoison);
#ifdef OLD_API
            const orthopt_status st = orthopt_multi_lion(int64_t(sz.size()), sz.data(), G.p.data(), c.g, M.p.data(),
                                                         c.s, W.p.data(), c.w, c.copy ? P.p.data() : nullptr, c.p,
                                                         dev.lr, 0.9, 0.99, d.wd, d.cautious, dev.keep_ptr(keep),
                                                         nullptr);
#else
            const orthopt_status st = orthopt_multi_lion(G.desc(), M.desc(), W.desc(), P.desc(c.copy),
                                                         {{dev.lr, d.wd, d.cautious}, 0.9, 0.99}, dev.keep_ptr(keep),
                                                         nullptr);
#endif
            out(al + "lion " + sizes_name(sz) + " " + nm(c.g) + nm(c.s) + nm(c.w) + (c.copy ? nm(c.p) : "-") + " wd" +
                    std::to_string(d.wd) + " c" + std::to_string(d.cautious) + " keep" + std::to_string(keep),
                st, {&M, &W, &P});
          }
    }
    // Row-shaped operations: tensors of R_j rows of cols.
    const std::vector<int64_t> R = {5, 1, 64, 300, 17, 0, 2};
    for (int64_t cols : {64, 6, 768, 1001}) {
      std::vector<int64_t> numel;
      for (int64_t r : R) numel.push_back(r * cols);
      // row-scaled update
      struct UC { orthopt_dtype w, d, p; bool copy; int wd_mode; };
      for (UC c : {UC{F, B, F, false, 0}, UC{F, H, B, true, 1}, UC{B, F, F, false, 2}, UC{F, F, B, true, 0}})
        for (int keep : {0, 2}) {
          g_state = ++cfg;
          Buf W(c.w, numel, kNormal, 0.5), D(c.d, numel, kNormal), P(c.p, numel, kPoison), S(F, R, kPositive, 2.0);
          std::vector<double> factor;
          for (size_t i = 0; i < R.size(); ++i) factor.push_back(0.5 + 0.25 * double(i % 7));
          const double wd = c.wd_mode ? 0.1 : 0.0;
          const int cautious = c.wd_mode == 2;
#ifdef OLD_API
          std::vector<const float*> sc;
          for (void* q : S.p) sc.push_back(static_cast<const float*>(q));
          const orthopt_status st = orthopt_multi_update(int64_t(R.size()), numel.data(), W.p.data(), c.w, D.p.data(),
                                                         c.d, c.copy ? P.p.data() : nullptr, c.p, factor.data(),
                                                         sc.data(), cols, dev.lr, wd, cautious, dev.keep_ptr(keep),
                                                         nullptr);
#else
          const orthopt_status st =
              orthopt_multi_update(W.desc(), D.desc(), P.desc(c.copy), S.desc(),
                                   {{dev.lr, wd, cautious}, factor.data(), cols}, dev.keep_ptr(keep), nullptr);
#endif
          out(al + "update_rows cols" + std::to_string(cols) + " " + nm(c.w) + nm(c.d) + (c.copy ? nm(c.p) : "-") +
                  " wdmode" + std::to_string(c.wd_mode) + " keep" + std::to_string(keep),
              st, {&W, &P});
        }
      // update through a row map
      for (UC c : {UC{F, F, F, false, 1}, UC{F, F, B, true, 2}, UC{B, H, F, false, 2}, UC{F, B, H, true, 0}})
        for (int keep : {0, 2}) {
          g_state = ++cfg;
          std::vector<int64_t> dnumel;
          std::vector<std::vector<int32_t>> maps;
          for (int64_t r : R) {
            const int64_t k = r == 0 ? 0 : std::max<int64_t>(1, r / 4);
            maps.emplace_back(r, -1);
            for (int64_t s = 0; s < k; ++s) maps.back()[(s * 7 + 3) % r] = -2;  // marks, resolved below
            int32_t next = 0;
            for (int64_t i = 0; i < r; ++i)
              if (maps.back()[i] == -2) maps.back()[i] = next++;
            dnumel.push_back(int64_t(next) * cols);
          }
          Buf W(c.w, numel, kNormal, 0.5), D(c.d, dnumel, kNormal), P(c.p, numel, kPoison);
          std::vector<int32_t*> mdev;
          for (const auto& m : maps) {
            int32_t* q = nullptr;
            CK(cudaMalloc(&q, std::max<size_t>(1, m.size()) * 4));
            if (!m.empty()) CK(cudaMemcpy(q, m.data(), m.size() * 4, cudaMemcpyHostToDevice));
            mdev.push_back(q);
          }
          std::vector<double> factor;
          for (size_t i = 0; i < R.size(); ++i) factor.push_back(0.5 + 0.25 * double(i));
          const double wd = c.wd_mode ? 0.1 : 0.0;
          const int cautious = c.wd_mode == 2;
#ifdef OLD_API
          const std::vector<const int32_t*> mp(mdev.begin(), mdev.end());
          const orthopt_status st = orthopt_multi_update_selected(
              int64_t(R.size()), numel.data(), W.p.data(), c.w, D.p.data(), c.d, mp.data(), cols,
              c.copy ? P.p.data() : nullptr, c.p, factor.data(), dev.lr, wd, cautious, dev.keep_ptr(keep), nullptr);
#else
          std::vector<void*> mp(mdev.begin(), mdev.end());
          const orthopt_status st = orthopt_multi_update_selected(
              W.desc(), D.desc(), {int64_t(R.size()), R.data(), mp.data(), F}, P.desc(c.copy),
              {{dev.lr, wd, cautious}, factor.data(), cols}, dev.keep_ptr(keep), nullptr);
#endif
          out(al + "update_selected cols" + std::to_string(cols) + " " + nm(c.w) + nm(c.d) +
                  (c.copy ? nm(c.p) : "-") + " wdmode" + std::to_string(c.wd_mode) + " keep" + std::to_string(keep),
              st, {&W, &P});
          for (int32_t* q : mdev) cudaFree(q);
        }
      // momentum with row statistics
      struct RC { orthopt_dtype m, g, o; bool has_out; orthopt_row_stat stat; int nest; };
      for (RC c : {RC{F, F, F, false, ORTHOPT_ROW_L1_MOMENTUM, 0}, RC{B, F, F, false, ORTHOPT_ROW_L1_MOMENTUM, 0},
                   RC{F, B, B, true, ORTHOPT_ROW_SUMSQ_OUT, 1}, RC{B, F, H, true, ORTHOPT_ROW_SUMSQ_OUT, 0},
                   RC{F, F, F, false, ORTHOPT_ROW_SUMSQ_OUT, 1}})
        for (int keep : {0, 2}) {
          g_state = ++cfg;
          Buf M(c.m, numel, kNormal), G(c.g, numel, kNormal), O(c.o, numel, kPoison), S(F, R, kPoison);
#ifdef OLD_API
          std::vector<float*> sp;
          for (void* q : S.p) sp.push_back(static_cast<float*>(q));
          const orthopt_status st = orthopt_multi_momentum_rows(
              int64_t(R.size()), numel.data(), cols, M.p.data(), c.m, G.p.data(), c.g, c.has_out ? O.p.data() : nullptr,
              c.o, 0.95, 0.05, c.nest, c.stat, sp.data(), dev.keep_ptr(keep), nullptr);
#else
          const orthopt_status st =
              orthopt_multi_momentum_rows(M.desc(), G.desc(), O.desc(c.has_out), S.desc(), cols, {0.95, 0.05, c.nest},
                                          c.stat, dev.keep_ptr(keep), nullptr);
#endif
          out(al + "momentum_rows cols" + std::to_string(cols) + " " + nm(c.m) + nm(c.g) +
                  (c.has_out ? nm(c.o) : "-") + " stat" + std::to_string(int(c.stat)) + " keep" + std::to_string(keep),
              st, {&M, &O, &S});
        }
    }
  }
  std::printf("%d configurations, %d errors\n", cfg, g_fail);
  return g_fail ? 1 : 0;
}

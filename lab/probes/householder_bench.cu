// Timings of the Householder panel kernel (orthopt_householder_panel) on the panels of Dion's
// blocked QR (GPT-2 and Llama P banks) at widths 32, 16 and 8, with the waves the planner
// (orthopt_householder_panel_waves) sees for each. Where the time goes: at widths 32 and 16 the
// panel is also timed with 4 columns fewer (the same kernel instance, still 16-byte loads), so
// the difference is the cost of 4 columns and the rest the launch, the loads, the column scaling
// and the stores. CUDA events, median of 30 launches after 5 warm-ups. Prints a markdown table.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "orthopt_kernels.h"
#include "bench_check.h"

namespace {

double panel_median_ms(int64_t batch, int64_t rows, int64_t cols, const float* A, float* V) {
  return median_ms([&] { CK(orthopt_householder_panel(batch, rows, cols, A, 32, rows * 32, V, 32, rows * 32, nullptr)); });
}

}  // namespace

int main() {
  require_device("householder_bench");
  struct Shape { int64_t batch, rows; const char* what; };
  const std::vector<Shape> shapes = {{12, 768, "GPT-2 768-row P"},   {12, 3072, "GPT-2 3072-row P"},
                                     {88, 2048, "Llama 2048-row P"}, {22, 2048, "Llama 2048-row P (22)"},
                                     {22, 5632, "Llama 5632-row P"}};
  size_t most = 0;
  for (const auto& s : shapes) most = std::max(most, static_cast<size_t>(s.batch * s.rows * 32));
  float *A = nullptr, *V = nullptr;
  CK(cudaMalloc(&A, most * sizeof(float)));
  CK(cudaMalloc(&V, most * sizeof(float)));
  fill_uniform<<<1024, 256>>>(A, most, 7, 1.0f);
  CK(cudaDeviceSynchronize());
  std::printf("| panels | width | waves | ms | ms, 4 columns fewer | us per column (the last 4) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    for (int64_t w : {32, 16, 8}) {
      const int64_t waves = orthopt_householder_panel_waves(s.batch, s.rows, w);
      if (s.rows > orthopt_householder_panel_max_rows(w)) continue;
      const double full = panel_median_ms(s.batch, s.rows, w, A, V);
      std::printf("| %lld×%lld (%s) | %lld | %lld | %.4f |", (long long)s.batch, (long long)s.rows, s.what,
                  (long long)w, (long long)waves, full);
      if (w >= 16) {
        const double part = panel_median_ms(s.batch, s.rows, w - 4, A, V);
        std::printf(" %.4f | %.2f |\n", part, 1e3 * (full - part) / 4.0);
      } else {
        std::printf(" – | – |\n");
      }
    }
  }
  CK(cudaFree(A));
  CK(cudaFree(V));
  return 0;
}

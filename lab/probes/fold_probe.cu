// What folding Muon's update into the last Newton–Schulz product would cost and save, before
// building it (docs/decisions/fold-update.md): W ← β·W + α·(Q·X) as cuBLASLt's β·C epilogue with fp32
// C = D = W, against today's last product writing U = Q·X in bf16 and the update pass reading
// W and U and writing W (10 bytes per element). The weights of a bank are separate tensors, so
// the folded product needs cuBLASLt's pointer-array batch mode; it is timed next to the same
// product over one strided fp32 stack (what the pointer arrays might cost) and the bf16 one.
// Shapes: the last products of GPT-2's banks (Q [B, 768, 768] · X [B, 768, n]). α, β are device
// scalars (CUBLASLT_POINTER_MODE_DEVICE), as a graph-captured step needs. CUDA events, median of
// 30 after 5 warm-ups, the heuristic's first algorithm and the fastest of its first 8. Prints a
// markdown table; checks the folded result against the two-pass one on the first matrices.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "bench_check.h"

namespace {

// Today's update pass, as a stand-in with the same traffic: W ← β·W + α·float(U), 16-byte loads.
__global__ void update(float* const* W, const __nv_bfloat16* U, size_t per, int batch, const float* ab) {
  const float alpha = ab[0], beta = ab[1];
  const size_t total = per * batch / 8;
  for (size_t v = blockIdx.x * size_t(blockDim.x) + threadIdx.x; v < total; v += size_t(gridDim.x) * blockDim.x) {
    const size_t e = v * 8, b = e / per, o = e % per;
    const uint4 u = reinterpret_cast<const uint4*>(U)[v];
    const __nv_bfloat16* uh = reinterpret_cast<const __nv_bfloat16*>(&u);
    float4* w = reinterpret_cast<float4*>(W[b] + o);
    float4 w0 = w[0], w1 = w[1];
    w0.x = beta * w0.x + alpha * __bfloat162float(uh[0]);
    w0.y = beta * w0.y + alpha * __bfloat162float(uh[1]);
    w0.z = beta * w0.z + alpha * __bfloat162float(uh[2]);
    w0.w = beta * w0.w + alpha * __bfloat162float(uh[3]);
    w1.x = beta * w1.x + alpha * __bfloat162float(uh[4]);
    w1.y = beta * w1.y + alpha * __bfloat162float(uh[5]);
    w1.z = beta * w1.z + alpha * __bfloat162float(uh[6]);
    w1.w = beta * w1.w + alpha * __bfloat162float(uh[7]);
    w[0] = w0;
    w[1] = w1;
  }
}


struct Product {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;
};

// Row-major D [m, n] = Q [m, m] · X [m, n] as cuBLASLt's column-major Dᵀ = Xᵀ · Qᵀ.
Product make(cublasLtHandle_t lt, int batch, int64_t m, int64_t n, cudaDataType_t out, bool pointer_array,
             bool device_scalars, size_t workspace) {
  Product p;
  CK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (device_scalars) {
    const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)));
  }
  const int32_t count = batch;
  const uint32_t batch_mode = pointer_array ? CUBLASLT_BATCH_MODE_POINTER_ARRAY : CUBLASLT_BATCH_MODE_STRIDED;
  auto layout = [&](cublasLtMatrixLayout_t* l, cudaDataType_t t, int64_t rows, int64_t cols) {
    CK(cublasLtMatrixLayoutCreate(l, t, rows, cols, rows));
    CK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    if (pointer_array) {
      CK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &batch_mode, sizeof(batch_mode)));
    } else {
      const int64_t stride = rows * cols;
      CK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  };
  layout(&p.a, CUDA_R_16BF, n, m);  // Xᵀ
  layout(&p.b, CUDA_R_16BF, m, m);  // Qᵀ
  layout(&p.c, out, n, m);          // Dᵀ (C = D)
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                          sizeof(workspace)));
  cublasLtMatmulHeuristicResult_t r[8] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 8, r, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (r[i].state == CUBLAS_STATUS_SUCCESS) p.algos.push_back(r[i].algo);
  return p;
}

}  // namespace

int main() {
  require_device("fold_probe");
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  const size_t workspace = size_t(32) << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, workspace));
  struct Shape { int batch; int64_t m, n; const char* what; };
  const std::vector<Shape> shapes = {{12, 768, 2304, "GPT-2 768x2304 bank"},
                                     {24, 768, 3072, "GPT-2 768x3072 banks (fc and proj)"},
                                     {12, 768, 768, "GPT-2 768x768 bank"}};
  // ab = {α, β}: a step's -lr·adjustment and 1 - lr·wd.
  float* ab = nullptr;
  CK(cudaMalloc(&ab, 2 * sizeof(float)));
  const float host_ab[2] = {-0.0173f, 0.9999f};
  CK(cudaMemcpy(ab, host_ab, sizeof(host_ab), cudaMemcpyHostToDevice));
  std::printf("| bank | bf16 U (strided) + update | update alone | folded, strided fp32 | folded, pointer arrays | heuristic's first | saved | algos (ptr-array) | max rel. diff |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const int64_t m = s.m, n = s.n;
    const size_t per = size_t(m) * n, q_per = size_t(m) * m;
    __nv_bfloat16 *Q, *X, *U;
    float *Wstack;
    CK(cudaMalloc(&Q, q_per * s.batch * 2));
    CK(cudaMalloc(&X, per * s.batch * 2));
    CK(cudaMalloc(&U, per * s.batch * 2));
    CK(cudaMalloc(&Wstack, per * s.batch * 4));
    fill_uniform<<<1024, 256>>>(Q, q_per * s.batch, 1, 0.05f);
    fill_uniform<<<1024, 256>>>(X, per * s.batch, 2, 1.0f);
    fill_uniform<<<1024, 256>>>(Wstack, per * s.batch, 3, 1.0f);
    // Separate weights (as separate parameters are), in reverse order so no stride links them.
    std::vector<float*> W(s.batch);
    for (int i = s.batch - 1; i >= 0; --i) CK(cudaMalloc(&W[i], per * 4));
    for (int i = 0; i < s.batch; ++i) CK(cudaMemcpy(W[i], Wstack + per * i, per * 4, cudaMemcpyDeviceToDevice));
    std::vector<const void*> hx(s.batch), hq(s.batch);
    std::vector<void*> hw(s.batch);
    for (int i = 0; i < s.batch; ++i) {
      hx[i] = X + per * i;
      hq[i] = Q + q_per * i;
      hw[i] = W[i];
    }
    void **dx, **dq, **dw;
    CK(cudaMalloc(&dx, s.batch * sizeof(void*)));
    CK(cudaMalloc(&dq, s.batch * sizeof(void*)));
    CK(cudaMalloc(&dw, s.batch * sizeof(void*)));
    CK(cudaMemcpy(dx, hx.data(), s.batch * sizeof(void*), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, hq.data(), s.batch * sizeof(void*), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw.data(), s.batch * sizeof(void*), cudaMemcpyHostToDevice));

    Product bf = make(lt, s.batch, m, n, CUDA_R_16BF, false, true, workspace);
    Product fs = make(lt, s.batch, m, n, CUDA_R_32F, false, true, workspace);
    Product fp = make(lt, s.batch, m, n, CUDA_R_32F, true, true, workspace);
    auto best = [&](Product& p, const void* a, const void* b, const void* c, void* d, const float* alpha,
                    const float* beta) {
      double t = -1;
      for (const auto& algo : p.algos) {
        auto run = [&] {
          CK(cublasLtMatmul(lt, p.op, alpha, a, p.a, b, p.b, beta, c, p.c, d, p.c, &algo, ws, workspace, nullptr));
        };
        if (cublasLtMatmul(lt, p.op, alpha, a, p.a, b, p.b, beta, c, p.c, d, p.c, &algo, ws, workspace, nullptr) !=
            CUBLAS_STATUS_SUCCESS)
          continue;
        const double ms = median_ms(run);
        if (t < 0 || ms < t) t = ms;
      }
      return t;
    };
    const float one_zero[2] = {1.0f, 0.0f};
    float* d_one_zero = nullptr;
    CK(cudaMalloc(&d_one_zero, 2 * sizeof(float)));
    CK(cudaMemcpy(d_one_zero, one_zero, sizeof(one_zero), cudaMemcpyHostToDevice));
    const double t_bf = best(bf, X, Q, U, U, d_one_zero, d_one_zero + 1);
    const double t_upd = median_ms([&] { update<<<132 * 8, 256>>>(reinterpret_cast<float* const*>(dw), U, per, s.batch, ab); });
    const double t_fs = best(fs, X, Q, Wstack, Wstack, ab, ab + 1);
    const double t_fp = fp.algos.empty() ? -1 : best(fp, dx, dq, dw, dw, ab, ab + 1);
    // The heuristic's first choice alone: what orthopt_gemm_update runs (it cannot time
    // candidates on the weights it writes).
    double t_fp0 = -1;
    if (!fp.algos.empty()) {
      Product first = fp;
      first.algos.resize(1);
      t_fp0 = best(first, dx, dq, dw, dw, ab, ab + 1);
    }

    // Check: from the same W, the folded pointer-array product against bf16 U + update (they
    // differ by U's bf16 rounding, ≈ |α|·|U|·2⁻⁹ per element).
    double max_rel = -1;
    if (!fp.algos.empty()) {
      for (int i = 0; i < s.batch; ++i) CK(cudaMemcpy(W[i], Wstack + per * i, per * 4, cudaMemcpyDeviceToDevice));
      std::vector<float> w0(per);
      CK(cudaMemcpy(w0.data(), W[0], per * 4, cudaMemcpyDeviceToHost));
      CK(cublasLtMatmul(lt, fp.op, ab, dx, fp.a, dq, fp.b, ab + 1, dw, fp.c, dw, fp.c, &fp.algos[0], ws, workspace,
                        nullptr));
      std::vector<float> folded(per), two(per);
      CK(cudaMemcpy(folded.data(), W[0], per * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(W[0], w0.data(), per * 4, cudaMemcpyHostToDevice));
      CK(cublasLtMatmul(lt, bf.op, d_one_zero, X, bf.a, Q, bf.b, d_one_zero + 1, U, bf.c, U, bf.c, &bf.algos[0], ws,
                        workspace, nullptr));
      update<<<132 * 8, 256>>>(reinterpret_cast<float* const*>(dw), U, per, 1, ab);
      CK(cudaMemcpy(two.data(), W[0], per * 4, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t e = 0; e < per; ++e) {
        num = std::max(num, double(std::fabs(folded[e] - two[e])));
        den = std::max(den, double(std::fabs(two[e] - w0[e] * host_ab[1])));
      }
      max_rel = num / den;  // relative to the largest step α·U
    }
    std::printf("| %s (%d×%lld×%lld) | %.4f + %.4f = %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %zu | %.2e |\n", s.what,
                s.batch, static_cast<long long>(m), static_cast<long long>(n), t_bf, t_upd, t_bf + t_upd, t_upd, t_fs,
                t_fp, t_fp0, t_fp > 0 ? t_bf + t_upd - t_fp : 0.0, fp.algos.size(), max_rel);
    CK(cudaFree(Q));
    CK(cudaFree(X));
    CK(cudaFree(U));
    CK(cudaFree(Wstack));
    for (float* w : W) CK(cudaFree(w));
    CK(cudaFree(dx));
    CK(cudaFree(dq));
    CK(cudaFree(dw));
    CK(cudaFree(d_one_zero));
  }
  std::printf("\n(ms; `saved`: bf16 U + update minus the folded pointer-array product; a -1 time: no algorithm)\n");
  return 0;
}

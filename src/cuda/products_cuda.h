#pragma once
// ATen glue over the CUDA kernel library (kernels/include/orthopt_kernels.h): the Newton–Schulz
// products on CUDA tensors in bf16/fp16. Compiled only when torch has CUDA and the kernels
// are built (ORTHOPT_WITH_CUDA).
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/ATen.h>

namespace orthopt::cuda {

// Whether the kernels take this operand: a CUDA tensor in bf16 or fp16, and routing not
// switched off by the environment variable ORTHOPT_GPU_KERNELS=0 (read at each call, so a
// test can compare against the ATen reference path in one process).
bool handles(const at::Tensor& t);

// alpha·A·Bᵀ + beta·C + diag·I for A, B [batch, m, k], C [batch, m, m] (undefined: none).
// The caller promises A·Bᵀ is symmetric (B == A, or commuting symmetric A, B with k == m);
// only the lower triangle is computed and the result is exactly symmetric.
at::Tensor sym_abt(const at::Tensor& A, const at::Tensor& B, double alpha, const at::Tensor& C, double beta,
                   double diag);

// alpha·A·X + beta·C for A [batch, m, k], X [batch, k, n], C [batch, m, n] (undefined: none).
at::Tensor gemm(const at::Tensor& A, const at::Tensor& X, double alpha, const at::Tensor& C, double beta);

}  // namespace orthopt::cuda
#endif

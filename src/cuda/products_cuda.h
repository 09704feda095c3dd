#pragma once
// ATen glue over the CUDA kernel library (kernels/include/orthopt/kernels/): the Newton–Schulz
// products on CUDA tensors in bf16/fp16, and the scaled cast/transpose that prepares the NS input
// and makes tall NS results contiguous. Compiled only when torch has CUDA and the kernels
// are built (ORTHOPT_WITH_CUDA).
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/ATen.h>

#include <optional>

namespace orthopt::cuda {

// Whether the kernels take this operand: a CUDA tensor in bf16 or fp16, with the kernels on in
// this thread (kernels_enabled(): off inside a KernelsScope of execution kernels=off).
bool handles(const at::Tensor& t);

// Whether t [B, r, c] is not contiguous but its transpose [B, c, r] is (Newton–Schulz's view of
// a tall matrix kept in its own layout).
bool is_transposed_view(const at::Tensor& t);

// alpha·A·Bᵀ + beta·C + diag·I for A, B [batch, m, k], C [batch, m, m] (undefined: none).
// The caller promises A·Bᵀ is symmetric (B == A, or commuting symmetric A, B with k == m);
// only the lower triangle is computed and the result is exactly symmetric.
// out: where to write D ([batch, m, m], contiguous, A's dtype and device; undefined: allocated).
at::Tensor sym_abt(const at::Tensor& A, const at::Tensor& B, double alpha, const at::Tensor& C, double beta,
                   double diag, const at::Tensor& out = at::Tensor());

// alpha·A·X + beta·C for A [batch, m, k], X [batch, k, n], C [batch, m, n] (undefined: none);
// D is contiguous. A or X may be the transpose of a contiguous tensor (is_transposed_view): it is
// read as stored, without a copy; any other layout is made contiguous first.
// D's dtype: out's when given, else out_dtype, else A's; it must be A's or fp32 (then C is fp32
// too, and the fp32 accumulator is rounded once to fp32).
// out: where to write D ([batch, m, n], contiguous, on A's device; undefined: allocated).
at::Tensor gemm(const at::Tensor& A, const at::Tensor& X, double alpha, const at::Tensor& C, double beta,
                const at::Tensor& out = at::Tensor(), std::optional<at::ScalarType> out_dtype = std::nullopt);

// Whether scale_cast takes this input and output dtype: a CUDA tensor in fp32, bf16 or fp16, an
// output dtype among those, with the kernels on (like handles()).
bool scale_cast_handles(const at::Tensor& in, at::ScalarType out_dtype);

// op(in[b] / (norm[b]·safety + eps)) in out_dtype for in [B, rows, cols] (fp32, bf16 or fp16)
// and norm fp32 with B values ([B] or [B, 1, 1]) on in's device (undefined: no scaling, op(in[b])
// cast only); op is the
// transpose (result [B, cols, rows], contiguous) when `transpose`, else the identity. Bit for bit
// ATen's `(in.to(fp32) / (norm * safety + eps)).to(out_dtype)` (safety and eps rounded to fp32
// like ATen's scalars), transposed when asked: orthopt_scale_cast.
at::Tensor scale_cast(const at::Tensor& in, const at::Tensor& norm, double safety, double eps,
                      at::ScalarType out_dtype, bool transpose);

// t as a contiguous tensor of the same shape and dtype. When t's last two dimensions are the
// transpose of a contiguous layout (the transposed views Newton–Schulz returns for tall matrices)
// and scale_cast takes it, the copy is one tiled transpose kernel; otherwise t.contiguous().
at::Tensor contiguous(const at::Tensor& t);

// t.to(dtype), with the strides t.to(dtype) gives (a dense layout is kept). A contiguous t, or
// the transpose of a contiguous layout in its last two dimensions, is converted as stored by
// scale_cast's vectorized pass, bit for bit ATen's conversion (widening is exact, narrowing
// rounds to nearest even); anything else, the same dtype, or kernels switched off: t.to(dtype).
// ATen's conversion copy ran at ≈ 1.9 TB/s on an H200: 1.5 of 20.4 ms of the NS of
// 32×7168×2048 went to casting its result to fp32.
at::Tensor cast(const at::Tensor& t, at::ScalarType dtype);

}  // namespace orthopt::cuda
#endif

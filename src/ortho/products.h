#pragma once
// The matrix products of Newton–Schulz, on batched [B, r, c] tensors in the compute dtype.
// This is the one place where the GPU kernels (symmetric products, cuBLASLt epilogues)
// plug in; the reference path is ATen.
//
// On the CPU, half-precision compute dtypes are emulated: operands are widened to fp32,
// multiplied with fp32 accumulation, and the result is rounded once to the compute dtype,
// which is what a GPU tensor-core product with an fp32 epilogue does.

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace orthopt::detail {

struct Precision {
  at::ScalarType dtype;
  bool emulate;  // CPU + half/bfloat16
  static Precision of(at::ScalarType dtype, c10::Device device);
};

// X may be the transposed view of a contiguous tensor (a tall matrix kept in its own layout):
// gram_product and mm then read it as stored, and mm's result has the same layout.

// X·Xᵀ (symmetric result); written into `out` ([B, m, m], contiguous, X's dtype) when given,
// e.g. a slice of one buffer holding the products of several batches.
at::Tensor gram_product(const at::Tensor& X, const Precision& p, const at::Tensor& out = at::Tensor());
// beta·C + alpha·A·B + diag·I where A, B are commuting symmetric matrices (symmetric result).
at::Tensor sym_addmm(const at::Tensor& C, const at::Tensor& A, const at::Tensor& B, double beta,
                     double alpha, const Precision& p, double diag = 0.0);
// beta·C + alpha·A·X for a general X.
at::Tensor addmm(const at::Tensor& C, const at::Tensor& A, const at::Tensor& X, double beta,
                 double alpha, const Precision& p);
// A·X for a general X. transposed_result: with the kernels and X contiguous, the result is
// computed as Xᵀ·Aᵀ into a contiguous [B, n, m] tensor and returned as its transposed view, the
// layout a tall matrix transposed for NS has (no copy to bring it back); elsewhere the flag only
// concerns the layout and is ignored.
// result_dtype: the dtype the product is written in (rounded once; undefined: the compute
// dtype); only where writes_result_dtype(X, result_dtype) holds.
at::Tensor mm(const at::Tensor& A, const at::Tensor& X, const Precision& p, bool transposed_result = false,
              std::optional<at::ScalarType> result_dtype = std::nullopt);
// Whether mm(A, X, ...) with operands like X writes `dtype` in its product (the GPU kernels'
// path, dtype fp32), so that Newton–Schulz's last product can give the caller's dtype without a
// cast pass after it.
bool writes_result_dtype(const at::Tensor& X, at::ScalarType dtype);
// Muon's decoupled update, offered to a batch's last NS product (mm_update): weights[b] ←
// (1 − lr·weight_decay)·weights[b] − lr·factor·U[b] written by the product's epilogue, instead
// of U written in the compute dtype and an update pass reading it back (the fused Muon step).
struct FoldedUpdate {
  std::vector<at::Tensor> weights;  // per matrix of the batch: fp32, contiguous, the result's shape
  double factor = 1.0;              // the lr adjustment
  at::Tensor lr;                    // 0-d fp64 on the device
  double weight_decay = 0.0;
  at::Tensor keep;  // the skip flag (0-d bool on the device), or undefined
};
// Whether mm_update() takes operands like X (the GPU kernels' path).
bool takes_update(const at::Tensor& X);
// The update u with U = A·X laid out as mm(A, X, p, transposed_result) lays it out (so the
// weights hold matrices in that layout), in one product (cuda::update_by_product). Only where
// takes_update(X).
void mm_update(const at::Tensor& A, const at::Tensor& X, bool transposed_result, const FoldedUpdate& u);
// Z ← Z + a·I (per batch entry), in place.
void add_identity_(const at::Tensor& Z, double a, const Precision& p);

}  // namespace orthopt::detail

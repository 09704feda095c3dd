#pragma once
// Internal entry points of the orthogonalization engine (not part of the public API).

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "orthopt/orthogonalize.h"
#include "ortho/products.h"

namespace orthopt::detail {

// orthogonalize(G, opt) before its final cast to G's dtype: the Newton–Schulz result in the
// compute dtype, with G's shape; for tall matrices (rows > cols) a transposed view of the
// contiguous [..., cols, rows] result, or contiguous where Gram NS ran on the GPU kernels (in the
// matrix's own layout, or transposed with its last product written back; with split_sizes:
// contiguous). orthogonalize() returns the same up to the rounding of its last product, which
// on the GPU kernels' path writes G's dtype directly (fp32), elsewhere this .to(G.scalar_type());
// the fused optimizer step uses it directly as the update direction (a bf16/fp16 direction widens
// to fp32 exactly, like that cast).
at::Tensor orthogonalize_in_compute_dtype(const at::Tensor& G, const OrthoOptions& opt);

// orthogonalize_in_compute_dtype() of each of Gs (one device; no split_sizes), with the Gram NS
// of every input that shares its m (rows after orientation) and compute dtype with others run as
// one iteration over all of them (the small m×m products batched across shapes). Each result is
// what orthogonalize_in_compute_dtype(Gs[i], opt) gives, up to the products' batching.
// norms (empty, or one per input): each input's per-matrix Frobenius norms [B] (fp32, on the
// inputs' device), already known to the caller (the fused Muon step gets them from its momentum
// pass), used instead of a reduction over the input; they agree with it up to summation order.
// prepared (empty, or one flag per input): where set, Gs[i] is its NS input already, the
// scaled input in the compute dtype as stored (prepared_input_dtype), and norms[i] is ignored.
// updates (empty, or one per input, null for none; opt.nonfinite must be Propagate): input i's
// last product does Muon's update of updates[i]->weights (one per matrix, in Gs[i]'s layout)
// where the GPU kernels take it, and its result is then undefined; a defined result means the
// update was not done and is the caller's to do.
std::vector<at::Tensor> orthogonalize_many_in_compute_dtype(const std::vector<at::Tensor>& Gs,
                                                            const OrthoOptions& opt,
                                                            const std::vector<at::Tensor>& norms = {},
                                                            const std::vector<bool>& prepared = {},
                                                            const std::vector<const FoldedUpdate*>& updates = {});

// Where the NS input of matrices [rows, cols] on `like`'s device is the matrices as stored,
// scaled (X / (‖X‖·safety + eps)) and rounded to a 16-bit compute dtype: wide or square ones,
// and tall ones that Gram NS takes in their own layout on the GPU kernels' path (no
// split_sizes). Returns that dtype, or nullopt (transposed input, fp32/fp64 compute, CPU, or
// the kernels off): where a caller (the fused Muon step) may hand
// orthogonalize_many_in_compute_dtype the input ready-made.
std::optional<at::ScalarType> prepared_input_dtype(int64_t rows, int64_t cols, const OrthoOptions& opt,
                                                   const at::Tensor& like);

// How one batch [batch, rows, cols] of `input` dtype on `device` is orthogonalized: the rule
// orthogonalize() follows (orientation, method, compute dtype, whether the CUDA kernels take it
// and whether a tall Gram batch stays in its own layout), for the optimizer's plan to record and
// hand down. work: the multiply-adds of one X·Xᵀ over the batch (B·m²·n).
struct NsPlan {
  bool tall = false;
  int64_t m = 0, n = 0;
  OrthoMethod method = OrthoMethod::Standard;
  at::ScalarType compute = at::kFloat;
  bool kernels = false;
  bool own_layout = false;
  double work = 0;
};
// like: a tensor of that device and dtype when the caller has one (the input itself), so that
// none is made in the step's hot path.
NsPlan plan_ns(int64_t batch, int64_t rows, int64_t cols, c10::Device device, at::ScalarType input,
               const OrthoOptions& opt, const at::Tensor& like = {});
// An independent chain of NS products: a Gram group (inputs with the same m and compute dtype
// iterating together) or one standard input; side_stream: it runs on a side stream beside the
// first chain (which stays on the caller's). In the order the chains are enqueued.
struct NsChain {
  std::vector<size_t> inputs;
  bool gram = false;
  double work = 0;
  bool side_stream = false;
};
std::vector<NsChain> plan_chains(const std::vector<NsPlan>& plans, c10::Device device, const ExecutionOptions& e);
// X.to(dtype), on the GPU by the vectorized cast kernel: what orthogonalize() does last.
at::Tensor cast_result(const at::Tensor& X, at::ScalarType dtype);

}  // namespace orthopt::detail

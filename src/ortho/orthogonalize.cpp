#include "orthopt/orthogonalize.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>

#include "orthopt/runtime.h"
#include "ortho/orthogonalize_detail.h"
#include "ortho/products.h"

#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#include "cuda/products_cuda.h"
#include "cuda/stream_fork.h"
#endif

namespace orthopt {
namespace {

using detail::Precision;

// Standard NS on X [B, m, n], m <= n, already normalized and in the compute dtype. The result is
// in the compute dtype, or in result_dtype where the products write it (detail::mm). With
// `update` (taken: detail::takes_update(X)), the last product does that update instead, its
// product laid out transposed when `update_transposed` (a tall matrix's weights), and the result
// is undefined.
at::Tensor standard_ns(at::Tensor X, const Schedule& s, int steps, const Precision& p,
                       std::optional<at::ScalarType> result_dtype, const detail::FoldedUpdate* update = nullptr,
                       bool update_transposed = false) {
  for (int t = 0; t < steps; ++t) {
    const auto& [a, b, c] = s.at_step(t);
    auto A = detail::gram_product(X, p);  // X·Xᵀ
    if (t + 1 == steps && (update || (result_dtype && *result_dtype != X.scalar_type() &&
                                      detail::writes_result_dtype(X, *result_dtype)))) {
      // The last step as (a·I + b·A + c·A·A)·X, a·I fused into the symmetric product's diagonal:
      // one product writing the caller's dtype (fp32) instead of a·X + B·X in the compute dtype
      // and a cast pass over the result after it, or one product doing the update.
      auto B = detail::sym_addmm(A, A, A, b, c, p, /*diag=*/a);
      if (update) {
        detail::mm_update(B, X, update_transposed, *update);
        return at::Tensor();
      }
      return detail::mm(B, X, p, /*transposed_result=*/false, result_dtype);
    }
    auto B = detail::sym_addmm(A, A, A, b, c, p);  // b·A + c·A·A
    X = detail::addmm(X, B, X, a, 1.0, p);         // a·X + B·X
  }
  return X;
}

// Gram NS (algorithms.md §1.1) on batches Xs[i] [B_i, m, n_i] (m <= n_i; one m, one compute
// dtype). Only R = X·Xᵀ and Q·X depend on a batch's n_i: the m×m iteration (Z, Q, R) runs once
// over all batches stacked, so same-m banks of different widths (GPT-2's 768×2304 and 768×3072)
// share one batch of small products instead of one each. Each matrix gets the same operations
// as alone. transposed[i]: batch i is a tall matrix transposed for NS; its last Q·X is written
// in the tall layout (detail::mm's transposed_result), so that transposing the result back
// (orthogonalize_batches) gives a contiguous tensor and nobody copies it. The last Q·X writes
// result_dtype where the products can (detail::mm), else the compute dtype. updates[i] (non-null,
// taken: detail::takes_update): batch i's last product does that update instead, and its result
// is undefined.
std::vector<at::Tensor> gram_ns(std::vector<at::Tensor> Xs, const Schedule& s, int steps,
                                const std::vector<int>& restarts, const Precision& p,
                                const std::vector<bool>& transposed, std::optional<at::ScalarType> result_dtype,
                                const std::vector<const detail::FoldedUpdate*>& updates) {
  auto is_restart = [&](int t) { return std::find(restarts.begin(), restarts.end(), t) != restarts.end(); };
  auto gram = [&] {  // R of every batch, stacked: each written into its slice of one buffer
    if (Xs.size() == 1) return detail::gram_product(Xs[0], p);
    int64_t total = 0;
    for (const auto& X : Xs) total += X.size(0);
    const at::Tensor R = at::empty({total, Xs[0].size(1), Xs[0].size(1)}, Xs[0].options());
    int64_t offset = 0;
    for (const auto& X : Xs) {
      detail::gram_product(X, p, R.narrow(0, offset, X.size(0)));
      offset += X.size(0);
    }
    return R;
  };
  auto apply = [&](const at::Tensor& Q, bool last) {  // X_i ← Q_i·X_i
    int64_t offset = 0;
    for (size_t i = 0; i < Xs.size(); ++i) {
      const int64_t b = Xs[i].size(0);
      if (last && updates[i]) {
        detail::mm_update(Q.narrow(0, offset, b), Xs[i], transposed[i], *updates[i]);
        Xs[i] = at::Tensor();
        offset += b;
        continue;
      }
      // The last product writes the caller's dtype where the products can: no cast pass after it.
      const bool direct = last && result_dtype && detail::writes_result_dtype(Xs[i], *result_dtype);
      Xs[i] = detail::mm(Q.narrow(0, offset, b), Xs[i], p, last && transposed[i],
                         direct ? result_dtype : std::nullopt);
      offset += b;
    }
  };
  auto R = gram();
  at::Tensor Q;
  bool fresh = true;
  for (int t = 0; t < steps; ++t) {
    if (t > 0 && is_restart(t)) {
      apply(Q, /*last=*/false);
      R = gram();
      fresh = true;
    }
    const auto& [a, b, c] = s.at_step(t);
    auto Z = detail::sym_addmm(R, R, R, b, c, p);  // b·R + c·R·R
    if (!fresh) Q = detail::sym_addmm(Q, Q, Z, a, 1.0, p);  // Q·Z + a·Q
    // R is not needed after the last step or right before a restart recomputes it.
    if (t + 1 < steps && !is_restart(t + 1)) {
      auto RZ = detail::sym_addmm(R, R, Z, a, 1.0, p);  // R·Z + a·R
      R = detail::sym_addmm(RZ, Z, RZ, a, 1.0, p);      // Z·RZ + a·RZ
    }
    if (fresh) {  // Q = Z + a·I, in place: Z's last use is above (no copy of Z)
      detail::add_identity_(Z, a, p);
      Q = Z;
      fresh = false;
    }
  }
  apply(Q, /*last=*/true);
  return Xs;
}

// Whether Gram NS of a tall batch [B, n, m] (n > m) runs in the batch's own layout: X = Tᵀ as a
// view of the contiguous T, R = Tᵀ·T and the result T·Qᵀ read T as stored (products.cpp), so
// neither the NS input nor its result is transposed in memory: the result needs no copy (a
// pass of 4 bytes per element) and the input's scaled cast is a plain vectorized pass instead of
// a tiled transpose. The price: R becomes a dense product instead of the symmetric kernel's
// lower triangle, m/2 more multiply-adds per element each time R is formed, so it pays for small
// m only. Measured on an H200 (bench/results/2026-12-01-h200-own-layout.md): GPT-2's
// 2304×768 and 3072×768 banks (m = 768) gain; at Llama's m = 2048 the estimate is a loss.
// CUDA kernels only (the reference path transposes). ExecutionOptions::gram_own_layout forces it
// off or on.
constexpr int64_t kOwnLayoutMaxM = 1024;

bool gram_in_own_layout(const at::Tensor& G3, at::ScalarType compute, int64_t m, Toggle choice) {
#ifdef ORTHOPT_WITH_CUDA
  if (compute != at::kBFloat16 && compute != at::kHalf) return false;
  if (!cuda::scale_cast_handles(G3, compute)) return false;
  return resolve(choice, m <= kOwnLayoutMaxM);
#else
  (void)G3, (void)compute, (void)m, (void)choice;
  return false;
#endif
}

#ifdef ORTHOPT_WITH_CUDA
// The per-matrix Frobenius norms [B, 1, 1] of G3 in fp32, reduced over G3 as stored: what the
// GPU kernels' path of normalized_input scales by when the caller has no norms. Where the fp32
// reduction overflows on finite entries (|x| beyond ≈ 1.8e19), which would scale the input to
// zeros, the norm is taken again over G3 divided by a power of two, on the device and only for
// those matrices (cuda::repair_norms: no host synchronization; every other norm keeps its
// bits), so the scaled input is the reference's (pow2_scale) up to the order of the fp32 sums.
// It stays Inf where the norm itself is beyond the fp32 range (entries ≳ 3.4e38/√(rows·cols)).
at::Tensor kernel_path_norms(const at::Tensor& G3) {
  const at::Tensor G = G3.contiguous();
  const at::Tensor Gf = G.scalar_type() == at::kFloat ? G : G.to(at::kFloat);  // exact widening
  const at::Tensor norms = at::linalg_vector_norm(Gf, 2, at::IntArrayRef{1, 2}, /*keepdim=*/true);
  cuda::repair_norms(G, norms);
  return norms;
}
#endif

// A power of two per matrix [B, 1, 1] of X [B, m, n] (fp32 or fp64) that brings its largest
// magnitude into [1, 2): dividing by it is exact, and the Frobenius norm of the quotient can
// neither overflow (fp32 squares overflow beyond |x| ≈ 1.8e19, which made the norm Inf and the
// result all zeros) nor underflow. 1 where the maximum is Inf or NaN, 2^-126 (2^-1022) where it is
// zero or subnormal. Built from the exponent bits of max|x|, so no rounding is involved.
at::Tensor pow2_scale(const at::Tensor& X) {
  const at::Tensor amax = at::linalg_vector_norm(X, INFINITY, at::IntArrayRef{1, 2}, /*keepdim=*/true);
  const bool fp64 = X.scalar_type() == at::kDouble;
  TORCH_CHECK(fp64 || X.scalar_type() == at::kFloat, "pow2_scale: expected fp32 or fp64, got ", X.scalar_type());
  const int64_t exponent_mask = fp64 ? 0x7ff0000000000000LL : 0x7f800000LL;
  const int64_t min_normal = fp64 ? 0x0010000000000000LL : 0x00800000LL;
  const int64_t one = fp64 ? 0x3ff0000000000000LL : 0x3f800000LL;
  at::Tensor e = at::bitwise_and(amax.view(fp64 ? at::kLong : at::kInt), exponent_mask);
  e.masked_fill_(e.eq(0), min_normal);
  e.masked_fill_(e.eq(exponent_mask), one);
  return e.view(X.scalar_type());
}

// How a batch G3 [B, r, c] is orthogonalized: tall (r > c: NS works on its transpose), m ≤ n
// the sizes NS sees, the method and the compute dtype.
struct NsShape {
  bool tall;
  int64_t m, n;
  OrthoMethod method;
  at::ScalarType compute;
};

NsShape ns_shape(int64_t rows, int64_t cols, const c10::Device& device, const OrthoOptions& opt) {
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  const OrthoMethod method = resolve_method(m, n, opt);
  return {tall, m, n, method, resolve_compute_dtype(opt, device, method)};
}

// Whether NS keeps a tall batch in its own layout (Gram NS, gram_in_own_layout). `like`: the
// batch, or a tensor of its device and dtype.
bool in_own_layout(const NsShape& shape, const at::Tensor& like, const ExecutionOptions& e) {
  return shape.tall && shape.method == OrthoMethod::Gram &&
         gram_in_own_layout(like, shape.compute, shape.m, e.gram_own_layout);
}
// Whether NS takes a batch as stored: wide and square batches, and tall ones in their own layout.
// The one rule behind both the inputs callers prepare (detail::prepared_input_dtype) and the
// check of them (orthogonalize_batches).
bool takes_as_stored(bool tall, bool own_layout) { return !tall || own_layout; }

// The NS input: X / (‖X‖_F·safety + eps) per matrix in the compute dtype, [B, m, n] contiguous,
// where X = G3, or its transpose when tall; with own_layout (tall, CUDA kernels), the transposed
// view of the scaled G3 instead. Normalization always in fp32 (or fp64 when that is the compute
// dtype). given_norm: the per-matrix norms [B, 1, 1] when the caller has them.
at::Tensor normalized_input(const at::Tensor& G3, bool tall, at::ScalarType compute, const Schedule& s,
                            const at::Tensor& given_norm, bool own_layout) {
#ifdef ORTHOPT_WITH_CUDA
  // CUDA input in fp32/bf16/fp16, compute dtype among those, kernels on (execution kernels).
  if (cuda::scale_cast_handles(G3, compute)) {
    // One kernel instead of a (strided, for tall inputs) fp32 copy, the division and the cast:
    // the same fp32 operations, bit for bit (orthopt_scale_cast). The norm is taken over the
    // input as stored, contiguous: for tall inputs that is a different reduction order than the
    // reference path below (which reduces the transposed copy), so the norm, and with it the
    // result, may differ from the reference by about one ulp of the norm; wide inputs reduce
    // the same fp32 tensor and match the reference bit for bit. A given norm (the fused Muon
    // step sums each row's squares in its momentum pass) replaces the reduction; it agrees with
    // it up to the order of the fp32 sums.
    const at::Tensor G = G3.contiguous();
    const at::Tensor norm = given_norm.defined() ? given_norm : kernel_path_norms(G);
    if (own_layout) return cuda::scale_cast(G, norm, s.safety, s.eps, compute, /*transpose=*/false).transpose(1, 2);
    return cuda::scale_cast(G, norm, s.safety, s.eps, compute, /*transpose=*/tall);
  }
#endif
  TORCH_CHECK(!own_layout, "normalized_input: own layout needs the CUDA kernels");
  // The reference path (CPU, fp64, execution kernels=off).
  const at::ScalarType norm_dtype = compute == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor X = tall ? G3.transpose(1, 2) : G3;
  if (given_norm.defined()) {
    X = X.to(norm_dtype).contiguous();
    return (X / (given_norm.to(norm_dtype) * s.safety + s.eps)).to(compute).contiguous();
  }
  // X/(‖X‖·safety + eps) computed as X'/(‖X'‖·safety + eps/p) with X' = X/p, p = pow2_scale(X):
  // every step is exactly scaled by the power of two, so the bits are those of the direct formula
  // wherever it neither overflows nor underflows, and finite inputs of any magnitude (fp64 ones
  // beyond the fp32 range included: scaled before the cast) give their polar factor.
  const at::Tensor wide = X.scalar_type() == at::kDouble ? X : X.to(norm_dtype);
  const at::Tensor p = pow2_scale(wide);
  X = (wide / p).to(norm_dtype).contiguous();  // a tall input then reduces like its wide transpose
  const at::Tensor eps = (p.reciprocal() * s.eps).to(norm_dtype);
  const at::Tensor norm = at::linalg_vector_norm(X, 2, at::IntArrayRef{1, 2}, /*keepdim=*/true);
  return (X / (norm * s.safety + eps)).to(compute).contiguous();
}

// Whether an independent chain of NS products (a standard input, or a Gram group) goes to one of
// the kernel library's side streams, to run beside the others. `work`: the multiply-adds of one
// X·Xᵀ over its inputs (Σ B·m²·n). Measured on an H200 (bench/results/2026-12-01-h200-own-layout.md
// and 2026-12-01-h200-row-stats.md): GPT-2's chains (12×768² standard, 5e9; the m = 768 Gram group,
// 6e10) gain from running side by side (their products fill the GPU for 1–2 waves, and the small
// kernels between them leave it idle), while Llama's (≥ 7.6e11, many waves per product) were 7%
// slower side by side. ExecutionOptions::side_streams = off keeps every chain on the caller's
// stream, on forks every chain but the first.
#ifdef ORTHOPT_WITH_CUDA
constexpr double kSideChainMaxWork = 2e11;

bool on_side_stream(double work, Toggle choice) { return resolve(choice, work <= kSideChainMaxWork); }
#endif

}  // namespace

detail::NsPlan detail::plan_ns(int64_t batch, int64_t rows, int64_t cols, c10::Device device, at::ScalarType input,
                               const OrthoOptions& opt, const at::Tensor& like_given) {
  const NsShape shape = ns_shape(rows, cols, device, opt);
  NsPlan p;
  p.tall = shape.tall;
  p.m = shape.m;
  p.n = shape.n;
  p.method = shape.method;
  p.compute = shape.compute;
  const at::Tensor like =
      like_given.defined() ? like_given : at::empty({0}, at::TensorOptions().device(device).dtype(input));
#ifdef ORTHOPT_WITH_CUDA
  p.kernels = cuda::scale_cast_handles(like, shape.compute);
#endif
  p.own_layout = in_own_layout(shape, like, opt.execution);
  p.work = static_cast<double>(batch) * static_cast<double>(shape.m) * static_cast<double>(shape.m) *
           static_cast<double>(shape.n);
  return p;
}

std::vector<detail::NsChain> detail::plan_chains(const std::vector<NsPlan>& plans, c10::Device device,
                                                 const ExecutionOptions& e) {
  std::map<std::pair<int64_t, at::ScalarType>, std::vector<size_t>> gram;  // (m, compute dtype) -> inputs
  std::vector<NsChain> chains;
  for (size_t i = 0; i < plans.size(); ++i)
    if (plans[i].method == OrthoMethod::Gram) gram[{plans[i].m, plans[i].compute}].push_back(i);
  for (const auto& [key, idx] : gram) {
    NsChain c{idx, true, 0.0, false};
    for (size_t i : idx) c.work += plans[i].work;
    chains.push_back(c);
  }
  for (size_t i = 0; i < plans.size(); ++i)
    if (plans[i].method != OrthoMethod::Gram) chains.push_back({{i}, false, plans[i].work, false});
#ifdef ORTHOPT_WITH_CUDA
  if (device.is_cuda() && kernels_enabled() && chains.size() > 1) {
    // The largest chain stays on the caller's stream; the small ones go beside it, the rest
    // follow it there.
    std::stable_sort(chains.begin(), chains.end(), [](const NsChain& a, const NsChain& b) { return a.work > b.work; });
    for (size_t k = 1; k < chains.size(); ++k) chains[k].side_stream = on_side_stream(chains[k].work, e.side_streams);
  }
#else
  (void)device, (void)e;
#endif
  return chains;
}

namespace {

// Orthogonalizes batches G3s[i] [B_i, r_i, c_i] (any orientation, one device); returns each as
// [B_i, r_i, c_i] in its compute dtype (for tall inputs through standard NS a transposed view of
// the contiguous [B, c, r] result; through Gram NS contiguous on the GPU kernels' path, whether it
// ran in the input's own layout or transposed, gram_ns writing the last product back). How each
// batch runs is detail::plan_ns's, and which chains of products run where detail::plan_chains's:
// Gram batches with the same m and compute dtype iterate together (gram_ns); each Gram group and
// each standard input is an independent chain of products, and on a GPU with the kernels on,
// small chains run on parallel streams (each chain's operations are those it runs alone, so the
// results are too).
// prepared (empty, or one flag per batch): where set, G3s[i] is its NS input already, scaled and
// in the compute dtype, as stored (detail::prepared_input_dtype), and norms[i] is not used.
// updates (empty, or one per batch, null for none): batch i's last product does that update
// (detail::FoldedUpdate, weights in G3s[i]'s layout) where the products take it
// (detail::takes_update) and write the result in the batch's stored layout; its result is then
// undefined, and otherwise it is returned as without an update (the caller updates from it).
std::vector<at::Tensor> orthogonalize_batches(const std::vector<at::Tensor>& G3s, const OrthoOptions& opt,
                                              const Schedule& s, const std::vector<at::Tensor>& norms = {},
                                              std::optional<at::ScalarType> result_dtype = std::nullopt,
                                              const std::vector<bool>& prepared = {},
                                              const std::vector<const detail::FoldedUpdate*>& updates = {}) {
  std::vector<at::Tensor> X(G3s.size());
  std::vector<detail::NsPlan> plans;
  const c10::Device device = G3s[0].device();
  for (size_t i = 0; i < G3s.size(); ++i) {
    const at::Tensor& G3 = G3s[i];
    TORCH_CHECK(G3.device() == device, "argument 'G': batch ", i, " is on ", G3.device(), ", batch 0 on ", device);
    plans.push_back(detail::plan_ns(G3.size(0), G3.size(1), G3.size(2), device, G3.scalar_type(), opt, G3));
    if (plans.back().method == OrthoMethod::Gram) {
      const std::string warning = gram_precision_warning(opt, plans.back().compute);
      if (!warning.empty()) {
        TORCH_WARN_ONCE(warning);
      }
    }
  }
  // Gram batches transposed for NS get their last product back in their own layout (gram_ns);
  // gram_transposed_result = off leaves it as a transposed view instead.
  const bool transposed_result = resolve(opt.execution.gram_transposed_result, true);
  // direct_result = off: the last product in the compute dtype and the caller's cast pass after it.
  if (!resolve(opt.execution.direct_result, true)) result_dtype.reset();
  auto input = [&](size_t i) {
    const detail::NsPlan& p = plans[i];
    if (!prepared.empty() && prepared[i]) {
      TORCH_CHECK(G3s[i].scalar_type() == p.compute && G3s[i].is_contiguous() && takes_as_stored(p.tall, p.own_layout),
                  "argument 'prepared' [", i, "]: input ", i, " (", G3s[i].scalar_type(), ", shape ", G3s[i].sizes(),
                  ") is not an NS input as stored: expected a contiguous ", p.compute,
                  " batch that NS takes without transposing it");
      return p.own_layout ? G3s[i].transpose(1, 2) : G3s[i];
    }
    return normalized_input(G3s[i], p.tall, p.compute, s, norms.empty() ? at::Tensor() : norms[i], p.own_layout);
  };
  // Batch i's update, where its last product (laid out as `transposed`) writes the stored layout.
  auto update_of = [&](size_t i, const at::Tensor& x, bool transposed) -> const detail::FoldedUpdate* {
    if (updates.empty() || !updates[i] || !detail::takes_update(x)) return nullptr;
    return (!plans[i].tall || plans[i].own_layout || transposed) ? updates[i] : nullptr;
  };
  auto run_chain = [&](const detail::NsChain& chain) {
    if (chain.gram) {
      std::vector<at::Tensor> Xs;
      std::vector<bool> transposed;
      std::vector<const detail::FoldedUpdate*> folded;
      for (size_t i : chain.inputs) {
        Xs.push_back(input(i));
        transposed.push_back(transposed_result && plans[i].tall && !plans[i].own_layout);
        folded.push_back(update_of(i, Xs.back(), transposed.back()));
      }
      Xs = gram_ns(std::move(Xs), s, opt.steps, opt.gram_restarts,
                   Precision::of(plans[chain.inputs[0]].compute, device), transposed, result_dtype, folded);
      for (size_t k = 0; k < chain.inputs.size(); ++k) X[chain.inputs[k]] = Xs[k];
      return;
    }
    const size_t i = chain.inputs[0];
    const at::Tensor x = input(i);
    // A tall batch runs transposed; its folded update writes the stored layout back
    // (detail::mm_update's transposed result).
    X[i] = standard_ns(x, s, opt.steps, Precision::of(plans[i].compute, device), result_dtype,
                       update_of(i, x, /*transposed=*/plans[i].tall), plans[i].tall);
  };
  const std::vector<detail::NsChain> chains = detail::plan_chains(plans, device, opt.execution);
  const bool any_side =
      std::any_of(chains.begin(), chains.end(), [](const detail::NsChain& c) { return c.side_stream; });
#ifdef ORTHOPT_WITH_CUDA
  if (any_side) {
    std::vector<std::function<void()>> parallel{[&] {
      for (const auto& c : chains)
        if (!c.side_stream) run_chain(c);
    }};
    for (const auto& c : chains)
      if (c.side_stream) parallel.push_back([&run_chain, &c] { run_chain(c); });
    std::vector<at::Tensor> inputs(G3s.begin(), G3s.end());
    for (const at::Tensor& n : norms)
      if (n.defined()) inputs.push_back(n);
    cuda::run_on_parallel_streams(device, parallel, inputs, &X);
  } else
#endif
    for (const auto& chain : chains) run_chain(chain);
  (void)any_side;
  for (size_t i = 0; i < G3s.size(); ++i)
    if (plans[i].tall && X[i].defined()) X[i] = X[i].transpose(1, 2);
  return X;
}

// [..., r, c] -> batched orthogonalization, no splitting.
at::Tensor orthogonalize_matrices(const at::Tensor& G, const OrthoOptions& opt, const Schedule& s,
                                  std::optional<at::ScalarType> result_dtype) {
  auto G3 = G.reshape({-1, G.size(-2), G.size(-1)});
  return orthogonalize_batches({G3}, opt, s, {}, result_dtype)[0].reshape(G.sizes());
}

// Split rows into blocks; same-sized blocks are stacked into one batched call.
at::Tensor orthogonalize_split(const at::Tensor& G, const OrthoOptions& opt, const Schedule& s,
                               std::optional<at::ScalarType> result_dtype) {
  auto blocks = G.split_with_sizes(opt.split_sizes, -2);
  std::vector<at::Tensor> out(blocks.size());
  std::map<int64_t, std::vector<size_t>> by_size;
  for (size_t i = 0; i < blocks.size(); ++i) by_size[opt.split_sizes[i]].push_back(i);
  for (const auto& [size, idx] : by_size) {
    std::vector<at::Tensor> group;
    for (size_t i : idx) group.push_back(blocks[i]);
    auto res = orthogonalize_matrices(at::stack(group, 0), opt, s, result_dtype);
    for (size_t j = 0; j < idx.size(); ++j) out[idx[j]] = res[static_cast<int64_t>(j)];
  }
  return at::cat(out, -2);
}


}  // namespace

namespace {

// Where values are computed (not in validate_ortho_args, which the optimizer runs on meta tensors
// to check shapes): before anything reads them, as the non-finite check would inside ATen.
void check_has_values(const at::Tensor& G) {
  TORCH_CHECK_VALUE(!G.defined() || !G.is_meta(), "argument 'G': meta tensors are not supported (orthogonalize "
                    "computes values; a meta tensor has none)");
}

// NonFinitePolicy::Error: whether G is all finite, as a device flag computed before the work and
// read (one host sync) only after the work is enqueued, so the GPU does not idle while the host
// launches the work after the sync (the cost of reading it first was not measured apart from the
// spread between machines: bench/results/2026-12-01-h200-dion-peer.md).
struct FiniteCheck {
  at::Tensor flag;  // undefined: no check
  // Set when the flag says whether G's norms are finite (see orthogonalize_one): a norm is also
  // infinite when it is beyond the fp32 range though G is finite (entries ≳ 3.4e38/√(rows·cols);
  // sums of squares that overflow below that are taken again scaled: kernel_path_norms), so only
  // then is G checked entry by entry.
  at::Tensor G_of_norms;

  // Throws when G holds NaN or Inf; true when G is finite but a norm is infinite (the result,
  // scaled by an infinite norm, is then all zeros and must be recomputed).
  bool verify() const {
    if (!flag.defined() || flag.item<bool>()) return false;
    if (G_of_norms.defined() && at::isfinite(G_of_norms).all().item<bool>()) return true;
    TORCH_CHECK(false, "argument 'G': contains NaN or Inf (pass nonfinite=propagate to let them through)");
  }
};

FiniteCheck finite_check(const at::Tensor& G, const OrthoOptions& opt) {
  return {opt.nonfinite == NonFinitePolicy::Error ? at::isfinite(G).all() : at::Tensor(), at::Tensor()};
}

// orthogonalize_in_compute_dtype(), or, with result_dtype, the result in that dtype where the
// last product can write it (the GPU kernels, fp32) and in the compute dtype elsewhere.
at::Tensor orthogonalize_one(const at::Tensor& G, const OrthoOptions& opt, std::optional<at::ScalarType> result_dtype) {
  const KernelsScope kernels(opt.execution.kernels);
  check_has_values(G);
  validate_ortho_args(G, opt);
  const Schedule s = resolve_schedule(opt);
  const at::Tensor M = (opt.flatten && G.dim() > 2) ? G.reshape({G.size(0), -1}) : G;
  if (!opt.split_sizes.empty()) {
    const FiniteCheck finite = finite_check(G, opt);
    const at::Tensor out = orthogonalize_split(M, opt, s, result_dtype);
    finite.verify();
    return out.reshape(G.sizes());
  }
  at::Tensor G3 = M.reshape({-1, M.size(-2), M.size(-1)});
  std::vector<at::Tensor> norms;
  FiniteCheck finite;
#ifdef ORTHOPT_WITH_CUDA
  // NonFinitePolicy::Error where the GPU kernels prepare the NS input: the norms its scaling
  // takes are computed here and flag G, instead of a separate pass over G (ATen's isfinite(G).all()
  // took 2.6–2.8 ms for fp32 [32, 7168, 2048] on an H200, against 18.5 ms of NS).
  if (opt.nonfinite == NonFinitePolicy::Error &&
      cuda::scale_cast_handles(G3, ns_shape(G3.size(1), G3.size(2), G3.device(), opt).compute)) {
    // Contiguous once, here: the norms and normalized_input both read it, and each would copy a
    // strided G3 again.
    G3 = G3.contiguous();
    norms.push_back(kernel_path_norms(G3));
    finite = {at::isfinite(norms[0]).all(), G3};
  }
#endif
  if (!finite.flag.defined()) finite = finite_check(G, opt);
  at::Tensor out = orthogonalize_batches({G3}, opt, s, norms, result_dtype)[0];
#ifdef ORTHOPT_WITH_CUDA
  if (finite.verify()) {
    // A norm of finite entries beyond the fp32 range (kernel_path_norms keeps it Inf): again on
    // G3 divided by a power of two per matrix (exact), whose norm is finite. eps then acts on the
    // scaled matrix, a relative change below 1e-7. Only this path (nonfinite=error) has the
    // host sync that finds it; with nonfinite=propagate the kernels' result stays zeros there.
    const at::Tensor p = pow2_scale(G3.to(at::kFloat));
    const at::Tensor scaled = (G3.to(at::kFloat) / p).to(G3.scalar_type()).contiguous();
    out = orthogonalize_batches({scaled}, opt, s, {kernel_path_norms(scaled)}, result_dtype)[0];
  }
#else
  finite.verify();
#endif
  return out.reshape(G.sizes());
}

}  // namespace

at::Tensor detail::orthogonalize_in_compute_dtype(const at::Tensor& G, const OrthoOptions& opt) {
  return orthogonalize_one(G, opt, std::nullopt);
}

std::optional<at::ScalarType> detail::prepared_input_dtype(int64_t rows, int64_t cols, const OrthoOptions& opt,
                                                           const at::Tensor& like) {
  const KernelsScope kernels(opt.execution.kernels);
#ifdef ORTHOPT_WITH_CUDA
  if (!opt.split_sizes.empty() || !like.defined() || !like.is_cuda() || rows < 1 || cols < 1) return std::nullopt;
  const NsShape shape = ns_shape(rows, cols, like.device(), opt);
  if (shape.compute != at::kBFloat16 && shape.compute != at::kHalf) return std::nullopt;
  if (!cuda::scale_cast_handles(like, shape.compute)) return std::nullopt;
  if (takes_as_stored(shape.tall, in_own_layout(shape, like, opt.execution))) return shape.compute;
#else
  (void)rows, (void)cols, (void)opt, (void)like;
#endif
  return std::nullopt;
}

std::vector<at::Tensor> detail::orthogonalize_many_in_compute_dtype(const std::vector<at::Tensor>& Gs,
                                                                   const OrthoOptions& opt,
                                                                   const std::vector<at::Tensor>& norms,
                                                                   const std::vector<bool>& prepared,
                                                                   const std::vector<const FoldedUpdate*>& updates) {
  TORCH_CHECK(opt.split_sizes.empty(), "argument 'split_sizes': orthogonalize_many takes whole matrices (split them "
              "before, or call orthogonalize per tensor)");
  const KernelsScope kernels(opt.execution.kernels);
  for (const auto& G : Gs) {
    check_has_values(G);
    validate_ortho_args(G, opt);
  }
  TORCH_CHECK(norms.empty() || norms.size() == Gs.size(), "argument 'norms': expected none or ", Gs.size(),
              " tensors, got ", norms.size());
  TORCH_CHECK(prepared.empty() || prepared.size() == Gs.size(), "argument 'prepared': expected none or ", Gs.size(),
              " flags, got ", prepared.size());
  TORCH_CHECK(updates.empty() || updates.size() == Gs.size(), "argument 'updates': expected none or ", Gs.size(),
              ", got ", updates.size());
  // A folded update writes the weights before the non-finite check below could refuse the step.
  TORCH_CHECK(updates.empty() || opt.nonfinite != NonFinitePolicy::Error,
              "argument 'updates': needs nonfinite=propagate (the update is written before the check)");
  if (Gs.empty()) return {};
  std::vector<FiniteCheck> finite;
  for (const auto& G : Gs) finite.push_back(finite_check(G, opt));
  const Schedule s = resolve_schedule(opt);
  std::vector<at::Tensor> G3s, norm3s;
  for (size_t i = 0; i < Gs.size(); ++i) {
    const at::Tensor& G = Gs[i];
    const at::Tensor M = (opt.flatten && G.dim() > 2) ? G.reshape({G.size(0), -1}) : G;
    G3s.push_back(M.reshape({-1, M.size(-2), M.size(-1)}));
    if (norms.empty()) continue;
    if (!prepared.empty() && prepared[i]) {
      norm3s.emplace_back();
      continue;
    }
    const at::Tensor& n = norms[i];
    TORCH_CHECK(n.defined() && n.scalar_type() == at::kFloat && n.device() == G.device() &&
                    n.numel() == G3s.back().size(0),
                "argument 'norms' [", i, "]: expected ", G3s.back().size(0), " fp32 norms on ", G.device());
    norm3s.push_back(n.reshape({-1, 1, 1}));
  }
  auto out = orthogonalize_batches(G3s, opt, s, norm3s, std::nullopt, prepared, updates);
  for (const auto& f : finite) f.verify();
  for (size_t i = 0; i < Gs.size(); ++i)
    if (out[i].defined()) out[i] = out[i].reshape(Gs[i].sizes());
  return out;
}

at::Tensor detail::cast_result(const at::Tensor& X, at::ScalarType dtype) {
#ifdef ORTHOPT_WITH_CUDA
  if (X.is_cuda()) return cuda::cast(X, dtype);  // X.to(), by the vectorized kernel
#endif
  return X.to(dtype);
}

at::Tensor orthogonalize(const at::Tensor& G, const OrthoOptions& opt) {
  const KernelsScope kernels(opt.execution.kernels);
  // The last product writes G's dtype where it can; cast_result converts what it did not.
  return detail::cast_result(orthogonalize_one(G, opt, G.scalar_type()), G.scalar_type());
}

}  // namespace orthopt

#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAGuard.h>

#include <map>
#include <optional>

#include "cuda/products_cuda.h"
#include "orthopt/runtime.h"
#include "orthopt/kernels/gemm.h"
#include "orthopt/kernels/multi_tensor.h"

namespace orthopt::cuda {
namespace {

constexpr int kAbsent = -1;  // dtype code of an absent optional tensor (no parameter copy)

bool supported_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

orthopt_dtype kernel_dtype(at::ScalarType t) {
  return t == at::kFloat ? ORTHOPT_FP32 : (t == at::kBFloat16 ? ORTHOPT_BF16 : ORTHOPT_FP16);
}

void check_status(orthopt_status st, const char* fn) { TORCH_CHECK(st == ORTHOPT_OK, fn, ": ", orthopt_last_error()); }

// One argument of a call: a list of tensors and how its entries are checked.
struct List {
  const std::vector<at::Tensor>* tensors;
  const char* name;
  bool optional = false;  // the list may be empty and its entries undefined
  bool count = false;     // entries are 0-d fp32 step counts (not shaped like the first list)
  bool any_numel = false; // element counts are checked by the caller (rows of a larger tensor)
  bool index = false;     // int32 row maps (the caller checks their count)
};

bool present(const List& l, size_t i) { return !l.tensors->empty() && (*l.tensors)[i].defined(); }

// Checks every list against the first one (sizes, device, element counts, contiguity, dtypes)
// and groups the indices by the dtypes of their tensors: one kernel call per group.
std::map<std::vector<int>, std::vector<size_t>> by_dtypes(const std::vector<List>& lists, const char* fn) {
  const std::vector<at::Tensor>& first = *lists[0].tensors;
  const size_t n = first.size();
  for (const List& l : lists)
    TORCH_CHECK(l.tensors->size() == n || (l.optional && l.tensors->empty()), fn, ": argument '", l.name, "' has ",
                l.tensors->size(), " tensors, expected ", n);
  std::map<std::vector<int>, std::vector<size_t>> groups;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> key;
    for (const List& l : lists) {
      if (l.optional && !present(l, i)) {
        key.push_back(kAbsent);
        continue;
      }
      const at::Tensor& t = (*l.tensors)[i];
      TORCH_CHECK(t.defined(), fn, ": argument '", l.name, "' [", i, "] is undefined");
      TORCH_CHECK(t.is_cuda() && t.device() == first[0].device(), fn, ": argument '", l.name, "' [", i,
                  "]: expected a tensor on ", first[0].device(), ", got ", t.device());
      TORCH_CHECK(t.is_contiguous(), fn, ": argument '", l.name, "' [", i, "] must be contiguous");
      if (l.index) {
        TORCH_CHECK(t.scalar_type() == at::kInt, fn, ": argument '", l.name, "' [", i, "]: expected int32, got ",
                    t.scalar_type());
        key.push_back(0);
        continue;
      }
      TORCH_CHECK(supported_dtype(t.scalar_type()), fn, ": argument '", l.name, "' [", i,
                  "]: expected fp32, bf16 or fp16, got ", t.scalar_type());
      if (l.count) {
        TORCH_CHECK(t.numel() == 1 && t.scalar_type() == at::kFloat, fn, ": argument '", l.name, "' [", i,
                    "]: expected a one-element fp32 step count, got ", t.scalar_type(), " with ", t.numel(),
                    " elements");
      } else if (!l.any_numel) {
        TORCH_CHECK(t.numel() == first[i].numel(), fn, ": argument '", l.name, "' [", i, "] has ", t.numel(),
                    " elements, expected ", first[i].numel(), " (argument '", lists[0].name, "')");
      }
      key.push_back(static_cast<int>(kernel_dtype(t.scalar_type())));
    }
    groups[key].push_back(i);
  }
  return groups;
}

// The dtype code of an optional list's group entry; absent lists are passed as fp32 (unused).
orthopt_dtype dtype_or_fp32(int code) { return code == kAbsent ? ORTHOPT_FP32 : static_cast<orthopt_dtype>(code); }

// The tensor-list descriptors of one kernel call: list k holds the tensors of lists[k] at idx
// (element counts, device pointers, the group's dtype), absent (data NULL) where the group has
// none there.
class Descriptors {
 public:
  Descriptors(const std::vector<List>& lists, const std::vector<int>& dtypes, const std::vector<size_t>& idx)
      : bufs_(lists.size()) {
    for (size_t k = 0; k < lists.size(); ++k) {
      Buf& b = bufs_[k];
      if (!lists[k].optional || present(lists[k], idx[0]))  // a group holds only present or only absent entries
        for (size_t i : idx) {
          b.numel.push_back((*lists[k].tensors)[i].numel());
          b.data.push_back((*lists[k].tensors)[i].data_ptr());
        }
      b.list = {static_cast<int64_t>(idx.size()), b.numel.data(), b.data.empty() ? nullptr : b.data.data(),
                dtype_or_fp32(dtypes[k])};
    }
  }
  const orthopt_tensor_list& operator[](size_t k) const { return bufs_[k].list; }

 private:
  struct Buf {
    std::vector<int64_t> numel;
    std::vector<void*> data;
    orthopt_tensor_list list{};
  };
  std::vector<Buf> bufs_;  // sized once: the descriptors point into its vectors
};

const uint8_t* keep_pointer(const at::Tensor& keep, const at::Device& device, const char* fn) {
  if (!keep.defined()) return nullptr;
  TORCH_CHECK(keep.scalar_type() == at::kBool && keep.numel() == 1 && keep.is_cuda() && keep.device() == device, fn,
              ": argument 'keep': expected a one-element bool tensor on ", device, ", got ", keep.scalar_type(),
              " with ", keep.numel(), " elements on ", keep.device());
  return static_cast<const uint8_t*>(keep.data_ptr());
}

const double* lr_pointer(const at::Tensor& lr, const at::Device& device, const char* fn) {
  TORCH_CHECK(lr.defined() && lr.scalar_type() == at::kDouble && lr.numel() == 1 && lr.is_cuda() &&
                  lr.device() == device,
              fn, ": argument 'lr': expected a one-element fp64 tensor on ", device);
  return static_cast<const double*>(lr.data_ptr());
}

// What every call needs once its lists are checked: the device made current, its current stream,
// and the device pointers of the skip flag and (for the kernels that take one) the learning rate.
struct Launch {
  c10::cuda::CUDAGuard guard;
  cudaStream_t stream;
  const uint8_t* keep;
  const double* lr;
  Launch(const at::Device& device, const at::Tensor& keep_flag, const at::Tensor* lr_tensor, const char* fn)
      : guard(device),
        stream(at::cuda::getCurrentCUDAStream().stream()),
        keep(keep_pointer(keep_flag, device, fn)),
        lr(lr_tensor ? lr_pointer(*lr_tensor, device, fn) : nullptr) {}
};

// factors[i] for i in idx.
std::vector<double> picked(const std::vector<double>& factors, const std::vector<size_t>& idx) {
  std::vector<double> out;
  for (size_t i : idx) out.push_back(factors[i]);
  return out;
}

// The kernels write through raw pointers, which autograd does not see. Bump the written tensors'
// version counters like an in-place ATen op does (a detached view shares its parameter's), so a
// parameter saved for a backward that has not run yet is reported by autograd, not silently used.
void bump_versions(const std::vector<at::Tensor>& written) {
  for (const at::Tensor& t : written)
    if (t.defined()) t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

bool multi_tensor_handles(const at::Tensor& t) {
  if (!t.defined() || !t.is_cuda() || !supported_dtype(t.scalar_type()) || !t.is_contiguous() || t.numel() == 0)
    return false;
  return kernels_enabled();
}

void momentum_rows(const std::vector<at::Tensor>& momenta, const std::vector<at::Tensor>& grads,
                   const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& stats, int64_t cols, double mu,
                   double grad_weight, bool nesterov, RowStat stat, const at::Tensor& keep) {
  const char* fn = "orthopt::cuda::momentum_rows";
  TORCH_CHECK(cols > 0, fn, ": argument 'cols' must be > 0, got ", cols);
  TORCH_CHECK(stat != RowStat::L1OfMomentum || outs.empty(), fn, ": argument 'outs' must be empty for L1OfMomentum");
  const std::vector<List> lists = {{&momenta, "momenta"},
                                   {&grads, "grads"},
                                   {&outs, "outs", /*optional=*/true},
                                   {&stats, "stats", false, false, /*any_numel=*/true}};
  const auto groups = by_dtypes(lists, fn);
  for (size_t i = 0; i < momenta.size(); ++i) {
    TORCH_CHECK(momenta[i].numel() % cols == 0, fn, ": argument 'momenta' [", i, "] has ", momenta[i].numel(),
                " elements, not whole rows of ", cols);
    TORCH_CHECK(stats[i].scalar_type() == at::kFloat && stats[i].numel() == momenta[i].numel() / cols, fn,
                ": argument 'stats' [", i, "]: expected ", momenta[i].numel() / cols, " fp32 entries (one per row), got ",
                stats[i].numel(), " of ", stats[i].scalar_type());
  }
  if (momenta.empty()) return;
  const Launch launch(momenta[0].device(), keep, nullptr, fn);
  const orthopt_row_stat kernel_stat = stat == RowStat::L1OfMomentum ? ORTHOPT_ROW_L1_MOMENTUM : ORTHOPT_ROW_SUMSQ_OUT;
  for (const auto& [dt, idx] : groups) {
    const Descriptors d(lists, dt, idx);
    check_status(orthopt_multi_momentum_rows(d[0], d[1], d[2], d[3], cols, {mu, grad_weight, nesterov ? 1 : 0},
                                             kernel_stat, launch.keep, launch.stream),
                 "orthopt_multi_momentum_rows");
  }
}

at::Tensor norms_from_row_sumsq(const at::Tensor& row_sumsq, const at::Tensor& stack) {
  const char* fn = "orthopt::cuda::norms_from_row_sumsq";
  TORCH_CHECK(row_sumsq.defined() && row_sumsq.is_cuda() && row_sumsq.scalar_type() == at::kFloat &&
                  row_sumsq.dim() == 2 && row_sumsq.is_contiguous(),
              fn, ": argument 'row_sumsq': expected a contiguous fp32 CUDA tensor [B, rows]");
  TORCH_CHECK(stack.defined() && stack.device() == row_sumsq.device() && stack.scalar_type() == at::kFloat &&
                  stack.dim() == 3 && stack.size(0) == row_sumsq.size(0) && stack.size(1) == row_sumsq.size(1) &&
                  stack.is_contiguous(),
              fn, ": argument 'stack': expected a contiguous fp32 tensor [", row_sumsq.size(0), ", ",
              row_sumsq.size(1), ", cols] on ", row_sumsq.device());
  const c10::cuda::CUDAGuard guard(row_sumsq.device());
  at::Tensor norms = at::empty({row_sumsq.size(0)}, row_sumsq.options());
  check_status(orthopt_norms_from_row_sumsq(row_sumsq.size(0), row_sumsq.size(1), stack.size(2),
                                            row_sumsq.data_ptr<float>(), stack.data_ptr<float>(),
                                            norms.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream()),
               "orthopt_norms_from_row_sumsq");
  return norms;
}

void repair_norms(const at::Tensor& input, const at::Tensor& norms) {
  const char* fn = "orthopt::cuda::repair_norms";
  TORCH_CHECK(input.defined() && input.is_cuda() && supported_dtype(input.scalar_type()) && input.dim() == 3 &&
                  input.is_contiguous(),
              fn, ": argument 'input': expected a contiguous fp32/bf16/fp16 CUDA tensor [B, rows, cols]");
  TORCH_CHECK(norms.defined() && norms.device() == input.device() && norms.scalar_type() == at::kFloat &&
                  norms.numel() == input.size(0) && norms.is_contiguous(),
              fn, ": argument 'norms': expected ", input.size(0), " contiguous fp32 values on ", input.device());
  const c10::cuda::CUDAGuard guard(input.device());
  check_status(orthopt_repair_norms(input.size(0), input.size(1), input.size(2), input.data_ptr(),
                                    kernel_dtype(input.scalar_type()), norms.data_ptr<float>(),
                                    at::cuda::getCurrentCUDAStream().stream()),
               "orthopt_repair_norms");
}

bool momentum_ns_input_handles(const at::Device& device, int64_t rows, int64_t cols) {
  if (!device.is_cuda() || !kernels_enabled()) return false;
  const c10::cuda::CUDAGuard guard(device);
  return orthopt_momentum_ns_input_fits(rows, cols) == 1;
}

void momentum_ns_input(const std::vector<at::Tensor>& momenta, const std::vector<at::Tensor>& grads,
                       const at::Tensor& out, double mu, double grad_weight, bool nesterov, double safety,
                       double eps, const at::Tensor& keep) {
  const char* fn = "orthopt::cuda::momentum_ns_input";
  TORCH_CHECK(out.defined() && out.is_cuda() && out.dim() == 3 && out.is_contiguous() &&
                  (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kHalf),
              fn, ": argument 'out': expected a contiguous bf16/fp16 CUDA tensor [B, rows, cols]");
  TORCH_CHECK(static_cast<int64_t>(momenta.size()) == out.size(0), fn, ": argument 'momenta' has ", momenta.size(),
              " tensors, expected ", out.size(0), " (one per matrix of 'out')");
  const std::vector<List> lists = {{&momenta, "momenta"}, {&grads, "grads"}};
  const auto groups = by_dtypes(lists, fn);
  if (momenta.empty()) return;
  TORCH_CHECK(groups.size() == 1, fn, ": arguments 'momenta' and 'grads' must each have one dtype");
  const int64_t rows = out.size(1), cols = out.size(2);
  for (size_t i = 0; i < momenta.size(); ++i)
    TORCH_CHECK(momenta[i].numel() == rows * cols && momenta[i].device() == out.device(), fn, ": argument 'momenta' [",
                i, "] has ", momenta[i].numel(), " elements on ", momenta[i].device(), ", expected ", rows * cols,
                " on ", out.device());
  const Launch launch(out.device(), keep, nullptr, fn);
  const Descriptors d(lists, groups.begin()->first, groups.begin()->second);
  const at::Tensor row_sumsq = at::empty({out.size(0), rows}, out.options().dtype(at::kFloat));
  const at::Tensor arrived = at::empty({2 * out.size(0)}, out.options().dtype(at::kInt));
  // Scalars rounded to fp32 as scale_cast rounds them (static_cast: to nearest).
  const orthopt_ns_input_params params{{mu, grad_weight, nesterov ? 1 : 0}, static_cast<float>(safety),
                                       static_cast<float>(eps)};
  check_status(orthopt_momentum_ns_input(d[0], d[1], rows, cols, out.data_ptr(), kernel_dtype(out.scalar_type()),
                                         params, row_sumsq.data_ptr<float>(),
                                         static_cast<unsigned int*>(arrived.data_ptr()), launch.keep, launch.stream),
               "orthopt_momentum_ns_input");
}

void update_by_product(const at::Tensor& A_in, const at::Tensor& X_in, const std::vector<at::Tensor>& weights,
                       double factor, const at::Tensor& lr, double weight_decay, const at::Tensor& keep) {
  const char* fn = "orthopt::cuda::update_by_product";
  RECORD_FUNCTION("orthopt::update_by_product", std::vector<c10::IValue>({A_in, X_in}));
  TORCH_CHECK(A_in.dim() == 3 && X_in.dim() == 3 && A_in.is_cuda() && X_in.device() == A_in.device() &&
                  (A_in.scalar_type() == at::kBFloat16 || A_in.scalar_type() == at::kHalf) &&
                  X_in.scalar_type() == A_in.scalar_type(),
              fn, ": arguments 'A', 'X': expected bf16 or fp16 batches [B, m, k], [B, k, n] of one dtype on one CUDA "
              "device, got ", A_in.scalar_type(), " ", A_in.sizes(), " and ", X_in.scalar_type(), " ", X_in.sizes());
  const int64_t batch = A_in.size(0), m = A_in.size(1), k = A_in.size(2), n = X_in.size(2);
  TORCH_CHECK(X_in.size(0) == batch && X_in.size(1) == k, fn, ": argument 'X': expected shape [", batch, ", ", k,
              ", n], got ", X_in.sizes());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == batch, fn, ": argument 'weights': expected ", batch,
              " tensors (one per matrix), got ", weights.size());
  std::vector<float*> w;
  for (size_t b = 0; b < weights.size(); ++b) {
    const at::Tensor& t = weights[b];
    TORCH_CHECK(t.defined() && t.is_cuda() && t.device() == A_in.device() && t.scalar_type() == at::kFloat &&
                    t.is_contiguous() && t.numel() == m * n,
                fn, ": argument 'weights' [", b, "]: expected a contiguous fp32 tensor of ", m, "x", n,
                " elements on ", A_in.device());
    w.push_back(t.data_ptr<float>());
  }
  const bool a_t = is_transposed_view(A_in), x_t = is_transposed_view(X_in);
  const at::Tensor A = a_t ? A_in : A_in.contiguous(), X = x_t ? X_in : X_in.contiguous();
  if (!orthopt_gemm_update_aligned(batch, A.data_ptr(), m * k, X.data_ptr(), k * n, w.data(), 2)) {
    // A matrix off a 256-byte boundary (shapes whose sizes are not multiples of 64 or so): the
    // product in A's dtype and the update pass, what the step does unfolded.
    const at::Tensor D = gemm(A, X, 1.0, at::Tensor(), 0.0);
    std::vector<at::Tensor> directions;
    for (int64_t b = 0; b < batch; ++b) directions.push_back(D[b]);
    update(weights, directions, std::vector<at::Tensor>(weights.size()), std::vector<double>(weights.size(), factor),
           lr, weight_decay, /*cautious=*/false, keep);
    return;
  }
  const Launch launch(A.device(), keep, &lr, fn);
  const at::Tensor scratch =
      at::empty({static_cast<int64_t>(orthopt_gemm_update_scratch_bytes(batch))}, A.options().dtype(at::kByte));
  const orthopt_dtype dt = A.scalar_type() == at::kBFloat16 ? ORTHOPT_BF16 : ORTHOPT_FP16;
  check_status(orthopt_gemm_update(dt, batch, m, n, k, A.data_ptr(), m * k, a_t ? 1 : 0, X.data_ptr(), k * n,
                                   x_t ? 1 : 0, w.data(), factor, launch.lr, weight_decay, launch.keep,
                                   scratch.data_ptr(), launch.stream),
               "orthopt_gemm_update");
  bump_versions(weights);
}

void update(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& directions,
            const std::vector<at::Tensor>& param_copies, const std::vector<double>& factors, const at::Tensor& lr,
            double weight_decay, bool cautious, const at::Tensor& keep, const std::vector<at::Tensor>& row_scales,
            int64_t cols) {
  const char* fn = "orthopt::cuda::update";
  const bool scaled = !row_scales.empty();
  const std::vector<List> lists = {{&weights, "weights"},
                                   {&directions, "directions"},
                                   {&param_copies, "param_copies", /*optional=*/true},
                                   {&row_scales, "row_scales", /*optional=*/true, false, /*any_numel=*/true}};
  const auto groups = by_dtypes(lists, fn);
  TORCH_CHECK(factors.size() == weights.size(), fn, ": argument 'factors' has ", factors.size(), " entries, expected ",
              weights.size());
  if (scaled) {
    TORCH_CHECK(cols > 0, fn, ": argument 'cols' must be > 0 with row_scales, got ", cols);
    for (size_t i = 0; i < weights.size(); ++i)
      TORCH_CHECK(row_scales[i].defined() && row_scales[i].scalar_type() == at::kFloat &&
                      weights[i].numel() % cols == 0 && row_scales[i].numel() == weights[i].numel() / cols,
                  fn, ": argument 'row_scales' [", i, "]: expected ", weights[i].numel() / cols,
                  " fp32 values (one per row of ", cols, " of the weight's ", weights[i].numel(), " elements)");
  }
  if (weights.empty()) return;
  const Launch launch(weights[0].device(), keep, &lr, fn);
  for (const auto& [dt, idx] : groups) {
    const Descriptors d(lists, dt, idx);  // row_scales absent unless scaled
    const auto factor = picked(factors, idx);
    const orthopt_update_params params{{launch.lr, weight_decay, cautious ? 1 : 0}, factor.data(), cols};
    check_status(orthopt_multi_update(d[0], d[1], d[2], d[3], params, launch.keep, launch.stream),
                 "orthopt_multi_update");
  }
  bump_versions(weights);
  bump_versions(param_copies);
}

void update_selected(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& directions,
                     const std::vector<at::Tensor>& row_maps, int64_t cols, const std::vector<at::Tensor>& param_copies,
                     const std::vector<double>& factors, const at::Tensor& lr, double weight_decay, bool cautious,
                     const at::Tensor& keep) {
  const char* fn = "orthopt::cuda::update_selected";
  TORCH_CHECK(cols > 0, fn, ": argument 'cols' must be > 0, got ", cols);
  const std::vector<List> lists = {{&weights, "weights"},
                                   {&directions, "directions", false, false, /*any_numel=*/true},
                                   {&param_copies, "param_copies", /*optional=*/true},
                                   {&row_maps, "row_maps", false, false, true, /*index=*/true}};
  const auto groups = by_dtypes(lists, fn);
  TORCH_CHECK(factors.size() == weights.size(), fn, ": argument 'factors' has ", factors.size(), " entries, expected ",
              weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    TORCH_CHECK(weights[i].numel() % cols == 0 && row_maps[i].numel() == weights[i].numel() / cols, fn,
                ": argument 'row_maps' [", i, "] has ", row_maps[i].numel(), " entries for ", weights[i].numel(),
                " elements in rows of ", cols);
    TORCH_CHECK(directions[i].numel() % cols == 0, fn, ": argument 'directions' [", i, "] must hold rows of ", cols,
                " elements, has ", directions[i].numel());
  }
  if (weights.empty()) return;
  const Launch launch(weights[0].device(), keep, &lr, fn);
  for (const auto& [dt, idx] : groups) {
    const Descriptors d(lists, dt, idx);
    const auto factor = picked(factors, idx);
    const orthopt_update_params params{{launch.lr, weight_decay, cautious ? 1 : 0}, factor.data(), cols};
    check_status(orthopt_multi_update_selected(d[0], d[1], d[3], d[2], params, launch.keep, launch.stream),
                 "orthopt_multi_update_selected");
  }
  bump_versions(weights);
  bump_versions(param_copies);
}

at::Tensor normuon_factors(const at::Tensor& U, const at::Tensor& variance, const at::Tensor& variance_rows,
                           double beta2, double eps, const at::Tensor& keep) {
  const char* fn = "orthopt::cuda::normuon_factors";
  TORCH_CHECK(U.defined() && U.is_cuda() && U.dim() >= 2 && U.is_contiguous() && supported_dtype(U.scalar_type()) &&
                  U.numel() > 0,
              fn, ": argument 'U' must be a non-empty contiguous CUDA tensor of fp32, bf16 or fp16 matrices [..., rows, cols]");
  const int64_t rows = U.size(-2), cols = U.size(-1), n_rows = U.numel() / cols;
  TORCH_CHECK(variance.defined() && variance.is_cuda() && variance.device() == U.device() &&
                  variance.scalar_type() == at::kFloat && variance.is_contiguous(),
              fn, ": argument 'variance' must be a contiguous fp32 tensor on ", U.device());
  const int64_t* rows_ptr = nullptr;
  if (variance_rows.defined()) {
    TORCH_CHECK(variance_rows.is_cuda() && variance_rows.device() == U.device() &&
                    variance_rows.scalar_type() == at::kLong && variance_rows.is_contiguous() &&
                    variance_rows.numel() == n_rows,
                fn, ": argument 'variance_rows' must be a contiguous int64 tensor on ", U.device(), " with ", n_rows,
                " entries (one per row of U), got ", variance_rows.numel(), " of ", variance_rows.scalar_type());
    rows_ptr = variance_rows.data_ptr<int64_t>();
  } else {
    TORCH_CHECK(variance.numel() == n_rows, fn, ": argument 'variance' has ", variance.numel(), " entries, expected ",
                n_rows, " (one per row of U)");
  }
  std::vector<int64_t> sizes = U.sizes().vec();
  sizes.back() = 1;
  at::Tensor factors = at::empty(sizes, U.options().dtype(at::kFloat));
  const Launch launch(U.device(), keep, nullptr, fn);
  check_status(orthopt_normuon_factors(n_rows / rows, rows, cols, U.data_ptr(), kernel_dtype(U.scalar_type()),
                                       variance.data_ptr<float>(), rows_ptr, beta2, eps, factors.data_ptr<float>(),
                                       launch.keep, launch.stream),
               "orthopt_normuon_factors");
  bump_versions({variance});
  return factors;
}

Dion3Selection dion3_take_rows(const at::Tensor& M, const at::Tensor& rows_idx, double mu, const at::Tensor& keep) {
  const char* fn = "orthopt::cuda::dion3_take_rows";
  TORCH_CHECK(M.defined() && M.is_cuda() && M.dim() == 3 && M.is_contiguous() && supported_dtype(M.scalar_type()) &&
                  M.numel() > 0,
              fn, ": argument 'M' must be a non-empty contiguous CUDA tensor [B, rows, cols] of fp32, bf16 or fp16");
  const int64_t B = M.size(0), rows = M.size(1), cols = M.size(2);
  TORCH_CHECK(rows_idx.defined() && rows_idx.is_cuda() && rows_idx.device() == M.device() &&
                  rows_idx.scalar_type() == at::kLong && rows_idx.dim() == 2 && rows_idx.size(0) == B &&
                  rows_idx.size(1) <= rows && rows_idx.is_contiguous(),
              fn, ": argument 'rows_idx' must be a contiguous int64 tensor [", B, ", k <= ", rows, "] on ", M.device(),
              ", got ", rows_idx.sizes(), " of ", rows_idx.scalar_type());
  const int64_t k = rows_idx.size(1);
  Dion3Selection out;
  out.selected = at::empty({B, k, cols}, M.options());
  out.flat = at::empty({B * k}, rows_idx.options());
  out.row_map = at::full({B * rows}, -1, rows_idx.options().dtype(at::kInt));
  const Launch launch(M.device(), keep, nullptr, fn);
  check_status(orthopt_dion3_take_rows(B, rows, cols, k, M.data_ptr(), kernel_dtype(M.scalar_type()),
                                       rows_idx.data_ptr<int64_t>(), mu, out.selected.data_ptr(),
                                       out.flat.data_ptr<int64_t>(), out.row_map.data_ptr<int32_t>(), launch.keep,
                                       launch.stream),
               "orthopt_dion3_take_rows");
  bump_versions({M});
  return out;
}

void adamw(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& exp_avgs,
           const std::vector<at::Tensor>& exp_avg_sqs, const std::vector<at::Tensor>& steps,
           const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& param_copies, const at::Tensor& lr,
           double beta1, double beta2, double eps, double weight_decay, bool cautious, const at::Tensor& keep) {
  const char* fn = "orthopt::cuda::adamw";
  const std::vector<List> lists = {{&grads, "grads"},
                                   {&exp_avgs, "exp_avgs"},
                                   {&exp_avg_sqs, "exp_avg_sqs"},
                                   {&steps, "steps", /*optional=*/false, /*count=*/true},
                                   {&weights, "weights"},
                                   {&param_copies, "param_copies", /*optional=*/true}};
  const auto groups = by_dtypes(lists, fn);
  if (grads.empty()) return;
  const Launch launch(grads[0].device(), keep, &lr, fn);
  const orthopt_adamw_params params{{launch.lr, weight_decay, cautious ? 1 : 0}, beta1, beta2, eps};
  for (const auto& [dt, idx] : groups) {
    const Descriptors d(lists, dt, idx);
    check_status(orthopt_multi_adamw(d[0], d[1], d[2], d[3], d[4], d[5], params, launch.keep, launch.stream),
                 "orthopt_multi_adamw");
  }
  bump_versions(weights);
  bump_versions(param_copies);
}

void lion(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& exp_avgs,
          const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& param_copies, const at::Tensor& lr,
          double beta1, double beta2, double weight_decay, bool cautious, const at::Tensor& keep) {
  const char* fn = "orthopt::cuda::lion";
  const std::vector<List> lists = {{&grads, "grads"},
                                   {&exp_avgs, "exp_avgs"},
                                   {&weights, "weights"},
                                   {&param_copies, "param_copies", /*optional=*/true}};
  const auto groups = by_dtypes(lists, fn);
  if (grads.empty()) return;
  const Launch launch(grads[0].device(), keep, &lr, fn);
  const orthopt_lion_params params{{launch.lr, weight_decay, cautious ? 1 : 0}, beta1, beta2};
  for (const auto& [dt, idx] : groups) {
    const Descriptors d(lists, dt, idx);
    check_status(orthopt_multi_lion(d[0], d[1], d[2], d[3], params, launch.keep, launch.stream), "orthopt_multi_lion");
  }
  bump_versions(weights);
  bump_versions(param_copies);
}

}  // namespace orthopt::cuda
#endif  // ORTHOPT_WITH_CUDA

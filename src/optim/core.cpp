// The optimizer's shared core: state, banks, weights, the skip gate and the step's dispatch
// (optimizer_impl.h).
#include "optim/optimizer_impl.h"

#include "orthopt/runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_set>

#include "optim/update_math.h"

namespace orthopt {

using namespace optim_core;
using optim_detail::lr_adjust_factor;

namespace optim_core {

bool is_low_precision(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

bool is_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// Updates are computed in fp32 (fp64 for fp64 parameters).
at::ScalarType work_dtype(const at::Tensor& p) { return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

bool uses_master(const at::Tensor& p, const GroupOptions& o) {
  return o.master_weights && is_low_precision(p.scalar_type());
}

// Momentum-like state: fp32 when master weights are kept, else the parameter's dtype.
at::ScalarType state_dtype(const at::Tensor& p, const GroupOptions& o) {
  return uses_master(p, o) ? at::kFloat : p.scalar_type();
}

// The shape the matrix optimizers see: the parameter itself ([m, n] or a batch [..., m, n]),
// or with `flatten` a >=3-D weight as one [dim0, prod(rest)] matrix.
std::vector<int64_t> matrix_sizes(const at::Tensor& p, const GroupOptions& o) {
  if (o.ortho.flatten && p.dim() > 2) return {p.size(0), p.numel() / std::max<int64_t>(p.size(0), 1)};
  return p.sizes().vec();
}

// The state a parameter of this group holds, by name (algorithms.md §3–7).
std::vector<StateSpec> state_specs(const at::Tensor& p, const GroupOptions& o) {
  std::vector<StateSpec> specs;
  const auto sd = state_dtype(p, o);
  const auto msz = matrix_sizes(p, o);
  auto rows_shape = [&] {
    auto s = msz;
    s.back() = 1;
    return s;
  };
  switch (o.algorithm) {
    case Algorithm::Muon:
    case Algorithm::Dion2: specs.push_back({"momentum", p.sizes().vec(), sd}); break;
    case Algorithm::NorMuon:
    case Algorithm::Dion3:
      specs.push_back({"momentum", p.sizes().vec(), sd});
      specs.push_back({"variance", rows_shape(), at::kFloat});
      break;
    case Algorithm::Dion: {
      specs.push_back({"momentum", p.sizes().vec(), sd});
      auto q = msz;
      const int64_t m = q[q.size() - 2], n = q.back();
      q[q.size() - 2] = n;
      q.back() = optim_detail::dion_rank(o.rank_fraction, m, n);
      specs.push_back({"Q", q, at::kFloat});
      break;
    }
    case Algorithm::AdamW:
      specs.push_back({"exp_avg", p.sizes().vec(), sd});
      specs.push_back({"exp_avg_sq", p.sizes().vec(), sd});
      specs.push_back({"step", {}, at::kFloat});
      break;
    case Algorithm::Lion: specs.push_back({"exp_avg", p.sizes().vec(), sd}); break;
  }
  if (uses_master(p, o)) specs.push_back({"master", p.sizes().vec(), at::kFloat});
  return specs;
}

// Dion's random initial Q of parameter i of group g ([..., n, r] fp32, CPU). The distributed
// layers rely on this rule (through set_initial_q_sources) to start from the same Q.
at::Tensor random_q(size_t g, size_t i, at::IntArrayRef sizes) {
  auto gen = at::detail::createCPUGenerator(0x6f72746f + 1000003ULL * g + i);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
}

int64_t leading_count(const std::vector<int64_t>& msz) {
  int64_t n = 1;
  for (size_t d = 0; d + 2 < msz.size(); ++d) n *= msz[d];
  return n;
}

// Whether Dion3 and NorMuon's row statistics run per bank (below) on `device`, or per matrix
// (the reference path). Banks by default, except on the CPU: there nothing is launch-bound, and
// the large stacked temporaries are what glibc's malloc hands back to the OS after each step,
// so touching them again costs page faults that made the CPU step 10-40% slower than per matrix
// (docs/optimizers.md). ExecutionOptions::banks forces them on or off; with the kernels off
// (ExecutionOptions::kernels) Auto gives the per-matrix path everywhere.
bool use_banks(c10::Device device, const ExecutionOptions& e) {
  if (e.banks != Toggle::Auto) return e.banks == Toggle::On;
  return kernels_enabled() && !device.is_cpu();
}

// The tensors `ts` (one per param of a bank, each its matrices as r×c: the weights r = rows,
// c = cols, the variance c = 1) as one [B, r, c] tensor in `dtype`: a view of `ts[0]` when it is
// the only one and has that dtype (never write into the result), else a new tensor. Values are
// only copied or converted, so each param's slice holds exactly what its own .to(dtype) holds.
at::Tensor stack_bank(const std::vector<at::Tensor>& ts, int64_t r, int64_t c, at::ScalarType dtype) {
  const bool one_dtype = std::all_of(ts.begin(), ts.end(),
                                     [&](const at::Tensor& t) { return t.scalar_type() == ts[0].scalar_type(); });
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(one_dtype ? t.reshape({-1, r, c}) : t.reshape({-1, r, c}).to(dtype));
  return (parts.size() == 1 ? parts[0] : at::cat(parts, 0)).to(dtype);
}

// Whether `sources` can make the initial Q of parameter i of group g (see optim.h).
void check_q_sources(const ParamGroup& grp, size_t g, size_t i, const std::vector<QSource>& sources) {
  const std::string label = param_label(grp, g, i);
  TORCH_CHECK(grp.options.algorithm == Algorithm::Dion, label, ": initial Q sources need a 'dion' group, this one is '",
              to_string(grp.options.algorithm), "'");
  const auto msz = matrix_sizes(grp.params[i], grp.options);
  const int64_t m = msz[msz.size() - 2], n = msz.back();
  int64_t total = 0;
  for (const auto& s : sources) {
    const auto& ss = s.matrix_sizes;
    TORCH_CHECK(ss.size() >= 2 && ss[ss.size() - 2] == m && ss.back() == n, label, ": initial Q source (group ",
                s.group, ", param ", s.index, ") has matrix shape ", at::IntArrayRef(ss), ", the parameter's matrices are ",
                m, "x", n);
    TORCH_CHECK(s.begin >= 0 && s.begin < s.end && s.end <= leading_count(ss), label, ": initial Q source (group ",
                s.group, ", param ", s.index, ") range [", s.begin, ", ", s.end, ") is outside its ",
                leading_count(ss), " matrices");
    total += s.end - s.begin;
  }
  TORCH_CHECK(total == leading_count(msz), label, ": initial Q sources cover ", total, " matrices, the parameter has ",
              leading_count(msz));
}

}  // namespace optim_core

OptimizerImpl::OptimizerImpl(std::vector<ParamGroup> g) : groups(std::move(g)) {
  c10::optional<c10::Device> device;
  std::unordered_set<const void*> seen;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    auto& grp = groups[gi];
    validate_options(grp.options, gi);
    TORCH_CHECK_VALUE(grp.names.empty() || grp.names.size() == grp.params.size(), "group ", gi, ": 'names' has ",
                      grp.names.size(), " entries for ", grp.params.size(), " params");
    for (size_t i = 0; i < grp.params.size(); ++i) {
      const auto& p = grp.params[i];
      const std::string label = param_label(grp, gi, i);
      validate_param(p, grp.options, label);
      TORCH_CHECK_VALUE(seen.insert(p.unsafeGetTensorImpl()).second, label,
                        " is listed more than once across the groups (option 'params')");
      if (!device) device = p.device();
      TORCH_CHECK_VALUE(p.device() == *device, label, " is on ", p.device(), " but earlier parameters are on ",
                        *device, "; one optimizer handles one device");
    }
    state.emplace_back(grp.params.size());
    q_sources.emplace_back(grp.params.size());
  }
  auto opts = at::TensorOptions().dtype(at::kFloat).device(device.value_or(at::Device(at::kCPU)));
  lr_scale = at::ones({}, opts);
  skip_factor = at::ones({}, opts);
  steps = at::zeros({}, opts.dtype(at::kLong));
}

StateDict& OptimizerImpl::state_of(size_t g, size_t i) {
  StateDict& st = state[g][i];
  if (!st.empty()) return st;
  const auto& p = groups[g].params[i];
  const auto& o = groups[g].options;
  for (const auto& spec : state_specs(p, o)) {
    auto opts = p.options().dtype(spec.dtype);
    if (spec.name == "master") {
      st[spec.name] = p.detach().to(at::kFloat).clone();
    } else if (spec.name == "Q") {
      // Dion's right factor starts random; seeded per (group, param) so runs repeat. Drawn on
      // the CPU (the same Q on every device); to a GPU through pinned memory, since a copy from
      // pageable memory makes the host wait for the device (tests/gpu: no step synchronizes).
      at::Tensor q = initial_q(g, i, spec.sizes);
      st[spec.name] = p.is_cuda() ? q.pin_memory().to(p.device(), q.scalar_type(), /*non_blocking=*/true)
                                  : q.to(p.device());
    } else {
      st[spec.name] = at::zeros(spec.sizes, opts);
    }
  }
  return st;
}

// Q [..., n, r]: drawn from the param's own seed, or assembled from its sources (optim.h).
at::Tensor OptimizerImpl::initial_q(size_t g, size_t i, const std::vector<int64_t>& sizes) {
  const auto& sources = q_sources[g][i];
  if (sources.empty()) return random_q(g, i, sizes);
  check_q_sources(groups[g], g, i, sources);  // options (flatten) may have changed since
  const int64_t n = sizes[sizes.size() - 2], r = sizes.back();
  std::vector<at::Tensor> parts;
  for (const auto& s : sources) {
    auto full = s.matrix_sizes;  // the source's whole Q: same n and r (same m×n, same group options)
    full[full.size() - 2] = n;
    full.back() = r;
    if (!(q_cache.q.defined() && q_cache.g == s.group && q_cache.i == s.index && q_cache.sizes == full)) {
      q_cache.q = random_q(s.group, s.index, full);
      q_cache.g = s.group;
      q_cache.i = s.index;
      q_cache.sizes = full;
    }
    parts.push_back(q_cache.q.reshape({-1, n, r}).narrow(0, s.begin, s.end - s.begin));
  }
  return at::cat(parts, 0).reshape(sizes);  // cat copies: no view of the cached tensor
}

// Indices of the group's params that have a gradient (validated).
std::vector<size_t> OptimizerImpl::active(size_t g) {
  std::vector<size_t> out;
  const auto& grp = groups[g];
  for (size_t i = 0; i < grp.params.size(); ++i) {
    const auto& p = grp.params[i];
    const auto& grad = p.grad();
    if (!grad.defined()) continue;
    TORCH_CHECK(!grad.is_sparse(), param_label(grp, g, i), ": sparse gradients are not supported");
    TORCH_CHECK(grad.sizes() == p.sizes(), param_label(grp, g, i), ": gradient shape ", grad.sizes(),
                " does not match the parameter shape ", p.sizes());
    out.push_back(i);
  }
  return out;
}

// The tensor that holds the weights: the fp32 master, or the parameter itself.
at::Tensor OptimizerImpl::weight_storage(size_t g, size_t i) {
  const auto& p = groups[g].params[i];
  if (uses_master(p, groups[g].options)) return state_of(g, i).at("master");
  return p.detach();
}

void OptimizerImpl::write_weights(size_t g, size_t i, const at::Tensor& W_new) {
  at::Tensor p = groups[g].params[i].detach();
  if (uses_master(groups[g].params[i], groups[g].options)) {
    at::Tensor& master = state_of(g, i).at("master");
    commit(master, W_new);
    p.copy_(master);
  } else {
    commit(p, W_new);
  }
}

// write_weights() for a bank: W_new [B, rows, cols] gated once against W_old (the weights
// stacked; by `gate`, the skip flag by default), then per param one copy (and the
// parameter's copy of its master weights).
void OptimizerImpl::write_weights_bank(size_t g, const Bank& b, const at::Tensor& W_new, const at::Tensor& W_old) {
  write_weights_bank(g, b, W_new, W_old, keep_flag());
}

void OptimizerImpl::write_weights_bank(size_t g, const Bank& b, const at::Tensor& W_new, const at::Tensor& W_old,
                        const at::Tensor& gate) {
  const at::Tensor v = gated(W_new, W_old, gate);
  for (size_t j = 0; j < b.params.size(); ++j) {
    const size_t i = b.params[j];
    at::Tensor p = groups[g].params[i].detach();
    const at::Tensor w = b.slice(v, j).reshape(p.sizes());
    if (uses_master(groups[g].params[i], groups[g].options)) {
      state_of(g, i).at("master").copy_(w);
      p.copy_(state_of(g, i).at("master"));
    } else {
      p.copy_(w);
    }
  }
}

at::Tensor OptimizerImpl::grad_of(size_t g, size_t i) {
  const auto& p = groups[g].params[i];
  return p.grad().detach().to(work_dtype(p));
}

// The banks of the active params `idx` of group g (in order of first appearance).
std::vector<Bank> OptimizerImpl::banks(size_t g, const std::vector<size_t>& idx) const {
  const auto& o = groups[g].options;
  std::vector<Bank> out;
  std::map<std::tuple<int64_t, int64_t, at::ScalarType>, size_t> index;
  for (size_t j = 0; j < idx.size(); ++j) {
    const auto& p = groups[g].params[idx[j]];
    const auto msz = matrix_sizes(p, o);
    const int64_t rows = msz[msz.size() - 2], cols = msz.back();
    auto [it, fresh] = index.try_emplace({rows, cols, work_dtype(p)}, out.size());
    if (fresh) {
      out.emplace_back();
      out.back().rows = rows;
      out.back().cols = cols;
      out.back().dtype = work_dtype(p);
    }
    Bank& b = out[it->second];
    b.params.push_back(idx[j]);
    b.positions.push_back(j);
    b.offsets.push_back(b.offsets.back() + leading_count(msz));
  }
  return out;
}

// Whether the active params `idx` of group g go through banks (use_banks()).
bool OptimizerImpl::banks_used(size_t g, const std::vector<size_t>& idx) const {
  return !idx.empty() && use_banks(groups[g].params[idx[0]].device(), groups[g].options.ortho.execution);
}

// The state tensors `name` of a bank's params.
std::vector<at::Tensor> OptimizerImpl::bank_state(size_t g, const Bank& b, const char* name) {
  std::vector<at::Tensor> out;
  for (size_t i : b.params) out.push_back(state_of(g, i).at(name));
  return out;
}

// The state `name` of a bank's params (each its matrices as rows×cols: the momentum
// cols = b.cols, the variance 1; Dion's Q n×r) as one [B, rows, cols] tensor whose slices ARE those state
// tensors, so a step updates them in place: no stacking copy before and no copy back per
// param after (for Dion3 on a large model these two copies were a third of the step).
// When they are not yet consecutive in one buffer (first step, after load_param_states(), a
// changed set of active params) they are moved into a new one and each param's state becomes
// its view (state_version counts such moves). Undefined where a state tensor's dtype is not
// `dtype`: the caller then stacks.
at::Tensor OptimizerImpl::owned_bank(size_t g, const Bank& b, const char* name, int64_t cols, at::ScalarType dtype) {
  return owned_bank(g, b, name, b.rows, cols, dtype);
}

at::Tensor OptimizerImpl::owned_bank(size_t g, const Bank& b, const char* name, int64_t rows, int64_t cols,
                      at::ScalarType dtype) {
  const auto ts = bank_state(g, b, name);
  for (const auto& t : ts)
    if (t.scalar_type() != dtype) return {};
  const int64_t per_matrix = rows * cols;
  const at::Tensor& first = ts[0];
  bool consecutive = true;
  for (size_t j = 0; j < ts.size() && consecutive; ++j)
    consecutive = ts[j].is_contiguous() && ts[j].is_alias_of(first) &&
                  ts[j].storage_offset() == first.storage_offset() + b.offsets[j] * per_matrix;
  if (consecutive)
    return first.as_strided({b.size(), rows, cols}, {per_matrix, cols, 1}, first.storage_offset());
  at::Tensor buffer = at::empty({b.size(), rows, cols}, first.options());
  for (size_t j = 0; j < ts.size(); ++j) {
    at::Tensor view = b.slice(buffer, j).view(ts[j].sizes());
    view.copy_(ts[j]);
    state[g][b.params[j]][name] = view;
  }
  ++state_version;
  return buffer;
}

// The options of the optimizers' orthogonalize() calls.
OrthoOptions OptimizerImpl::batch_ortho_options(const OrthoOptions& opt) {
  OrthoOptions o = opt;
  o.flatten = false;  // flattening already happened (matrix_sizes)
  o.nonfinite = NonFinitePolicy::Propagate;
  return o;
}

// Orthogonalizes matrices (each [..., m, n]); same-shaped ones in one batched call.
std::vector<at::Tensor> OptimizerImpl::orthogonalize_all(const std::vector<at::Tensor>& mats, const OrthoOptions& opt) {
  const OrthoOptions o = batch_ortho_options(opt);
  std::map<std::vector<int64_t>, std::vector<size_t>> by_shape;
  for (size_t j = 0; j < mats.size(); ++j) by_shape[mats[j].sizes().vec()].push_back(j);
  std::vector<at::Tensor> out(mats.size());
  for (const auto& [shape, idx] : by_shape) {
    if (idx.size() == 1) {
      out[idx[0]] = orthogonalize(mats[idx[0]], o);
      continue;
    }
    std::vector<at::Tensor> batch;
    for (size_t j : idx) batch.push_back(mats[j]);
    auto res = orthogonalize(at::stack(batch, 0), o);
    for (size_t k = 0; k < idx.size(); ++k) out[idx[k]] = res[static_cast<int64_t>(k)];
  }
  return out;
}

// U (matrix view) scaled for the lr rule. Without split_sizes returns U and the factor;
// with split_sizes each row block carries its own block's factor and the factor is 1.
std::pair<at::Tensor, double> OptimizerImpl::adjust_rows(const at::Tensor& U, const GroupOptions& o) {
  const int64_t rows = U.size(-2), cols = U.size(-1);
  if (o.ortho.split_sizes.empty()) return {U, lr_adjust_factor(o.lr_adjust, rows, cols)};
  std::vector<at::Tensor> blocks;
  int64_t offset = 0;
  for (int64_t s : o.ortho.split_sizes) {
    blocks.push_back(U.narrow(-2, offset, s) * lr_adjust_factor(o.lr_adjust, s, cols));
    offset += s;
  }
  return {at::cat(blocks, -2), 1.0};
}

// Optimizer::enqueue_step(): the whole step but finish_step()'s part.
void OptimizerImpl::enqueue_step() {
  at::NoGradGuard no_grad;
  q_cache.q.reset();
  pending_dion.clear();
  if (skip_active) keep = skip_factor != 0;
  // lr in fp64 so host lr values are not rounded twice; 0-d, so it does not promote tensors.
  const at::Tensor scale = lr_scale.to(at::kDouble);
  for (size_t g = 0; g < groups.size(); ++g) {
    const KernelsScope kernels(groups[g].options.ortho.execution.kernels);
    const at::Tensor lr = scale * groups[g].options.lr;
    switch (groups[g].options.algorithm) {
      case Algorithm::Muon:
      case Algorithm::NorMuon: step_muon(g, lr); break;
      case Algorithm::Dion3: step_dion3(g, lr); break;
      case Algorithm::Dion2: step_dion2(g, lr); break;
      case Algorithm::Dion: step_dion(g, lr); break;
      case Algorithm::AdamW: step_adamw(g, lr); break;
      case Algorithm::Lion: step_lion(g, lr); break;
    }
  }
  if (skip_active)
    steps.add_(keep.to(at::kLong));
  else
    steps.add_(1);
  q_cache.q.reset();
}

// Checks `states` against the groups (names and shapes) and returns them ready to install
// (cast and moved like the live state). Throws before anything is changed.
std::vector<std::vector<StateDict>> OptimizerImpl::prepare_states(const std::vector<std::vector<StateDict>>& states) const {
  TORCH_CHECK_VALUE(states.size() == groups.size(), "optimizer state: has ", states.size(),
                    " groups but this optimizer has ", groups.size());
  std::vector<std::vector<StateDict>> out(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& grp = groups[g];
    TORCH_CHECK_VALUE(states[g].size() == grp.params.size(), "optimizer state: group ", g, " has ", states[g].size(),
                      " params but this optimizer's group has ", grp.params.size());
    out[g].resize(grp.params.size());
    for (size_t i = 0; i < grp.params.size(); ++i) {
      const auto& given = states[g][i];
      if (given.empty()) continue;
      const auto& p = grp.params[i];
      const std::string label = param_label(grp, g, i);
      const auto specs = state_specs(p, grp.options);
      std::ostringstream expected;
      for (const auto& s : specs) expected << s.name << " ";
      TORCH_CHECK_VALUE(given.size() == specs.size(), label, ": the state holds ", given.size(),
                        " tensors but algorithm '", to_string(grp.options.algorithm), "' expects: ", expected.str());
      for (const auto& spec : specs) {
        auto it = given.find(spec.name);
        TORCH_CHECK_VALUE(it != given.end() && it->second.defined(), label, ": state '", spec.name,
                          "' is missing (algorithm '", to_string(grp.options.algorithm), "' expects: ", expected.str(),
                          ")");
        TORCH_CHECK_VALUE(it->second.sizes() == at::IntArrayRef(spec.sizes), label, ": state '", spec.name,
                          "' has shape ", it->second.sizes(), " but this optimizer expects ",
                          at::IntArrayRef(spec.sizes));
        TORCH_CHECK_VALUE(is_float(it->second.scalar_type()), label, ": state '", spec.name, "' has dtype ",
                          it->second.scalar_type());
        out[g][i][spec.name] = it->second.detach().to(p.device(), spec.dtype, /*non_blocking=*/false, /*copy=*/true);
      }
    }
  }
  return out;
}

#ifdef ORTHOPT_WITH_CUDA
// The fused steps (the *_fused functions of each algorithm's file) do what their reference
// counterparts do, with the same fp32 operations in the same order (the kernels avoid fused
// multiply-adds), state in the same dtypes and the same skip gating (the kernels write nothing
// when `keep` is false), so both paths agree to fp32 rounding; tests/gpu/test_gpu_fused.cpp
// compares them.

// What the update kernels write, as weights()/write_weights(): the fp32 master and the
// parameter as its copy, or the parameter itself (no copy).
void OptimizerImpl::add_weights(size_t g, size_t i, std::vector<at::Tensor>& weights, std::vector<at::Tensor>& copies) {
  const auto& p = groups[g].params[i];
  if (uses_master(p, groups[g].options)) {
    weights.push_back(state_of(g, i).at("master"));
    copies.push_back(p.detach());
  } else {
    weights.push_back(p.detach());
    copies.emplace_back();
  }
}
#endif  // ORTHOPT_WITH_CUDA

}  // namespace orthopt

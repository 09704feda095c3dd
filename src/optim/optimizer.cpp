// orthopt::Optimizer: parameter groups of any algorithm (algorithms.md §3–7, §9).
//
// Structure of a step: for each group, the algorithm's step function reads the gradient and
// the state, computes NEW tensors with the pure math of update_math.h, and commits them
// through commit(), the single place where the skip factor acts. Every matrix the
// orthogonalization needs in a group is collected first and same-shaped ones go through one
// batched orthogonalize() call.
//
// Dion3 and NorMuon's row statistics run per BANK: the group's active matrices of one shape
// (2-D params, the matrices of 3-D expert stacks, flattened params) stacked into [B, m, n], every
// step of the math one ATen op on the bank instead of one per matrix (a GPU step is otherwise
// launch-bound). State and weights stay separate tensors per param: they are stacked per step
// and each written back by one copy. The per-matrix functions stay as the reference path
// (ORTHOPT_GPU_KERNELS=0) and the CPU default (use_banks()); on the CPU both give the same bits
// (tests/cpp/test_optim_banks.cpp).
//
// On CUDA, Muon/NorMuon, AdamW and Lion groups take a fused path (the *_fused functions): the
// elementwise math of all the group's tensors runs in a few multi-tensor kernel launches
// (src/cuda/multi_tensor_cuda.h) with the same fp32 operations as the reference path, which
// stays the path for CPU, fp64, Dion and ORTHOPT_GPU_KERNELS=0. Dion3 writes its weights
// through the same multi-tensor update kernel there.
#include "orthopt/optim.h"
#include "orthopt/runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_set>

#include "core/env_switch.h"
#include "optim/update_math.h"
#include "ortho/orthogonalize_detail.h"

#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#include "cuda/products_cuda.h"
#endif

namespace orthopt {

using optim_detail::lr_adjust_factor;
using StateDict = Optimizer::StateDict;

// ---------------------------------------------------------------- names

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Muon: return "muon";
    case Algorithm::NorMuon: return "normuon";
    case Algorithm::Dion3: return "dion3";
    case Algorithm::Dion: return "dion";
    case Algorithm::AdamW: return "adamw";
    case Algorithm::Lion: return "lion";
    case Algorithm::Dion2: return "dion2";
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& s) {
  for (Algorithm a : {Algorithm::Muon, Algorithm::NorMuon, Algorithm::Dion3, Algorithm::Dion2, Algorithm::Dion,
                      Algorithm::AdamW, Algorithm::Lion})
    if (s == to_string(a)) return a;
  TORCH_CHECK_VALUE(false, "argument 'algorithm': unknown algorithm '", s,
                    "' (known: muon, normuon, dion3, dion2, dion, adamw, lion)");
}

const char* to_string(LrAdjust a) {
  switch (a) {
    case LrAdjust::SpectralNorm: return "spectral_norm";
    case LrAdjust::Jordan: return "jordan";
    case LrAdjust::RmsNorm: return "rms_norm";
    case LrAdjust::None: return "none";
  }
  return "?";
}

LrAdjust parse_lr_adjust(const std::string& s) {
  if (s == "spectral_norm") return LrAdjust::SpectralNorm;
  if (s == "jordan" || s == "original") return LrAdjust::Jordan;
  if (s == "rms_norm" || s == "match_rms_adamw") return LrAdjust::RmsNorm;
  if (s == "none") return LrAdjust::None;
  TORCH_CHECK_VALUE(false, "argument 'lr_adjust': unknown rule '", s,
                    "' (known: spectral_norm, jordan, rms_norm, none; torch's original, match_rms_adamw)");
}

const char* to_string(MomentumStyle m) { return m == MomentumStyle::Ema ? "ema" : "accumulate"; }

MomentumStyle parse_momentum_style(const std::string& s) {
  if (s == "accumulate") return MomentumStyle::Accumulate;
  if (s == "ema") return MomentumStyle::Ema;
  TORCH_CHECK_VALUE(false, "argument 'momentum_style': unknown style '", s, "' (known: accumulate, ema)");
}

const char* to_string(DionQr q) { return q == DionQr::Cholesky ? "cholesky" : "householder"; }

DionQr parse_dion_qr(const std::string& s) {
  if (s == "householder") return DionQr::Householder;
  if (s == "cholesky") return DionQr::Cholesky;
  TORCH_CHECK_VALUE(false, "argument 'dion_qr': unknown method '", s, "' (known: householder, cholesky)");
}

bool is_matrix_algorithm(Algorithm a) {
  return a == Algorithm::Muon || a == Algorithm::NorMuon || a == Algorithm::Dion3 || a == Algorithm::Dion2 ||
         a == Algorithm::Dion;
}

// ---------------------------------------------------------------- helpers

std::string param_label(const ParamGroup& g, size_t group, size_t index) {
  std::ostringstream s;
  if (index < g.names.size() && !g.names[index].empty())
    s << "parameter '" << g.names[index] << "' (group " << group << ")";
  else
    s << "parameter " << index << " of group " << group;
  return s.str();
}

namespace {

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

struct StateSpec {
  std::string name;
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

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

// Smallest eps options: nonzero in fp32 (its smallest normal number is 1.18e-38), and for
// NorMuon's normuon_eps with 1/eps² below fp32's largest number (3.4e38).
constexpr double kMinEps = 1e-38;
constexpr double kMinNormuonEps = 1e-19;

void validate_options(const GroupOptions& o, size_t group) {
  auto where = [&](const char* opt) {
    std::ostringstream s;
    s << "group " << group << " (" << to_string(o.algorithm) << "): option '" << opt << "'";
    return s.str();
  };
  const Algorithm a = o.algorithm;
  TORCH_CHECK_VALUE(std::isfinite(o.lr) && o.lr >= 0, where("lr"), " must be finite and >= 0, got ", o.lr);
  TORCH_CHECK_VALUE(std::isfinite(o.weight_decay) && o.weight_decay >= 0, where("weight_decay"),
                    " must be finite and >= 0, got ", o.weight_decay);
  if (is_matrix_algorithm(a)) {
    TORCH_CHECK_VALUE(o.momentum >= 0 && o.momentum < 1, where("momentum"), " must be in [0, 1), got ", o.momentum);
    TORCH_CHECK_VALUE(o.normuon_beta2 >= 0 && o.normuon_beta2 < 1, where("normuon_beta2"),
                      " must be in [0, 1), got ", o.normuon_beta2);
    // The eps options must be positive where a zero input would otherwise give 0/0: NorMuon's
    // U/(sqrt(V)+eps) with U = V = 0, Dion's column normalization R/(|R|+eps) with R = 0, the
    // orthogonalization's X/(|X|·safety+eps) with X = 0; and large enough to stay nonzero in fp32
    // (kMinEps), NorMuon's also to keep 1/eps² (its norm of U/(sqrt(V)+eps)) finite in fp32.
    if (a == Algorithm::NorMuon || a == Algorithm::Dion3)
      TORCH_CHECK_VALUE(std::isfinite(o.normuon_eps) && o.normuon_eps >= kMinNormuonEps, where("normuon_eps"),
                        " must be finite and >= ", kMinNormuonEps, " (a zero update would give 0/0), got ",
                        o.normuon_eps);
    if (a == Algorithm::Dion)
      TORCH_CHECK_VALUE(std::isfinite(o.eps) && o.eps >= kMinEps, where("eps"), " must be finite and >= ", kMinEps,
                        " (a zero momentum would give 0/0), got ", o.eps);
    if (o.ortho.eps)
      TORCH_CHECK_VALUE(std::isfinite(*o.ortho.eps) && *o.ortho.eps >= kMinEps, where("ns_eps"),
                        " must be finite and >= ", kMinEps, " (a zero update would give 0/0), got ", *o.ortho.eps);
    TORCH_CHECK_VALUE(o.fraction > 0 && o.fraction <= 1, where("fraction"), " must be in (0, 1], got ", o.fraction);
    TORCH_CHECK_VALUE(o.rank_fraction > 0 && o.rank_fraction <= 1, where("rank_fraction"),
                      " must be in (0, 1], got ", o.rank_fraction);
    if (a == Algorithm::Dion3 || a == Algorithm::Dion2 || a == Algorithm::Dion)
      TORCH_CHECK_VALUE(o.ortho.split_sizes.empty(), where("split_sizes"), " is not supported by ", to_string(a),
                        " (row selection / low rank act on the whole matrix)");
    try {
      (void)resolve_schedule(o.ortho);  // unknown schedule, bad overrides
    } catch (const c10::Error& e) {
      TORCH_CHECK_VALUE(false, where("ortho"), ": ", e.what_without_backtrace());
    }
  } else {
    TORCH_CHECK_VALUE(o.beta1 >= 0 && o.beta1 < 1, where("beta1"), " must be in [0, 1), got ", o.beta1);
    TORCH_CHECK_VALUE(o.beta2 >= 0 && o.beta2 < 1, where("beta2"), " must be in [0, 1), got ", o.beta2);
    if (a == Algorithm::AdamW)  // m/(sqrt(v)+eps): a zero gradient would give 0/0
      TORCH_CHECK_VALUE(std::isfinite(o.eps) && o.eps >= kMinEps, where("eps"), " must be finite and >= ", kMinEps,
                        " (a zero gradient would give 0/0), got ", o.eps);
  }
}

void validate_param(const at::Tensor& p, const GroupOptions& o, const std::string& label) {
  TORCH_CHECK_VALUE(p.defined(), label, ": undefined tensor (argument 'params')");
  TORCH_CHECK_TYPE(is_float(p.scalar_type()), label, ": expected a floating-point tensor, got ", p.scalar_type());
  TORCH_CHECK_TYPE(!p.is_sparse(), label, ": sparse parameters are not supported");
  if (!is_matrix_algorithm(o.algorithm)) return;
  TORCH_CHECK_VALUE(p.dim() >= 2, label, ": a ", p.dim(), "-D tensor (shape ", p.sizes(), ") cannot be in a '",
                    to_string(o.algorithm),
                    "' group (option 'algorithm' needs a matrix or a stack of matrices); route it to adamw or lion");
  if (o.algorithm == Algorithm::Dion3 || o.algorithm == Algorithm::Dion2 || o.algorithm == Algorithm::Dion) return;
  OrthoOptions ortho = o.ortho;
  ortho.nonfinite = NonFinitePolicy::Propagate;  // no data access at construction
  ortho.flatten = false;
  const auto msz = matrix_sizes(p, o);
  try {
    validate_ortho_args(at::empty(msz, at::TensorOptions().dtype(p.scalar_type()).device(at::kMeta)), ortho);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, label, ": option 'ortho': ", e.what_without_backtrace());
  }
}

// True when b differs from a only in scalar hyperparameters (lr, decay, betas, ...), so the
// per-parameter checks (shapes, split sizes, state shapes) cannot change their outcome. An LR
// scheduler changes lr every step; this keeps set_group_options cheap for it.
bool same_structure(const GroupOptions& a, const GroupOptions& b) {
  const auto& x = a.ortho;
  const auto& y = b.ortho;
  return a.algorithm == b.algorithm && a.rank_fraction == b.rank_fraction && a.master_weights == b.master_weights &&
         x.schedule == y.schedule && x.custom_triples == y.custom_triples && x.steps == y.steps &&
         x.method == y.method && x.compute_dtype == y.compute_dtype && x.gram_restarts == y.gram_restarts &&
         x.gram_aspect_threshold == y.gram_aspect_threshold && x.safety == y.safety && x.eps == y.eps &&
         x.split_sizes == y.split_sizes && x.flatten == y.flatten;
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
// (docs/optimizers.md). ORTHOPT_GPU_KERNELS=0 selects the per-matrix path everywhere (and the
// ATen path instead of the CUDA kernels), ORTHOPT_CPU_BANKS=1 the banks on the CPU too (tests,
// benchmarks). Read at each step, so a test can compare the paths in one process.
bool use_banks(c10::Device device) {
  if (!gpu_kernels_enabled()) return false;
  const char* cpu_banks = std::getenv("ORTHOPT_CPU_BANKS");
  return !device.is_cpu() || (cpu_banks && std::strcmp(cpu_banks, "1") == 0);
}

// Same-shaped matrices of a group's active params, processed as one [B, rows, cols] stack: a
// 2-D param is one matrix, a [..., rows, cols] param prod(leading) of them, a flattened one
// one. Params of another work dtype (fp64 next to fp32) form their own bank.
struct Bank {
  int64_t rows = 0, cols = 0;
  at::ScalarType dtype = at::kFloat;  // work dtype of its params
  std::vector<size_t> params;         // indices in the group
  std::vector<size_t> positions;      // indices in the step's list of active params
  std::vector<int64_t> offsets = {0};  // param j holds matrices [offsets[j], offsets[j + 1])

  int64_t size() const { return offsets.back(); }
  // Param j's part of a [B, ...] bank tensor (a view).
  at::Tensor slice(const at::Tensor& bank, size_t j) const {
    return bank.narrow(0, offsets[j], offsets[j + 1] - offsets[j]);
  }
};

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

}  // namespace

// ---------------------------------------------------------------- implementation

class OptimizerImpl {
 public:
  std::vector<ParamGroup> groups;
  std::vector<std::vector<StateDict>> state;  // [group][param]
  std::vector<std::vector<std::vector<QSource>>> q_sources;  // [group][param]; empty: own seed
  // The last source Q drawn during a step: the Python layer has one piece per matrix of a stack,
  // which would otherwise each draw the whole stack's Q again.
  struct {
    size_t g = 0, i = 0;
    std::vector<int64_t> sizes;
    at::Tensor q;
  } q_cache;
  at::Tensor lr_scale, skip_factor, steps;    // 0-d on the device; steps counts taken steps
  bool skip_active = false;                   // set_skip_factor was called at least once
  int64_t state_version = 0;                  // see Optimizer::state_version()
  int64_t dion_qr_fallbacks = 0;              // see Optimizer::dion_qr_fallbacks()
  at::Tensor keep;                            // skip_factor != 0, valid during step()
  // A bank of Dion with dion_qr = cholesky, stepped only where every factorization in it
  // succeeded (`ok`, 0-d bool on the device; else its params and state are left as they were).
  // finish_step() reads `ok` and steps a failed bank's params again through
  // step_dion_reference(). Made by enqueue_step(); in a CUDA graph, the tensors the replays
  // write.
  struct PendingDionBank {
    size_t g;
    std::vector<size_t> params;
    at::Tensor ok;
  };
  std::vector<PendingDionBank> pending_dion;

  explicit OptimizerImpl(std::vector<ParamGroup> g) : groups(std::move(g)) {
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

  // The skip flag of this step, undefined when there is no skip gating.
  at::Tensor keep_flag() const { return skip_active ? keep : at::Tensor(); }

  // `value`, or `old` where this step is skipped: what commit() writes.
  at::Tensor gated(const at::Tensor& value, const at::Tensor& old) const { return gated(value, old, keep_flag()); }
  // `value`, or `old` where `gate` (0-d bool; undefined: no gating) is false.
  static at::Tensor gated(const at::Tensor& value, const at::Tensor& old, const at::Tensor& gate) {
    return gate.defined() ? at::where(gate, value, old) : value;
  }

  // dst ← gated(value, dst, gate) in one pass where the dtypes agree (where() writing into dst,
  // which is also its `old` operand: no temporary and no copy of a bank-sized tensor).
  static void assign_gated_(const at::Tensor& dst, const at::Tensor& value, const at::Tensor& gate) {
    if (gate.defined() && value.scalar_type() == dst.scalar_type() && value.sizes() == dst.sizes()) {
      at::Tensor out = dst;
      at::where_out(out, gate, value, dst);
    } else {
      dst.copy_(gated(value, dst, gate));
    }
  }

  // Writes `value` into `dst` unless this step is skipped (then dst stays bit-identical).
  void commit(at::Tensor& dst, const at::Tensor& value) { assign_gated_(dst, value, keep_flag()); }

  // commit() for a bank: `value` [B, ...] into each param's tensor in `dsts`, gated once for
  // the whole bank (`old`: the dsts stacked; where() promotes like commit()'s, so each dst gets
  // the same bits), then one copy per param.
  void commit_bank(const Bank& b, const std::vector<at::Tensor>& dsts, const at::Tensor& value,
                   const at::Tensor& old) {
    commit_bank(b, dsts, value, old, keep_flag());
  }
  void commit_bank(const Bank& b, const std::vector<at::Tensor>& dsts, const at::Tensor& value,
                   const at::Tensor& old, const at::Tensor& gate) {
    const at::Tensor v = gated(value, old, gate);
    for (size_t j = 0; j < dsts.size(); ++j) dsts[j].copy_(b.slice(v, j).reshape(dsts[j].sizes()));
  }

  StateDict& state_of(size_t g, size_t i) {
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
  at::Tensor initial_q(size_t g, size_t i, const std::vector<int64_t>& sizes) {
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
  std::vector<size_t> active(size_t g) {
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
  at::Tensor weight_storage(size_t g, size_t i) {
    const auto& p = groups[g].params[i];
    if (uses_master(p, groups[g].options)) return state_of(g, i).at("master");
    return p.detach();
  }

  at::Tensor weights(size_t g, size_t i) { return weight_storage(g, i).to(work_dtype(groups[g].params[i])); }

  void write_weights(size_t g, size_t i, const at::Tensor& W_new) {
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
  void write_weights_bank(size_t g, const Bank& b, const at::Tensor& W_new, const at::Tensor& W_old) {
    write_weights_bank(g, b, W_new, W_old, keep_flag());
  }
  void write_weights_bank(size_t g, const Bank& b, const at::Tensor& W_new, const at::Tensor& W_old,
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

  at::Tensor grad_of(size_t g, size_t i) {
    const auto& p = groups[g].params[i];
    return p.grad().detach().to(work_dtype(p));
  }

  // The banks of the active params `idx` of group g (in order of first appearance).
  std::vector<Bank> banks(size_t g, const std::vector<size_t>& idx) const {
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
  bool banks_used(size_t g, const std::vector<size_t>& idx) const {
    return !idx.empty() && use_banks(groups[g].params[idx[0]].device());
  }

  // The state tensors `name` of a bank's params.
  std::vector<at::Tensor> bank_state(size_t g, const Bank& b, const char* name) {
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
  at::Tensor owned_bank(size_t g, const Bank& b, const char* name, int64_t cols, at::ScalarType dtype) {
    return owned_bank(g, b, name, b.rows, cols, dtype);
  }
  at::Tensor owned_bank(size_t g, const Bank& b, const char* name, int64_t rows, int64_t cols,
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
  static OrthoOptions batch_ortho_options(const OrthoOptions& opt) {
    OrthoOptions o = opt;
    o.flatten = false;  // flattening already happened (matrix_sizes)
    o.nonfinite = NonFinitePolicy::Propagate;
    return o;
  }

  // Orthogonalizes matrices (each [..., m, n]); same-shaped ones in one batched call.
  static std::vector<at::Tensor> orthogonalize_all(const std::vector<at::Tensor>& mats, const OrthoOptions& opt) {
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
  static std::pair<at::Tensor, double> adjust_rows(const at::Tensor& U, const GroupOptions& o) {
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

  // NorMuon (§4) on a bank's orthogonalized matrices U [B, rows, cols], for the bank with its
  // params' variances stacked: commits them and returns Û = U · factors [B, rows, cols].
  at::Tensor normuon_bank(size_t g, const Bank& b, const at::Tensor& U) { return U * normuon_bank_factors(g, b, U); }

  // normuon_bank() without the product: commits the variances and returns Û's row factors
  // [B, rows, 1] (fp32; fp64 for fp64 U), Û = U · factors.
  at::Tensor normuon_bank_factors(size_t g, const Bank& b, const at::Tensor& U) {
    const auto& o = groups[g].options;
    const at::Tensor V = owned_bank(g, b, "variance", 1, at::kFloat);  // in place (the variance is fp32)
    auto [factors, V_new] = optim_detail::normuon_row_factors(U, V, o.normuon_beta2, o.normuon_eps);
    assign_gated_(V, V_new, keep_flag());
    return factors;
  }

  // Orthogonalization and NorMuon normalization of `mats` (one per active param, matrix view),
  // one orthogonalize() and one normuon_bank() per bank. Returns Û per param (matrix view).
  std::vector<at::Tensor> orthogonalize_normuon_banks(size_t g, const std::vector<size_t>& idx,
                                                      const std::vector<at::Tensor>& mats) {
    const auto& o = groups[g].options;
    std::vector<at::Tensor> out(idx.size());
    for (const Bank& b : banks(g, idx)) {
      std::vector<at::Tensor> in;
      for (size_t j : b.positions) in.push_back(mats[j]);
      const at::Tensor U = orthogonalize(stack_bank(in, b.rows, b.cols, b.dtype), batch_ortho_options(o.ortho));
      const at::Tensor U_hat = normuon_bank(g, b, U);
      for (size_t j = 0; j < b.positions.size(); ++j)
        out[b.positions[j]] = b.slice(U_hat, j).reshape(mats[b.positions[j]].sizes());
    }
    return out;
  }

  // ---- Muon / NorMuon (§3, §4)
  void step_muon(size_t g, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    const auto idx = active(g);
#ifdef ORTHOPT_WITH_CUDA
    if (fused(g, idx)) return step_muon_fused(g, idx, lr);
#endif
    std::vector<at::Tensor> inputs;
    for (size_t i : idx) {
      auto& st = state_of(g, i);
      const auto& p = groups[g].params[i];
      auto [M_new, U_in] = optim_detail::muon_momentum(st.at("momentum").to(work_dtype(p)), grad_of(g, i),
                                                       o.momentum, o.momentum_style, o.nesterov);
      commit(st.at("momentum"), M_new);
      inputs.push_back(U_in.reshape(matrix_sizes(p, o)));
    }
    // NorMuon per bank; the per-matrix normalization below is its reference path.
    const bool banked = o.algorithm == Algorithm::NorMuon && banks_used(g, idx);
    const auto outs = banked ? orthogonalize_normuon_banks(g, idx, inputs) : orthogonalize_all(inputs, o.ortho);
    for (size_t j = 0; j < idx.size(); ++j) {
      const size_t i = idx[j];
      const auto& p = groups[g].params[i];
      at::Tensor U = outs[j];
      if (o.algorithm == Algorithm::NorMuon && !banked) {
        auto& V = state_of(g, i).at("variance");
        auto [U_hat, V_new] = optim_detail::normuon_normalize(U, V, o.normuon_beta2, o.normuon_eps);
        commit(V, V_new);
        U = U_hat;
      }
      auto [D, factor] = adjust_rows(U, o);
      auto W_new = optim_detail::decoupled_update(weights(g, i), D.reshape(p.sizes()), lr, lr * factor,
                                                  o.weight_decay, o.cautious_weight_decay);
      write_weights(g, i, W_new);
    }
  }

  // ---- Dion3 (§5)
  // The lr factor of a Dion3 update: the FULL matrix shape's adjustment, and lr / sqrt(f).
  static double dion3_lr_factor(const GroupOptions& o, int64_t rows, int64_t cols) {
    double factor = lr_adjust_factor(o.lr_adjust, rows, cols);
    if (o.scale_lr_by_fraction) factor /= std::sqrt(o.fraction);
    return factor;
  }

  // Per bank: the same operations as step_dion3_reference() on [B, rows, cols] stacks, so each
  // matrix gets the same values (batched reductions, topk, gather and scatter work per slice).
  void step_dion3(size_t g, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    const auto idx = active(g);
    if (!banks_used(g, idx)) return step_dion3_reference(g, idx, lr);
#ifdef ORTHOPT_WITH_CUDA
    // The momenta and the weights through the multi-tensor kernels (one launch per bank each:
    // momentum; decay, step, master copy and skip gate) where they take every tensor.
    const bool kernels = fused(g, idx);
#endif
    const std::vector<Bank> bks = banks(g, idx);
    // Per bank: the selected rows [B, k], as indices into [B·rows] (flat_rows), and the selection
    // [B, k, cols]; with the take kernel also the update's row map.
    std::vector<at::Tensor> rows(bks.size()), flat(bks.size()), selected(bks.size()), row_maps(bks.size());
    for (size_t bi = 0; bi < bks.size(); ++bi) {
      const Bank& b = bks[bi];
      // 1-3: accumulate, select the k rows of largest L1 norm, error feedback on them.
      std::vector<at::Tensor> grads;
      for (size_t i : b.params) grads.push_back(groups[g].params[i].grad().detach());
      if (const at::Tensor M = owned_bank(g, b, "momentum", b.cols, b.dtype); M.defined()) {
        // In place on the bank's momenta: the same values as the stacking path below. A skipped
        // step adds -0.0 (x + -0.0 is x, bit for bit, also for -0.0) and scatters the rows back
        // unchanged.
#ifdef ORTHOPT_WITH_CUDA
        if (kernels) {
          // One launch for the bank: 1·M + 1·G is M + G exactly, skip gate in the kernel, and
          // the rows' L1 scores in the same pass (no second read of M for the selection).
          const at::Tensor scores = at::empty({b.size(), b.rows}, M.options().dtype(at::kFloat));
          std::vector<at::Tensor> momenta, row_scores;
          for (size_t j = 0; j < b.params.size(); ++j) {
            momenta.push_back(b.slice(M, j).view(grads[j].sizes()));
            row_scores.push_back(b.slice(scores, j));
          }
          cuda::momentum_rows(momenta, grads, {}, row_scores, b.cols, 1.0, 1.0, /*nesterov=*/false,
                              cuda::RowStat::L1OfMomentum, keep_flag());
          rows[bi] = optim_detail::dion3_top_rows(scores, o.fraction);
          // The gather, the error feedback and the row indices below (and the update's row
          // map) in one launch: the same values (a copy, one fp32 product).
          auto took = cuda::dion3_take_rows(M, rows[bi], o.momentum, keep_flag());
          selected[bi] = took.selected;
          flat[bi] = took.flat;
          row_maps[bi] = took.row_map;
          continue;
        }
#endif
        for (size_t j = 0; j < b.params.size(); ++j) {
          const at::Tensor G = grads[j].reshape({-1, b.rows, b.cols});
          b.slice(M, j).add_(skip_active ? at::where(keep, G, at::full({}, -0.0, G.options())) : G);
        }
        rows[bi] = optim_detail::dion3_rows(M, o.fraction);
        flat[bi] = optim_detail::flat_rows(rows[bi], b.rows);
        selected[bi] = optim_detail::take_rows(M, flat[bi]).view({b.size(), rows[bi].size(-1), b.cols});
        optim_detail::put_rows_(M, flat[bi], gated(selected[bi] * o.momentum, selected[bi]));
      } else {  // (a scope, so the bank-sized momentum temporaries are freed before the next bank's)
        const auto momenta = bank_state(g, b, "momentum");
        const at::Tensor M_old = stack_bank(momenta, b.rows, b.cols, b.dtype);
        auto sel = optim_detail::dion3_select(M_old + stack_bank(grads, b.rows, b.cols, b.dtype), o.fraction,
                                              o.momentum);
        commit_bank(b, momenta, sel.momentum, M_old);
        rows[bi] = sel.rows;
        selected[bi] = sel.selected;
        flat[bi] = optim_detail::flat_rows(rows[bi], b.rows);
      }
    }
    // 4: every bank's selection in one call (Dion3 has no split_sizes): each is an independent
    // chain of products, so on a GPU the small chains run side by side, and the Gram NS of
    // selections with the same m iterates as one batch (orthogonalize_many_in_compute_dtype).
    // All banks' selections are alive at once (Llama 1.26B, fp32: about 1.1 GB).
    const std::vector<at::Tensor> ns =
        detail::orthogonalize_many_in_compute_dtype(selected, batch_ortho_options(o.ortho));
    for (size_t bi = 0; bi < bks.size(); ++bi) {
      const Bank& b = bks[bi];
      // 5: NorMuon on the selected rows (their variances updated in place in V); 6-7: decay
      // everywhere, the step on the selected rows.
      const at::Tensor V = owned_bank(g, b, "variance", 1, at::kFloat);  // the variance is fp32
      const double factor = dion3_lr_factor(o, b.rows, b.cols);
#ifdef ORTHOPT_WITH_CUDA
      if (kernels) {
        // NorMuon by its kernels, the selected rows' variances read and written through flat
        // (no gather and scatter of V), on the NS result in its compute dtype: the reference's
        // cast to the fp32 selection widens bf16/fp16 exactly, and U · factors promotes to the
        // same fp32 products, so Û is the reference's up to the order of the sums.
        at::Tensor U = ns[bi];
        if (U.scalar_type() == at::kDouble) U = detail::cast_result(U, selected[bi].scalar_type());
        U = cuda::contiguous(U);
        const at::Tensor U_hat =
            U * cuda::normuon_factors(U, V, flat[bi], o.normuon_beta2, o.normuon_eps, keep_flag());
        // The update with a direction that is zero outside the selection, without that
        // full-size direction: the kernel reads Û's row where the row map points to one, D = 0
        // elsewhere; the same arithmetic as the zero-padded update, one pass over the weights.
        const at::Tensor D = U_hat.contiguous().view({-1, b.cols});                 // [B·k, cols]
        const at::Tensor map =
            row_maps[bi].defined()
                ? row_maps[bi]
                : at::full({b.size() * b.rows}, -1, rows[bi].options().dtype(at::kInt))
                      .index_copy_(0, flat[bi], at::arange(flat[bi].numel(), rows[bi].options().dtype(at::kInt)));
        std::vector<at::Tensor> weights, copies, directions, maps;
        for (size_t j = 0; j < b.params.size(); ++j) {
          add_weights(g, b.params[j], weights, copies);
          directions.push_back(D);  // the bank's; the map holds bank-wide row numbers
          maps.push_back(map.narrow(0, b.offsets[j] * b.rows, (b.offsets[j + 1] - b.offsets[j]) * b.rows));
        }
        cuda::update_selected(weights, directions, maps, b.cols, copies, std::vector<double>(weights.size(), factor), lr,
                              o.weight_decay, o.cautious_weight_decay, keep_flag());
        continue;
      }
#endif
      // NorMuon of the NS result in the selection's dtype (what orthogonalize() returns).
      const at::Tensor U = detail::cast_result(ns[bi], selected[bi].scalar_type());
      const at::Tensor V_sel_old = optim_detail::take_rows(V, flat[bi]).view({b.size(), rows[bi].size(-1), 1});
      auto [U_hat, V_sel_new] = optim_detail::normuon_normalize(U, V_sel_old, o.normuon_beta2, o.normuon_eps);
      optim_detail::put_rows_(V, flat[bi], gated(V_sel_new.to(at::kFloat), V_sel_old));
      std::vector<at::Tensor> storage;
      for (size_t i : b.params) storage.push_back(weight_storage(g, i));
      const at::Tensor W_old = stack_bank(storage, b.rows, b.cols, b.dtype);
      write_weights_bank(g, b,
                         optim_detail::decoupled_update_rows(W_old, rows[bi], U_hat.to(b.dtype), lr, lr * factor,
                                                             o.weight_decay, o.cautious_weight_decay),
                         W_old);
    }
  }

  // The per-matrix reference path of step_dion3().
  void step_dion3_reference(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    std::vector<at::Tensor> inputs, rows;
    for (size_t i : idx) {
      auto& st = state_of(g, i);
      const auto& p = groups[g].params[i];
      const auto msz = matrix_sizes(p, o);
      at::Tensor M = (st.at("momentum").to(work_dtype(p)) + grad_of(g, i)).reshape(msz);
      auto sel = optim_detail::dion3_select(M, o.fraction, o.momentum);
      commit(st.at("momentum"), sel.momentum.reshape(p.sizes()));
      inputs.push_back(sel.selected);
      rows.push_back(sel.rows);
    }
    const auto outs = orthogonalize_all(inputs, o.ortho);
    for (size_t j = 0; j < idx.size(); ++j) {
      const size_t i = idx[j];
      const auto& p = groups[g].params[i];
      const auto msz = matrix_sizes(p, o);
      auto& V = state_of(g, i).at("variance");
      auto [U_hat, V_sel_new] = optim_detail::normuon_normalize(
          outs[j], optim_detail::gather_rows(V, rows[j]), o.normuon_beta2, o.normuon_eps);
      commit(V, optim_detail::scatter_rows(V, rows[j], V_sel_new));
      at::Tensor W = weights(g, i);
      at::Tensor D = optim_detail::scatter_rows(at::zeros(msz, W.options()), rows[j], U_hat.to(W.scalar_type()));
      const double factor = dion3_lr_factor(o, msz[msz.size() - 2], msz.back());
      write_weights(g, i,
                    optim_detail::decoupled_update(W, D.reshape(p.sizes()), lr, lr * factor, o.weight_decay,
                                                   o.cautious_weight_decay));
    }
  }

  // ---- Dion2 (dion's Dion2): Dion3's steps 1-4 and 6 without the normalization (5), selecting
  // along the shorter side: rows when rows <= cols, else columns (the rows of the transpose).
  // Per matrix on every device (no bank or kernel path); same-shaped selections share one
  // orthogonalize() call.
  void step_dion2(size_t g, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    const auto idx = active(g);
    std::vector<at::Tensor> inputs, rows;
    std::vector<bool> by_cols;
    for (size_t i : idx) {
      auto& st = state_of(g, i);
      const auto& p = groups[g].params[i];
      const auto msz = matrix_sizes(p, o);
      const bool cols = msz[msz.size() - 2] > msz.back();
      at::Tensor M = (st.at("momentum").to(work_dtype(p)) + grad_of(g, i)).reshape(msz);
      if (cols) M = M.transpose(-2, -1).contiguous();
      auto sel = optim_detail::dion3_select(M, o.fraction, o.momentum);
      at::Tensor M_new = cols ? sel.momentum.transpose(-2, -1) : sel.momentum;
      commit(st.at("momentum"), M_new.reshape(p.sizes()));
      inputs.push_back(sel.selected);
      rows.push_back(sel.rows);
      by_cols.push_back(cols);
    }
    const auto outs = orthogonalize_all(inputs, o.ortho);
    for (size_t j = 0; j < idx.size(); ++j) {
      const size_t i = idx[j];
      const auto& p = groups[g].params[i];
      const auto msz = matrix_sizes(p, o);
      at::Tensor W = weights(g, i);
      auto zeros_sizes = msz;
      if (by_cols[j]) std::swap(zeros_sizes[msz.size() - 2], zeros_sizes[msz.size() - 1]);
      at::Tensor D =
          optim_detail::scatter_rows(at::zeros(zeros_sizes, W.options()), rows[j], outs[j].to(W.scalar_type()));
      if (by_cols[j]) D = D.transpose(-2, -1);
      const double factor = dion3_lr_factor(o, msz[msz.size() - 2], msz.back());
      write_weights(g, i,
                    optim_detail::decoupled_update(W, D.reshape(p.sizes()), lr, lr * factor, o.weight_decay,
                                                   o.cautious_weight_decay));
    }
  }

  // ---- Dion (§6)
  void step_dion(size_t g, const at::Tensor& lr) {
    const auto idx = active(g);
    if (banks_used(g, idx)) return step_dion_banks(g, idx, lr);
    step_dion_reference(g, idx, lr);
  }

  // Per bank: step_dion_reference()'s operations on [B, m, n] stacks (on a GPU the per-parameter
  // step is launch-bound: about ten small operations per parameter), so each matrix gets the
  // same values. Momenta and Q live in one buffer per bank and are updated in place
  // (owned_bank()). No host synchronization, also with `cholesky`: a bank is stepped only if
  // every factorization in it succeeded (a device-side gate, beside the skip flag), and
  // finish_step() steps a bank where one failed again through the reference path, from its
  // untouched state, which then takes the Householder QR for the failed matrices.
  void step_dion_banks(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    const auto& params = groups[g].params;
#ifdef ORTHOPT_WITH_CUDA
    const bool kernels = fused(g, idx);  // the weights through the multi-tensor update kernel
#endif
    for (const Bank& b : banks(g, idx)) {
      // Q is fp32 [..., n, r] for every param (state_specs(); loads are converted to it).
      const int64_t r = state_of(g, b.params[0]).at("Q").size(-1);
      const at::Tensor Q = owned_bank(g, b, "Q", b.cols, r, at::kFloat);
      TORCH_INTERNAL_ASSERT(Q.defined(), "Dion's Q is not fp32");
      // The momenta: a view of the state when it lives in one buffer of the work dtype, else
      // stacked (and written back per param).
      const at::Tensor owned_momenta = owned_bank(g, b, "momentum", b.cols, b.dtype);
      const at::Tensor momenta = owned_momenta.defined()
                                     ? owned_momenta
                                     : stack_bank(bank_state(g, b, "momentum"), b.rows, b.cols, b.dtype);
      std::vector<at::Tensor> grads;
      for (size_t i : b.params) grads.push_back(params[i].grad().detach());
      // Nothing gates this step (no skip flag, no Cholesky): M = momentum + G is formed in the
      // state's buffer and the new momentum written over it there (dion_finish_), two
      // bank-sized copies fewer (H200, Llama set: ≈ 5 ms of device-to-device copies a step).
      const bool in_place = o.dion_qr == DionQr::Householder && !keep_flag().defined() &&
                            owned_momenta.defined() && momenta.scalar_type() == at::kFloat;
      at::Tensor M;  // momentum + G [B, m, n]
      if (in_place) {
        // Each gradient added into its slice of the momenta, one multi-tensor launch: the bank of
        // gradients is never stacked (a bank-sized copy; aten::cat was 2.2 ms of Llama's step on
        // an H200). The same sums as momenta + stack(grads).
        std::vector<at::Tensor> slices;
        for (size_t j = 0; j < b.params.size(); ++j) slices.push_back(b.slice(momenta, j).view(grads[j].sizes()));
        at::_foreach_add_(slices, grads);
        M = momenta;
      } else {
        M = momenta + stack_bank(grads, b.rows, b.cols, b.dtype);
      }
      const at::Tensor raw = optim_detail::dion_power(M, Q);
      at::Tensor P, gate = keep_flag();
      if (o.dion_qr == DionQr::Cholesky) {
        const auto q = optim_detail::cholesky_qr2_q(raw);
        P = q.Q;
        const at::Tensor ok = q.ok.all();
        pending_dion.push_back({g, b.params, ok});
        gate = gate.defined() ? gate.logical_and(ok) : ok;
      } else {
        P = optim_detail::householder_q(raw);
      }
      auto res = in_place ? optim_detail::dion_finish_(M, P, o.momentum, o.eps)
                          : optim_detail::dion_finish(M, P, o.momentum, o.eps);
      if (!in_place) {  // in place, the momenta hold the new momentum already
        if (owned_momenta.defined()) {
          assign_gated_(momenta, res.momentum, gate);
        } else {
          commit_bank(b, bank_state(g, b, "momentum"), res.momentum, momenta, gate);
        }
      }
      assign_gated_(Q, res.Q, gate);
      const double factor = lr_adjust_factor(o.lr_adjust, b.rows, b.cols);
#ifdef ORTHOPT_WITH_CUDA
      if (kernels) {  // res.direction is fp32, the reference's direction in the work dtype
        std::vector<at::Tensor> weights, copies, directions;
        for (size_t j = 0; j < b.params.size(); ++j) {
          add_weights(g, b.params[j], weights, copies);
          directions.push_back(b.slice(res.direction, j).reshape(params[b.params[j]].sizes()));
        }
        cuda::update(weights, directions, copies, std::vector<double>(weights.size(), factor), lr, o.weight_decay,
                     o.cautious_weight_decay, gate);
        continue;
      }
#endif
      std::vector<at::Tensor> storage;
      for (size_t i : b.params) storage.push_back(weight_storage(g, i));
      const at::Tensor W_old = stack_bank(storage, b.rows, b.cols, b.dtype);
      write_weights_bank(g, b,
                         optim_detail::decoupled_update(W_old, res.direction.to(b.dtype), lr, lr * factor,
                                                        o.weight_decay, o.cautious_weight_decay),
                         W_old, gate);
    }
  }

  // The host part of a step (Optimizer::finish_step()): the Dion banks whose Cholesky QR2
  // failed somewhere (step_dion_banks() left them as they were) take their step now, through
  // the reference path. One synchronization, only when there are such banks to check.
  void finish_step() {
    if (pending_dion.empty()) return;
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> flags;
    for (const auto& pb : pending_dion) flags.push_back(pb.ok);
    if (skip_active) flags.push_back(keep);
    const at::Tensor host = at::stack(flags).to(at::kCPU);  // the one sync
    if (skip_active && !host[static_cast<int64_t>(pending_dion.size())].item<bool>()) return;  // skipped step
    const at::Tensor scale = lr_scale.to(at::kDouble);
    for (size_t k = 0; k < pending_dion.size(); ++k) {
      if (host[static_cast<int64_t>(k)].item<bool>()) continue;
      const auto& pb = pending_dion[k];
      step_dion_reference(pb.g, pb.params, scale * groups[pb.g].options.lr);
      pb.ok.fill_(true);  // done: a second call steps nothing (a graph's next replay sets it again)
    }
  }

  // The per-parameter reference path of step_dion().
  void step_dion_reference(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    // M = momentum + G, formed again where it is used rather than held for every parameter
    // between the two passes of the Cholesky path (one weight-sized tensor each).
    auto momentum_of = [&](size_t i) {
      const auto& p = groups[g].params[i];
      return (state_of(g, i).at("momentum").to(work_dtype(p)) + grad_of(g, i)).reshape(matrix_sizes(p, o));
    };
    // The orthonormalized P of every active parameter. Cholesky: all of them first, then one
    // host synchronization reads which parameters had a failed factorization, and those take
    // the Householder QR. (Per parameter: stacking same-shaped ones is the bank path's job.)
    std::vector<at::Tensor> P(idx.size());
    if (o.dion_qr == DionQr::Cholesky && !idx.empty()) {
      std::vector<at::Tensor> raw(idx.size()), ok(idx.size());
      for (size_t j = 0; j < idx.size(); ++j) {
        raw[j] = optim_detail::dion_power(momentum_of(idx[j]), state_of(g, idx[j]).at("Q"));
        const auto q = optim_detail::cholesky_qr2_q(raw[j]);
        P[j] = q.Q;
        ok[j] = q.ok.all();
      }
      const at::Tensor ok_host = at::stack(ok).to(at::kCPU);  // the one sync
      for (size_t j = 0; j < idx.size(); ++j)
        if (!ok_host[j].item<bool>()) {
          P[j] = optim_detail::householder_q(raw[j]);
          ++dion_qr_fallbacks;
        }
    }
    for (size_t j = 0; j < idx.size(); ++j) {
      const size_t i = idx[j];
      auto& st = state_of(g, i);
      const auto& p = groups[g].params[i];
      const auto msz = matrix_sizes(p, o);
      const at::Tensor M = momentum_of(i);
      auto r = P[j].defined() ? optim_detail::dion_finish(M, P[j], o.momentum, o.eps)
                              : optim_detail::dion_step(M, st.at("Q"), o.momentum, o.eps);
      commit(st.at("momentum"), r.momentum.reshape(p.sizes()));
      commit(st.at("Q"), r.Q);
      at::Tensor W = weights(g, i);
      const double factor = lr_adjust_factor(o.lr_adjust, msz[msz.size() - 2], msz.back());
      write_weights(g, i,
                    optim_detail::decoupled_update(W, r.direction.to(W.scalar_type()).reshape(p.sizes()), lr,
                                                   lr * factor, o.weight_decay, o.cautious_weight_decay));
    }
  }

  // ---- AdamW (§7)
  void step_adamw(size_t g, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    const auto idx = active(g);
#ifdef ORTHOPT_WITH_CUDA
    if (fused(g, idx)) return step_adamw_fused(g, idx, lr);
#endif
    for (size_t i : idx) {
      auto& st = state_of(g, i);
      const auto& p = groups[g].params[i];
      at::Tensor step_new = st.at("step") + 1;
      auto r = optim_detail::adamw_direction(st.at("exp_avg").to(work_dtype(p)), st.at("exp_avg_sq").to(work_dtype(p)),
                                             grad_of(g, i), step_new, o.beta1, o.beta2, o.eps);
      commit(st.at("exp_avg"), r.exp_avg);
      commit(st.at("exp_avg_sq"), r.exp_avg_sq);
      commit(st.at("step"), step_new);
      write_weights(g, i,
                    optim_detail::decoupled_update(weights(g, i), r.direction, lr, lr, o.weight_decay,
                                                   o.cautious_weight_decay));
    }
  }

  // ---- Lion
  void step_lion(size_t g, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    const auto idx = active(g);
#ifdef ORTHOPT_WITH_CUDA
    if (fused(g, idx)) return step_lion_fused(g, idx, lr);
#endif
    for (size_t i : idx) {
      auto& st = state_of(g, i);
      const auto& p = groups[g].params[i];
      auto [m_new, D] = optim_detail::lion_direction(st.at("exp_avg").to(work_dtype(p)), grad_of(g, i), o.beta1, o.beta2);
      commit(st.at("exp_avg"), m_new);
      write_weights(g, i,
                    optim_detail::decoupled_update(weights(g, i), D, lr, lr, o.weight_decay, o.cautious_weight_decay));
    }
  }

#ifdef ORTHOPT_WITH_CUDA
  // ---- fused multi-tensor path (CUDA). Each function below does what its reference
  // counterpart above does, with the same fp32 operations in the same order (the kernels
  // avoid fused multiply-adds), state in the same dtypes and the same skip gating (the kernels
  // write nothing when `keep` is false), so both paths agree to fp32 rounding; the GPU test
  // tests/gpu/test_gpu_fused.cpp compares them.

  // Taken when the group has parameters with gradients and every one of them, its gradient and
  // its state are tensors the kernels take (CUDA; fp32, bf16 or fp16; contiguous; non-empty),
  // and ORTHOPT_GPU_KERNELS is not 0. Creates missing state like the reference path does.
  bool fused(size_t g, const std::vector<size_t>& idx) {
    if (idx.empty()) return false;
    for (size_t i : idx) {
      const auto& p = groups[g].params[i];
      if (!cuda::multi_tensor_handles(p) || !cuda::multi_tensor_handles(p.grad())) return false;
      for (const auto& [name, t] : state_of(g, i))
        if (!cuda::multi_tensor_handles(t)) return false;
    }
    return true;
  }

  // What the update kernels write, as weights()/write_weights(): the fp32 master and the
  // parameter as its copy, or the parameter itself (no copy).
  void add_weights(size_t g, size_t i, std::vector<at::Tensor>& weights, std::vector<at::Tensor>& copies) {
    const auto& p = groups[g].params[i];
    if (uses_master(p, groups[g].options)) {
      weights.push_back(state_of(g, i).at("master"));
      copies.push_back(p.detach());
    } else {
      weights.push_back(p.detach());
      copies.emplace_back();
    }
  }

  void step_muon_fused(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    const auto& params = groups[g].params;
    // Per bank, the momentum kernel writes the orthogonalization inputs straight into one fp32
    // [B, rows, cols] buffer (the stack the reference builds) and sums each row's squares of
    // them: the NS input norms then come from [B, rows] partial sums instead of another read of
    // the stack.
    // Where the NS input is the bank as stored (wide and square banks, tall ones in Gram NS's own
    // layout) and the bank fits the blocks' shared memory, one kernel does the momentum and
    // writes that input in its 16-bit dtype instead (cuda::momentum_ns_input: the same bits
    // without the fp32 stack written and read back; ORTHOPT_FUSED_NS_INPUT=0 turns it off).
    const auto bks = banks(g, idx);
    const double grad_weight = optim_detail::momentum_grad_weight(o.momentum, o.momentum_style);
    const OrthoOptions ortho = batch_ortho_options(o.ortho);
    const Schedule schedule = resolve_schedule(ortho);
    std::vector<at::Tensor> stacks, norms;
    std::vector<bool> prepared;
    for (const Bank& b : bks) {
      std::vector<at::Tensor> momenta, grads;
      for (size_t j = 0; j < b.params.size(); ++j) {
        momenta.push_back(state_of(g, b.params[j]).at("momentum"));
        grads.push_back(params[b.params[j]].grad());
      }
      // One launch per bank: its momenta in one dtype, its gradients in one (mixed banks, e.g.
      // bf16 and fp32 params of one shape, keep the two passes).
      const auto one_dtype = [](const std::vector<at::Tensor>& ts) {
        return std::all_of(ts.begin(), ts.end(),
                           [&](const at::Tensor& t) { return t.scalar_type() == ts[0].scalar_type(); });
      };
      const std::optional<at::ScalarType> ns_dtype = detail::prepared_input_dtype(b.rows, b.cols, ortho, momenta[0]);
      if (ns_dtype && one_dtype(momenta) && one_dtype(grads) &&
          cuda::momentum_ns_input_handles(momenta[0].device(), b.rows, b.cols)) {
        const at::Tensor input = at::empty({b.size(), b.rows, b.cols}, momenta[0].options().dtype(*ns_dtype));
        std::vector<at::Tensor> matrix_momenta, matrix_grads;  // one per matrix: a param may hold several
        for (size_t j = 0; j < momenta.size(); ++j) {
          const at::Tensor m3 = momenta[j].view({-1, b.rows, b.cols}), g3 = grads[j].reshape({-1, b.rows, b.cols});
          for (int64_t e = 0; e < m3.size(0); ++e) {
            matrix_momenta.push_back(m3[e]);
            matrix_grads.push_back(g3[e]);
          }
        }
        cuda::momentum_ns_input(matrix_momenta, matrix_grads, input, o.momentum, grad_weight, o.nesterov,
                                schedule.safety, schedule.eps, keep_flag());
        stacks.push_back(input);
        norms.emplace_back();
        prepared.push_back(true);
        continue;
      }
      const at::Tensor stack =
          at::empty({b.size(), b.rows, b.cols}, params[b.params[0]].options().dtype(at::kFloat));
      const at::Tensor row_sq = at::empty({b.size(), b.rows}, stack.options());
      std::vector<at::Tensor> inputs, stats;
      for (size_t j = 0; j < b.params.size(); ++j) {
        inputs.push_back(b.slice(stack, j));
        stats.push_back(b.slice(row_sq, j));
      }
      cuda::momentum_rows(momenta, grads, inputs, stats, b.cols, o.momentum, grad_weight, o.nesterov,
                          cuda::RowStat::SumSqOfOutput, keep_flag());
      stacks.push_back(stack);
      // [B]: the order momentum_ns_input sums in, so both forms give the same bits.
      if (o.ortho.split_sizes.empty()) norms.push_back(cuda::norms_from_row_sumsq(row_sq));
      prepared.push_back(false);
    }

    std::vector<at::Tensor> outs(idx.size());
    // Muon without split_sizes: the NS result in its compute dtype is the direction (the update
    // kernel widens bf16/fp16 exactly, as the reference's cast to fp32 does, so the update is
    // the same). With split_sizes NorMuon normalizes the compute-dtype result into fp32 and Muon
    // takes the fp32 result, whose math continues in fp32.
    const bool direct = o.algorithm == Algorithm::Muon && o.ortho.split_sizes.empty();
    // NorMuon without split_sizes: U also stays in its compute dtype (made contiguous like
    // Muon's) and its row factors go to the update kernel, which forms D = U · factor[row] in
    // fp32 as the reference's Û = U · factor does, without an fp32 Û written and read back
    // (and, for tall banks, transposed). On an H200 NorMuon cost 8.4 ms per step more than Muon
    // on Llama 1.26B with Û materialized.
    const bool row_scaled = o.algorithm == Algorithm::NorMuon && o.ortho.split_sizes.empty();
    std::vector<at::Tensor> bank_factors(bks.size());  // row_scaled: Û's row factors per bank
    // Without split_sizes every bank in one call: the Gram NS of banks with the same m (after
    // orientation) iterates as one batch (detail::orthogonalize_many_in_compute_dtype).
    // Muon's update folded into the last NS product (detail::FoldedUpdate: the epilogue writes
    // the weights, no direction written and read back by the update kernel) for banks whose
    // params are their own fp32 weights (no master copy), with plain decoupled decay. A skipped
    // step must leave the weights as they were through α = 0, β = 1, so the product must be
    // finite: both momentum kernels write zeros as the NS input then, which the prepared input
    // keeps and the two-pass form's scaled cast keeps where eps > 0 (0 / (0 + eps); with eps = 0
    // it would be NaN, so those banks are not folded). Banks the products do not take come back
    // with a result and are updated below. ORTHOPT_FOLD_UPDATE=0 turns it off (A/B timings).
    std::vector<detail::FoldedUpdate> folds(bks.size());
    std::vector<const detail::FoldedUpdate*> fold_of(bks.size(), nullptr);
    if (direct && !o.cautious_weight_decay && env_switch("ORTHOPT_FOLD_UPDATE") != std::optional<bool>(false)) {
      for (size_t k = 0; k < bks.size(); ++k) {
        const Bank& b = bks[k];
        const bool own_fp32 = std::all_of(b.params.begin(), b.params.end(), [&](size_t i) {
          const at::Tensor& p = params[i];
          return p.scalar_type() == at::kFloat && p.is_contiguous() && !uses_master(p, o);
        });
        if (!own_fp32 || (!prepared[k] && !(schedule.eps > 0))) continue;
        detail::FoldedUpdate& u = folds[k];
        for (size_t i : b.params) {
          const at::Tensor w3 = params[i].detach().view({-1, b.rows, b.cols});
          for (int64_t e = 0; e < w3.size(0); ++e) u.weights.push_back(w3[e]);
        }
        u.factor = lr_adjust_factor(o.lr_adjust, b.rows, b.cols);
        u.lr = lr;
        u.weight_decay = o.weight_decay;
        u.keep = keep_flag();
        fold_of[k] = &u;
      }
    }
    std::vector<at::Tensor> ns;
    if (o.ortho.split_sizes.empty())
      ns = detail::orthogonalize_many_in_compute_dtype(stacks, ortho, norms, prepared, fold_of);
    for (size_t k = 0; k < bks.size(); ++k) {
      const Bank& b = bks[k];
      if (!ns.empty() && !ns[k].defined()) continue;  // updated by the NS products: outs stay undefined
      // Tall matrices may come back as transposed views and the update kernel reads D
      // contiguously: one copy per bank (a no-op for wide ones and, on the GPU kernels' path, for
      // tall ones through Gram NS), for Muon and NorMuon by the transpose kernel in the compute
      // dtype; NorMuon's row factors are then taken over the contiguous copy (for tall banks
      // another summation order than the reference's over the view: fp32 rounding). With
      // split_sizes NorMuon normalizes the views like the reference, one normuon_bank() per bank.
      at::Tensor res;
      if (o.algorithm == Algorithm::Muon && !direct) {
        res = orthogonalize(stacks[k], ortho).contiguous();
      } else {
        at::Tensor U = !ns.empty() ? ns[k] : detail::orthogonalize_in_compute_dtype(stacks[k], ortho);
        if (U.scalar_type() == at::kDouble) U = U.to(at::kFloat);  // fp64 NS: as orthogonalize() casts
        // NorMuon reads the compute-dtype result as is (normuon_normalize widens it in its
        // reductions and returns fp32): no fp32 copy of the NS result first.
        if (direct || row_scaled) {
          res = cuda::contiguous(U);
          if (row_scaled)  // normuon_bank_factors() in two kernel launches
            bank_factors[k] = cuda::normuon_factors(res, owned_bank(g, b, "variance", 1, at::kFloat), {},
                                                    o.normuon_beta2, o.normuon_eps, keep_flag());
        } else {
          res = normuon_bank(g, b, U).contiguous();
        }
      }
      for (size_t j = 0; j < b.params.size(); ++j)
        outs[b.positions[j]] = b.slice(res, j).view(matrix_sizes(params[b.params[j]], o));
    }

    // An update's lists; add() appends param i: its weight (and copy), its direction from the NS
    // result `out` and its lr adjustment.
    struct UpdateLists {
      std::vector<at::Tensor> weights, copies, directions;
      std::vector<double> factors;
    };
    auto add = [&](UpdateLists& l, size_t i, const at::Tensor& out) {
      auto [D, factor] = adjust_rows(out, o);
      add_weights(g, i, l.weights, l.copies);
      l.directions.push_back(D.reshape(params[i].sizes()).contiguous());
      l.factors.push_back(factor);
    };
    if (row_scaled) {
      // One update per bank: the row factors of its params are rows of the bank's length.
      for (size_t k = 0; k < bks.size(); ++k) {
        const Bank& b = bks[k];
        UpdateLists l;
        std::vector<at::Tensor> row_factors;
        for (size_t j = 0; j < b.params.size(); ++j) {
          add(l, b.params[j], outs[b.positions[j]]);
          row_factors.push_back(b.slice(bank_factors[k], j).reshape({-1}));  // fp32: U is never fp64 here
        }
        cuda::update(l.weights, l.directions, l.copies, l.factors, lr, o.weight_decay, o.cautious_weight_decay,
                     keep_flag(), row_factors, b.cols);
      }
      return;
    }
    UpdateLists l;
    for (size_t j = 0; j < idx.size(); ++j)
      if (outs[j].defined()) add(l, idx[j], outs[j]);  // undefined: the NS products did the update
    if (!l.weights.empty())
      cuda::update(l.weights, l.directions, l.copies, l.factors, lr, o.weight_decay, o.cautious_weight_decay,
                   keep_flag());
  }

  void step_adamw_fused(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, counts, weights, copies;
    for (size_t i : idx) {
      auto& st = state_of(g, i);
      grads.push_back(groups[g].params[i].grad());
      exp_avgs.push_back(st.at("exp_avg"));
      exp_avg_sqs.push_back(st.at("exp_avg_sq"));
      counts.push_back(st.at("step"));
      add_weights(g, i, weights, copies);
    }
    cuda::adamw(grads, exp_avgs, exp_avg_sqs, counts, weights, copies, lr, o.beta1, o.beta2, o.eps, o.weight_decay,
                o.cautious_weight_decay, keep_flag());
  }

  void step_lion_fused(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
    const auto& o = groups[g].options;
    std::vector<at::Tensor> grads, exp_avgs, weights, copies;
    for (size_t i : idx) {
      grads.push_back(groups[g].params[i].grad());
      exp_avgs.push_back(state_of(g, i).at("exp_avg"));
      add_weights(g, i, weights, copies);
    }
    cuda::lion(grads, exp_avgs, weights, copies, lr, o.beta1, o.beta2, o.weight_decay, o.cautious_weight_decay,
               keep_flag());
  }
#endif  // ORTHOPT_WITH_CUDA

  // Optimizer::enqueue_step(): the whole step but finish_step()'s part.
  void enqueue_step() {
    at::NoGradGuard no_grad;
    q_cache.q.reset();
    pending_dion.clear();
    if (skip_active) keep = skip_factor != 0;
    // lr in fp64 so host lr values are not rounded twice; 0-d, so it does not promote tensors.
    const at::Tensor scale = lr_scale.to(at::kDouble);
    for (size_t g = 0; g < groups.size(); ++g) {
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
  std::vector<std::vector<StateDict>> prepare_states(const std::vector<std::vector<StateDict>>& states) const {
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
};

// ---------------------------------------------------------------- public surface

Optimizer::Optimizer(std::vector<ParamGroup> groups) : impl_(std::make_unique<OptimizerImpl>(std::move(groups))) {}
Optimizer::~Optimizer() = default;
Optimizer::Optimizer(Optimizer&&) noexcept = default;
Optimizer& Optimizer::operator=(Optimizer&&) noexcept = default;

void Optimizer::step() {
  impl_->enqueue_step();
  impl_->finish_step();
}
void Optimizer::enqueue_step() { impl_->enqueue_step(); }
void Optimizer::finish_step() { impl_->finish_step(); }

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : impl_->groups)
    for (auto& p : g.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.mutable_grad() = at::Tensor();
      } else {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
}

const std::vector<ParamGroup>& Optimizer::param_groups() const { return impl_->groups; }

void Optimizer::set_group_options(size_t group, const GroupOptions& options) {
  TORCH_CHECK(group < impl_->groups.size(), "argument 'group': index ", group, " out of range (",
              impl_->groups.size(), " groups)");
  auto& grp = impl_->groups[group];
  validate_options(options, group);
  TORCH_CHECK_VALUE(options.algorithm == grp.options.algorithm, "group ", group,
                    ": option 'algorithm' cannot change from '", to_string(grp.options.algorithm), "' to '",
                    to_string(options.algorithm), "' (state would not match)");
  if (same_structure(grp.options, options)) {
    grp.options = options;
    return;
  }
  for (size_t i = 0; i < grp.params.size(); ++i) {
    const std::string label = param_label(grp, group, i);
    validate_param(grp.params[i], options, label);
    const auto& st = impl_->state[group][i];
    if (st.empty()) continue;
    for (const auto& spec : state_specs(grp.params[i], options)) {
      auto it = st.find(spec.name);
      TORCH_CHECK_VALUE(it != st.end() && it->second.sizes() == at::IntArrayRef(spec.sizes), label,
                        ": the new options change the shape or set of state '", spec.name,
                        "' (e.g. flatten, rank_fraction, master_weights); not allowed after the first step");
    }
  }
  grp.options = options;
}

void Optimizer::set_lr_scale(double factor) {
  TORCH_CHECK_VALUE(std::isfinite(factor) && factor >= 0, "argument 'factor': lr scale must be finite and >= 0, got ",
                    factor);
  impl_->lr_scale.fill_(factor);
}

void Optimizer::set_skip_factor(const at::Tensor& factor) {
  TORCH_CHECK_VALUE(factor.defined() && factor.numel() == 1, "argument 'factor': expected a one-element tensor");
  impl_->skip_factor.copy_(factor.reshape({}));
  impl_->skip_active = true;
}

const at::Tensor& Optimizer::lr_scale() const { return impl_->lr_scale; }
const at::Tensor& Optimizer::skip_factor() const { return impl_->skip_factor; }
bool Optimizer::skip_gating() const { return impl_->skip_active; }
int64_t Optimizer::state_version() const { return impl_->state_version; }
int64_t Optimizer::step_count() const { return impl_->steps.item<int64_t>(); }
int64_t Optimizer::dion_qr_fallbacks() const { return impl_->dion_qr_fallbacks; }

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& g : impl_->state)
    for (const auto& st : g)
      for (const auto& [name, t] : st) bytes += static_cast<int64_t>(t.numel() * t.element_size());
  return bytes;
}

const StateDict& Optimizer::param_state(size_t group, size_t index) const {
  TORCH_CHECK(group < impl_->state.size() && index < impl_->state[group].size(), "argument 'group'/'index': (",
              group, ", ", index, ") out of range");
  return impl_->state[group][index];
}

void Optimizer::load_param_states(const std::vector<std::vector<StateDict>>& states) {
  auto prepared = impl_->prepare_states(states);
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < prepared.size(); ++g)
    for (size_t i = 0; i < prepared[g].size(); ++i) {
      impl_->state[g][i] = std::move(prepared[g][i]);
      ++impl_->state_version;
      // Master weights are the truth for the parameter.
      auto it = impl_->state[g][i].find("master");
      if (it != impl_->state[g][i].end()) impl_->groups[g].params[i].detach().copy_(it->second);
    }
}

void Optimizer::set_initial_q_sources(size_t group, size_t index, std::vector<QSource> sources) {
  TORCH_CHECK(group < impl_->groups.size() && index < impl_->groups[group].params.size(),
              "argument 'group'/'index': (", group, ", ", index, ") out of range");
  if (!sources.empty()) check_q_sources(impl_->groups[group], group, index, sources);
  impl_->q_sources[group][index] = std::move(sources);
}

// ---------------------------------------------------------------- serialization

namespace {
constexpr const char* kFormat = "orthopt.optim.v1";

std::string key(size_t g, const std::string& rest) { return "g" + std::to_string(g) + "_" + rest; }
std::string key(size_t g, size_t i, const std::string& rest) {
  return "g" + std::to_string(g) + "_p" + std::to_string(i) + "_" + rest;
}
}  // namespace

void Optimizer::save(torch::serialize::OutputArchive& archive) const {
  const auto& impl = *impl_;
  archive.write("format", c10::IValue(std::string(kFormat)));
  archive.write("num_groups", c10::IValue(static_cast<int64_t>(impl.groups.size())));
  archive.write("steps", impl.steps.cpu(), /*is_buffer=*/true);
  archive.write("lr_scale", impl.lr_scale.cpu(), true);
  archive.write("skip_factor", impl.skip_factor.cpu(), true);
  for (size_t g = 0; g < impl.groups.size(); ++g) {
    const auto& grp = impl.groups[g];
    archive.write(key(g, "algorithm"), c10::IValue(std::string(to_string(grp.options.algorithm))));
    archive.write(key(g, "num_params"), c10::IValue(static_cast<int64_t>(grp.params.size())));
    for (size_t i = 0; i < grp.params.size(); ++i) {
      archive.write(key(g, i, "shape"), c10::IValue(grp.params[i].sizes().vec()));
      std::string names;
      for (const auto& [name, t] : impl.state[g][i]) {
        names += (names.empty() ? "" : ",") + name;
        // A view into a bank's buffer (owned_bank) would serialize the whole buffer: its own copy.
        at::Tensor c = t.detach().cpu();
        if (c.storage().nbytes() != static_cast<size_t>(c.numel()) * c.element_size()) c = c.clone();
        archive.write(key(g, i, "s_" + name), c, true);
      }
      archive.write(key(g, i, "state_names"), c10::IValue(names));
    }
  }
}

void Optimizer::load(torch::serialize::InputArchive& archive) {
  auto& impl = *impl_;
  c10::IValue v;
  TORCH_CHECK(archive.try_read("format", v) && v.isString() && v.toStringRef() == kFormat,
              "optimizer checkpoint: not an orthopt optimizer state (missing or wrong 'format', expected ", kFormat, ")");
  archive.read("num_groups", v);
  TORCH_CHECK(v.toInt() == static_cast<int64_t>(impl.groups.size()), "optimizer checkpoint: has ", v.toInt(),
              " param groups but this optimizer has ", impl.groups.size());
  std::vector<std::vector<StateDict>> states(impl.groups.size());
  for (size_t g = 0; g < impl.groups.size(); ++g) {
    const auto& grp = impl.groups[g];
    archive.read(key(g, "algorithm"), v);
    TORCH_CHECK(v.toStringRef() == to_string(grp.options.algorithm), "optimizer checkpoint: group ", g,
                " was saved by algorithm '", v.toStringRef(), "' but this optimizer's group uses '",
                to_string(grp.options.algorithm), "'");
    archive.read(key(g, "num_params"), v);
    TORCH_CHECK(v.toInt() == static_cast<int64_t>(grp.params.size()), "optimizer checkpoint: group ", g, " has ",
                v.toInt(), " params but this optimizer's group has ", grp.params.size());
    states[g].resize(grp.params.size());
    for (size_t i = 0; i < grp.params.size(); ++i) {
      archive.read(key(g, i, "shape"), v);
      const auto shape = v.toIntVector();
      TORCH_CHECK(at::IntArrayRef(shape) == grp.params[i].sizes(), "optimizer checkpoint: ",
                  param_label(grp, g, i), " was saved with shape ", at::IntArrayRef(shape), " but has shape ",
                  grp.params[i].sizes());
      archive.read(key(g, i, "state_names"), v);
      std::stringstream names(v.toStringRef());
      for (std::string name; std::getline(names, name, ',');) {
        at::Tensor t;
        archive.read(key(g, i, "s_" + name), t, true);
        states[g][i][name] = t;
      }
    }
  }
  at::Tensor steps, lr_scale, skip;
  archive.read("steps", steps, true);
  archive.read("lr_scale", lr_scale, true);
  archive.read("skip_factor", skip, true);
  TORCH_CHECK(steps.numel() == 1 && lr_scale.numel() == 1 && skip.numel() == 1,
              "optimizer checkpoint: malformed steps/lr_scale/skip_factor");
  load_param_states(states);  // validates everything before changing anything
  impl.steps.copy_(steps.reshape({}));
  impl.lr_scale.copy_(lr_scale.reshape({}));
  impl.skip_factor.copy_(skip.reshape({}));
  if (skip.item<float>() != 1.0f) impl.skip_active = true;
}

}  // namespace orthopt

// The step's execution plan: every path choice of a group's step, made once per step from the
// device, dtypes, shapes and the options (ExecutionOptions included), and its description
// (Optimizer::plan(): orthopt plan, opt.plan(), the benchmarks' JSON). docs/execution.md.
#include "optim/optimizer_impl.h"

#include "orthopt/runtime.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <numeric>
#include <sstream>

#include "optim/cpu_loops.h"
#include "optim/update_math.h"
#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#endif

namespace orthopt {

using namespace optim_core;

namespace {

int64_t element_bytes(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kDouble: return "fp64";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: return c10::toString(t);
  }
}

const char* path_name(GroupPlan::Path p) {
  return p == GroupPlan::Path::Fused ? "fused" : p == GroupPlan::Path::Banked ? "banked" : "reference";
}

}  // namespace

bool OptimizerImpl::kernels_take(size_t g, size_t i) const {
#ifdef ORTHOPT_WITH_CUDA
  const at::Tensor& p = groups[g].params[i];
  if (!cuda::multi_tensor_handles(p)) return false;
  if (p.grad().defined() && !cuda::multi_tensor_handles(p.grad())) return false;
  // Missing state is created contiguous, in fp32 or the param's dtype: what the kernels take.
  for (const auto& [name, t] : state[g][i])
    if (!cuda::multi_tensor_handles(t)) return false;
  return true;
#else
  (void)g, (void)i;
  return false;
#endif
}

bool OptimizerImpl::cpu_loops_take(size_t g, size_t i) const {
  const at::Tensor& p = groups[g].params[i];
  const GroupOptions& o = groups[g].options;
  if (!optim_detail::cpu_loops_take(p) || uses_master(p, o) || state_dtype(p, o) != at::kFloat) return false;
  if (p.grad().defined() && !optim_detail::cpu_loops_take(p.grad())) return false;
  for (const auto& [name, t] : state[g][i])
    if (!optim_detail::cpu_loops_take(t)) return false;
  return true;
}

GroupPlan OptimizerImpl::plan_group(size_t g, const std::vector<size_t>& idx) const {
  GroupPlan plan;
  if (idx.empty()) return plan;
  const auto& grp = groups[g];
  const auto& o = grp.options;
  const ExecutionOptions& e = o.ortho.execution;
  const KernelsScope kernels_scope(e.kernels);
  const c10::Device device = grp.params[idx[0]].device();
  const bool kernels = std::all_of(idx.begin(), idx.end(), [&](size_t i) { return kernels_take(g, i); });
  const bool banked = use_banks(device, e);
  using Path = GroupPlan::Path;
  switch (o.algorithm) {
    case Algorithm::Muon:
    case Algorithm::NorMuon:
      plan.path = kernels                                          ? Path::Fused
                  : (o.algorithm == Algorithm::NorMuon && banked) ? Path::Banked
                                                                  : Path::Reference;
      break;
    case Algorithm::Dion3:
    case Algorithm::Dion: plan.path = !banked ? Path::Reference : kernels ? Path::Fused : Path::Banked; break;
    case Algorithm::Dion2: plan.path = Path::Reference; break;
    case Algorithm::AdamW:
    case Algorithm::Lion: {
      // On the CPU the fused path is one loop per param (cpu_loops.h), the same bits.
      const bool loops = device.is_cpu() && kernels_enabled() &&
                         std::all_of(idx.begin(), idx.end(), [&](size_t i) { return cpu_loops_take(g, i); });
      plan.path = kernels || loops ? Path::Fused : Path::Reference;
      break;
    }
  }
  if (plan.path != Path::Reference && is_matrix_algorithm(o.algorithm)) plan.banks = banks(g, idx);
  if (plan.path != Path::Fused || (o.algorithm != Algorithm::Muon && o.algorithm != Algorithm::NorMuon)) return plan;

#ifdef ORTHOPT_WITH_CUDA
  // Muon/NorMuon's fused step, per bank.
  const OrthoOptions ortho = batch_ortho_options(o.ortho);
  const Schedule schedule = resolve_schedule(ortho);
  // The direction is the NS result in its compute dtype (Muon without split_sizes): the update
  // may be folded into the last product for params that are their own fp32 weights (no master
  // copy) with plain decoupled decay; a skipped step then needs a finite product, which the
  // one-pass input gives and the two-pass scaled cast gives where eps > 0 (muon.cpp).
  const bool direct = o.algorithm == Algorithm::Muon && o.ortho.split_sizes.empty();
  for (const Bank& b : plan.banks) {
    std::vector<at::ScalarType> momentum_dtypes, grad_dtypes;
    at::Tensor like;  // a momentum once the state exists (no tensor made in the step)
    for (size_t i : b.params) {
      const at::Tensor& p = grp.params[i];
      const auto it = state[g][i].find("momentum");
      if (it != state[g][i].end() && !like.defined()) like = it->second;
      momentum_dtypes.push_back(it != state[g][i].end() ? it->second.scalar_type() : state_dtype(p, o));
      grad_dtypes.push_back(p.grad().defined() ? p.grad().scalar_type() : p.scalar_type());
    }
    const auto one_dtype = [](const std::vector<at::ScalarType>& ts) {
      return std::all_of(ts.begin(), ts.end(), [&](at::ScalarType t) { return t == ts[0]; });
    };
    GroupPlan::MuonBank choice;
    // One launch per bank for the momentum and the NS input: its momenta in one dtype, its
    // gradients in one (mixed banks, e.g. bf16 and fp32 params of one shape, take two passes).
    if (!like.defined() || like.scalar_type() != momentum_dtypes[0])
      like = at::empty({0}, at::TensorOptions().device(device).dtype(momentum_dtypes[0]));
    const std::optional<at::ScalarType> ns_dtype = detail::prepared_input_dtype(b.rows, b.cols, ortho, like);
    if (ns_dtype && resolve(e.fused_ns_input, true) && one_dtype(momentum_dtypes) && one_dtype(grad_dtypes) &&
        cuda::momentum_ns_input_handles(device, b.rows, b.cols))
      choice.one_pass_input = ns_dtype;
    const bool own_fp32 = std::all_of(b.params.begin(), b.params.end(), [&](size_t i) {
      const at::Tensor& p = grp.params[i];
      return p.scalar_type() == at::kFloat && p.is_contiguous() && !uses_master(p, o);
    });
    choice.fold = direct && !o.cautious_weight_decay && resolve(e.fold_update, true) && own_fp32 &&
                  (choice.one_pass_input || schedule.eps > 0);
    plan.muon.push_back(choice);
  }
#endif
  return plan;
}

BankPlan OptimizerImpl::describe(size_t g, const GroupPlan& plan, size_t k) const {
  const auto& grp = groups[g];
  const auto& o = grp.options;
  BankPlan d;
  d.group = g;
  d.algorithm = to_string(o.algorithm);
  d.path = path_name(plan.path);
  const Bank& b = plan.banks[k];
  d.params = b.params;
  const at::Tensor& p0 = grp.params[b.params[0]];
  d.dtype = dtype_name(p0.scalar_type());
  const int64_t pb = element_bytes(p0.scalar_type()), sb = element_bytes(state_dtype(p0, o));
  const bool master = uses_master(p0, o);
  const int64_t wb = master ? 4 : pb;  // the weights the update reads and writes
  if (!is_matrix_algorithm(o.algorithm)) {
    d.matrices = static_cast<int64_t>(b.params.size());
    d.numel = b.rows;
    const double n = static_cast<double>(d.numel);
    const bool adamw = o.algorithm == Algorithm::AdamW;
    d.flops = n * (adamw ? 14 : 9);
    // grad, state read and written (two moments for AdamW), weights read and written (and the
    // param's copy of its master weights).
    d.bytes = n * static_cast<double>(pb + (adamw ? 4 : 2) * sb + 2 * wb + (master ? pb : 0));
    if (plan.path == GroupPlan::Path::Fused) d.kernels = {adamw ? "adamw" : "lion"};
    return d;
  }
  d.matrices = b.size();
  d.rows = b.rows;
  d.cols = b.cols;
  d.numel = b.size() * b.rows * b.cols;
  const double n = static_cast<double>(d.numel), B = static_cast<double>(b.size());
  const OrthoOptions ortho = batch_ortho_options(o.ortho);
  // Dion's power iteration and QR instead of NS.
  if (o.algorithm == Algorithm::Dion) {
    const double r = static_cast<double>(optim_detail::dion_rank(o.rank_fraction, b.rows, b.cols));
    const double m = static_cast<double>(b.rows), c = static_cast<double>(b.cols);
    d.flops = B * (2 * m * c * r * 2 + 4 * m * r * r) + 6 * n;
    d.bytes = n * static_cast<double>(2 * sb + pb + 2 * wb + 4);
    // No NS: one power iteration and the QR of the [m, r] product (rank r).
    d.ns_method = o.dion_qr == DionQr::Cholesky ? "power-cholqr2" : "power-qr";
    d.ns_dtype = "fp32";
    d.ns_rows = static_cast<int64_t>(r);
    if (plan.path == GroupPlan::Path::Fused) d.kernels = {"update"};
    return d;
  }
  int64_t ns_rows = b.rows;
  if (o.algorithm == Algorithm::Dion3) ns_rows = optim_detail::dion3_rank(o.fraction, b.rows);
  d.ns_rows = ns_rows;
  const at::ScalarType input = o.algorithm == Algorithm::Dion3 || plan.path != GroupPlan::Path::Fused
                                   ? b.dtype
                                   : (k < plan.muon.size() && plan.muon[k].one_pass_input ? *plan.muon[k].one_pass_input
                                                                                           : at::kFloat);
  const detail::NsPlan ns = detail::plan_ns(b.size(), ns_rows, b.cols, p0.device(), input, ortho);
  d.ns_method = ns.method == OrthoMethod::Gram ? "gram" : "standard";
  d.ns_dtype = dtype_name(ns.compute);
  d.layout = !ns.tall ? "as stored" : ns.own_layout ? "own layout (tall)" : "transposed (tall)";
  d.flops = B * method_flops(ns_rows, b.cols, ortho.steps, ns.method, ortho.gram_restarts) + 8 * n;
  const int64_t cb = element_bytes(ns.compute);
  // momentum pass: momentum read and written, gradient read; NS input written and read;
  // update: weights read and written, direction read (not with a folded update).
  double per = static_cast<double>(2 * sb + pb + 2 * wb);
  if (plan.path == GroupPlan::Path::Fused && (o.algorithm == Algorithm::Muon || o.algorithm == Algorithm::NorMuon)) {
    const GroupPlan::MuonBank& c = plan.muon[k];
    if (c.one_pass_input) {
      d.kernels.push_back("momentum_ns_input");
      per += 2 * cb;
    } else {
      d.kernels.push_back("momentum_rows");
      d.kernels.push_back("scale_cast");
      per += 2 * 4 + 2 * cb;
    }
    if (o.algorithm == Algorithm::NorMuon) d.kernels.push_back("normuon_factors");
    if (c.fold) {
      d.kernels.push_back("update folded into the last product");
    } else {
      d.kernels.push_back("update");
      per += cb;
    }
  } else if (plan.path == GroupPlan::Path::Fused) {  // Dion3
    d.kernels = {"momentum_rows", "dion3_take_rows", "normuon_factors", "update_selected"};
    per += cb;
  } else {
    per += 2 * 4 + 2 * cb + 4;
  }
  if (ns.kernels) d.kernels.push_back(ns.method == OrthoMethod::Gram ? "gram products" : "symmetric products");
  d.bytes = n * per;
  return d;
}

StepPlan Optimizer::plan() const {
  const OptimizerImpl& impl = *impl_;
  StepPlan out;
  for (size_t g = 0; g < impl.groups.size(); ++g) {
    const auto& grp = impl.groups[g];
    if (grp.params.empty()) continue;
    if (out.device.empty()) {
      std::ostringstream s;
      s << grp.params[0].device();
      out.device = s.str();
      out.execution = to_string(grp.options.ortho.execution);
    }
    std::vector<size_t> idx(grp.params.size());
    std::iota(idx.begin(), idx.end(), size_t{0});
    GroupPlan plan = impl.plan_group(g, idx);
    if (plan.banks.empty()) {
      // Per matrix (reference), or a scalar group: the group's same-shaped tensors as one line.
      std::map<std::tuple<int64_t, int64_t, at::ScalarType>, size_t> index;
      const bool matrix = is_matrix_algorithm(grp.options.algorithm);
      for (size_t i : idx) {
        const at::Tensor& p = grp.params[i];
        int64_t rows = p.numel(), cols = 1, count = 1;
        if (matrix) {
          const auto msz = matrix_sizes(p, grp.options);
          rows = msz[msz.size() - 2];
          cols = msz.back();
          count = leading_count(msz);
        }
        const auto key = matrix ? std::make_tuple(rows, cols, p.scalar_type())
                                : std::make_tuple(int64_t{0}, int64_t{0}, p.scalar_type());
        auto [it, fresh] = index.try_emplace(key, plan.banks.size());
        if (fresh) {
          plan.banks.emplace_back();
          plan.banks.back().rows = matrix ? rows : 0;
          plan.banks.back().cols = matrix ? cols : 1;
          plan.banks.back().dtype = work_dtype(p);
        }
        Bank& b = plan.banks[it->second];
        b.params.push_back(i);
        b.offsets.push_back(b.offsets.back() + count);
        if (!matrix) b.rows += rows;  // scalar groups: numel in rows
      }
    }
    for (size_t k = 0; k < plan.banks.size(); ++k) out.banks.push_back(impl.describe(g, plan, k));
  }
  // Side streams: the chains the orthogonalization would run over each group's banks.
  size_t first = 0;
  for (size_t g = 0; g < impl.groups.size(); ++g) {
    std::vector<detail::NsPlan> ns;
    std::vector<size_t> where;
    for (size_t k = first; k < out.banks.size() && out.banks[k].group == g; ++k) {
      if (!out.banks[k].ns_method.empty() && out.banks[k].algorithm != "dion" && out.banks[k].path != "reference") {
        const auto& grp = impl.groups[g];
        ns.push_back(detail::plan_ns(out.banks[k].matrices, out.banks[k].ns_rows, out.banks[k].cols,
                                     grp.params[0].device(), grp.params[out.banks[k].params[0]].scalar_type(),
                                     OptimizerImpl::batch_ortho_options(grp.options.ortho)));
        where.push_back(k);
      }
    }
    while (first < out.banks.size() && out.banks[first].group == g) ++first;
    if (ns.empty()) continue;
    const KernelsScope kernels_scope(impl.groups[g].options.ortho.execution.kernels);
    const auto& grp = impl.groups[g];
    for (const auto& chain : detail::plan_chains(ns, grp.params[0].device(), grp.options.ortho.execution))
      for (size_t i : chain.inputs) out.banks[where[i]].side_stream = chain.side_stream;
  }
  return out;
}

double StepPlan::flops() const {
  double s = 0;
  for (const auto& b : banks) s += b.flops;
  return s;
}

double StepPlan::bytes() const {
  double s = 0;
  for (const auto& b : banks) s += b.bytes;
  return s;
}

std::string StepPlan::to_string() const {
  std::ostringstream s;
  s << "device " << device << ", execution " << execution << "\n";
  s << std::left << std::setw(3) << "g" << std::setw(9) << "algo" << std::setw(6) << "n" << std::setw(14) << "shape"
    << std::setw(6) << "dtype" << std::setw(10) << "path" << std::setw(26) << "ns" << std::setw(19) << "layout"
    << std::setw(6) << "side" << std::setw(10) << "GFLOP" << std::setw(9) << "MB"
    << "kernels\n";
  for (const auto& b : banks) {
    std::ostringstream shape;
    if (b.rows > 0)
      shape << b.rows << "x" << b.cols;
    else
      shape << b.numel;
    std::string ns = b.ns_method.empty() ? "-" : b.ns_method + "/" + b.ns_dtype;
    if (!b.ns_method.empty() && b.ns_rows != b.rows)
      ns += (b.algorithm == "dion" ? " r=" : " k=") + std::to_string(b.ns_rows);
    std::string kernels;
    for (const auto& k : b.kernels) kernels += (kernels.empty() ? "" : ", ") + k;
    s << std::left << std::setw(3) << b.group << std::setw(9) << b.algorithm << std::setw(6) << b.matrices
      << std::setw(14) << shape.str() << std::setw(6) << b.dtype << std::setw(10) << b.path << std::setw(26) << ns
      << std::setw(19) << (b.layout.empty() ? "-" : b.layout) << std::setw(6) << (b.side_stream ? "yes" : "-")
      << std::setw(10) << std::fixed << std::setprecision(2) << b.flops / 1e9 << std::setw(9) << std::setprecision(1)
      << b.bytes / 1e6 << (kernels.empty() ? "-" : kernels) << "\n";
  }
  s << std::fixed << std::setprecision(2) << "total: " << flops() / 1e9 << " GFLOP, " << std::setprecision(1)
    << bytes() / 1e6 << " MB\n";
  return s.str();
}

std::string StepPlan::to_json() const {
  auto str = [](const std::string& v) {
    std::string out = "\"";
    for (char c : v) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  };
  std::ostringstream s;
  s << std::setprecision(17);
  s << "{\"device\": " << str(device) << ", \"execution\": " << str(execution) << ", \"flops\": " << flops()
    << ", \"bytes\": " << bytes() << ", \"banks\": [";
  for (size_t k = 0; k < banks.size(); ++k) {
    const auto& b = banks[k];
    s << (k ? ", " : "") << "{\"group\": " << b.group << ", \"algorithm\": " << str(b.algorithm) << ", \"params\": [";
    for (size_t j = 0; j < b.params.size(); ++j) s << (j ? ", " : "") << b.params[j];
    s << "], \"matrices\": " << b.matrices << ", \"rows\": " << b.rows << ", \"cols\": " << b.cols
      << ", \"numel\": " << b.numel << ", \"dtype\": " << str(b.dtype) << ", \"path\": " << str(b.path)
      << ", \"ns_method\": " << str(b.ns_method) << ", \"ns_dtype\": " << str(b.ns_dtype)
      << ", \"ns_rows\": " << b.ns_rows << ", \"layout\": " << str(b.layout)
      << ", \"side_stream\": " << (b.side_stream ? "true" : "false") << ", \"kernels\": [";
    for (size_t j = 0; j < b.kernels.size(); ++j) s << (j ? ", " : "") << str(b.kernels[j]);
    s << "], \"flops\": " << b.flops << ", \"bytes\": " << b.bytes << "}";
  }
  s << "]}";
  return s.str();
}

}  // namespace orthopt

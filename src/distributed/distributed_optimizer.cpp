// DistributedOptimizer: whole-matrix ownership over same-shape banks, one flat buffer per step
// for the gradient reduce-scatter and one for the parameter all-gather.
//
// Layout (identical on every rank, derived from the groups and the world size N):
//   for each group, in order:
//     matrix algorithm: one BANK per distinct matrix shape (m, k) in order of first appearance;
//       a 2-D param is one matrix, a [..., m, k] param is prod(leading) matrices (expert stack),
//       with `flatten` a >=3-D param is one [size0, prod(rest)] matrix. The bank's B matrices
//       are padded to B_pad = N·ceil(B/N); rank r owns matrices [r·P, min(B, (r+1)·P)), P = B_pad/N.
//     scalar algorithm (AdamW, Lion): the group's params flattened into one vector of L
//       elements, padded to N·ceil(L/N), rank r owns elements [r·P, min(L, (r+1)·P)).
//   Each rank's chunk of the flat buffers is the concatenation of its slice of every segment,
//   so one reduce-scatter and one all-gather move everything; a matrix never straddles ranks.
//
// Every copy between a model parameter and the flat buffers is a run of contiguous elements
// (matrices of a param are contiguous in its flattened storage), listed once in `Run`s.
#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "orthopt/distributed.h"

namespace orthopt::dist {

namespace fs = std::filesystem;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string param_name(const ParamGroup& g, size_t i) {
  if (i < g.names.size() && !g.names[i].empty()) return g.names[i];
  return "param " + std::to_string(i);
}

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// Everything that must agree across ranks, as text (compared through the store at start-up).
std::string describe_config(const std::vector<ParamGroup>& groups, int world) {
  std::ostringstream os;
  os.precision(17);
  os << "world=" << world << ";groups=" << groups.size();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& o = groups[g].options;
    const auto& t = o.ortho;
    os << ";g" << g << ":" << to_string(o.algorithm) << " lr=" << o.lr << " wd=" << o.weight_decay
       << " cwd=" << o.cautious_weight_decay << " mu=" << o.momentum
       << " ms=" << static_cast<int>(o.momentum_style) << " nest=" << o.nesterov
       << " adj=" << to_string(o.lr_adjust) << " nb2=" << o.normuon_beta2 << " neps=" << o.normuon_eps
       << " f=" << o.fraction << " slf=" << o.scale_lr_by_fraction << " rf=" << o.rank_fraction
       << " dqr=" << to_string(o.dion_qr)
       << " b1=" << o.beta1 << " b2=" << o.beta2 << " eps=" << o.eps << " mw=" << o.master_weights
       << " ns=" << t.schedule << "/" << t.steps << "/" << to_string(t.method) << "/"
       << (t.compute_dtype ? static_cast<int>(*t.compute_dtype) : -1) << "/" << t.gram_aspect_threshold
       << "/" << (t.safety ? *t.safety : -1.0) << "/" << (t.eps ? *t.eps : -1.0) << "/" << t.flatten
       << "/" << static_cast<int>(t.nonfinite) << " split=" << shape_str(t.split_sizes) << " restarts=";
    for (int r : t.gram_restarts) os << r << ",";
    os << " custom=";
    for (const auto& tr : t.custom_triples) os << tr[0] << "," << tr[1] << "," << tr[2] << ";";
    os << " params=";
    for (size_t i = 0; i < groups[g].params.size(); ++i)
      os << param_name(groups[g], i) << shape_str(groups[g].params[i].sizes()) << " ";
  }
  return os.str();
}

}  // namespace

namespace {

// The matrix shape and count of matrices a param contributes to a bank.
void matrix_view(const ParamGroup& g, size_t i, int64_t& rows, int64_t& cols, int64_t& count) {
  const auto& p = g.params[i];
  TORCH_CHECK(p.dim() >= 2, "distributed optimizer: ", param_name(g, i), " of shape ", shape_str(p.sizes()),
              " is in a ", to_string(g.options.algorithm), " group but is not a matrix (needs >= 2 dims)");
  if (g.options.ortho.flatten && p.dim() >= 3) {
    rows = p.size(0);
    cols = p.numel() / rows;
    count = 1;
  } else {
    rows = p.size(-2);
    cols = p.size(-1);
    count = p.numel() / (rows * cols);
  }
}

// The local optimizer's options for a group: its pieces are [n, m, k] stacks of matrices that
// the layout has already flattened, so `flatten` (which would merge a stack into one matrix)
// is off there.
GroupOptions local_options(GroupOptions o) {
  o.ortho.flatten = false;
  return o;
}

// Splits [unit_begin, unit_begin + n) of a segment into runs at rank boundaries.
void add_runs(std::vector<LayoutRun>& runs, const LayoutSegment& seg, int64_t chunk, size_t group, size_t param,
              int64_t unit_begin, int64_t n) {
  const int64_t un = seg.unit_numel();
  int64_t u = unit_begin;
  while (u < unit_begin + n) {
    const int64_t block = u / seg.per_rank;
    const int owner = seg.owner_of_block(block);
    const int64_t end = std::min(unit_begin + n, (block + 1) * seg.per_rank);
    const int64_t local = u - block * seg.per_rank;
    runs.push_back(LayoutRun{group, param, (u - unit_begin) * un,
                       owner * chunk + seg.chunk_offset + local * un, (end - u) * un, owner});
    u = end;
  }
}

}  // namespace

// Segments, the block rotation of each, and the copy runs of every parameter (the layout
// described at the top of this file). Depends only on shapes, options and N.
Layout build_layout(const std::vector<ParamGroup>& groups, int N) {
  TORCH_CHECK(N >= 1, "build_layout: argument 'world_size' must be >= 1, got ", N);
  Layout L;
  L.world_size = N;
  auto& members = L.members;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& grp = groups[g];
    if (grp.params.empty()) continue;
    if (is_matrix_algorithm(grp.options.algorithm)) {
      std::vector<size_t> group_segs;
      for (size_t i = 0; i < grp.params.size(); ++i) {
        int64_t rows, cols, count;
        matrix_view(grp, i, rows, cols, count);
        size_t s = 0;
        for (; s < group_segs.size(); ++s)
          if (L.segments[group_segs[s]].rows == rows && L.segments[group_segs[s]].cols == cols) break;
        if (s == group_segs.size()) {
          group_segs.push_back(L.segments.size());
          LayoutSegment seg;
          seg.group = g;
          seg.is_bank = true;
          seg.rows = rows;
          seg.cols = cols;
          L.segments.push_back(seg);
        }
        LayoutSegment& seg = L.segments[group_segs[s]];
        members.push_back({group_segs[s], i, seg.units, count});
        seg.units += count;
      }
    } else {
      const size_t s = L.segments.size();
      LayoutSegment seg;
      seg.group = g;
      seg.is_bank = false;
      L.segments.push_back(seg);
      for (size_t i = 0; i < grp.params.size(); ++i) {
        members.push_back({s, i, L.segments[s].units, grp.params[i].numel()});
        L.segments[s].units += grp.params[i].numel();
      }
    }
  }
  // Blocks of a segment hold P, ..., P, remainder, 0, ... real units; rotating which rank
  // gets block 0 (greedily, the rotation that keeps the most loaded rank lightest) spreads the
  // remainders so no rank collects every bank's extra matrices. Load = elements owned, which
  // is what optimizer state and update traffic scale with.
  std::vector<int64_t> load(N, 0);
  for (auto& seg : L.segments) {
    seg.world = N;
    seg.per_rank = ceil_div(seg.units, N);
    int best_shift = 0;
    int64_t best_max = -1;
    double best_sq = 0;
    for (int shift = 0; shift < N; ++shift) {
      seg.shift = shift;
      int64_t mx = 0;
      double sq = 0;  // tie-break: the more even spread
      for (int r = 0; r < N; ++r) {
        const int64_t l = load[r] + (seg.owned_end(r) - seg.owned_begin(r)) * seg.unit_numel();
        mx = std::max(mx, l);
        sq += static_cast<double>(l) * static_cast<double>(l);
      }
      if (best_max < 0 || mx < best_max || (mx == best_max && sq < best_sq)) {
        best_max = mx;
        best_sq = sq;
        best_shift = shift;
      }
    }
    seg.shift = best_shift;
    for (int r = 0; r < N; ++r) load[r] += (seg.owned_end(r) - seg.owned_begin(r)) * seg.unit_numel();
    seg.chunk_offset = L.chunk;
    L.chunk += seg.per_rank * seg.unit_numel();
  }
  for (const auto& m : members) {
    const auto& seg = L.segments[m.segment];
    add_runs(L.runs, seg, L.chunk, seg.group, m.param, m.first_unit, m.count);
  }
  return L;
}

DistributedOptimizer::DistributedOptimizer(std::vector<ParamGroup> groups, std::shared_ptr<DistContext> ctx)
    : groups_(std::move(groups)), ctx_(std::move(ctx)) {
  TORCH_CHECK(ctx_, "DistributedOptimizer: context is null");
  TORCH_CHECK(!groups_.empty(), "DistributedOptimizer: no parameter groups");
  const int N = ctx_->world_size();
  const int rank = ctx_->rank();

  // Common dtype/device for the flat buffers.
  at::TensorOptions topt;
  bool have = false;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const auto& p = groups_[g].params[i];
      TORCH_CHECK(p.defined(), "DistributedOptimizer: group ", g, " ", param_name(groups_[g], i), " is undefined");
      TORCH_CHECK(p.is_contiguous(), "DistributedOptimizer: group ", g, " ", param_name(groups_[g], i),
                  " must be contiguous");
      TORCH_CHECK(p.numel() > 0, "DistributedOptimizer: group ", g, " ", param_name(groups_[g], i), " is empty");
      if (!have) {
        topt = p.options().requires_grad(false);
        have = true;
      }
      TORCH_CHECK(p.scalar_type() == topt.dtype().toScalarType() && p.device() == topt.device(),
                  "DistributedOptimizer: all parameters must share one dtype and device; group ", g, " ",
                  param_name(groups_[g], i), " is ", p.scalar_type(), " on ", p.device(), ", the first is ",
                  topt.dtype(), " on ", topt.device());
    }
  }
  TORCH_CHECK(have, "DistributedOptimizer: the groups hold no parameters");
  TORCH_CHECK(topt.device().type() == ctx_->device().type(), "DistributedOptimizer: parameters are on ",
              topt.device(), " but the context's backend ", ctx_->backend(), " works on ", ctx_->device());

  // A mismatched configuration would make ranks exchange buffers of different layouts: refuse
  // it up front, on every rank, with the first difference in the message.
  ctx_->check_same_on_all_ranks("optimizer configuration", describe_config(groups_, N));

  layout_ = std::make_unique<Layout>(build_layout(groups_, N));
  chunk_ = layout_->chunk;
  const auto& L = *layout_;

  grad_flat_ = at::zeros({N * chunk_}, topt);
  param_flat_ = at::zeros({N * chunk_}, topt);

  // Start identical: rank 0's parameters everywhere (like DDP).
  {
    at::NoGradGuard ng;
    for (const auto& r : L.runs)
      param_flat_.narrow(0, r.flat_offset, r.count).copy_(groups_[r.group].params[r.param].reshape(-1).narrow(0, r.param_offset, r.count));
    ctx_->broadcast(param_flat_, 0);
    unpack_params();
  }

  // The pieces this rank owns and the local optimizer over them.
  for (const auto& seg : L.segments) {
    ShardPiece p;
    p.group = seg.group;
    p.is_bank = seg.is_bank;
    p.rows = seg.rows;
    p.cols = seg.cols;
    p.begin = seg.owned_begin(rank);
    p.end = seg.owned_end(rank);
    pieces_.push_back(p);
  }
  for (const auto& g : groups_) group_options_.push_back(g.options);
  local_ = build_local();
  skip_factor_ = at::ones({}, at::TensorOptions().dtype(at::kFloat).device(topt.device()));
  steps_t_ = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(topt.device()));
}

DistributedOptimizer::~DistributedOptimizer() = default;

std::unique_ptr<Optimizer> DistributedOptimizer::build_local() {
  const int rank = ctx_->rank();
  auto own = param_flat_.narrow(0, rank * chunk_, chunk_);
  auto own_grad = grad_flat_.narrow(0, rank * chunk_, chunk_);
  std::vector<ParamGroup> local_groups;
  local_group_of_.assign(groups_.size(), -1);
  for (size_t k = 0; k < pieces_.size(); ++k) {
    auto& piece = pieces_[k];
    const auto& seg = layout_->segments[k];
    const int64_t n = piece.end - piece.begin;
    piece.local_index = -1;
    if (n <= 0) continue;  // empty shard of a small bank: this rank owns none of its matrices
    const int64_t off = seg.chunk_offset;
    at::Tensor p, gr;
    if (seg.is_bank) {
      p = own.narrow(0, off, n * seg.unit_numel()).view({n, seg.rows, seg.cols});
      gr = own_grad.narrow(0, off, n * seg.unit_numel()).view({n, seg.rows, seg.cols});
    } else {
      p = own.narrow(0, off, n);
      gr = own_grad.narrow(0, off, n);
    }
    p.mutable_grad() = gr;
    if (local_group_of_[seg.group] < 0) {
      local_group_of_[seg.group] = static_cast<int>(local_groups.size());
      ParamGroup lg;
      lg.options = local_options(group_options_[seg.group]);
      local_groups.push_back(lg);
    }
    auto& lg = local_groups[local_group_of_[seg.group]];
    piece.local_index = static_cast<int64_t>(lg.params.size());
    lg.params.push_back(p);
    const std::string range = "[" + std::to_string(piece.begin) + ":" + std::to_string(piece.end) + "]";
    lg.names.push_back("group" + std::to_string(seg.group) +
                       (seg.is_bank ? ".bank" + std::to_string(seg.rows) + "x" + std::to_string(seg.cols) : std::string(".flat")) +
                       range);
  }
  if (local_groups.empty()) return nullptr;
  auto opt = std::make_unique<Optimizer>(std::move(local_groups));
  opt->set_lr_scale(lr_scale_);
  // Dion's Q starts random, seeded per parameter of the optimizer that holds it. A piece's Q is
  // therefore declared as the slices of the Q the single-process optimizer gives each model
  // parameter it holds matrices of (same seed rule, same draw), so N ranks start exactly where
  // one process does, also after re-sharding or loading a checkpoint without state.
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const auto& piece = pieces_[k];
    if (piece.local_index < 0 || group_options_[piece.group].algorithm != Algorithm::Dion) continue;
    std::vector<QSource> sources;
    for (const auto& m : layout_->members) {
      const int64_t b = std::max(piece.begin, m.first_unit), e = std::min(piece.end, m.first_unit + m.count);
      if (m.segment != k || b >= e) continue;
      const auto& grp = groups_[piece.group];
      int64_t rows, cols, count;
      matrix_view(grp, m.param, rows, cols, count);
      std::vector<int64_t> msz = grp.params[m.param].sizes().vec();
      if (grp.options.ortho.flatten && msz.size() >= 3) msz = {rows, cols};  // as the single process sees it
      sources.push_back({piece.group, m.param, msz, b - m.first_unit, e - m.first_unit});
    }
    opt->set_initial_q_sources(local_group_of_[piece.group], piece.local_index, std::move(sources));
  }
  return opt;
}

void DistributedOptimizer::pack_grads() {
  for (const auto& r : layout_->runs) {
    const auto& p = groups_[r.group].params[r.param];
    const auto& g = p.grad();
    TORCH_CHECK(g.defined(), "DistributedOptimizer::step: group ", r.group, " ",
                param_name(groups_[r.group], r.param), " has no gradient (every parameter needs one on every rank)");
    TORCH_CHECK(g.sizes() == p.sizes(), "DistributedOptimizer::step: gradient of ",
                param_name(groups_[r.group], r.param), " has shape ", shape_str(g.sizes()), ", param ",
                shape_str(p.sizes()));
    grad_flat_.narrow(0, r.flat_offset, r.count).copy_(g.reshape(-1).narrow(0, r.param_offset, r.count));
  }
}

void DistributedOptimizer::pack_owned_params() {
  const int rank = ctx_->rank();
  for (const auto& r : layout_->runs) {
    if (r.owner != rank) continue;
    param_flat_.narrow(0, r.flat_offset, r.count)
        .copy_(groups_[r.group].params[r.param].reshape(-1).narrow(0, r.param_offset, r.count));
  }
}

void DistributedOptimizer::unpack_params() {
  for (const auto& r : layout_->runs) {
    auto& p = groups_[r.group].params[r.param];
    p.view({-1}).narrow(0, r.param_offset, r.count).copy_(param_flat_.narrow(0, r.flat_offset, r.count));
  }
}

at::Tensor DistributedOptimizer::reduce_gradients() {
  at::NoGradGuard ng;
  const int N = ctx_->world_size();
  const int rank = ctx_->rank();
  pack_grads();
  auto own_grad = grad_flat_.narrow(0, rank * chunk_, chunk_);
  ctx_->reduce_scatter_sum(grad_flat_, own_grad);
  own_grad.div_(N);  // average: the gradient of the global batch
  // Global norm of the averaged gradient: owned chunks are disjoint (padding is zero), so
  // the squares add up over ranks. One all-reduce of a scalar, no host synchronization.
  at::Tensor sq = own_grad.to(at::kFloat).pow(2).sum().reshape({1});
  ctx_->all_reduce_sum(sq);
  reduced_ = true;
  return sq.sqrt().reshape({});
}

std::vector<at::Tensor> DistributedOptimizer::owned_params() const {
  std::vector<at::Tensor> out;
  if (!local_) return out;
  for (const auto& g : local_->param_groups())
    for (const auto& p : g.params) out.push_back(p);
  return out;
}

void DistributedOptimizer::apply_update() {
  TORCH_CHECK(reduced_, "DistributedOptimizer::apply_update: call reduce_gradients() first (once per step)");
  at::NoGradGuard ng;
  const int rank = ctx_->rank();
  // The model parameters are the source of truth (a user may have loaded or edited them).
  pack_owned_params();
  if (local_) local_->step();
  auto own = param_flat_.narrow(0, rank * chunk_, chunk_);
  ctx_->all_gather(own, param_flat_);
  unpack_params();
  steps_t_.add_(skip_factor_.ne(0).to(at::kLong));
  reduced_ = false;
}

void DistributedOptimizer::step() {
  reduce_gradients();
  apply_update();
}

int64_t DistributedOptimizer::step_count() const { return steps_t_.item<int64_t>(); }

std::vector<int64_t> DistributedOptimizer::segment_units() const {
  std::vector<int64_t> u;
  for (const auto& s : layout_->segments) u.push_back(s.units);
  return u;
}

void DistributedOptimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_)
    for (auto& p : g.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) p.mutable_grad() = at::Tensor();
      else p.mutable_grad().zero_();
    }
}

void DistributedOptimizer::set_lr_scale(double factor) {
  lr_scale_ = factor;
  if (local_) local_->set_lr_scale(factor);
}

void DistributedOptimizer::set_skip_factor(const at::Tensor& factor) {
  skip_factor_.copy_(factor);
  if (local_) local_->set_skip_factor(factor);
}

void DistributedOptimizer::set_group_options(size_t group, const GroupOptions& options) {
  TORCH_CHECK(group < groups_.size(), "set_group_options: group ", group, " out of range (", groups_.size(), ")");
  TORCH_CHECK(options.algorithm == group_options_[group].algorithm,
              "set_group_options: the algorithm of a distributed group cannot change");
  TORCH_CHECK(options.ortho.flatten == group_options_[group].ortho.flatten,
              "set_group_options: option 'flatten' of a distributed group cannot change (the layout depends on it)");
  if (local_ && local_group_of_[group] >= 0) local_->set_group_options(local_group_of_[group], local_options(options));
  group_options_[group] = options;
  groups_[group].options = options;
}

int64_t DistributedOptimizer::state_bytes() const { return local_ ? local_->state_bytes() : 0; }


LayoutPlan plan_layout(const std::vector<ParamGroup>& groups, int world_size) {
  TORCH_CHECK(world_size >= 1, "plan_layout: argument 'world_size' must be >= 1, got ", world_size);
  const Layout L = build_layout(groups, world_size);
  LayoutPlan plan;
  plan.world_size = world_size;
  plan.chunk_elements = L.chunk;
  plan.owned_elements.assign(world_size, 0);
  plan.ns_flops.assign(world_size, 0.0);
  for (const auto& seg : L.segments) {
    plan.real_elements += seg.units * seg.unit_numel();
    const auto& o = groups[seg.group].options;
    double per_matrix = 0;  // Newton–Schulz FLOPs of one matrix of this bank
    if (seg.is_bank && o.algorithm != Algorithm::Dion) {
      int64_t rows = seg.rows;
      if (o.algorithm == Algorithm::Dion3)  // orthogonalizes the k selected rows only
        rows = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.fraction * static_cast<double>(seg.rows))));
      const int64_t m = std::min(rows, seg.cols), n = std::max(rows, seg.cols);
      per_matrix = method_flops(m, n, o.ortho.steps, resolve_method(m, n, o.ortho), o.ortho.gram_restarts);
    }
    for (int r = 0; r < world_size; ++r) {
      const int64_t owned = seg.owned_end(r) - seg.owned_begin(r);
      plan.owned_elements[r] += owned * seg.unit_numel();
      plan.ns_flops[r] += static_cast<double>(owned) * per_matrix;
    }
  }
  return plan;
}

}  // namespace orthopt::dist

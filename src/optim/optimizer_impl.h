// The optimizer's shared core (internal, src/optim/): OptimizerImpl holds the parameter groups,
// their state, the banks and the skip gate; each algorithm's steps (reference, banked, fused) live in
// its own file and are members of it: muon.cpp, normuon.cpp, dion3.cpp, dion2.cpp, dion.cpp,
// adamw.cpp, lion.cpp. core.cpp: state, banks, weights and the step's dispatch; options.cpp: names
// and option checks; optimizer.cpp: the public surface and serialization.
//
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
// (execution banks=off) and the CPU default (use_banks()); on the CPU both give the same bits
// (tests/cpp/test_optim_banks.cpp).
//
// On CUDA, Muon/NorMuon, AdamW and Lion groups take a fused path (the *_fused functions): the
// elementwise math of all the group's tensors runs in a few multi-tensor kernel launches
// (src/cuda/multi_tensor_cuda.h) with the same fp32 operations as the reference path, which
// stays the path for CPU, fp64, Dion and execution kernels=off. Dion3 writes its weights
// through the same multi-tensor update kernel there.
#pragma once

#include "orthopt/optim.h"
#include "orthopt/plan.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ortho/orthogonalize_detail.h"

namespace orthopt {

using StateDict = Optimizer::StateDict;

namespace optim_core {

bool is_low_precision(at::ScalarType t);
bool is_float(at::ScalarType t);
// Updates are computed in fp32 (fp64 for fp64 parameters).
at::ScalarType work_dtype(const at::Tensor& p);
bool uses_master(const at::Tensor& p, const GroupOptions& o);
at::ScalarType state_dtype(const at::Tensor& p, const GroupOptions& o);
std::vector<int64_t> matrix_sizes(const at::Tensor& p, const GroupOptions& o);

struct StateSpec {
  std::string name;
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};
std::vector<StateSpec> state_specs(const at::Tensor& p, const GroupOptions& o);

void validate_options(const GroupOptions& o, size_t group);
void validate_param(const at::Tensor& p, const GroupOptions& o, const std::string& label);
bool same_structure(const GroupOptions& a, const GroupOptions& b);

at::Tensor random_q(size_t g, size_t i, at::IntArrayRef sizes);
int64_t leading_count(const std::vector<int64_t>& msz);
bool use_banks(c10::Device device, const ExecutionOptions& e);

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

at::Tensor stack_bank(const std::vector<at::Tensor>& ts, int64_t r, int64_t c, at::ScalarType dtype);
void check_q_sources(const ParamGroup& grp, size_t g, size_t i, const std::vector<QSource>& sources);

}  // namespace optim_core

using optim_core::Bank;

// The decisions of one step of a group over its active params, made in one place
// (OptimizerImpl::plan_group, plan.cpp) and executed by the algorithm's step functions; the
// orthogonalization below them follows detail::plan_ns / plan_chains, which the plan records.
struct GroupPlan {
  enum class Path { Reference, Banked, Fused };
  Path path = Path::Reference;
  std::vector<Bank> banks;  // Banked and Fused paths of the matrix algorithms
  // Muon/NorMuon's fused path, per bank: the NS input written by the momentum kernel in this
  // dtype (one pass; nullopt: momentum into an fp32 stack, then the scaled cast), and whether
  // the update is folded into the last NS product.
  struct MuonBank {
    std::optional<at::ScalarType> one_pass_input;
    bool fold = false;
  };
  std::vector<MuonBank> muon;
};

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


  explicit OptimizerImpl(std::vector<ParamGroup> g);

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
  at::Tensor weights(size_t g, size_t i) { return weight_storage(g, i).to(optim_core::work_dtype(groups[g].params[i])); }

  // ---- plan.cpp
  // `all`: plan every param as if it had a gradient (Optimizer::plan()); else the active ones.
  GroupPlan plan_group(size_t g, const std::vector<size_t>& idx) const;
  BankPlan describe(size_t g, const GroupPlan& plan, size_t bank) const;
  // Whether orthopt's multi-tensor kernels take param i of group g, its gradient (or, without
  // one, a gradient like the param) and its state (the state it will get, before the first step).
  bool kernels_take(size_t g, size_t i) const;
  // Whether the CPU update loops (AdamW, Lion; cpu_loops.h) take param i of group g, its
  // gradient and its state (present or to be made).
  bool cpu_loops_take(size_t g, size_t i) const;

  // ---- core.cpp
  StateDict& state_of(size_t g, size_t i);
  at::Tensor initial_q(size_t g, size_t i, const std::vector<int64_t>& sizes);
  std::vector<size_t> active(size_t g);
  at::Tensor weight_storage(size_t g, size_t i);
  void write_weights(size_t g, size_t i, const at::Tensor& W_new);
  void write_weights_bank(size_t g, const Bank& b, const at::Tensor& W_new, const at::Tensor& W_old);
  void write_weights_bank(size_t g, const Bank& b, const at::Tensor& W_new, const at::Tensor& W_old,
                          const at::Tensor& gate);
  at::Tensor grad_of(size_t g, size_t i);
  std::vector<Bank> banks(size_t g, const std::vector<size_t>& idx) const;
  bool banks_used(size_t g, const std::vector<size_t>& idx) const;
  std::vector<at::Tensor> bank_state(size_t g, const Bank& b, const char* name);
  at::Tensor owned_bank(size_t g, const Bank& b, const char* name, int64_t cols, at::ScalarType dtype);
  at::Tensor owned_bank(size_t g, const Bank& b, const char* name, int64_t rows, int64_t cols,
                        at::ScalarType dtype);
  static OrthoOptions batch_ortho_options(const OrthoOptions& opt);
  static std::vector<at::Tensor> orthogonalize_all(const std::vector<at::Tensor>& mats, const OrthoOptions& opt);
  static std::pair<at::Tensor, double> adjust_rows(const at::Tensor& U, const GroupOptions& o);
  void enqueue_step();
  std::vector<std::vector<StateDict>> prepare_states(const std::vector<std::vector<StateDict>>& states) const;

  // ---- muon.cpp
  void step_muon(size_t g, const at::Tensor& lr);
#ifdef ORTHOPT_WITH_CUDA
  void step_muon_fused(size_t g, const std::vector<size_t>& idx, const GroupPlan& plan, const at::Tensor& lr);
#endif

  // ---- normuon.cpp
  at::Tensor normuon_bank(size_t g, const Bank& b, const at::Tensor& U);
  at::Tensor normuon_bank_factors(size_t g, const Bank& b, const at::Tensor& U);
  std::vector<at::Tensor> orthogonalize_normuon_banks(size_t g, const std::vector<size_t>& idx,
                                                      const std::vector<at::Tensor>& mats);

  // ---- dion3.cpp
  static double dion3_lr_factor(const GroupOptions& o, int64_t rows, int64_t cols);
  void step_dion3(size_t g, const at::Tensor& lr);
  void step_dion3_reference(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr);

  // ---- dion2.cpp
  void step_dion2(size_t g, const at::Tensor& lr);

  // ---- dion.cpp
  void step_dion(size_t g, const at::Tensor& lr);
  void step_dion_banks(size_t g, const std::vector<size_t>& idx, const GroupPlan& plan, const at::Tensor& lr);
  void finish_step();
  void step_dion_reference(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr);

  // ---- adamw.cpp
  void step_adamw(size_t g, const at::Tensor& lr);
  void step_adamw_fused(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr);

  // ---- lion.cpp
  void step_lion(size_t g, const at::Tensor& lr);
  void step_lion_fused(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr);

#ifdef ORTHOPT_WITH_CUDA
  // ---- core.cpp: the fused multi-tensor path
  void add_weights(size_t g, size_t i, std::vector<at::Tensor>& weights, std::vector<at::Tensor>& copies);
#endif
};

}  // namespace orthopt

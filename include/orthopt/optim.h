#pragma once
// Muon-family and scalar optimizers (algorithms.md §2–7, §9): one optimizer object holds
// groups of different algorithms, like the dion package.
//
// CONTRACT used by the trainer (src/train) and the distributed layer (src/distributed); the
// implementation lives in src/optim. Change this surface only together with its users.

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "orthopt/orthogonalize.h"
#include "orthopt/plan.h"

namespace orthopt {

// Dion2: Dion3's selection and error feedback without NorMuon's normalization (dion's Dion2),
// selecting along the shorter side (rows when rows <= cols, else columns).
enum class Algorithm { Muon, NorMuon, Dion3, Dion, AdamW, Lion, Dion2 };
enum class MomentumStyle { Accumulate, Ema };                 // M <- μM + G  |  M <- μM + (1-μ)G
enum class LrAdjust { SpectralNorm, Jordan, RmsNorm, None };  // algorithms.md §2
// How Dion orthonormalizes P = M·Q (algorithms.md §6). Householder: the fp32 QR of the contract
// (LAPACK / cuSOLVER), the default. Cholesky: Cholesky QR2 in fp64 (G = PᵀP, P·R⁻¹ twice), a few
// batched products instead of a column-sequential factorization; a matrix whose Cholesky fails
// (rank-deficient or non-finite P) takes the Householder QR instead, decided once per group
// step (one host synchronization). The same column space and, for full-rank P, the same Q up to
// column signs, which leave Dion's update unchanged (P·Qᵀ and P·Rᵀ are sign-invariant).
enum class DionQr { Householder, Cholesky };

const char* to_string(Algorithm a);
Algorithm parse_algorithm(const std::string& s);  // muon | normuon | dion3 | dion2 | dion | adamw | lion
const char* to_string(LrAdjust a);
LrAdjust parse_lr_adjust(const std::string& s);   // spectral_norm | jordan | rms_norm | none
                                                  // (torch's names original | match_rms_adamw too)
const char* to_string(MomentumStyle m);
const char* to_string(DionQr q);
DionQr parse_dion_qr(const std::string& s);       // householder | cholesky
MomentumStyle parse_momentum_style(const std::string& s);  // accumulate | ema
bool is_matrix_algorithm(Algorithm a);            // muon, normuon, dion3, dion2, dion

// Every option of every algorithm; a group uses those of its algorithm. Defaults follow
// algorithms.md (dion's defaults for the matrix optimizers).
struct GroupOptions {
  Algorithm algorithm = Algorithm::Muon;
  double lr = 0.01;
  double weight_decay = 0.01;
  bool cautious_weight_decay = false;  // decay only where W·U >= 0 (AdamW: same sign)
  // matrix optimizers
  double momentum = 0.95;  // μ
  MomentumStyle momentum_style = MomentumStyle::Accumulate;
  bool nesterov = false;
  LrAdjust lr_adjust = LrAdjust::SpectralNorm;
  OrthoOptions ortho;          // schedule, steps, method, compute dtype, split_sizes, flatten
  double normuon_beta2 = 0.95; // NorMuon / Dion3 row variance
  double normuon_eps = 1e-8;
  double fraction = 0.25;      // Dion3 row fraction f (Dion2: of the shorter side)
  bool scale_lr_by_fraction = false;  // Dion3, Dion2: lr / sqrt(f)
  double rank_fraction = 0.25; // Dion
  DionQr dion_qr = DionQr::Householder;  // Dion's orthonormalization of P
  // scalar optimizers (AdamW, Lion)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  // bf16/fp16 parameters keep an fp32 master copy in the optimizer state
  bool master_weights = false;
};

struct ParamGroup {
  std::vector<at::Tensor> params;
  std::vector<std::string> names;  // empty, or one per param (used in error messages)
  GroupOptions options;
};

// Part of a parameter's initial Dion Q taken from another parameter (Optimizer::set_initial_q_sources).
struct QSource {
  size_t group = 0, index = 0;        // a parameter of the original (single-process) groups
  std::vector<int64_t> matrix_sizes;  // its matrix view [..., m, n] (with `flatten`: [size0, prod(rest)])
  int64_t begin = 0, end = 0;         // its matrices [begin, end), leading dims flattened
};

// How errors name a parameter: "parameter 'name' (group g)", or by index without a name.
std::string param_label(const ParamGroup& g, size_t group, size_t index);

class OptimizerImpl;

class Optimizer {
 public:
  // Validates everything (shapes against the algorithm, options, duplicates across groups,
  // split sizes) and throws c10::Error naming the parameter and the option: c10::ValueError
  // for a bad value (out-of-range option, unknown name, wrong shape or device), c10::TypeError
  // for a wrong kind of tensor (not floating point, sparse).
  explicit Optimizer(std::vector<ParamGroup> groups);
  ~Optimizer();
  Optimizer(Optimizer&&) noexcept;
  Optimizer& operator=(Optimizer&&) noexcept;

  // One step over every parameter that has a gradient (params with undefined grad are
  // skipped). Same-shaped matrices in a group are orthogonalized in one batched call.
  void step();
  // step() in its two parts, for a CUDA graph (CudaGraphOptimizer captures enqueue_step() and
  // calls finish_step() after each replay). enqueue_step() queues the step on the device
  // without a host synchronization, except on the per-parameter reference paths of Dion with
  // dion_qr = cholesky (the CPU; execution banks=off or kernels=off). finish_step() does what needs the
  // host: where Dion's Cholesky QR2 failed in a bank (which enqueue_step() then left as it
  // was), one synchronization reads it and the bank's params take their step through the
  // reference path, with the Householder QR for the failed matrices. Without such banks
  // finish_step() returns at once.
  void enqueue_step();
  void finish_step();
  void zero_grad(bool set_to_none = true);

  const std::vector<ParamGroup>& param_groups() const;
  // Host-side change of a group's options (e.g. lr); validated like the constructor.
  void set_group_options(size_t group, const GroupOptions& options);

  // Time-varying hyperparameters as device tensors (0-d fp32 on the params' device),
  // read by step() without host synchronization (CUDA-graph friendly):
  //   lr_scale multiplies every group's lr (the schedule factor), default 1;
  //   skip_factor gates the update AND every state change: 0 leaves params and all
  //   state bit-identical (also with NaN gradients), any other value is a normal step.
  //   The gating (a `where` per write) is enabled by the first set_skip_factor call: make
  //   it before a CUDA-graph capture.
  void set_lr_scale(double factor);
  void set_skip_factor(const at::Tensor& factor);  // copied in place (0-d, any device)
  const at::Tensor& lr_scale() const;
  const at::Tensor& skip_factor() const;
  bool skip_gating() const;    // whether set_skip_factor has enabled the gating
  int64_t step_count() const;  // optimizer steps taken (skipped steps do not count)
  // Dion with dion_qr = cholesky: parameter updates whose Cholesky QR failed and took the
  // Householder QR instead, since construction (not saved).
  int64_t dion_qr_fallbacks() const;

  // Full state (per-param state, step counters, device hyperparameters) through torch
  // serialization. load() checks algorithm, group structure and shapes first and throws
  // without changing anything on a mismatch.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

  // Bytes of optimizer state held (for the memory-per-rank checks of the distributed layer).
  int64_t state_bytes() const;
  // The execution plan of a step over every parameter (orthopt/plan.h): per group and bank the
  // path, the orthogonalization, the fused kernels and estimates of the work.
  StepPlan plan() const;

  // Per-parameter state (name -> tensor; empty before the parameter's first step). The
  // tensors are the live state: steps update them in place. Names per algorithm:
  //   muon, dion2: momentum | normuon, dion3: momentum, variance [..., rows, 1] fp32 |
  //   dion: momentum, Q [..., cols, r] fp32 | adamw: exp_avg, exp_avg_sq, step (0-d fp32) |
  //   lion: exp_avg | any, with master weights: master (fp32).
  using StateDict = std::map<std::string, at::Tensor>;
  const StateDict& param_state(size_t group, size_t index) const;
  // Counts the times state tensors were replaced by others (load_param_states, and the first
  // Dion3 step on a GPU, which moves a bank's momenta into one buffer and leaves each param's
  // momentum a view of it). Whoever keeps references to state tensors re-reads them on a change.
  int64_t state_version() const;
  // Replaces the state of every parameter (outer index: group, inner: param; an empty map
  // leaves a parameter without state). Validates names and shapes of everything first and
  // throws without changing anything on a mismatch; values are copied (cast to the state's
  // dtype, moved to the parameter's device).
  void load_param_states(const std::vector<std::vector<StateDict>>& states);

  // Dion's Q starts random, drawn per (group, index) of this optimizer. A parameter that holds
  // matrices of other parameters (a shard of the distributed layer) takes theirs instead: its
  // initial Q becomes the concatenation over `sources` of matrices [begin, end) of the initial Q
  // that a single-process Optimizer gives parameter (group, index) of the original groups, so
  // the shards start exactly where the single process does. Used whenever the state is created
  // (first step, or a step after loading an empty state); loaded state wins. Checked against
  // the parameter (a Dion group, same m×n, matrix count); not saved (the caller sets it again).
  void set_initial_q_sources(size_t group, size_t index, std::vector<QSource> sources);

 private:
  std::unique_ptr<OptimizerImpl> impl_;
};

// Routing helper (algorithms.md §7): 2-D weights inside blocks and 3-D expert stacks go to
// a matrix group with `matrix` options; embeddings, the output head and 1-D params go to
// AdamW with `scalar` options (weight decay 0 for embeddings and head).
struct RoutingOptions {
  GroupOptions matrix;                     // algorithm: a matrix algorithm (default muon)
  GroupOptions scalar = [] { GroupOptions g; g.algorithm = Algorithm::AdamW; g.lr = 3e-3; g.weight_decay = 0.01; return g; }();
  std::vector<std::string> embedding_patterns = {"embed", "wte", "tok_emb"};  // substrings of names
  std::vector<std::string> head_patterns = {"lm_head", "head", "output"};
  // Name-pattern overrides (std::regex search on the name), first match wins.
  std::vector<std::pair<std::string, GroupOptions>> overrides;
};

std::vector<ParamGroup> route_params(const std::vector<std::pair<std::string, at::Tensor>>& named,
                                     const RoutingOptions& routing);

// The routing decision alone (the one definition route_params and the Python helper use):
// per parameter a slot, -1 frozen (requires_grad false), 0 matrix, 1 flattened >=4-D
// matrix, 2 scalar, 3 embedding/head (no weight decay), 4 + k the k-th override pattern.
enum RouteSlot : int { kRouteFrozen = -1, kRouteMatrix = 0, kRouteFlatten = 1, kRouteScalar = 2, kRouteNoDecay = 3,
                       kRouteOverride = 4 };
std::vector<int> route_slots(const std::vector<std::pair<std::string, at::Tensor>>& named,
                             const std::vector<std::string>& embedding_patterns,
                             const std::vector<std::string>& head_patterns,
                             const std::vector<std::string>& override_patterns);

}  // namespace orthopt

#pragma once
// Data-parallel training on PyTorch's c10d (ProcessGroupGloo on CPU, ProcessGroupNCCL on GPU,
// TCPStore rendezvous) with whole-matrix ownership and sharded optimizer state.
//
//   DistContext           rank, world size, the process group; every collective goes through it
//                         (blocking with a timeout, bytes counted per collective kind).
//   DistributedOptimizer  wraps the ParamGroups of a replicated model: gradients are
//                         reduce-scattered (average) so each rank owns whole matrices of every
//                         same-shape bank, a LOCAL orthopt::Optimizer steps only those (one batched
//                         call per bank), then parameters are all-gathered back into the model.
//   launch_local          spawns N local ranks of a command (the `--nproc N` launcher).
//
// docs/distributed.md explains the layout, the communication volume and the checkpoint format.

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "orthopt/optim.h"

namespace orthopt::dist {

struct DistOptions {
  // -1 / empty: read from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
  int rank = -1;
  int world_size = -1;
  std::string master_addr;
  int master_port = -1;
  // "gloo", "nccl", or "auto" (nccl when `device` is CUDA, else gloo).
  std::string backend = "auto";
  c10::Device device = c10::Device(c10::kCPU);
  // Bound on every rendezvous wait and collective: a dead or stuck peer makes the others throw
  // within about this long instead of hanging. Env ORTHOPT_DIST_TIMEOUT_S overrides when > 0.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

// Bytes per collective kind. `payload` is the size of the logical buffer the collective works on
// (the full buffer for reduce-scatter/all-gather/all-reduce); `wire` is what one rank sends with
// a bandwidth-optimal ring algorithm: (N-1)/N·payload for reduce-scatter and all-gather,
// 2(N-1)/N·payload for all-reduce, payload for a broadcast root's tree/pipeline.
struct CollectiveStats {
  int64_t calls = 0;
  int64_t payload_bytes = 0;
  int64_t wire_bytes = 0;
};
using CommStats = std::map<std::string, CollectiveStats>;  // "reduce_scatter", "all_gather", ...

class DistContext {
 public:
  // Rendezvous through a TCPStore on MASTER_ADDR:MASTER_PORT (rank 0 hosts it) and creates the
  // process group. Throws c10::Error naming the variable/option on bad input, and on timeout.
  explicit DistContext(DistOptions options = {});
  ~DistContext();
  DistContext(const DistContext&) = delete;
  DistContext& operator=(const DistContext&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& backend() const { return backend_; }
  c10::Device device() const { return options_.device; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }

  // Collectives (blocking; throw c10::Error naming the collective on failure or timeout).
  // `full` holds world_size equal contiguous chunks; rank r's chunk is full[r·C, (r+1)·C).
  void all_reduce_sum(at::Tensor& tensor);
  // chunk <- sum over ranks of their full[rank·C ...]; on Gloo (no reduce-scatter in c10d's Gloo
  // 1.13) an all-reduce of `full` followed by a local slice: twice the wire bytes (counted so).
  void reduce_scatter_sum(at::Tensor& full, at::Tensor& chunk);
  // full <- concatenation of every rank's chunk (chunk may alias full's own chunk).
  void all_gather(at::Tensor& chunk, at::Tensor& full);
  void broadcast(at::Tensor& tensor, int root);
  void barrier();

  // Every rank passes its own `value`; throws on every rank, naming `what` and the ranks whose
  // value differs from rank 0's, when they are not all equal. Uses the store (no tensor traffic).
  void check_same_on_all_ranks(const std::string& what, const std::string& value);

  const CommStats& comm_stats() const { return stats_; }
  void reset_comm_stats() { stats_.clear(); }

  struct Impl;  // c10d objects (version-specific types stay in src/distributed)

 private:
  void count(const char* kind, int64_t payload, int64_t wire);

  DistOptions options_;
  int rank_ = 0;
  int world_size_ = 1;
  std::string backend_;
  int64_t store_round_ = 0;  // makes store keys of successive checks unique
  CommStats stats_;
  std::unique_ptr<Impl> impl_;
};

// Format tag of a DistributedOptimizer shard (optim_shard_<r>.json) and of the Python engine's
// state_dict(), which holds the same content (docs/distributed.md, "Checkpoints").
inline constexpr char kShardFormat[] = "orthopt.dist.shard.v1";

// Where one local parameter of the owning rank comes from (also written into checkpoints so a
// different world size can re-shard the state).
struct ShardPiece {
  size_t group = 0;        // index into the original ParamGroups
  bool is_bank = true;     // bank of same-shape matrices, or the group's flat scalar buffer
  int64_t rows = 0, cols = 0;  // matrix shape of the bank (banks only)
  int64_t begin = 0, end = 0;  // global range this rank owns: matrices of the bank, or elements
  int64_t local_index = -1;    // index of the param in the local optimizer's group, -1 if empty
};

// The flat-buffer layout of a DistributedOptimizer: identical on every rank, a function of the
// groups' algorithms, their `flatten` options, the parameter shapes and the world size N
// (docs/distributed.md, "Layout"). python/orthopt/dist.py reads it through orthopt._C.dist_layout.
struct LayoutSegment {  // one bank of same-shape matrices or one scalar group's flat vector
  size_t group = 0;
  bool is_bank = true;
  int64_t rows = 0, cols = 0;  // banks
  int64_t units = 0;           // matrices (banks) or elements (scalars), before padding
  int64_t per_rank = 0;        // units per rank after padding (block size P = ceil(units / N))
  int64_t chunk_offset = 0;    // offset of this segment inside every rank's chunk
  int world = 1;
  int shift = 0;               // block j is owned by rank (j + shift) % N: spreads remainders
  int64_t unit_numel() const { return is_bank ? rows * cols : 1; }
  int64_t block_of(int r) const { return (r - shift + world) % world; }
  int owner_of_block(int64_t j) const { return static_cast<int>((j + shift) % world); }
  int64_t owned_begin(int r) const { return std::min(units, block_of(r) * per_rank); }
  int64_t owned_end(int r) const { return std::min(units, (block_of(r) + 1) * per_rank); }
};

// Units [first_unit, first_unit + count) of a segment come from parameter `param` of its group.
struct LayoutMember {
  size_t segment = 0, param = 0;
  int64_t first_unit = 0, count = 0;
};

// A contiguous run of elements copied between a model parameter and the [N·chunk] flat buffers.
struct LayoutRun {
  size_t group = 0, param = 0;
  int64_t param_offset = 0;  // in the param's flattened elements
  int64_t flat_offset = 0;   // in the [N·chunk] flat buffer
  int64_t count = 0;
  int owner = 0;
};

struct Layout {
  int world_size = 1;
  std::vector<LayoutSegment> segments;
  std::vector<LayoutMember> members;  // in segment order of units
  std::vector<LayoutRun> runs;        // per member, in unit order
  int64_t chunk = 0;                  // flat elements per rank, padding included
};

// The layout for `groups` on `world_size` ranks (tensors are read for shapes only: meta tensors
// work). Throws c10::Error naming the parameter when a matrix group holds a param with < 2 dims.
Layout build_layout(const std::vector<ParamGroup>& groups, int world_size);

class DistributedOptimizer {
 public:
  // `groups` hold the (replicated) model parameters. Parameters are broadcast from rank 0 so all
  // ranks start identical; configurations (algorithms, options, shapes) are compared across ranks
  // and a mismatch throws on every rank.
  DistributedOptimizer(std::vector<ParamGroup> groups, std::shared_ptr<DistContext> ctx);
  ~DistributedOptimizer();

  // Every parameter must have a gradient (the local gradients of this rank's micro-batch; they
  // are averaged over ranks). Reduce-scatter, local step on owned matrices, all-gather.
  // Same as reduce_gradients() followed by apply_update().
  void step();
  // The two halves of step(), for a trainer that clips or guards on the global gradient:
  // reduce_gradients() averages the gradients over ranks into the owned shard and returns the
  // global gradient norm (0-d fp32 on the device, the same on every rank; one extra scalar
  // all-reduce). owned_params() are the local optimizer's parameters whose .grad are the
  // reduced shard: scale them (e.g. train's clip_grad_norm(owned_params(), max, norm)) before
  // apply_update() runs the local step and the all-gather.
  at::Tensor reduce_gradients();
  std::vector<at::Tensor> owned_params() const;
  void apply_update();
  void zero_grad(bool set_to_none = true);

  void set_lr_scale(double factor);
  // Must be the same on every rank (e.g. computed from all-reduced loss/grad norms).
  void set_skip_factor(const at::Tensor& factor);
  void set_group_options(size_t group, const GroupOptions& options);
  // Steps taken (a step with skip factor 0 does not count); kept here, not in the local
  // optimizer, because a rank may own nothing.
  int64_t step_count() const;

  // Optimizer state held by THIS rank (≈ total/N).
  int64_t state_bytes() const;
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const std::vector<ShardPiece>& owned_pieces() const { return pieces_; }
  DistContext& context() { return *ctx_; }

  // Checkpoint shard of this rank: `dir`/optim_shard_<rank>.pt (local optimizer state) and
  // `dir`/optim_shard_<rank>.json (layout). Collective-free.
  void save_shard(const std::string& dir) const;
  // Loads the shards of a checkpoint written with any world size (re-shards when it differs).
  // Checks group structure and shapes first; throws without changing anything on a mismatch.
  void load_shards(const std::string& dir);

  // Bytes per step this rank puts on the wire (ring model) for its gradient reduce-scatter and
  // parameter all-gather, computed from the layout (the measured counts are in comm_stats()).
  int64_t flat_elements_per_rank() const { return chunk_; }

 private:
  void pack_grads();
  void pack_owned_params();
  void unpack_params();
  std::vector<int64_t> segment_units() const;  // matrices or elements per segment
  std::unique_ptr<Optimizer> build_local();  // over pieces_ (views into the own chunk)

  std::vector<ParamGroup> groups_;
  std::shared_ptr<DistContext> ctx_;
  std::unique_ptr<Layout> layout_;
  std::vector<ShardPiece> pieces_;
  int64_t chunk_ = 0;            // flat elements per rank
  at::Tensor grad_flat_, param_flat_;  // [world · chunk]
  std::unique_ptr<Optimizer> local_;   // null when this rank owns nothing
  std::vector<GroupOptions> group_options_;
  std::vector<int> local_group_of_;    // original group -> local optimizer group, -1 if none
  double lr_scale_ = 1.0;
  at::Tensor skip_factor_;   // 0-d fp32 on the params' device
  at::Tensor steps_t_;       // 0-d int64 on the params' device (no host sync per step)
  bool reduced_ = false;     // reduce_gradients() done, apply_update() pending
};

// The layout a DistributedOptimizer would use for `groups` on `world_size` ranks, without
// creating anything (tensors are read for shapes only: meta tensors work). For the
// communication/compute model of docs/distributed.md and `orthopt dist-plan`.
struct LayoutPlan {
  int world_size = 1;
  int64_t real_elements = 0;   // parameter elements
  int64_t chunk_elements = 0;  // flat elements per rank, padding included; the reduce-scatter
                               // and all-gather each move world_size·chunk_elements elements
  std::vector<int64_t> owned_elements;  // per rank (no padding)
  std::vector<double> ns_flops;         // per rank and step: Newton–Schulz FLOPs of the owned
                                        // matrices (dense count of the method used; Dion: 0)
};
LayoutPlan plan_layout(const std::vector<ParamGroup>& groups, int world_size);

// Writes a sharded checkpoint directory: every rank calls it; each writes its optimizer shard
// into `final_dir`.tmp/, `extra` (if set) runs on rank 0 after a barrier to add its own files
// (model, metadata), then rank 0 publishes by renaming to `final_dir` and a last barrier lets
// everyone see it. An existing `final_dir` is refused unless `overwrite`; replaced, it stays whole
// under `final_dir`.old until the new one is published.
void save_sharded_checkpoint(DistributedOptimizer& opt, const std::string& final_dir,
                             const std::function<void(const std::string& tmp_dir)>& extra = {},
                             bool overwrite = false);

// Spawns `nproc` copies of argv (argv[0] is a path or a name on PATH) with RANK, LOCAL_RANK,
// WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT set; waits for all. Unless
// requested_threads() gives a count, each rank also gets ORTHOPT_NUM_THREADS =
// threads_per_local_rank(default_intra_op_threads(available_cores(), blas_threading()), nproc):
// the ranks share what init_runtime would give one process instead of each taking all of it. When one exits non-zero or by a signal, the others get SIGTERM (SIGKILL
// after `grace`), a message names the failing rank on stderr, and the return value is non-zero
// (that rank's exit code, or 128+signal).
int launch_local(int nproc, const std::vector<std::string>& argv,
                 std::chrono::milliseconds grace = std::chrono::seconds(5));

// torch threads for each of `nproc` local ranks sharing `threads`: threads / nproc, at least 1.
// (2 cores, 2 ranks of 40 `orthopt train` steps: 12.7 s with 1 thread each, 19.0 s with 2.)
int threads_per_local_rank(int threads, int nproc);

// Whether this build can create the c10d backend "gloo" (needs gloo headers at build time:
// Debian's libgloo-dev; pip torch ships none) or "nccl" (CUDA build with nccl.h).
bool backend_available(const std::string& backend);

// This process's command line (from /proc/self/cmdline, argv[0] replaced by /proc/self/exe)
// without the options in `drop` and their values ("--nproc 4" and "--nproc=4" alike): what
// a `--nproc N` command hands to launch_local to start its ranks.
std::vector<std::string> relaunch_argv(const std::vector<std::string>& drop);

// A free TCP port on 127.0.0.1 (bound and released; another process may take it meanwhile).
int find_free_port();

}  // namespace orthopt::dist

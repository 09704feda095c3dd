// DistContext: environment parsing, rendezvous, collectives with byte accounting and errors
// that name the collective and the rank.
#include <c10/util/Exception.h>

#include <cstdlib>
#include <exception>
#include <string>

#include "distributed/c10d_compat.h"
#include "orthopt/distributed.h"

namespace orthopt::dist {

struct DistContext::Impl {
  std::unique_ptr<detail::C10dGroup> group;
};

namespace {

// Integer from an environment variable; `fallback` when unset. Throws naming the variable.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  TORCH_CHECK(end && *end == '\0', "environment variable ", name, "='", v, "' is not an integer");
  return static_cast<int>(x);
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

// Runs one c10d call and turns any failure into a c10::Error saying what and where.
template <class F>
void guarded(const char* what, int rank, int world, F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "distributed ", what, " failed on rank ", rank, " of ", world,
                " (a peer rank died, diverged or timed out): ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "distributed ", what, " failed on rank ", rank, " of ", world,
                " (a peer rank died, diverged or timed out): ", e.what());
  }
}

}  // namespace

DistContext::DistContext(DistOptions options) : options_(std::move(options)), impl_(new Impl) {
  rank_ = options_.rank >= 0 ? options_.rank : env_int("RANK", -1);
  world_size_ = options_.world_size >= 0 ? options_.world_size : env_int("WORLD_SIZE", -1);
  TORCH_CHECK(world_size_ >= 1, "WORLD_SIZE (or DistOptions::world_size) must be >= 1, got ",
              world_size_);
  TORCH_CHECK(rank_ >= 0 && rank_ < world_size_, "RANK (or DistOptions::rank) must be in [0, ",
              world_size_, "), got ", rank_);
  std::string addr = options_.master_addr.empty() ? env_str("MASTER_ADDR", "") : options_.master_addr;
  int port = options_.master_port >= 0 ? options_.master_port : env_int("MASTER_PORT", -1);
  TORCH_CHECK(!addr.empty(), "MASTER_ADDR (or DistOptions::master_addr) is not set");
  TORCH_CHECK(port > 0 && port < 65536, "MASTER_PORT (or DistOptions::master_port) must be in "
              "[1, 65535], got ", port);
  int timeout_s = env_int("ORTHOPT_DIST_TIMEOUT_S", 0);
  if (timeout_s > 0) options_.timeout = std::chrono::seconds(timeout_s);
  TORCH_CHECK(options_.timeout.count() > 0, "DistOptions::timeout must be positive");

  backend_ = options_.backend;
  if (backend_ == "auto") backend_ = options_.device.is_cuda() ? "nccl" : "gloo";
  TORCH_CHECK(backend_ == "gloo" || backend_ == "nccl",
              "DistOptions::backend must be gloo, nccl or auto, got '", options_.backend, "'");
  TORCH_CHECK(detail::backend_available(backend_), "DistOptions::backend '", backend_,
              "' is not available in this build");
  TORCH_CHECK(backend_ != "nccl" || options_.device.is_cuda(),
              "backend nccl needs a CUDA device, got ", options_.device.str());

  detail::C10dSetup setup;
  setup.master_addr = addr;
  setup.master_port = port;
  setup.rank = rank_;
  setup.world_size = world_size_;
  setup.backend = backend_;
  setup.device = options_.device;
  setup.timeout = options_.timeout;
  guarded("rendezvous", rank_, world_size_, [&] { impl_->group = detail::make_c10d_group(setup); });
}

DistContext::~DistContext() = default;

bool backend_available(const std::string& backend) { return detail::backend_available(backend); }

void DistContext::count(const char* kind, int64_t payload, int64_t wire) {
  auto& s = stats_[kind];
  s.calls += 1;
  s.payload_bytes += payload;
  s.wire_bytes += wire;
}

void DistContext::all_reduce_sum(at::Tensor& tensor) {
  TORCH_CHECK(tensor.is_contiguous(), "all_reduce_sum: tensor must be contiguous");
  const int64_t bytes = tensor.numel() * tensor.element_size();
  guarded("all_reduce", rank_, world_size_, [&] {
    if (world_size_ > 1) impl_->group->all_reduce_sum(tensor);
  });
  count("all_reduce", bytes, 2 * (world_size_ - 1) * bytes / world_size_);
}

void DistContext::reduce_scatter_sum(at::Tensor& full, at::Tensor& chunk) {
  TORCH_CHECK(full.is_contiguous() && chunk.is_contiguous(),
              "reduce_scatter_sum: tensors must be contiguous");
  TORCH_CHECK(full.numel() == chunk.numel() * world_size_, "reduce_scatter_sum: full has ",
              full.numel(), " elements, expected world_size·chunk = ", chunk.numel() * world_size_);
  const int64_t bytes = full.numel() * full.element_size();
  if (world_size_ == 1) {
    if (chunk.data_ptr() != full.data_ptr()) chunk.copy_(full);
    count("reduce_scatter", bytes, 0);
    return;
  }
  if (impl_->group->has_reduce_scatter()) {
    guarded("reduce_scatter", rank_, world_size_, [&] { impl_->group->reduce_scatter_sum(full, chunk); });
    count("reduce_scatter", bytes, (world_size_ - 1) * bytes / world_size_);
  } else {
    // Gloo: all-reduce the whole buffer, keep our chunk. Twice the ring traffic of a true
    // reduce-scatter; counted under its own name so the report can say so.
    guarded("reduce_scatter (all_reduce)", rank_, world_size_, [&] { impl_->group->all_reduce_sum(full); });
    auto own = full.narrow(0, rank_ * chunk.numel(), chunk.numel());
    if (own.data_ptr() != chunk.data_ptr()) chunk.copy_(own);
    count("reduce_scatter_via_all_reduce", bytes, 2 * (world_size_ - 1) * bytes / world_size_);
  }
}

void DistContext::all_gather(at::Tensor& chunk, at::Tensor& full) {
  TORCH_CHECK(full.is_contiguous() && chunk.is_contiguous(), "all_gather: tensors must be contiguous");
  TORCH_CHECK(full.numel() == chunk.numel() * world_size_, "all_gather: full has ", full.numel(),
              " elements, expected world_size·chunk = ", chunk.numel() * world_size_);
  const int64_t bytes = full.numel() * full.element_size();
  if (world_size_ == 1) {
    if (chunk.data_ptr() != full.data_ptr()) full.copy_(chunk);
  } else {
    guarded("all_gather", rank_, world_size_, [&] { impl_->group->all_gather(chunk, full); });
  }
  count("all_gather", bytes, (world_size_ - 1) * bytes / world_size_);
}

void DistContext::broadcast(at::Tensor& tensor, int root) {
  TORCH_CHECK(root >= 0 && root < world_size_, "broadcast: root ", root, " out of range");
  const int64_t bytes = tensor.numel() * tensor.element_size();
  guarded("broadcast", rank_, world_size_, [&] {
    if (world_size_ > 1) impl_->group->broadcast(tensor, root);
  });
  count("broadcast", bytes, rank_ == root && world_size_ > 1 ? bytes : 0);
}

void DistContext::barrier() {
  guarded("barrier", rank_, world_size_, [&] {
    if (world_size_ > 1) impl_->group->barrier();
  });
  count("barrier", 0, 0);
}

void DistContext::check_same_on_all_ranks(const std::string& what, const std::string& value) {
  const std::string prefix = "orthopt/check/" + std::to_string(store_round_++) + "/" + what + "/";
  std::vector<std::string> values(world_size_);
  guarded("consistency check", rank_, world_size_, [&] {
    impl_->group->store_set(prefix + std::to_string(rank_), value);
    for (int r = 0; r < world_size_; ++r) values[r] = impl_->group->store_get(prefix + std::to_string(r));
    // Rank 0 hosts the store: it waits until everyone has read, so a rank that throws below
    // cannot take the store away from the others' reads.
    impl_->group->store_set(prefix + "read/" + std::to_string(rank_), "1");
    if (rank_ == 0)
      for (int r = 0; r < world_size_; ++r) impl_->group->store_get(prefix + "read/" + std::to_string(r));
  });
  int first = -1;
  std::string differ;
  for (int r = 1; r < world_size_; ++r) {
    if (values[r] == values[0]) continue;
    if (first < 0) first = r;
    differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  if (first < 0) return;
  // Show where the first disagreeing rank's value departs from rank 0's.
  const std::string& a = values[0];
  const std::string& b = values[first];
  size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  const size_t from = at > 40 ? at - 40 : 0;
  TORCH_CHECK(false, what, " differs across ranks: rank(s) ", differ, " disagree with rank 0 (this is rank ",
              rank_, "); first difference at character ", at, ": rank 0 has '...", a.substr(from, 100),
              "', rank ", first, " has '...", b.substr(from, 100), "'");
}

}  // namespace orthopt::dist

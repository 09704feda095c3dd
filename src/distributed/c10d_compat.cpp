// c10d glue for libtorch 1.13 and torch 2.x (see c10d_compat.h). Everything version-specific
// is in the `#if TORCH_VERSION_MAJOR` blocks at the top; the rest is shared.
#include "distributed/c10d_compat.h"

#include <torch/version.h>

#if __has_include(<gloo/config.h>)
#define ORTHOPT_HAVE_GLOO 1
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#if defined(ORTHOPT_WITH_CUDA) && __has_include(<nccl.h>)
#define ORTHOPT_HAVE_NCCL 1
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

// Declares c10d::Backend (2.x) / c10d::ProcessGroup (1.13), Work and the option structs even
// when neither backend header is usable (a CPU-only build without gloo headers).
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <vector>

namespace orthopt::dist::detail {
namespace {

#if TORCH_VERSION_MAJOR >= 2
// torch 2.x: concrete process groups (Gloo, NCCL) are c10d::Backend objects.
using GroupHandle = c10::intrusive_ptr<c10d::Backend>;
#else
// libtorch 1.13: they are c10d::ProcessGroup objects.
using GroupHandle = c10::intrusive_ptr<c10d::ProcessGroup>;
#endif

#ifdef ORTHOPT_HAVE_GLOO  // only Gloo's device choice asks (an unused function warns otherwise)
bool is_loopback(const std::string& addr) {
  return addr == "127.0.0.1" || addr == "localhost" || addr == "::1";
}
#endif

void wait_work(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout) {
  work->wait(timeout);  // throws on timeout and rethrows the collective's own error
}

class Group final : public C10dGroup {
 public:
  explicit Group(const C10dSetup& s) : timeout_(s.timeout) {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(s.master_port);
    so.isServer = (s.rank == 0);
    so.numWorkers = static_cast<std::size_t>(s.world_size);
    so.waitWorkers = true;  // the server waits (bounded by the timeout) until all ranks joined
    so.timeout = s.timeout;
    store_ = c10::make_intrusive<c10d::TCPStore>(s.master_addr, so);

    if (s.backend == "gloo") {
#ifdef ORTHOPT_HAVE_GLOO
      auto opts = c10d::ProcessGroupGloo::Options::create(s.timeout);
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      if (ifname && *ifname) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      } else if (is_loopback(s.master_addr)) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      opts->threads = 2;
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, s.rank, s.world_size, opts);
      native_reduce_scatter_ = false;  // c10d's Gloo lacks reduce_scatter in 1.13
#else
      TORCH_CHECK(false, "backend 'gloo': this build has no Gloo headers (install libgloo-dev)");
#endif
    } else if (s.backend == "nccl") {
#ifdef ORTHOPT_HAVE_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = s.timeout;
      group_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, s.rank, s.world_size, opts);
      native_reduce_scatter_ = true;
#else
      TORCH_CHECK(false, "backend 'nccl': this build has no CUDA/NCCL support");
#endif
    } else {
      TORCH_CHECK(false, "backend must be 'gloo' or 'nccl', got '", s.backend, "'");
    }
  }

  void store_set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string store_get(const std::string& key) override {
    store_->wait({key}, timeout_);
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }

  void all_reduce_sum(at::Tensor& t) override {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    wait_work(group_->allreduce(ts, o), timeout_);
  }

  bool has_reduce_scatter() const override { return native_reduce_scatter_; }

  void reduce_scatter_sum(at::Tensor& full, at::Tensor& chunk) override {
    TORCH_CHECK(native_reduce_scatter_, "reduce_scatter: not available on this backend");
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    wait_work(group_->_reduce_scatter_base(chunk, full, o), timeout_);
  }

  void all_gather(at::Tensor& chunk, at::Tensor& full) override {
    if (native_reduce_scatter_) {  // NCCL: one flat all-gather (in place when chunk aliases full)
      wait_work(group_->_allgather_base(full, chunk), timeout_);
      return;
    }
    // Gloo: the list form (1.13's Gloo has no _allgather_base); it copies into the views.
    const int64_t n = full.numel() / chunk.numel();
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int64_t r = 0; r < n; ++r) outs[0].push_back(full.narrow(0, r * chunk.numel(), chunk.numel()));
    std::vector<at::Tensor> ins{chunk};
    wait_work(group_->allgather(outs, ins), timeout_);
  }

  void broadcast(at::Tensor& t, int root) override {
    std::vector<at::Tensor> ts{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    wait_work(group_->broadcast(ts, o), timeout_);
  }

  void barrier() override { wait_work(group_->barrier(), timeout_); }

 private:
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  GroupHandle group_;
  bool native_reduce_scatter_ = false;
};

}  // namespace

std::unique_ptr<C10dGroup> make_c10d_group(const C10dSetup& setup) {
  return std::make_unique<Group>(setup);
}

bool backend_available(const std::string& backend) {
#ifdef ORTHOPT_HAVE_GLOO
  if (backend == "gloo") return true;
#endif
#ifdef ORTHOPT_HAVE_NCCL
  if (backend == "nccl") return true;
#endif
  return false;
}

}  // namespace orthopt::dist::detail

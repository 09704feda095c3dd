#pragma once
// The only place that touches c10d types. c10d's C++ surface changed between libtorch 1.13
// (Debian, CPU) and torch 2.x (GPU machine): process groups became Backends, option structs
// moved. c10d_compat.cpp hides that behind this small, version-free interface.

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>

namespace orthopt::dist::detail {

struct C10dSetup {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int world_size = 1;
  std::string backend;  // "gloo" | "nccl"
  c10::Device device = c10::Device(c10::kCPU);
  std::chrono::milliseconds timeout{120000};
};

// Rendezvous + process group. Every call blocks until done, throwing std::exception on failure
// or after `timeout`.
class C10dGroup {
 public:
  virtual ~C10dGroup() = default;
  virtual void store_set(const std::string& key, const std::string& value) = 0;
  virtual std::string store_get(const std::string& key) = 0;  // waits up to the timeout
  virtual void all_reduce_sum(at::Tensor& t) = 0;
  // true when the backend has a native reduce-scatter into a chunk (NCCL); false: caller
  // all-reduces and slices (Gloo).
  virtual bool has_reduce_scatter() const = 0;
  virtual void reduce_scatter_sum(at::Tensor& full, at::Tensor& chunk) = 0;
  virtual void all_gather(at::Tensor& chunk, at::Tensor& full) = 0;
  virtual void broadcast(at::Tensor& t, int root) = 0;
  virtual void barrier() = 0;
};

std::unique_ptr<C10dGroup> make_c10d_group(const C10dSetup& setup);

// Whether this build can create the backend (gloo needs gloo headers; nccl needs CUDA + NCCL).
bool backend_available(const std::string& backend);

}  // namespace orthopt::dist::detail

#pragma once
// Step guards (algorithms.md §9): global gradient norm and clipping, the skip-step-on-spike
// guard (device-side decision, no host sync) and the non-finite firewall (host-side).

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace orthopt::train {

// sqrt(Σ_i ‖grad_i‖²) over every parameter whose grad is defined, computed in fp32 (bf16/fp16
// grads are upcast) as one reduction on the params' device; returns a 0-d fp32 tensor without
// synchronizing with the host. No defined grads: 0. All grads must live on one device.
at::Tensor global_grad_norm(const std::vector<at::Tensor>& params);

// Scales every defined grad in place by min(1, max_norm / (total_norm + 1e-6)), all on the
// device (no host sync). max_norm <= 0 disables clipping. Returns the applied factor as a 0-d
// fp32 tensor (1 when not clipped) — NOT the norm; the caller already holds total_norm.
// A non-finite total_norm makes the grads non-finite: the firewall must skip such a step.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                          const at::Tensor& total_norm);

// Skip-step on loss / grad-norm spikes. Rolling windows (ring buffers on the device, fp64) of
// the last `window` finite observations of loss and grad norm. observe() returns a 0-d fp32
// device tensor: 1 = apply the step, 0 = skip. Once at least half a window is filled
// (2·count >= window) a step is skipped when loss > mean + σf·σ or grad_norm > mean + σf·σ,
// with mean and σ (population standard deviation, divisor n) over the window BEFORE the current
// value is added. Every finite value enters the window (also skipped spikes, so a lasting level
// shift is accepted as it fills the window); a non-finite value gives 0 and does not enter it.
// Everything runs on `device` with device-side counters and in-place state updates: no host
// sync, and capturable in a CUDA graph (load() also writes in place, so a captured graph stays valid).
// Construct it on the training device (inputs on another device are copied, which syncs).
class SpikeGuard {
 public:
  SpikeGuard(int64_t window = 128, double sigma_factor = 6.0, c10::Device device = c10::kCPU);

  at::Tensor observe(const at::Tensor& loss, const at::Tensor& grad_norm);

  // Host read of the current window statistics (same definition as observe uses), for logs and
  // the stability monitor. count = number of values in the window (<= window).
  struct Stats {
    double loss_mean, loss_std, gnorm_mean, gnorm_std;
    int64_t count;
  };
  Stats stats() const;

  int64_t window() const { return window_; }
  double sigma_factor() const { return sigma_factor_; }
  c10::Device device() const { return device_; }

  // Bit-exact resume. Keys are prefixed "spike_guard."; load checks window and sigma_factor
  // match this guard's (throws c10::Error otherwise) and moves the state to this guard's device.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  int64_t window_;
  double sigma_factor_;
  c10::Device device_;
  at::Tensor loss_window_;   // [window] fp64
  at::Tensor gnorm_window_;  // [window] fp64
  at::Tensor pushed_;        // 0-d int64: finite observations ever pushed (next slot = pushed % window)
};

// Thrown by NonFiniteFirewall::check once max_consecutive consecutive non-finite steps are seen.
class NonFiniteAbort : public std::runtime_error {
 public:
  NonFiniteAbort(int64_t step, int consecutive, int max_consecutive);
  int64_t step() const { return step_; }
  int consecutive() const { return consecutive_; }

 private:
  int64_t step_;
  int consecutive_;
};

// Host-side non-finite check of loss and grad norm: one host sync per call (both values are
// checked in one transfer). The trainer skips the step when check() returns false; the
// parameters and every optimizer/guard state must then stay untouched.
class NonFiniteFirewall {
 public:
  explicit NonFiniteFirewall(int max_consecutive = 5);  // >= 1, else c10::Error

  // true when loss and grad_norm are all finite (resets the consecutive count); false otherwise
  // (increments it). Throws NonFiniteAbort when the count reaches max_consecutive.
  bool check(const at::Tensor& loss, const at::Tensor& grad_norm, int64_t step);
  int consecutive() const { return consecutive_; }
  int max_consecutive() const { return max_consecutive_; }

  // Key "nonfinite_firewall.consecutive".
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  int max_consecutive_;
  int consecutive_ = 0;
};

}  // namespace orthopt::train

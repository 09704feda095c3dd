#include "orthopt/train/guards.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/torch_version.h"

namespace orthopt::train {

at::Tensor global_grad_norm(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> squares;
  std::vector<at::Tensor> cuda_fp32;  // reduced together, below
  c10::optional<c10::Device> device;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    TORCH_CHECK(!device || g.device() == *device,
                "global_grad_norm: all grads must be on one device; param ", i, " has its grad on ",
                g.device(), ", earlier ones on ", *device);
    device = g.device();
#if ORTHOPT_TORCH_AT_LEAST(2, 1)
    if (g.is_cuda() && g.scalar_type() == at::kFloat) {
      cuda_fp32.push_back(g);
      continue;
    }
#endif
    // ‖g‖² accumulated in fp32 (bf16/fp16 grads upcast inside the reduction).
    squares.push_back(at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kFloat).square());
  }
#if ORTHOPT_TORCH_AT_LEAST(2, 1)
  // fp32 grads on a GPU: one multi-tensor norm launch per chunk instead of one reduction per
  // parameter (the per-parameter loop was launch-bound); fp32 in, fp32 accumulation, fp32 out.
  if (!cuda_fp32.empty()) squares.push_back(at::stack(at::_foreach_norm(cuda_fp32, 2)).square().sum());
#endif
  if (squares.empty()) {
    const c10::Device dev = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
    return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(dev));
  }
  return at::stack(squares).sum().sqrt();
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm,
                          const at::Tensor& total_norm) {
  TORCH_CHECK(total_norm.defined() && total_norm.numel() == 1,
              "clip_grad_norm: total_norm must be a one-element tensor");
  TORCH_CHECK(!std::isnan(max_norm), "clip_grad_norm: max_norm must not be NaN");
  const at::Tensor norm = total_norm.reshape({}).to(at::kFloat);
  if (max_norm <= 0.0) return at::ones_like(norm);
  const at::Tensor factor = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
#if ORTHOPT_TORCH_AT_LEAST(2, 1)
  // One multi-tensor launch per chunk of grads rather than one kernel per parameter: on a GPU
  // the per-parameter loop was launch-bound.
  if (!grads.empty() && std::all_of(grads.begin(), grads.end(), [&](const at::Tensor& g) {
        return g.device() == grads[0].device() && g.scalar_type() == grads[0].scalar_type();
      })) {
    at::_foreach_mul_(grads, factor.to(grads[0].device(), grads[0].scalar_type()));
    return factor;
  }
#endif
  for (at::Tensor& g : grads) g.mul_(factor.to(g.device(), g.scalar_type()));
  return factor;
}

// ---------------------------------------------------------------- SpikeGuard

namespace {

struct WindowStats {
  at::Tensor mean, std;  // 0-d fp64 on the window's device
};

// Mean and population standard deviation of the first n entries of a ring buffer that is filled
// in slot order 0, 1, ..., window−1 and then overwritten in place, so the valid slots are exactly
// those with index < n. n is a device tensor: no host sync. n = 0 gives mean 0, std 0.
WindowStats window_stats(const at::Tensor& buffer, const at::Tensor& n) {
  const at::Tensor valid = at::arange(buffer.size(0), buffer.options().dtype(at::kLong)) < n;
  const at::Tensor count = n.to(at::kDouble).clamp_min(1.0);
  const at::Tensor mean = at::where(valid, buffer, at::zeros_like(buffer)).sum() / count;
  const at::Tensor centered = at::where(valid, buffer - mean, at::zeros_like(buffer));
  return {mean, (centered.square().sum() / count).sqrt()};
}

at::Tensor as_scalar(const at::Tensor& t, c10::Device device, const char* what) {
  TORCH_CHECK(t.defined() && t.numel() == 1, "SpikeGuard.observe: ", what,
              " must be a one-element tensor");
  return t.detach().reshape({}).to(device, at::kDouble);
}

}  // namespace

SpikeGuard::SpikeGuard(int64_t window, double sigma_factor, c10::Device device)
    : window_(window), sigma_factor_(sigma_factor), device_(device) {
  TORCH_CHECK(window >= 2, "SpikeGuard: window must be >= 2, got ", window);
  TORCH_CHECK(std::isfinite(sigma_factor) && sigma_factor > 0.0,
              "SpikeGuard: sigma_factor must be a finite positive number, got ", sigma_factor);
  const auto opts = at::TensorOptions().dtype(at::kDouble).device(device);
  loss_window_ = at::zeros({window}, opts);
  gnorm_window_ = at::zeros({window}, opts);
  pushed_ = at::zeros({}, opts.dtype(at::kLong));
}

at::Tensor SpikeGuard::observe(const at::Tensor& loss, const at::Tensor& grad_norm) {
  const at::Tensor l = as_scalar(loss, device_, "loss");
  const at::Tensor g = as_scalar(grad_norm, device_, "grad_norm");
  const at::Tensor finite = at::isfinite(l).logical_and(at::isfinite(g));

  // Decision on the window before this value enters it.
  const at::Tensor n = pushed_.clamp_max(window_);
  const WindowStats ls = window_stats(loss_window_, n);
  const WindowStats gs = window_stats(gnorm_window_, n);
  const at::Tensor active = n * 2 >= window_;
  const at::Tensor spike = (l > ls.mean + sigma_factor_ * ls.std)
                               .logical_or(g > gs.mean + sigma_factor_ * gs.std)
                               .logical_and(active);
  const at::Tensor apply = finite.logical_and(spike.logical_not()).to(at::kFloat);

  // Push finite values into slot pushed % window via a masked select (no host-side index).
  // In-place updates keep the state tensors' storage fixed, so a captured CUDA graph that
  // contains observe() advances the same state on every replay.
  const at::Tensor slot = at::arange(window_, pushed_.options()) == at::remainder(pushed_, window_);
  const at::Tensor write = slot.logical_and(finite);
  loss_window_.copy_(at::where(write, l, loss_window_));
  gnorm_window_.copy_(at::where(write, g, gnorm_window_));
  pushed_.add_(finite.to(at::kLong));
  return apply;
}

SpikeGuard::Stats SpikeGuard::stats() const {
  const at::Tensor n = pushed_.clamp_max(window_);
  const WindowStats ls = window_stats(loss_window_, n);
  const WindowStats gs = window_stats(gnorm_window_, n);
  const at::Tensor all = at::stack({ls.mean, ls.std, gs.mean, gs.std}).cpu();
  const double* v = all.data_ptr<double>();
  return {v[0], v[1], v[2], v[3], n.item<int64_t>()};
}

void SpikeGuard::save(torch::serialize::OutputArchive& archive) const {
  archive.write("spike_guard.window", at::tensor({window_}, at::kLong));
  archive.write("spike_guard.sigma_factor", at::tensor({sigma_factor_}, at::kDouble));
  // Copies: the state is updated in place, and .cpu() of a CPU tensor would alias it, so an
  // archive filled now and written to disk later would otherwise see later observations.
  archive.write("spike_guard.loss_window", loss_window_.cpu().clone());
  archive.write("spike_guard.gnorm_window", gnorm_window_.cpu().clone());
  archive.write("spike_guard.pushed", pushed_.cpu().clone());
}

void SpikeGuard::load(torch::serialize::InputArchive& archive) {
  at::Tensor window, sigma, loss_w, gnorm_w, pushed;
  archive.read("spike_guard.window", window);
  archive.read("spike_guard.sigma_factor", sigma);
  archive.read("spike_guard.loss_window", loss_w);
  archive.read("spike_guard.gnorm_window", gnorm_w);
  archive.read("spike_guard.pushed", pushed);
  TORCH_CHECK(window.numel() == 1 && window.item<int64_t>() == window_,
              "SpikeGuard.load: checkpoint window ", window.item<int64_t>(), " != configured window ",
              window_);
  TORCH_CHECK(sigma.numel() == 1 && sigma.item<double>() == sigma_factor_,
              "SpikeGuard.load: checkpoint sigma_factor ", sigma.item<double>(),
              " != configured sigma_factor ", sigma_factor_);
  TORCH_CHECK(loss_w.dim() == 1 && loss_w.size(0) == window_ && gnorm_w.sizes() == loss_w.sizes() &&
                  loss_w.scalar_type() == at::kDouble && gnorm_w.scalar_type() == at::kDouble,
              "SpikeGuard.load: window tensors must be fp64 of shape [", window_, "]");
  TORCH_CHECK(pushed.numel() == 1 && pushed.scalar_type() == at::kLong && pushed.item<int64_t>() >= 0,
              "SpikeGuard.load: bad 'spike_guard.pushed' entry");
  // Copied into the existing storage (see observe): a graph captured before load stays valid.
  loss_window_.copy_(loss_w);
  gnorm_window_.copy_(gnorm_w);
  pushed_.copy_(pushed.reshape({}));
}

// ---------------------------------------------------------------- NonFiniteFirewall

NonFiniteAbort::NonFiniteAbort(int64_t step, int consecutive, int max_consecutive)
    : std::runtime_error(fmt::format(
          "aborting at step {}: {} consecutive steps with a non-finite loss or gradient norm "
          "(limit {})",
          step, consecutive, max_consecutive)),
      step_(step),
      consecutive_(consecutive) {}

NonFiniteFirewall::NonFiniteFirewall(int max_consecutive) : max_consecutive_(max_consecutive) {
  TORCH_CHECK(max_consecutive >= 1, "NonFiniteFirewall: max_consecutive must be >= 1, got ",
              max_consecutive);
}

bool NonFiniteFirewall::check(const at::Tensor& loss, const at::Tensor& grad_norm, int64_t step) {
  TORCH_CHECK(loss.defined() && grad_norm.defined(),
              "NonFiniteFirewall.check: loss and grad_norm must be defined tensors");
  // One host sync: both checks reduced on the device, one bool read back.
  const bool finite =
      at::isfinite(loss.detach()).all().logical_and(at::isfinite(grad_norm.detach().to(loss.device())).all())
          .item<bool>();
  if (finite) {
    consecutive_ = 0;
    return true;
  }
  ++consecutive_;
  if (consecutive_ >= max_consecutive_) throw NonFiniteAbort(step, consecutive_, max_consecutive_);
  return false;
}

void NonFiniteFirewall::save(torch::serialize::OutputArchive& archive) const {
  archive.write("nonfinite_firewall.consecutive", at::tensor({static_cast<int64_t>(consecutive_)}, at::kLong));
}

void NonFiniteFirewall::load(torch::serialize::InputArchive& archive) {
  at::Tensor c;
  archive.read("nonfinite_firewall.consecutive", c);
  TORCH_CHECK(c.numel() == 1 && c.item<int64_t>() >= 0 && c.item<int64_t>() < max_consecutive_,
              "NonFiniteFirewall.load: bad consecutive count in checkpoint (limit ", max_consecutive_, ")");
  consecutive_ = static_cast<int>(c.item<int64_t>());
}

}  // namespace orthopt::train

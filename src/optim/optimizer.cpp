// orthopt::Optimizer's public surface and its serialization; the step itself is OptimizerImpl's
// (optimizer_impl.h: the shared core and one file per algorithm).
#include "optim/optimizer_impl.h"

#include <cmath>

namespace orthopt {

using namespace optim_core;
// ---------------------------------------------------------------- public surface

Optimizer::Optimizer(std::vector<ParamGroup> groups) : impl_(std::make_unique<OptimizerImpl>(std::move(groups))) {}
Optimizer::~Optimizer() = default;
Optimizer::Optimizer(Optimizer&&) noexcept = default;
Optimizer& Optimizer::operator=(Optimizer&&) noexcept = default;

void Optimizer::step() {
  impl_->enqueue_step();
  impl_->finish_step();
}
void Optimizer::enqueue_step() { impl_->enqueue_step(); }
void Optimizer::finish_step() { impl_->finish_step(); }

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : impl_->groups)
    for (auto& p : g.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.mutable_grad() = at::Tensor();
      } else {
        p.mutable_grad().detach_();
        p.mutable_grad().zero_();
      }
    }
}

const std::vector<ParamGroup>& Optimizer::param_groups() const { return impl_->groups; }

void Optimizer::set_group_options(size_t group, const GroupOptions& options) {
  TORCH_CHECK(group < impl_->groups.size(), "argument 'group': index ", group, " out of range (",
              impl_->groups.size(), " groups)");
  auto& grp = impl_->groups[group];
  validate_options(options, group);
  TORCH_CHECK_VALUE(options.algorithm == grp.options.algorithm, "group ", group,
                    ": option 'algorithm' cannot change from '", to_string(grp.options.algorithm), "' to '",
                    to_string(options.algorithm), "' (state would not match)");
  if (same_structure(grp.options, options)) {
    grp.options = options;
    return;
  }
  for (size_t i = 0; i < grp.params.size(); ++i) {
    const std::string label = param_label(grp, group, i);
    validate_param(grp.params[i], options, label);
    const auto& st = impl_->state[group][i];
    if (st.empty()) continue;
    for (const auto& spec : state_specs(grp.params[i], options)) {
      auto it = st.find(spec.name);
      TORCH_CHECK_VALUE(it != st.end() && it->second.sizes() == at::IntArrayRef(spec.sizes), label,
                        ": the new options change the shape or set of state '", spec.name,
                        "' (e.g. flatten, rank_fraction, master_weights); not allowed after the first step");
    }
  }
  grp.options = options;
}

void Optimizer::set_lr_scale(double factor) {
  TORCH_CHECK_VALUE(std::isfinite(factor) && factor >= 0, "argument 'factor': lr scale must be finite and >= 0, got ",
                    factor);
  impl_->lr_scale.fill_(factor);
}

void Optimizer::set_skip_factor(const at::Tensor& factor) {
  TORCH_CHECK_VALUE(factor.defined() && factor.numel() == 1, "argument 'factor': expected a one-element tensor");
  impl_->skip_factor.copy_(factor.reshape({}));
  impl_->skip_active = true;
}

const at::Tensor& Optimizer::lr_scale() const { return impl_->lr_scale; }
const at::Tensor& Optimizer::skip_factor() const { return impl_->skip_factor; }
bool Optimizer::skip_gating() const { return impl_->skip_active; }
int64_t Optimizer::state_version() const { return impl_->state_version; }
int64_t Optimizer::step_count() const { return impl_->steps.item<int64_t>(); }
int64_t Optimizer::dion_qr_fallbacks() const { return impl_->dion_qr_fallbacks; }

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& g : impl_->state)
    for (const auto& st : g)
      for (const auto& [name, t] : st) bytes += static_cast<int64_t>(t.numel() * t.element_size());
  return bytes;
}

const StateDict& Optimizer::param_state(size_t group, size_t index) const {
  TORCH_CHECK(group < impl_->state.size() && index < impl_->state[group].size(), "argument 'group'/'index': (",
              group, ", ", index, ") out of range");
  return impl_->state[group][index];
}

void Optimizer::load_param_states(const std::vector<std::vector<StateDict>>& states) {
  auto prepared = impl_->prepare_states(states);
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < prepared.size(); ++g)
    for (size_t i = 0; i < prepared[g].size(); ++i) {
      impl_->state[g][i] = std::move(prepared[g][i]);
      ++impl_->state_version;
      // Master weights are the truth for the parameter.
      auto it = impl_->state[g][i].find("master");
      if (it != impl_->state[g][i].end()) impl_->groups[g].params[i].detach().copy_(it->second);
    }
}

void Optimizer::set_initial_q_sources(size_t group, size_t index, std::vector<QSource> sources) {
  TORCH_CHECK(group < impl_->groups.size() && index < impl_->groups[group].params.size(),
              "argument 'group'/'index': (", group, ", ", index, ") out of range");
  if (!sources.empty()) check_q_sources(impl_->groups[group], group, index, sources);
  impl_->q_sources[group][index] = std::move(sources);
}

// ---------------------------------------------------------------- serialization

namespace {
constexpr const char* kFormat = "orthopt.optim.v1";

std::string key(size_t g, const std::string& rest) { return "g" + std::to_string(g) + "_" + rest; }
std::string key(size_t g, size_t i, const std::string& rest) {
  return "g" + std::to_string(g) + "_p" + std::to_string(i) + "_" + rest;
}
}  // namespace

void Optimizer::save(torch::serialize::OutputArchive& archive) const {
  const auto& impl = *impl_;
  archive.write("format", c10::IValue(std::string(kFormat)));
  archive.write("num_groups", c10::IValue(static_cast<int64_t>(impl.groups.size())));
  archive.write("steps", impl.steps.cpu(), /*is_buffer=*/true);
  archive.write("lr_scale", impl.lr_scale.cpu(), true);
  archive.write("skip_factor", impl.skip_factor.cpu(), true);
  for (size_t g = 0; g < impl.groups.size(); ++g) {
    const auto& grp = impl.groups[g];
    archive.write(key(g, "algorithm"), c10::IValue(std::string(to_string(grp.options.algorithm))));
    archive.write(key(g, "num_params"), c10::IValue(static_cast<int64_t>(grp.params.size())));
    for (size_t i = 0; i < grp.params.size(); ++i) {
      archive.write(key(g, i, "shape"), c10::IValue(grp.params[i].sizes().vec()));
      std::string names;
      for (const auto& [name, t] : impl.state[g][i]) {
        names += (names.empty() ? "" : ",") + name;
        // A view into a bank's buffer (owned_bank) would serialize the whole buffer: its own copy.
        at::Tensor c = t.detach().cpu();
        if (c.storage().nbytes() != static_cast<size_t>(c.numel()) * c.element_size()) c = c.clone();
        archive.write(key(g, i, "s_" + name), c, true);
      }
      archive.write(key(g, i, "state_names"), c10::IValue(names));
    }
  }
}

void Optimizer::load(torch::serialize::InputArchive& archive) {
  auto& impl = *impl_;
  c10::IValue v;
  TORCH_CHECK(archive.try_read("format", v) && v.isString() && v.toStringRef() == kFormat,
              "optimizer checkpoint: not an orthopt optimizer state (missing or wrong 'format', expected ", kFormat, ")");
  archive.read("num_groups", v);
  TORCH_CHECK(v.toInt() == static_cast<int64_t>(impl.groups.size()), "optimizer checkpoint: has ", v.toInt(),
              " param groups but this optimizer has ", impl.groups.size());
  std::vector<std::vector<StateDict>> states(impl.groups.size());
  for (size_t g = 0; g < impl.groups.size(); ++g) {
    const auto& grp = impl.groups[g];
    archive.read(key(g, "algorithm"), v);
    TORCH_CHECK(v.toStringRef() == to_string(grp.options.algorithm), "optimizer checkpoint: group ", g,
                " was saved by algorithm '", v.toStringRef(), "' but this optimizer's group uses '",
                to_string(grp.options.algorithm), "'");
    archive.read(key(g, "num_params"), v);
    TORCH_CHECK(v.toInt() == static_cast<int64_t>(grp.params.size()), "optimizer checkpoint: group ", g, " has ",
                v.toInt(), " params but this optimizer's group has ", grp.params.size());
    states[g].resize(grp.params.size());
    for (size_t i = 0; i < grp.params.size(); ++i) {
      archive.read(key(g, i, "shape"), v);
      const auto shape = v.toIntVector();
      TORCH_CHECK(at::IntArrayRef(shape) == grp.params[i].sizes(), "optimizer checkpoint: ",
                  param_label(grp, g, i), " was saved with shape ", at::IntArrayRef(shape), " but has shape ",
                  grp.params[i].sizes());
      archive.read(key(g, i, "state_names"), v);
      std::stringstream names(v.toStringRef());
      for (std::string name; std::getline(names, name, ',');) {
        at::Tensor t;
        archive.read(key(g, i, "s_" + name), t, true);
        states[g][i][name] = t;
      }
    }
  }
  at::Tensor steps, lr_scale, skip;
  archive.read("steps", steps, true);
  archive.read("lr_scale", lr_scale, true);
  archive.read("skip_factor", skip, true);
  TORCH_CHECK(steps.numel() == 1 && lr_scale.numel() == 1 && skip.numel() == 1,
              "optimizer checkpoint: malformed steps/lr_scale/skip_factor");
  load_param_states(states);  // validates everything before changing anything
  impl.steps.copy_(steps.reshape({}));
  impl.lr_scale.copy_(lr_scale.reshape({}));
  impl.skip_factor.copy_(skip.reshape({}));
  if (skip.item<float>() != 1.0f) impl.skip_active = true;
}

}  // namespace orthopt

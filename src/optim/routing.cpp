// route_params: default parameter routing of algorithms.md §7 with name-pattern overrides.
#include <c10/util/Exception.h>

#include <regex>

#include "orthopt/optim.h"

namespace orthopt {
namespace {

bool contains_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns)
    if (!p.empty() && name.find(p) != std::string::npos) return true;
  return false;
}

}  // namespace

std::vector<int> route_slots(const std::vector<std::pair<std::string, at::Tensor>>& named,
                             const std::vector<std::string>& embedding_patterns,
                             const std::vector<std::string>& head_patterns,
                             const std::vector<std::string>& override_patterns) {
  std::vector<std::regex> overrides;
  for (const auto& pattern : override_patterns) {
    try {
      overrides.emplace_back(pattern);
    } catch (const std::regex_error& e) {
      TORCH_CHECK_VALUE(false, "argument 'overrides': invalid regex '", pattern, "': ", e.what());
    }
  }
  std::vector<int> slots;
  for (const auto& [name, p] : named) {
    TORCH_CHECK(p.defined(), "argument 'named': parameter '", name, "' is undefined");
    int slot = kRouteFrozen;
    if (p.requires_grad()) {
      for (size_t k = 0; k < overrides.size() && slot == kRouteFrozen; ++k)
        if (std::regex_search(name, overrides[k])) slot = kRouteOverride + static_cast<int>(k);
      if (slot != kRouteFrozen) {
      } else if (contains_any(name, embedding_patterns) || contains_any(name, head_patterns)) {
        slot = kRouteNoDecay;  // embeddings and output head: scalar optimizer, weight decay 0
      } else if (p.dim() == 2 || p.dim() == 3) {
        slot = kRouteMatrix;   // matrices and stacked expert matrices
      } else if (p.dim() >= 4) {
        slot = kRouteFlatten;  // conv-like weights: one flattened matrix each
      } else {
        slot = kRouteScalar;   // 0-D / 1-D: norm gains, biases
      }
    }
    slots.push_back(slot);
  }
  return slots;
}

std::vector<ParamGroup> route_params(const std::vector<std::pair<std::string, at::Tensor>>& named,
                                     const RoutingOptions& routing) {
  TORCH_CHECK(is_matrix_algorithm(routing.matrix.algorithm), "argument 'routing.matrix': algorithm '",
              to_string(routing.matrix.algorithm), "' is not a matrix optimizer (muon, normuon, dion3, dion2, dion)");
  std::vector<std::string> patterns;
  for (const auto& [pattern, opts] : routing.overrides) patterns.push_back(pattern);
  const auto slots = route_slots(named, routing.embedding_patterns, routing.head_patterns, patterns);

  // Groups in slot order (deterministic for checkpoints); empty ones are dropped.
  std::vector<ParamGroup> groups(kRouteOverride + routing.overrides.size());
  groups[kRouteMatrix].options = routing.matrix;
  groups[kRouteFlatten].options = routing.matrix;
  groups[kRouteFlatten].options.ortho.flatten = true;
  groups[kRouteScalar].options = routing.scalar;
  groups[kRouteNoDecay].options = routing.scalar;
  groups[kRouteNoDecay].options.weight_decay = 0.0;
  for (size_t k = 0; k < routing.overrides.size(); ++k) groups[kRouteOverride + k].options = routing.overrides[k].second;
  for (size_t j = 0; j < named.size(); ++j) {
    if (slots[j] == kRouteFrozen) continue;
    groups[slots[j]].params.push_back(named[j].second);
    groups[slots[j]].names.push_back(named[j].first);
  }
  std::vector<ParamGroup> out;
  for (auto& g : groups)
    if (!g.params.empty()) out.push_back(std::move(g));
  return out;
}

}  // namespace orthopt

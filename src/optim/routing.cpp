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

std::vector<ParamGroup> route_params(const std::vector<std::pair<std::string, at::Tensor>>& named,
                                     const RoutingOptions& routing) {
  TORCH_CHECK(is_matrix_algorithm(routing.matrix.algorithm), "argument 'routing.matrix': algorithm '",
              to_string(routing.matrix.algorithm), "' is not a matrix optimizer (muon, normuon, dion3, dion)");
  std::vector<std::regex> override_res;
  for (const auto& [pattern, opts] : routing.overrides) {
    try {
      override_res.emplace_back(pattern);
    } catch (const std::regex_error& e) {
      TORCH_CHECK(false, "argument 'routing.overrides': invalid regex '", pattern, "': ", e.what());
    }
  }

  // Fixed group order (deterministic for checkpoints): matrices, flattened >=4-D weights,
  // scalars, embeddings/head (no weight decay), then one group per override.
  GroupOptions flat = routing.matrix;
  flat.ortho.flatten = true;
  GroupOptions no_decay = routing.scalar;
  no_decay.weight_decay = 0.0;
  std::vector<ParamGroup> groups(4 + routing.overrides.size());
  groups[0].options = routing.matrix;
  groups[1].options = flat;
  groups[2].options = routing.scalar;
  groups[3].options = no_decay;
  for (size_t k = 0; k < routing.overrides.size(); ++k) groups[4 + k].options = routing.overrides[k].second;

  for (const auto& [name, p] : named) {
    TORCH_CHECK(p.defined(), "argument 'named': parameter '", name, "' is undefined");
    if (!p.requires_grad()) continue;  // frozen: never has a gradient
    size_t target = groups.size();
    for (size_t k = 0; k < override_res.size() && target == groups.size(); ++k)
      if (std::regex_search(name, override_res[k])) target = 4 + k;
    if (target == groups.size()) {
      if (contains_any(name, routing.embedding_patterns) || contains_any(name, routing.head_patterns))
        target = 3;  // embeddings and output head: AdamW, weight decay 0
      else if (p.dim() == 2 || p.dim() == 3)
        target = 0;  // matrices and stacked expert matrices
      else if (p.dim() >= 4)
        target = 1;  // conv-like weights: one flattened matrix each
      else
        target = 2;  // 0-D / 1-D: norm gains, biases
    }
    groups[target].params.push_back(p);
    groups[target].names.push_back(name);
  }
  std::vector<ParamGroup> out;
  for (auto& g : groups)
    if (!g.params.empty()) out.push_back(std::move(g));
  return out;
}

}  // namespace orthopt

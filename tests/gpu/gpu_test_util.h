#pragma once
// Helpers shared by the GPU gtests (tests/gpu/test_gpu_*.cpp).
#include <ATen/ATen.h>

#include <string>

#include "orthopt/optim.h"

namespace orthopt::gpu_test {

// Bitwise comparison of two optimizers' parameters and every state tensor (same groups);
// returns the first mismatch as "name (what)", or "" when all are equal.
inline std::string first_mismatch(const Optimizer& a, const Optimizer& b) {
  const auto& ga = a.param_groups();
  const auto& gb = b.param_groups();
  for (size_t g = 0; g < ga.size(); ++g)
    for (size_t i = 0; i < ga[g].params.size(); ++i) {
      const std::string name = ga[g].names[i];
      if (!at::equal(ga[g].params[i], gb[g].params[i])) return name + " (parameter)";
      const auto& sa = a.param_state(g, i);
      const auto& sb = b.param_state(g, i);
      if (sa.size() != sb.size()) return name + " (state entries)";
      for (const auto& [key, t] : sa) {
        auto it = sb.find(key);
        if (it == sb.end() || !at::equal(t, it->second)) return name + " (state '" + key + "')";
      }
    }
  return "";
}

// Sets one ExecutionOptions field (Toggle) on every group of `opt` (the path its next steps take).
inline void set_execution(Optimizer& opt, Toggle ExecutionOptions::*field, Toggle value) {
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    GroupOptions o = opt.param_groups()[g].options;
    o.ortho.execution.*field = value;
    opt.set_group_options(g, o);
  }
}

}  // namespace orthopt::gpu_test

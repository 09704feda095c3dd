// An A/B switch in the environment (ORTHOPT_GRAM_OWN_LAYOUT, ORTHOPT_FUSED_NS_INPUT, ...), read at
// each call (tests flip it in one process): "0" off, "1" on, anything else (or unset) leaves the
// measured rule in charge.
#pragma once

#include <cstdlib>
#include <cstring>
#include <optional>

namespace orthopt {

inline std::optional<bool> env_switch(const char* name) {
  const char* env = std::getenv(name);
  if (env && std::strcmp(env, "0") == 0) return false;
  if (env && std::strcmp(env, "1") == 0) return true;
  return std::nullopt;
}

}  // namespace orthopt

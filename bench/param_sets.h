#pragma once
// The parameter sets of the optimizer-step benchmarks (docs/performance.md §2), defined once, as
// JSON: `orthopt bench step` parses kParamSetsJson, and bench/gpu/step_peers.py (with the scripts
// that import it) reads the same raw string literal from this file.
//
// Per set: `blocks` blocks named <prefix>.<i>. holding `block` (name, shape) each, then `final`.
// Parameters are created in this order. The names follow the usual modules, so that route_params
// sends embeddings, head and vectors to AdamW and the block matrices to the matrix optimizer.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace orthopt::bench {

inline constexpr const char kParamSetsJson[] = R"json(
{
  "gpt2": {
    "about": "GPT-2 124M: 48 matrices, 50 vectors, the 50304x768 embedding",
    "blocks": 12,
    "prefix": "h",
    "block": [
      ["attn.c_attn.weight", [2304, 768]],
      ["attn.c_proj.weight", [768, 768]],
      ["mlp.c_fc.weight", [3072, 768]],
      ["mlp.c_proj.weight", [768, 3072]],
      ["ln_1.weight", [768]],
      ["ln_1.bias", [768]],
      ["ln_2.weight", [768]],
      ["ln_2.bias", [768]]
    ],
    "final": [
      ["ln_f.weight", [768]],
      ["ln_f.bias", [768]],
      ["wte.weight", [50304, 768]]
    ]
  },
  "llama": {
    "about": "Llama-style 1.26B: 154 matrices, 45 vectors, embedding and head",
    "blocks": 22,
    "prefix": "layers",
    "block": [
      ["attn.q.weight", [2048, 2048]],
      ["attn.k.weight", [2048, 2048]],
      ["attn.v.weight", [2048, 2048]],
      ["attn.o.weight", [2048, 2048]],
      ["mlp.gate.weight", [5632, 2048]],
      ["mlp.up.weight", [5632, 2048]],
      ["mlp.down.weight", [2048, 5632]],
      ["attn_norm.weight", [2048]],
      ["mlp_norm.weight", [2048]]
    ],
    "final": [
      ["norm.weight", [2048]],
      ["embed.weight", [32000, 2048]],
      ["lm_head.weight", [32000, 2048]]
    ]
  },
  "small": {
    "about": "a quick set: 4 blocks of 128-wide matrices, 1000x128 embedding",
    "blocks": 4,
    "prefix": "l",
    "block": [
      ["qkv.weight", [384, 128]],
      ["o.weight", [128, 128]],
      ["fc.weight", [512, 128]],
      ["proj.weight", [128, 512]],
      ["norm.weight", [128]]
    ],
    "final": [
      ["embed.weight", [1000, 128]]
    ]
  }
}
)json";

// The sets' names, and a set's parameter names and shapes in its order.
inline const nlohmann::json& param_sets() {
  static const nlohmann::json sets = nlohmann::json::parse(kParamSetsJson);
  return sets;
}

inline std::vector<std::string> param_set_names() {
  std::vector<std::string> names;
  for (const auto& [name, set] : param_sets().items()) names.push_back(name);
  return names;
}

// Throws std::invalid_argument naming `option` for an unknown set.
inline std::vector<std::pair<std::string, std::vector<int64_t>>> param_shapes(const std::string& set,
                                                                             const char* option = "--sets") {
  if (!param_sets().contains(set)) {
    std::string known;
    for (const auto& n : param_set_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument(std::string("argument '") + option + "': unknown set '" + set + "' (" + known + ")");
  }
  const auto& def = param_sets().at(set);
  const auto prefix = def.at("prefix").get<std::string>();
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (int64_t i = 0; i < def.at("blocks").get<int64_t>(); ++i)
    for (const auto& p : def.at("block"))
      shapes.emplace_back(prefix + "." + std::to_string(i) + "." + p.at(0).get<std::string>(),
                          p.at(1).get<std::vector<int64_t>>());
  for (const auto& p : def.at("final")) shapes.emplace_back(p.at(0).get<std::string>(), p.at(1).get<std::vector<int64_t>>());
  return shapes;
}

}  // namespace orthopt::bench

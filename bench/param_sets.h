#pragma once
// The parameter sets of the optimizer-step benchmarks (docs/performance.md §2), defined once, as
// JSON: `orthopt bench step` parses kParamSetsJson, and bench/gpu/step_peers.py (with the scripts
// that import it) reads the same raw string literal from this file.
//
// Per set: `blocks` blocks named <prefix>.<i>. holding `block` (name, shape) each, then `final`.
// Parameters are created in this order. The names follow the usual modules, so that route_params
// sends embeddings, head and vectors to AdamW and the block matrices to the matrix optimizer.

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
  }
}
)json";

}  // namespace orthopt::bench

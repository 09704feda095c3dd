#pragma once
// orthopt bench train: the trainer's step timed per part beside a plain PyTorch peer of the same
// model (bench/train_peer.py) run in the same invocation.
#include <cstdint>
#include <string>

#include "commands.h"

namespace orthopt::cli {

// Adds `train` under the `bench` subcommand.
void register_bench_train(CLI::App& bench, Action& action);

// Model FLOPs per trained token (PaLM's appendix B count): 6 per weight that multiplies an
// activation (every matrix but the embedding table, which is a lookup) for the forward and
// backward products, plus attention's scores and weighted sum, 12·layers·context·d_model (the
// full context×context product, as PaLM counts it; the causal mask halves the useful part).
struct ModelFlops {
  int64_t n_params = 0;       // every parameter
  int64_t n_matmul = 0;       // the parameters of the products: all but the embedding and the norm gains
  double attention = 0.0;     // 12·L·T·d
  double per_token = 0.0;     // 6·n_matmul + attention
  std::string formula;        // the count written out with its numbers
};

// Peak dense bf16 tensor FLOP/s of a CUDA device from its name (H100 SXM/HBM3 and H200 989e12,
// H100 PCIe 756e12, H100 NVL 835e12, A100 312e12, ...); 0 when the name is not in the table.
double peak_bf16_flops(const std::string& device_name);

}  // namespace orthopt::cli

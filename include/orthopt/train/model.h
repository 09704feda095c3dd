#pragma once
// Byte-level decoder-only transformer for the trainer: token embedding, pre-norm RMSNorm
// blocks with causal self-attention (RoPE) and a SwiGLU MLP (or a mixture of SwiGLU experts),
// a final RMSNorm and an untied output head. Vocabulary: the 256 byte values.

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "orthopt/optim.h"

namespace orthopt::train {

struct ModelConfig {
  std::string preset = "tiny";
  int64_t vocab_size = 256;
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t d_ff = 384;      // SwiGLU hidden width (per expert for MoE)
  int64_t context = 128;   // longest sequence the model is trained on
  double rope_base = 10000.0;
  double norm_eps = 1e-6;
  // Mixture of experts: n_experts == 0 is the dense MLP.
  int64_t n_experts = 0;
  int64_t top_k = 2;
  double router_bias_rate = 1e-3;  // aux-loss-free balancing step per optimizer step
  double router_z_loss = 0.0;      // coefficient of mean(logsumexp(router logits)²)
  // Activations recomputed in the backward pass instead of kept from the forward:
  // "none"; "block": each block keeps only its input; "selective": the SwiGLU activation and
  // (without a fused attention kernel) the attention scores and probabilities. The same
  // operations run again, so losses and gradients keep their bits (docs/training.md).
  // The RMSNorms are not recomputed alone: their input also feeds the residual sum, and
  // back-propagating through a recomputed norm would add that input's gradients in another
  // order (the bits would change in the last places).
  std::string activation_checkpointing = "none";
};

const std::vector<std::string>& activation_checkpointing_modes();
// Throws naming activation_checkpointing unless `mode` is one of the modes, and "none" with MoE.
void validate_activation_checkpointing(const std::string& mode, int64_t n_experts);

// Presets: tiny (~1M params, CPU), small (~6M), gpt2-124m (GPT-2 small's shape with a byte
// vocabulary, ~85M params, GPU). Throws naming the valid presets.
ModelConfig model_preset(const std::string& name);
const std::vector<std::string>& model_preset_names();
// Throws c10::Error naming the offending field.
void validate_model_config(const ModelConfig& cfg);

// Rotary position embedding, "half-split" pairing: feature i rotates with feature i + hd/2
// by the angle pos·base^(-2i/hd). cos/sin: [T, hd/2] fp32 tables from rope_tables().
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double base,
                                              c10::Device device);
// x: [..., T, hd]
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// fn(inputs) computed without keeping its intermediate tensors: the forward pass runs it under
// no_grad and keeps only `inputs`; the backward pass runs it again with gradients (under the
// forward's CUDA autocast state) and back-propagates through that. The parameters fn uses get
// their gradients accumulated there. fn must compute the same values both times (no
// randomness, no state it changes). Where gradients are off, just fn(inputs).
at::Tensor recompute_in_backward(std::function<at::Tensor(const std::vector<at::Tensor>&)> fn,
                                 const std::vector<at::Tensor>& inputs);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const ModelConfig& cfg);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  torch::nn::Linear qkv{nullptr};   // fused [3·d, d]: q rows, then k rows, then v rows
  torch::nn::Linear proj{nullptr};
 private:
  int64_t n_heads_, head_dim_;
  bool recompute_scores_;  // selective checkpointing of the explicit (unfused) attention
};
TORCH_MODULE(CausalSelfAttention);

class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t d_model, int64_t d_ff, bool recompute = false);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear w_gate{nullptr}, w_up{nullptr}, w_down{nullptr};
 private:
  bool recompute_;  // silu(gate)·up recomputed in the backward pass
};
TORCH_MODULE(SwiGLU);

// Top-k mixture of SwiGLU experts. Expert weights are 3-D stacks [E, out, in] (orthogonalized
// as a batch of matrices). Routing runs in fp32: probabilities p = softmax(x·Wrᵀ); experts are
// chosen by top-k of p + bias, weighted by p renormalized over the chosen k. The bias (a buffer,
// not trained by gradients) balances the load without an auxiliary loss: once per optimizer
// step, bias_e += rate·sign(mean load − load_e).
class MoEImpl : public torch::nn::Module {
 public:
  explicit MoEImpl(const ModelConfig& cfg);
  // Returns the output and adds the router z-loss term (unscaled mean) to *z_loss.
  at::Tensor forward(const at::Tensor& x, at::Tensor* z_loss);
  // Applies the balancing update from the loads counted since the last call, multiplied by
  // skip_factor (0-d; 0 leaves the bias unchanged), and resets the counts.
  void update_bias(const at::Tensor& skip_factor);
  at::Tensor router;                  // [E, d]
  at::Tensor w_gate, w_up, w_down;    // [E, ff, d], [E, ff, d], [E, d, ff]
  at::Tensor bias;                    // [E] fp32 buffer
  at::Tensor load;                    // [E] fp32 buffer: tokens routed since the last update
 private:
  int64_t n_experts_, top_k_;
  double rate_;
};
TORCH_MODULE(MoE);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& cfg);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     at::Tensor* z_loss);
  RMSNorm norm1{nullptr}, norm2{nullptr};
  CausalSelfAttention attn{nullptr};
  SwiGLU mlp{nullptr};
  MoE moe{nullptr};
 private:
  at::Tensor forward_kept(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor* z_loss);
  bool checkpoint_;  // activation_checkpointing "block"
};
TORCH_MODULE(Block);

struct LossParts {
  at::Tensor total;    // what backward() is called on: lm + z-loss term
  at::Tensor lm;       // mean next-byte cross entropy in nats
};

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelConfig& cfg);
  // idx: [B, T] int64 byte values, T <= context. Returns fp32 logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& idx);
  LossParts loss(const at::Tensor& idx, const at::Tensor& targets);
  const ModelConfig& config() const { return cfg_; }
  int64_t num_parameters() const;
  // Once per optimizer step (MoE only; no-op for the dense model).
  void update_router_biases(const at::Tensor& skip_factor);
  // The MoE blocks' token-load counters (the buffers themselves; empty for the dense model). Data
  // parallel training sums them over the ranks first, so every rank moves its biases alike.
  std::vector<at::Tensor> router_loads();
  // Param groups for the optimizer: route_params on named_parameters() with the fused QKV
  // weights split into their q, k, v blocks (Muon, NorMuon) and the MoE routers given to the
  // scalar group.
  std::vector<ParamGroup> param_groups(const RoutingOptions& routing) const;

  torch::nn::Embedding tok_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  RMSNorm norm_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
 private:
  at::Tensor forward_impl(const at::Tensor& idx, at::Tensor* z_loss);
  ModelConfig cfg_;
  // rope_tables() for the last sequence length and device: built on the host and copied once,
  // not at every forward.
  std::pair<at::Tensor, at::Tensor> rope_;
};
TORCH_MODULE(Transformer);

}  // namespace orthopt::train

// The byte-level transformer of the trainer (see include/orthopt/train/model.h).
#include "orthopt/train/model.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/torch_version.h"
#include "orthopt/train/trainer.h"

namespace orthopt::train {

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = {"tiny", "small", "gpt2-124m"};
  return names;
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig c;
  c.preset = name;
  if (name == "tiny") {  // 4·(4·128² + 3·128·384) + 2·256·128 ≈ 0.98M params
    c.d_model = 128; c.n_layers = 4; c.n_heads = 4; c.d_ff = 384; c.context = 128;
  } else if (name == "small") {  // ≈ 6.4M params
    c.d_model = 256; c.n_layers = 6; c.n_heads = 8; c.d_ff = 704; c.context = 256;
  } else if (name == "gpt2-124m") {  // GPT-2 small's trunk; byte vocabulary makes it ≈ 85M
    c.d_model = 768; c.n_layers = 12; c.n_heads = 12; c.d_ff = 2048; c.context = 1024;
  } else {
    std::string valid;
    for (const auto& n : model_preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    TORCH_CHECK(false, "preset: unknown model preset '", name, "' (valid: ", valid, ")");
  }
  return c;
}

const std::vector<std::string>& activation_checkpointing_modes() {
  static const std::vector<std::string> modes = {"none", "block", "selective"};
  return modes;
}

void validate_model_config(const ModelConfig& c) {
  TORCH_CHECK(c.vocab_size == 256, "vocab_size: the model is byte-level, must be 256, got ", c.vocab_size);
  TORCH_CHECK(c.d_model > 0 && c.n_layers > 0 && c.n_heads > 0 && c.d_ff > 0,
              "model: d_model, n_layers, n_heads and d_ff must be positive");
  TORCH_CHECK(c.d_model % c.n_heads == 0, "n_heads: must divide d_model (", c.d_model, "), got ", c.n_heads);
  TORCH_CHECK((c.d_model / c.n_heads) % 2 == 0, "n_heads: head dimension d_model/n_heads must be even for RoPE");
  TORCH_CHECK(c.context >= 2, "context: must be >= 2, got ", c.context);
  TORCH_CHECK(c.rope_base > 1.0, "rope_base: must be > 1, got ", c.rope_base);
  TORCH_CHECK(c.norm_eps > 0.0, "norm_eps: must be > 0, got ", c.norm_eps);
  TORCH_CHECK(c.n_experts >= 0, "n_experts: must be >= 0, got ", c.n_experts);
  if (c.n_experts > 0) {
    TORCH_CHECK(c.top_k >= 1 && c.top_k <= c.n_experts, "top_k: must be in [1, n_experts=", c.n_experts,
                "], got ", c.top_k);
    TORCH_CHECK(c.router_bias_rate >= 0.0, "router_bias_rate: must be >= 0, got ", c.router_bias_rate);
    TORCH_CHECK(c.router_z_loss >= 0.0, "router_z_loss: must be >= 0, got ", c.router_z_loss);
  }
  validate_activation_checkpointing(c.activation_checkpointing, c.n_experts);
}

void validate_activation_checkpointing(const std::string& mode, int64_t n_experts) {
  const auto& modes = activation_checkpointing_modes();
  TORCH_CHECK(std::find(modes.begin(), modes.end(), mode) != modes.end(),
              "activation_checkpointing: must be none, block or selective, got '", mode, "'");
  // A recomputed MoE block would count its tokens into the router loads twice, and its z-loss
  // term would leave the graph.
  TORCH_CHECK(mode == "none" || n_experts == 0, "activation_checkpointing: '", mode,
              "' is not supported with n_experts > 0 (use none)");
}

// ---- activation checkpointing

namespace {

using Inputs = std::vector<at::Tensor>;
using RecomputeFn = std::function<at::Tensor(const Inputs&)>;

bool cuda_autocast_enabled() {
#if ORTHOPT_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

// What the backward pass needs besides the saved inputs: the function and the forward's
// autocast state (on CUDA the autograd engine runs the backward pass on its device thread, whose
// autocast is off). The trainer's only autocast is bf16 on CUDA (Bf16Autocast).
struct RecomputeState : torch::CustomClassHolder {
  RecomputeFn fn;
  bool autocast = false;
};

struct Recompute : torch::autograd::Function<Recompute> {
  // inputs as a TensorList: that is what makes them the node's inputs (a std::vector would
  // be taken as one non-tensor argument).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<RecomputeState> state,
                            at::TensorList inputs) {
    state->autocast = cuda_autocast_enabled();
    ctx->save_for_backward(inputs.vec());
    at::Tensor out;
    {
      torch::NoGradGuard no_grad;
      out = state->fn(inputs.vec());
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto holder = ctx->saved_data["state"].toCapsule();
    const auto* state = static_cast<const RecomputeState*>(holder.get());
    Inputs leaves;
    for (const at::Tensor& t : ctx->get_saved_variables())
      leaves.push_back(t.detach().requires_grad_(t.requires_grad()));
    at::Tensor out;
    {
      torch::AutoGradMode grad(true);
      const Bf16Autocast autocast(state->autocast);
      out = state->fn(leaves);
    }
    // Into the leaves' .grad and the parameters' .grad, as the kept graph would have.
    if (out.requires_grad()) torch::autograd::backward({out}, {grad_out[0]});
    torch::autograd::variable_list grads = {at::Tensor()};  // the state argument
    for (const at::Tensor& t : leaves) grads.push_back(t.requires_grad() ? t.grad() : at::Tensor());
    return grads;
  }
};

}  // namespace

at::Tensor recompute_in_backward(RecomputeFn fn, const Inputs& inputs) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  auto state = c10::make_intrusive<RecomputeState>();
  state->fn = std::move(fn);
  return Recompute::apply(std::move(state), at::TensorList(inputs));
}

// ---- RoPE ----

std::pair<at::Tensor, at::Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double base,
                                              c10::Device device) {
  TORCH_CHECK(head_dim % 2 == 0, "rope_tables: head_dim must be even, got ", head_dim);
  const int64_t half = head_dim / 2;
  // Angles in float64 so long contexts keep their precision; stored as fp32.
  auto opts = at::TensorOptions().dtype(at::kDouble);
  auto inv_freq = at::pow(base, -at::arange(0, half, opts) * (2.0 / static_cast<double>(head_dim)));
  auto angles = at::outer(at::arange(0, seq_len, opts), inv_freq);
  return {angles.cos().to(device, at::kFloat), angles.sin().to(device, at::kFloat)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto c = cos.to(x.scalar_type());
  auto s = sin.to(x.scalar_type());
  return at::cat({x1 * c - x2 * s, x1 * s + x2 * c}, -1);
}

// ---- modules ----

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  auto xf = x.to(at::kFloat);  // statistics in fp32 even under autocast
  auto y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return (y * weight.to(at::kFloat)).to(x.scalar_type());
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& cfg)
    : n_heads_(cfg.n_heads), head_dim_(cfg.d_model / cfg.n_heads),
      recompute_scores_(cfg.activation_checkpointing == "selective") {
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, 3 * cfg.d_model).bias(false)));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.d_model).bias(false)));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
  // [B, T, 3, H, hd] -> [3, B, H, T, hd]
  // unbind, not three selects: its backward stacks the three gradients into one tensor, where
  // each select's would zero a copy of the whole [3, B, H, T, hd] tensor and add the three.
  auto qkv_heads = qkv->forward(x).view({B, T, 3, n_heads_, head_dim_}).permute({2, 0, 3, 1, 4}).unbind(0);
  auto q = apply_rope(qkv_heads[0], cos, sin);
  auto k = apply_rope(qkv_heads[1], cos, sin);
  auto v = qkv_heads[2];
  at::Tensor y;
#if TORCH_VERSION_MAJOR >= 2
  // Fused kernel (flash / memory-efficient on CUDA); the explicit path below is the reference.
  y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
#else
  // [B, H, T, T] scores and probabilities: the largest activations of this path, recomputed in
  // the backward pass under selective checkpointing.
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  const auto attend = [scale, T](const Inputs& in) {
    auto scores = at::matmul(in[0], in[1].transpose(-2, -1)) * scale;
    auto future = at::ones({T, T}, in[0].options().dtype(at::kBool)).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    return at::matmul(at::softmax(scores, -1), in[2]);
  };
  y = recompute_scores_ && is_training() ? recompute_in_backward(attend, {q, k, v}) : attend({q, k, v});
#endif
  return proj->forward(y.transpose(1, 2).reshape({B, T, D}));
}

SwiGLUImpl::SwiGLUImpl(int64_t d_model, int64_t d_ff, bool recompute) : recompute_(recompute) {
  w_gate = register_module("w_gate", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_ff).bias(false)));
  w_up = register_module("w_up", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_ff).bias(false)));
  w_down = register_module("w_down", torch::nn::Linear(torch::nn::LinearOptions(d_ff, d_model).bias(false)));
}

at::Tensor SwiGLUImpl::forward(const at::Tensor& x) {
  const auto gated = [](const Inputs& in) { return at::silu(in[0]) * in[1]; };
  const Inputs in = {w_gate->forward(x), w_up->forward(x)};
  return w_down->forward(recompute_ && is_training() ? recompute_in_backward(gated, in) : gated(in));
}

MoEImpl::MoEImpl(const ModelConfig& cfg)
    : n_experts_(cfg.n_experts), top_k_(cfg.top_k), rate_(cfg.router_bias_rate) {
  const int64_t E = cfg.n_experts, d = cfg.d_model, f = cfg.d_ff;
  router = register_parameter("router", torch::empty({E, d}));
  w_gate = register_parameter("w_gate", torch::empty({E, f, d}));
  w_up = register_parameter("w_up", torch::empty({E, f, d}));
  w_down = register_parameter("w_down", torch::empty({E, d, f}));
  bias = register_buffer("bias", torch::zeros({E}));
  load = register_buffer("load", torch::zeros({E}));
}

at::Tensor MoEImpl::forward(const at::Tensor& x, at::Tensor* z_loss) {
  auto flat = x.reshape({-1, x.size(-1)});
  at::Tensor logits;
  {
    // Routing in fp32 even under autocast: the top-k choice is sensitive to rounding.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
    logits = at::matmul(flat.to(at::kFloat), router.to(at::kFloat).t());  // [N, E]
  }
  if (z_loss) *z_loss = *z_loss + at::logsumexp(logits, -1).pow(2).mean();
  auto probs = at::softmax(logits, -1);
  auto chosen = std::get<1>((probs.detach() + bias).topk(top_k_, -1));  // [N, k]
  auto gates = probs.gather(-1, chosen);
  gates = gates / gates.sum(-1, /*keepdim=*/true);
  if (is_training()) {
    torch::NoGradGuard no_grad;
    load.index_add_(0, chosen.reshape(-1), at::ones({chosen.numel()}, load.options()));
  }
  auto out = at::zeros_like(flat);
  for (int64_t e = 0; e < n_experts_; ++e) {
    auto hit = chosen.eq(e);                            // [N, k]
    auto rows = hit.any(-1).nonzero().squeeze(-1);      // tokens sent to expert e
    if (rows.numel() == 0) continue;
    auto gate = (gates * hit).sum(-1).index_select(0, rows).unsqueeze(-1);
    auto h = flat.index_select(0, rows);
    auto y = at::matmul(at::silu(at::matmul(h, w_gate[e].t())) * at::matmul(h, w_up[e].t()), w_down[e].t());
    // Under CUDA autocast y comes back in bf16 while the residual stream stays fp32.
    out = out.index_add(0, rows, y.to(out.scalar_type()) * gate.to(out.scalar_type()));
  }
  return out.view(x.sizes());
}

void MoEImpl::update_bias(const at::Tensor& skip_factor) {
  torch::NoGradGuard no_grad;
  auto direction = (load.mean() - load).sign();  // under-loaded experts get a higher bias
  bias.add_(direction * skip_factor.to(bias.device(), at::kFloat) * rate_);
  load.zero_();
}

BlockImpl::BlockImpl(const ModelConfig& cfg) : checkpoint_(cfg.activation_checkpointing == "block") {
  const bool selective = cfg.activation_checkpointing == "selective";
  norm1 = register_module("norm1", RMSNorm(cfg.d_model, cfg.norm_eps));
  attn = register_module("attn", CausalSelfAttention(cfg));
  norm2 = register_module("norm2", RMSNorm(cfg.d_model, cfg.norm_eps));
  if (cfg.n_experts > 0) {
    moe = register_module("moe", MoE(cfg));
  } else {
    mlp = register_module("mlp", SwiGLU(cfg.d_model, cfg.d_ff, selective));
  }
}

at::Tensor BlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              at::Tensor* z_loss) {
  if (!checkpoint_ || !is_training()) return forward_kept(x, cos, sin, z_loss);
  return recompute_in_backward([this, cos, sin](const Inputs& in) { return forward_kept(in[0], cos, sin, nullptr); },
                               {x});
}

at::Tensor BlockImpl::forward_kept(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                   at::Tensor* z_loss) {
  auto h = x + attn->forward(norm1->forward(x), cos, sin);
  auto n = norm2->forward(h);
  return h + (moe ? moe->forward(n, z_loss) : mlp->forward(n));
}

TransformerImpl::TransformerImpl(const ModelConfig& cfg) : cfg_(cfg) {
  validate_model_config(cfg);
  tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layers; ++i) blocks->push_back(Block(cfg));
  norm_f = register_module("norm_f", RMSNorm(cfg.d_model, cfg.norm_eps));
  lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));

  // GPT-2 style init from the current torch generator: N(0, 0.02), the projections that
  // write into the residual stream scaled by 1/sqrt(2·layers); norm gains stay 1.
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layers));
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (p.value().dim() == 1) continue;
    const bool residual = name.find("attn.proj") != std::string::npos || name.find("w_down") != std::string::npos;
    p.value().normal_(0.0, residual ? residual_std : 0.02);
  }
}

at::Tensor TransformerImpl::forward_impl(const at::Tensor& idx, at::Tensor* z_loss) {
  TORCH_CHECK(idx.dim() == 2, "model input: expected [batch, time] token ids, got ", idx.sizes());
  TORCH_CHECK(idx.size(1) <= cfg_.context, "model input: sequence length ", idx.size(1),
              " exceeds the context ", cfg_.context);
  if (!rope_.first.defined() || rope_.first.size(0) != idx.size(1) || rope_.first.device() != idx.device())
    rope_ = rope_tables(idx.size(1), cfg_.d_model / cfg_.n_heads, cfg_.rope_base, idx.device());
  auto x = tok_emb->forward(idx);
  for (const auto& block : *blocks) x = block->as<Block>()->forward(x, rope_.first, rope_.second, z_loss);
  return lm_head->forward(norm_f->forward(x)).to(at::kFloat);
}

at::Tensor TransformerImpl::forward(const at::Tensor& idx) { return forward_impl(idx, nullptr); }

LossParts TransformerImpl::loss(const at::Tensor& idx, const at::Tensor& targets) {
  at::Tensor z = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(idx.device()));
  auto logits = forward_impl(idx, cfg_.n_experts > 0 ? &z : nullptr);
  LossParts out;
  out.lm = at::cross_entropy_loss(logits.reshape({-1, cfg_.vocab_size}), targets.reshape({-1}));
  out.total = out.lm;
  if (cfg_.n_experts > 0 && cfg_.router_z_loss > 0.0)
    out.total = out.lm + z * (cfg_.router_z_loss / static_cast<double>(cfg_.n_layers));
  return out;
}

int64_t TransformerImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

std::vector<at::Tensor> TransformerImpl::router_loads() {
  std::vector<at::Tensor> loads;
  for (const auto& block : *blocks) {
    auto b = block->as<Block>();
    if (b->moe) loads.push_back(b->moe->load);
  }
  return loads;
}

void TransformerImpl::update_router_biases(const at::Tensor& skip_factor) {
  for (const auto& block : *blocks) {
    auto b = block->as<Block>();
    if (b->moe) b->moe->update_bias(skip_factor);
  }
}

std::vector<ParamGroup> TransformerImpl::param_groups(const RoutingOptions& routing) const {
  RoutingOptions r = routing;
  r.overrides.insert(r.overrides.begin(), {R"(\.moe\.router$)", routing.scalar});
  // q, k and v are orthogonalized apart where the algorithm orthogonalizes whole matrices;
  // Dion3's row selection and Dion's low rank act on the whole fused matrix.
  const Algorithm a = routing.matrix.algorithm;
  if (a == Algorithm::Muon || a == Algorithm::NorMuon) {
    GroupOptions qkv = routing.matrix;
    qkv.ortho.split_sizes = {cfg_.d_model, cfg_.d_model, cfg_.d_model};
    r.overrides.insert(r.overrides.begin(), {R"(\.attn\.qkv\.weight$)", qkv});
  }
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& p : named_parameters()) named.emplace_back(p.key(), p.value());
  return route_params(named, r);
}

}  // namespace orthopt::train

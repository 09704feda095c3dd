#!/usr/bin/env python3
"""The trainer's model (src/train/model.cpp) written plainly in PyTorch, and its training step
timed per part: the peer `orthopt bench train` runs beside its own step (bench/bench_train.cpp).

The model: byte embedding; pre-norm blocks of RMSNorm (statistics in fp32), causal self-attention
with one fused q/k/v projection and half-split rotary embeddings, RMSNorm, SwiGLU MLP; a final
RMSNorm and an untied head; no biases; GPT-2 style initialisation. Batches are drawn as the
trainer's BatchSampler draws them: offsets rng() % (n_train - context) from a 64-bit Mersenne
Twister seeded with --seed over the first bytes of --data (all but the last ceil(val_fraction·n)).

The step: bf16 autocast on CUDA, torch.compile where torch >= 2 and the device is CUDA (eager
otherwise), scaled_dot_product_attention where torch has it; clipping with
torch.nn.utils.clip_grad_norm_; --algorithm adamw: torch.optim.AdamW on everything (fused on
CUDA), otherwise orthopt's optimizer of that name on the block matrices (q, k and v
orthogonalized apart for muon and normuon, as the trainer routes them) and torch.optim.AdamW on
the embedding, head and norm gains.

Prints nothing on success; --json FILE receives the timings. --count-only builds the model on
the meta device and writes only its parameter count.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH_2 = int(torch.__version__.split(".")[0]) >= 2
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# ---------------------------------------------------------------- sampling

class MT19937_64:
    """std::mt19937_64 (the C++ standard's 64-bit Mersenne Twister) seeded with one integer."""

    N, M = 312, 156
    MASK = (1 << 64) - 1

    def __init__(self, seed):
        self.mt = [0] * self.N
        self.mt[0] = seed & self.MASK
        for i in range(1, self.N):
            prev = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & self.MASK
        self.index = self.N

    def _twist(self):
        upper, lower = 0xFFFFFFFF80000000, 0x7FFFFFFF
        mt = self.mt
        for i in range(self.N):
            x = (mt[i] & upper) | (mt[(i + 1) % self.N] & lower)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + self.M) % self.N] ^ xa
        self.index = 0

    def __call__(self):
        if self.index >= self.N:
            self._twist()
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & self.MASK


def train_bytes(path, val_fraction):
    with open(path, "rb") as f:
        data = f.read()
    n_val = math.ceil(val_fraction * len(data))
    return torch.frombuffer(bytearray(data[:len(data) - n_val]), dtype=torch.uint8)


class Sampler:
    def __init__(self, tokens, batch, context, seed):
        self.tokens, self.batch, self.context = tokens.long(), batch, context
        self.rng = MT19937_64(seed)

    def next(self, device):
        span = self.tokens.numel() - self.context
        offsets = torch.tensor([self.rng() % span for _ in range(self.batch)])
        idx = offsets[:, None] + torch.arange(self.context + 1)[None, :]
        windows = self.tokens[idx].to(device)
        return windows[:, :-1], windows[:, 1:]


# ---------------------------------------------------------------- model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(seq_len, head_dim, base):
    half = head_dim // 2
    inv_freq = base ** (-torch.arange(0, half, dtype=torch.float64) * (2.0 / head_dim))
    angles = torch.outer(torch.arange(0, seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)


class Attention(nn.Module):
    def __init__(self, d, n_heads, device=None):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d // n_heads
        self.qkv = nn.Linear(d, 3 * d, bias=False, device=device)
        self.proj = nn.Linear(d, d, bias=False, device=device)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    def __init__(self, d, d_ff, device=None):
        super().__init__()
        self.w_gate = nn.Linear(d, d_ff, bias=False, device=device)
        self.w_up = nn.Linear(d, d_ff, bias=False, device=device)
        self.w_down = nn.Linear(d_ff, d, bias=False, device=device)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, d, n_heads, d_ff, eps, device=None):
        super().__init__()
        self.norm1, self.attn = RMSNorm(d, eps, device), Attention(d, n_heads, device)
        self.norm2, self.mlp = RMSNorm(d, eps, device), SwiGLU(d, d_ff, device)

    def forward(self, x, cos, sin):
        h = x + self.attn(self.norm1(x), cos, sin)
        return h + self.mlp(self.norm2(h))


class Transformer(nn.Module):
    def __init__(self, vocab_size, d_model, n_layers, n_heads, d_ff, context, rope_base=10000.0, norm_eps=1e-6,
                 device=None):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model, device=device)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff, norm_eps, device) for _ in range(n_layers))
        self.norm_f = RMSNorm(d_model, norm_eps, device)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False, device=device)
        cos, sin = rope_tables(context, d_model // n_heads, rope_base)
        self.register_buffer("cos", cos.to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)
        residual_std = 0.02 / math.sqrt(2.0 * n_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() > 1 and p.device.type != "meta":
                    residual = "attn.proj" in name or "w_down" in name
                    p.normal_(0.0, residual_std if residual else 0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(self.norm_f(x)).float()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def model_from_args(a, device):
    return Transformer(a.vocab_size, a.d_model, a.n_layers, a.n_heads, a.d_ff, a.context, a.rope_base, a.norm_eps,
                       device=device)


# ---------------------------------------------------------------- optimizers

def make_optimizers(model, a, cuda):
    """The trainer's routing: block matrices to `algorithm` (lr a.lr, weight decay, momentum), the
    rest to AdamW (a.scalar_lr, weight decay; none on the embedding and head)."""
    adamw_extra = {"fused": True} if cuda and TORCH_2 else {"foreach": True}
    matrices, qkv, norms, no_decay = [], [], [], []
    for name, p in model.named_parameters():
        if name.startswith("blocks.") and p.dim() == 2:
            (qkv if name.endswith("attn.qkv.weight") else matrices).append(p)
        elif name.startswith(("tok_emb.", "lm_head.")):
            no_decay.append(p)
        else:
            norms.append(p)
    scalar_groups = [{"params": norms, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if a.algorithm == "adamw":
        groups = [{"params": matrices + qkv, "lr": a.lr, "weight_decay": a.weight_decay}]
        groups += [dict(g, lr=a.scalar_lr) for g in scalar_groups]
        opt = torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8, **adamw_extra)
        return [opt], f"torch.optim.AdamW ({'fused' if 'fused' in adamw_extra else 'foreach'})"
    import orthopt
    cls = {"muon": orthopt.Muon, "normuon": orthopt.NorMuon, "dion3": orthopt.Dion3, "dion": orthopt.Dion,
           "lion": orthopt.Lion}[a.algorithm]
    opts = {"lr": a.lr, "weight_decay": a.weight_decay}
    if a.algorithm in ("muon", "normuon", "dion3", "dion"):
        opts["momentum"] = a.momentum
    if a.algorithm in ("muon", "normuon"):
        groups = [{"params": qkv, "split_sizes": [a.d_model] * 3}, {"params": matrices}]
    else:
        groups = [{"params": qkv + matrices}]
    matrix_opt = cls(groups, **opts)
    scalar_opt = torch.optim.AdamW([dict(g, lr=a.scalar_lr) for g in scalar_groups], betas=(0.9, 0.95), eps=1e-8,
                                   **adamw_extra)
    return [matrix_opt, scalar_opt], (f"orthopt.{cls.__name__} on the block matrices + torch.optim.AdamW "
                                      f"({'fused' if 'fused' in adamw_extra else 'foreach'}) on the rest")


# ---------------------------------------------------------------- run

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, kind in [("d-model", int), ("n-layers", int), ("n-heads", int), ("d-ff", int), ("context", int)]:
        p.add_argument("--" + name, type=kind, required=True)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--rope-base", type=float, default=10000.0)
    p.add_argument("--norm-eps", type=float, default=1e-6)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--algorithm", default="muon", choices=["adamw", "muon", "normuon", "dion3", "dion", "lion"])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--scalar-lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.95)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--data")
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave torch's default)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--count-only", action="store_true", help="write the parameter count (meta device) and exit")
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)
    for name in ("d_model", "n_layers", "n_heads", "d_ff", "context", "batch_size", "steps"):
        if getattr(a, name) <= 0:
            p.error(f"argument --{name.replace('_', '-')}: must be positive, got {getattr(a, name)}")
    if a.d_model % a.n_heads or (a.d_model // a.n_heads) % 2:
        p.error("argument --n-heads: must divide --d-model into an even head dimension")
    if not a.count_only and not a.data:
        p.error("argument --data: required unless --count-only")
    return a


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


def main(argv=None):
    a = parse_args(argv)
    if a.count_only:
        model = model_from_args(a, torch.device("meta"))
        write_json(a.json, {"n_params": sum(p.numel() for p in model.parameters())})
        return 0
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("train_peer.py: error: argument --device: cuda requested but torch has no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    torch.manual_seed(a.seed)
    model = model_from_args(a, device)
    n_params = sum(p.numel() for p in model.parameters())
    params = list(model.parameters())
    optimizers, opt_desc = make_optimizers(model, a, cuda)
    compiled = cuda and TORCH_2 and not a.no_compile
    run = torch.compile(model) if compiled else model
    sampler = Sampler(train_bytes(a.data, a.val_fraction), a.batch_size, a.context, a.seed)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    totals = [0.0, 0.0, 0.0, 0.0]
    first_sum, loss = None, None
    model.train()
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        x, y = sampler.next(device)
        if first_sum is None:
            first_sum = int(x.sum())
        with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
            loss = run(x, y)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        sync()
        t3 = time.perf_counter()
        for opt in optimizers:
            opt.step()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        sync()
        t4 = time.perf_counter()
        if i >= a.warmup:
            for j, (s, e) in enumerate([(t0, t1), (t1, t2), (t2, t3), (t3, t4)]):
                totals[j] += (e - s) * 1e3
    final_loss = float(loss)
    if not math.isfinite(final_loss):
        print(f"train_peer.py: error: the loss is {final_loss} after the steps", file=sys.stderr)
        return 1
    fwd, bwd, clip, opt = (t / a.steps for t in totals)
    ms_step = fwd + bwd + clip + opt
    if cuda:
        peak, peak_kind = torch.cuda.max_memory_allocated(), "device, max allocated"
    else:
        peak, peak_kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process RSS, max"
    if compiled:
        how = "torch.compile"
    elif cuda and not TORCH_2:
        how = "eager (torch.compile needs torch >= 2)"
    elif cuda:
        how = "eager (--no-compile)"
    else:
        how = "eager (torch.compile is used on CUDA only)"
    mode = (f"PyTorch {torch.__version__}, {how}, {'bf16 autocast' if cuda else 'fp32'}, "
            f"{'scaled_dot_product_attention' if HAS_SDPA else 'explicit attention (no SDPA in this torch)'}; "
            f"{opt_desc}")
    write_json(a.json, {"n_params": n_params, "mode": mode, "torch": torch.__version__, "compiled": compiled,
                        "sdpa": HAS_SDPA, "optimizer": opt_desc, "threads": torch.get_num_threads(),
                        "tokens_per_s": a.batch_size * a.context / (ms_step / 1e3), "ms_per_step": ms_step,
                        "fwd_ms": fwd, "bwd_ms": bwd, "clip_ms": clip, "opt_ms": opt, "peak_memory_bytes": peak,
                        "peak_memory_kind": peak_kind, "final_loss": final_loss, "first_batch_sum": first_sum})
    return 0


if __name__ == "__main__":
    sys.exit(main())

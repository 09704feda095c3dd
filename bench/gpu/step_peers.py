"""Python peers of `orthopt bench step`: torch.optim.Muon + fused AdamW, and fused AdamW alone,
on performance.md's parameter sets (fp32 parameters, random gradients), CUDA-event median.
Run on a GPU machine: python3 bench/gpu/step_peers.py [gpt2|llama ...]"""
import sys

import torch


def param_set(name):
    shapes = []
    if name == "gpt2":
        for _ in range(12):
            shapes += [(2304, 768), (768, 768), (3072, 768), (768, 3072)] + [(768,)] * 4
        shapes += [(768,), (768,), ("emb", 50304, 768)]
    else:
        for _ in range(22):
            shapes += [(2048, 2048)] * 4 + [(5632, 2048)] * 2 + [(2048, 5632)] + [(2048,)] * 2
        shapes += [(2048,), ("emb", 32000, 2048), ("emb", 32000, 2048)]
    mats, others = [], []
    for s in shapes:
        emb = s[0] == "emb"
        p = torch.nn.Parameter(torch.randn(s[1:] if emb else s, device="cuda") * 0.02)
        p.grad = torch.randn_like(p) * 1e-3
        (others if emb or len(s) == 1 else mats).append(p)
    return mats, others


def round_robin_ms(fns, warmup, repeats):
    """Median ms of each callable, one call of each per round (so clock and power drift hit all)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[i].append(a.elapsed_time(b))
    return [sorted(t)[len(t) // 2] for t in times]


def median_ms(fn, warmup=3, repeats=10):
    """round_robin_ms of one callable."""
    return round_robin_ms([fn], warmup, repeats)[0]


def main():
    torch.manual_seed(0)
    for name in sys.argv[1:] or ["gpt2", "llama"]:
        mats, others = param_set(name)
        muon = torch.optim.Muon(mats, lr=0.02, weight_decay=0.01)
        adamw = torch.optim.AdamW(others, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01, fused=True)

        def step():
            muon.step()
            adamw.step()

        print(f"{name:<7} {'torch.optim.Muon + AdamW(fused)':<34} {median_ms(step):10.3f} ms", flush=True)
        del muon, adamw
        everything = torch.optim.AdamW(mats + others, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01, fused=True)
        print(f"{name:<7} {'AdamW(fused), all parameters':<34} {median_ms(everything.step):10.3f} ms", flush=True)
        del everything, mats, others
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

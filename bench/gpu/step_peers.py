"""Python peers of `orthopt bench step`: torch.optim.Muon + fused AdamW, and fused AdamW alone,
on performance.md's parameter sets (fp32 parameters, random gradients), CUDA-event median.
Run on a GPU machine: python3 bench/gpu/step_peers.py [gpt2|llama ...] (sets: bench/param_sets.h)"""
import json
import os
import sys

import torch

# The sets are defined once, in bench/param_sets.h: a JSON document in a C++ raw string literal,
# which `orthopt bench step` compiles in and param_sets() reads.
SETS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "param_sets.h")


def param_sets():
    """{set name: definition} from bench/param_sets.h."""
    with open(SETS_FILE) as f:
        text = f.read()
    return json.loads(text.split('kParamSetsJson[] = R"json(', 1)[1].split(')json";', 1)[0])


def param_shapes(name):
    """[(parameter name, shape, matrix)] of a set, in creation order. matrix: a block's matrix, the
    matrix optimizer's (route_params gives the rest, vectors, embedding and head, to AdamW)."""
    sets = param_sets()
    if name not in sets:
        raise ValueError(f"unknown parameter set {name!r} (known: {', '.join(sets)})")
    s = sets[name]
    shapes = []
    for i in range(s["blocks"]):
        shapes += [(f"{s['prefix']}.{i}.{n}", tuple(shape), len(shape) == 2) for n, shape in s["block"]]
    return shapes + [(n, tuple(shape), False) for n, shape in s["final"]]


def param_set(name, device="cuda"):
    """The set's parameters with random values and gradients: (matrices, the rest)."""
    mats, others = [], []
    for _, shape, matrix in param_shapes(name):
        p = torch.nn.Parameter(torch.randn(shape, device=device) * 0.02)
        p.grad = torch.randn_like(p) * 1e-3
        (mats if matrix else others).append(p)
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
    for name in sys.argv[1:] or list(param_sets()):
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

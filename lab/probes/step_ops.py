"""CPU timing and ATen op count of one optimizer step, batched (execution banks=on) vs the
per-matrix reference path (banks=off), on a GPT-2-like matrix set (docs/optimizers.md, "Batched
Dion3 and NorMuon"; docs/execution.md). The op count is the number of ATen calls a step makes
that do work on data, seen through a TorchDispatchMode (which also sees the C++ step's calls, each
op once, deterministically): views, detach and allocations are left out, so it approximates the
kernels a GPU step launches (one per elementwise op, reduction, copy, fill, matmul; topk a few).

PYTHONPATH=build/python /usr/bin/python3 lab/probes/step_ops.py [--scale 8] [--ns-steps 5] [--repeats 3]
--scale s divides every dimension by s (12 x [2304x768, 768x768, 3072x768, 768x3072] at s=1).
Times are CPU time of this process (time.process_time, one intra-op thread by default), so other
jobs on a shared machine disturb them less than wall time; min and median of the repeats. Also
printed: minor page faults per step (median), the CPU cost of large fresh temporaries.
"""
import argparse
import resource
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import orthopt


def gpt2_like(scale, gen):
    d = 768 // scale
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * 12
    return [torch.randn(s, generator=gen).mul_(0.02).requires_grad_() for s in shapes]


# Ops that only make views or allocate: no kernel.
NO_KERNEL = frozenset("""detach unsqueeze expand _reshape_alias view select slice transpose t as_strided alias empty
    empty_like empty_strided permute squeeze _unsafe_view split narrow unbind lift_fresh
    _record_function_enter _record_function_enter_new _record_function_exit""".split())


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in NO_KERNEL:
            self.ops += 1
        return func(*args, **(kwargs or {}))


PATHS = ("reference", "batched")
# Each path's execution options; the batched path is not the CPU default, so both are forced.
EXECUTION = {"reference": {"banks": "off"}, "batched": {"banks": "on"}}


def run(algo, args):
    """Both paths on their own copies of the set, stepped alternately (load drifts hit both)."""
    gen = torch.Generator().manual_seed(0)
    params = gpt2_like(args.scale, gen)
    grads = [torch.randn(p.shape, generator=gen) for p in params]
    opts, times, faults = {}, {}, {}
    for path in PATHS:
        own = [p.detach().clone().requires_grad_() for p in params]
        for p, g in zip(own, grads):
            p.grad = g.clone()
        opts[path] = orthopt.Muon(own, algorithm=algo, lr=0.02, weight_decay=0.01, ns_steps=args.ns_steps,
                                  method="standard", execution=EXECUTION[path])
        opts[path].step()  # state exists
        times[path], faults[path] = [], []
    for _ in range(args.repeats):
        for path in PATHS:
            f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
            opts[path].step()
            times[path].append(time.process_time() - t0)
            faults[path].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    out = {}
    for path in PATHS:
        with CountOps() as count:
            opts[path].step()
        t, f = sorted(times[path]), sorted(faults[path])
        out[path] = (t[0] * 1e3, t[len(t) // 2] * 1e3, count.ops, f[len(f) // 2])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--ns-steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--algos", default="dion3,normuon")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"GPT-2-like set / {args.scale}, ns_steps {args.ns_steps}, {torch.get_num_threads()} threads")
    for algo in args.algos.split(","):
        res = run(algo, args)
        for path in PATHS:
            lo, med, ops, flt = res[path]
            print(f"{algo:8} {path:9} step CPU time min {lo:9.1f} ms, median {med:9.1f} ms ({args.repeats} steps), "
                  f"{ops:5d} ATen kernel ops, {flt:6d} page faults", flush=True)


if __name__ == "__main__":
    main()

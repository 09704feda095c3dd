"""Cost of the Python glue of ``process_group=`` (python/orthopt/dist.py) on CPU Gloo.

Model: GPT-2-like, scaled down so that a step takes tens of ms on 2 cores: 12 layers, width 128,
vocabulary 2048, context 256, 148 params (2.67M elements, fp32). The 48 matrices (c_attn
[384,128], c_proj [128,128], c_fc [512,128], mlp c_proj [128,512] per layer) are one Muon group;
embeddings, layer norms and biases (100 params) one AdamW group, so the flat buffers hold banks of
four shapes and a scalar vector whose blocks split params across ranks. Fixed random gradients.

Per world size N (Gloo processes on this host, --threads torch threads in each; default 1: on
this 2-core machine 2 threads made the C++ step 2-3x slower and noisier), rank 0 reports medians
in ms over --steps rounds. Each round times, one after the other (so that load from other
processes hits every variant alike; with --compare the two engines' order alternates by round):
  cpp     a step of a single-process optimizer on a copy of the model (orthopt.Muon without
          process_group: the C++ step plus its thin Python wrapper; rank 0 only, the others wait)
  step    a step of the distributed optimizer (engine.step())
  local   the local C++ step inside it (engine.local.step())
  copies  _pack_grads + _pack_params + _unpack_params, each also printed
  floor   one torch.cat of all gradients into a buffer: the memory traffic of one full copy
With ``--compare FILE`` (another dist.py, e.g. the version before a change) every round also
times the same for a second engine built from FILE on the same optimizer, so both are measured
in the same processes under the same load:
    git show <old commit>:python/orthopt/dist.py > /tmp/old_dist.py
    PYTHONPATH=build/python /usr/bin/python3 lab/probes/dist_python_overhead.py --compare /tmp/old_dist.py
Results: docs/distributed.md (Python section, "Overhead").
"""
import argparse
import importlib.util
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAYERS, D, VOCAB, CTX = 12, 128, 2048, 256


def make_groups(seed=0):
    g = torch.Generator().manual_seed(seed)
    mats, rest = [], []

    def new(shape, into):
        p = (torch.randn(shape, generator=g) * 0.02).requires_grad_()
        p.grad = torch.randn(shape, generator=g) * 0.01
        into.append(p)

    new((VOCAB, D), rest)
    new((CTX, D), rest)
    for _ in range(LAYERS):
        new((D,), rest), new((D,), rest)                  # ln_1
        new((3 * D, D), mats), new((3 * D,), rest)        # attn.c_attn
        new((D, D), mats), new((D,), rest)                # attn.c_proj
        new((D,), rest), new((D,), rest)                  # ln_2
        new((4 * D, D), mats), new((4 * D,), rest)        # mlp.c_fc
        new((D, 4 * D), mats), new((D,), rest)            # mlp.c_proj
    new((D,), rest), new((D,), rest)                      # ln_f
    return [dict(params=mats, algorithm="muon", lr=0.02),
            dict(params=rest, algorithm="adamw", lr=3e-3, weight_decay=0.01)]


def load_module(path):
    import orthopt  # noqa: F401  (the package its relative imports need)
    spec = importlib.util.spec_from_file_location("orthopt._bench_compared_dist", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "orthopt"
    spec.loader.exec_module(module)
    return module


def ms(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def worker(rank, world, port, args, queue):
    torch.set_num_threads(args.threads)
    import orthopt
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    opt = orthopt.Muon(make_groups(), process_group=dist.group.WORLD)
    engines = {"this": opt._dist}
    if args.compare:
        engines["compared"] = load_module(args.compare).DistributedEngine(opt, dist.group.WORLD)
    single = orthopt.Muon(make_groups()) if rank == 0 else None
    grads = [p.grad.view(-1) for g in opt.param_groups for p in g["params"]]
    buf = torch.empty(sum(x.numel() for x in grads))
    times = {}

    def add(key, value):
        times.setdefault(key, []).append(value)

    with torch.no_grad():
        for n in range(3 + args.steps):
            t = {"cpp": ms(single.step) if rank == 0 else 0.0, "floor": ms(lambda: torch.cat(grads, out=buf))}
            for name, e in (list(engines.items())[::-1] if n % 2 else engines.items()):  # alternating order
                dist.barrier()
                t[name, "step"] = ms(e.step)
                t[name, "local"] = ms(e.local.step)
                for f in ("_pack_grads", "_pack_params", "_unpack_params"):
                    t[name, f] = ms(getattr(e, f))
            if n >= 3:
                for k, v in t.items():
                    add(k, v)
    if rank == 0:
        queue.put({k: statistics.median(v) for k, v in times.items()})
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--compare", help="another dist.py (e.g. an older version), timed alongside")
    args = ap.parse_args()
    groups = make_groups()
    print(f"model: {sum(len(g['params']) for g in groups)} params, "
          f"{sum(p.numel() for g in groups for p in g['params'])} elements; torch {torch.__version__}, "
          f"{os.cpu_count()} cores, {args.threads} thread(s) per process; medians of {args.steps} rounds, ms")
    print(f"{'N':>2} {'dist.py':<9} {'cpp':>6} {'step':>6} {'local':>6} {'copies':>6} {'step-cpp':>8} "
          f"{'pack_grads':>10} {'pack_params':>11} {'unpack':>6} {'floor':>5}")
    ctx = mp.get_context("spawn")
    for world in args.ranks:
        queue = ctx.SimpleQueue()
        mp.start_processes(worker, args=(world, free_port(), args, queue), nprocs=world, start_method="spawn")
        t = queue.get()
        for name in ("compared", "this") if args.compare else ("this",):
            parts = [t[name, f] for f in ("_pack_grads", "_pack_params", "_unpack_params")]
            label = "this" if name == "this" else "compared"
            print(f"{world:>2} {label:<9} {t['cpp']:6.1f} {t[name, 'step']:6.1f} {t[name, 'local']:6.1f} "
                  f"{sum(parts):6.2f} {t[name, 'step'] - t['cpp']:8.1f} {parts[0]:10.2f} {parts[1]:11.2f} "
                  f"{parts[2]:6.2f} {t['floor']:5.2f}")


if __name__ == "__main__":
    main()

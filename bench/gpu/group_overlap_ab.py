"""A/B of ORTHOPT_GROUP_OVERLAP: the AdamW group's launch on a side stream beside the matrix
group's orthogonalization (=1, opt-in) against every group on the caller's stream in group order
(unset), in one process, round-robin, on performance.md's parameter sets (bench/gpu/step_peers.py).
Run on a GPU machine: PYTHONPATH=build-gpu/python python3 bench/gpu/group_overlap_ab.py
[gpt2|llama ...] [--algos=muon,dion3] [--repeats=N]
Eager: one optimizer, the variable set before each step (it is read when a step is queued).
Graph: one CudaGraphOptimizer per variant, each captured with its setting (a replay repeats what
was captured); all of them step the same parameters, each with its own state."""
import os
import sys

import torch

import orthopt
from profile_step import groups_for, sets_and_flags
from step_peers import param_set, round_robin_ms


def with_overlap(on, fn):
    def run():
        if on:
            os.environ["ORTHOPT_GROUP_OVERLAP"] = "1"
        else:
            os.environ.pop("ORTHOPT_GROUP_OVERLAP", None)
        fn()
    return run


def main():
    torch.manual_seed(0)
    sets, flags = sets_and_flags(sys.argv[1:])
    algos = flags.get("algos", "muon,dion3").split(",")
    repeats = int(flags.get("repeats", "30"))
    print("| set | algorithm | eager, in order | eager, beside | graph, in order | graph, beside | graph beside / in order |")
    print("|---|---|---|---|---|---|---|")
    for name in sets:
        mats, others = param_set(name)
        for algo in algos:
            eager = orthopt.Muon(groups_for(algo, mats, others))
            graphs = {}
            for on in (False, True):
                g = orthopt.CudaGraphOptimizer(orthopt.Muon(groups_for(algo, mats, others)), warmup_steps=2)
                for _ in range(3):  # two eager warm-up steps and the capture, with this setting
                    with_overlap(on, g.step)()
                assert g.captured
                graphs[on] = g
            fns = [with_overlap(False, eager.step), with_overlap(True, eager.step),
                   with_overlap(False, graphs[False].step), with_overlap(True, graphs[True].step)]
            ms = round_robin_ms(fns, warmup=3, repeats=repeats)
            print(f"| {name} | {algo} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | {ms[3]:.3f} | {ms[3] / ms[2]:.3f} |",
                  flush=True)
            del eager, graphs, fns
            torch.cuda.empty_cache()
        del mats, others
        torch.cuda.empty_cache()
    os.environ.pop("ORTHOPT_GROUP_OVERLAP", None)


if __name__ == "__main__":
    main()

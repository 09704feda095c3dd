#!/usr/bin/python3
"""Tabulates finished `orthopt train`/`compare` runs: for each algorithm at a chosen lr, the final
validation loss over seeds and the steps to reach a target (default: AdamW's mean final loss).

usage: summarize_runs.py --runs DIR [DIR...] --pick adamw=0.00075 muon=0.01 ... [--target L]
Every DIR is searched for run directories (config.json + metrics.jsonl); lr grids show up as
extra rows with --grid.
"""
import argparse
import json
import math
import pathlib
import statistics
from collections import defaultdict


def load_runs(roots):
    runs = []
    for root in roots:
        for cfg_path in pathlib.Path(root).rglob("config.json"):
            cfg = json.loads(cfg_path.read_text())
            evals = []
            for line in (cfg_path.parent / "metrics.jsonl").read_text().splitlines():
                rec = json.loads(line)
                if rec["type"] == "eval":
                    evals.append((rec["step"], rec["val_loss"]))
            if not evals or evals[-1][0] != cfg["steps"]:
                continue  # unfinished
            runs.append({"alg": cfg["algorithm"], "lr": cfg["lr"], "seed": cfg["seed"], "evals": evals})
    return runs


def crossing(evals, target):
    """Step where the validation curve first reaches target, linearly interpolated between the
    two evaluations around the crossing; None if it never does."""
    prev = None
    for step, loss in evals:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return float(step)
            return prev[0] + (prev[1] - target) / (prev[1] - loss) * (step - prev[0])
        prev = (step, loss)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--pick", nargs="+", required=True, help="algorithm=lr")
    ap.add_argument("--target", type=float)
    ap.add_argument("--grid", action="store_true", help="also list every (algorithm, lr) seen")
    args = ap.parse_args()
    runs = load_runs(args.runs)
    by = defaultdict(dict)  # (alg, lr) -> seed -> evals (duplicates of a deterministic run are identical)
    for r in runs:
        by[(r["alg"], r["lr"])][r["seed"]] = r["evals"]
    picks = [(p.split("=")[0], float(p.split("=")[1])) for p in args.pick]
    finals = {k: [ev[-1][1] for ev in by[k].values()] for k in picks}
    target = args.target or statistics.mean(finals[picks[0]])
    first = picks[0]
    # The reference (first --pick) reaches its own mean final loss by definition at its budget.
    budget = max(s for ev in by[first].values() for s, _ in ev)
    print(f"Target: {target:.4f} ({first[0]}'s mean final validation loss after {budget} steps).\n")
    print(f"| optimizer | lr | seeds | final val loss (mean ± std) | first eval <= target (per seed) "
          f"| interpolated steps (mean) | vs {first[0]}'s {budget} |")
    print("|---|---|---|---|---|---|---|")
    for k in picks:
        seeds = sorted(by[k])
        coarse = [next((s for s, v in by[k][sd] if v <= target), None) for sd in seeds]
        fine = [crossing(by[k][sd], target) for sd in seeds]
        m = statistics.mean(finals[k])
        sd = statistics.stdev(finals[k]) if len(finals[k]) > 1 else 0.0
        per_seed = ", ".join(str(s) if s is not None else "—" for s in coarse)
        if k == first:
            steps_cell, vs = f"{budget} (by definition)", "–"
        elif all(f is not None for f in fine):
            mean_fine = statistics.mean(fine)
            steps_cell, vs = f"{mean_fine:.0f}", f"{100 * (mean_fine - budget) / budget:+.0f}%"
        else:
            steps_cell, vs = f"not reached by {sum(f is None for f in fine)}/{len(fine)} seeds", "–"
        print(f"| {k[0]} | {k[1]:g} | {len(seeds)} | {m:.4f} ± {sd:.4f} | {per_seed} | {steps_cell} | {vs} |")
    if args.grid:
        print("\n| optimizer | lr | seed | final val loss |\n|---|---|---|---|")
        for (alg, lr), seeds in sorted(by.items()):
            for seed, ev in sorted(seeds.items()):
                print(f"| {alg} | {lr:g} | {seed} | {ev[-1][1]:.4f} |")


if __name__ == "__main__":
    main()

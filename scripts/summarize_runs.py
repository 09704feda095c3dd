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
    print(f"| optimizer | lr | seeds | final val loss (mean ± std) | steps to {target:.4f} (mean; per seed) | vs {first[0]} |")
    print("|---|---|---|---|---|---|")
    base = None
    for k in picks:
        seeds = sorted(by[k])
        steps = [next((s for s, v in by[k][sd] if v <= target), None) for sd in seeds]
        reached = [s for s in steps if s is not None]
        m = statistics.mean(finals[k])
        sd = statistics.stdev(finals[k]) if len(finals[k]) > 1 else 0.0
        mean_steps = statistics.mean(reached) if len(reached) == len(steps) else math.nan
        if base is None:
            base = mean_steps
        vs = f"{100 * (mean_steps - base) / base:+.0f}%" if not math.isnan(mean_steps) else "–"
        per_seed = ", ".join(str(s) if s is not None else "—" for s in steps)
        print(f"| {k[0]} | {k[1]:g} | {len(seeds)} | {m:.4f} ± {sd:.4f} | "
              f"{'%.0f' % mean_steps if not math.isnan(mean_steps) else 'not all reached'} ({per_seed}) | {vs} |")
    if args.grid:
        print("\n| optimizer | lr | seed | final val loss |\n|---|---|---|---|")
        for (alg, lr), seeds in sorted(by.items()):
            for seed, ev in sorted(seeds.items()):
                print(f"| {alg} | {lr:g} | {seed} | {ev[-1][1]:.4f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Draws the validation-loss curves of `orthopt compare` (curves.csv) into a PNG.

usage: plot_compare.py CURVES_CSV OUT_PNG [--target LOSS]
One line per optimizer: the mean over seeds at each evaluated step, with the min–max band
over seeds when there are several.
"""
import argparse
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("curves_csv")
    ap.add_argument("out_png")
    ap.add_argument("--target", type=float, default=None, help="horizontal line at this loss")
    args = ap.parse_args()

    # algorithm -> step -> [loss per seed]
    curves = defaultdict(lambda: defaultdict(list))
    order = []
    with open(args.curves_csv, newline="") as f:
        for row in csv.DictReader(f):
            alg = row["algorithm"]
            if alg not in order:
                order.append(alg)
            curves[alg][int(row["step"])].append(float(row["val_loss"]))
    if not order:
        print(f"plot_compare: {args.curves_csv} holds no curves", file=sys.stderr)
        return 1

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for alg in order:
        steps = sorted(curves[alg])
        losses = [curves[alg][s] for s in steps]
        mean = [sum(v) / len(v) for v in losses]
        (line,) = ax.plot(steps, mean, label=alg, linewidth=1.6)
        if any(len(v) > 1 for v in losses):
            ax.fill_between(steps, [min(v) for v in losses], [max(v) for v in losses],
                            color=line.get_color(), alpha=0.2, linewidth=0)
    if args.target is not None:
        ax.axhline(args.target, color="gray", linestyle="--", linewidth=1, label=f"target {args.target:.4f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (nats/byte)")
    # The early steps dwarf the differences that matter: show the second half of the range.
    all_losses = [x for alg in order for v in curves[alg].values() for x in v]
    lo, hi = min(all_losses), max(all_losses)
    ax.set_ylim(lo - 0.02 * (hi - lo), lo + 0.5 * (hi - lo) if hi > lo else hi + 0.1)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("orthopt compare: validation loss")
    fig.tight_layout()
    fig.savefig(args.out_png)
    return 0


if __name__ == "__main__":
    sys.exit(main())

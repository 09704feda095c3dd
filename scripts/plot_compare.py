#!/usr/bin/python3
"""Draws the validation-loss curves of `orthopt compare` (curves.csv) into a PNG.

usage: plot_compare.py RUN_DIR [--out PNG]
       plot_compare.py CURVES_CSV OUT_PNG [--target LOSS]

RUN_DIR: reads RUN_DIR/curves.csv and the target loss from RUN_DIR/compare.csv, writes
RUN_DIR/compare.png (or --out); this is how the plot of a study trained on a machine without
matplotlib is drawn afterwards. One line per optimizer (curves.csv's `optimizer` column, else
`algorithm`): the mean over seeds at each evaluated step, with the min-max band over seeds when
there are several. Every evaluation lies inside the axes: the y axis is logarithmic and spans all
points (the first evaluations, several nats/byte, and the last ones, which differ in the second
decimal, on one scale), the x axis all steps.
Exit status 3: matplotlib cannot be imported (nothing is written).
"""
import argparse
import csv
import math
import os
import sys
from collections import defaultdict


def read_curves(path):
    """(order, curves): the row names in file order and name -> step -> [loss per seed]."""
    curves = defaultdict(lambda: defaultdict(list))
    order = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name = row.get("optimizer") or row["algorithm"]
            if row.get("lr"):
                name = f"{name} (lr {row['lr']})"
            if name not in order:
                order.append(name)
            curves[name][int(row["step"])].append(float(row["val_loss"]))
    return order, curves


def read_target(compare_csv):
    """The target loss compare.csv records, or None."""
    if not os.path.exists(compare_csv):
        return None
    with open(compare_csv, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("target_loss"):
                return float(row["target_loss"])
    return None


def y_limits(values):
    """Limits holding every value with a margin of 3% of the range (in log space when all are > 0)."""
    lo, hi = min(values), max(values)
    if lo <= 0:
        pad = 0.03 * (hi - lo) or 0.05 * max(abs(hi), 1.0)
        return lo - pad, hi + pad, False
    ratio = hi / lo if hi > lo else 1.1
    return lo / ratio ** 0.03, hi * ratio ** 0.03, True


def draw(order, curves, target=None):
    """The figure and its axes."""
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name in order:
        steps = sorted(curves[name])
        losses = [curves[name][s] for s in steps]
        mean = [sum(v) / len(v) for v in losses]
        (line,) = ax.plot(steps, mean, label=name, linewidth=1.6, marker="o", markersize=2.5)
        if any(len(v) > 1 for v in losses):
            ax.fill_between(steps, [min(v) for v in losses], [max(v) for v in losses],
                            color=line.get_color(), alpha=0.2, linewidth=0)
    values = [x for name in order for v in curves[name].values() for x in v]
    if target is not None and math.isfinite(target):
        values.append(target)
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:.4f}")
    lo, hi, log = y_limits(values)
    if log:
        ax.set_yscale("log")
        # A log axis over less than a decade has no labelled decade: label round values instead.
        ax.yaxis.set_major_locator(ticker.FixedLocator(ticker.MaxNLocator(nbins=8).tick_values(lo, hi)))
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.set_ylim(lo, hi)
    steps = [s for name in order for s in curves[name]]
    pad = 0.02 * (max(steps) - min(steps)) or 1.0
    ax.set_xlim(min(steps) - pad, max(steps) + pad)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (nats/byte, log scale)" if log else "validation loss (nats/byte)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("orthopt compare: validation loss")
    fig.tight_layout()
    return fig, ax


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a compare run directory, or its curves.csv")
    ap.add_argument("out_png", nargs="?", help="with a curves.csv: the PNG to write")
    ap.add_argument("--out", help="with a run directory: the PNG to write (default RUN_DIR/compare.png)")
    ap.add_argument("--target", type=float, default=None, help="horizontal line at this loss")
    args = ap.parse_args(argv)

    if os.path.isdir(args.source):
        if args.out_png:
            ap.error("with a run directory, give the PNG as --out")
        curves_csv = os.path.join(args.source, "curves.csv")
        out = args.out or os.path.join(args.source, "compare.png")
        target = args.target if args.target is not None else read_target(os.path.join(args.source, "compare.csv"))
    else:
        if not args.out_png:
            ap.error("with a curves.csv, give the PNG to write")
        curves_csv, out, target = args.source, args.out_png, args.target
    if not os.path.exists(curves_csv):
        print(f"plot_compare: {curves_csv} does not exist", file=sys.stderr)
        return 2
    order, curves = read_curves(curves_csv)
    if not order:
        print(f"plot_compare: {curves_csv} holds no curves", file=sys.stderr)
        return 2
    try:
        import matplotlib
    except ImportError:
        print(f"plot_compare: matplotlib is not installed for {sys.executable} (Debian: python3-matplotlib); "
              f"on a machine with it: /usr/bin/python3 scripts/plot_compare.py {os.path.dirname(curves_csv) or '.'}",
              file=sys.stderr)
        return 3
    matplotlib.use("Agg")  # files only, no display
    fig, _ = draw(order, curves, target)
    fig.savefig(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

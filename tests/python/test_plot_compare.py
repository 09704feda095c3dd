"""scripts/plot_compare.py on synthetic curves.csv files: the PNG is written, every evaluation
(the high first ones included) lies inside the axes' limits, the run-directory form reads the
target from compare.csv, and a python without matplotlib exits with 3 and says how to plot later."""
import csv
import importlib.util
import math
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "plot_compare.py")


def load_script():
    spec = importlib.util.spec_from_file_location("plot_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_study(dirname, rng, with_compare_csv=True):
    """A run directory with curves.csv (three optimizers, three seeds, losses from ~5.5 down to
    ~1.6 nats/byte) and compare.csv; returns the points as (optimizer, step, loss)."""
    os.makedirs(dirname, exist_ok=True)
    points = []
    with open(os.path.join(dirname, "curves.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["algorithm", "seed", "step", "val_loss", "optimizer", "lr"])
        for name, alg, lr, floor in [("adamw", "adamw", "0.0006", 1.75), ("muon", "muon", "0.01", 1.62),
                                     ("dion3 f=0.25", "dion3", "0.005", 1.70)]:
            for seed in (1, 2, 3):
                for step in range(25, 301, 25):
                    loss = floor + (5.55 - floor) * math.exp(-step / 60.0) + rng.uniform(-0.01, 0.01)
                    w.writerow([alg, seed, step, f"{loss:.8f}", name, lr])
                    points.append((name, step, loss))
    if with_compare_csv:
        with open(os.path.join(dirname, "compare.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["optimizer", "target_loss"])
            w.writerow(["adamw", "1.7512"])
            w.writerow(["muon", "1.7512"])
    return points


def test_every_evaluation_inside_the_axes(tmp_path):
    mod = load_script()
    points = write_study(tmp_path, random.Random(7))
    order, curves = mod.read_curves(os.path.join(tmp_path, "curves.csv"))
    assert order == ["adamw (lr 0.0006)", "muon (lr 0.01)", "dion3 f=0.25 (lr 0.005)"]
    fig, ax = mod.draw(order, curves, target=1.7512)
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    assert ax.get_yscale() == "log"
    for _, step, loss in points:
        assert x0 < step < x1
        assert y0 < loss < y1, (loss, y0, y1)
    # The first evaluations (> 4 nats/byte) and the final ones (< 1.8) share the axes.
    assert max(p[2] for p in points) > 4.0 and min(p[2] for p in points) < 1.8
    assert y0 < 1.7512 < y1


def test_run_directory_form_writes_the_png(tmp_path):
    write_study(tmp_path, random.Random(11))
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    png = os.path.join(tmp_path, "compare.png")
    with open(png, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 10000
    assert load_script().read_target(os.path.join(tmp_path, "compare.csv")) == 1.7512


def test_curves_csv_form_and_the_older_columns(tmp_path):
    # curves.csv of the form before grids: algorithm, seed, step, val_loss.
    path = os.path.join(tmp_path, "curves.csv")
    with open(path, "w") as f:
        f.write("algorithm,seed,step,val_loss\nadamw,1,3,5.4\nadamw,1,6,2.0\nmuon,1,3,5.1\nmuon,1,6,1.9\n")
    out = os.path.join(tmp_path, "plot.png")
    r = subprocess.run([sys.executable, SCRIPT, path, out, "--target", "2.0"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(out) > 1000
    order, curves = load_script().read_curves(path)
    assert order == ["adamw", "muon"] and curves["muon"][6] == [1.9]


def test_without_matplotlib_exit_3_and_nothing_written(tmp_path):
    write_study(tmp_path, random.Random(3))
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "matplotlib.py").write_text("raise ImportError('no matplotlib here')\n")
    env = dict(os.environ, PYTHONPATH=str(fake))
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 3
    assert "matplotlib is not installed" in r.stderr
    assert f"scripts/plot_compare.py {tmp_path}" in r.stderr
    assert not os.path.exists(os.path.join(tmp_path, "compare.png"))


def test_missing_curves_is_an_error(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "curves.csv does not exist" in r.stderr

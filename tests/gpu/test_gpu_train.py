"""`orthopt train` on a CUDA device (skipped without one; run tests/gpu/run.sh): the trainer's
CUDA path (bf16 autocast, the fused attention, the guards) with the optimizer step eager and as
a CUDA graph (`--cuda-graph`), and exact resume on the GPU.

`--deterministic` (torch's strict mode) makes two runs of one configuration bit-identical on one
device, and a graph replay is bit-identical to the eager step (docs/cuda_graph.md), so a graph
run must reproduce the eager run's metrics exactly: every training loss, gradient norm and
validation loss, each of which depends on all parameters after the step before. The runs have a
scheduled lr (WSD warm-up and decay), clipping, and a non-finite step injected after the capture
(step 15; the capture is at step 11)."""
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

orthopt = pytest.importorskip("orthopt")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# The binary next to the Python package of the same build (PYTHONPATH=<build>/python).
BIN = os.environ.get("ORTHOPT_BIN") or str(Path(orthopt.__file__).resolve().parents[2] / "orthopt")

STEPS = 24


def corpus(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "corpus.txt"
    if not path.exists():
        words = "the light water and earth said was good of day night upon face deep form void moved".split()
        x, out = 12345, []
        while sum(len(w) + 1 for w in out) < 60000:
            x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
            out.append(words[(x >> 33) % len(words)])
        path.write_text(" ".join(out))
    return path


def train(run_dir, data, *extra):
    args = [BIN, "train", "--preset", "tiny", "--context", "64", "--batch-size", "8", "--steps", str(STEPS),
            "--eval-every", "8", "--eval-batches", "2", "--checkpoint-every", "8", "--keep-last", "5",
            "--device", "cuda", "--data", str(data), "--run-dir", str(run_dir), "--progress", "off",
            "--inject-nonfinite", "15", *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def metrics(run_dir):
    """metrics.jsonl without the timing fields (the only ones allowed to differ)."""
    lines = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        j = json.loads(line)
        j.pop("time_s", None)
        j.pop("tokens_per_s", None)
        j.pop("opt_ms", None)
        lines.append(j)
    return lines


def check_run(lines):
    train_lines = [j for j in lines if j["type"] == "train"]
    assert [j["step"] for j in train_lines] == list(range(1, STEPS + 1))
    assert [j["skipped"] for j in train_lines if j["step"] == 15] == ["nonfinite"]
    evals = [j["val_loss"] for j in lines if j["type"] == "eval"]
    assert len(evals) == 3 and evals[-1] < train_lines[0]["loss"] - 0.5  # it learns


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return corpus(tmp_path_factory)


def test_deterministic_runs_repeat_bit_for_bit(tmp_path, data):
    train(tmp_path / "a", data, "--deterministic", "true")
    train(tmp_path / "b", data, "--deterministic", "true")
    check_run(metrics(tmp_path / "a"))
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")


@pytest.mark.parametrize("algorithm,extra", [
    ("muon", []), ("normuon", []), ("dion3", []), ("adamw", []), ("lion", []),
    ("muon", ["--n-experts", "4", "--top-k", "2"]), ("dion", ["--dion-qr", "cholesky"]),
], ids=["muon", "normuon", "dion3", "adamw", "lion", "muon-moe", "dion-cholesky"])
# Not Dion with the Householder QR: torch.linalg.qr's bits depend on the CUDA stream it runs on
# (docs/cuda_graph.md, "Dion and streams"), and the graph is captured on a stream of torch's pool,
# not the eager run's. test_dion_cuda_graph_run_repeats_and_tracks_eager_run checks what holds
# there. Dion's Cholesky QR2 takes no linalg.qr unless a factorization fails.
def test_cuda_graph_run_equals_eager_run(tmp_path, data, algorithm, extra):
    common = ["--algorithm", algorithm, "--deterministic", "true", *extra]
    train(tmp_path / "eager", data, *common)
    out = train(tmp_path / "graph", data, *common, "--cuda-graph", "true")
    assert "optimizer step as a CUDA graph" in out
    check_run(metrics(tmp_path / "graph"))
    assert metrics(tmp_path / "graph") == metrics(tmp_path / "eager")


def test_dion_cuda_graph_run_repeats_and_tracks_eager_run(tmp_path, data):
    """Dion (Householder QR) as a graph: two graph runs are bit-identical (the capture stream is
    the same pool stream in every run of one program), and the graph run follows the eager run
    to fp32 rounding. In fp32 (`--bf16 false`): under bf16 autocast a weight that differs in its
    last fp32 bit flips bf16 roundings of activations, and the runs parted by 1.5e-3 of the
    gradient norm two steps after the capture (H200), noise that would hide a wrong step. The
    tolerance: the first difference is a few fp32 ulps of some weights (docs/cuda_graph.md), and
    it grew to 3.1e-7 of a gradient norm by the end (H200); 1e-5 leaves 30×
    that and is far below what a wrong step (a stale lr, a missed skip, an update applied
    twice) changes within one."""
    common = ["--algorithm", "dion", "--dion-qr", "householder", "--deterministic", "true", "--bf16", "false"]
    train(tmp_path / "eager", data, *common)
    for run in ("graph_a", "graph_b"):
        out = train(tmp_path / run, data, *common, "--cuda-graph", "true")
        assert "optimizer step as a CUDA graph" in out
    check_run(metrics(tmp_path / "graph_a"))
    assert metrics(tmp_path / "graph_a") == metrics(tmp_path / "graph_b")
    eager, graph = metrics(tmp_path / "eager"), metrics(tmp_path / "graph_a")
    assert [(j["type"], j["step"], j.get("skipped")) for j in graph] == \
        [(j["type"], j["step"], j.get("skipped")) for j in eager]
    worst, where = 0.0, None
    for e, g in zip(eager, graph):
        for key in ("loss", "grad_norm", "val_loss"):
            if isinstance(e.get(key), float) and math.isfinite(e[key]):
                d = abs(g[key] - e[key]) / abs(e[key])
                if d > worst:
                    worst, where = d, (e["type"], e["step"], key)
            else:  # absent, or the injected step's non-finite value (JSON null)
                assert g.get(key) == e.get(key), (e["step"], key)
    print(f"Dion graph run against the eager run: largest relative difference {worst:.3g} at {where}")
    assert worst < 1e-5, where


def test_tf32_switches_fp32_products_to_tf32(tmp_path, data):
    """`--tf32 true` (torch's allow_tf32 for the run): Dion's fp32 products and, with `--bf16 false`,
    the model's matmuls take TF32 inputs. Under --deterministic both runs are reproducible, so a
    switch that did nothing would give the fp32 run's metrics bit for bit."""
    common = ["--algorithm", "dion", "--dion-qr", "cholesky", "--bf16", "false", "--deterministic", "true"]
    train(tmp_path / "fp32", data, *common)
    out = train(tmp_path / "tf32", data, *common, "--tf32", "true")
    assert "TF32 products" in out
    check_run(metrics(tmp_path / "tf32"))
    assert metrics(tmp_path / "tf32") != metrics(tmp_path / "fp32")


def test_resume_on_cuda_with_cuda_graph_is_bit_exact(tmp_path, data):
    """Interrupted after step 12 (a checkpoint), resumed: the wrapper is made after the state is
    loaded, warms up and captures again, and the run ends as the uninterrupted one."""
    common = ["--deterministic", "true", "--cuda-graph", "true"]
    train(tmp_path / "whole", data, *common)
    train(tmp_path / "split", data, *common, "--stop-after", "12")
    assert not (tmp_path / "split" / "step_16").exists()
    out = train(tmp_path / "split", data, *common, "--resume")
    assert "resumed from" in out
    assert metrics(tmp_path / "split") == metrics(tmp_path / "whole")


def test_default_cuda_run_learns_with_cuda_graph(tmp_path, data):
    """Without --deterministic (the fast kernels, e.g. the flash attention's backward): the run
    completes and learns; no bit-exactness is claimed."""
    train(tmp_path / "fast", data, "--cuda-graph", "true")
    check_run(metrics(tmp_path / "fast"))

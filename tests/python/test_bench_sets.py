"""The optimizer-step benchmarks' parameter sets (bench/param_sets.h): the Python scripts
(bench/gpu/step_peers.py, imported by dion_peers.py and profile_step.py) build the same parameters as
`orthopt bench step`, whose --dry-run lists them with the optimizer route_params gives each."""
import importlib.util
import json
import os
import pathlib
import subprocess

import pytest
import torch

ROOT = pathlib.Path(os.environ.get("ORTHOPT_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BIN = os.environ.get("ORTHOPT_BIN", str(ROOT / "build" / "orthopt"))


def load_step_peers():
    spec = importlib.util.spec_from_file_location("step_peers", ROOT / "bench" / "gpu" / "step_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


step_peers = load_step_peers()


@pytest.fixture(scope="module")
def cpp_sets(tmp_path_factory):
    if not os.path.exists(BIN):
        pytest.skip(f"{BIN} not built")
    out = tmp_path_factory.mktemp("bench_sets") / "sets.json"
    subprocess.run([BIN, "bench", "step", "--dry-run", "--sets", ",".join(step_peers.param_sets()), "--json", str(out)],
                   check=True, env=dict(os.environ, ORTHOPT_NUM_THREADS="1"), stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["sets"]


def test_the_sets_are_gpt2_llama_and_small(cpp_sets):
    assert list(step_peers.param_sets()) == ["gpt2", "llama", "small"]
    assert sorted(cpp_sets) == ["gpt2", "llama", "small"]


@pytest.mark.parametrize("name, matrices, others, elements", [
    ("gpt2", 48, 51, 123_606_528),  # GPT-2 124M (embedding 50304x768, no separate head)
    ("llama", 154, 47, 1_261_529_088),  # Llama-style 1.26B (embedding and head)
    ("small", 16, 5, 4 * ((384 + 128 + 512 + 512) * 128 + 128) + 1000 * 128),
])
def test_python_shapes_and_routing_equal_the_cpp_ones(cpp_sets, name, matrices, others, elements):
    py = step_peers.param_shapes(name)
    cpp = cpp_sets[name]
    assert [(n, list(s)) for n, s, _ in py] == [(p["name"], p["shape"]) for p in cpp]
    # The scripts' split (block matrices to the matrix optimizer) is route_params' one.
    assert [m for _, _, m in py] == [p["optimizer"] == "matrix" for p in cpp]
    assert all(p["optimizer"] in ("matrix", "adamw") for p in cpp)
    assert sum(m for _, _, m in py) == matrices
    assert sum(not m for _, _, m in py) == others
    assert sum(torch.Size(s).numel() for _, s, _ in py) == elements


def test_param_set_builds_the_shapes_in_order():
    mats, others = step_peers.param_set("gpt2", device="meta")
    shapes = step_peers.param_shapes("gpt2")
    assert [tuple(p.shape) for p in mats] == [s for _, s, m in shapes if m]
    assert [tuple(p.shape) for p in others] == [s for _, s, m in shapes if not m]
    assert all(p.grad is not None and p.grad.shape == p.shape for p in mats + others)


def test_unknown_set_is_refused():
    with pytest.raises(ValueError, match="unknown parameter set 'gpt3'"):
        step_peers.param_shapes("gpt3")

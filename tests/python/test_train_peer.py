"""bench/train_peer.py, the PyTorch peer of `orthopt bench train`: the same parameters as the C++
trainer's model (counted on the meta device here, against the C++ model's count that
`orthopt bench train --dry-run` reports), the C++ standard's 64-bit Mersenne Twister behind its
sampler, and one training step."""
import importlib.util
import json
import math
import os
import pathlib
import subprocess

import pytest
import torch

ROOT = pathlib.Path(os.environ.get("ORTHOPT_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BIN = os.environ.get("ORTHOPT_BIN", str(ROOT / "build" / "orthopt"))


def load_peer():
    spec = importlib.util.spec_from_file_location("train_peer", ROOT / "bench" / "train_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


peer = load_peer()


def cpp_model(preset, tmp_path):
    """The C++ model's dimensions and parameter count, from the CLI's dry run."""
    if not os.path.exists(BIN):
        pytest.skip(f"{BIN} not built")
    out = tmp_path / f"{preset}.json"
    env = dict(os.environ, ORTHOPT_NUM_THREADS="1")
    subprocess.run([BIN, "bench", "train", "--dry-run", "--device", "cpu", "--preset", preset, "--json", str(out)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def peer_args(extra):
    return peer.parse_args(extra + ["--json", "unused.json"])


@pytest.mark.parametrize("preset", ["tiny", "gpt2-124m"])
def test_parameter_count_equals_the_cpp_models(preset, tmp_path):
    doc = cpp_model(preset, tmp_path)
    dims = doc["model"]
    argv = [x for k in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "context")
            for x in ("--" + k.replace("_", "-"), str(dims[k]))] + ["--count-only"]
    model = peer.model_from_args(peer_args(argv), torch.device("meta"))
    assert all(p.device.type == "meta" for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == doc["n_params"]
    # The C++ count of product weights (all but the embedding) is the peer's too.
    n_matmul = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and not name.startswith("tok_emb"))
    assert n_matmul == doc["n_matmul_params"]


def test_mersenne_twister_is_the_cpp_standards():
    # [rand.predef]: the 10000th invocation of a default-constructed std::mt19937_64 (seed 5489)
    # produces 9981545732273789042.
    # The first outputs of that generator are 14514284786278117030, 4620546740167642908.
    rng = peer.MT19937_64(5489)
    assert rng() == 14514284786278117030
    assert rng() == 4620546740167642908
    for _ in range(9997):
        rng()
    assert rng() == 9981545732273789042


def test_sampler_windows_are_offsets_of_the_training_bytes(tmp_path):
    text = ("In the beginning God created the heaven and the earth. " * 40).encode()
    path = tmp_path / "corpus.txt"
    path.write_bytes(text)
    tokens = peer.train_bytes(str(path), 0.1)
    assert tokens.numel() == len(text) - math.ceil(0.1 * len(text))
    sampler = peer.Sampler(tokens, batch=3, context=16, seed=7)
    rng = peer.MT19937_64(7)
    x, y = sampler.next(torch.device("cpu"))
    for b in range(3):
        offset = rng() % (tokens.numel() - 16)
        assert bytes(x[b].tolist()) == text[offset:offset + 16]
        assert bytes(y[b].tolist()) == text[offset + 1:offset + 17]


@pytest.mark.parametrize("algorithm", ["adamw", "muon"])
def test_one_step_runs_and_reports_positive_times(algorithm, tmp_path):
    if algorithm != "adamw":
        pytest.importorskip("orthopt")
    path = tmp_path / "corpus.txt"
    path.write_text("And God said, Let there be light: and there was light. " * 30)
    out = tmp_path / "peer.json"
    rc = peer.main(["--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64", "--context", "32",
                    "--batch-size", "2", "--steps", "1", "--warmup", "0", "--algorithm", algorithm, "--data",
                    str(path), "--device", "cpu", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    for key in ("tokens_per_s", "ms_per_step", "fwd_ms", "bwd_ms", "opt_ms", "peak_memory_bytes", "final_loss"):
        assert math.isfinite(doc[key]) and doc[key] > 0, key
    assert doc["clip_ms"] >= 0
    assert doc["compiled"] is False
    assert doc["first_batch_sum"] > 0
    n_expected = 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 2 * 256 * 32 + 32
    assert doc["n_params"] == n_expected

"""The distributed Python optimizers (process_group=, python/orthopt/dist.py) on NCCL: 2 ranks,
rank r on cuda:r, against a single-process optimizer on the global batch on cuda:0.

Skipped without 2 CUDA GPUs or without NCCL. Run by bench/gpu/run_nccl.sh; alone:
    PYTHONPATH=build-gpu/python python3 -m pytest -q -rs tests/gpu/test_dist_nccl.py
Dry run of the same logic on Gloo and the CPU (a machine without GPUs; ~20 s on 2 cores):
    ORTHOPT_NCCL_DRY_RUN=1 PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/gpu/test_dist_nccl.py

The worker, its scenarios and the checks are those of tests/python/test_dist_python.py (the Gloo
version), run with ORTHOPT_TEST_BACKEND=nccl, ORTHOPT_TEST_DEVICE=cuda and fp32 params: the mixed
model (Muon, NorMuon, Dion3, Dion, AdamW and Lion groups; wide, tall and square matrices, a
[3,16,24] stack sharing a bank with two [16,24], a 4-D stack, vectors, an embedding-like [40,8];
gradients missing on some ranks or everywhere; an LR change), Newton–Schulz in fp32
(compute_dtype=torch.float32 in its groups; with the CUDA default, bf16/fp16, the batching
differences below would be of bf16 size).
What NCCL adds over Gloo: reduce_scatter_tensor / all_gather_into_tensor in place on the flat
buffers (Gloo's path is an all-reduce plus a slice and the list all-gather), object collectives
(start-up check, full_state_dict) on the current device, CUDA tensors everywhere.

Tolerance (1e-5 relative per parameter, fp32): the local gradients are multiples of 1/256 in
[-1/4, 1/4), so a sum over 2 ranks and the division by 2 are exact in fp32 whatever order NCCL's
reduction adds in; the averaged gradient the owner steps with is bit-identical to the single
process's mean. What differs is how the matrices are batched: the single process orthogonalizes
each bank (same-shape matrices of a group) in one batched call, a rank only its owned matrices,
and cuBLAS may pick another kernel (another summation order) per batch size, i.e. fp32 rounding
(~1e-7 relative per product) that the 5 NS iterations carry into the update; the parameter moves
by lr·update (lr 0.02: ~1% of its norm per step), so over 3 steps the relative parameter
difference is expected at ~1e-8..1e-7 (Gloo on the CPU, the dry run: 1.0e-8, from Dion's batched
fp32 products; fp64 on the CPU: 2.9e-9). 1e-5 leaves 100x margin for that and
still fails on any distribution error: a wrong owner, chunk or padding gives O(1e-2) and more, a
missing average 2x momentum buffers in the full-state check (the algorithms themselves are
scale-invariant up to eps, so that one is caught through the state, not the parameters).
"""
import os
import sys
import time

import pytest
import torch

orthopt = pytest.importorskip("orthopt")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import test_dist_python as base  # noqa: E402  the Gloo version: worker, scenarios, checks

DRY = os.environ.get("ORTHOPT_NCCL_DRY_RUN") == "1"
BACKEND, DEVICE = ("gloo", "cpu") if DRY else ("nccl", "cuda")
REF_DEVICE = "cpu" if DRY else "cuda:0"
WORLD = 2
DTYPE = torch.float32
TOL = 1e-5
TIMEOUT_S = 60        # the process group's timeout in the main launch (NCCL's default is 10 min)
KILL_TIMEOUT_S = 10   # ... in the kill test: how long NCCL waits for the dead rank
KILL_LIMIT_S = KILL_TIMEOUT_S + 50  # the survivors must be gone this long after the death
# NVLink multicast stays off on the test machine (bench/gpu/run_nccl.sh sets the same).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _why_skip():
    if DRY:
        return None
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        return "torch.distributed has no NCCL"
    if torch.cuda.device_count() < WORLD:
        return f"needs {WORLD} CUDA GPUs, found {torch.cuda.device_count()}"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))


def worker_env(**extra):
    env = dict(NO_MULTICAST, ORTHOPT_TEST_BACKEND=BACKEND, ORTHOPT_TEST_DEVICE=DEVICE, ORTHOPT_TEST_DTYPE="float32",
               ORTHOPT_TEST_TIMEOUT_S=str(TIMEOUT_S))
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="module")
def reference():
    """The single-process optimizer on the global batch, on cuda:0."""
    _, opt, snaps = base.run_reference(WORLD, DTYPE, base.STEPS, snapshots=(1, base.STEPS), device=REF_DEVICE)
    return {"snaps": snaps, "state": opt.state_dict(), "state_bytes": opt.state_bytes}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One launch of 2 ranks runs every scenario."""
    os.environ.update(NO_MULTICAST)  # this process too (the reference runs here)
    out = tmp_path_factory.mktemp("nccl")
    _, opt, _ = base.run_reference(WORLD, torch.float32, 2, device=REF_DEVICE)
    torch.save(base.to_cpu(opt.state_dict()), out / "ref_state.pt")
    scenarios = ["exact", "dion_q", "saveload", "mismatch"]
    t0 = time.time()
    res = base.launch(WORLD, scenarios, out, worker_env(ORTHOPT_TEST_REF_STATE=out / "ref_state.pt"),
                      timeout=TIMEOUT_S + 30)
    info = f"torch {torch.__version__}"
    if not DRY:
        v = torch.cuda.nccl.version()
        info += f", NCCL {'.'.join(map(str, v)) if isinstance(v, tuple) else v}, {torch.cuda.get_device_name(0)}"
    res["info"] = (f"{BACKEND} {WORLD} ranks ({info}): {time.time() - t0:.1f} s; per scenario (rank 0): " +
                   ", ".join(f"{s} {res[s][0]['seconds']:.2f} s" for s in scenarios))
    return res


def test_launch(runs, capsys):
    """The launch itself (every scenario's result was saved; the checks follow)."""
    with capsys.disabled():
        print("\n" + runs["info"])


def test_matches_single_process_on_global_batch(runs, reference, capsys):
    res = base.result(runs["exact"])
    worst = base.check_matches_single_process(res, reference["snaps"], DTYPE, TOL)
    with capsys.disabled():
        print(f"\n{BACKEND} {WORLD} ranks vs 1 process on {REF_DEVICE} (fp32, NS fp32, {base.STEPS} steps): "
              f"largest relative difference {worst:.2e} (bound {TOL:g})")


def test_dion_pieces_start_from_the_single_process_q(runs):
    base.check_dion_q(base.result(runs["dion_q"]), WORLD, DTYPE, REF_DEVICE)


def test_full_state_dict_equals_single_process_state(runs, reference):
    base.check_full_state(base.result(runs["exact"]), reference["state"], WORLD, DTYPE, TOL, REF_DEVICE)


def test_state_is_sharded(runs, reference, capsys):
    total = reference["state_bytes"]
    per_rank = base.check_state_sharded(base.result(runs["exact"]), reference["state"], total, WORLD)
    with capsys.disabled():
        print(f"\n{BACKEND}: state bytes per rank {per_rank} of {total}")


def test_save_load_continues_bit_identically_and_reshards(runs):
    base.check_save_load(base.result(runs["saveload"]), WORLD, TOL, REF_DEVICE)


def test_mismatch_raises_on_every_rank(runs):
    base.check_mismatch(base.result(runs["mismatch"]), WORLD, BACKEND, DEVICE)


def test_killed_rank_ends_the_others_with_an_error(tmp_path, capsys):
    """Rank 1 is SIGKILLed after its first step; rank 0 steps on. NCCL cannot see the death in a
    collective (the peer's GPU memory just stops changing), so the group's timeout decides: torch
    2.x's watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING, default 3 = SkipCleanUp) takes the process
    down (SIGABRT) once a collective is older than the timeout given to init_process_group, or
    with TORCH_NCCL_BLOCKING_WAIT=1 the wait raises instead. The default NCCL timeout is 10 min:
    a real job must pass its own. Either ending passes here; a hang or a finished run fails."""
    t0 = time.time()
    ranks = base.run_kill(WORLD, tmp_path, worker_env(ORTHOPT_TEST_TIMEOUT_S=KILL_TIMEOUT_S),
                          timeout=KILL_LIMIT_S + 30)
    lines = base.check_kill(ranks, WORLD, KILL_LIMIT_S)
    with capsys.disabled():
        print(f"\n{BACKEND} kill test ({time.time() - t0:.1f} s, group timeout {KILL_TIMEOUT_S} s): " + "; ".join(lines))

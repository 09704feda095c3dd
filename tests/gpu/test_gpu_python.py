"""GPU checks of the Python module (skipped without CUDA; run tests/gpu/run.sh).

The reference is standard Newton–Schulz in float64 written here in plain torch, on random
inputs; the bound is the bf16 noise of the same iteration run densely in plain torch bf16."""
import contextlib

import pytest
import torch

orthopt = pytest.importorskip("orthopt")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def polar_express():
    s = next(x for x in orthopt.schedules() if x["name"] == "polar_express")
    return s["triples"], s["safety"], s["eps"]


def plain_ns(G, dtype, steps=5):
    triples, safety, eps = polar_express()
    X = G.to(torch.float64 if dtype == torch.float64 else torch.float32)
    X = (X / (X.norm(dim=(-2, -1), keepdim=True) * safety + eps)).to(dtype)
    for t in range(steps):
        a, b, c = triples[min(t, len(triples) - 1)]
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.double()


def rel(x, ref):
    return ((x.double().cpu() - ref.cpu()).norm() / ref.cpu().norm()).item()


@pytest.mark.parametrize("shape", [(384, 640), (3, 256, 256)])
def test_standard_ns_bf16_on_cuda_within_bf16_noise(shape):
    torch.manual_seed(3)
    G = torch.randn(shape, dtype=torch.float64, device="cuda")
    ref = plain_ns(G, torch.float64)
    noise = rel(plain_ns(G, torch.bfloat16), ref)
    out = orthopt.orthogonalize(G.float(), method="standard", compute_dtype=torch.bfloat16)
    assert out.dtype == torch.float32 and out.is_cuda
    err = rel(out, ref)
    assert torch.isfinite(out).all()
    assert err <= 1.5 * noise + 1e-3, (err, noise)


@pytest.mark.parametrize("algorithm", ["muon", "adamw", "lion"])
def test_step_is_seen_by_autograd_as_an_inplace_update(algorithm):
    """The fused kernels write through raw pointers; the step must still bump the parameters'
    version counters, so a backward through a graph that saved a parameter before the step fails
    loudly (as with torch.optim) instead of using the updated values."""
    p = torch.randn(64, 96, device="cuda", requires_grad=True)
    opt = orthopt.Muon([p], algorithm=algorithm, lr=0.01)
    p.grad = torch.randn_like(p)
    loss = (p * p).sum()  # saves p for backward
    v0 = p._version
    opt.step()
    assert p._version > v0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


# ---- no hidden host synchronization
#
# torch's sync debug mode ("error") raises at every synchronizing call that goes through c10's hooks
# (.item(), copies to the host, stream or device synchronize). An optimizer step that synchronizes
# makes the host wait for the GPU every step, so the next step's launches cannot queue up behind
# the running kernels. A direct CUDA runtime call would pass unseen, so the CUDA-graph tests
# (capture fails on any synchronization) complement this one for the algorithms they capture.

MATRICES = [(96, 160), (160, 96), (128, 128), (2, 64, 96), (3, 200, 72)]


@contextlib.contextmanager
def sync_debug_error():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("algorithm", ["muon", "normuon", "dion3", "dion", "adamw", "lion"])
def test_eager_step_does_not_synchronize(algorithm):
    """Every step of each algorithm, the first (which creates the state) included, fp32 parameters
    on their default GPU paths; one AdamW group of vectors beside the matrix groups."""
    gen = torch.Generator().manual_seed(11)
    mats = [torch.randn(s, generator=gen).cuda().requires_grad_() for s in MATRICES]
    vecs = [torch.randn(96, generator=gen).cuda().requires_grad_()]
    groups = [{"params": mats, "algorithm": algorithm}, {"params": vecs, "algorithm": "adamw", "lr": 3e-3}]
    opt = orthopt.Muon(groups, lr=0.02, weight_decay=0.1)
    before = [p.detach().clone() for p in mats + vecs]
    for step in range(3):
        for p in mats + vecs:
            p.grad = torch.randn(p.shape, generator=gen).cuda()
        with sync_debug_error():
            opt.step()
    assert all(torch.isfinite(p).all() and not torch.equal(p, b) for p, b in zip(mats + vecs, before))


def test_orthogonalize_synchronizes_only_for_its_nonfinite_check():
    """docs/orthogonalization.md: nonfinite="error" costs one host synchronization (the flag is read
    after the work is enqueued); "propagate" costs none."""
    G = torch.randn(4, 256, 384, device="cuda")
    with sync_debug_error():
        out = orthopt.orthogonalize(G, nonfinite="propagate")
    assert torch.isfinite(out).all()
    with pytest.raises(RuntimeError, match="synchroniz"):
        with sync_debug_error():
            orthopt.orthogonalize(G)

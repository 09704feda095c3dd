"""Every optimizer's GPU step against its CPU step (correctness on the GPU).

Same fp32 parameters and gradients on both devices, 1 and 5 steps; compared is the displacement
W − W₀ (what the steps did), relative to the CPU run's. Bounds:
- fp32 orthogonalization on both sides (standard NS, no TF32): both are fp32 rounding of the same
  iteration, measured to be far below 1e-4 (5 NS steps amplify per-product rounding ~1e-6);
- the GPU default (bf16 NS through our kernels) against the CPU's fp32: bf16 noise, 5e-2 like the
  torch.optim.Muon parity test (unit roundoff 3.9e-3, several products);
- AdamW and Lion: the same element-wise fp32 operations (no FMA contraction in the fused kernels),
  1e-6 (the CPU may vectorize and round sqrt/div alike; any reordering would show at ~1e-7).
Dion3's row choice is taken from fp32 momentum on both devices before any orthogonalization, so
it is the same rows unless two row norms tie to the last bit (random data: they do not).
"""
import pytest
import torch

orthopt = pytest.importorskip("orthopt")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPES = [(96, 160), (160, 96), (128, 128), (3, 64, 96), (2, 96, 160)]  # last: one bank with the first
MATRIX = ["muon", "normuon", "dion3", "dion"]


def run(device, algorithm, steps, **opts):
    g = torch.Generator().manual_seed(5)
    params = [torch.randn(s, generator=g).to(device).requires_grad_() for s in SHAPES]
    W0 = [p.detach().cpu().clone() for p in params]
    lr = 3e-3 if algorithm in ("adamw", "lion") else 0.02
    opt = orthopt.Muon(params, algorithm=algorithm, lr=lr, weight_decay=0.1, **opts)
    for t in range(steps):
        gg = torch.Generator().manual_seed(100 + t)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gg).to(device)
        opt.step()
    return [p.detach().cpu() - w for p, w in zip(params, W0)]


def worst(gpu, cpu):
    return max(((a.double() - b.double()).norm() / b.double().norm()).item() for a, b in zip(gpu, cpu))


@pytest.mark.parametrize("algorithm", MATRIX)
@pytest.mark.parametrize("steps", [1, 5])
def test_matrix_step_fp32_matches_cpu(algorithm, steps, capsys):
    opts = dict(method="standard", compute_dtype=torch.float32)
    err = worst(run("cuda", algorithm, steps, **opts), run("cpu", algorithm, steps, **opts))
    with capsys.disabled():
        print(f"\n{algorithm} fp32, {steps} step(s): GPU vs CPU displacement rel diff {err:.2e}")
    assert err < 1e-4


@pytest.mark.parametrize("steps", [1, 5])
def test_dion_cholesky_qr_gpu_matches_cpu_householder(steps, capsys):
    """Dion's Cholesky QR2 (fp64, cuSOLVER/cuBLAS) on the GPU against the CPU's Householder QR:
    the same updates to fp32 precision (column signs of Q do not reach P·Qᵀ); same bound."""
    gpu = run("cuda", "dion", steps, dion_qr="cholesky")
    err = worst(gpu, run("cpu", "dion", steps))
    with capsys.disabled():
        print(f"\ndion cholesky QR on the GPU vs CPU householder, {steps} step(s): rel diff {err:.2e}")
    assert err < 1e-4


@pytest.mark.parametrize("algorithm", ["muon", "normuon", "dion3"])
def test_matrix_step_default_gpu_dtype_within_bf16_noise(algorithm, capsys):
    err = worst(run("cuda", algorithm, 5), run("cpu", algorithm, 5))
    with capsys.disabled():
        print(f"\n{algorithm} GPU default (bf16 NS) vs CPU fp32, 5 steps: rel diff {err:.2e}")
    assert err < 5e-2


@pytest.mark.parametrize("algorithm", ["adamw", "lion"])
@pytest.mark.parametrize("steps", [1, 5])
def test_elementwise_step_matches_cpu(algorithm, steps, capsys):
    err = worst(run("cuda", algorithm, steps), run("cpu", algorithm, steps))
    with capsys.disabled():
        print(f"\n{algorithm}, {steps} step(s): GPU vs CPU displacement rel diff {err:.2e}")
    assert err < 1e-6

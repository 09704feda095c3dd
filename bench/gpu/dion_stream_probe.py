"""Probe for docs/cuda_graph.md, "Dion and streams": does a Dion step, or one of its ops, give
other bits on a second CUDA stream than on the current one?

Twenty-ninth session's finding (H200, torch 2.11): under torch's deterministic mode a Dion step
run once on a fresh stream after steps on the current stream was off by 3e-8 in one of two
runs; never on the per-parameter reference path (ORTHOPT_GPU_KERNELS=0), never without
deterministic mode. This script repeats that with more trials and then bisects the bank path's
ops. Each op is computed once on the current stream and then `--trials` times on a fresh
stream each. It prints how many trials differed in their bits.

    PYTHONPATH=build-gpu/python python3 bench/gpu/dion_stream_probe.py [--trials 8]
"""
import argparse
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as `orthopt train --deterministic`

import torch  # noqa: E402

# The tiny preset's matrix shapes (docs/training.md), where the trainer's graph run differed.
SHAPES = [(128, 128)] * 16 + [(384, 128)] * 4 + [(128, 384)] * 4


def on_fresh_stream(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return out


def count_differing(name, fn, trials):
    ref = fn()
    torch.cuda.synchronize()
    bad = 0
    for _ in range(trials):
        out = on_fresh_stream(fn)
        bad += any(not torch.equal(a, b) for a, b in zip(ref, out))
    print(f"  {name}: {bad} of {trials} fresh-stream trials differ")


def op_probes(trials):
    g = torch.Generator(device="cuda").manual_seed(0)
    M = torch.randn(16, 128, 128, device="cuda", generator=g)
    Q = torch.randn(16, 128, 32, device="cuda", generator=g)
    T = torch.randn(4, 384, 128, device="cuda", generator=g)
    QT = torch.randn(4, 128, 32, device="cuda", generator=g)
    P = torch.linalg.qr(M @ Q)[0]
    count_differing("bmm [16,128,128]x[16,128,32]", lambda: [M @ Q], trials)
    count_differing("bmm [4,384,128]x[4,128,32]", lambda: [T @ QT], trials)
    count_differing("bmm M^T P [16,128,128]^T x[16,128,32]", lambda: [M.transpose(-2, -1) @ P], trials)
    count_differing("bmm P R^T [16,128,32]x[16,32,128]", lambda: [P @ Q.transpose(-2, -1)], trials)
    count_differing("linalg_qr [16,128,32] (cuBLAS batched geqrf)", lambda: list(torch.linalg.qr(M @ Q)), trials)
    count_differing("linalg_qr [4,384,32] (cuSOLVER)", lambda: list(torch.linalg.qr(T @ QT)), trials)
    count_differing("column norms [16,128,32]", lambda: [torch.linalg.vector_norm(P, 2, dim=-2, keepdim=True)],
                    trials)


def step_probe(orthopt, trials, kernels):
    """Nine Dion steps on the current stream, the tenth on a fresh stream, against ten on the current."""
    os.environ["ORTHOPT_GPU_KERNELS"] = kernels

    def run(fresh_at):
        gen = torch.Generator().manual_seed(0)
        ps = [(0.1 * torch.randn(s, generator=gen)).cuda().requires_grad_() for s in SHAPES]
        opt = orthopt.Dion([dict(params=ps)], lr=0.02, weight_decay=0.01, rank_fraction=0.25)
        for t in range(10):
            gg = torch.Generator().manual_seed(1000 + t)
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gg).cuda()
            if t == fresh_at:
                on_fresh_stream(opt.step)
            else:
                opt.step()
        torch.cuda.synchronize()
        return [p.detach().clone() for p in ps]

    ref = run(None)
    bad = sum(any(not torch.equal(a, b) for a, b in zip(ref, run(9))) for _ in range(trials))
    print(f"  Dion step 10 on a fresh stream (ORTHOPT_GPU_KERNELS={kernels}): {bad} of {trials} trials differ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    args = ap.parse_args()
    if args.trials < 1:
        ap.error("argument --trials: must be >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    import orthopt
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for det in (True, False):
        torch.use_deterministic_algorithms(det)
        print(f"deterministic={det}")
        for kernels in ("1", "0"):
            step_probe(orthopt, args.trials, kernels)
        op_probes(args.trials)
    os.environ.pop("ORTHOPT_GPU_KERNELS", None)


if __name__ == "__main__":
    main()

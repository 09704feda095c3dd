"""Probe for docs/cuda_graph.md, "Dion and streams": does a Dion step, or one of its ops, give
other bits on a second CUDA stream than on the current one?

The finding it probes (torch 2.11): under torch's deterministic mode a Dion step
run once on a fresh stream after steps on the current stream was off by 3e-8 in one of two
runs; never on the per-parameter reference path (execution kernels=off), never without
deterministic mode. This script repeats that with more trials, with a run-to-run baseline (every
step on the current stream), with torch's NaN fill of new memory off, and names the state that
differs; then it probes the bank path's ops alone and composed (one bank's step written in
torch). Each op is computed once on the current stream and then `--trials` times on a fresh
stream each. It prints how many trials differed in their bits.

    PYTHONPATH=build-gpu/python python3 lab/probes/dion_stream_probe.py [--trials 8] [--ops-only]

(--ops-only needs torch only, no orthopt build.)
"""
import argparse
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as `orthopt train --deterministic`

import torch  # noqa: E402
import torch.utils.deterministic  # noqa: E402,F401  (fill_uninitialized_memory)

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


def count_differing(name, fn, trials, fresh=True):
    """Runs fn once on the current stream, then `trials` times on a fresh stream each (or, with
    fresh=False, again on the current stream: the run-to-run baseline)."""
    ref = fn()
    torch.cuda.synchronize()
    bad = 0
    for _ in range(trials):
        out = on_fresh_stream(fn) if fresh else fn()
        torch.cuda.synchronize()
        bad += any(not torch.equal(a, b) for a, b in zip(ref, out))
    where = "fresh-stream" if fresh else "same-stream"
    print(f"  {name}: {bad} of {trials} {where} trials differ")


# The bank shapes of the tiny preset [B, m, n], Dion's rank r = 32 for each.
BANKS = ((16, 128, 128), (4, 384, 128), (4, 128, 384))


def op_probes(trials):
    """Each op of one bank's Dion step (step_dion_banks, Householder QR) on its own."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, m, n in BANKS:
        M = torch.randn(B, m, n, device="cuda", generator=g)
        Q = torch.randn(B, n, 32, device="cuda", generator=g)
        raw = M @ Q
        P = torch.linalg.qr(raw)[0]
        R = M.transpose(-2, -1) @ P
        Qn = R / (torch.linalg.vector_norm(R, 2, dim=-2, keepdim=True) + 1e-8)
        s = f"[{B},{m},{n}]"
        count_differing(f"{s} P = M Q (bmm)", lambda: [M @ Q], trials)
        count_differing(f"{s} linalg_qr(P)", lambda: list(torch.linalg.qr(raw)), trials)
        count_differing(f"{s} R = M^T P (bmm)", lambda: [M.transpose(-2, -1) @ P], trials)
        count_differing(f"{s} P R^T (bmm)", lambda: [P @ R.transpose(-2, -1)], trials)
        count_differing(f"{s} column norms of R", lambda: [torch.linalg.vector_norm(R, 2, dim=-2, keepdim=True)],
                        trials)
        count_differing(f"{s} P Q^T (bmm)", lambda: [P @ Qn.transpose(-2, -1)], trials)


def per_stream_probe(streams):
    """Is the difference a property of the stream? The one QR that differed ([4,128,32]) on
    `streams` fresh streams (torch hands out its pool's streams round-robin), three times on each,
    against the current stream."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, m, n in BANKS:  # the same inputs as op_probes()
        M = torch.randn(B, m, n, device="cuda", generator=g)
        Q = torch.randn(B, n, 32, device="cuda", generator=g)
    raw = M @ Q
    ref = torch.linalg.qr(raw)
    torch.cuda.synchronize()
    rows = []
    for k in range(streams):
        st = torch.cuda.Stream()
        verdicts = []
        for _ in range(3):
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                out = torch.linalg.qr(raw)
            torch.cuda.current_stream().wait_stream(st)
            torch.cuda.synchronize()
            verdicts.append(any(not torch.equal(a, b) for a, b in zip(ref, out)))
        if any(verdicts):
            rows.append(f"stream {k} (handle {st.cuda_stream:#x}): differs in {sum(verdicts)} of 3")
    print(f"  linalg_qr [4,128,32] on {streams} fresh streams: {len(rows)} differ")
    for r in rows:
        print(f"    {r}")


def dion_run(orthopt, kernels, fresh_at):
    """Ten Dion steps on the tiny preset's shapes with execution kernels=`kernels`; step `fresh_at`
    (None: none) on a fresh stream. Returns the weights, momenta and Q after the last step."""
    gen = torch.Generator().manual_seed(0)
    ps = [(0.1 * torch.randn(s, generator=gen)).cuda().requires_grad_() for s in SHAPES]
    opt = orthopt.Dion([dict(params=ps)], lr=0.02, weight_decay=0.01, rank_fraction=0.25,
                       execution={"kernels": kernels})
    for t in range(10):
        gg = torch.Generator().manual_seed(1000 + t)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gg).cuda()
        if t == fresh_at:
            on_fresh_stream(opt.step)
        else:
            opt.step()
    torch.cuda.synchronize()
    return {"weight": [p.detach().clone() for p in ps],
            "momentum": [opt.state[p]["momentum"].clone() for p in ps],
            "Q": [opt.state[p]["Q"].clone() for p in ps]}


def diff_report(ref, out):
    """'' when equal, else which state differs, in which params (index:shape), by how much."""
    parts = []
    for key in ref:
        bad = [(i, (a - b).abs().max().item()) for i, (a, b) in enumerate(zip(ref[key], out[key]))
               if not torch.equal(a, b)]
        if bad:
            worst = max(d for _, d in bad)
            where = ",".join(f"{i}:{'x'.join(map(str, SHAPES[i]))}" for i, _ in bad[:6])
            parts.append(f"{key} in {len(bad)} params (max {worst:.3g}; {where})")
    return "; ".join(parts)


def step_probe(orthopt, trials, kernels, fresh_at):
    """The run with step `fresh_at` on a fresh stream (None: every step on the current stream,
    i.e. run-to-run repeatability) against a first run on the current stream."""
    ref = dion_run(orthopt, kernels, None)
    reports = [diff_report(ref, dion_run(orthopt, kernels, fresh_at)) for _ in range(trials)]
    bad = [r for r in reports if r]
    where = "all steps on the current stream" if fresh_at is None else f"step {fresh_at + 1} on a fresh stream"
    print(f"  Dion, {where} (execution kernels={kernels}): {len(bad)} of {trials} trials differ")
    for r in bad[:3]:
        print(f"    {r}")


def torch_bank_step(M, Q, mu=0.95, eps=1e-8):
    """step_dion_banks' ops for one bank written in torch (Householder QR), as one fn for a probe."""
    P = torch.linalg.qr(M @ Q)[0]
    R = M.transpose(-2, -1) @ P
    mom = M - (P @ R.transpose(-2, -1)) * (1.0 - mu)
    Qn = R / (torch.linalg.vector_norm(R, 2, dim=-2, keepdim=True) + eps)
    return [mom, Qn, P @ Qn.transpose(-2, -1)]


def composite_probe(trials):
    g = torch.Generator(device="cuda").manual_seed(1)
    for B, m, n in BANKS:
        M = torch.randn(B, m, n, device="cuda", generator=g)
        Q = torch.randn(B, n, 32, device="cuda", generator=g)
        for fresh in (True, False):
            count_differing(f"torch bank step [{B},{m},{n}] r=32", lambda: torch_bank_step(M, Q), trials, fresh)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--ops-only", action="store_true", help="only the op and composite probes (no orthopt)")
    args = ap.parse_args()
    if args.trials < 1:
        ap.error("argument --trials: must be >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    orthopt = None if args.ops_only else __import__("orthopt")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    settings = [("deterministic", True, True), ("deterministic, no NaN fill of new memory", True, False),
                ("not deterministic", False, True)]
    for label, det, fill in settings:
        torch.use_deterministic_algorithms(det)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        print(label)
        for kernels in () if args.ops_only else ("auto", "off"):
            for fresh_at in (None, 9, 4):
                step_probe(orthopt, args.trials, kernels, fresh_at)
        op_probes(args.trials)
        composite_probe(args.trials)
        per_stream_probe(args.trials)


if __name__ == "__main__":
    main()

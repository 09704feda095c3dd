"""Same-run comparison with the dion package (github.com/microsoft/dion), the best peer in
performance.md: its Triton Newton–Schulz and its Muon / NorMuon / Dion3 / Dion steps against orthopt's, in
one process on one GPU, timed round-robin (one call of each contender per round), CUDA-event median.

The dion package is not part of orthopt and is not vendored: pass a checkout of it with
--dion PATH (the folder that holds the `dion` package). Run on a GPU machine:

    PYTHONPATH=build-gpu/python python3 bench/gpu/dion_peers.py --dion PATH [--ns] [--step]

NS: the five NS target shapes (docs/performance.md), fp32 input, 5 steps of dion's fixed quintic triples (our
schedule `you` has the same triples, so both sides do the same math); each contender's relative
error against the same iteration in float64 (written out below) is printed beside its time.
Step: performance.md's GPT-2 124M and Llama 1.26B sets (bench/param_sets.h), matrices to the
named algorithm and the rest to AdamW inside the same optimizer, fp32 parameters, random gradients.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_peers import param_set, param_sets, round_robin_ms  # noqa: E402  (one definition of the sets and the timing)

NS_SHAPES = [(1, 4096, 4096), (1, 8192, 8192), (1, 4096, 14336), (16, 1536, 2048), (32, 7168, 2048)]
# The NS targets and the H100 best-peer (dion Triton) times they were set against, ms.
NS_TARGETS = {(1, 4096, 4096): (2.55, 2.0), (1, 8192, 8192): (17.9, 15.5), (1, 4096, 14336): (6.93, 3.8),
              (16, 1536, 2048): (3.45, 2.3), (32, 7168, 2048): (35.7, 16.0)}


def ns_plain(G, triples, dtype):
    """The iteration written plainly in `dtype`: X = G/(|G|_F + 1e-7) (wide orientation), then per
    triple A = X Xᵀ, B = bA + cA², X = aX + BX. float64: the reference; bfloat16: the dense torch
    peer (the one `orthopt bench ns` writes itself)."""
    X = G.to(dtype)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for a, b, c in triples:
        A = X @ X.mT
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.mT if tall else X


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def run_ns(args, dion_ns, orthopt):
    print("\n## NS, 5 steps of the triples of dion / schedule `you`, fp32 input, bf16 iteration "
          f"(median of {args.repeats} round-robin rounds after {args.warmup}); ms\n")
    print("| batch×m×n | torch dense | dion Triton | orthopt standard | orthopt auto | dion / auto | "
          "target ratio (H100 peer / target) | err dion | err standard | err auto | err torch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    def ours(G, method):
        # nonfinite="propagate": no finiteness check of G, whose .item() would sync the host every
        # call (`orthopt bench ns` leaves it out too; dion has none).
        return orthopt.orthogonalize(G, schedule="you", method=method, nonfinite="propagate")

    # dion's triples are our schedule `you` (algorithms.md): taken from the library, one definition.
    triples = next(s["triples"] for s in orthopt.schedules() if s["name"] == "you")
    torch.manual_seed(0)
    for shape in NS_SHAPES:
        b, m, n = shape
        G = torch.randn(shape if b > 1 else (m, n), device="cuda")
        t0 = time.time()
        outs = {
            "torch": ns_plain(G, triples, torch.bfloat16),
            "dion": dion_ns(G),  # the first call also autotunes dion's Triton kernels for this shape
            "standard": ours(G, "standard"),
            "auto": ours(G, "auto"),
        }
        ref = ns_plain(G, triples, torch.float64)
        errs = {k: rel(v, ref) for k, v in outs.items()}
        del outs, ref
        fns = [lambda: ns_plain(G, triples, torch.bfloat16), lambda: dion_ns(G),
               lambda: ours(G, "standard"),
               lambda: ours(G, "auto")]
        ms = round_robin_ms(fns, args.warmup, args.repeats)
        peer_h100, target = NS_TARGETS[shape]
        print(f"| {b}×{m}×{n} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | {ms[3]:.3f} | {ms[1] / ms[3]:.2f} | "
              f"{peer_h100 / target:.2f} | {errs['dion']:.2e} | {errs['standard']:.2e} | {errs['auto']:.2e} | "
              f"{errs['torch']:.2e} |", flush=True)
        print(f"<!-- {b}x{m}x{n}: {time.time() - t0:.1f} s with warm-up and the float64 reference -->", flush=True)
        torch.cuda.empty_cache()


def run_products(args, ns_line_1, ns_line_2):
    """dion's two symmetric Triton products alone against the dense cuBLAS products (torch), bf16,
    for comparison with `orthopt_sym_bench`'s kernel-level table (same quantities: A·Aᵀ of X, and
    B = b·A + c·A·A of the symmetric A)."""
    print(f"\n## dion's symmetric Triton products alone, bf16 (median of {args.repeats} round-robin rounds "
          f"after {args.warmup}); ms\n")
    print("| batch×m×k | dense X·Xᵀ (cuBLAS) | dion ns_line_1 | dion / dense | dense b·A + c·A·A (cuBLAS) | "
          "dion ns_line_2 | dion / dense |")
    print("|---|---|---|---|---|---|---|")
    torch.manual_seed(0)
    for b, m, k in [(1, 4096, 4096), (1, 8192, 8192), (16, 1536, 2048), (88, 2048, 2048), (1, 4096, 14336)]:
        X = torch.randn((b, m, k) if b > 1 else (m, k), device="cuda", dtype=torch.bfloat16) / k ** 0.5
        A = (X @ X.mT).contiguous()
        A1, B1 = torch.empty_like(A), torch.empty_like(A)
        fns = [lambda: torch.matmul(X, X.mT, out=A1), lambda: ns_line_1(X, out=A1),
               lambda: torch.baddbmm(A, A, A, beta=-6.3, alpha=2.6, out=B1) if b > 1
               else torch.addmm(A, A, A, beta=-6.3, alpha=2.6, out=B1),
               lambda: ns_line_2(A, alpha=2.6, beta=-6.3, out=B1)]
        for fn in fns:  # the first calls autotune dion's kernels for this shape
            fn()
        ms = round_robin_ms(fns, args.warmup, args.repeats)
        print(f"| {b}×{m}×{k} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[1] / ms[0]:.2f} | {ms[2]:.3f} | {ms[3]:.3f} | "
              f"{ms[3] / ms[2]:.2f} |", flush=True)
        X = A = A1 = B1 = fns = None
        torch.cuda.empty_cache()


def run_step(args, dion, orthopt):
    print(f"\n## Optimizer step, fp32 parameters, random gradients (median of {args.repeats} "
          f"round-robin rounds after {args.warmup}); ms\n")
    print("| set | algorithm | dion (default paths) | dion (use_triton) | orthopt eager | orthopt graph | "
          "dion best / orthopt graph |")
    print("|---|---|---|---|---|---|---|")
    adamw = dict(algorithm="adamw", lr=3e-3, weight_decay=0.01)
    for name in args.sets:
        for algo in [a for a in args.algorithms if a != "dion"]:  # dion: run_dion_step()
            try:
                torch.manual_seed(0)
                t0 = time.time()
                # Each contender owns its parameters (the same shapes and values, its own state).
                sets = [param_set(name) for _ in range(4)]
                dion_cls = {"muon": dion.Muon, "normuon": dion.NorMuon, "dion3": dion.Dion3}[algo]
                ours_cls = {"muon": orthopt.Muon, "normuon": orthopt.NorMuon, "dion3": orthopt.Dion3}[algo]
                extra = dict(fraction=0.25) if algo == "dion3" else {}
                opts = []
                for use_triton, (mats, others) in zip((False, True), sets[:2]):
                    opts.append(dion_cls([dict(params=mats), dict(params=others, **adamw)], lr=0.02,
                                         weight_decay=0.01, mu=0.95, use_triton=use_triton, **extra))
                for graphed, (mats, others) in zip((False, True), sets[2:]):
                    o = ours_cls([dict(params=mats), dict(params=others, **adamw)], lr=0.02, weight_decay=0.01,
                                 momentum=0.95, **extra)
                    opts.append(orthopt.CudaGraphOptimizer(o, warmup_steps=2) if graphed else o)
                for _ in range(3):  # the graph's two eager warm-up steps and its capture, before any timing
                    opts[3].step()
                ms = round_robin_ms([o.step for o in opts], args.warmup, args.repeats)
                best = min(ms[0], ms[1])
                print(f"| {name} | {algo} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | {ms[3]:.3f} | "
                      f"{best / ms[3]:.2f} |", flush=True)
                print(f"<!-- {name} {algo}: {time.time() - t0:.1f} s -->", flush=True)
            except Exception as e:  # a contender that fails is reported in its row, the others go on
                print(f"| {name} | {algo} | failed: {type(e).__name__}: {str(e).splitlines()[0][:160]} | | | | |",
                      flush=True)
                print(f"<!-- {name} {algo}, the whole message: {str(e)} -->", flush=True)
            opts = sets = None
            torch.cuda.empty_cache()


def run_dion_step(args, dion, orthopt):
    """Dion (low rank, algorithms.md §6): dion's Dion (its randomized Cholesky QR, the only method
    of its single-device class) against ours with each dion_qr; rank fraction 0.25 on both sides."""
    print(f"\n## Dion step, rank fraction 0.25, fp32 parameters, random gradients (median of {args.repeats} "
          f"round-robin rounds after {args.warmup}); ms\n")
    print("| set | dion Dion (rcqr) | orthopt householder eager | orthopt householder graph | "
          "orthopt cholesky eager | dion / orthopt best |")
    print("|---|---|---|---|---|---|")
    adamw = dict(algorithm="adamw", lr=3e-3, weight_decay=0.01)
    for name in args.sets:
        try:
            torch.manual_seed(0)
            t0 = time.time()
            sets = [param_set(name) for _ in range(4)]
            mats, others = sets[0]
            opts = [dion.Dion([dict(params=mats), dict(params=others, **adamw)], lr=0.02, mu=0.95,
                              weight_decay=0.01, rank_fraction=0.25)]
            for k, ((mats, others), qr) in enumerate(zip(sets[1:], ("householder", "householder", "cholesky"))):
                o = orthopt.Dion([dict(params=mats), dict(params=others, **adamw)], lr=0.02, weight_decay=0.01,
                                 momentum=0.95, rank_fraction=0.25, dion_qr=qr)
                opts.append(orthopt.CudaGraphOptimizer(o, warmup_steps=2) if k == 1 else o)
            for _ in range(3):  # the graph's two eager warm-up steps and its capture, before any timing
                opts[2].step()
            ms = round_robin_ms([o.step for o in opts], args.warmup, args.repeats)
            print(f"| {name} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | {ms[3]:.3f} | {ms[0] / min(ms[1:]):.2f} |",
                  flush=True)
            print(f"<!-- {name} dion: {time.time() - t0:.1f} s -->", flush=True)
        except Exception as e:  # a contender that fails is reported in its row
            print(f"| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:160]} | | | | |", flush=True)
            print(f"<!-- {name} dion, the whole message: {str(e)} -->", flush=True)
        opts = sets = None
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dion", required=True, help="folder holding the `dion` package (a microsoft/dion checkout)")
    p.add_argument("--ns", action="store_true", help="time Newton–Schulz (default: both parts)")
    p.add_argument("--step", action="store_true", help="time optimizer steps (default: both parts)")
    p.add_argument("--products", action="store_true",
                   help="time dion's symmetric Triton products alone against dense cuBLAS (not in the default)")
    p.add_argument("--sets", nargs="+", default=list(param_sets()), choices=list(param_sets()))
    p.add_argument("--algorithms", nargs="+", default=["muon", "normuon", "dion3", "dion"],
                   choices=["muon", "normuon", "dion3", "dion"])
    p.add_argument("--recompile-limit", type=int, default=None,
                   help="raise torch._dynamo's recompile limit (dion's compiled per-shape updates hit the "
                        "default 8 on GPT-2's NorMuon); default: torch's own")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    if not os.path.isdir(os.path.join(args.dion, "dion")):
        sys.exit(f"argument --dion: {args.dion!r} does not hold a 'dion' package folder")
    if args.warmup < 0 or args.repeats < 1:
        sys.exit("arguments --warmup/--repeats: need warmup >= 0 and repeats >= 1")
    if args.recompile_limit is not None:
        if args.recompile_limit < 1:
            sys.exit("argument --recompile-limit: must be >= 1")
        # Imported under its own name: `import torch._dynamo` here would make `torch` a local
        # name of main() and break every later use of it when the option is not given.
        import torch._dynamo as dynamo
        # torch >= 2.6 names it recompile_limit; older releases cache_size_limit.
        name = "recompile_limit" if hasattr(dynamo.config, "recompile_limit") else "cache_size_limit"
        setattr(dynamo.config, name, args.recompile_limit)
    sys.path.insert(0, args.dion)
    import dion
    from dion.newton_schulz_triton import newton_schulz_triton, ns_line_1, ns_line_2

    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"dion at {os.path.abspath(args.dion)}")
    if args.products:
        run_products(args, ns_line_1, ns_line_2)
    both = not (args.ns or args.step or args.products)
    if args.ns or args.step or both:
        import orthopt
    if args.ns or both:
        run_ns(args, newton_schulz_triton, orthopt)
    if args.step or both:
        if any(a != "dion" for a in args.algorithms):
            run_step(args, dion, orthopt)
        if "dion" in args.algorithms:
            run_dion_step(args, dion, orthopt)


if __name__ == "__main__":
    main()

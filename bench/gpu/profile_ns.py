"""Where one Newton–Schulz call's GPU time goes: torch-profiler breakdown by kernel of
orthopt.orthogonalize (method auto, the bench's shapes of issue 5), next to the CUDA-event time
of the same call. The products' share against the rest (normalization, casts, copies) says
whether a shape is bound by the symmetric/rectangular products or by overhead around them.
Run on a GPU machine: PYTHONPATH=build-gpu/python python3 bench/gpu/profile_ns.py [SHAPE ...]
(SHAPE like 4096x4096 or 16x1536x2048; default: the five target shapes) [--top=N]"""
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import orthopt
from profile_step import kernel_class
from step_peers import median_ms

CALLS = 3
TARGET_SHAPES = ["4096x4096", "8192x8192", "4096x14336", "16x1536x2048", "32x7168x2048"]


def main():
    torch.manual_seed(0)
    shapes = [a for a in sys.argv[1:] if not a.startswith("--")] or TARGET_SHAPES
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    top = int(flags.get("top", "10"))
    for shape in shapes:
        dims = [int(d) for d in shape.split("x")]
        G = torch.randn(*dims, device="cuda", dtype=torch.float32)
        call = lambda: orthopt.orthogonalize(G, method="auto", nonfinite="propagate")  # noqa: E731
        ms = median_ms(call, warmup=3, repeats=10)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                call()
            torch.cuda.synchronize()
        per_kernel = collections.defaultdict(lambda: [0.0, 0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                k = per_kernel[ev.name]
                k[0] += ev.device_time_total / 1e3 / CALLS  # ms per call
                k[1] += 1
        total = sum(v[0] for v in per_kernel.values())
        launches = sum(v[1] for v in per_kernel.values()) / CALLS
        print(f"\n## NS {shape}: {ms:.3f} ms (CUDA events, median of 10); kernels {total:.3f} ms/call, "
              f"{launches:.0f} launches/call; gaps {ms - total:.3f} ms", flush=True)
        by_class = collections.defaultdict(float)
        for kname, (t, _) in per_kernel.items():
            by_class[kernel_class(kname)] += t
        for c, t in sorted(by_class.items(), key=lambda kv: -kv[1]):
            print(f"  {c:<28} {t:8.3f} ms  {100 * t / max(total, 1e-9):5.1f}%")
        print("  top kernels (ms/call, launches/call, name):")
        for kname, (t, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"    {t:8.3f} {n / CALLS:6.1f}  {kname[:100]}")
        del G
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

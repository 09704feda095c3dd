"""Where one Newton–Schulz call's GPU time goes: torch-profiler breakdown by kernel of
orthopt.orthogonalize (method auto, the NS target shapes of docs/performance.md), next to the CUDA-event time
of the same call. The products' share against the rest (normalization, casts, copies) says
whether a shape is bound by the symmetric/rectangular products or by overhead around them.
Run on a GPU machine: PYTHONPATH=build-gpu/python python3 lab/probes/profile_ns.py [SHAPE ...]
(SHAPE like 4096x4096 or 16x1536x2048; default: the five target shapes) [--top=N]"""
import pathlib
import sys

import torch

import orthopt

# bench/gpu/profile_step.py, the lasting profiler this probe shares its breakdown with.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"))
from profile_step import print_breakdown  # noqa: E402

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
        print_breakdown(call, f"NS {shape}:", "call", top)
        del G
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

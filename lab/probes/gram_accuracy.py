"""Accuracy of Gram Newton–Schulz against the standard iteration by aspect ratio, for choosing
gram_aspect_threshold (docs/gpu.md plan item 2: Dion3's 1408×2048 selections on Llama).
Relative Frobenius error against the standard iteration in float64 of: standard NS in bf16,
Gram NS in fp16 with the default restart, and Gram NS in fp16 without restarts. CPU run: the
half-precision products are emulated as on the GPU (fp32 accumulation, one rounding per product).
Inputs: 2 random matrices per shape with singular values spread over [1e-3, 1] (log scale).
Run:  PYTHONPATH=build/python /usr/bin/python3 lab/probes/gram_accuracy.py"""
import torch

import orthopt

SHAPES = [(2048, 2048), (1792, 2048), (1408, 2048), (1024, 2048), (704, 2048)]


def spread(batch, m, n):
    k = min(m, n)
    U = torch.linalg.qr(torch.randn(batch, m, k, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(batch, n, k, dtype=torch.float64))[0]
    s = 10.0 ** torch.linspace(0, -3, k, dtype=torch.float64)
    return ((U * s) @ V.transpose(-2, -1)).float()


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def main():
    torch.manual_seed(0)
    print("shape        aspect  standard bf16  gram fp16  gram fp16, no restart")
    for m, n in SHAPES:
        G = spread(2, m, n)
        ref = orthopt.orthogonalize(G.double(), method="standard", compute_dtype=torch.float64)
        errs = [
            rel_err(orthopt.orthogonalize(G, method="standard", compute_dtype=torch.bfloat16), ref),
            rel_err(orthopt.orthogonalize(G, method="gram", compute_dtype=torch.float16), ref),
            rel_err(orthopt.orthogonalize(G, method="gram", compute_dtype=torch.float16, restarts=[]), ref),
        ]
        print(f"{m}x{n:<7} {n / m:6.2f}  {errs[0]:13.3e}  {errs[1]:9.3e}  {errs[2]:9.3e}", flush=True)


if __name__ == "__main__":
    main()

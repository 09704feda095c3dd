"""The trainer's own parameter set (gpt2-124m preset: qkv split 3×768, SwiGLU 2048-wide
matrices, AdamW on the rest) through orthopt.Muon, eager and as a CUDA graph, timed three ways:
  events   back-to-back, CUDA events (how bench step times);
  idle     wall time from an idle device to the step's end (how the trainer times opt_ms);
  hot      as idle, right after ~150 ms of bf16 8192² matmuls (the board and L2 as a training step
           leaves them).
Usage: PYTHONPATH=build-gpu/python python3 lab/probes/trainer_param_set_step.py muon|normuon|dion3"""
import statistics, time, sys
import torch
import orthopt

torch.manual_seed(0)
d, f, L, V = 768, 2048, 12, 256
mats, qkvs, others = [], [], []
def P(*s):
    p = torch.nn.Parameter(torch.randn(*s, device="cuda") * 0.02); p.grad = torch.randn_like(p) * 1e-3; return p
for _ in range(L):
    qkvs.append(P(3 * d, d)); mats += [P(d, d), P(f, d), P(f, d), P(d, f)]; others += [P(d), P(d)]
others += [P(d), P(V, d), P(V, d)]
alg = sys.argv[1] if len(sys.argv) > 1 else "muon"
groups = [dict(params=qkvs, algorithm=alg, split_sizes=[d, d, d] if alg in ("muon", "normuon") else None),
          dict(params=mats, algorithm=alg),
          dict(params=others, algorithm="adamw", lr=3e-3, weight_decay=0.0)]
opt = orthopt.Muon(groups, lr=0.01, weight_decay=0.01)
graphed = orthopt.CudaGraphOptimizer(orthopt.Muon(groups, lr=0.01, weight_decay=0.01), warmup_steps=3)
A = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
def burst():
    for _ in range(40): A @ A  # ~40 × 1.1 TFLOP
def events(fn, n=30):
    for _ in range(5): fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)
def wall(fn, n=30, hot=False):
    for _ in range(5): fn()
    ts = []
    for _ in range(n):
        if hot: burst()
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
        ts.append(1e3 * (time.perf_counter() - t))
    return statistics.median(ts)
torch.cuda.synchronize(); t=time.perf_counter(); burst(); torch.cuda.synchronize(); print(f"burst {1e3*(time.perf_counter()-t):.1f} ms")
for name, fn in [("eager", opt.step), ("graph", graphed.step)]:
    print(f"{alg} {name}: events {events(fn):.3f} ms, idle {wall(fn):.3f} ms, hot {wall(fn, hot=True):.3f} ms, "
          f"idle again {wall(fn):.3f} ms")

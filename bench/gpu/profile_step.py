"""Where the optimizer step's GPU time goes: torch-profiler breakdown of orthopt's eager step
on performance.md's parameter sets (bench/param_sets.h), by kernel.
Run on a GPU machine: PYTHONPATH=build-gpu/python python3 bench/gpu/profile_step.py [gpt2|llama ...]
[--algos=muon,dion3] [--dion-qr=householder|cholesky] [--top=N] [--host] [--graph] [--tf32]
Prints, per set and algorithm: the CUDA-event step time, the sum of kernel times per step, the
profiled steps' own event time and timeline (the time the GPU idled between kernels), and
the kernels grouped into classes (GEMM, orthopt kernels, other elementwise/reduction) plus the
top kernels by total time.
--graph also profiles the CUDA-graph-captured step (orthopt.CudaGraphOptimizer on parameters of
its own, same shapes): the two steps timed round-robin, then the graph's replays
broken down like the eager step (the profiler reports the kernels inside a replay where the
CUDA driver's activity records carry them), so that a graph slower than its eager step can be
told apart as slower kernels (clock, memory placement) or as less overlap between them.
--trace[=DIR] also prints one step's kernels in the order they started (start and duration in
us, stream, grid, and for the eager step the product they belong to: orthopt::gemm and
orthopt::sym_abt name themselves in profiles, with their operands' shapes), for the eager step
and, with --graph, for a replay; DIR keeps the profiler's chrome traces.
--host also prints where the host's time goes: the host time to enqueue one step (from an idle
GPU, through the Python front end and through the C++ optimizer directly), and the host-side
operations (ATen ops, CUDA runtime calls) by self CPU time; an eager step whose enqueue takes
longer than its kernels is host-bound, and a synchronizing call shows up here."""
import collections
import json
import os
import statistics
import tempfile
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule

import orthopt
from step_peers import median_ms, param_set, param_sets, round_robin_ms

STEPS = 3


def print_breakdown(fn, title, unit, top, runs=STEPS):
    """Times fn (CUDA events, median of 10 after 3 warm-ups), profiles `runs` calls of it and
    prints the kernel time per call (per `unit`) by class and the `top` kernels."""
    ms = median_ms(fn, warmup=3, repeats=10)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        begin.record()
        for _ in range(runs):
            fn()
        end.record()
        torch.cuda.synchronize()
    profiled_ms = begin.elapsed_time(end) / runs
    per_kernel = collections.defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = per_kernel[ev.name]
            k[0] += ev.device_time_total / 1e3 / runs  # ms per call
            k[1] += 1
    total = sum(v[0] for v in per_kernel.values())
    launches = sum(v[1] for v in per_kernel.values()) / runs
    print(f"\n## {title} {ms:.3f} ms (CUDA events, median of 10); kernels {total:.3f} ms/{unit}, "
          f"{launches:.0f} launches/{unit}; gaps {ms - total:.3f} ms", flush=True)
    print_timeline(prof, unit, runs, profiled_ms)
    by_class = collections.defaultdict(float)
    for kname, (t, _) in per_kernel.items():
        by_class[kernel_class(kname)] += t
    for c, t in sorted(by_class.items(), key=lambda kv: -kv[1]):
        print(f"  {c:<28} {t:8.3f} ms  {100 * t / max(total, 1e-9):5.1f}%")
    print(f"  top kernels (ms/{unit}, launches/{unit}, name):")
    for kname, (t, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"    {t:8.3f} {n / runs:6.1f}  {kname[:110]}")


def print_timeline(prof, unit, runs, profiled_ms):
    """Separates the event time's excess over the kernels' sum into idle time on the GPU and the
    rest (clocks differing between the profiled and the timed runs): over the profiled calls,
    enqueued back to back, the span from the first kernel's start to the last one's end, the time
    some kernel ran (the union of their intervals: kernels launched with programmatic dependent
    launch may overlap), and the largest idle gaps with the kernels around them."""
    spans = sorted((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                   if ev.device_type == torch.autograd.DeviceType.CUDA)
    if not spans:
        return
    busy, gaps = 0.0, []
    cur_start, cur_end, cur_name = spans[0]
    for start, end, name in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            gaps.append((start - cur_end, cur_name, name))
            cur_start = start
        if end >= cur_end:
            cur_end, cur_name = end, name
    busy += cur_end - cur_start
    span = cur_end - spans[0][0]  # cur_end: the latest end of all
    idle = span - busy
    print(f"  timeline ({runs} calls back to back, profiled): CUDA events {profiled_ms:.3f} ms/{unit}, "
          f"kernels' span {span / 1e3 / runs:.3f}, "
          f"a kernel running {busy / 1e3 / runs:.3f}, idle {idle / 1e3 / runs:.3f} "
          f"({sum(1 for g in gaps if g[0] > 5) / runs:.1f} gaps > 5 us/{unit})")
    for gap, before, after in sorted(gaps, reverse=True)[:3]:
        print(f"    idle {gap:8.1f} us between {before[:50]} and {after[:50]}")


def print_trace(fn, title, keep_dir=None):
    """One call of fn (after 3 warm-ups) profiled with the operands' shapes: its kernels in start
    order, each with the innermost orthopt:: operation that launched it (eager only: a graph
    replay's kernels have no host-side parent)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        fn()
        torch.cuda.synchronize()
    path = os.path.join(keep_dir or tempfile.mkdtemp(), title.replace(" ", "_").replace(":", "") + ".json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ops = collections.defaultdict(list)  # tid -> orthopt ops (ts, end, name, dims)
    launch_at = {}  # correlation id -> (tid, ts) of the launching runtime/driver call
    kernels = []
    for e in events:
        cat, args = e.get("cat", ""), e.get("args", {})
        if cat == "cpu_op" and e["name"].startswith("orthopt::"):
            ops[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"], args.get("Input Dims", "")))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launch_at[args["correlation"]] = (e["tid"], e["ts"])
        elif cat == "kernel":
            kernels.append(e)
    kernels.sort(key=lambda e: e["ts"])
    if not kernels:
        return
    t0 = kernels[0]["ts"]
    print(f"\n## {title}: trace of one step ({len(kernels)} kernels; start, duration in us)", flush=True)
    for e in kernels:
        args = e.get("args", {})
        owner = ""
        tid, ts = launch_at.get(args.get("correlation"), (None, None))
        if tid is not None:
            inner = [o for o in ops.get(tid, []) if o[0] <= ts <= o[1]]
            if inner:
                o = max(inner, key=lambda o: o[0])
                owner = f"{o[2]}{o[3]}"
        grid = "x".join(str(g) for g in args.get("grid", []))
        print(f"  {e['ts'] - t0:9.1f} {e['dur']:8.1f} s{args.get('stream', '?'):<3} {grid:>12} "
              f"{owner:<58} {e['name'][:70]}")


def host_ms(fn, repeats=10):
    """Median host time of fn() started on an idle GPU, without waiting for its kernels."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def print_host(opt, title, top, runs=STEPS):
    """Host enqueue times of opt.step() and of its C++ optimizer's step(), and the top host-side
    operations by self CPU time per step."""
    version = opt._cpp.state_version
    front, cpp = host_ms(opt.step), host_ms(opt._cpp.step)
    moved = opt._cpp.state_version - version  # state moved into new buffers (re-aliased by the front end)
    sync, alias = host_ms(opt._sync), host_ms(opt._alias_state)
    # One step profiled but not counted: the profiler's start-up lands on the first operation it
    # records (about 2-3 ms on the H200 machines), which would read as one slow ATen call.
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=runs)) as prof:
        opt.step()
        prof.step()
        for _ in range(runs):
            opt.step()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows) / 1e3 / runs
    print(f"\n## {title}: host enqueue {front:.3f} ms (Python front end), {cpp:.3f} ms (C++ step); front end's "
          f"_sync {sync:.3f} ms, _alias_state {alias:.3f} ms; state moves in 20 steps: {moved}; "
          f"profiled self CPU {total:.3f} ms/step", flush=True)
    print("  top host operations (self CPU ms/step, calls/step, name):")
    for e in rows[:top]:
        print(f"    {e.self_cpu_time_total / 1e3 / runs:8.3f} {e.count / runs:6.1f}  {e.key[:100]}")


def kernel_class(name):
    n = name.lower()
    # Templates print as "void orthopt_k::...": match the namespace anywhere in the name.
    if "orthopt_k::" in n or n.startswith("orthopt") or "multi_tensor" in n:
        return "orthopt kernels"
    if any(k in n for k in ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "gemv", "cublas")):
        return "GEMM (cuBLAS/cuBLASLt)"
    if "reduce" in n or "norm" in n:
        return "reductions (ATen)"
    if "copy" in n or "cat" in n or "memcpy" in n or "memset" in n or "fill" in n:
        return "copies/fills (ATen)"
    return "elementwise/other (ATen)"


def groups_for(algo, mats, others, dion_qr="householder"):
    matrix = dict(params=mats, algorithm=algo, lr=0.02, weight_decay=0.01)
    if algo == "dion3":
        matrix["fraction"] = 0.25
    if algo == "dion":
        matrix["dion_qr"] = dion_qr
    return [matrix, dict(params=others, algorithm="adamw", lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)]


def main():
    torch.manual_seed(0)
    sets = [a for a in sys.argv[1:] if not a.startswith("--")] or list(param_sets())
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    algos = flags.get("algos", "muon,normuon,dion3").split(",")
    top = int(flags.get("top", "14"))
    host = "--host" in sys.argv[1:]
    trace = "--trace" in sys.argv[1:] or "trace" in flags
    trace_dir = flags.get("trace")
    graph = "--graph" in sys.argv[1:]
    dion_qr = flags.get("dion-qr", "householder")
    # torch's TF32 switch for fp32 cuBLAS products (Dion's four products), as a user would set it.
    torch.backends.cuda.matmul.allow_tf32 = "--tf32" in sys.argv[1:]
    for name in sets:
        mats, others = param_set(name)
        for algo in algos:
            opt = orthopt.Muon(groups_for(algo, mats, others, dion_qr))
            if graph:
                g_mats, g_others = param_set(name)
                g = orthopt.CudaGraphOptimizer(orthopt.Muon(groups_for(algo, g_mats, g_others, dion_qr)), warmup_steps=2)
                for _ in range(3):  # two eager warm-up steps and the capture, before any timing
                    g.step()
                eager_ms, graph_ms = round_robin_ms([opt.step, g.step], warmup=3, repeats=15)
                print(f"\n## {name} {algo}: eager {eager_ms:.3f} ms, graph {graph_ms:.3f} ms "
                      f"(CUDA events, round-robin, median of 15); graph / eager {graph_ms / eager_ms:.3f}", flush=True)
            print_breakdown(opt.step, f"{name} {algo}: step", "step", top)
            if trace:
                print_trace(opt.step, f"{name} {algo}: step", trace_dir)
            if graph:
                print_breakdown(g.step, f"{name} {algo}: graph replay", "step", top)
                if trace:
                    print_trace(g.step, f"{name} {algo}: graph replay", trace_dir)
                del g, g_mats, g_others
            if host:
                print_host(opt, f"{name} {algo}: step", top)
            del opt
            torch.cuda.empty_cache()
        del mats, others
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

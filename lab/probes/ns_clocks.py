"""Newton–Schulz in short bursts after the GPU idled, against sustained runs, with the SM clock.

Under sustained load the H200 sits at its power cap and lowers the SM clock; the benchmarks time
sustained runs (a median of repeats after warm-up), so a call can read well above what it takes
on a cool board. Per shape: three rounds of a pause (the GPU idle), a burst of about 40 ms of
calls back to back, then four blocks of about 200 ms each; CUDA events around each burst and
block, and `nvidia-smi` sampling the SM clock, the power draw and the clock event reasons every
20 ms. Each burst and block gets the median clock of its samples and the number of samples with
the software power cap active (reason 0x4). The power readings are averages over about a second
and lag behind the load.

Run on a GPU machine: PYTHONPATH=build-gpu/python python3 lab/probes/ns_clocks.py [SHAPE ...]
(SHAPE like 4096x4096 or 16x1536x2048; default: the five NS target shapes) [--pause=S]"""
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import orthopt

TARGET_SHAPES = ["4096x4096", "8192x8192", "4096x14336", "16x1536x2048", "32x7168x2048"]
QUERY = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"


def read_samples(path):
    """(time, SM MHz, W, power cap active) per nvidia-smi line."""
    rows = []
    with open(path) as f:
        for line in f:
            p = [x.strip() for x in line.split(",")]
            try:
                t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((t, float(p[1].split()[0]), float(p[2].split()[0]), bool(int(p[3], 16) & 0x4)))
            except (ValueError, IndexError):
                continue
    return rows


def timed(fn, n, start, stop):
    """ms per call of n calls back to back, and their wall-clock interval."""
    t0 = time.time()
    start.record()
    for _ in range(n):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / n, t0, time.time()


def main():
    shapes = [a for a in sys.argv[1:] if not a.startswith("--")] or TARGET_SHAPES
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    pause = float(flags.get("pause", "3"))
    torch.manual_seed(0)
    log = tempfile.NamedTemporaryFile(prefix="ns_clocks_", suffix=".csv", delete=False)
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader", "-lms", "20"],
                           stdout=log, stderr=subprocess.DEVNULL)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spans = []  # (shape, round, what, ms per call, calls, t0, t1)
    try:
        for shape in shapes:
            G = torch.randn(*[int(d) for d in shape.split("x")], device="cuda")
            call = lambda: orthopt.orthogonalize(G, nonfinite="propagate")  # noqa: E731
            timed(call, 3, start, stop)  # warm-up (the first call tunes cuBLASLt and allocates)
            est, _, _ = timed(call, 3, start, stop)  # the call's length
            burst, block = max(3, round(40 / est)), max(3, round(200 / est))
            for r in range(3):
                time.sleep(pause)
                ms, t0, t1 = timed(call, burst, start, stop)
                spans.append((shape, r, f"burst after {pause:g} s idle", ms, burst, t0, t1))
                for b in range(4):
                    ms, t0, t1 = timed(call, block, start, stop)
                    spans.append((shape, r, f"sustained block {b}", ms, block, t0, t1))
            del G
            torch.cuda.empty_cache()
    finally:
        smi.terminate()
        smi.wait()
        log.close()
    samples = read_samples(log.name)
    os.unlink(log.name)
    print(f"device: {torch.cuda.get_device_name()}; {len(samples)} nvidia-smi samples\n")
    print("| shape | round | what | calls | ms per call | samples | SM MHz, median (min) | power cap in |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, r, what, ms, n, t0, t1 in spans:
        sel = [s for s in samples if t0 <= s[0] <= t1]
        clock = (f"{statistics.median(s[1] for s in sel):.0f} ({min(s[1] for s in sel):.0f})" if sel else "-")
        print(f"| {shape} | {r} | {what} | {n} | {ms:.3f} | {len(sel)} | {clock} | {sum(s[3] for s in sel)} |")
    print("\nSM clock and power-cap flag (clock event reason 0x4) from nvidia-smi every 20 ms, matched to each "
          "burst or block by time; orthogonalize(G, nonfinite='propagate'), fp32 input, method auto.")


if __name__ == "__main__":
    main()

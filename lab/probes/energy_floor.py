"""Sustained FLOP floors and energy per FLOP: orthopt's Newton–Schulz against cuBLAS's dense product.

performance.md's floors divide each NS call's FLOPs by 746 TFLOP/s, cuBLAS's bf16 rate on a cool
board. Under sustained load the H200 sits at its ≈ 700 W power cap and lowers the SM clock, so a
sustained call is bound by energy, not by the rate at full clock. This script measures, per NS
target shape, both contenders on the same board in the same run:

- `dense`: cuBLAS's bf16 product of the shape's largest NS product, [B,m,m]·[B,m,n] (B·X or Q·X);
- `ns`: orthopt.orthogonalize (auto; fp32 input, nonfinite='propagate'),

each in a burst after the GPU idled and in sustained blocks (alternated round by round, after a
heat-up), with the board's energy counter read around every burst and block (NVML,
nvmlDeviceGetTotalEnergyConsumption) and the SM clock and power-cap flag sampled every 20 ms.
It prints ms per call, the counted rate (NS: the symmetric count of algorithms.md §1.1,
15m²n + 5m³ standard, 6m²n + 14m³ Gram, per matrix), joules per call and picojoules per counted
FLOP, then a summary: the sustained floor (NS FLOPs over cuBLAS's sustained dense rate on the same
shape), the NS target (docs/performance.md), and the rate the target asks for against that sustained dense rate.
Two more cases give the Llama 1.26B Muon step's sustained floor: its two NS banks (88×2048² and
66×2048×5632) and a device-to-device copy for its memory passes.

The energy counter moves in coarse steps (short bursts often read 0 J, and blocks at the cap vary
widely; bench/results/2026-12-02-h200-sustained-floor.md): a block shorter than 0.3 s gets no energy figure,
and the summary's pJ/FLOP is taken over all sustained blocks of a contender together.

Run on a GPU machine: PYTHONPATH=build-gpu/python python3 lab/probes/energy_floor.py [--quick]
  [--json FILE]. --quick: shorter blocks (a smoke run)."""
import ctypes
import json
import math
import statistics
import sys
import threading
import time

import torch

import orthopt

# (name, shape, the NS target in ms on an H100 (docs/performance.md), or None)
CASES = [
    ("NS 4096²", (4096, 4096), 2.0),
    ("NS 8192²", (8192, 8192), 15.5),
    ("NS 4096×14336", (4096, 14336), 3.8),
    ("NS 16×1536×2048", (16, 1536, 2048), 2.3),
    ("NS 32×7168×2048", (32, 7168, 2048), 16.0),
    ("Llama NS 88×2048²", (88, 2048, 2048), None),
    ("Llama NS 66×2048×5632", (66, 2048, 5632), None),
]
GRAM_ASPECT = 1.5  # orthogonalize's default gram_aspect_threshold: auto takes Gram NS from here
LLAMA_MUON_TARGET_MS = 50.0
# Fewest bytes of the Llama 1.26B Muon step's memory passes (performance.md's set): per Muon
# matrix element G read (4), M read and written (8), W read and written (8), the NS input and
# result at 2 bytes each (4); AdamW on the rest: G (4), two moments read and written (16), W (8).
LLAMA_MUON_ELEMENTS = 22 * (4 * 2048 * 2048 + 3 * 5632 * 2048)
LLAMA_ADAMW_ELEMENTS = 2 * 32000 * 2048 + 22 * 2 * 2048 + 2048
LLAMA_BYTES = 24 * LLAMA_MUON_ELEMENTS + 28 * LLAMA_ADAMW_ELEMENTS
MIN_ENERGY_S = 0.3  # shortest block given an energy figure (the counter moves in coarse steps)


class Nvml:
    """The few NVML calls used, through ctypes (nothing links against NVML)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = None
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0".encode()
        if bus is not None and self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.handle)) == 0:
            self.found_by = f"PCI bus id {bus.decode()}"
        else:  # CUDA's index and NVML's agree only without CUDA_VISIBLE_DEVICES; say which was used
            self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)), "nvmlDeviceGetHandleByIndex_v2")
            self.found_by = "NVML index 0"
        self.reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(self.lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        self.energy_mj()  # fails here, not in the middle of a run, where the counter is missing

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} returned NVML error {rc}")

    def energy_mj(self):
        v = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(v)),
                    "nvmlDeviceGetTotalEnergyConsumption")
        return v.value

    def sample(self):
        """(SM MHz, power cap active or None)."""
        mhz = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(mhz)), "nvmlDeviceGetClockInfo")  # 1: SM
        cap = None
        if self.reasons is not None:
            r = ctypes.c_ulonglong()
            if self.reasons(self.handle, ctypes.byref(r)) == 0:
                cap = bool(r.value & 0x4)  # software power cap
        return mhz.value, cap


class Sampler:
    """Samples the SM clock and the power-cap flag every 20 ms on a thread of its own."""

    def __init__(self, nvml):
        self.nvml, self.samples, self.lock = nvml, [], threading.Lock()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stop_event.wait(0.02):
            mhz, cap = self.nvml.sample()
            with self.lock:
                self.samples.append((time.monotonic(), mhz, cap))

    def window(self, t0, t1):
        with self.lock:
            sel = [s for s in self.samples if t0 <= s[0] <= t1]
        if not sel:
            return "-", "-"
        mhz = f"{statistics.median(s[1] for s in sel):.0f} ({min(s[1] for s in sel):.0f})"
        caps = [s[2] for s in sel if s[2] is not None]
        cap = f"{100 * sum(caps) / len(caps):.0f}% of {len(caps)}" if caps else "not read"
        return mhz, cap

    def close(self):
        self.stop_event.set()
        self.thread.join()


def ns_flops(shape):
    """Counted FLOPs of 5 NS steps of auto (algorithms.md §1.1's symmetric counts), and the method."""
    batch = math.prod(shape[:-2])
    m, n = sorted(shape[-2:])
    if n >= GRAM_ASPECT * m:
        return batch * (6 * m * m * n + 14 * m ** 3), "gram"
    return batch * (15 * m * m * n + 5 * m ** 3), "standard"


def rotating(make, nbytes):
    """A list of input sets: 4 when one set fits in 64 MB (so repeats do not time the L2), else 1."""
    return [make() for _ in range(4 if nbytes < 64 << 20 else 1)]


def contenders(shape):
    """[(name, call, FLOPs or bytes per call, unit)] for one case."""
    batch_dims, (rows, cols) = shape[:-2], shape[-2:]
    m, n = sorted((rows, cols))
    batch = math.prod(batch_dims)  # 1 for a single matrix
    g_sets = rotating(lambda: torch.randn(*shape, device="cuda"), 4 * rows * cols * batch)
    # Random operands of the dense product's shape, bf16 like NS's iteration (never zeros).
    d_sets = rotating(lambda: (torch.randn(*batch_dims, m, m, device="cuda").to(torch.bfloat16),
                               torch.randn(*batch_dims, m, n, device="cuda").to(torch.bfloat16)),
                      2 * (m * m + m * n) * batch)
    state = {"ns": 0, "dense": 0}

    def ns():
        state["ns"] = (state["ns"] + 1) % len(g_sets)
        return orthopt.orthogonalize(g_sets[state["ns"]], nonfinite="propagate")

    def dense():
        state["dense"] = (state["dense"] + 1) % len(d_sets)
        a, x = d_sets[state["dense"]]
        return torch.matmul(a, x)

    flops, method = ns_flops(shape)
    return [("dense", dense, 2 * batch * m * m * n, "FLOP"),
            (f"ns ({method})", ns, flops, "FLOP")]


def copy_contender():
    src = torch.randn(512 << 20, device="cuda")  # 2 GiB of fp32
    dst = torch.empty_like(src)
    return [("copy", lambda: dst.copy_(src), 2 * src.numel() * 4, "byte")]


def run_block(nvml, sampler, call, n):
    """n calls back to back: (ms per call, J per call, W, SM clock, power cap); J and W NaN when short."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    e0, t0 = nvml.energy_mj(), time.monotonic()
    start.record()
    for _ in range(n):
        call()
    stop.record()
    torch.cuda.synchronize()
    e1, t1 = nvml.energy_mj(), time.monotonic()
    ms = start.elapsed_time(stop) / n
    mhz, cap = sampler.window(t0, t1)
    if t1 - t0 < MIN_ENERGY_S:  # the counter's steps would dominate
        return ms, float("nan"), float("nan"), mhz, cap
    return ms, (e1 - e0) / 1000.0 / n, (e1 - e0) / 1000.0 / (t1 - t0), mhz, cap


def measure(nvml, sampler, case, entries, quick):
    """Burst after idle and sustained blocks for each contender of a case; returns result rows."""
    burst_ms, block_ms, idle_s, heat_s, rounds = (40, 150, 1.0, 0.3, 2) if quick else (60, 1000, 2.0, 1.5, 3)
    rows = []
    est = {}
    for name, call, work, unit in entries:
        for _ in range(3):  # warm-up: cuBLASLt's first-call tuning, allocations
            call()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        est[name] = max(1e-3, (time.perf_counter() - t) / 3 * 1000)
    for name, call, work, unit in entries:
        time.sleep(idle_s)
        n = max(3, round(burst_ms / est[name]))
        rows.append((case, name, "burst after idle", n, work, unit) + run_block(nvml, sampler, call, n))
    # Heat the board with the first contender, then alternate sustained blocks round by round.
    name, call, _, _ = entries[0]
    run_block(nvml, sampler, call, max(3, round(heat_s * 1000 / est[name])))
    for r in range(rounds):
        for name, call, work, unit in entries:
            n = max(3, round(block_ms / est[name]))
            rows.append((case, name, f"sustained {r}", n, work, unit) + run_block(nvml, sampler, call, n))
    return rows


def main():
    quick = "--quick" in sys.argv
    json_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    torch.manual_seed(0)
    nvml = Nvml()
    sampler = Sampler(nvml)
    rows = []
    try:
        for case, shape, _ in CASES:
            rows += measure(nvml, sampler, case, contenders(shape), quick)
            torch.cuda.empty_cache()
        rows += measure(nvml, sampler, "copy 2 GiB", copy_contender(), quick)
        torch.cuda.empty_cache()
        rows += measure(nvml, sampler, "dense 8192³", contenders((8192, 8192))[:1], quick)
    finally:
        sampler.close()

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; NVML by {nvml.found_by}\n")
    print("| case | contender | run | calls | ms per call | rate | J per call | pJ per FLOP | W | SM MHz median (min) | power cap |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case, name, run, n, work, unit, ms, joules, watts, mhz, cap in rows:
        rate = work / (ms * 1e-3)
        rate_s = f"{rate / 1e12:.0f} TF/s" if unit == "FLOP" else f"{rate / 1e12:.2f} TB/s"
        if joules != joules:  # NaN: too short for the counter
            j_s = pj = w_s = "-"
        else:
            j_s, w_s = f"{joules:.4f}", f"{watts:.0f}"
            pj = f"{joules / work * 1e12:.3f}" if unit == "FLOP" else "-"
        print(f"| {case} | {name} | {run} | {n} | {ms:.3f} | {rate_s} | {j_s} | {pj} | {w_s} | {mhz} | {cap} |")

    def med(case, prefix, run_prefix, key):
        vals = [r for r in rows if r[0] == case and r[1].startswith(prefix) and r[2].startswith(run_prefix)]
        return statistics.median(key(r) for r in vals) if vals else float("nan")

    ms_of = lambda r: r[6]  # noqa: E731
    rate_of = lambda r: r[4] / (r[6] * 1e-3)  # noqa: E731

    def pj_sustained(case, prefix):
        """pJ per counted FLOP over all sustained blocks of a contender together."""
        vals = [r for r in rows if r[0] == case and r[1].startswith(prefix) and r[2].startswith("sustained")
                and r[7] == r[7]]
        return sum(r[7] * r[3] for r in vals) / sum(r[4] * r[3] for r in vals) * 1e12 if vals else float("nan")
    print("\nSummary (medians over the sustained blocks; burst: after idle). Sustained floor = the NS call's counted "
          "FLOPs at cuBLAS's sustained dense rate on the same shape; 'target asks' = the counted rate the target "
          "needs, as a multiple of that dense rate; pJ/FLOP over all sustained blocks of each contender.\n")
    print("| case | target | ns burst | ns sustained | dense sustained rate | sustained floor | ns / floor | "
          "target asks | pJ/FLOP ns / dense (sustained) |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary = []
    for case, shape, target in CASES:
        flops, _ = ns_flops(shape)
        dense_rate = med(case, "dense", "sustained", rate_of)
        floor_ms = flops / dense_rate * 1e3
        ns_s, ns_b = med(case, "ns", "sustained", ms_of), med(case, "ns", "burst", ms_of)
        asks = flops / (target * 1e-3) / dense_rate if target else float("nan")
        pj_ns, pj_dense = pj_sustained(case, "ns"), pj_sustained(case, "dense")
        summary.append(dict(case=case, target_ms=target, ns_burst_ms=ns_b, ns_sustained_ms=ns_s,
                            dense_sustained_tflops=dense_rate / 1e12, sustained_floor_ms=floor_ms,
                            target_asks=asks, pj_per_flop_ns=pj_ns, pj_per_flop_dense=pj_dense))
        print(f"| {case} | {'≤ %.1f' % target if target else '–'} | {ns_b:.3f} | {ns_s:.3f} | {dense_rate / 1e12:.0f} TF/s | "
              f"{floor_ms:.3f} | {ns_s / floor_ms:.2f} | {'%.2f×' % asks if target else '–'} | {pj_ns:.3f} / {pj_dense:.3f} |")
    copy_bw = med("copy 2 GiB", "copy", "sustained", rate_of)
    ns_floor = sum(s["sustained_floor_ms"] for s in summary if s["case"].startswith("Llama"))
    ns_time = sum(s["ns_sustained_ms"] for s in summary if s["case"].startswith("Llama"))
    mem_ms = LLAMA_BYTES / copy_bw * 1e3
    print(f"\nLlama 1.26B Muon step: NS floor {ns_floor:.1f} ms sustained (its two banks' NS measured alone: "
          f"{ns_time:.1f} ms) + memory passes {LLAMA_BYTES / 1e9:.1f} GB at the sustained copy rate "
          f"{copy_bw / 1e12:.2f} TB/s = {mem_ms:.1f} ms: floor {ns_floor + mem_ms:.1f} ms against the target "
          f"≤ {LLAMA_MUON_TARGET_MS:.0f}.")
    print(f"dense 8192³ sustained: {med('dense 8192³', 'dense', 'sustained', rate_of) / 1e12:.0f} TF/s, burst "
          f"{med('dense 8192³', 'dense', 'burst', rate_of) / 1e12:.0f} TF/s (performance.md's H100 reference: 746).")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(rows=[dict(case=r[0], contender=r[1], run=r[2], calls=r[3], work=r[4], unit=r[5], ms=r[6],
                                      joules=r[7], watts=r[8], sm_mhz=r[9], power_cap=r[10]) for r in rows],
                           summary=summary, llama_muon=dict(ns_floor_ms=ns_floor, ns_measured_ms=ns_time,
                                                            memory_ms=mem_ms, copy_tbps=copy_bw / 1e12)), f, indent=1)


if __name__ == "__main__":
    main()

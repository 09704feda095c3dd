"""Distributed Python optimizers (process_group=..., orthopt/dist.py) on Gloo, 2 and 3 processes.

This file is also the worker: the tests start N copies of it (``python test_dist_python.py
worker``) with RANK/WORLD_SIZE and a file rendezvous set; each rank runs the scenarios and saves what it
saw into a scratch directory. The worker's backend, device and dtype come from the environment
(ORTHOPT_TEST_BACKEND, ORTHOPT_TEST_DEVICE, ORTHOPT_TEST_DTYPE; default Gloo, CPU, float64), and the
checks below are functions of the results: tests/gpu/test_dist_nccl.py runs the same scenarios and
checks on NCCL, rank r on cuda:r. The tests compare that with a single-process orthopt optimizer
run here on the global batch (the gradient averaged over the ranks' local gradients). The
single-process optimizer's own math is checked against float64 references in test_optim.py;
what is under test here is the distribution: layout, padding, ownership, collectives, state
sharding and re-sharding, the start-up check.

Local gradients are multiples of 1/256 in [-1/4, 1/4): sums over ranks are exact in any order,
so both sides see bit-identical averaged gradients; what remains is fp rounding from batching
the matrices differently (bound 1e-6 relative; measured 0 on this CPU).
"""
import datetime
import gc
import importlib.util
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import weakref

import pytest
import torch

import orthopt

STEPS = 3
NS = {"compute_dtype": torch.float32}  # the CPU default; on CUDA the default is bf16/fp16 (too loose to compare)
# (algorithm, options, shapes): wide, tall and square matrices, a [3,16,24] stack in the same bank
# as two [16,24] (it straddles ranks), a 4-D stack, a vector, an embedding-like [40,8], biases.
# Dion (random initial Q) the same, plus a flatten group ([8,4,6] is one [8,24] matrix).
SPEC = [
    ("muon", {"lr": 0.02, "batched": True, **NS},
     [(16, 24), (16, 24), (24, 16), (20, 20), (3, 16, 24), (24, 16), (16, 16), (2, 2, 8, 8)]),
    ("adamw", {"lr": 3e-3, "weight_decay": 0.01}, [(50,), (40, 8), (13,)]),
    ("normuon", {"lr": 0.02, **NS}, [(16, 16), (16, 16), (8, 32)]),
    ("dion3", {"lr": 0.03, "fraction": 0.25, **NS}, [(32, 16), (32, 16), (32, 16), (16, 48)]),
    ("lion", {"lr": 1e-3}, [(30,)]),
    ("dion", {"lr": 0.02, "batched": True}, [(16, 24), (16, 24), (3, 16, 24), (24, 16), (20, 20), (2, 2, 8, 8)]),
    ("dion", {"lr": 0.02, "flatten": True, "rank_fraction": 0.5}, [(8, 4, 6), (8, 24)]),
]
DION_PARAMS = [k for k, algo in enumerate(a for a, _, shapes in SPEC for _ in shapes) if algo == "dion"]

# The model of the v1 shard fixture in tests/python/data, written by the engine of that format:
# fp32 params (randn(seed 5) * 0.5, stored as "after2"), 2 ranks, local gradients local_grad(p, k,
# t, rank) except param 4 at step 0 (none) and param 6 at step 1 (rank 0 only); each rank saved
# state_dict() after 2 steps; "after3": the params after a third step with every gradient present.
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
V1_SPEC = [
    ("muon", {"lr": 0.02, **NS}, 5),
    ("adamw", {"lr": 3e-3, "weight_decay": 0.01}, 2),
    ("normuon", {"lr": 0.02, **NS}, 2),
    ("dion", {"lr": 0.02}, 2),
    ("dion", {"lr": 0.02, "flatten": True, "rank_fraction": 0.5}, 1),
]


def v1_groups(values):
    values = iter(values)
    return [dict(opts, algorithm=algo, params=[next(values).clone().requires_grad_() for _ in range(n)])
            for algo, opts, n in V1_SPEC]


def make_groups(dtype, seed=7, device="cpu"):
    g = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same values on every device
    return [dict(opts, algorithm=algo, params=[(torch.randn(s, generator=g) * 0.5).to(dtype).to(device).requires_grad_()
                                               for s in shapes]) for algo, opts, shapes in SPEC]


def flat_params(groups):
    return [p for grp in groups for p in grp["params"]]


def has_grad(k, step, rank):
    """Which local gradients exist: param 3 ([20,20]) has none at step 0 on any rank, param 10
    ([13]) only on rank 0 at step 1 (the others count as zero), param 12 never (never stepped)."""
    if k == 12 or (k == 3 and step == 0):
        return False
    return not (k == 10 and step == 1 and rank != 0)


def local_grad(p, k, step, rank):
    g = torch.Generator().manual_seed(100000 + 1000 * step + 37 * rank + k)
    return (torch.randint(-64, 64, p.shape, generator=g).to(p.dtype) / 256).to(p.device)


def set_local_grads(groups, step, rank):
    for k, p in enumerate(flat_params(groups)):
        p.grad = local_grad(p, k, step, rank) if has_grad(k, step, rank) else None


def set_global_grads(groups, step, world):
    """The single-process view: the average over ranks, missing local gradients as zero."""
    for k, p in enumerate(flat_params(groups)):
        present = [r for r in range(world) if has_grad(k, step, r)]
        p.grad = None
        if present:
            total = torch.zeros_like(p)
            for r in present:
                total += local_grad(p, k, step, r)
            p.grad = total / world


def schedule(opt, t):
    """An LR change from step 1 on: hyperparameters edited between steps reach every rank's C++."""
    opt.param_groups[0]["lr"] = 0.02 if t < 1 else 0.01


def run_reference(world, dtype, steps, start=0, groups=None, opt=None, snapshots=(), device="cpu"):
    groups = groups or make_groups(dtype, device=device)
    opt = opt or orthopt.Muon(groups)
    snaps = {}
    for t in range(start, start + steps):
        set_global_grads(groups, t, world)
        schedule(opt, t)
        opt.step()
        if t + 1 in snapshots:
            snaps[t + 1] = [p.detach().clone() for p in flat_params(groups)]
    return groups, opt, snaps


def state_nbytes(state, with_scalars=True):
    return sum(v.numel() * v.element_size() for st in state.values() for v in st.values()
               if with_scalars or v.dim() > 0)


# ---------------------------------------------------------------- worker side (one rank)

def backend():
    return os.environ.get("ORTHOPT_TEST_BACKEND", "gloo")


def rank_device(rank):
    """ORTHOPT_TEST_DEVICE: cpu (default) or cuda (rank r on cuda:r)."""
    kind = os.environ.get("ORTHOPT_TEST_DEVICE", "cpu")
    return torch.device(f"cuda:{rank}") if kind == "cuda" else torch.device(kind)


def exact_dtype():
    """Dtype of the params compared with the single process (exact, dion_q, subgroup)."""
    return getattr(torch, os.environ.get("ORTHOPT_TEST_DTYPE", "float64"))


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(v) for v in x)
    return x


def scenario_exact(pg, rank, world, out):
    """3 steps (fp64 on Gloo); ranks > 0 start from other values (the constructor broadcasts rank 0's)."""
    groups = make_groups(exact_dtype(), device=rank_device(rank))
    with torch.no_grad():
        for p in flat_params(groups):
            p.add_(rank)
    opt = orthopt.Muon(groups, process_group=pg)
    res = {"start": [p.detach().clone() for p in flat_params(groups)]}
    for t in range(STEPS):
        set_local_grads(groups, t, rank)
        schedule(opt, t)
        opt.step()
        if t == 0:
            res["step1"] = [p.detach().clone() for p in flat_params(groups)]
    res["final"] = [p.detach().clone() for p in flat_params(groups)]
    opt.set_skip_factor(0.0)  # a skipped step (same decision on every rank) changes nothing
    set_local_grads(groups, STEPS, rank)
    opt.step()
    res["skipped_equal"] = all(torch.equal(p, q) for p, q in zip(flat_params(groups), res["final"]))
    opt.set_skip_factor(1.0)
    shard = opt.state_dict()["state"]
    res["state_bytes"] = opt.state_bytes
    res["shard_bytes"] = state_nbytes(shard)
    res["shard_tensor_bytes"] = state_nbytes(shard, with_scalars=False)
    res["full"] = opt.full_state_dict()
    res["step_count"] = opt.step_count
    return res


def scenario_dion_q(pg, rank, world, out):
    """Dion's initial Q: a skipped step creates every piece's state and changes nothing."""
    groups = make_groups(exact_dtype(), device=rank_device(rank))
    opt = orthopt.Muon(groups, process_group=pg)
    opt.set_skip_factor(0.0)
    set_local_grads(groups, 0, rank)
    opt.step()
    return {"full": opt.full_state_dict()}


def scenario_saveload(pg, rank, world, out):
    """fp32: shard save -> load on the same ranks continues bit for bit; the parent's
    single-process state dict (after 2 steps) loads here and continues like the 1-process run."""
    dev = rank_device(rank)
    groups = make_groups(torch.float32, device=dev)
    a = orthopt.Muon(groups, process_group=pg)
    for t in range(2):
        set_local_grads(groups, t, rank)
        schedule(a, t)
        a.step()
    path = os.path.join(out, f"shard_{rank}.pt")
    torch.save(a.state_dict(), path)
    clones = [[p.detach().clone().requires_grad_() for p in grp["params"]] for grp in groups]
    twin = [dict(grp, params=c) for grp, c in zip(groups, clones)]
    b = orthopt.Muon(twin, process_group=pg)
    b.load_state_dict(torch.load(path, map_location=dev))
    unloaded = [dict(grp, params=[p.detach().clone().requires_grad_() for p in grp["params"]]) for grp in groups]
    c = orthopt.Muon(unloaded, process_group=pg)  # mutation check: no state loaded
    ref = torch.load(os.environ["ORTHOPT_TEST_REF_STATE"], map_location=dev)
    resharded = [dict(grp, params=[p.detach().clone().requires_grad_() for p in grp["params"]]) for grp in groups]
    d = orthopt.Muon(resharded, process_group=pg)
    d.load_state_dict(ref)
    for t in range(2, 4):
        for opt, grps in ((a, groups), (b, twin), (c, unloaded), (d, resharded)):
            set_local_grads(grps, t, rank)
            schedule(opt, t)
            opt.step()
    res = {"a": [p.detach().clone() for p in flat_params(groups)],
           "b": [p.detach().clone() for p in flat_params(twin)],
           "c": [p.detach().clone() for p in flat_params(unloaded)],
           "d": [p.detach().clone() for p in flat_params(resharded)],
           "steps": (a.step_count, b.step_count, d.step_count)}
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    res["states_equal"] = sa.keys() == sb.keys() and all(
        sa[n].keys() == sb[n].keys() and all(torch.equal(sa[n][k], sb[n][k]) for k in sa[n]) for n in sa)
    res["meta"] = a.state_dict()["orthopt_dist"]
    wrong = a.state_dict()
    wrong["orthopt_dist"]["rank"] = (rank + 1) % world
    try:
        b.load_state_dict(wrong)
        res["wrong_rank"] = None
    except ValueError as e:
        res["wrong_rank"] = str(e)
    return res


def scenario_mismatch(pg, rank, world, out):
    """Configurations that differ across ranks, and a bad parameter on one rank: every rank raises."""
    res, dev = {}, rank_device(rank)
    cases = {
        "lr": lambda g: g[0].update(lr=0.05) if rank == world - 1 else None,
        "shape": lambda g: g[1]["params"].__setitem__(1, torch.zeros(40, 9, dtype=torch.float32, device=dev))
        if rank == 0 else None,
        "mixed": lambda g: g[2]["params"].__setitem__(0, torch.zeros(16, 16, device="meta"))
        if rank == 1 else None,
        "device": lambda g: [grp.update(params=[p.detach().to("meta") for p in grp["params"]]) for grp in g]
        if rank == 1 else None,
    }
    for name, edit in cases.items():
        groups = make_groups(torch.float32, device=dev)
        edit(groups)
        try:
            orthopt.Muon(groups, process_group=pg)
            res[name] = None
        except RuntimeError as e:
            res[name] = str(e)
    # A bad hyperparameter on one rank: its step raises, so do the others', and nothing changes.
    groups = make_groups(torch.float32, device=dev)
    opt = orthopt.Muon(groups, process_group=pg)
    set_local_grads(groups, 0, rank)
    before = [p.detach().clone() for p in flat_params(groups)]
    if rank == 1:
        opt.param_groups[0]["lr"] = float("nan")
    try:
        opt.step()
        res["step"] = None
    except (RuntimeError, ValueError) as e:  # the failing rank's own error is a ValueError
        res["step"] = str(e)
    res["unchanged"] = all(torch.equal(p, q) for p, q in zip(flat_params(groups), before))
    t = torch.ones(1, device=dev)
    torch.distributed.all_reduce(t, group=pg)  # the group is still usable: nobody hangs or desyncs
    res["after"] = float(t)
    return res


def scenario_subgroup(pg, rank, world, out):
    """The last two ranks of three form a group (src of the broadcast is global rank 1)."""
    sub = torch.distributed.new_group([1, 2])
    if rank == 0:
        return {}
    sub_rank = rank - 1
    groups = make_groups(exact_dtype(), device=rank_device(rank))
    with torch.no_grad():
        for p in flat_params(groups):
            p.add_(sub_rank)
    opt = orthopt.Muon(groups, process_group=sub)
    for t in range(STEPS):
        set_local_grads(groups, t, sub_rank)
        schedule(opt, t)
        opt.step()
    return {"final": [p.detach().clone() for p in flat_params(groups)]}


def scenario_dtensor(pg, rank, world, out):
    """DTensor params (torch >= 2.4): [3,16,24] experts Shard(0) and a Replicate matrix are
    stepped locally (no communication), [24,16] Shard(0) is gathered to its owner; adamw
    params Shard(0). Gradients are given as FSDP2 leaves them: averaged, same placements."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    full = make_dtensor_model()
    placements = [Shard(0), Shard(0), Replicate(), Shard(0), Shard(0)]
    params = [torch.nn.Parameter(distribute_tensor(t.clone(), mesh, [pl])) for t, pl in zip(full, placements)]
    opt = orthopt.Muon([{"params": params[:3]}, {"params": params[3:], "algorithm": "adamw", "lr": 3e-3}], lr=0.02)
    res = {}
    for t in range(STEPS):
        for p, g in zip(params, dtensor_grads(full, t, world)):
            p.grad = distribute_tensor(g, mesh, p.placements)
        opt.step()
    # Copies: for Replicate, distribute_tensor broadcasts in place and full_tensor() returns the
    # local tensor, so without them the CommDebugMode steps below would move the recorded result.
    res["final"] = [p.detach().full_tensor().clone() for p in params]
    try:
        try:
            from torch.distributed.tensor.debug import CommDebugMode
        except ImportError:
            from torch.distributed._tensor.debug import CommDebugMode
    except ImportError:
        return res
    counts = {}
    for name, idx in (("local", [0, 2, 3]), ("gather", [1])):
        ps = [torch.nn.Parameter(distribute_tensor(full[k].clone(), mesh, [placements[k]])) for k in idx]
        o = orthopt.Muon([{"params": [p for p in ps if p.dim() > 1]},
                          {"params": [p for p in ps if p.dim() == 1], "algorithm": "adamw"}])
        for p in ps:
            p.grad = distribute_tensor(torch.ones(p.shape), mesh, p.placements)
        mode = CommDebugMode()
        with mode:
            o.step()
        counts[name] = mode.get_total_counts()
    res["comm_counts"] = counts
    return res


def make_dtensor_model():
    g = torch.Generator().manual_seed(11)
    return [torch.randn(s, generator=g) for s in [(3, 16, 24), (24, 16), (16, 16), (30,), (10, 8)]]


def dtensor_grads(full, step, world):
    out = []
    for k, t in enumerate(full):
        total = sum(local_grad(t, k, step, r) for r in range(world))
        out.append(total / world)
    return out


def scenario_kill(pg, rank, world, out):
    """The last rank dies (SIGKILL) after the first step; the others go on stepping and must end
    with an error instead of hanging (Gloo: the closed connection; NCCL: the group's timeout, see
    tests/gpu/test_dist_nccl.py). Launched alone: the killed rank runs nothing after it."""
    groups = make_groups(torch.float32, device=rank_device(rank))
    opt = orthopt.Muon(groups, process_group=pg)
    for t in range(1000):
        set_local_grads(groups, t, rank)
        opt.step()
        float(flat_params(groups)[0].sum())  # the step finished here (a device sync on CUDA)
        if t == 0:
            open(os.path.join(out, f"kill_stepped_{rank}"), "w").close()
            if rank == world - 1:
                os.kill(os.getpid(), signal.SIGKILL)
    return {"completed": True}


def scenario_release(pg, rank, world, out):
    """A distributed optimizer that is dropped is freed at once, without a garbage collection: no
    reference cycle keeps it, and through it the process group, alive past destroy_process_group()
    (a Gloo group torn down at interpreter exit can abort the process)."""
    groups = make_groups(torch.float32, device=rank_device(rank))
    enabled = gc.isenabled()
    gc.disable()
    try:
        opt = orthopt.Muon(groups, process_group=pg)
        set_local_grads(groups, 0, rank)
        opt.step()
        ref = weakref.ref(opt)
        del opt
        return {"freed": ref() is None}
    finally:
        if enabled:
            gc.enable()


def scenario_v1_shard(pg, rank, world, out):
    """A shard of the Python format orthopt.dist.python.shard.v1 (tests/python/data, written at 2
    ranks after 2 steps of the V1_SPEC model) loads and the next step equals the saving run's."""
    saved = torch.load(os.path.join(DATA, "v1_params.pt"))
    res = {}
    for load in (True, False):  # False: mutation check, the state matters
        groups = v1_groups(saved["after2"])
        opt = orthopt.Muon(groups, process_group=pg)
        if load:
            shard = torch.load(os.path.join(DATA, f"v1_shard_{rank}.pt"))
            res["format"] = shard["orthopt_dist"]["format"]
            opt.load_state_dict(shard)
        for k, p in enumerate(flat_params(groups)):
            p.grad = local_grad(p, k, 2, rank)
        opt.step()
        res["loaded" if load else "unloaded"] = [p.detach().clone() for p in flat_params(groups)]
        res["step_count" if load else "unloaded_step_count"] = opt.step_count
    return res


SCENARIOS = {"exact": scenario_exact, "dion_q": scenario_dion_q, "saveload": scenario_saveload,
             "mismatch": scenario_mismatch,
             "subgroup": scenario_subgroup, "dtensor": scenario_dtensor, "kill": scenario_kill,
             "release": scenario_release, "v1_shard": scenario_v1_shard}


def worker():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = os.environ["ORTHOPT_TEST_OUT"]
    torch.set_num_threads(1)
    device = rank_device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's object collectives and barrier use the current device
    # A file rendezvous: a free TCP port picked by the parent could be taken before rank 0 binds it.
    timeout = datetime.timedelta(seconds=float(os.environ.get("ORTHOPT_TEST_TIMEOUT_S", "30")))
    torch.distributed.init_process_group(backend(), init_method=f"file://{os.environ['ORTHOPT_TEST_STORE']}",
                                         rank=rank, world_size=world, timeout=timeout)
    pg = torch.distributed.group.WORLD
    scenarios = os.environ["ORTHOPT_TEST_SCENARIOS"].split(",")
    for name in scenarios:
        t0 = time.time()
        try:
            res = SCENARIOS[name](pg, rank, world, out)
        except Exception:  # noqa: BLE001  reported by the test that reads it
            res = {"error": traceback.format_exc()}
        res["seconds"] = time.time() - t0
        torch.save(to_cpu(res), os.path.join(out, f"{name}_{rank}.pt"))
    if "kill" in scenarios:  # the group is broken: tearing it down could block (NCCL)
        sys.stdout.flush()
        os._exit(0)
    # Reference cycles the scenarios left behind go now, so that destroy_process_group() drops the
    # last references to the groups while the interpreter is fully alive.
    gc.collect()
    torch.distributed.destroy_process_group()


# ---------------------------------------------------------------- test side

def start(world, scenarios, out, extra_env=None, logs=None):
    """Starts `world` ranks of this file's worker; returns the Popen objects. stdout+stderr go to a
    pipe, or with ``logs`` to the files logs[r] (nothing to drain while the caller polls)."""
    # The workers import the same orthopt as this process, whatever the cwd and PYTHONPATH.
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(orthopt.__file__)))
    path = os.pathsep.join([pkg_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    store = tempfile.mktemp(prefix="orthopt_store_", dir=str(out))  # must not exist yet: FileStore creates it
    env = dict(os.environ, PYTHONPATH=path, WORLD_SIZE=str(world), ORTHOPT_TEST_STORE=store,
               ORTHOPT_TEST_OUT=str(out), ORTHOPT_TEST_SCENARIOS=",".join(scenarios), OMP_NUM_THREADS="1",
               **(extra_env or {}))
    procs = []
    for r in range(world):
        sink = open(logs[r], "wb") if logs else subprocess.PIPE
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker"], env=dict(env, RANK=str(r)),
                                      stdout=sink, stderr=subprocess.STDOUT))
        if logs:
            sink.close()  # the child has its own descriptor
    return procs


def launch(world, scenarios, out, extra_env=None, timeout=120):
    """Runs `world` ranks of this file's worker; returns {scenario: [result of rank r]}."""
    # Output into files: a rank blocked on a full pipe while another waits for it in a collective
    # would deadlock (NCCL can log a lot).
    log_files = [os.path.join(out, f"rank{r}.log") for r in range(world)]
    procs = start(world, scenarios, out, extra_env, logs=log_files)
    deadline, hung = time.time() + timeout, False
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
        hung = True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [f"---- rank {r} (exit code {p.returncode}):\n" + open(f, errors="replace").read()[-20000:]
            for r, (p, f) in enumerate(zip(procs, log_files))]
    assert not hung, f"the ranks did not finish within {timeout} s (killed)\n" + "\n".join(logs)
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return {s: [torch.load(os.path.join(out, f"{s}_{r}.pt")) for r in range(world)] for s in scenarios}


def run_kill(world, out, extra_env=None, timeout=120):
    """Launches the kill scenario; returns per rank (exit code, seconds from the killed rank's death
    to this rank's exit, result dict or None, log tail, whether its first step finished). Ranks
    still alive after `timeout` are killed (exit code None: they hung)."""
    log_files = [os.path.join(out, f"kill_rank{r}.log") for r in range(world)]
    procs = start(world, ["kill"], out, extra_env, logs=log_files)
    deadline, died, ended = time.time() + timeout, None, [None] * world
    try:
        while time.time() < deadline and any(e is None for e in ended):
            for r in reversed(range(world)):  # the killed rank first: no survivor ends "before" the death
                if ended[r] is None and procs[r].poll() is not None:
                    ended[r] = time.time()
            if died is None and ended[world - 1] is not None:
                died = ended[world - 1]
            time.sleep(0.05)
        rcs = [p.poll() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p in procs:
        p.wait()
    logs = [open(f, errors="replace").read()[-20000:] for f in log_files]
    out_res = []
    for r in range(world):
        f = os.path.join(out, f"kill_{r}.pt")
        out_res.append(torch.load(f) if os.path.exists(f) else None)
    return [(rcs[r], None if died is None or ended[r] is None else ended[r] - died, out_res[r], logs[r],
             os.path.exists(os.path.join(out, f"kill_stepped_{r}"))) for r in range(world)]


def rel(a, b):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def result(res):
    """The per-rank results of one scenario, failing on any rank's error."""
    for r, x in enumerate(res):
        assert "error" not in x, f"rank {r}: {x['error']}"
    return res


# Checks of the worker results: each takes the per-rank results of one launch and what the
# single-process optimizer gave on the global batch (tests/gpu/test_dist_nccl.py uses them too).

def check_matches_single_process(res, snaps, dtype, tol):
    """Every rank after 1 and STEPS steps against the single-process snapshots; returns the worst."""
    start = make_groups(dtype)
    worst = 0.0
    for r, x in enumerate(res):
        for k, p in enumerate(x["start"]):  # rank 0's parameters were broadcast
            assert torch.equal(p, flat_params(start)[k].detach()), (r, k)
        for key, step in (("step1", 1), ("final", STEPS)):
            for k, (got, want) in enumerate(zip(x[key], snaps[step])):
                e = rel(got, want)
                worst = max(worst, e)
                assert e <= tol, f"rank {r}, param {k}, after {step} step(s): relative difference {e:.3e}"
        for got, want in zip(x["final"], res[0]["final"]):
            assert torch.equal(got, want)  # every rank holds the same model
        assert x["step_count"] == STEPS and x["skipped_equal"]
    # The never-stepped param (no gradient anywhere) is untouched; the partial one moved.
    assert torch.equal(res[0]["final"][12], flat_params(start)[12].detach())
    return worst


def check_dion_q(res, world, dtype, device="cpu"):
    groups = make_groups(dtype, device=device)
    opt = orthopt.Muon(groups)
    opt.set_skip_factor(0.0)
    set_global_grads(groups, 0, world)
    opt.step()
    want = opt.state_dict()["state"]
    for r, x in enumerate(res):
        for k in DION_PARAMS:  # every piece's Q is its slice of this, so the assembled Q is equal
            assert torch.equal(x["full"]["state"][k]["Q"], want[k]["Q"].cpu()), f"rank {r}, param {k}"


def check_full_state(res, want, world, dtype, tol, device="cpu"):
    """full_state_dict() equals the single-process state dict ``want``; a single-process optimizer
    loads it and continues like the single-process run."""
    full = res[0]["full"]
    assert [g["params"] for g in full["param_groups"]] == [g["params"] for g in want["param_groups"]]
    assert full["state"].keys() == want["state"].keys()
    assert 12 not in full["state"]  # never had a gradient: no state, like the single process
    for pid, st in want["state"].items():
        assert full["state"][pid].keys() == st.keys(), pid
        for k, v in st.items():
            got = full["state"][pid][k]
            assert got.shape == v.shape and got.dtype == v.dtype, (pid, k)
            if v.dim() == 0:
                assert torch.equal(got, v.cpu()), (pid, k)
            else:
                assert rel(got, v) <= tol, (pid, k, rel(got, v))
    groups = make_groups(dtype, device=device)
    with torch.no_grad():
        for p, w in zip(flat_params(groups), res[0]["final"]):
            p.copy_(w)
    opt = orthopt.Muon(groups)
    opt.load_state_dict(full)
    run_reference(world, dtype, 1, start=STEPS, groups=groups, opt=opt)
    _, _, snaps = run_reference(world, dtype, STEPS + 1, snapshots=(STEPS + 1,), device=device)
    for k, (got, want_p) in enumerate(zip(flat_params(groups), snaps[STEPS + 1])):
        assert rel(got, want_p) <= tol, (k, rel(got, want_p))


def check_state_sharded(res, want_state, want_bytes, world):
    """Returns the state bytes per rank."""
    want_tensors = state_nbytes(want_state["state"], with_scalars=False)
    per_rank = [x["state_bytes"] for x in res]
    for x in res:
        assert x["state_bytes"] == x["shard_bytes"]
    # Each piece holds exactly its slice (0-d AdamW step counters are per piece, so not summed).
    assert sum(x["shard_tensor_bytes"] for x in res) == want_tensors
    # Whole matrices cannot split finer. Measured on this model: largest rank 50.0% at N=2, 41.0%
    # at N=3; without the per-bank rotation of the blocks 70% / 55%; replicated state 100%.
    assert max(per_rank) <= 1.25 * want_bytes / world, per_rank
    return per_rank


def check_save_load(res, world, tol, device="cpu"):
    for r, x in enumerate(res):
        for k, (a, b) in enumerate(zip(x["a"], x["b"])):
            assert torch.equal(a, b), f"rank {r} param {k}: resumed from the shard differs"
        assert x["states_equal"]
        assert x["steps"] == (4, 4, 2)  # d loaded a single-process dict: its own count restarts
        assert any(not torch.equal(a, c) for a, c in zip(x["a"], x["c"]))  # the state matters
        assert "rank" in x["wrong_rank"]
    # The shards are in the C++ format: its segments, and pieces that tile each segment over the ranks.
    metas = [x["meta"] for x in res]
    assert all(m["format"] == orthopt._C.DIST_SHARD_FORMAT == "orthopt.dist.shard.v1" for m in metas)
    assert all(m["world_size"] == world and m["rank"] == r and m["segments"] == metas[0]["segments"]
               for r, m in enumerate(metas))
    for k, seg in enumerate(metas[0]["segments"]):
        ranges = sorted((p["begin"], p["end"]) for m in metas for p in m["pieces"] if p["segment"] == k)
        assert ranges[0][0] == 0 and ranges[-1][1] == seg["units"], (k, ranges)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (k, ranges)
    # Re-sharding: the 1-process state after 2 steps, loaded on N ranks, continues like the
    # 1-process run (the same test at N = 2 and 3 covers any world size to any other).
    _, _, snaps = run_reference(world, torch.float32, 4, snapshots=(4,), device=device)
    for r, x in enumerate(res):
        for k, (got, want) in enumerate(zip(x["d"], snaps[4])):
            assert rel(got, want) <= tol, f"rank {r} param {k}: {rel(got, want):.3e}"


def check_mismatch(res, world, backend_name="gloo", device_type="cpu"):
    for r, x in enumerate(res):
        assert "differs across ranks" in x["lr"] and "group 0 option 'lr'" in x["lr"], x["lr"]
        assert f"rank(s) {world - 1} disagree" in x["lr"]
        assert "group 1 param 1" in x["shape"] and "(40, 9)" in x["shape"], x["shape"]
        assert "rank 1: " in x["mixed"] and "group 2 param 0" in x["mixed"] and "one dtype and device" in x["mixed"]
        assert "rank 1: " in x["device"] and "group 0 param 0 is on meta" in x["device"], x["device"]
        assert f"{backend_name} backend needs {device_type}" in x["device"], x["device"]
        want = "option 'lr' must be finite" if r == 1 else "other rank(s) failed"
        assert want in x["step"] and x["unchanged"], x["step"]
        assert x["after"] == world


def check_kill(ranks, world, limit_s):
    """The killed rank died by SIGKILL after its first step; every other rank took its first step
    and then ended with an error (an exception, or a signal such as NCCL's watchdog abort) within
    limit_s of the death, not after finishing and not by hanging. Returns a line per rank."""
    lines = []
    rc, _, _, log, stepped = ranks[world - 1]
    assert stepped and rc == -signal.SIGKILL, f"the killed rank: rc {rc}, first step done {stepped}\n{log}"
    for r, (rc, after, res, log, stepped) in enumerate(ranks[:world - 1]):
        assert stepped, f"rank {r} did not finish its first step (rc {rc})\n{log}"
        assert rc is not None, f"rank {r} still running {limit_s} s after rank {world - 1} died: a hang\n{log}"
        assert after is not None and after <= limit_s, (r, after)
        if res is not None and "error" not in res:
            raise AssertionError(f"rank {r} finished all steps without its peer: {res}\n{log}")
        if res is not None:
            how = "raised " + res["error"].strip().splitlines()[-1][:300]
        else:
            assert rc != 0, f"rank {r}: exit code 0 without a result\n{log}"
            how = f"ended by signal {signal.Signals(-rc).name}" if rc < 0 else f"exited with {rc}"
        lines.append(f"rank {r}: {how}, {after:.1f} s after rank {world - 1} died")
    return lines


# ---------------------------------------------------------------- the tests (Gloo, CPU)

@pytest.fixture(scope="module")
def reference():
    """Single-process runs on the global batch of 2 and 3 ranks."""
    ref = {}
    for world in (2, 3):
        groups, opt, snaps = run_reference(world, torch.float64, STEPS, snapshots=(1, STEPS))
        ref[world] = {"snaps": snaps, "state": opt.state_dict(), "state_bytes": opt.state_bytes}
    return ref


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One launch per world size runs every scenario (process start-up dominates the time)."""
    results = {}
    for world in (2, 3):
        out = tmp_path_factory.mktemp(f"dist{world}")
        # The single-process state after 2 steps of this world size's global batch, for re-sharding.
        _, opt, _ = run_reference(world, torch.float32, 2)
        torch.save(opt.state_dict(), out / "ref_state.pt")
        scenarios = ["exact", "dion_q", "saveload", "mismatch", "release"] + \
            (["subgroup"] if world == 3 else ["v1_shard"])
        t0 = time.time()
        results[world] = launch(world, scenarios, out, {"ORTHOPT_TEST_REF_STATE": str(out / "ref_state.pt")})
        print(f"\n{world} ranks: {time.time() - t0:.1f} s; per scenario (rank 0): " +
              ", ".join(f"{s} {results[world][s][0]['seconds']:.2f} s" for s in scenarios))
    return results


@pytest.mark.parametrize("world", [2, 3])
def test_matches_single_process_on_global_batch(runs, reference, world, capsys):
    worst = check_matches_single_process(result(runs[world]["exact"]), reference[world]["snaps"], torch.float64, 1e-6)
    with capsys.disabled():
        print(f"\n{world} ranks vs 1 process (fp64, {STEPS} steps): largest relative difference {worst:.2e}")


@pytest.mark.parametrize("world", [2, 3])
def test_dion_pieces_start_from_the_single_process_q(runs, world):
    check_dion_q(result(runs[world]["dion_q"]), world, torch.float64)


@pytest.mark.parametrize("world", [2, 3])
def test_full_state_dict_equals_single_process_state(runs, reference, world):
    check_full_state(result(runs[world]["exact"]), reference[world]["state"], world, torch.float64, 1e-6)


@pytest.mark.parametrize("world", [2, 3])
def test_state_is_sharded(runs, reference, world, capsys):
    total = reference[world]["state_bytes"]
    per_rank = check_state_sharded(result(runs[world]["exact"]), reference[world]["state"], total, world)
    with capsys.disabled():
        print(f"\n{world} ranks: state bytes per rank {per_rank} of {total} "
              f"(largest {100 * max(per_rank) / total:.1f}%)")


@pytest.mark.parametrize("world", [2, 3])
def test_save_load_continues_bit_identically_and_reshards(runs, world):
    check_save_load(result(runs[world]["saveload"]), world, 1e-6)


@pytest.mark.parametrize("world", [2, 3])
def test_mismatch_raises_on_every_rank(runs, world):
    check_mismatch(result(runs[world]["mismatch"]), world)


@pytest.mark.parametrize("world", [2, 3])
def test_dropped_optimizer_is_freed_without_garbage_collection(runs, world):
    assert all(x["freed"] for x in result(runs[world]["release"]))


def test_subgroup_of_three_ranks_matches_two_rank_reference(runs, reference):
    res = result(runs[3]["subgroup"])
    for r in (1, 2):
        for k, (got, want) in enumerate(zip(res[r]["final"], reference[2]["snaps"][STEPS])):
            assert rel(got, want) <= 1e-6, (r, k)


def test_python_shard_format_v1_loads_and_continues_bit_identically(runs):
    saved = torch.load(os.path.join(DATA, "v1_params.pt"))
    for r, x in enumerate(result(runs[2]["v1_shard"])):
        assert x["format"] == "orthopt.dist.python.shard.v1"
        for k, (got, want) in enumerate(zip(x["loaded"], saved["after3"])):
            assert torch.equal(got, want), f"rank {r} param {k}: the step after loading the v1 shard differs"
        assert x["step_count"] == 3 and x["unloaded_step_count"] == 1
        assert any(not torch.equal(a, b) for a, b in zip(x["unloaded"], saved["after3"]))


# Mixed parameter lists for the layout test: banks that straddle ranks, stacks, flatten, banks
# smaller than N, scalar groups, an empty group, a matrix group after a scalar one.
LAYOUT_SPECS = {
    "test_model": [(algo, bool(opts.get("flatten")), shapes) for algo, opts, shapes in SPEC],
    "stacks": [("muon", False, [(4, 6), (5, 4, 6), (6, 4), (2, 3, 6, 4), (4, 6)]),
               ("adamw", False, [(7,), (3, 5), (1,)]),
               ("dion", True, [(4, 2, 3), (4, 6), (3, 3, 3)])],
    "tiny": [("lion", False, [(3,)]), ("muon", False, [(2, 2)]), ("adamw", False, []),
             ("normuon", False, [(9, 2), (2, 9), (9, 2)])],
    "wide_bank": [("dion3", False, [(8, 8)] * 11 + [(16, 8)]), ("adamw", False, [(100,), (17, 3)]),
                  ("dion2", True, [(2, 2, 2, 2)] * 3)],
}


@pytest.mark.parametrize("name", sorted(LAYOUT_SPECS))
def test_engine_layout_is_the_cpp_layout(name):
    """The pieces the Python engine builds on every rank and the copies it makes are those of the
    C++ layout (orthopt._C.dist_layout = orthopt::dist::build_layout), at N = 1..8, and that layout
    has the documented properties."""
    from orthopt import _C
    from orthopt.dist import flat_layout, owned_pieces
    groups = LAYOUT_SPECS[name]
    numel = {(g, i): math.prod(shape) for g, (_, _, shapes) in enumerate(groups) for i, shape in enumerate(shapes)}
    for world in range(1, 9):
        cpp = _C.dist_layout(groups, world)
        # Param indices as the engine passes them: without the params that bypass the flat buffers.
        spec = [(algo, flatten, [(10 + i, shape) for i, shape in enumerate(shapes)]) for algo, flatten, shapes in groups]
        segments, members, runs, chunk = flat_layout(spec, world)
        assert chunk == cpp["chunk"] and segments == cpp["segments"]
        assert members == [(s, g, 10 + i, first, n) for s, g, i, first, n in cpp["members"]]
        # Where every element of every param lives in the [N*chunk] buffer, from the C++ runs.
        where = {}
        for g, i, po, fo, n, owner in cpp["runs"]:
            assert fo // chunk == owner and (fo + n - 1) // chunk == owner, "a run straddles ranks"
            for e in range(n):
                assert (g, i, po + e) not in where
                where[(g, i, po + e)] = fo + e
        assert sorted(where) == sorted((g, i, e) for (g, i), n in numel.items() for e in range(n))
        for (g, i), rs in runs.items():
            for po, owner, co, n in rs:
                assert all(where[(g, i - 10, po + e)] == owner * chunk + co + e for e in range(n))
        # The engine's pieces: each rank's tile exactly the elements the layout gives that rank.
        for r in range(world):
            got = set()
            for g, i, kind, offset, co, n, (k, begin, end) in owned_pieces(segments, members, r):
                shape = groups[g][2][i - 10]
                first = offset * n if kind == "matrix" else offset if kind == "flat" else 0
                # The piece's units of its segment, as its shard names them: within rank r's range.
                b, e = cpp["segments"][k]["owned"][r]
                assert b <= begin < end <= e and (end - begin) * cpp["segments"][k]["unit_numel"] == n
                assert kind != "whole" or n == numel[(g, i - 10)]
                for e in range(n):
                    assert where[(g, i - 10, first + e)] == r * chunk + co + e, (world, r, g, i, kind, offset)
                    got.add((g, i - 10, first + e))
                if kind != "flat":
                    assert n == math.prod(shape[-2:]) or (groups[g][1] and len(shape) >= 3)
            assert got == {k for k, f in where.items() if f // chunk == r}
        # The layout itself: one bank per (group, matrix shape) in order of first appearance,
        # blocks of ceil(units/N) that partition the bank, and per segment the rotation that keeps
        # the most loaded rank lightest (then the most even), given the segments before it.
        load, offset = [0] * world, 0
        for seg in cpp["segments"]:
            assert seg["per_rank"] == -(-seg["units"] // world) and seg["chunk_offset"] == offset
            offset += seg["per_rank"] * seg["unit_numel"]
            owned = sorted(seg["owned"])
            assert owned[0][0] == 0 and owned[-1][1] == seg["units"]
            assert all(a[1] == b[0] for a, b in zip(owned, owned[1:]))

            def key(shift):
                loads = [load[r] + min(seg["units"], ((r - shift) % world + 1) * seg["per_rank"]) * seg["unit_numel"]
                         - min(seg["units"], ((r - shift) % world) * seg["per_rank"]) * seg["unit_numel"]
                         for r in range(world)]
                return max(loads), sum(float(x) ** 2 for x in loads)
            assert key(seg["shift"]) == min(key(s) for s in range(world))
            for r, (b, e) in enumerate(seg["owned"]):
                load[r] += (e - b) * seg["unit_numel"]
        assert offset == chunk
        banks = [(seg["group"], seg["rows"], seg["cols"]) for seg in cpp["segments"] if seg["bank"]]
        assert len(banks) == len(set(banks))


def test_dist_layout_rejects_bad_arguments():
    from orthopt import _C
    with pytest.raises(ValueError, match="world_size"):
        _C.dist_layout([("muon", False, [(2, 2)])], 0)
    with pytest.raises(ValueError, match="algorithm"):
        _C.dist_layout([("sgd", False, [(2, 2)])], 2)
    with pytest.raises(ValueError, match="empty"):
        _C.dist_layout([("muon", False, [(0, 2)])], 2)
    with pytest.raises(TypeError, match="groups"):
        _C.dist_layout(["muon"], 2)
    with pytest.raises(RuntimeError, match="not a matrix"):
        _C.dist_layout([("muon", False, [(4,)])], 2)


def test_killed_rank_ends_the_others_with_an_error(tmp_path, capsys):
    """Rank 1 of 2 is SIGKILLed after its first step: rank 0's next step raises (Gloo sees the
    closed connection at once; tests/gpu/test_dist_nccl.py runs the same on NCCL)."""
    lines = check_kill(run_kill(2, tmp_path, timeout=60), 2, limit_s=30)
    with capsys.disabled():
        print("\ngloo kill test: " + "; ".join(lines))


def test_process_group_without_init_process_group_is_refused():
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):
        orthopt.Muon(make_groups(torch.float32), process_group=object())


def _has_dtensor():
    # find_spec instead of an import kept only for its side effect (which pyflakes reports
    # as unused, `# noqa` or not).
    try:
        return importlib.util.find_spec("torch.distributed.tensor") is not None
    except ModuleNotFoundError:  # no torch.distributed at all
        return False


@pytest.mark.skipif(not _has_dtensor(), reason="needs torch.distributed.tensor (torch >= 2.4)")
def test_dtensor_params(tmp_path):
    res = launch(2, ["dtensor"], tmp_path)["dtensor"]
    full = make_dtensor_model()
    params = [t.clone().requires_grad_() for t in full]
    opt = orthopt.Muon([{"params": params[:3]}, {"params": params[3:], "algorithm": "adamw", "lr": 3e-3}], lr=0.02)
    for t in range(STEPS):
        for p, g in zip(params, dtensor_grads(full, t, 2)):
            p.grad = g
        opt.step()
    for r, x in enumerate(res):
        assert "error" not in x, x.get("error")
        for k, (got, want) in enumerate(zip(x["final"], params)):
            assert rel(got, want.detach()) <= 1e-6, (r, k, rel(got, want.detach()))
        if "comm_counts" in x:
            assert x["comm_counts"]["local"] == 0 and x["comm_counts"]["gather"] > 0, x["comm_counts"]


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()

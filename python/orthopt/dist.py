"""Data-parallel orthopt optimizers on a torch.distributed process group (docs/distributed.md).

``orthopt.Muon(params, process_group=pg)`` (any of the classes) runs a ``DistributedEngine``:
the layout of the C++ ``orthopt::dist::DistributedOptimizer`` (``build_layout`` in
src/distributed/distributed_optimizer.cpp, read through ``orthopt._C.dist_layout``) driven by
torch.distributed collectives on the caller's group, so any backend works and no c10d type
crosses between torch's module and ours; the math is the C++ step (orthopt._C) on the pieces
this rank owns.

Layout (the same on every rank; docs/distributed.md): one bank per matrix shape of a matrix group,
padded to N*ceil(B/N) matrices and cut into N blocks with a per-bank rotation; a scalar group
(adamw, lion) one flat vector, padded and cut alike. Rank r's chunk is its block of every segment.
Python holds only the collectives and the copies the layout prescribes. A step: pack the gradients
into [N*chunk], reduce-scatter (sum; other backends than NCCL: all-reduce + slice), divide by N,
C++ step on the owned pieces, all-gather the parameter chunks, copy them into the params.

Owned pieces are the local C++ optimizer's parameters: one [m, k] view per owned matrix (the
param's own shape when it is one matrix), one 1-D view per (scalar param, owned range). So a
group's same-shape matrices are orthogonalized in one batched call, and a piece's state is a
slice of its param's single-process state (what full_state_dict / load_state_dict re-shard).
"""
import math
import weakref

import torch
import torch.distributed as dist

from . import _C
from . import dtensor as _dt
from .optim import _check_same_groups, _cpp_options

__all__ = ["DistributedEngine", "flat_layout", "owned_pieces"]

_MATRIX = frozenset({"muon", "normuon", "dion3", "dion2", "dion"})
SHARD_FORMAT = _C.DIST_SHARD_FORMAT  # the C++ DistributedOptimizer's (include/orthopt/distributed.h)
PYTHON_SHARD_FORMAT_V1 = "orthopt.dist.python.shard.v1"  # read only: state_dict() of earlier versions
# The states C++ keeps in matrix shape ([..., rows, 1], [..., cols, r]: state_specs in
# src/optim/optimizer.cpp); every other state tensor has the parameter's shape.
_MATRIX_SHAPED_STATE = frozenset({"variance", "Q"})


def flat_layout(spec, world):
    """The C++ layout (``orthopt._C.dist_layout``, i.e. ``orthopt::dist::build_layout``) of the params
    that go through the flat buffers. ``spec``: per group (algorithm, flatten, [(param index, shape), ...]).
    Returns (segments, members, runs, chunk): segments as dicts (group, bank, rows, cols, units,
    unit_numel, per_rank, chunk_offset, shift, owned = [(begin, end) per rank]); members
    (segment, group, param index, first unit, units); runs per (group, param index): (param offset,
    owner, offset in the owner's chunk, count) in elements."""
    index = [[i for i, _ in params] for _, _, params in spec]
    layout = _C.dist_layout([(algo, flatten, [shape for _, shape in params]) for algo, flatten, params in spec], world)
    chunk = layout["chunk"]
    members = [(s, g, index[g][j], first, count) for s, g, j, first, count in layout["members"]]
    runs = {}
    for g, j, param_offset, flat_offset, count, owner in layout["runs"]:
        runs.setdefault((g, index[g][j]), []).append((param_offset, owner, flat_offset - owner * chunk, count))
    return layout["segments"], members, runs, chunk


def owned_pieces(segments, members, rank):
    """The pieces of the flat params that ``rank`` owns, in chunk order per segment:
    (group, param index, kind, offset, offset in the chunk, numel, (segment, begin, end)). kind
    'flat': elements [offset, offset + numel) of a scalar param; 'matrix': matrix ``offset`` of a
    stack (numel of one matrix); 'whole': a param that is one matrix. (segment, begin, end): the
    units of the segment the piece holds, as a piece of the C++ shard format names them."""
    out = []
    for s, g, i, first, count in members:
        seg = segments[s]
        b, e = seg["owned"][rank]
        lo, hi = max(b, first), min(e, first + count)
        if not seg["bank"]:
            if lo < hi:
                out.append((g, i, "flat", lo - first, seg["chunk_offset"] + (lo - b), hi - lo, (s, lo, hi)))
            continue
        un = seg["unit_numel"]
        for u in range(lo, hi):
            out.append((g, i, "whole" if count == 1 else "matrix", u - first, seg["chunk_offset"] + (u - b) * un, un,
                        (s, u, u + 1)))
    return out


class _Item:
    """One parameter of the local C++ optimizer.

    kind: 'whole' (an owned param that is one matrix), 'matrix' (matrix `offset` of a stack),
    'flat' (elements [offset, offset + numel) of a scalar param), 'local' (a DTensor's local
    shard), 'full' (a gathered DTensor on its owner), 'replica' (a plain param without a group).
    """

    def __init__(self, group, param, kind, offset, tensor, name, grad_view=None, flag=-1):
        self.group, self.param, self.kind, self.offset = group, param, kind, offset
        self.tensor, self.name, self.grad_view, self.flag = tensor, name, grad_view, flag
        self.local_group = self.local_index = -1
        self.piece = None  # (segment, begin, end) of the C++ layout; None outside it (DTensor, replica)

    @property
    def key(self):
        return (self.group, self.param, self.kind, self.offset)


def _first_difference(a, b, r):
    for (la, va), (lb, vb) in zip(a, b):
        if (la, va) != (lb, vb):
            if la == lb:
                return f"{la}: rank 0 has {va}, rank {r} has {vb}"
            return f"rank 0 has '{la}: {va}', rank {r} has '{lb}: {vb}'"
    return f"rank 0 describes {len(a)} items, rank {r} {len(b)}"


class DistributedEngine:
    """The distributed state of an orthopt optimizer ``opt`` (see the module docstring)."""

    def __init__(self, opt, process_group):
        name = type(opt).__name__
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"{name}: process_group was given (or a parameter is a DTensor) but torch.distributed "
                               "is not initialized: call torch.distributed.init_process_group first")
        # A weak reference: opt holds this engine, and a cycle would keep both, and through them the
        # process group, alive until a garbage collection, possibly after destroy_process_group()
        # and into interpreter shutdown, where tearing down a Gloo group can abort the process.
        self.opt, self.pg = weakref.proxy(opt), process_group
        groups = opt.param_groups
        # Group of the start-up check and full_state_dict; without process_group the ranks of the
        # DTensors' mesh (None: a multi-dim mesh on part of the world, e.g. a pipeline stage).
        self.group = process_group
        if process_group is None:
            first = next(p for g in groups for p in g["params"] if _dt.is_dtensor(p))
            self.group = _dt.check_group(first) if _dt.available() else dist.group.WORLD
        in_group = self.group is not None
        self.rank = dist.get_rank(self.group) if in_group else dist.get_rank()
        if self.rank < 0:
            raise RuntimeError(f"{name}: this process (global rank {dist.get_rank()}) is not in process_group")
        self.world = dist.get_world_size(self.group) if in_group else dist.get_world_size()
        self.algorithms = [g["algorithm"] for g in groups]
        self.flat, self.replica, self.dlocal, self.dgather = [], [], [], []
        self.segments = []
        self.native = False
        error = None
        try:
            self._classify(groups)
            # Options and shapes as C++ sees them, on meta tensors: every rank validates every group
            # (a rank may own nothing of one), so a bad value fails everywhere alike.
            _C.Optimizer([dict(_cpp_options(g), params=[torch.empty(tuple(p.shape), dtype=p.dtype, device="meta")
                                                        for p in g["params"]]) for g in groups])
        except Exception as e:  # noqa: BLE001  reported on every rank by the check below
            error = f"{type(e).__name__}: {e}"
        self.description = self._describe(groups)
        self._check_same(name, error)
        self.items = []
        if self.flat:
            self._build_flat(groups)
        self._build_dtensor(groups)
        for g, i in self.replica:  # stepped in place, with the param's own gradient
            self.items.append(_Item(g, i, "replica", 0, groups[g]["params"][i], self._label(g, i)))
        self._build_local(groups)
        self.lr_scale, self.skip = 1.0, None
        self.steps = torch.zeros((), dtype=torch.long)

    # -- construction

    def _label(self, g, i):
        names = self.opt.param_groups[g].get("param_names")
        return f"group {g} param {i}" + (f" ({names[i]})" if names else "")

    def _classify(self, groups):
        first = None
        for g, group in enumerate(groups):
            matrix = group["algorithm"] in _MATRIX
            for i, p in enumerate(group["params"]):
                label = self._label(g, i)
                if matrix and p.dim() < 2:
                    raise ValueError(f"{label} of shape {tuple(p.shape)} is in a '{group['algorithm']}' group but is "
                                     "not a matrix (needs >= 2 dims); route it to adamw or lion")
                if p.numel() == 0:
                    raise ValueError(f"{label} is empty")
                if _dt.is_dtensor(p):
                    if not _dt.available():
                        raise RuntimeError(f"{label} is a DTensor: DTensor parameters need torch >= 2.4")
                    if _dt.is_local(p, matrix, bool(group.get("flatten"))):
                        self.dlocal.append((g, i))
                    else:
                        problem = _dt.gather_problem(p)
                        if problem:
                            raise ValueError(f"{label} {problem}")
                        self.dgather.append((g, i))
                elif self.pg is None:
                    self.replica.append((g, i))
                else:
                    if not p.is_contiguous():
                        raise ValueError(f"{label} must be contiguous")
                    if first is None:
                        first = (p.dtype, p.device, label)
                    elif (p.dtype, p.device) != first[:2]:
                        raise ValueError(f"all parameters must share one dtype and device: {label} is {p.dtype} on "
                                         f"{p.device}, {first[2]} is {first[0]} on {first[1]}")
                    self.flat.append((g, i))
        if first is not None:
            backend = str(dist.get_backend(self.pg)).lower()
            if ":" in backend:  # "cpu:gloo,cuda:nccl"
                backend = dict(x.split(":", 1) for x in backend.split(",")).get(first[1].type, "")
                if not backend:
                    raise ValueError(f"{first[2]} is on {first[1]} but process_group has no backend for that device")
            needs = {"gloo": "cpu", "nccl": "cuda"}.get(backend)
            if needs and first[1].type != needs:
                raise ValueError(f"{first[2]} is on {first[1]} but process_group's {backend} backend needs {needs} "
                                 "tensors")
            self.native = backend == "nccl"  # reduce_scatter_tensor; others emulate it (Gloo has none in 1.13)

    def _describe(self, groups):
        items = [("world size", self.world), ("process_group given", self.pg is not None),
                 ("param groups", len(groups))]
        for g, group in enumerate(groups):
            opts = _cpp_options(group)
            items += [(f"group {g} option '{k}'", repr(opts[k])) for k in sorted(opts)]
            items.append((f"group {g} params", len(group["params"])))
            for i, p in enumerate(group["params"]):
                desc = _dt.describe(p) if _dt.is_dtensor(p) and _dt.available() else f"{tuple(p.shape)} {p.dtype}"
                items.append((self._label(g, i), desc))
        return items

    def _check_same(self, name, error):
        """All ranks exchange their description and local error; any problem raises on every rank."""
        if self.group is None:  # no group spans exactly these ranks: local checks only
            if error:
                raise RuntimeError(f"{name}: {error}")
            return
        gathered = [None] * self.world
        dist.all_gather_object(gathered, (self.description, error), group=self.group)
        errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(gathered) if e]
        if errors:
            raise RuntimeError(f"{name}: " + "; ".join(errors))
        ref = gathered[0][0]
        bad = [r for r in range(1, self.world) if gathered[r][0] != ref]
        if bad:
            raise RuntimeError(f"{name}: optimizer configuration differs across ranks: rank(s) "
                               f"{', '.join(map(str, bad))} disagree with rank 0; first difference: "
                               f"{_first_difference(ref, gathered[bad[0]][0], bad[0])}")

    def _build_flat(self, groups):
        N, r = self.world, self.rank
        spec = [(grp["algorithm"], bool(grp.get("flatten")), []) for grp in groups]
        for g, i in self.flat:
            spec[g][2].append((i, tuple(groups[g]["params"][i].shape)))
        segments, members, self.runs, C = flat_layout(spec, N)
        self.segments = segments
        self.C = C
        self.flag_of = {gi: k for k, gi in enumerate(self.flat)}
        self.G = C + len(self.flat) + 1  # gradient chunk: data, one presence flag per param, an error flag
        p0 = groups[self.flat[0][0]]["params"][self.flat[0][1]]
        opts = dict(dtype=p0.dtype, device=p0.device)
        self.grad_flat = torch.zeros(N * self.G, **opts)
        self.param_flat = torch.zeros(N * C, **opts)
        self._plan_copies()
        with torch.no_grad():  # start identical: rank 0's parameters everywhere (like DDP)
            self._pack_params(all_ranks=True)
            src = 0 if self.pg is dist.group.WORLD else dist.get_global_rank(self.pg, 0)
            dist.broadcast(self.param_flat, src=src, group=self.pg)
            self._unpack_params()
        own_p = self.param_flat[r * C:(r + 1) * C]
        own_g = self.grad_flat[r * self.G:r * self.G + C]
        for g, i, kind, offset, o, n, piece in owned_pieces(segments, members, r):
            p, label = groups[g]["params"][i], self._label(g, i)
            if kind == "flat":
                shape, name = (n,), f"{label}[{offset}:{offset + n}]"
            elif kind == "whole":
                shape, name = tuple(p.shape), label
            else:
                shape, name = tuple(p.shape[-2:]), f"{label}[matrix {offset}]"
            self.items.append(_Item(g, i, kind, offset, own_p[o:o + n].view(shape), name, own_g[o:o + n].view(shape),
                                    self.flag_of[(g, i)]))
            self.items[-1].piece = piece

    def _build_dtensor(self, groups):
        for g, i in self.dlocal:
            loc = _dt.local(groups[g]["params"][i])
            if loc.numel():  # an empty shard (fewer experts than ranks) has nothing to step
                # Copies of the shard and its gradient: the C++ optimizer keeps its tensors, while a
                # DTensor's local tensor and gradient may be replaced between steps (FSDP2).
                t = loc.detach().clone()
                self.items.append(_Item(g, i, "local", 0, t, self._label(g, i), torch.empty_like(t)))
        self.owner = {}
        load = {}
        for g, i in self.dgather:  # owner: the least loaded rank of the param's mesh, by elements
            p = groups[g]["params"][i]
            key = id(p.device_mesh)
            counts = load.setdefault(key, [0] * _dt.mesh_size(p))
            owner = min(range(len(counts)), key=lambda k: counts[k])
            counts[owner] += p.numel()
            self.owner[(g, i)] = owner
            if owner == _dt.mesh_rank(p):
                t = torch.empty(tuple(p.shape), dtype=p.dtype, device=_dt.local(p).device)
                self.items.append(_Item(g, i, "full", 0, t, self._label(g, i), torch.empty_like(t)))

    def _build_local(self, groups):
        by_group = {}
        for it in self.items:
            by_group.setdefault(it.group, []).append(it)
        self.local_group_of = [-1] * len(groups)
        local_groups = []
        for g in sorted(by_group):
            self.local_group_of[g] = len(local_groups)
            for li, it in enumerate(by_group[g]):
                it.local_group, it.local_index = len(local_groups), li
            local_groups.append(dict(_cpp_options(groups[g]), params=[it.tensor for it in by_group[g]],
                                     param_names=[it.name for it in by_group[g]]))
        self.items = [it for g in sorted(by_group) for it in by_group[g]]
        self.local = _C.Optimizer(local_groups) if local_groups else None
        self.synced = [_cpp_options(g) for g in groups]
        # Dion's Q starts random, seeded per parameter of the optimizer holding it: each piece
        # declares the slice of the Q the single-process optimizer gives its parameter (same seed
        # rule and draw, in C++), so N ranks start where one process does, also after loading a
        # state dict without Q. Not done for DTensor shards that split a stack (left: own seed).
        for it in self.items:
            source = self._q_source(it) if groups[it.group]["algorithm"] == "dion" else None
            if source is not None:
                self.local.set_initial_q_sources(it.local_group, it.local_index, [source])

    def _q_source(self, it):
        """(group, index, matrix sizes, begin, end): which matrices of its parameter's Q a piece holds."""
        p = self._params(it.group, it.param)
        shape = list(p.shape)  # a DTensor's global shape
        msz = [shape[0], math.prod(shape[1:])] if self.opt.param_groups[it.group].get("flatten") and len(shape) >= 3 \
            else shape
        if it.kind == "matrix":
            return it.group, it.param, msz, it.offset, it.offset + 1
        if it.kind == "local" and not all(pl.is_replicate() for pl in p.placements):
            return None
        return it.group, it.param, msz, 0, math.prod(msz[:-2])  # the whole parameter

    # -- copies between the params and the flat buffers

    # Each copy is one or a few tensor ops whatever the number of params and runs (on a GPU a
    # launch each): packing is one torch.cat(..., out=buffer) of the sources in the buffer's order
    # (params or run slices of them, zero pieces for the padding and for missing gradients, the
    # flags), unpacking one op per param from views of param_flat made once here. Pure copies:
    # the buffers hold bit for bit what the per-run copy_ loops wrote.

    def _plan(self, owners, flags=False):
        """The pieces of the given ranks' chunks, in order: (k, param offset, count) a run of flat param k,
        (-1, 0, count) zeros (padding), (-2, 0, 0) the flags (after each chunk's data, with ``flags``)."""
        pos = {owner: [] for owner in owners}
        for k, gi in enumerate(self.flat):
            for po, owner, co, n in self.runs[gi]:
                if owner in pos:
                    pos[owner].append((co, k, po, n))
        plan = []
        for owner in owners:
            at = 0
            for co, k, po, n in sorted(pos[owner]):
                if co > at:
                    plan.append((-1, 0, co - at))
                plan.append((k, po, n))
                at = co + n
            if at < self.C:
                plan.append((-1, 0, self.C - at))
            if flags:
                plan.append((-2, 0, 0))
        return plan

    def _plan_copies(self):
        N, r, C = self.world, self.rank, self.C
        self.numel = [self._params(*gi).numel() for gi in self.flat]
        self.plan_all = self._plan(range(N))  # construction: every rank's chunk
        self.plan_own = self._plan([r])       # a step: this rank's chunk
        self.plan_grad = self._plan(range(N), flags=True)
        gap = max((n for plan in (self.plan_all, self.plan_grad) for k, _, n in plan if k == -1), default=0)
        self.zeros = torch.zeros(gap, dtype=self.param_flat.dtype, device=self.param_flat.device)
        # unpack: per flat param, its runs' slices of param_flat in the param's order
        self.unpack_src = []
        for gi in self.flat:
            views = [self.param_flat[owner * C + co:owner * C + co + n] for po, owner, co, n in sorted(self.runs[gi])]
            self.unpack_src.append(views[0] if len(views) == 1 else views)

    def _zero(self, n):
        if n > self.zeros.numel():  # a missing gradient longer than any padding: grown once
            self.zeros = torch.zeros(n, dtype=self.zeros.dtype, device=self.zeros.device)
        return self.zeros[:n]

    def _pieces(self, plan, srcs, flags=None):
        out = []
        for k, po, n in plan:
            if k >= 0:
                src = srcs[k]
                out.append(self._zero(n) if src is None else src if n == self.numel[k] else src[po:po + n])
            else:
                out.append(self._zero(n) if k == -1 else flags)
        return out

    def _params(self, g, i):
        return self.opt.param_groups[g]["params"][i]

    def _pack_params(self, all_ranks=False):
        r, C = self.rank, self.C
        srcs = [self._params(*gi).detach().view(-1) for gi in self.flat]
        if all_ranks:
            torch.cat(self._pieces(self.plan_all, srcs), out=self.param_flat)
        else:
            torch.cat(self._pieces(self.plan_own, srcs), out=self.param_flat[r * C:(r + 1) * C])

    def _unpack_params(self):
        for gi, src in zip(self.flat, self.unpack_src):
            dst = self._params(*gi).detach().view(-1)
            dst.copy_(src) if isinstance(src, torch.Tensor) else torch.cat(src, out=dst)

    def _pack_grads(self):
        """Local gradients and the presence flags into the flat buffer (None grad: zeros, flag 0);
        returns the flags."""
        srcs, present = [], []
        for gi in self.flat:
            p = self._params(*gi)
            grad = p.grad
            if grad is not None and (grad.is_sparse or grad.shape != p.shape):
                raise ValueError(f"{self._label(*gi)}: gradient of shape {tuple(grad.shape)}"
                                 f"{' (sparse)' if grad.is_sparse else ''} for a parameter of shape {tuple(p.shape)}")
            srcs.append(grad.detach().reshape(-1) if grad is not None else None)
            present.append(1.0 if grad is not None else 0.0)
        flags = self._flags(present, None)
        torch.cat(self._pieces(self.plan_grad, srcs, flags), out=self.grad_flat)
        return present

    def _flags(self, present, error):
        flags = torch.tensor((present or [0.0] * len(self.flat)) + [1.0 if error else 0.0], dtype=self.grad_flat.dtype)
        return flags.to(self.grad_flat.device)

    # -- stepping

    def sync(self, force=False):
        """Pushes changed hyperparameters (e.g. from an LR scheduler) into the local C++ optimizer."""
        for g, group in enumerate(self.opt.param_groups):
            opts = _cpp_options(group)
            if not force and opts == self.synced[g]:
                continue
            if opts.get("algorithm") != self.algorithms[g]:
                raise ValueError(f"param group {g}: the algorithm of a distributed group cannot change "
                                 f"('{self.algorithms[g]}' -> '{opts.get('algorithm')}')")
            if self.local_group_of[g] >= 0:
                self.local.set_group_options(self.local_group_of[g], opts)
            self.synced[g] = opts

    @torch.no_grad()
    def step(self):
        error, present = None, None
        try:
            self.sync()
            if self.flat:
                present = self._pack_grads()
        except Exception as e:  # noqa: BLE001  every rank learns of it through the error flag
            if not self.flat:
                raise
            error = e
        if self.flat:
            self._reduce(present, error)
            self._pack_params()  # the model is the source of truth (it may have been loaded or edited)
        gathered = self._dtensor_before()
        if self.local is not None:
            self.local.step()
        if self.flat:
            self._gather()
            self._unpack_params()
        self._dtensor_after(gathered)
        self.steps.add_(1 if self.skip is None else (self.skip != 0).to(torch.long))

    def _reduce(self, present, error):
        """Sums the gradients and presence flags into this rank's chunk; raises on every rank if one failed."""
        N, r, C, G = self.world, self.rank, self.C, self.G
        if error is not None:  # otherwise _pack_grads wrote them
            self.grad_flat.view(N, G)[:, C:].copy_(self._flags(present, error))  # every rank's chunk gets them
        own = self.grad_flat[r * G:(r + 1) * G]
        if self.native:
            scatter = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
            scatter(own, self.grad_flat, group=self.pg)
        else:  # all-reduce + slice, like the Gloo path of src/distributed/c10d_compat.cpp
            dist.all_reduce(self.grad_flat, group=self.pg)
        counts = own[C:].tolist()  # ranks that had each gradient; the last: ranks that failed (one host sync)
        if counts[-1] > 0:
            if error is not None:
                raise error
            raise RuntimeError(f"optimizer step: {int(counts[-1])} other rank(s) failed before the step (their error "
                               "says why); no rank changed anything")
        own[:C].div_(N)  # average: the gradient of the global batch
        for it in self.items:
            if it.flag >= 0:  # stepped when any rank had a gradient (missing ones count as zero)
                it.tensor.grad = it.grad_view if counts[it.flag] > 0 else None

    def _gather(self):
        N, r, C = self.world, self.rank, self.C
        own = self.param_flat[r * C:(r + 1) * C]
        if self.native:
            gather = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
            gather(self.param_flat, own, group=self.pg)
        else:
            dist.all_gather(list(self.param_flat.chunk(N)), own, group=self.pg)

    def _dtensor_before(self):
        """Local shards and their gradients into the C++ tensors; gathered params to their owner."""
        for it in self.items:
            if it.kind == "local":
                p = self._params(it.group, it.param)
                it.tensor.copy_(_dt.local(p))
                grad = _dt.local_grad(p)
                it.tensor.grad = None if grad is None else it.grad_view.copy_(grad)
        mine = {(it.group, it.param): it for it in self.items if it.kind == "full"}
        values = []
        for gi in self.dgather:  # same order on every rank: the collectives pair up
            p, it = self._params(*gi), mine.get(gi)
            if p.grad is None:  # must be the same on every rank (FSDP2: it is)
                if it is not None:
                    it.tensor.grad = None
                values.append(None)
                continue
            if it is not None:
                _dt.full_into(p.grad, it.grad_view)
                it.tensor.grad = it.grad_view
                values.append(_dt.full_into(p, it.tensor))
            else:  # take part in the all-gathers; the buffer then receives the owner's result
                buf = torch.empty(tuple(p.shape), dtype=p.dtype, device=_dt.local(p).device)
                _dt.full_into(p.grad, buf)
                values.append(_dt.full_into(p, buf))
        return values

    def _dtensor_after(self, values):
        for it in self.items:
            if it.kind == "local":
                _dt.local(self._params(it.group, it.param)).copy_(it.tensor)
        for gi, value in zip(self.dgather, values):
            if value is not None:
                _dt.scatter_back(self._params(*gi), value, self.owner[gi])

    def set_lr_scale(self, factor):
        self.lr_scale = float(factor)
        if self.local is not None:
            self.local.set_lr_scale(self.lr_scale)

    def set_skip_factor(self, factor):
        self.skip = factor
        self.steps = self.steps.to(factor.device)
        if self.local is not None:
            self.local.set_skip_factor(factor)

    @property
    def step_count(self):
        return int(self.steps)

    @property
    def state_bytes(self):
        """Optimizer state held by this rank."""
        return self.local.state_bytes if self.local is not None else 0

    # -- state dicts

    def _packed_groups(self):
        out, start = [], 0
        for group in self.opt.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            out.append(packed)
        return out

    def _item_state(self, it):
        return self.local.param_state(it.local_group, it.local_index)

    def state_dict(self):
        """This rank's shard in the C++ shard format (docs/distributed.md, "Checkpoints"):
        'orthopt_dist' is what the C++ optimizer writes into optim_shard_<rank>.json (format, world
        size, rank, segments, and per piece its segment, unit range and state names); 'state' maps
        piece j to its tensors (piece<j>_<name> of the .pt), 'orthopt_dist_scalars' holds the .pt's
        steps, lr_scale and skip_factor; 'param_groups' the hyperparameters (torch's format).
        A piece here is one owned matrix or one (scalar param, range): the local optimizer's
        parameters. DTensor and replicated params, outside the C++ layout, follow as 'params'."""
        state, pieces, extra = {}, [], []
        items = [it for it in self.items if it.piece is not None] + [it for it in self.items if it.piece is None]
        for j, it in enumerate(items):
            st = self._item_state(it)
            if st:
                state[j] = self._to_piece(it, st) if it.piece is not None else dict(st)
            if it.piece is not None:
                seg, begin, end = it.piece
                pieces.append({"segment": seg, "begin": begin, "end": end, "state": list(st)})
            else:
                extra.append({"group": it.group, "param": it.param, "kind": it.kind, "state": list(st)})
        meta = {"format": SHARD_FORMAT, "world_size": self.world, "rank": self.rank,
                "segments": self._segments_meta(), "pieces": pieces}
        if extra:
            meta["params"] = extra
        skip = torch.ones((), dtype=torch.float32) if self.skip is None else self.skip.detach().float().cpu()
        scalars = {"steps": self.steps.detach().cpu().clone(), "lr_scale": torch.tensor(self.lr_scale, dtype=torch.float64),
                   "skip_factor": skip.reshape(())}
        return {"state": state, "param_groups": self._packed_groups(), "orthopt_dist": meta,
                "orthopt_dist_scalars": scalars}

    def _segments_meta(self):
        return [{"group": seg["group"], "bank": seg["bank"], "rows": seg["rows"], "cols": seg["cols"],
                 "units": seg["units"]} for seg in self.segments]

    def _to_piece(self, it, st):
        """An item's state as the C++ shard holds a piece's: a bank piece's tensors have the matrices
        on dim 0 and the matrix dims last, a scalar piece's the elements."""
        out = {}
        for k, v in st.items():
            if v.dim() == 0 or it.kind == "flat":
                out[k] = v
            elif it.kind == "matrix":
                out[k] = v.unsqueeze(0)
            else:
                p, seg = self._params(it.group, it.param), self.segments[it.piece[0]]
                out[k] = v.reshape(1, seg["rows"], seg["cols"]) if v.shape == p.shape else v.reshape(1, *v.shape[-2:])
        return out

    def _from_piece(self, it, st):
        """Inverse of _to_piece: the local optimizer's state of ``it`` from a piece's tensors."""
        out = {}
        p = self._params(it.group, it.param)
        flat_matrix = bool(self.opt.param_groups[it.group].get("flatten")) and p.dim() >= 3
        for k, v in st.items():
            if v.dim() == 0 or it.kind == "flat":
                out[k] = v
                continue
            if v.shape[0] != 1:
                raise ValueError(f"{it.name}: state '{k}' of shape {tuple(v.shape)} in the shard is not one matrix's")
            if it.kind == "matrix":
                shape = v.shape[1:]
            elif k in _MATRIX_SHAPED_STATE:
                shape = (() if flat_matrix else tuple(p.shape[:-2])) + tuple(v.shape[1:])
            else:
                shape = tuple(p.shape)
            if math.prod(shape) != v.numel():
                raise ValueError(f"{it.name}: state '{k}' of shape {tuple(v.shape)} in the shard does not fit the "
                                 f"parameter's shape {tuple(p.shape)}")
            out[k] = v.reshape(shape)
        return out

    def full_state_dict(self):
        """Collective: the single-process state dict (CPU tensors) on every rank."""
        if self.dlocal or self.dgather or self.replica:
            raise RuntimeError("full_state_dict(): not available with DTensor parameters; save state_dict() on "
                               "every rank")
        mine = {}
        for it in self.items:
            st = self._item_state(it)
            if st:
                mine[it.key] = {k: v.detach().cpu() for k, v in st.items()}
        gathered = [None] * self.world
        dist.all_gather_object(gathered, mine, group=self.group)
        per_param = {}
        for d in gathered:
            for key, st in d.items():
                per_param.setdefault(key[:2], []).append((key[2], key[3], st))
        state, pid = {}, 0
        for g, group in enumerate(self.opt.param_groups):
            for i, p in enumerate(group["params"]):
                if (g, i) in per_param:
                    state[pid] = self._assemble(g, i, p, sorted(per_param[(g, i)], key=lambda e: e[1]))
                pid += 1
        return {"state": state, "param_groups": self._packed_groups()}

    def _assemble(self, g, i, p, entries):
        kind = entries[0][0]
        if kind == "whole":
            return dict(entries[0][2])
        out = {}
        if kind == "matrix":
            count = math.prod(p.shape[:-2])
            if [e[1] for e in entries] != list(range(count)):
                raise RuntimeError(f"full_state_dict(): {self._label(g, i)} has state for matrices "
                                   f"{[e[1] for e in entries]} of {count}")
            for k, v in entries[0][2].items():
                out[k] = v if v.dim() == 0 else torch.stack([e[2][k] for e in entries]).reshape(
                    *p.shape[:-2], *v.shape)
            return out
        for k, v in entries[0][2].items():
            out[k] = v if v.dim() == 0 else torch.cat([e[2][k] for e in entries])
            if v.dim() and out[k].numel() != p.numel():
                raise RuntimeError(f"full_state_dict(): {self._label(g, i)} state '{k}' covers {out[k].numel()} "
                                   f"of {p.numel()} elements")
            if v.dim():
                out[k] = out[k].reshape(p.shape)
        return out

    def _slice(self, it, st):
        """The part of a param's single-process state that belongs to piece ``it``."""
        if not st or it.kind == "whole":
            return dict(st or {})
        p = self._params(it.group, it.param)
        out = {}
        for k, v in st.items():
            if not isinstance(v, torch.Tensor) or v.dim() == 0:
                out[k] = v
            elif it.kind == "matrix" and tuple(v.shape[:p.dim() - 2]) == tuple(p.shape[:-2]):
                out[k] = v.reshape(-1, *v.shape[p.dim() - 2:])[it.offset]
            elif it.kind == "flat" and v.numel() == p.numel():
                out[k] = v.reshape(-1)[it.offset:it.offset + it.tensor.numel()]
            else:
                raise ValueError(f"{self._label(it.group, it.param)}: loaded state '{k}' of shape {tuple(v.shape)} "
                                 f"does not fit the parameter's shape {tuple(p.shape)}")
        return out

    def _shard_states(self, meta, saved_state):
        """Per item (self.items order), its state from a shard of SHARD_FORMAT (same rank and world size)."""
        flat = [it for it in self.items if it.piece is not None]
        other = [it for it in self.items if it.piece is None]
        pieces = [(p["segment"], p["begin"], p["end"]) for p in meta["pieces"]]
        params = [(p["group"], p["param"], p["kind"]) for p in meta.get("params", [])]
        if meta["segments"] != self._segments_meta() or pieces != [it.piece for it in flat] or \
                params != [(it.group, it.param, it.kind) for it in other]:
            raise ValueError("the shard's layout differs from this optimizer's (other parameters, groups or options)"
                             f"; shard segments: {meta['segments']}, this optimizer's: {self._segments_meta()}")
        by_item = {}
        for j, it in enumerate(flat + other):
            st = dict(saved_state.get(j, {}))
            by_item[id(it)] = self._from_piece(it, st) if it.piece is not None else st
        return [by_item[id(it)] for it in self.items]

    def load_state_dict(self, state_dict):
        """Loads this rank's shard from state_dict() (same rank and world size), or a full state dict
        (full_state_dict(), or a single-process optimizer's state_dict(): any world size)."""
        saved_groups = state_dict["param_groups"]
        groups = self.opt.param_groups
        _check_same_groups(saved_groups, groups)
        meta = state_dict.get("orthopt_dist")
        saved_state = state_dict["state"]
        steps = None
        if meta is not None:
            if meta.get("format") not in (SHARD_FORMAT, PYTHON_SHARD_FORMAT_V1):
                raise ValueError(f"unknown shard format {meta.get('format')!r} (expected {SHARD_FORMAT!r})")
            if (meta["rank"], meta["world_size"]) != (self.rank, self.world):
                raise ValueError(f"this is the shard of rank {meta['rank']} of {meta['world_size']}; this optimizer "
                                 f"is rank {self.rank} of {self.world}: load each shard on its own rank at the same "
                                 "world size, or re-shard through full_state_dict()")
            if meta["format"] == PYTHON_SHARD_FORMAT_V1:
                if [tuple(k) for k in meta["items"]] != [it.key for it in self.items]:
                    raise ValueError("the shard's layout differs from this optimizer's (other parameters, groups or "
                                     "options)")
                states = [dict(saved_state.get(n, {})) for n in range(len(self.items))]
                steps = int(meta["step_count"])
            else:
                states = self._shard_states(meta, saved_state)
                steps = int(state_dict["orthopt_dist_scalars"]["steps"])
        else:
            if self.dlocal or self.dgather or self.replica:
                raise ValueError("a full state dict cannot be loaded with DTensor parameters; load each rank's "
                                 "state_dict()")
            pids = [list(saved["params"]) for saved in saved_groups]
            states = [self._slice(it, saved_state.get(pids[it.group][it.param])) for it in self.items]
        per_local = [[] for _ in range(max((it.local_group for it in self.items), default=-1) + 1)]
        for it, st in zip(self.items, states):
            per_local[it.local_group].append(st)
        old = [{k: v for k, v in grp.items() if k != "params"} for grp in groups]
        try:
            for saved, group in zip(saved_groups, groups):
                group.update({k: v for k, v in saved.items() if k != "params"})
            self.sync(force=True)
            if self.local is not None:
                self.local.load_param_states(per_local)
        except Exception:
            for o, group in zip(old, groups):
                group.update(o)
            self.sync(force=True)
            raise
        if steps is not None:
            self.steps.fill_(steps)

"""DTensor (FSDP2, tensor parallel) parameters of the distributed optimizers; torch >= 2.4.

Decided per parameter at construction (docs/distributed.md, "Python"):

  local   every mesh dim is Replicate, or Shard(d) on a leading (expert) dim of a matrix param,
          or any placement in an adamw/lion group (element-wise): this rank's shard holds whole
          matrices, so the C++ step runs on the local tensor, with no communication.
  gather  anything else (e.g. a 2-D weight Shard(0) over its rows): full_tensor() of the param
          and its gradient, the owner rank (balanced by size) steps the full matrix and keeps its
          state, a broadcast from the owner brings the result back, each rank keeps its shard.

Gradients are used as they are: FSDP2 has already reduce-scattered (averaged) them.
Nothing else in orthopt touches DTensor; without torch.distributed.tensor this module is inert.
"""
import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor, Replicate
except ImportError:  # torch < 2.4: no public DTensor
    DTensor = Replicate = None


def available():
    return DTensor is not None


def is_dtensor(t):
    if DTensor is not None:
        return isinstance(t, DTensor)
    return type(t).__name__ == "DTensor"  # a private DTensor of torch < 2.4: refused by the caller


def is_local(p, matrix, flatten):
    """True when every rank's shard of ``p`` holds whole matrices (or ``p`` is element-wise)."""
    nd = p.dim()
    for pl in p.placements:
        if pl.is_replicate():
            continue
        if pl.is_shard() and (not matrix or (not (flatten and nd >= 3) and pl.dim % nd < nd - 2)):
            continue
        return False
    return True


def gather_problem(p):
    """Why ``p`` cannot take the gather path, or None."""
    if p.device_mesh.ndim != 1:
        return (f"is a DTensor on a {p.device_mesh.ndim}-D mesh with placements {tuple(p.placements)}: "
                "only 1-D meshes are supported when the shards split matrices")
    return None


def check_group(p):
    """The group of the ranks that hold ``p`` (for the start-up check), or None if there is none
    at hand (a multi-dim mesh on part of the world)."""
    mesh = p.device_mesh
    if mesh.ndim == 1:
        return mesh.get_group()
    return dist.group.WORLD if mesh.size() == dist.get_world_size() else None


def describe(p):
    return f"DTensor {tuple(p.shape)} {p.dtype} mesh {tuple(p.device_mesh.shape)} {tuple(p.placements)}"


def local(t):
    """The local shard; under no_grad to_local() is the DTensor's own tensor, so writes reach it."""
    with torch.no_grad():
        return t.to_local()


def local_grad(p):
    g = p.grad
    if g is None:
        return None
    if tuple(g.placements) != tuple(p.placements):
        g = g.redistribute(p.device_mesh, p.placements)
    return g.to_local()


def full_into(t, out):
    """out <- the whole of DTensor ``t`` (an all-gather over its mesh); a plain tensor, whatever
    full_tensor() returns (an async collective result in some versions)."""
    return out.copy_(t.full_tensor())


def mesh_size(p):
    return p.device_mesh.size()


def mesh_rank(p):
    return dist.get_rank(p.device_mesh.get_group())


def scatter_back(p, value, owner):
    """Broadcasts the owner's full ``value`` over p's (1-D) mesh and writes this rank's shard."""
    mesh = p.device_mesh
    group = mesh.get_group()
    src = owner if group is dist.group.WORLD else dist.get_global_rank(group, owner)
    dist.broadcast(value, src=src, group=group)
    # Replicate -> p's placements is a local slice (no communication).
    shard = DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)
    local(p).copy_(shard.redistribute(mesh, p.placements).to_local())

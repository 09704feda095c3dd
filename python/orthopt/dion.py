"""The dion package's optimizers with their class names and arguments, on orthopt's engine.

Changing ``from dion import Muon`` to ``from orthopt.dion import Muon`` is enough: the classes
take dion's argument names and defaults (``mu``, ``epsilon``, ``adjust_lr``, ``cautious_wd``,
``muon_beta2``, ``ef_decay``, ``distributed_mesh``, ...), their param groups may carry
``algorithm='adamw'`` or ``'lion'`` as in dion, and ``load_state_dict`` takes dion's checkpoints
of the same parameters. Each is the orthopt class of the same algorithm (``isinstance(opt,
orthopt.Muon)``), so its param groups hold orthopt's option names (``momentum``, ``eps``, ...).

Arguments that choose dion's implementation rather than the math (``use_triton``,
``triton_post_ortho``, ``verbose``) are accepted and have no effect; ``newton_schulz_func`` and
dion's sharded-mesh options (``outer_shard_mesh``, ``inner_shard_mesh``) are refused with a
ValueError. ``distributed_mesh`` (``replicate_mesh`` for Dion) may be None, a ProcessGroup or a
1-D DeviceMesh: its group becomes ``process_group`` (data parallel, whole-matrix ownership).
"""
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch

from . import optim as _o

__all__ = ["Muon", "NorMuon", "Dion", "Dion2", "NorDion2", "Dion3", "DionMixedPrecisionConfig"]


@dataclass
class DionMixedPrecisionConfig:
    """dion's state dtypes for Dion (None: the parameter's dtype). orthopt keeps momenta in the
    parameter's dtype and Q in fp32, so Dion accepts None for each and float32 for Q_dtype, and
    refuses other dtypes with a ValueError."""

    momentum_dtype: Optional[torch.dtype] = None
    Q_dtype: Optional[torch.dtype] = None
    variance_dtype: Optional[torch.dtype] = None


def _process_group(mesh, argument):
    """A dion mesh argument as a process group: None, a ProcessGroup, or a 1-D DeviceMesh."""
    if mesh is None:
        return None
    if hasattr(mesh, "get_group") and hasattr(mesh, "ndim"):  # DeviceMesh
        if mesh.ndim != 1:
            raise ValueError(f"argument '{argument}': a {mesh.ndim}-D DeviceMesh; orthopt takes a 1-D mesh "
                             "(or a ProcessGroup) over the data-parallel ranks")
        return mesh.get_group()
    import torch.distributed as dist
    if isinstance(mesh, dist.ProcessGroup):
        return mesh
    raise TypeError(f"argument '{argument}': expected None, a ProcessGroup or a 1-D DeviceMesh, got "
                    f"{type(mesh).__name__}")


def _lr_adjust(adjust_lr):
    if adjust_lr not in ("spectral_norm", "rms_norm", None):
        raise ValueError(f"Invalid adjust_lr value: {adjust_lr}. Must be 'spectral_norm', 'rms_norm', or None.")
    return adjust_lr or "none"


def _check(lr, betas, **nonnegative):
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    for name, v in nonnegative.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0.0:
            raise ValueError(f"Invalid {name}: {v}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"Invalid betas: {betas}")


def _ortho_options(use_gram_newton_schulz, use_polar_express, newton_schulz_func):
    if newton_schulz_func is not None:
        raise ValueError("argument 'newton_schulz_func': orthopt orthogonalizes in C++ and takes no Python function; "
                         "choose the iteration with use_polar_express / use_gram_newton_schulz")
    # dion's choices: polar_express coefficients or the fixed quintic (3.4445, -4.775, 2.0315);
    # standard or Gram Newton-Schulz.
    return dict(schedule="polar_express" if use_polar_express else [(3.4445, -4.775, 2.0315)],
                method="gram" if use_gram_newton_schulz else "standard")


def _scalar_groups(betas, epsilon):
    """dion's betas and epsilon reach its AdamW/Lion groups."""
    return dict(betas=tuple(betas), eps=epsilon)


def _selection_scope(selection_scope):
    if selection_scope not in ("local", "global"):
        raise ValueError(f"selection_scope must be 'local' or 'global', got {selection_scope!r}")


class Muon(_o.Muon):
    """dion's Muon (``dion.Muon``) on orthopt's engine: ``M <- mu*M + G``; ``U = orthogonalize(M)``
    (Nesterov: ``G + mu*M``); ``W <- W*(1 - lr*weight_decay) - lr*adjust*U``.

    Args:
        params: parameters or param groups (groups may set ``algorithm='adamw'`` / ``'lion'``).
        distributed_mesh (ProcessGroup or 1-D DeviceMesh, optional): data parallel over its ranks.
        lr (float): learning rate (default: 0.01).
        mu (float): momentum factor (default: 0.95).
        betas (Tuple[float, float]): betas of the AdamW/Lion groups (default: (0.9, 0.95)).
        weight_decay (float): decoupled weight decay (default: 0.01).
        cautious_wd (bool): decay only where the update pushes W towards zero (default: False).
        epsilon (float): eps of the AdamW groups (default: 1e-8).
        nesterov (bool): Nesterov momentum (default: False).
        adjust_lr (str or None): 'spectral_norm' sqrt(fan_out/fan_in), 'rms_norm' 0.2*sqrt(max(fan_out,
            fan_in)), or None (default: 'spectral_norm').
        flatten (bool): a >=3-D weight is one [size(0), prod(rest)] matrix (default: False).
        use_gram_newton_schulz (bool): Gram Newton-Schulz instead of the standard iteration (default: False).
        use_triton (bool): accepted, no effect (orthopt runs its own kernels).
        use_polar_express (bool): Polar Express coefficients, else the fixed quintic (default: True).
        newton_schulz_func: must be None (refused otherwise).
    """

    def __init__(self, params: _o.ParamsT, distributed_mesh: Optional[Any] = None, lr: float = 0.01,
                 mu: float = 0.95, betas: Tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.01,
                 cautious_wd: bool = False, epsilon: float = 1e-8, nesterov: bool = False,
                 adjust_lr: Optional[str] = "spectral_norm", flatten: bool = False,
                 use_gram_newton_schulz: bool = False, use_triton: bool = False, use_polar_express: bool = True,
                 newton_schulz_func: Optional[Callable] = None):
        _check(lr, betas, **{"momentum factor (mu)": mu})
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=mu, nesterov=nesterov,
                         lr_adjust=_lr_adjust(adjust_lr), cautious_weight_decay=cautious_wd, flatten=flatten,
                         process_group=_process_group(distributed_mesh, "distributed_mesh"),
                         **_ortho_options(use_gram_newton_schulz, use_polar_express, newton_schulz_func),
                         **_scalar_groups(betas, epsilon))


class NorMuon(_o.NorMuon):
    """dion's NorMuon (``dion.NorMuon``) on orthopt's engine: Muon, then per row
    ``V <- muon_beta2*V + (1-muon_beta2)*mean(U^2)``, ``U' = U/(sqrt(V) + epsilon)`` rescaled to |U|.

    Args: as orthopt.dion.Muon, plus
        muon_beta2 (float): beta2 of the per-row second moment (default: 0.95).
        epsilon (float): eps of the normalization and of the AdamW groups (default: 1e-8).
    """

    def __init__(self, params: _o.ParamsT, distributed_mesh: Optional[Any] = None, lr: float = 0.01,
                 mu: float = 0.95, muon_beta2: float = 0.95, betas: Tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.01, cautious_wd: bool = False, epsilon: float = 1e-8,
                 nesterov: bool = False, adjust_lr: Optional[str] = "spectral_norm", flatten: bool = False,
                 use_gram_newton_schulz: bool = False, use_triton: bool = False, use_polar_express: bool = True,
                 newton_schulz_func: Optional[Callable] = None):
        _check(lr, betas, **{"momentum factor (mu)": mu, "muon_beta2": muon_beta2})
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=mu, nesterov=nesterov,
                         lr_adjust=_lr_adjust(adjust_lr), cautious_weight_decay=cautious_wd, flatten=flatten,
                         normuon_beta2=muon_beta2, normuon_eps=epsilon,
                         process_group=_process_group(distributed_mesh, "distributed_mesh"),
                         **_ortho_options(use_gram_newton_schulz, use_polar_express, newton_schulz_func),
                         **_scalar_groups(betas, epsilon))


class Dion2(_o.Dion2):
    """dion's Dion2 (``dion.Dion2``) on orthopt's engine: ``M <- M + G``; the ``ceil(fraction*n)``
    rows (or columns, for tall matrices) of largest L1 norm are orthogonalized and decayed by
    ``ef_decay`` in M; ``W <- W*(1 - lr*weight_decay)``, the selected slices step by ``-lr*adjust*U``.

    Args:
        params, distributed_mesh, lr, betas, weight_decay, epsilon, adjust_lr, flatten,
        use_gram_newton_schulz, use_triton, use_polar_express, newton_schulz_func: as orthopt.dion.Muon.
        fraction (float): fraction in (0, 1] of the shorter side selected per step (default: 0.25).
        ef_decay (float): error-feedback factor on the selected slices of M (default: 0.95).
        verbose, triton_post_ortho (bool): accepted, no effect.
        selection_scope (str): 'local' or 'global'; orthopt selects on whole matrices, which is
            'global' (and what 'local' is off dion's row-sharded path) (default: 'local').
    """

    def __init__(self, params: _o.ParamsT, distributed_mesh: Optional[Any] = None, lr: float = 0.01,
                 fraction: float = 0.25, ef_decay: float = 0.95, betas: Tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.01, epsilon: float = 1e-8, adjust_lr: Optional[str] = "spectral_norm",
                 flatten: bool = False, use_triton: bool = False, use_polar_express: bool = True,
                 use_gram_newton_schulz: bool = False, newton_schulz_func: Optional[Callable] = None,
                 verbose: bool = False, triton_post_ortho: bool = False, selection_scope: str = "local"):
        _check(lr, betas, ef_decay=ef_decay)
        if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        _selection_scope(selection_scope)
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=ef_decay, fraction=float(fraction),
                         lr_adjust=_lr_adjust(adjust_lr), flatten=flatten,
                         process_group=_process_group(distributed_mesh, "distributed_mesh"),
                         **_ortho_options(use_gram_newton_schulz, use_polar_express, newton_schulz_func),
                         **_scalar_groups(betas, epsilon))


class NorDion2(_o.Dion3):
    """dion's NorDion2 / Dion3 (``dion.NorDion2``) on orthopt's engine (orthopt's Dion3): Dion2's
    row selection (always rows) with error feedback ``mu``, then NorMuon's normalization of the
    selected rows.

    Args: as orthopt.dion.Dion2 (``mu`` instead of ``ef_decay``), plus
        muon_beta2 (float): beta2 of the per-row second moment (default: 0.95).
        epsilon (float): eps of the normalization and of the AdamW groups (default: 1e-8).
    """

    def __init__(self, params: _o.ParamsT, distributed_mesh: Optional[Any] = None, lr: float = 0.01,
                 fraction: float = 0.25, mu: float = 0.95, muon_beta2: float = 0.95,
                 betas: Tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.01, epsilon: float = 1e-8,
                 adjust_lr: Optional[str] = "spectral_norm", flatten: bool = False, use_triton: bool = False,
                 use_polar_express: bool = True, use_gram_newton_schulz: bool = False,
                 newton_schulz_func: Optional[Callable] = None, triton_post_ortho: bool = False,
                 selection_scope: str = "local"):
        _check(lr, betas, **{"momentum factor (mu)": mu, "muon_beta2": muon_beta2})
        if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        _selection_scope(selection_scope)
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=mu, fraction=float(fraction),
                         normuon_beta2=muon_beta2, normuon_eps=epsilon, lr_adjust=_lr_adjust(adjust_lr),
                         flatten=flatten, process_group=_process_group(distributed_mesh, "distributed_mesh"),
                         **_ortho_options(use_gram_newton_schulz, use_polar_express, newton_schulz_func),
                         **_scalar_groups(betas, epsilon))


Dion3 = NorDion2  # dion's alias: the same class


class Dion(_o.Dion):
    """dion's Dion (``dion.Dion``) on orthopt's engine: ``M <- M + G``; ``P = orth(M*Q)``;
    ``R = M^T*P``; ``M <- M - (1-mu)*P*R^T``; ``Q <- R`` column-normalized (+epsilon);
    ``W <- W*(1 - lr*weight_decay) - lr*sqrt(fan_out/fan_in)*P*Q^T``.

    Args:
        params: parameters or param groups (groups may set ``algorithm='adamw'`` / ``'lion'``).
        replicate_mesh (ProcessGroup or 1-D DeviceMesh, optional): data parallel over its ranks.
        outer_shard_mesh, inner_shard_mesh: must be None (dion's sharded Dion is not implemented).
        replicate_mesh_grad_sync (bool): accepted; orthopt always averages the gradients over the group.
        rank_fraction (float): rank r = ceil(rank_fraction*min(m, n)) (default: 1.0).
        rank_multiple_of (int): must be 1 (default: 1).
        lr (float): learning rate (default: 0.01).  mu (float): error-feedback factor (default: 0.95).
        betas (Tuple[float, float]): betas of the AdamW/Lion groups (default: (0.9, 0.95)).
        weight_decay (float): decoupled weight decay (default: 0.01).
        epsilon (float): eps of Q's column normalization and of the AdamW groups (default: 1e-8).
        power_iters (int): must be 1.  qr_method (str): 'rcqr' accepted; orthopt orthonormalizes P by
            Householder QR (dion_qr). cqr_warmup_steps, rcqr_oversample: accepted, no effect.
        mixed_precision_config (DionMixedPrecisionConfig, optional): None, or state dtypes orthopt keeps
            (momentum and variance: None; Q: None or torch.float32).
    """

    def __init__(self, params: _o.ParamsT, replicate_mesh: Optional[Any] = None, outer_shard_mesh: Optional[Any] = None,
                 inner_shard_mesh: Optional[Any] = None, replicate_mesh_grad_sync: bool = True,
                 rank_fraction: float = 1.0, rank_multiple_of: int = 1, lr: float = 0.01, mu: float = 0.95,
                 betas: Tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.01, epsilon: float = 1e-8,
                 power_iters: int = 1, qr_method: str = "rcqr", cqr_warmup_steps: int = 150,
                 rcqr_oversample: float = 1.25, mixed_precision_config: Optional[Any] = None):
        _check(lr, betas, **{"momentum factor (mu)": mu, "weight_decay value": weight_decay})
        if not (isinstance(rank_fraction, (int, float)) and 0 < rank_fraction <= 1):
            raise ValueError(f"Invalid rank fraction: {rank_fraction}")
        if rank_multiple_of != 1:
            raise ValueError(f"argument 'rank_multiple_of': orthopt's rank is ceil(rank_fraction*min(m, n)); only 1 is "
                             f"supported, got {rank_multiple_of}")
        if power_iters != 1:
            raise ValueError("argument 'power_iters': only 1 is supported")
        if qr_method != "rcqr":
            raise ValueError("argument 'qr_method': only 'rcqr' is accepted (as dion's Dion)")
        for name, mesh in (("outer_shard_mesh", outer_shard_mesh), ("inner_shard_mesh", inner_shard_mesh)):
            if mesh is not None:
                raise ValueError(f"argument '{name}': sharded Dion is not supported; pass None (data parallel over "
                                 "replicate_mesh only)")
        if mixed_precision_config is not None:
            for field, allowed in (("momentum_dtype", (None,)), ("Q_dtype", (None, torch.float32)),
                                   ("variance_dtype", (None,))):
                value = getattr(mixed_precision_config, field, None)
                if value not in allowed:
                    raise ValueError(f"argument 'mixed_precision_config': {field}={value} is not supported (orthopt "
                                     "keeps momenta in the parameter's dtype and Q in fp32); allowed: "
                                     f"{', '.join(str(a) for a in allowed)}")
        super().__init__(params, lr=lr, weight_decay=weight_decay, momentum=mu, rank_fraction=float(rank_fraction),
                         eps=epsilon, process_group=_process_group(replicate_mesh, "replicate_mesh"),
                         betas=tuple(betas))

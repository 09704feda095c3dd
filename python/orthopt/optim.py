"""torch.optim front ends over the C++ optimizers (orthopt._C.Optimizer).

Each class is a ``torch.optim.Optimizer``: ``param_groups`` hold the hyperparameters (LR
schedulers edit them as usual; they are synced into C++ before every step), ``state`` holds
the live C++ state tensors (so ``state_dict()`` is torch's own), and ``step()`` runs the C++
step. A group may carry an ``algorithm`` key (muon | normuon | dion3 | dion | adamw | lion),
so one optimizer can mix matrix and scalar groups like the dion package.

``process_group=pg`` (a torch.distributed group of any backend) makes the optimizer data
parallel with whole-matrix ownership (orthopt.dist, docs/distributed.md); DTensor parameters
(FSDP2) are handled too (orthopt.dtensor). None (the default) is the single-process optimizer.
"""
from collections import defaultdict

import torch

from . import _C
from . import dtensor as _dt

__all__ = ["Muon", "NorMuon", "Dion3", "Dion", "AdamW", "Lion", "param_groups"]

# Every option with its default (algorithms.md; dion's defaults for matrix optimizers).
# Groups of any algorithm get every key, so a Muon optimizer can hold an adamw group.
_BASE_DEFAULTS = dict(
    algorithm="muon",
    lr=0.01,
    weight_decay=0.01,
    cautious_weight_decay=False,
    momentum=0.95,
    momentum_style="accumulate",
    nesterov=False,
    lr_adjust="spectral_norm",
    schedule="polar_express",
    ns_steps=5,
    method="auto",
    compute_dtype=None,
    split_sizes=None,
    flatten=False,
    normuon_beta2=0.95,
    normuon_eps=1e-8,
    fraction=0.25,
    scale_lr_by_fraction=False,
    rank_fraction=0.25,
    dion_qr="householder",
    betas=(0.9, 0.95),
    eps=1e-8,
    master_weights=False,
)
_OPTION_KEYS = frozenset(_C.optimizer_option_keys())
# Keys torch itself or its LR schedulers put into groups.
_PASSTHROUGH_KEYS = frozenset({"params", "param_names", "initial_lr", "name"})


def _check_same_groups(saved_groups, groups):
    """A loaded state dict must have this optimizer's groups: count, params per group, algorithm."""
    if len(saved_groups) != len(groups):
        raise ValueError(f"loaded state dict has {len(saved_groups)} param groups, "
                         f"this optimizer has {len(groups)}")
    for g, (saved, group) in enumerate(zip(saved_groups, groups)):
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(f"param group {g}: loaded state dict has {len(saved['params'])} params, "
                             f"this group has {len(group['params'])}")
        if saved.get("algorithm") != group.get("algorithm"):
            raise ValueError(f"param group {g}: loaded state dict is for algorithm "
                             f"'{saved.get('algorithm')}', this group uses '{group.get('algorithm')}'")


def _cpp_options(group):
    """The group's options as plain values for C++ (a tensor lr becomes a float)."""
    out = {}
    for k in _OPTION_KEYS:
        if k not in group or group[k] is None:
            continue
        v = group[k]
        if isinstance(v, torch.Tensor):
            v = float(v)
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


class _OrthoptOptimizer(torch.optim.Optimizer):
    """Shared machinery; subclasses only set their defaults."""

    _defaults = {}

    def __init__(self, params, process_group=None, **kwargs):
        unknown = sorted(set(kwargs) - _OPTION_KEYS)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown option(s) {unknown}; known: {sorted(_OPTION_KEYS)}")
        defaults = dict(_BASE_DEFAULTS)
        defaults.update(self._defaults)
        defaults.update(kwargs)
        self._cpp = None
        self._dist = None          # orthopt.dist.DistributedEngine in distributed mode
        self._step_offset = 0      # steps taken by C++ optimizers replaced in add_param_group
        self._skip_set = False
        super().__init__(params, defaults)
        self._synced = [None] * len(self.param_groups)
        self.process_group = process_group
        if process_group is not None or any(_dt.is_dtensor(p) for g in self.param_groups for p in g["params"]):
            from .dist import DistributedEngine
            self._dist = DistributedEngine(self, process_group)
        else:
            self._cpp = self._build()

    # -- construction

    def add_param_group(self, param_group):
        given = param_group if isinstance(param_group, dict) else {"params": param_group}
        unknown = sorted(set(given) - _OPTION_KEYS - _PASSTHROUGH_KEYS)
        if unknown:
            raise ValueError(f"param group {len(self.param_groups)}: unknown option(s) {unknown}")
        if self._dist is not None:
            raise RuntimeError("add_param_group: not supported by a distributed optimizer (its layout is fixed at "
                               "construction); build it with every group")
        super().add_param_group(param_group)
        if self._cpp is not None:  # a group added later: rebuild, keeping the state
            old = self._cpp
            states = [[old.param_state(g, i) for i in range(len(grp["params"]))]
                      for g, grp in enumerate(self.param_groups[:-1])]
            self._synced.append(None)
            self._cpp = self._build()
            self._cpp.load_param_states(states + [[{} for _ in self.param_groups[-1]["params"]]])
            self._step_offset += old.step_count
            self._cpp.set_lr_scale(float(old.lr_scale))
            if self._skip_set:
                self._cpp.set_skip_factor(old.skip_factor)
            self.state = defaultdict(dict)  # alias the new optimizer's live tensors
            self._alias_state()

    def _build(self):
        groups = []
        for group in self.param_groups:
            d = _cpp_options(group)
            d["params"] = list(group["params"])
            if "param_names" in group:
                d["param_names"] = list(group["param_names"])
            groups.append(d)
        cpp = _C.Optimizer(groups)
        self._synced = [_cpp_options(g) for g in self.param_groups]
        return cpp

    # -- stepping

    def _sync(self, force=False):
        """Pushes changed hyperparameters (e.g. from an LR scheduler) into C++."""
        if self._dist is not None:
            return self._dist.sync(force)
        for g, group in enumerate(self.param_groups):
            opts = _cpp_options(group)
            if force or opts != self._synced[g]:
                self._cpp.set_group_options(g, opts)
                self._synced[g] = opts

    def _alias_state(self):
        """Makes self.state[p] the live C++ state tensors (created lazily by C++; replaced when
        C++ moves them, e.g. Dion3's first GPU step puts a bank's momenta into one buffer)."""
        version = self._cpp.state_version
        if version != getattr(self, "_state_version", version):
            self.state = defaultdict(dict)
        self._state_version = version
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if not self.state.get(p):
                    st = self._cpp.param_state(g, i)
                    if st:
                        self.state[p] = st

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._dist is not None:
            self._dist.step()  # syncs hyperparameters itself
            return loss
        self._sync()
        self._cpp.step()
        self._alias_state()
        return loss

    # -- device-side hyperparameters (CUDA-graph friendly), see include/orthopt/optim.h

    def set_lr_scale(self, factor):
        (self._dist or self._cpp).set_lr_scale(float(factor))

    def set_skip_factor(self, factor):
        """Distributed: must be the same on every rank (e.g. from all-reduced loss / grad norm)."""
        (self._dist or self._cpp).set_skip_factor(torch.as_tensor(factor, dtype=torch.float32))
        self._skip_set = True

    @property
    def step_count(self):
        if self._dist is not None:
            return self._dist.step_count
        return self._step_offset + self._cpp.step_count

    @property
    def state_bytes(self):
        """Bytes of optimizer state held by this process (distributed: this rank's share)."""
        return (self._dist or self._cpp).state_bytes

    # -- state dict

    def state_dict(self):
        """Single process: torch's format. Distributed: this rank's shard (its pieces' state, the
        hyperparameters, the layout); load it on the same rank at the same world size."""
        if self._dist is not None:
            return self._dist.state_dict()
        return super().state_dict()

    def full_state_dict(self):
        """The single-process state dict. Distributed: a collective (call it on every rank) that
        gathers the shards into it, CPU tensors on every rank; any world size, and a
        single-process optimizer, can load it."""
        if self._dist is not None:
            return self._dist.full_state_dict()
        return self.state_dict()

    def load_state_dict(self, state_dict):
        if self._dist is not None:
            return self._dist.load_state_dict(state_dict)
        saved_groups = state_dict["param_groups"]
        _check_same_groups(saved_groups, self.param_groups)
        saved_state = state_dict["state"]
        states = [[dict(saved_state.get(pid, {})) for pid in saved["params"]] for saved in saved_groups]
        old_groups = [{k: v for k, v in grp.items() if k != "params"} for grp in self.param_groups]
        try:
            for saved, group in zip(saved_groups, self.param_groups):
                group.update({k: v for k, v in saved.items() if k != "params"})
            self._sync(force=True)                # validates the loaded hyperparameters
            self._cpp.load_param_states(states)   # validates names and shapes; all or nothing
        except Exception:
            for old, group in zip(old_groups, self.param_groups):
                group.update(old)
            self._sync(force=True)
            raise
        self.state = defaultdict(dict)
        self._alias_state()


class Muon(_OrthoptOptimizer):
    """Muon (algorithms.md §3). For torch.optim.Muon semantics use ``Muon.torch_like``."""

    _defaults = dict(algorithm="muon")

    @classmethod
    def torch_like(cls, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                   ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None, **kwargs):
        """Configured like torch.optim.Muon (same argument names and defaults): ema momentum,
        Nesterov, one NS triple with eps 1e-7, lr rule 'original' (= jordan) unless given."""
        return cls(params, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                   momentum_style="ema", schedule=[tuple(ns_coefficients)], ns_steps=ns_steps, ns_safety=1.0,
                   ns_eps=eps, lr_adjust=adjust_lr_fn or "original", method="standard", **kwargs)


class NorMuon(_OrthoptOptimizer):
    """NorMuon (algorithms.md §4): Muon with neuron-wise (row) normalization."""

    _defaults = dict(algorithm="normuon")


class Dion3(_OrthoptOptimizer):
    """Dion3 (algorithms.md §5): row selection with error feedback + NorMuon normalization."""

    _defaults = dict(algorithm="dion3")


class Dion(_OrthoptOptimizer):
    """Dion (algorithms.md §6): low-rank orthonormalized updates with error feedback.

    ``dion_qr="cholesky"`` orthonormalizes P by Cholesky QR2 in fp64 (Householder where a
    factorization fails) instead of the default fp32 Householder QR: the same updates to fp32
    precision, faster on a GPU (H200, CUDA graph: Llama 1.26B set 1.18×, GPT-2 set 2.0×;
    the Householder QR there is orthopt's blocked QR with its own panel kernel, not cuSOLVER's;
    docs/optimizers.md). ``CudaGraphOptimizer``
    captures both; with ``cholesky`` one host synchronization per step (after the replay)
    reads whether a factorization failed.

    Dion's four rectangular products (M·Q, Mᵀ·P, the error feedback, P·Qᵀ) are fp32 cuBLAS
    products and follow torch's switch: with ``torch.backends.cuda.matmul.allow_tf32 = True``
    (or ``torch.set_float32_matmul_precision("high")``) they take TF32 inputs on the tensor
    cores (H200, Cholesky, CUDA graph: Llama 1.26B set 2.1×, GPT-2 set 1.4× faster steps;
    docs/optimizers.md); the QR stays fp32/fp64.
    """

    _defaults = dict(algorithm="dion")


class AdamW(_OrthoptOptimizer):
    """AdamW with bias correction and decoupled weight decay (optionally cautious)."""

    _defaults = dict(algorithm="adamw", lr=1e-3)


class Lion(_OrthoptOptimizer):
    """Lion: sign of the interpolated momentum, decoupled weight decay."""

    _defaults = dict(algorithm="lion", lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)


def param_groups(model, algorithm="muon", matrix=None, scalar=None, overrides=(),
                 embedding_patterns=("embed", "wte", "tok_emb"), head_patterns=("lm_head", "head", "output")):
    """Routes ``model.named_parameters()`` into groups (algorithms.md §7).

    Matrices (2-D, and 3-D expert stacks) go to ``algorithm`` with the ``matrix`` options;
    >=4-D weights to the same with ``flatten``; 0-D/1-D params to the ``scalar`` options
    (default adamw, lr 3e-3, wd 0.01); embeddings and the output head to ``scalar`` with weight
    decay 0. ``overrides`` is a sequence of (regex, options) pairs, first match wins.
    Frozen parameters are left out. Returns a list of group dicts for any orthopt optimizer.
    """
    named = [(n, p) for n, p in model.named_parameters()]
    slots = _C.route_slots([n for n, _ in named], [p for _, p in named], list(embedding_patterns),
                           list(head_patterns), [pattern for pattern, _ in overrides])
    matrix_opts = dict(matrix or {}, algorithm=algorithm)
    scalar_opts = dict({"algorithm": "adamw", "lr": 3e-3, "weight_decay": 0.01}, **(scalar or {}))
    templates = [matrix_opts, dict(matrix_opts, flatten=True), scalar_opts, dict(scalar_opts, weight_decay=0.0)]
    templates += [dict(opts) for _, opts in overrides]
    groups = [dict(t, params=[], param_names=[]) for t in templates]
    for (name, p), slot in zip(named, slots):
        if slot >= 0:
            groups[slot]["params"].append(p)
            groups[slot]["param_names"].append(name)
    return [g for g in groups if g["params"]]

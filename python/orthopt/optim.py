"""torch.optim front ends over the C++ optimizers (orthopt._C.Optimizer).

Each class is a ``torch.optim.Optimizer``: ``param_groups`` hold the hyperparameters (LR
schedulers edit them as usual; they are synced into C++ before every step), ``state`` holds
the live C++ state tensors (so ``state_dict()`` is torch's own), and ``step()`` runs the C++
step. A group may carry an ``algorithm`` key (muon | normuon | dion3 | dion2 | dion | adamw |
lion), so one optimizer can mix matrix and scalar groups like the dion package.

``process_group=pg`` (a torch.distributed group of any backend) makes the optimizer data
parallel with whole-matrix ownership (orthopt.dist, docs/distributed.md); DTensor parameters
(FSDP2) are handled too (orthopt.dtensor). None (the default) is the single-process optimizer.

Defaults come from the C++ ``orthopt::GroupOptions`` (``_C.optimizer_option_defaults()``); a
class changes only those its algorithm is known by (AdamW's and Lion's lr, Lion's betas).
"""
import functools
import json
import types
from collections import defaultdict
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

import torch

from . import _C
from . import dtensor as _dt

__all__ = ["Muon", "NorMuon", "Dion3", "Dion2", "Dion", "AdamW", "Lion", "param_groups", "ExecutionPlan"]

ParamsT = Union[Iterable[torch.Tensor], Iterable[Dict[str, Any]]]
ScheduleT = Union[str, Sequence[Tuple[float, float, float]]]
ExecutionT = Optional[Union[str, Dict[str, str]]]

# The C++ defaults of every option (orthopt::GroupOptions): the one source.
_D = dict(_C.optimizer_option_defaults())
_D["gram_restarts"] = tuple(_D["gram_restarts"])
# The one option of the front ends alone (C++ takes every [..., m, n] as a stack of matrices):
# declares that a matrix group's >=4-D weights are stacks of matrices rather than, say, conv
# weights, which need flatten=True; without either such a weight is refused.
_D["batched"] = False
_OPTION_KEYS = frozenset(_C.optimizer_option_keys())
_KNOWN_KEYS = _OPTION_KEYS | {"batched"}
# Keys torch itself or its LR schedulers put into groups.
_PASSTHROUGH_KEYS = frozenset({"params", "param_names", "initial_lr", "name", "max_lr", "min_lr",
                               "max_momentum", "base_momentum", "differentiable"})

# The options each algorithm reads; a group carries those of its algorithm. A Muon-family group has
# 'momentum' and no 'betas', so torch's schedulers (OneCycleLR, CyclicLR) cycle its momentum.
_COMMON = ("lr", "weight_decay", "cautious_weight_decay", "master_weights", "execution")
_ORTHO = ("momentum", "momentum_style", "nesterov", "lr_adjust", "schedule", "ns_steps", "method", "compute_dtype",
          "split_sizes", "flatten", "batched", "gram_restarts", "gram_aspect_threshold", "ns_safety", "ns_eps")
_ALGORITHM_KEYS = {
    "muon": _COMMON + _ORTHO,
    "normuon": _COMMON + _ORTHO + ("normuon_beta2", "normuon_eps"),
    "dion3": _COMMON + _ORTHO + ("normuon_beta2", "normuon_eps", "fraction", "scale_lr_by_fraction"),
    "dion2": _COMMON + _ORTHO + ("fraction", "scale_lr_by_fraction"),
    "dion": _COMMON + _ORTHO + ("rank_fraction", "dion_qr", "eps"),
    "adamw": _COMMON + ("betas", "eps"),
    "lion": _COMMON + ("betas",),
}
_MATRIX_ALGORITHMS = frozenset({"muon", "normuon", "dion3", "dion2", "dion"})


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
    """The group's options as plain values for C++ (a tensor lr becomes a float; None is passed
    on, and C++ refuses it where the option needs a value)."""
    out = {}
    for k in _OPTION_KEYS:
        if k not in group:
            continue
        v = group[k]
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                raise ValueError(f"option '{k}': Tensor {k} must be 1-element, got shape {tuple(v.shape)}")
            v = v.item()
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


# ---------------------------------------------------------------- foreign checkpoints

# dion's algorithm names -> orthopt's.
_DION_ALGORITHMS = {"muon": "muon", "normuon": "normuon", "nordion2": "dion3", "dion3": "dion3", "dion2": "dion2",
                    "dion": "dion", "adamw": "adamw", "lion": "lion"}


def _source_of(saved):
    """The optimizer that wrote a saved param group: 'orthopt', 'torch_muon', 'torch_adam' or 'dion'."""
    if "ns_coefficients" in saved or "adjust_lr_fn" in saved:
        return "torch_muon"
    if "amsgrad" in saved:
        return "torch_adam"
    if "algorithm" in saved and any(k in saved for k in ("mu", "epsilon", "beta1", "ef_decay")):
        return "dion"
    if "algorithm" in saved:
        return "orthopt"
    return None


def _convert_group(g, saved, group):
    """(options, state renames) of a saved foreign param group for this optimizer's group `group`."""
    source = _source_of(saved)
    mine = group["algorithm"]

    def need(algorithm, what):
        if mine != algorithm:
            raise ValueError(f"param group {g}: the loaded state dict is {what}, which matches an orthopt "
                             f"'{algorithm}' group; this group uses '{mine}'")

    if source == "torch_muon":
        need("muon", "torch.optim.Muon's")
        if group.get("momentum_style") != "ema":
            raise ValueError(f"param group {g}: torch.optim.Muon's momentum_buffer is an EMA of the gradients; this "
                             f"group has momentum_style='{group.get('momentum_style')}' (build the optimizer with "
                             "orthopt.Muon.torch_like)")
        opts = {k: saved[k] for k in ("lr", "weight_decay", "momentum", "nesterov", "ns_steps") if k in saved}
        if "ns_coefficients" in saved:
            opts["schedule"] = [tuple(saved["ns_coefficients"])]
        if "eps" in saved:
            opts["ns_eps"] = saved["eps"]
        if "adjust_lr_fn" in saved:
            opts["lr_adjust"] = saved["adjust_lr_fn"] or "original"
        return opts, {"momentum_buffer": "momentum"}
    if source == "torch_adam":
        need("adamw", "torch.optim.AdamW's")
        for flag in ("amsgrad", "maximize"):
            if saved.get(flag):
                raise ValueError(f"param group {g}: the loaded torch optimizer has {flag}=True, which orthopt's "
                                 "AdamW does not implement")
        if saved.get("weight_decay") and saved.get("decoupled_weight_decay") is False:
            raise ValueError(f"param group {g}: the loaded state dict is torch.optim.Adam's with L2 weight decay; "
                             "orthopt's AdamW decays decoupled (torch.optim.AdamW)")
        opts = {k: saved[k] for k in ("lr", "betas", "eps", "weight_decay") if k in saved}
        return opts, {}
    if source == "dion":
        algorithm = _DION_ALGORITHMS.get(saved["algorithm"])
        if algorithm is None:
            raise ValueError(f"param group {g}: unknown dion algorithm '{saved['algorithm']}'")
        need(algorithm, f"dion's '{saved['algorithm']}' group")
        if algorithm in ("muon", "normuon", "dion3", "dion2", "dion") and group.get("momentum_style") != "accumulate":
            raise ValueError(f"param group {g}: dion's momentum accumulates (M = mu*M + G); this group has "
                             f"momentum_style='{group.get('momentum_style')}'")
        opts = {k: saved[k] for k in ("lr", "weight_decay", "nesterov", "flatten", "fraction", "rank_fraction")
                if k in saved and (k in _ALGORITHM_KEYS[algorithm])}
        if "mu" in saved:
            opts["momentum"] = saved["mu"]
        if "ef_decay" in saved:
            opts["momentum"] = saved["ef_decay"]
        if "beta1" in saved and algorithm in ("adamw", "lion"):
            opts["betas"] = (saved["beta1"], saved["beta2"])
        if "epsilon" in saved:
            if algorithm in ("adamw", "dion"):
                opts["eps"] = saved["epsilon"]
            elif algorithm in ("normuon", "dion3"):
                opts["normuon_eps"] = saved["epsilon"]
        if "cautious_wd" in saved:
            opts["cautious_weight_decay"] = bool(saved["cautious_wd"])
        if "muon_beta2" in saved and algorithm in ("normuon", "dion3"):
            opts["normuon_beta2"] = saved["muon_beta2"]
        if "adjust_lr" in saved and algorithm in _MATRIX_ALGORITHMS:
            opts["lr_adjust"] = saved["adjust_lr"] or "none"
        renames = {"variance_neuron": "variance"}
        if algorithm in ("adamw", "lion"):
            renames = {"momentum": "exp_avg", "variance": "exp_avg_sq", "step_dev": "step"}
        return opts, renames
    raise ValueError(f"param group {g}: unrecognized state dict format (keys {sorted(k for k in saved if k != 'params')}); "
                     "orthopt loads its own state dicts and those of torch.optim.Muon, torch.optim.AdamW and dion's "
                     "optimizers")


def _import_state_dict(state_dict, groups):
    """An orthopt-format state dict from one of torch.optim.Muon, torch.optim.AdamW or dion's optimizers
    (the same parameters, in the same groups); an orthopt state dict is returned unchanged."""
    saved_groups = state_dict.get("param_groups")
    if not isinstance(saved_groups, (list, tuple)) or "state" not in state_dict:
        raise ValueError("load_state_dict: expected a dict with 'state' and 'param_groups' (torch's format)")
    if all(_source_of(s) == "orthopt" for s in saved_groups):
        return state_dict
    if len(saved_groups) != len(groups):
        raise ValueError(f"loaded state dict has {len(saved_groups)} param groups, this optimizer has {len(groups)}")
    new_groups, new_state = [], {}
    for g, (saved, group) in enumerate(zip(saved_groups, groups)):
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(f"param group {g}: loaded state dict has {len(saved['params'])} params, "
                             f"this group has {len(group['params'])}")
        if _source_of(saved) == "orthopt":
            new_groups.append(saved)
            new_state.update({pid: state_dict["state"][pid] for pid in saved["params"] if pid in state_dict["state"]})
            continue
        opts, renames = _convert_group(g, saved, group)
        new_groups.append(dict(opts, algorithm=group["algorithm"], params=list(saved["params"])))
        for pid in saved["params"]:
            st = state_dict["state"].get(pid)
            if not st:
                continue
            out = {}
            for k, v in st.items():
                k = renames.get(k, k)
                if k == "step" and not isinstance(v, torch.Tensor):
                    v = torch.tensor(float(v))
                out[k] = v
            if group["algorithm"] == "adamw" and "step" not in out and "step" in saved:  # dion: the group's count
                out["step"] = torch.tensor(float(saved["step"]))
            new_state[pid] = out
    return {"state": new_state, "param_groups": new_groups}


# ---------------------------------------------------------------- the optimizer

class ExecutionPlan:
    """An optimizer step's execution plan (opt.plan()): ``device``, ``execution`` (the options'
    ExecutionOptions), ``flops`` and ``bytes`` (estimates for the whole step) and ``banks``, one
    dict per bank (group, algorithm, params, matrices, rows, cols, numel, dtype, path, ns_method,
    ns_dtype, ns_rows, layout, side_stream, kernels, flops, bytes). str() is a table."""

    def __init__(self, text, data):
        self._text = text
        self.device = data["device"]
        self.execution = data["execution"]
        self.flops = data["flops"]
        self.bytes = data["bytes"]
        self.banks = data["banks"]

    def __str__(self):
        return self._text

    def __repr__(self):
        return (f"ExecutionPlan(device={self.device!r}, execution={self.execution!r}, banks={len(self.banks)}, "
                f"flops={self.flops:.3g}, bytes={self.bytes:.3g})")


class _OrthoptOptimizer(torch.optim.Optimizer):
    """Shared machinery; each subclass has its own signature and defaults."""

    _algorithm = "muon"

    def _setup(self, params, options, process_group=None, extra=None):
        """options: this class's arguments (keys of the class's algorithm, or any option key);
        extra: options of other algorithms given as keywords (they fill those groups only)."""
        options = dict(options)
        extra = dict(extra or {})
        unknown = sorted(k for k in set(options) | set(extra) if k not in _KNOWN_KEYS)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown option(s) {unknown}; known: {sorted(_KNOWN_KEYS)}")
        algorithm = extra.pop("algorithm", options.pop("algorithm", self._algorithm))
        if algorithm not in _ALGORITHM_KEYS:
            raise ValueError(f"argument 'algorithm': unknown algorithm '{algorithm}' (known: "
                             f"{', '.join(_ALGORITHM_KEYS)})")
        keys = _ALGORITHM_KEYS[algorithm]
        defaults = {k: _D[k] for k in keys}
        defaults.update({k: v for k, v in options.items() if k in keys})
        defaults.update({k: v for k, v in extra.items() if k in keys})
        defaults["algorithm"] = algorithm
        # Options that the default algorithm does not read: kept for the groups of other algorithms.
        self._group_defaults = {k: v for k, v in list(options.items()) + list(extra.items()) if k not in keys}
        self._cpp = None
        self.process_group = process_group
        self._dist = None          # orthopt.dist.DistributedEngine in distributed mode
        self._step_offset = 0      # steps taken by C++ optimizers replaced (add_param_group, copies)
        self._skip_set = False
        super().__init__(params, defaults)
        self._synced = [None] * len(self.param_groups)
        if process_group is not None or any(_dt.is_dtensor(p) for g in self.param_groups for p in g["params"]):
            from .dist import DistributedEngine
            self._dist = DistributedEngine(self, process_group)
        else:
            self._cpp = self._build()

    # -- construction

    def add_param_group(self, param_group):
        given = param_group if isinstance(param_group, dict) else {"params": param_group}
        g = len(self.param_groups)
        unknown = sorted(set(given) - _KNOWN_KEYS - _PASSTHROUGH_KEYS)
        if unknown:
            raise ValueError(f"param group {g}: unknown option(s) {unknown}")
        if self._dist is not None:
            raise RuntimeError("add_param_group: not supported by a distributed optimizer (its layout is fixed at "
                               "construction); build it with every group")
        algorithm = given.get("algorithm", self.defaults.get("algorithm"))
        if algorithm not in _ALGORITHM_KEYS:
            raise ValueError(f"param group {g}: option 'algorithm': unknown algorithm '{algorithm}' (known: "
                             f"{', '.join(_ALGORITHM_KEYS)})")
        if isinstance(param_group, dict) and not isinstance(param_group.get("params"), (torch.Tensor, set)):
            param_group["params"] = list(param_group["params"])  # as torch does; read below
        params = given.get("params")
        names = given.get("param_names") or []

        def option(key):
            return given.get(key, self.defaults.get(key, self._group_defaults.get(key, _D[key])))

        for i, p in enumerate([params] if isinstance(params, torch.Tensor) else params or []):
            name = names[i] if i < len(names) else None
            if isinstance(p, tuple) and len(p) == 2:  # torch 2.x's named parameters
                name, p = p
            if not isinstance(p, torch.Tensor):
                continue  # torch's add_param_group refuses it
            label = f"param group {g}: parameter {i}" + (f" ('{name}')" if name is not None else "")
            # Distributed: the engine checks every rank's params collectively (all ranks raise alike).
            if p.is_meta and getattr(self, "process_group", None) is None and not _dt.is_dtensor(p):
                raise ValueError(f"{label} (shape {tuple(p.shape)}) is on the meta device (argument 'params'): it has "
                                 "no data to update; materialize it first (e.g. Module.to_empty(device=...) and "
                                 "initialize it)")
            if algorithm in _MATRIX_ALGORITHMS and p.dim() >= 4 and not option("flatten") and not option("batched"):
                raise ValueError(f"{label} is {p.dim()}-D (shape {tuple(p.shape)}) in a '{algorithm}' group: set "
                                 f"flatten=True to make it one [{p.shape[0]}, prod(rest)] matrix (e.g. a conv weight), "
                                 "or batched=True if it is a stack of matrices over its leading dims")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for k in _ALGORITHM_KEYS[group["algorithm"]]:  # the options of the group's own algorithm
            if k not in group:
                group[k] = self._group_defaults.get(k, _D[k])
        if self._cpp is not None:  # a group added later: rebuild, keeping the state
            old = self._cpp
            try:
                self._rebuild([[old.param_state(gi, i) for i in range(len(grp["params"]))]
                               for gi, grp in enumerate(self.param_groups[:-1])] + [[{} for _ in group["params"]]])
            except Exception:  # the group is refused: the optimizer stays as it was
                self.param_groups.pop()
                self._cpp = old
                self._synced = [_cpp_options(grp) for grp in self.param_groups]
                raise

    def _rebuild(self, states):
        """A new C++ optimizer over the current groups with `states`, continuing the old one's step
        count and device hyperparameters."""
        old = self._cpp
        cpp = self._build()
        cpp.load_param_states(states)
        self._cpp = cpp
        if old is not None:
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

    # -- copies (copy.deepcopy, pickle): the C++ optimizer is rebuilt from param_groups and state

    def __getstate__(self):
        if self._dist is not None:
            raise TypeError(f"{type(self).__name__}: a distributed optimizer cannot be copied or pickled (its "
                            "process group cannot); save full_state_dict() and load it into a new optimizer")
        # Not copied, as by torch's own __getstate__: the engine (rebuilt), the hooks (torch's
        # __setstate__ starts them empty) and functions patched onto the instance (an LR scheduler's
        # step wrapper, which would step the original).
        out = {k: v for k, v in self.__dict__.items()
               if k not in ("_cpp", "_synced", "_state_version") and not k.startswith("_optimizer_")
               and not isinstance(v, (types.FunctionType, types.MethodType, functools.partial))}
        if self._cpp is not None:
            self._alias_state()
            out["_step_offset"] = self.step_count
            out["_engine"] = {"lr_scale": float(self._cpp.lr_scale),
                              "skip_factor": self._cpp.skip_factor.clone() if self._skip_set else None}
        return out

    def __setstate__(self, state):
        engine = state.pop("_engine", None)
        had_differentiable = "differentiable" in state.get("defaults", {})
        super().__setstate__(state)
        if not had_differentiable:  # torch's __setstate__ adds it; it is no option of ours
            self.defaults.pop("differentiable", None)
        self._cpp, self._synced = None, [None] * len(self.param_groups)
        if engine is None:
            return
        states = [[dict(self.state.get(p, {})) for p in group["params"]] for group in self.param_groups]
        self._cpp = self._build()
        self._cpp.load_param_states(states)
        self._cpp.set_lr_scale(engine["lr_scale"])
        if engine["skip_factor"] is not None:
            self._cpp.set_skip_factor(engine["skip_factor"])
        self.state = defaultdict(dict)
        self._alias_state()

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
        """Performs a single optimization step.

        Args:
            closure (Callable, optional): a closure that reevaluates the model and returns the loss.
        """
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

    def plan(self):
        """The execution plan of a step (docs/execution.md): per group and bank the path, the
        Newton-Schulz method and dtype, the fused kernels that run and estimated FLOPs and bytes.
        print() shows it as a table; .banks holds one dict per bank."""
        if self._cpp is None:
            raise RuntimeError("plan(): the distributed engine has no single-process plan; call it on one rank's "
                               "optimizer without process_group")
        self._sync()
        return ExecutionPlan(self._cpp.plan_text(), json.loads(self._cpp.plan_json()))

    def set_lr_scale(self, factor):
        """Multiplies every group's lr by `factor` through a device tensor (no host sync, CUDA-graph safe)."""
        (self._dist or self._cpp).set_lr_scale(float(factor))

    def set_skip_factor(self, factor):
        """0 skips the next steps bit-identically (params and state untouched), any other value steps.
        Distributed: must be the same on every rank (e.g. from all-reduced loss / grad norm)."""
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
        """Loads an orthopt state dict, or one of torch.optim.Muon (into Muon.torch_like),
        torch.optim.AdamW (into AdamW) or dion's optimizers (into orthopt.dion's) over the same
        parameters in the same groups. Raises ValueError naming what does not match, changing nothing."""
        if self._dist is not None:
            if "orthopt_dist" not in state_dict:
                state_dict = _import_state_dict(state_dict, self.param_groups)
            return self._dist.load_state_dict(state_dict)
        state_dict = _import_state_dict(state_dict, self.param_groups)
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
                params = group["params"]
                group.clear()
                group.update(old, params=params)
            self._sync(force=True)
            raise
        self.state = defaultdict(dict)
        self._alias_state()


# ---------------------------------------------------------------- documentation pieces

_ARG_DOCS = {
    "params": "params (iterable): parameters to optimize, or dicts defining parameter groups. A group may set "
              "'algorithm' and any option below, so one optimizer can hold matrix and AdamW/Lion groups.",
    "lr": "lr (float, Tensor, optional): learning rate (default: {lr})",
    "weight_decay": "weight_decay (float, optional): decoupled weight decay, W <- W*(1 - lr*weight_decay), always "
                    "with the unadjusted lr (default: {weight_decay})",
    "cautious_weight_decay": "cautious_weight_decay (bool, optional): decay only the entries where the update also "
                             "pushes W towards zero (default: {cautious_weight_decay})",
    "momentum": "momentum (float, optional): momentum factor mu in [0, 1) (default: {momentum})",
    "momentum_style": "momentum_style (str, optional): 'accumulate' (M <- mu*M + G, dion's) or 'ema' "
                      "(M <- mu*M + (1-mu)*G, torch's) (default: {momentum_style})",
    "nesterov": "nesterov (bool, optional): orthogonalize G + mu*M (ema: (1-mu)*G + mu*M) instead of M "
                "(default: {nesterov})",
    "lr_adjust": "lr_adjust (str, optional): lr factor for a fan_out x fan_in matrix: 'spectral_norm' "
                 "sqrt(fan_out/fan_in), 'jordan' (torch's 'original') sqrt(max(1, fan_out/fan_in)), 'rms_norm' "
                 "(torch's 'match_rms_adamw') 0.2*sqrt(max(fan_out, fan_in)), or 'none' (default: {lr_adjust})",
    "schedule": "schedule (str or sequence of (a, b, c), optional): Newton-Schulz coefficients: a built-in name "
                "(orthopt.schedules()) or one triple per step, the last repeated (default: {schedule})",
    "ns_steps": "ns_steps (int, optional): Newton-Schulz steps (default: {ns_steps})",
    "method": "method (str, optional): 'standard' NS, 'gram' NS (iterates on the small Gram matrix), or 'auto' "
              "(Gram where cols >= gram_aspect_threshold*rows) (default: {method})",
    "compute_dtype": "compute_dtype (torch.dtype, optional): dtype of the Newton-Schulz products; None: fp32 on "
                     "the CPU, bf16 (standard) / fp16 (Gram) on CUDA (default: None)",
    "split_sizes": "split_sizes (list of int, optional): row blocks orthogonalized separately, each with its own lr "
                   "factor (fused QKV; Muon and NorMuon only) (default: None)",
    "flatten": "flatten (bool, optional): treat a >=3-D weight as one [size(0), prod(rest)] matrix (conv weights); "
               "without it a 3-D weight is a stack of matrices (expert weights) (default: {flatten})",
    "batched": "batched (bool, optional): declare >=4-D weights stacks of [m, n] matrices over their leading dims; "
               "a >=4-D weight needs flatten or batched, else ValueError (default: {batched})",
    "gram_restarts": "gram_restarts (sequence of int, optional): Gram NS restarts before these step indices "
                     "(default: {gram_restarts})",
    "gram_aspect_threshold": "gram_aspect_threshold (float, optional): aspect ratio from which 'auto' takes Gram NS "
                             "(default: {gram_aspect_threshold})",
    "ns_safety": "ns_safety (float, optional): overrides the schedule's norm safety factor (default: None)",
    "ns_eps": "ns_eps (float, optional): overrides the schedule's eps in X/(|X|*safety + eps), >= 1e-38 (default: None)",
    "master_weights": "master_weights (bool, optional): keep an fp32 copy of bf16/fp16 parameters in the state "
                      "(default: {master_weights})",
    "execution": "execution (dict or str, optional): which implementation each part of the step takes, e.g. "
                 "{{'fold_update': 'off'}} or 'kernels=off'; fields and their measured defaults in docs/execution.md, "
                 "values 'auto', 'on', 'off'; not the math (default: None, all 'auto')",
    "normuon_beta2": "normuon_beta2 (float, optional): beta2 of the per-row second moment V (default: {normuon_beta2})",
    "normuon_eps": "normuon_eps (float, optional): eps in U/(sqrt(V) + eps), >= 1e-19 (default: {normuon_eps})",
    "fraction": "fraction (float, optional): fraction f in (0, 1] of rows selected per step (default: {fraction})",
    "scale_lr_by_fraction": "scale_lr_by_fraction (bool, optional): use lr/sqrt(f), which keeps the best lr across "
                            "fractions (default: {scale_lr_by_fraction})",
    "rank_fraction": "rank_fraction (float, optional): rank r = ceil(rank_fraction*min(m, n)) (default: {rank_fraction})",
    "dion_qr": "dion_qr (str, optional): orthonormalization of P: 'householder' (fp32 QR) or 'cholesky' (Cholesky "
               "QR2 in fp64, Householder where it fails; faster on a GPU) (default: {dion_qr})",
    "betas": "betas (Tuple[float, float], optional): coefficients of the running averages (default: {betas})",
    "eps": "eps (float, optional): term added to the denominator, >= 1e-38 (default: {eps})",
    "process_group": "process_group (ProcessGroup, optional): data parallel over this torch.distributed group, each "
                     "rank owning whole matrices (docs/distributed.md); None: single process (default: None)",
    "options": "**options: options of other algorithms' groups in this optimizer (e.g. betas and eps for "
               "'adamw' groups), or 'algorithm' to make every group another algorithm by default",
}


def _doc(summary, rule, keys, defaults, extra_args=(), notes=""):
    """A torch.optim-style docstring: summary, the update rule, each argument with its default."""
    lines = [summary, "", "Update, per matrix W with gradient G (or per tensor):", ""]
    lines += ["    " + r for r in rule.strip("\n").split("\n")]
    lines += ["", "Args:"]
    for k in ("params",) + tuple(keys) + tuple(extra_args):
        text = _ARG_DOCS[k].format(**{k2: repr(v) if isinstance(v, str) else v for k2, v in defaults.items()})
        lines.append("    " + text)
    if notes:
        lines += [""] + notes.strip("\n").split("\n")
    return "\n".join(lines)


_MUON_RULE = """
M <- mu*M + G                      (momentum_style='ema': mu*M + (1-mu)*G)
U <- orthogonalize(M)              (nesterov: of G + mu*M; Newton-Schulz, ns_steps)
W <- W*(1 - lr*weight_decay) - lr*adjust(fan_out, fan_in)*U
"""

_CHECKPOINT_NOTE = """
load_state_dict also takes the state dict of {source} over the same parameters in the same groups
({mapping}); anything that does not match raises ValueError naming it, and nothing changes.
"""


def _muon_family_keys(extra):
    return ("lr", "weight_decay", "momentum", "nesterov", "momentum_style", "lr_adjust", "cautious_weight_decay") \
        + tuple(extra) + ("schedule", "ns_steps", "method", "compute_dtype", "split_sizes", "flatten", "batched",
                          "gram_restarts", "gram_aspect_threshold", "ns_safety", "ns_eps", "master_weights", "execution")


def _class_options(values):
    """The arguments of a constructor call, without self, params, process_group and **options."""
    return {k: v for k, v in values.items() if k not in ("self", "params", "process_group", "options", "__class__")}


class Muon(_OrthoptOptimizer):
    _algorithm = "muon"

    def __init__(self, params: ParamsT, lr: Union[float, torch.Tensor] = _D["lr"],
                 weight_decay: float = _D["weight_decay"], momentum: float = _D["momentum"],
                 nesterov: bool = _D["nesterov"], momentum_style: str = _D["momentum_style"],
                 lr_adjust: str = _D["lr_adjust"], cautious_weight_decay: bool = _D["cautious_weight_decay"],
                 schedule: ScheduleT = _D["schedule"], ns_steps: int = _D["ns_steps"], method: str = _D["method"],
                 compute_dtype: Optional[torch.dtype] = None, split_sizes: Optional[Sequence[int]] = None,
                 flatten: bool = _D["flatten"], batched: bool = _D["batched"],
                 gram_restarts: Sequence[int] = _D["gram_restarts"],
                 gram_aspect_threshold: float = _D["gram_aspect_threshold"], ns_safety: Optional[float] = None,
                 ns_eps: Optional[float] = None, master_weights: bool = _D["master_weights"], *,
                 execution: ExecutionT = None,
                 process_group=None, **options):
        self._setup(params, _class_options(locals()), process_group, options)

    @classmethod
    def torch_like(cls, params: ParamsT, lr: Union[float, torch.Tensor] = 1e-3, weight_decay: float = 0.1,
                   momentum: float = 0.95, nesterov: bool = True,
                   ns_coefficients: Tuple[float, float, float] = (3.4445, -4.775, 2.0315), eps: float = 1e-7,
                   ns_steps: int = 5, adjust_lr_fn: Optional[str] = None, *, process_group=None, **options):
        """A Muon configured like torch.optim.Muon, with its argument names and defaults.

        momentum_style 'ema' (M <- mu*M + (1-mu)*G, Nesterov (1-mu)*G + mu*M), standard Newton-Schulz
        with the one triple ``ns_coefficients`` after the normalization X/(|X| + eps), computed in
        bf16 on every device as torch does, lr factor ``adjust_lr_fn`` ('original' =
        sqrt(max(1, A/B)) when None, or 'match_rms_adamw' = 0.2*sqrt(max(A, B))). Only 2-D
        parameters, as torch.optim.Muon. ``options`` are further orthopt options (e.g.
        compute_dtype=torch.float32). Loads torch.optim.Muon's state dicts (momentum_buffer).
        """
        if adjust_lr_fn is not None and adjust_lr_fn not in ("original", "match_rms_adamw"):
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int):
            raise TypeError(f"argument 'ns_steps': expected an int, got {type(ns_steps).__name__}")
        if ns_steps >= 100:
            raise ValueError("Number of steps must be less than 100 for computational efficiency")
        if not isinstance(ns_coefficients, (tuple, list)) or len(ns_coefficients) != 3:
            raise ValueError("Coefficients must be a tuple of exactly 3 values")
        if not isinstance(params, torch.Tensor):  # (a tensor: torch's TypeError below)
            params = [dict(p, params=list(p["params"]) if not isinstance(p["params"], torch.Tensor) else [p["params"]])
                      if isinstance(p, dict) else p for p in params]
            for item in params:  # torch.optim.Muon's check, before anything else refuses the parameter
                group = item if isinstance(item, dict) else {"params": [item]}
                if group.get("algorithm", options.get("algorithm", "muon")) != "muon":
                    continue
                for p in group["params"]:
                    p = p[1] if isinstance(p, tuple) and len(p) == 2 else p
                    if isinstance(p, torch.Tensor) and p.ndim != 2:
                        raise ValueError(f"Muon only supports 2D parameters whereas we found a parameter with size: "
                                         f"{p.size()}")
        config = dict(momentum_style="ema", schedule=[tuple(float(c) for c in ns_coefficients)], ns_steps=ns_steps,
                      ns_safety=1.0, ns_eps=eps, lr_adjust=adjust_lr_fn or "original", method="standard",
                      compute_dtype=torch.bfloat16)
        config.update(options)
        # A subclass with another signature (orthopt.dion.Muon) gets orthopt's Muon.
        target = cls if cls.__init__ is Muon.__init__ else Muon
        opt = target(params, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                     process_group=process_group, **config)
        return opt


Muon.__doc__ = _doc(
    "Muon: momentum, orthogonalized by Newton-Schulz, with a shape-dependent lr.", _MUON_RULE,
    _muon_family_keys(()), _D, ("process_group", "options"),
    "Defaults follow the dion package; ``Muon.torch_like`` gives torch.optim.Muon's behaviour and names.\n"
    "Matrices only: 2-D weights, 3-D stacks of matrices (expert weights), >=4-D weights with flatten=True (or\n"
    "batched=True for stacks); "
    "route embeddings, the output head and 1-D parameters to 'adamw' groups (orthopt.param_groups does)."
    + _CHECKPOINT_NOTE.format(source="torch.optim.Muon (into Muon.torch_like)",
                              mapping="momentum_buffer -> momentum; lr, weight_decay, momentum, nesterov, "
                                      "ns_coefficients, eps, ns_steps, adjust_lr_fn"))


class NorMuon(_OrthoptOptimizer):
    _algorithm = "normuon"

    def __init__(self, params: ParamsT, lr: Union[float, torch.Tensor] = _D["lr"],
                 weight_decay: float = _D["weight_decay"], momentum: float = _D["momentum"],
                 nesterov: bool = _D["nesterov"], momentum_style: str = _D["momentum_style"],
                 lr_adjust: str = _D["lr_adjust"], cautious_weight_decay: bool = _D["cautious_weight_decay"],
                 normuon_beta2: float = _D["normuon_beta2"], normuon_eps: float = _D["normuon_eps"],
                 schedule: ScheduleT = _D["schedule"], ns_steps: int = _D["ns_steps"], method: str = _D["method"],
                 compute_dtype: Optional[torch.dtype] = None, split_sizes: Optional[Sequence[int]] = None,
                 flatten: bool = _D["flatten"], batched: bool = _D["batched"],
                 gram_restarts: Sequence[int] = _D["gram_restarts"],
                 gram_aspect_threshold: float = _D["gram_aspect_threshold"], ns_safety: Optional[float] = None,
                 ns_eps: Optional[float] = None, master_weights: bool = _D["master_weights"], *,
                 execution: ExecutionT = None,
                 process_group=None, **options):
        self._setup(params, _class_options(locals()), process_group, options)


NorMuon.__doc__ = _doc(
    "NorMuon: Muon with neuron-wise (row) normalization of the orthogonalized update.", """
M <- mu*M + G;  U <- orthogonalize(M)          (as Muon)
V_i <- beta2*V_i + (1-beta2)*mean_j(U_ij^2)     (per row, fp32, from 0)
U' <- U/(sqrt(V) + eps), rescaled to |U'|_F = |U|_F
W <- W*(1 - lr*weight_decay) - lr*adjust(fan_out, fan_in)*U'
""", _muon_family_keys(("normuon_beta2", "normuon_eps")), _D, ("process_group", "options"))


class Dion3(_OrthoptOptimizer):
    _algorithm = "dion3"

    def __init__(self, params: ParamsT, lr: Union[float, torch.Tensor] = _D["lr"],
                 weight_decay: float = _D["weight_decay"], momentum: float = _D["momentum"],
                 nesterov: bool = _D["nesterov"], momentum_style: str = _D["momentum_style"],
                 lr_adjust: str = _D["lr_adjust"], cautious_weight_decay: bool = _D["cautious_weight_decay"],
                 fraction: float = _D["fraction"], scale_lr_by_fraction: bool = _D["scale_lr_by_fraction"],
                 normuon_beta2: float = _D["normuon_beta2"], normuon_eps: float = _D["normuon_eps"],
                 schedule: ScheduleT = _D["schedule"], ns_steps: int = _D["ns_steps"], method: str = _D["method"],
                 compute_dtype: Optional[torch.dtype] = None, split_sizes: Optional[Sequence[int]] = None,
                 flatten: bool = _D["flatten"], batched: bool = _D["batched"],
                 gram_restarts: Sequence[int] = _D["gram_restarts"],
                 gram_aspect_threshold: float = _D["gram_aspect_threshold"], ns_safety: Optional[float] = None,
                 ns_eps: Optional[float] = None, master_weights: bool = _D["master_weights"], *,
                 execution: ExecutionT = None,
                 process_group=None, **options):
        self._setup(params, _class_options(locals()), process_group, options)


_SELECTION_RULE = """
M <- M + G
S <- the k = max(1, ceil(f*rows)) rows of M with the largest L1 norms
U <- orthogonalize(M[S]);  then M[S] <- mu*M[S]   (error feedback: unselected rows keep accumulating)
"""

Dion3.__doc__ = _doc(
    "Dion3 (dion's NorDion2): row selection with error feedback, and NorMuon's normalization.",
    _SELECTION_RULE + """U' <- NorMuon's normalization of U on the selected rows (their V only)
W <- W*(1 - lr*weight_decay);  W[S] <- W[S] - lr*adjust(fan_out, fan_in)*U'   (full matrix shape)
""", _muon_family_keys(("fraction", "scale_lr_by_fraction", "normuon_beta2", "normuon_eps")), _D,
    ("process_group", "options"), "momentum is the error-feedback factor mu; nesterov and momentum_style do not apply.")


class Dion2(_OrthoptOptimizer):
    _algorithm = "dion2"

    def __init__(self, params: ParamsT, lr: Union[float, torch.Tensor] = _D["lr"],
                 weight_decay: float = _D["weight_decay"], momentum: float = _D["momentum"],
                 lr_adjust: str = _D["lr_adjust"], cautious_weight_decay: bool = _D["cautious_weight_decay"],
                 fraction: float = _D["fraction"], scale_lr_by_fraction: bool = _D["scale_lr_by_fraction"],
                 schedule: ScheduleT = _D["schedule"], ns_steps: int = _D["ns_steps"], method: str = _D["method"],
                 compute_dtype: Optional[torch.dtype] = None, flatten: bool = _D["flatten"],
                 batched: bool = _D["batched"], gram_restarts: Sequence[int] = _D["gram_restarts"],
                 gram_aspect_threshold: float = _D["gram_aspect_threshold"], ns_safety: Optional[float] = None,
                 ns_eps: Optional[float] = None, master_weights: bool = _D["master_weights"], *,
                 execution: ExecutionT = None,
                 process_group=None, **options):
        self._setup(params, _class_options(locals()), process_group, options)


Dion2.__doc__ = _doc(
    "Dion2 (dion's Dion2): selection with error feedback along the shorter side, no normalization.", """
M <- M + G
S <- the k = max(1, ceil(f*n)) rows (rows <= cols; else columns, n their count) of M with the largest L1 norms
U <- orthogonalize(M[S]);  then M[S] <- mu*M[S]   (error feedback: the others keep accumulating)
W <- W*(1 - lr*weight_decay);  W[S] <- W[S] - lr*adjust(fan_out, fan_in)*U   (full matrix shape)
""", ("lr", "weight_decay", "momentum", "lr_adjust", "cautious_weight_decay", "fraction", "scale_lr_by_fraction",
      "schedule", "ns_steps", "method", "compute_dtype", "flatten", "batched", "gram_restarts", "gram_aspect_threshold",
      "ns_safety", "ns_eps", "master_weights", "execution"), _D, ("process_group", "options"),
    "momentum is the error-feedback factor (dion's ef_decay). Steps per matrix on every device (no bank path).")


class Dion(_OrthoptOptimizer):
    _algorithm = "dion"

    def __init__(self, params: ParamsT, lr: Union[float, torch.Tensor] = _D["lr"],
                 weight_decay: float = _D["weight_decay"], momentum: float = _D["momentum"],
                 lr_adjust: str = _D["lr_adjust"], cautious_weight_decay: bool = _D["cautious_weight_decay"],
                 rank_fraction: float = _D["rank_fraction"], dion_qr: str = _D["dion_qr"], eps: float = _D["eps"],
                 flatten: bool = _D["flatten"], batched: bool = _D["batched"],
                 master_weights: bool = _D["master_weights"], *,
                 execution: ExecutionT = None,
                 process_group=None, **options):
        self._setup(params, _class_options(locals()), process_group, options)


Dion.__doc__ = _doc(
    "Dion: low-rank orthonormalized updates with error feedback.", """
M <- M + G;  P <- orthonormalize(M*Q) (QR, fp32);  R <- M^T*P
M <- M - (1-mu)*P*R^T                           (error feedback)
Q <- R with columns normalized (+eps)
W <- W*(1 - lr*weight_decay) - lr*adjust(fan_out, fan_in)*P*Q^T
""", ("lr", "weight_decay", "momentum", "lr_adjust", "cautious_weight_decay", "rank_fraction", "dion_qr", "eps",
      "flatten", "batched", "master_weights", "execution"), _D, ("process_group", "options"),
    "Q starts random, seeded per (group, parameter). The four rectangular products follow torch's TF32 switch\n"
    "(torch.backends.cuda.matmul.allow_tf32) on a GPU; the QR stays fp32/fp64 (docs/optimizers.md).")


class AdamW(_OrthoptOptimizer):
    _algorithm = "adamw"

    def __init__(self, params: ParamsT, lr: Union[float, torch.Tensor] = 1e-3, betas: Tuple[float, float] = _D["betas"],
                 eps: float = _D["eps"], weight_decay: float = _D["weight_decay"],
                 cautious_weight_decay: bool = _D["cautious_weight_decay"],
                 master_weights: bool = _D["master_weights"], *,
                 execution: ExecutionT = None, process_group=None, **options):
        self._setup(params, _class_options(locals()), process_group, options)


AdamW.__doc__ = _doc(
    "AdamW with bias correction and decoupled weight decay (optionally cautious).", """
m <- beta1*m + (1-beta1)*G;  v <- beta2*v + (1-beta2)*G^2;  t <- t + 1
W <- W*(1 - lr*weight_decay) - lr*(m/(1-beta1^t))/(sqrt(v)/sqrt(1-beta2^t) + eps)
""", ("lr", "betas", "eps", "weight_decay", "cautious_weight_decay", "master_weights", "execution"),
    dict(_D, lr=1e-3), ("process_group", "options"),
    _CHECKPOINT_NOTE.format(source="torch.optim.AdamW", mapping="exp_avg, exp_avg_sq, step; lr, betas, eps, "
                                                                 "weight_decay; amsgrad and maximize are refused"))


class Lion(_OrthoptOptimizer):
    _algorithm = "lion"

    def __init__(self, params: ParamsT, lr: Union[float, torch.Tensor] = 1e-4,
                 betas: Tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0,
                 cautious_weight_decay: bool = _D["cautious_weight_decay"],
                 master_weights: bool = _D["master_weights"], *,
                 execution: ExecutionT = None, process_group=None, **options):
        self._setup(params, _class_options(locals()), process_group, options)


Lion.__doc__ = _doc(
    "Lion: sign of the interpolated momentum, decoupled weight decay.", """
D <- sign(beta1*m + (1-beta1)*G);  m <- beta2*m + (1-beta2)*G
W <- W*(1 - lr*weight_decay) - lr*D
""", ("lr", "betas", "weight_decay", "cautious_weight_decay", "master_weights", "execution"),
    dict(_D, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0), ("process_group", "options"))


# ---------------------------------------------------------------- routing

def _module_roles(model):
    """ids of parameters that are embeddings or the output head by module type: every nn.Embedding /
    nn.EmbeddingBag weight; an nn.Linear whose weight is an embedding's (tied); the last nn.Linear when
    its out_features is an embedding's vocabulary size."""
    embeddings = [m for m in model.modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))]
    ids = {id(m.weight) for m in embeddings}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    vocab = {m.num_embeddings for m in embeddings}
    if linears and linears[-1].out_features in vocab:
        ids.add(id(linears[-1].weight))
    return ids


def param_groups(model: torch.nn.Module, algorithm: str = "muon", matrix: Optional[dict] = None,
                 scalar: Optional[dict] = None, overrides: Sequence[Tuple[str, dict]] = (),
                 embedding_patterns: Sequence[str] = ("embed", "wte", "wpe", "tok_emb"),
                 head_patterns: Sequence[str] = ("lm_head", "head", "output"),
                 batch_patterns: Sequence[str] = ("expert",)):
    """Routes ``model.named_parameters()`` into groups for any orthopt optimizer.

    Matrices (2-D) go to ``algorithm`` with the ``matrix`` options; >=4-D weights (conv) to the same
    with ``flatten=True``; 3-D weights whose name contains one of ``batch_patterns`` (expert stacks)
    as stacks of matrices. 0-D/1-D params go to the ``scalar`` options (default adamw, lr 3e-3, wd 0.01);
    embeddings and the output head to ``scalar`` with weight decay 0. Embeddings and heads are found
    by module type (nn.Embedding; an nn.Linear tied to an embedding, or the last nn.Linear with an
    embedding's vocabulary size as out_features) and by name (``embedding_patterns``,
    ``head_patterns``: substrings). ``overrides`` is a sequence of (regex, options) pairs, first
    match wins. Frozen parameters are left out. Returns a list of group dicts.

    Raises ValueError for a 3-D weight that would go to the matrix group without being declared a
    stack (``batch_patterns``) or flattened (``matrix={'flatten': True}`` or an override).
    """
    named = [(n, p) for n, p in model.named_parameters()]
    slots = list(_C.route_slots([n for n, _ in named], [p for _, p in named], list(embedding_patterns),
                                list(head_patterns), [pattern for pattern, _ in overrides]))
    roles = _module_roles(model)
    matrix_opts = dict(matrix or {}, algorithm=algorithm)
    for j, (name, p) in enumerate(named):
        if slots[j] in (0, 1) and id(p) in roles:
            slots[j] = 3
        if slots[j] == 0 and p.dim() == 3 and not matrix_opts.get("flatten") \
                and not any(s and s in name for s in batch_patterns):
            raise ValueError(f"param_groups: parameter '{name}' is 3-D (shape {tuple(p.shape)}) and would go to the "
                             f"'{algorithm}' group as a stack of {p.shape[0]} matrices: name it in batch_patterns if "
                             "it is one (expert weights), or set flatten (matrix={'flatten': True}, or an override "
                             f"(r'{name}', {{'flatten': True}})) to make it one matrix")
    scalar_opts = dict({"algorithm": "adamw", "lr": 3e-3, "weight_decay": 0.01}, **(scalar or {}))
    templates = [matrix_opts, dict(matrix_opts, flatten=True), scalar_opts, dict(scalar_opts, weight_decay=0.0)]
    templates += [dict(opts) for _, opts in overrides]
    groups = [dict(t, params=[], param_names=[]) for t in templates]
    for (name, p), slot in zip(named, slots):
        if slot >= 0:
            groups[slot]["params"].append(p)
            groups[slot]["param_names"].append(name)
    return [g for g in groups if g["params"]]

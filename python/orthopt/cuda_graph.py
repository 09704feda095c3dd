"""CUDA-graph optimizer step for the orthopt torch.optim optimizers (docs/cuda_graph.md).

``CudaGraphOptimizer(opt)`` runs ``warmup_steps`` eager steps, captures the next step into a CUDA
graph (replayed at once) and replays it for every later step. Usage::

    opt = orthopt.Muon(orthopt.param_groups(model), lr=0.02)
    graphed = orthopt.CudaGraphOptimizer(opt, warmup_steps=10)
    for batch in data:
        model(batch).backward()
        opt.set_lr_scale(schedule(step))  # the lr schedule: a device tensor, allowed after capture
        graphed.step()
        graphed.zero_grad()               # set_to_none=False: keeps the gradient buffers

After the capture the graph is fixed: a changed host-side hyperparameter (e.g. ``group['lr']``
edited by a torch LR scheduler), a gradient set to None or reassigned, or a trainable parameter
without a gradient raise RuntimeError instead of silently training wrong; ``release()`` drops the
graph (the next steps warm up again and re-capture).
"""
import torch

from . import _C

__all__ = ["CudaGraphOptimizer"]


class CudaGraphOptimizer:
    """Graph-captured ``step()`` of an orthopt optimizer (``orthopt.Muon``, ``NorMuon``, ...)."""

    def __init__(self, optimizer, warmup_steps=10):
        if getattr(optimizer, "_dist", None) is not None:
            raise TypeError("CudaGraphOptimizer: distributed optimizers (process_group or DTensor params) "
                            "cannot be captured (their step runs collectives and host-side bookkeeping)")
        if not isinstance(getattr(optimizer, "_cpp", None), _C.Optimizer):
            raise TypeError("CudaGraphOptimizer: argument 'optimizer' must be an orthopt optimizer "
                            f"(orthopt.Muon, NorMuon, Dion3, AdamW, Lion, ...), got {type(optimizer).__name__}")
        self.optimizer = optimizer
        optimizer._sync()  # C++ holds the groups' current options before anything is captured
        self._cpp = optimizer._cpp
        self._graph = _C.CudaGraphOptimizer(self._cpp, int(warmup_steps))

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        opt = self.optimizer
        if opt._cpp is not self._cpp:
            raise RuntimeError("CudaGraphOptimizer: the optimizer was rebuilt (add_param_group) after this wrapper "
                               "was created; create a new CudaGraphOptimizer")
        opt._sync()  # host-side changes reach C++, which refuses them after the capture
        self._graph.step()
        opt._alias_state()
        return loss

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place by default: the captured graph reads those buffers."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def release(self):
        """Frees the graph; the next steps are eager warm-up steps, then it re-captures."""
        self._graph.release()

    def set_lr_scale(self, factor):
        self.optimizer.set_lr_scale(factor)

    @property
    def captured(self):
        return self._graph.captured

    @property
    def warmup_steps(self):
        return self._graph.warmup_steps

    @property
    def eager_steps(self):
        """Eager steps taken since construction or the last release()."""
        return self._graph.eager_steps

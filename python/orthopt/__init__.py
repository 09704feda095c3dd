"""orthopt: Muon-family (orthogonal-update) optimizers on a C++ engine.

The heavy lifting is in the C++ library (``orthopt._C``); this package adds the
``torch.optim`` front ends (``orthopt.Muon``, ...) and dion's class names and arguments
(``orthopt.dion``). Importing it changes no global setting; ``orthopt.set_num_threads()``
sets torch's thread count the way the orthopt CLI does.
"""
import torch  # noqa: F401  (loads libtorch before the extension)
from ._version import __version__  # noqa: F401  (generated from CMakeLists.txt's project(VERSION))

from ._C import orthogonalize, schedules, set_num_threads  # noqa: F401
from .optim import AdamW, Dion, Dion2, Dion3, ExecutionPlan, Lion, Muon, NorMuon, param_groups  # noqa: F401
from .cuda_graph import CudaGraphOptimizer  # noqa: F401
from . import dion  # noqa: F401

__all__ = ["orthogonalize", "schedules", "set_num_threads"]
__all__ += ["Muon", "NorMuon", "Dion3", "Dion2", "Dion", "AdamW", "Lion", "param_groups", "ExecutionPlan"]
__all__ += ["CudaGraphOptimizer", "dion"]

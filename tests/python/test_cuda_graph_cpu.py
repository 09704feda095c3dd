"""orthopt.CudaGraphOptimizer without a GPU: a clear error, not a crash (GPU tests: tests/gpu)."""
import pytest
import torch

import orthopt


def test_cpu_parameters_give_a_clear_error():
    w = torch.randn(8, 12, requires_grad=True)
    with pytest.raises(RuntimeError, match="CudaGraphOptimizer: CUDA graphs need (a CUDA build|the parameters on a CUDA device)"):
        orthopt.CudaGraphOptimizer(orthopt.Muon([w]))


def test_non_orthopt_optimizer_is_rejected():
    w = torch.randn(8, 12, requires_grad=True)
    with pytest.raises(TypeError, match="argument 'optimizer' must be an orthopt optimizer"):
        orthopt.CudaGraphOptimizer(torch.optim.SGD([w], lr=0.1))

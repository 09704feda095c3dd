"""Muon.torch_like through PyTorch's own optimizer test data: the OptimizerInfo of torch.optim.Muon
in torch.testing._internal.common_optimizers (torch >= 2.9; skipped where torch has none, e.g.
Debian's 1.13). PyTorch's test_optim.py is not installed with torch, so its checks that apply are
written here over that data, each run on torch.optim.Muon and on Muon.torch_like:

- every error input (construction and step errors) raises for torch_like what it raises for
  torch's Muon, of the same type, where torch's does;
- for every input configuration, on the CPU and on CUDA: the loss of PyTorch's
  `test_forloop_goes_right_direction` goes down, and after 5 steps the parameters follow torch's
  Muon within the bf16 rounding of Newton–Schulz (both compute NS in bf16, so they differ by up to
  about twice its error, ~1e-2 a step at these sizes: relative difference of the displacement
  <= 0.1, where a missing, doubled or sign-flipped update gives 1 or more);
- state_dict round trips step on bit for bit (PyTorch's `test_state_dict_deterministic`), and
  deepcopy keeps the public attributes (`test_deepcopy_copies_all_public_attrs`).
"""
import copy

import pytest
import torch

orthopt = pytest.importorskip("orthopt")

try:
    from torch.testing._internal.common_optimizers import OptimizerErrorEnum, optim_db
    MUON_INFO = next((o for o in optim_db if getattr(torch.optim, "Muon", None) is o.optim_cls), None)
except ImportError:  # torch without the OptimizerInfo database
    MUON_INFO = None

pytestmark = pytest.mark.skipif(MUON_INFO is None, reason="torch has no OptimizerInfo for torch.optim.Muon")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _inputs(device):
    return MUON_INFO.optim_inputs_func(device=device)


def _params(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(device)) for s in [(10, 5), (12, 8)]]


def _errors(device):
    return MUON_INFO.optim_error_inputs_func(device=device, dtype=torch.float32) \
        if MUON_INFO.optim_error_inputs_func is not None else []


def _outcome(cls, error_input):
    """What constructing (and, for step errors, stepping) gives: None or the exception."""
    inp = error_input.optimizer_error_input
    params = copy.deepcopy(inp.params)
    try:
        opt = cls(params, **copy.deepcopy(inp.kwargs))
        if error_input.error_on == OptimizerErrorEnum.STEP_ERROR:
            opt.step()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return e
    return None


@pytest.mark.parametrize("device", DEVICES)
def test_error_inputs_raise_what_torch_muon_raises(device):
    checked = 0
    for error_input in _errors(device):
        if issubclass(error_input.error_type, Warning):
            continue
        want = _outcome(torch.optim.Muon, error_input)
        if want is None:
            continue
        got = _outcome(orthopt.Muon.torch_like, error_input)
        assert got is not None, f"torch_like accepted {error_input.optimizer_error_input.desc}: {want}"
        assert isinstance(got, type(want)) or isinstance(got, error_input.error_type), \
            (error_input.optimizer_error_input.desc, type(want), type(got), str(got))
        checked += 1
    assert checked > 0


def _run(cls, device, kwargs, steps=5):
    weight, bias_matrix = _params(device)
    inp = torch.randn(5, generator=torch.Generator().manual_seed(1)).to(device)
    opt = cls([weight, bias_matrix], **kwargs)
    start = [weight.detach().clone(), bias_matrix.detach().clone()]

    def closure():
        opt.zero_grad()
        loss = (weight.mv(inp)).pow(2).sum() + (bias_matrix ** 2).sum()
        loss.backward()
        return loss

    first = closure().item()
    for _ in range(steps):
        opt.step(closure)
    last = closure().item()
    return first, last, [(p.detach() - s).double() for p, s in zip([weight, bias_matrix], start)]


@pytest.mark.parametrize("device", DEVICES)
def test_every_input_goes_the_right_direction_and_follows_torch_muon(device):
    for optim_input in _inputs(device):
        kwargs = dict(optim_input.kwargs)
        first, last, moves = _run(orthopt.Muon.torch_like, device, kwargs)
        assert last < first, (optim_input.desc, first, last)
        _, _, want = _run(torch.optim.Muon, device, kwargs)
        for a, b in zip(want, moves):
            if a.norm() == 0:
                assert b.norm() == 0, optim_input.desc
                continue
            assert ((a - b).norm() / a.norm()).item() <= 0.1, optim_input.desc


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_round_trip_steps_on_bit_for_bit(device):
    for optim_input in _inputs(device):
        params = _params(device)
        opt = orthopt.Muon.torch_like(params, **optim_input.kwargs)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        clones = [torch.nn.Parameter(p.detach().clone()) for p in params]
        other = orthopt.Muon.torch_like(clones, **optim_input.kwargs)
        other.load_state_dict(copy.deepcopy(opt.state_dict()))
        for ps in (params, clones):
            for p in ps:
                p.grad = torch.full_like(p, 0.5)
        opt.step()
        other.step()
        for a, b in zip(params, clones):
            assert torch.equal(a, b), optim_input.desc
        assert opt.state_dict()["param_groups"] == other.state_dict()["param_groups"]


def test_deepcopy_copies_all_public_attrs():
    params = _params("cpu")
    opt = orthopt.Muon.torch_like(params, **_inputs("cpu")[0].kwargs)
    public = {k for k in opt.__dict__ if not k.startswith("_")}
    assert public == {k for k in copy.deepcopy(opt).__dict__ if not k.startswith("_")}

"""orthopt's optimizers as torch.optim drop-ins: the checks of PyTorch's test_optim.py that apply
(deepcopy, pickling, errors and their types, state_dict round trips, closures, zero_grad, LR and
momentum schedulers), Muon.torch_like against torch.optim.Muon's algorithm written plainly here,
loading torch.optim.Muon / AdamW checkpoints, signatures and defaults, and import side effects."""
import copy
import inspect
import io
import math
import pickle
import subprocess
import sys

import pytest
import torch

import orthopt
from orthopt import _C

CLASSES = [orthopt.Muon, orthopt.NorMuon, orthopt.Dion3, orthopt.Dion2, orthopt.Dion, orthopt.AdamW, orthopt.Lion]
MATRIX_CLASSES = CLASSES[:5]


def make_params(shapes, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype=dtype, device=device)) for s in shapes]


def set_grads(params, step):
    g = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(dtype=p.dtype, device=p.device)


def build(cls, params, **kw):
    if cls is orthopt.Muon and kw.pop("torch_like", False):
        return cls.torch_like(params, **kw)
    return cls(params, **kw)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ---------------------------------------------------------------- copies

def public_attrs(obj):
    return {k for k in obj.__dict__ if not k.startswith("_")}


@pytest.mark.parametrize("cls", CLASSES)
def test_deepcopy_copies_all_public_attrs_and_steps_like_the_original(cls):
    params = make_params([(6, 10), (10, 6)] if cls in MATRIX_CLASSES else [(7,), (3, 4)], seed=1)
    opt = cls(params)
    for t in range(3):
        set_grads(params, t)
        opt.step()
    twin = copy.deepcopy(opt)
    assert public_attrs(opt) == public_attrs(twin)
    assert twin.defaults == opt.defaults
    twin_params = [p for g in twin.param_groups for p in g["params"]]
    assert all(a is not b and torch.equal(a, b) for a, b in zip(params, twin_params))
    assert twin.step_count == opt.step_count == 3
    for t in range(3, 5):
        set_grads(params, t)
        set_grads(twin_params, t)
        opt.step()
        twin.step()
    for a, b in zip(params, twin_params):
        assert torch.equal(a, b)
        for k in opt.state[a]:
            assert torch.equal(opt.state[a][k], twin.state[b][k]), k


@pytest.mark.parametrize("cls", [orthopt.Muon, orthopt.Dion, orthopt.AdamW])
def test_pickle_round_trip_gives_a_working_optimizer(cls):
    params = make_params([(8, 12)], seed=2)
    opt = cls(params, lr=0.01)
    opt.set_lr_scale(0.5)
    for t in range(2):
        set_grads(params, t)
        opt.step()
    # Pickled together, as a training script does: the optimizer refers to the model's params.
    blob = pickle.dumps((params, opt))
    params2, opt2 = pickle.loads(blob)
    assert opt2.param_groups[0]["params"][0] is params2[0]
    assert opt2.step_count == 2
    for t in range(2, 4):
        set_grads(params, t)
        set_grads(params2, t)
        opt.step()
        opt2.step()
    assert torch.equal(params[0], params2[0])  # the lr scale 0.5 came along too


def test_copies_of_an_optimizer_with_a_scheduler_step_themselves():
    """An LR scheduler patches opt.step with a wrapper bound to opt: a deepcopy or pickle must not
    keep it (the copy would step the original)."""
    params = make_params([(6, 8)], seed=3)
    opt = orthopt.Muon(params, lr=0.02)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for copied in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        twin = copied.param_groups[0]["params"]
        before = params[0].detach().clone()
        set_grads(twin, 0)
        copied.step()
        assert torch.equal(params[0], before) and not torch.equal(twin[0], before)


def test_distributed_optimizer_copy_is_refused_clearly():
    opt = orthopt.Muon(make_params([(4, 4)]))
    opt._dist = object()  # what process_group= sets
    with pytest.raises(TypeError, match="distributed optimizer cannot be copied"):
        copy.deepcopy(opt)
    opt._dist = None


# ---------------------------------------------------------------- errors

def muon_like(**kw):
    return orthopt.Muon.torch_like(make_params([(4, 6)]), **kw)


@pytest.mark.parametrize("kwargs,error,regex", [
    (dict(lr=-1.0), ValueError, "'lr'"),
    (dict(lr=None), TypeError, "'lr'"),
    (dict(lr="fast"), TypeError, "'lr'"),
    (dict(lr=torch.tensor([1e-3, 1e-3])), ValueError, "Tensor lr must be 1-element"),
    (dict(momentum=-0.1), ValueError, "'momentum'"),
    (dict(momentum=1.0), ValueError, "'momentum'"),
    (dict(weight_decay=-0.1), ValueError, "'weight_decay'"),
    (dict(weight_decay=None), TypeError, "'weight_decay'"),
    (dict(ns_steps=0), ValueError, "steps"),
    (dict(ns_steps=100), ValueError, "Number of steps must be less than 100"),
    (dict(ns_steps=2.5), TypeError, "'ns_steps'"),
    (dict(eps=0.0), ValueError, "'ns_eps'"),
    (dict(eps=-1e-7), ValueError, "'ns_eps'"),
    (dict(ns_coefficients=(1.0, 2.0)), ValueError, "exactly 3 values"),
    (dict(adjust_lr_fn="arbitrary"), ValueError, "Adjust learning rate function arbitrary is not supported"),
    (dict(nesterov="yes"), TypeError, "'nesterov'"),
])
def test_torch_like_errors_have_torch_types(kwargs, error, regex):
    with pytest.raises(error, match=regex):
        muon_like(**kwargs)


def test_errors_of_torch_optimizer_base():
    p = make_params([(4, 6)])[0]
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts"):
        orthopt.Muon(p)
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        orthopt.Muon([{"params": [p]}, {"params": [p]}])
    with pytest.raises(ValueError, match="empty parameter list"):
        orthopt.Muon([])
    for shape in [(2, 3, 4), (5,)]:
        with pytest.raises(ValueError, match="Muon only supports 2D parameters"):
            orthopt.Muon.torch_like(make_params([shape]))
        with pytest.raises(ValueError, match="Muon only supports 2D parameters"):
            orthopt.Muon.torch_like([{"params": make_params([shape])}])
    orthopt.Muon.torch_like([{"params": make_params([(5,)]), "algorithm": "adamw"}])  # others: any shape
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts"):
        orthopt.Muon.torch_like(p)
    with pytest.raises(TypeError, match="unknown option"):
        orthopt.Muon([p], momentun=0.9)


@pytest.mark.parametrize("cls,kwargs,error,regex", [
    (orthopt.AdamW, dict(eps=0.0), ValueError, "'eps'.*>= 1e-38"),
    (orthopt.AdamW, dict(betas=(0.9, 1.0)), ValueError, "'beta2'"),
    (orthopt.AdamW, dict(betas=(0.9,)), ValueError, "'betas'"),
    (orthopt.AdamW, dict(betas="fast"), TypeError, "'betas'"),
    (orthopt.AdamW, dict(lr=None), TypeError, "'lr'"),
    (orthopt.NorMuon, dict(normuon_eps=0.0), ValueError, "'normuon_eps'.*>= 1e-19"),
    (orthopt.Dion3, dict(normuon_eps=0.0), ValueError, "'normuon_eps'"),
    (orthopt.Dion3, dict(fraction=0.0), ValueError, "'fraction'"),
    (orthopt.Dion2, dict(fraction=1.5), ValueError, "'fraction'"),
    (orthopt.Dion, dict(eps=0.0), ValueError, "'eps'.*>= 1e-38"),
    (orthopt.Dion, dict(dion_qr="givens"), ValueError, "'dion_qr'"),
    (orthopt.Muon, dict(ns_eps=0.0), ValueError, "'ns_eps'"),
    (orthopt.Muon, dict(lr_adjust="huge"), ValueError, "'lr_adjust'"),
    (orthopt.Muon, dict(method="fast"), ValueError, "'method'"),
    (orthopt.Muon, dict(compute_dtype="bf16"), TypeError, "'compute_dtype'"),
    (orthopt.Muon, dict(momentum=True), TypeError, "'momentum'"),
    (orthopt.Muon, dict(algorithm="sgd"), ValueError, "unknown algorithm"),
])
def test_bad_values_are_value_errors_bad_types_type_errors(cls, kwargs, error, regex):
    shape = (6,) if cls in (orthopt.AdamW, orthopt.Lion) else (6, 8)
    with pytest.raises(error, match=regex):
        cls(make_params([shape]), **kwargs)


@pytest.mark.parametrize("cls,key,smallest", [(orthopt.AdamW, "eps", 1e-38), (orthopt.NorMuon, "normuon_eps", 1e-19),
                                              (orthopt.Dion3, "normuon_eps", 1e-19), (orthopt.Dion, "eps", 1e-38),
                                              (orthopt.Muon, "ns_eps", 1e-38)])
def test_eps_bounds_keep_a_zero_gradient_finite(cls, key, smallest):
    """Why eps has a lower bound: with a zero gradient the formulas are 0/0 at eps = 0 (and at an
    eps that rounds to 0 in fp32, or whose 1/eps² overflows it, NorMuon's). With the smallest eps
    allowed, a zero gradient is a finite step (only the weight decay moves W); below it, ValueError."""
    shape = (5,) if cls is orthopt.AdamW else (5, 7)
    p = make_params([shape])[0]
    w = p.detach().clone()
    opt = cls([p], lr=0.1, weight_decay=0.5, **{key: smallest})
    p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.isfinite(p).all()
    assert torch.allclose(p, w * (1 - 0.1 * 0.5))
    for bad in (0.0, smallest / 10, -smallest, float("nan")):
        with pytest.raises(ValueError, match=f"'{key}'"):
            cls(make_params([shape]), **{key: bad})


def test_meta_parameter_is_a_value_error_naming_params():
    p = torch.nn.Parameter(torch.empty(4, 6, device="meta"))
    with pytest.raises(ValueError, match="meta device .*'params'"):
        orthopt.Muon([p])


@pytest.mark.parametrize("cls", MATRIX_CLASSES)
def test_4d_weight_needs_flatten_or_batched(cls):
    """A conv weight [8, 3, 3, 3] given without flatten would be 24 3x3 matrices: refused."""
    w = make_params([(8, 3, 3, 3)])
    with pytest.raises(ValueError, match="4-D .*flatten=True.*batched=True"):
        cls(w)
    with pytest.raises(ValueError, match="parameter 0 \\('conv.weight'\\) is 4-D"):
        cls([{"params": w, "param_names": ["conv.weight"]}])
    with pytest.raises(ValueError, match="4-D"):
        orthopt.AdamW(make_params([(4,)])).add_param_group({"params": w, "algorithm": cls._algorithm})
    for kw in (dict(flatten=True), dict(batched=True)):
        opt = cls(w, **kw)
        set_grads(w, 0)
        opt.step()
        assert opt.param_groups[0][next(iter(kw))] is True
    cls(make_params([(2, 4, 6)]))  # 3-D: a stack of matrices
    orthopt.Muon([{"params": w, "algorithm": "adamw"}])  # elementwise groups take any shape


def test_bad_value_set_by_a_scheduler_is_refused_at_the_step():
    p = make_params([(6, 8)])
    opt = orthopt.Muon(p)
    opt.param_groups[0]["lr"] = None
    set_grads(p, 0)
    with pytest.raises(TypeError, match="'lr'"):
        opt.step()
    opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ValueError, match="'lr'"):
        opt.step()


# ---------------------------------------------------------------- state dicts, closures, zero_grad

@pytest.mark.parametrize("cls", CLASSES)
def test_state_dict_round_trip_through_torch_save(cls):
    shapes = [(6, 10), (10, 6)] if cls in MATRIX_CLASSES else [(7,), (3, 4)]
    a = make_params(shapes, seed=3)
    opt_a = cls(a)
    for t in range(3):
        set_grads(a, t)
        opt_a.step()
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_b = cls(b, lr=0.5)
    buf.seek(0)
    opt_b.load_state_dict(torch.load(buf))
    assert opt_b.param_groups[0]["lr"] == opt_a.param_groups[0]["lr"]
    for t in range(3, 6):
        set_grads(a, t)
        set_grads(b, t)
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        assert torch.equal(p, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls", CLASSES)
def test_state_dict_with_cuda_params(cls):
    """torch's test: a CPU optimizer's state dict loads into one over CUDA copies of the params,
    without changing the state dict, and both then step alike (the GPU within fp32 noise)."""
    shapes = [(6, 10), (10, 6)] if cls in MATRIX_CLASSES else [(7,), (3, 4)]
    a = make_params(shapes, seed=4)
    kw = dict(compute_dtype=torch.float32, method="standard") if cls in MATRIX_CLASSES and cls is not orthopt.Dion \
        else {}
    opt = cls(a, **kw)
    for t in range(2):
        set_grads(a, t)
        opt.step()
    sd = opt.state_dict()
    sd_copy = copy.deepcopy(sd)
    c = [torch.nn.Parameter(p.detach().clone().cuda()) for p in a]
    opt_c = cls(c, **kw)
    opt_c.load_state_dict(sd_copy)
    for k, v in sd["state"].items():
        for name, t in v.items():
            assert torch.equal(sd_copy["state"][k][name], t)
    for t in range(2, 4):
        set_grads(a, t)
        set_grads(c, t)
        opt.step()
        opt_c.step()
    for p, q in zip(a, c):
        assert rel(q.cpu(), p) < 1e-4


def test_load_state_dict_of_different_groups_raises_value_error():
    a = make_params([(6, 8), (6, 8)], seed=5)
    sd = orthopt.Muon(a).state_dict()
    with pytest.raises(ValueError, match="param groups"):
        orthopt.Muon([{"params": a[:1]}, {"params": a[1:]}]).load_state_dict(sd)
    with pytest.raises(ValueError, match="params"):
        orthopt.Muon(a[:1]).load_state_dict(sd)
    with pytest.raises(ValueError, match="algorithm"):
        orthopt.NorMuon(a).load_state_dict(sd)


def test_step_with_closure_returns_the_loss_and_steps():
    a = make_params([(6, 8)], seed=6)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    x = torch.randn(8, 5)
    opt_a, opt_b = orthopt.Muon(a), orthopt.Muon(b)

    def closure():
        opt_a.zero_grad()
        loss = (a[0] @ x).square().sum()
        loss.backward()
        return loss

    loss = opt_a.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.item() == pytest.approx((b[0] @ x).square().sum().item())
    (b[0] @ x).square().sum().backward()
    opt_b.step()
    assert torch.equal(a[0], b[0])


def test_zero_grad():
    p = make_params([(6, 8)])
    opt = orthopt.Muon(p)
    set_grads(p, 0)
    opt.zero_grad(set_to_none=False)
    assert torch.equal(p[0].grad, torch.zeros(6, 8))
    opt.zero_grad(set_to_none=True)  # torch's own zero_grad (its default differs across versions)
    assert p[0].grad is None
    opt.step()  # no gradient: nothing happens
    assert opt.state.get(p[0]) is None or not opt.state.get(p[0])


# ---------------------------------------------------------------- schedulers

def _twin_run(make_opt, make_sched, key, steps=6):
    """Steps an optimizer driven by a scheduler and a twin whose `key` (lr and momentum or betas) is
    set by hand to the values the scheduler chose: the same params, bit for bit."""
    a = make_params([(6, 8), (8,)], seed=7)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_a, opt_b = make_opt(a), make_opt(b)
    sched = make_sched(opt_a)
    seen = []
    for t in range(steps):
        for g_a, g_b in zip(opt_a.param_groups, opt_b.param_groups):
            g_b["lr"] = g_a["lr"]
            g_b[key] = g_a[key]
        seen.append(opt_a.param_groups[0][key])
        set_grads(a, t)
        set_grads(b, t)
        opt_a.step()
        opt_b.step()
        sched.step()
    assert len(set(map(str, seen))) > 2  # the scheduler did cycle it
    for p, q in zip(a, b):
        assert torch.equal(p, q)
    return a, seen


@pytest.mark.parametrize("cls", [orthopt.Muon, orthopt.NorMuon, orthopt.Dion3, orthopt.Dion2])
def test_one_cycle_lr_cycles_the_momentum_of_matrix_groups(cls):
    def make(ps):
        return cls([{"params": ps[:1]}, {"params": ps[1:], "algorithm": "adamw"}], lr=0.02)

    def sched(opt):
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10, base_momentum=0.8,
                                                   max_momentum=0.95)

    a, seen = _twin_run(make, sched, "momentum")
    assert seen[0] == pytest.approx(0.95)


def test_one_cycle_momentum_reaches_the_engine():
    """The cycled momentum is the one the C++ step uses: a run with OneCycleLR differs from one
    with the momentum left at its start value."""
    def run(cycle):
        p = make_params([(6, 8)], seed=8)
        opt = orthopt.Muon(p, lr=0.02)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10, cycle_momentum=cycle)
        for t in range(4):
            set_grads(p, t)
            opt.step()
            sched.step()
        return p[0].detach()

    assert not torch.equal(run(True), run(False))


def test_one_cycle_lr_cycles_betas_of_adamw():
    def make(ps):
        return orthopt.AdamW(ps, lr=1e-3)

    def sched(opt):
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=10)

    _twin_run(make, sched, "betas")


def test_cyclic_lr_cycles_the_momentum():
    def make(ps):
        return orthopt.Muon([{"params": ps[:1]}, {"params": ps[1:], "algorithm": "adamw"}], lr=0.02)

    def sched(opt):
        return torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.05, step_size_up=3,
                                                 base_momentum=0.8, max_momentum=0.95)

    _twin_run(make, sched, "momentum")


def test_muon_groups_have_momentum_and_no_betas():
    opt = orthopt.Muon([{"params": make_params([(4, 6)])}, {"params": make_params([(6,)]), "algorithm": "adamw"}])
    assert "momentum" in opt.defaults and "betas" not in opt.defaults
    assert "betas" not in opt.param_groups[0]
    assert opt.param_groups[1]["betas"] == tuple(_C.optimizer_option_defaults()["betas"])


# ---------------------------------------------------------------- torch.optim.Muon's behaviour

def torch_muon_reference(params, grads_per_step, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                         coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5, adjust="original",
                         buffers=None, dtype=torch.bfloat16):
    """torch.optim.Muon's algorithm (torch 2.11), written out: EMA momentum, bf16 Newton-Schulz with
    the one triple after X/max(|X|, eps), lr factor sqrt(max(1, A/B)) ('original')."""
    W = [p.detach().clone() for p in params]
    B = buffers or [torch.zeros_like(w) for w in W]
    a, b, c = coefficients
    for grads in grads_per_step:
        for k, G in enumerate(grads):
            B[k] = B[k].lerp(G, 1 - momentum)
            U = G.lerp(B[k], momentum) if nesterov else B[k]
            X = U.to(dtype)
            tall = X.size(0) > X.size(1)
            if tall:
                X = X.T
            X = X / X.norm().clamp(min=eps)
            for _ in range(ns_steps):
                A = X @ X.T
                X = a * X + (b * A + c * A @ A) @ X
            if tall:
                X = X.T
            rows, cols = W[k].shape
            factor = math.sqrt(max(1, rows / cols)) if adjust == "original" else 0.2 * math.sqrt(max(rows, cols))
            W[k] = W[k] * (1 - lr * weight_decay) - lr * factor * X.to(W[k].dtype)
    return W, B


def grads_list(shapes, steps, start=0):
    out = []
    for t in range(start, start + steps):
        g = torch.Generator().manual_seed(1000 + t)
        out.append([torch.randn(s, generator=g) for s in shapes])
    return out


def _run_torch_like(shapes, steps, **kw):
    params = make_params(shapes, seed=9)
    W0 = [p.detach().clone() for p in params]
    opt = orthopt.Muon.torch_like(params, **kw)
    for grads in steps:
        for p, G in zip(params, grads):
            p.grad = G.clone()
        opt.step()
    return opt, [p.detach() for p in params], W0


@pytest.mark.parametrize("adjust", [None, "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_torch_like_is_torch_muons_algorithm(adjust, nesterov):
    """With fp32 Newton-Schulz, torch_like takes exactly the steps of torch.optim.Muon's algorithm
    in fp32: rounding noise of 5 fp32 NS steps (measured 2e-6..4e-6 relative); 2e-5 bounds it."""
    shapes = [(32, 48), (48, 32), (40, 40)]
    steps = grads_list(shapes, 5)
    kw = dict(lr=0.02, weight_decay=0.05, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust)
    _, W, W0 = _run_torch_like(shapes, steps, compute_dtype=torch.float32, **kw)
    ref, _ = torch_muon_reference(W0, steps, lr=0.02, weight_decay=0.05, momentum=0.9, nesterov=nesterov,
                                  adjust=adjust or "original", dtype=torch.float32)
    for w, r, w0 in zip(W, ref, W0):
        assert rel(w - w0, r - w0) < 2e-5


def test_torch_like_computes_in_bf16_like_torch():
    """By default torch_like iterates in bf16 on every device, as torch.optim.Muon does: its steps
    differ from the fp32 algorithm by bf16 rounding (far above fp32 noise), and from torch's bf16
    iteration (which rounds after every operation) by less than twice torch's own distance from fp32."""
    shapes = [(32, 48), (48, 32), (40, 40)]
    steps = grads_list(shapes, 5)
    opt, W, W0 = _run_torch_like(shapes, steps, lr=0.02)
    assert opt.param_groups[0]["compute_dtype"] == torch.bfloat16
    ref16, _ = torch_muon_reference(W0, steps, lr=0.02)
    ref32, _ = torch_muon_reference(W0, steps, lr=0.02, dtype=torch.float32)
    for w, r16, r32, w0 in zip(W, ref16, ref32, W0):
        assert rel(w - w0, r32 - w0) > 1e-4
        assert rel(w - w0, r16 - w0) < 2 * rel(r16 - w0, r32 - w0)


def test_torch_like_signature_is_torch_muons():
    expected = {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
                "ns_coefficients": (3.4445, -4.775, 2.0315), "eps": 1e-7, "ns_steps": 5, "adjust_lr_fn": None}
    if hasattr(torch.optim, "Muon"):
        theirs = inspect.signature(torch.optim.Muon).parameters
        expected = {k: v.default for k, v in theirs.items() if k != "params"}
    ours = inspect.signature(orthopt.Muon.torch_like).parameters
    for name, default in expected.items():
        assert name in ours, name
        assert ours[name].default == default, name


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_torch_like_matches_torch_optim_muon():
    shapes = [(32, 48), (48, 32)]
    a = make_params(shapes, seed=10)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    ours, theirs = orthopt.Muon.torch_like(a, lr=0.02), torch.optim.Muon(b, lr=0.02)
    W0 = [p.detach().clone() for p in a]
    steps = []
    for t in range(5):
        set_grads(a, t)
        set_grads(b, t)
        steps.append([p.grad.clone() for p in a])
        ours.step()
        theirs.step()
    ref32, _ = torch_muon_reference(W0, steps, lr=0.02, dtype=torch.float32)
    for p, q, w, r in zip(a, b, W0, ref32):  # both bf16: the band of the test above
        assert rel(p.detach() - w, q.detach() - w) < 2 * rel(q.detach() - w, r - w)
    ours.load_state_dict(theirs.state_dict())  # torch's checkpoint loads into torch_like


# ---------------------------------------------------------------- foreign checkpoints

def test_load_torch_muon_state_dict_hand_made_in_torch_format():
    """torch 2.11's torch.optim.Muon state dict (built here in its format from the algorithm above):
    loads into Muon.torch_like; the next steps match torch's algorithm from the same state."""
    shapes = [(32, 48), (48, 32)]
    W0 = make_params(shapes, seed=11)
    first = grads_list(shapes, 3)
    W3, B3 = torch_muon_reference(W0, first, lr=0.02, weight_decay=0.05, momentum=0.9, dtype=torch.float32)
    torch_sd = {"state": {i: {"momentum_buffer": B3[i].clone()} for i in range(2)},
                "param_groups": [{"lr": 0.02, "weight_decay": 0.05, "momentum": 0.9, "nesterov": True,
                                  "ns_coefficients": (3.4445, -4.775, 2.0315), "eps": 1e-7, "ns_steps": 5,
                                  "adjust_lr_fn": None, "params": [0, 1]}]}
    params = [torch.nn.Parameter(w.clone()) for w in W3]
    # fp32 iteration on both sides (the bf16 default is tested above); the other hyperparameters
    # come from the checkpoint.
    opt = orthopt.Muon.torch_like(params, compute_dtype=torch.float32)
    opt.load_state_dict(torch_sd)
    g = opt.param_groups[0]
    assert (g["lr"], g["weight_decay"], g["momentum"]) == (0.02, 0.05, 0.9)
    for i, p in enumerate(params):
        assert torch.equal(opt.state[p]["momentum"], B3[i])
    nxt = grads_list(shapes, 3, start=3)
    for grads in nxt:
        for p, G in zip(params, grads):
            p.grad = G.clone()
        opt.step()
    W6, _ = torch_muon_reference(W3, nxt, lr=0.02, weight_decay=0.05, momentum=0.9, buffers=[b.clone() for b in B3],
                                 dtype=torch.float32)
    for p, w, w3 in zip(params, W6, W3):
        assert rel(p.detach() - w3, w - w3) < 2e-5  # fp32 rounding noise, as above


def test_load_torch_adamw_state_dict_then_steps_match():
    shapes = [(12,), (5, 7)]
    a = make_params(shapes, seed=12, dtype=torch.float64)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    theirs = torch.optim.AdamW(a, lr=1e-2, betas=(0.85, 0.97), eps=1e-7, weight_decay=0.05)
    for t in range(3):
        set_grads(a, t)
        theirs.step()
    for p, q in zip(a, b):
        q.data.copy_(p.data)
    ours = orthopt.AdamW(b)
    ours.load_state_dict(theirs.state_dict())
    g = ours.param_groups[0]
    assert (g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"]) == (1e-2, (0.85, 0.97), 1e-7, 0.05)
    for t in range(3, 6):
        set_grads(a, t)
        set_grads(b, t)
        theirs.step()
        ours.step()
    for p, q in zip(a, b):
        assert rel(q.detach(), p.detach()) < 1e-12  # float64 both: rounding order only


def test_foreign_checkpoint_mismatches_are_value_errors_that_say_what():
    p = make_params([(6, 8)])
    adam = torch.optim.AdamW(make_params([(6, 8)]), amsgrad=True)
    with pytest.raises(ValueError, match="torch.optim.AdamW's.*'adamw' group; this group uses 'muon'"):
        orthopt.Muon(p).load_state_dict(adam.state_dict())
    with pytest.raises(ValueError, match="amsgrad=True"):
        orthopt.AdamW(p).load_state_dict(adam.state_dict())
    torch_muon = {"state": {}, "param_groups": [{"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
                                                 "ns_coefficients": (3.4445, -4.775, 2.0315), "eps": 1e-7,
                                                 "ns_steps": 5, "adjust_lr_fn": None, "params": [0]}]}
    with pytest.raises(ValueError, match="momentum_style='accumulate'.*torch_like"):
        orthopt.Muon(p).load_state_dict(torch_muon)
    with pytest.raises(ValueError, match="unrecognized state dict format"):
        orthopt.Muon(p).load_state_dict({"state": {}, "param_groups": [{"lr": 1.0, "params": [0]}]})
    bad_shape = {"state": {0: {"momentum_buffer": torch.zeros(3, 3)}}, "param_groups": torch_muon["param_groups"]}
    with pytest.raises(ValueError, match="state 'momentum' has shape"):
        orthopt.Muon.torch_like(p).load_state_dict(bad_shape)


# ---------------------------------------------------------------- signatures, defaults, docs

def test_defaults_come_from_the_cpp_options():
    cpp = _C.optimizer_option_defaults()
    class_specific = {orthopt.AdamW: {"lr"}, orthopt.Lion: {"lr", "betas", "weight_decay"}}
    for cls in CLASSES:
        sig = inspect.signature(cls.__init__).parameters
        for name, par in sig.items():
            if name in cpp and name not in class_specific.get(cls, ()):
                default = par.default
                expected = cpp[name]
                if isinstance(expected, list):
                    expected = tuple(expected)
                assert default == expected, (cls.__name__, name)
        opt = cls(make_params([(4, 6)] if cls in MATRIX_CLASSES else [(4,)]))
        for k, v in opt.defaults.items():
            if k in cpp and k != "algorithm" and k not in class_specific.get(cls, ()):
                assert v == (tuple(cpp[k]) if isinstance(cpp[k], list) else cpp[k]), (cls.__name__, k)


def test_signatures_and_docstrings_name_every_argument():
    for cls in CLASSES:
        sig = inspect.signature(cls)
        names = [n for n, p in sig.parameters.items() if p.kind != p.VAR_KEYWORD]
        assert names[0] == "params" and "lr" in names and "process_group" in names
        doc = cls.__doc__
        assert "Args:" in doc and "<-" in doc.split("Args:")[0]  # the update rule, then the arguments
        for n in names:
            assert f"{n} (" in doc or f"{n}:" in doc, (cls.__name__, n)
        assert "algorithms.md" not in doc
        assert all(p.annotation is not inspect.Parameter.empty for n, p in sig.parameters.items()
                   if n not in ("process_group", "options")), cls.__name__
    assert "ns_coefficients" in str(inspect.signature(orthopt.Muon.torch_like))


# ---------------------------------------------------------------- import side effects

def test_import_changes_no_thread_count_and_set_num_threads_does():
    code = ("import torch; torch.set_num_threads(3); import orthopt; assert torch.get_num_threads() == 3, "
            "torch.get_num_threads(); assert orthopt.set_num_threads(2) == 2; assert torch.get_num_threads() == 2; "
            "n = orthopt.set_num_threads(); assert n >= 1 and torch.get_num_threads() == n; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "ORTHOPT_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    with pytest.raises(ValueError, match="'n'"):
        orthopt.set_num_threads(0)
    with pytest.raises(TypeError, match="'n'"):
        orthopt.set_num_threads(1.5)

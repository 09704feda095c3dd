"""AdamW's and Lion's fused CPU loops (src/optim/cpu_loops.cpp) against the reference path
(execution kernels=off: ATen operations), which they must equal bit for bit, and against a float64
AdamW / Lion written here, which they must follow to fp32 rounding.

The loops take fp32 contiguous CPU tensors; anything else (bf16 with master weights, a strided
parameter) stays on the reference path, which the plan reports.
"""
import math

import pytest
import torch

import orthopt

CLASSES = [orthopt.AdamW, orthopt.Lion]
# Sizes beyond the loops' grain (32768 elements), so that several threads share a tensor where
# torch has more than one, and small ones.
SHAPES = [(300, 257), (7,), (64, 33), (1,)]
DECAYS = [{"weight_decay": 0.0}, {"weight_decay": 0.1}, {"weight_decay": 0.1, "cautious_weight_decay": True}]


def _bits(t):
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int64)


def _params(seed, shapes=SHAPES, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_(True) for s in shapes]


def _run(cls, execution, options, steps=4, skip_at=(), scale_at=None, dtype=torch.float32, shapes=SHAPES,
         grad_scale=1.0):
    ps = _params(1, shapes, dtype)
    opt = cls(ps, lr=0.003, execution=execution, **options)
    g = torch.Generator().manual_seed(2)
    for k in range(steps):
        for p in ps:
            p.grad = (torch.randn(p.shape, generator=g) * grad_scale).to(dtype)
        opt.set_skip_factor(0.0 if k in skip_at else 1.0)
        if scale_at is not None:
            opt.set_lr_scale(scale_at[k])
        opt.step()
    state = [t.clone() for p in ps for _, t in sorted(opt.state[p].items())]
    return opt, [p.detach().clone() for p in ps], state


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("decay", DECAYS, ids=["no-decay", "decay", "cautious"])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.8, 0.95)])
def test_loops_equal_the_reference_bit_for_bit(cls, decay, betas):
    options = dict(decay, betas=betas)
    fused, want_p, want_s = _run(cls, None, options, skip_at=(2,), scale_at=[1.0, 0.5, 0.5, 0.25])
    reference, got_p, got_s = _run(cls, {"kernels": "off"}, options, skip_at=(2,), scale_at=[1.0, 0.5, 0.5, 0.25])
    assert {b["path"] for b in fused.plan().banks} == {"fused"}
    assert {b["path"] for b in reference.plan().banks} == {"reference"}
    for a, b in zip(want_p + want_s, got_p + got_s):
        assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_loops_equal_the_reference_with_several_threads(cls):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _, one_p, one_s = _run(cls, None, DECAYS[2])
        torch.set_num_threads(3)
        _, three_p, three_s = _run(cls, None, DECAYS[2])
        _, ref_p, ref_s = _run(cls, {"kernels": "off"}, DECAYS[2])
    finally:
        torch.set_num_threads(before)
    for a, b, c in zip(one_p + one_s, three_p + three_s, ref_p + ref_s):
        assert torch.equal(_bits(a), _bits(b)) and torch.equal(_bits(a), _bits(c))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_skipped_steps_leave_everything_as_it_was(cls):
    _, p1, s1 = _run(cls, None, DECAYS[1], steps=2)
    _, p2, s2 = _run(cls, None, DECAYS[1], steps=2, skip_at=(0, 1))
    _, p0, _ = _run(cls, None, DECAYS[1], steps=0)
    for a, b in zip(p2, p0):
        assert torch.equal(_bits(a), _bits(b))
    assert any(not torch.equal(a, b) for a, b in zip(p1, p0))
    assert all(not t.any() for t in s2 if t.dim() > 0)  # moments still zero: nothing committed
    assert all(float(t) == 0 for t in s2 if t.dim() == 0)  # AdamW's step count not advanced
    del s1


def test_non_finite_gradients_propagate_like_the_reference():
    def run(execution):
        ps = _params(3, [(50, 40)])
        opt = orthopt.AdamW(ps, lr=0.01, weight_decay=0.1, cautious_weight_decay=True, execution=execution)
        grad = torch.randn(50, 40, generator=torch.Generator().manual_seed(4))
        grad[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
        ps[0].grad = grad
        opt.step()
        return ps[0].detach(), opt.state[ps[0]]["exp_avg_sq"]
    a, b = run(None), run({"kernels": "off"})
    for x, y in zip(a, b):
        assert torch.equal(_bits(x), _bits(y))
    assert torch.isnan(a[0][0, :3]).all()


def test_other_dtypes_and_layouts_stay_on_the_reference_path():
    bf16 = _params(1, [(8, 8)], torch.bfloat16)
    assert {b["path"] for b in orthopt.AdamW(bf16, lr=0.01).plan().banks} == {"reference"}
    strided = [torch.randn(8, 16)[:, ::2].requires_grad_(True)]
    opt = orthopt.AdamW(strided, lr=0.01)
    assert {b["path"] for b in opt.plan().banks} == {"reference"}
    strided[0].grad = torch.randn(8, 8)
    opt.step()  # takes the reference path and works


def _adamw64(w, grads, lr, betas, eps, wd):
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        d = (m / (1 - betas[0] ** t)) / (v.sqrt() / math.sqrt(1 - betas[1] ** t) + eps)
        w = w * (1 - lr * wd) - lr * d
    return w


def _lion64(w, grads, lr, betas, wd):
    m = torch.zeros_like(w)
    for g in grads:
        d = torch.sign(betas[0] * m + (1 - betas[0]) * g)
        m = betas[1] * m + (1 - betas[1]) * g
        w = w * (1 - lr * wd) - lr * d
    return w


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_loops_follow_a_float64_reference(cls):
    gen = torch.Generator().manual_seed(7)
    w0 = torch.randn(200, 300, generator=gen)
    grads = [torch.randn(200, 300, generator=gen) for _ in range(5)]
    p = w0.clone().requires_grad_(True)
    betas = (0.9, 0.99)
    opt = cls([p], lr=0.01, betas=betas, weight_decay=0.05)
    assert opt.plan().banks[0]["path"] == "fused"
    for g in grads:
        p.grad = g.clone()
        opt.step()
    w64 = w0.double()
    g64 = [g.double() for g in grads]
    want = (_adamw64(w64, g64, 0.01, betas, opt.defaults["eps"], 0.05) if cls is orthopt.AdamW
            else _lion64(w64, g64, 0.01, betas, 0.05))
    # fp32 state and weights: each of the 5 steps rounds the moments and the weight, |w| ~ 1 and
    # the update ~ lr, so the error stays within a few fp32 ulps of 1 (6e-8 each). Lion's sign
    # can flip where its argument is within rounding of zero: those entries differ by 2·lr.
    err = (p.detach().double() - want).abs()
    if cls is orthopt.AdamW:
        assert err.max().item() < 5e-6
    else:
        assert (err > 5e-6).float().mean().item() < 1e-3

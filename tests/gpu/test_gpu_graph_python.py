"""orthopt.CudaGraphOptimizer on the GPU (skipped without CUDA; run tests/gpu/run.sh).

Gate: an eager and a graphed optimizer over identical parameters get identical random
gradients every step; parameters and every state tensor must stay bit-identical
(torch.equal), for a constant and a scheduled lr, with Muon, NorMuon, Dion3, Dion (Householder
QR) and AdamW groups in one optimizer. Bitwise is the right tolerance: a replay runs the same kernels on the same data.
"""
import math

import pytest
import torch

orthopt = pytest.importorskip("orthopt")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPES = {"muon": [(64, 96), (64, 96), (2, 32, 48)], "normuon": [(80, 40)], "dion3": [(96, 64)],
          "dion": [(64, 96), (2, 64, 96)], "adamw": [(96,), (32, 16)]}


def make_optimizer(seed):
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for algorithm, shapes in SHAPES.items():
        params = []
        for shape in shapes:
            p = (0.1 * torch.randn(shape, generator=gen)).cuda().requires_grad_()
            p.grad = torch.zeros_like(p)  # persistent buffers, filled in place
            params.append(p)
        group = {"params": params, "algorithm": algorithm, "weight_decay": 0.05}
        if algorithm == "adamw":
            group["lr"] = 3e-3
        groups.append(group)
    return orthopt.Muon(groups, lr=0.02, cautious_weight_decay=True)


def all_params(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def fill_grads(opts, step):
    gen = torch.Generator().manual_seed(1000 + step)
    for ps in zip(*[all_params(o) for o in opts]):
        g = torch.randn(ps[0].shape, generator=gen).cuda()
        for p in ps:
            if p.grad is not None:
                p.grad.copy_(g)


def first_mismatch(a, b):
    for k, (p, q) in enumerate(zip(all_params(a), all_params(b))):
        if not torch.equal(p, q):
            return f"param {k}"
        sa, sb = a.state.get(p, {}), b.state.get(q, {})
        if sa.keys() != sb.keys():
            return f"param {k} state keys {sorted(sa)} vs {sorted(sb)}"
        for key in sa:
            if not torch.equal(sa[key], sb[key]):
                return f"param {k} state '{key}'"
    return ""


@pytest.mark.parametrize("scheduled", [False, True], ids=["constant_lr", "scheduled_lr"])
def test_replay_bit_identical_to_eager(scheduled):
    eager, opt = make_optimizer(5), make_optimizer(5)
    graphed = orthopt.CudaGraphOptimizer(opt, warmup_steps=3)
    steps = 9
    for t in range(steps):
        if scheduled:
            scale = 0.1 + 0.45 * (1 + math.cos(math.pi * t / steps))
            eager.set_lr_scale(scale)
            graphed.set_lr_scale(scale)
        fill_grads([eager, opt], t)
        before = [p.detach().clone() for p in all_params(eager)]
        eager.step()
        graphed.step()
        assert graphed.captured == (t >= 3)
        assert any(not torch.equal(p, q) for p, q in zip(all_params(eager), before)), "step changed nothing"
        diff = first_mismatch(eager, opt)
        assert diff == "", f"step {t}: graphed differs from eager at {diff}"
    assert graphed.eager_steps == 3
    assert opt.step_count == eager.step_count == steps


def test_lr_scheduler_edit_after_capture_is_refused_then_release_recaptures():
    eager, opt = make_optimizer(6), make_optimizer(6)
    graphed = orthopt.CudaGraphOptimizer(opt, warmup_steps=1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched_eager = torch.optim.lr_scheduler.StepLR(eager, step_size=1, gamma=0.5)
    for t in range(2):
        fill_grads([eager, opt], t)
        eager.step()
        graphed.step()
    assert graphed.captured
    sched.step()  # host-side lr edit: not allowed with a captured graph
    sched_eager.step()
    fill_grads([eager, opt], 2)
    before = [p.detach().clone() for p in all_params(opt)]
    with pytest.raises(RuntimeError, match="set_lr_scale"):
        graphed.step()
    assert all(torch.equal(p, q) for p, q in zip(all_params(opt), before)), "a refused step changed parameters"
    graphed.release()
    for t in range(2, 5):  # one eager step, then a new capture with the halved lr, then a replay
        if t > 2:
            fill_grads([eager, opt], t)
        eager.step()
        graphed.step()
        assert first_mismatch(eager, opt) == ""
    assert graphed.captured


def test_missing_gradient_is_refused():
    opt = make_optimizer(7)
    all_params(opt)[1].grad = None  # trainable, no gradient
    graphed = orthopt.CudaGraphOptimizer(opt, warmup_steps=1)
    fill_grads([opt], 0)
    graphed.step()  # eager warm-up skips it
    with pytest.raises(RuntimeError, match="no gradient"):
        graphed.step()
    assert not graphed.captured


def test_zero_grad_keeps_buffers_and_set_to_none_is_refused():
    opt = make_optimizer(8)
    graphed = orthopt.CudaGraphOptimizer(opt, warmup_steps=1)
    fill_grads([opt], 0)
    graphed.step()
    graphed.step()
    ptrs = [p.grad.data_ptr() for p in all_params(opt)]
    graphed.zero_grad()  # default set_to_none=False
    assert [p.grad.data_ptr() for p in all_params(opt)] == ptrs
    assert all(not p.grad.any() for p in all_params(opt))
    fill_grads([opt], 1)
    graphed.step()
    opt.zero_grad()  # torch's default frees the buffers
    with pytest.raises(RuntimeError, match="(?i)set_to_none=false"):
        graphed.step()


def test_dion_cholesky_reference_path_and_non_orthopt_optimizers_are_refused():
    w = torch.randn(32, 48, device="cuda", requires_grad=True)
    orthopt.CudaGraphOptimizer(orthopt.Dion([w], dion_qr="cholesky"))  # the bank path captures
    with pytest.raises(RuntimeError, match="dion_qr 'cholesky' on the per-parameter reference path"):
        orthopt.CudaGraphOptimizer(orthopt.Dion([w], dion_qr="cholesky", execution={"kernels": "off"}))
    with pytest.raises(TypeError, match="orthopt optimizer"):
        orthopt.CudaGraphOptimizer(torch.optim.SGD([w], lr=0.1))

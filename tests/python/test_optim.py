"""orthopt's torch.optim front ends: parity with plain float64 reference steps, state_dict
round trip, LR schedulers, mixed algorithm groups, routing and bad input."""
import copy
import io
import math

import pytest
import torch

import orthopt

# Float64 params with fp32 orthogonalization (the CPU default): rounding of 5 polar_express
# steps measures 2e-6..6e-6 relative (see tests/cpp/test_optim_muon.cpp); 1e-5 is the bound.
TOL = 1e-5
SHAPES = [(16, 40), (40, 16), (24, 24), (3, 12, 20)]


def ref_newton_schulz(G, schedule="polar_express", steps=5):
    """Standard NS of one matrix in float64 with a built-in schedule's coefficients."""
    s = next(x for x in orthopt.schedules() if x["name"] == schedule)
    tall = G.shape[0] > G.shape[1]
    X = G.T if tall else G
    X = X / (X.norm() * s["safety"] + s["eps"])
    for t in range(steps):
        a, b, c = s["triples"][t] if t < len(s["triples"]) else s["tail"]
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def ref_orthogonalize(U):
    flat = U.reshape(-1, U.shape[-2], U.shape[-1])
    return torch.stack([ref_newton_schulz(m) for m in flat]).reshape(U.shape)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def make_params(shapes, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float32).to(dtype).requires_grad_() for s in shapes]


def grads_for(params, step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) for p in params]


@pytest.mark.parametrize("nesterov,style", [(False, "accumulate"), (True, "accumulate"), (True, "ema")])
def test_muon_matches_float64_reference(nesterov, style):
    params = make_params(SHAPES)
    W0 = [p.detach().clone() for p in params]
    W = [p.detach().clone() for p in params]
    M = [torch.zeros_like(p) for p in params]
    lr, wd, mu = 0.02, 0.1, 0.95
    opt = orthopt.Muon(params, lr=lr, weight_decay=wd, momentum=mu, nesterov=nesterov, momentum_style=style,
                       method="standard")
    for t in range(10):
        for p, G in zip(params, grads_for(params, t)):
            p.grad = G
        for k, G in enumerate(grads_for(params, t)):
            gw = (1 - mu) if style == "ema" else 1.0
            M[k] = mu * M[k] + gw * G
            Uin = gw * G + mu * M[k] if nesterov else M[k]
            U = ref_orthogonalize(Uin)
            adj = math.sqrt(W[k].shape[-2] / W[k].shape[-1])
            W[k] = W[k] * (1 - lr * wd) - lr * adj * U
        opt.step()
        if t in (0, 9):
            for k, p in enumerate(params):
                assert rel(p.detach() - W0[k], W[k] - W0[k]) < TOL, (t, SHAPES[k])


def test_adamw_matches_torch_adamw_and_reference():
    params = make_params([(32,), (12, 7)])
    twins = [p.detach().clone().requires_grad_() for p in params]
    W = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    opt = orthopt.AdamW(params, lr=1e-2, weight_decay=0.1)
    torch_opt = torch.optim.AdamW(twins, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    for t in range(1, 11):
        for p, q, G in zip(params, twins, grads_for(params, t)):
            p.grad, q.grad = G, G.clone()
        for k, G in enumerate(grads_for(params, t)):
            m[k] = 0.9 * m[k] + 0.1 * G
            v[k] = 0.95 * v[k] + 0.05 * G * G
            D = (m[k] / (1 - 0.9 ** t)) / ((v[k] / (1 - 0.95 ** t)).sqrt() + 1e-8)
            W[k] = W[k] * (1 - 1e-2 * 0.1) - 1e-2 * D
        opt.step()
        torch_opt.step()
    for p, q, w in zip(params, twins, W):
        # float64 params: both computed in float64, only rounding order differs.
        assert rel(p.detach(), w) < 1e-12
        assert rel(p.detach(), q.detach()) < 1e-12


def test_mixed_algorithm_groups_and_none_grads():
    mats = make_params([(8, 12), (12, 8)], seed=1)
    vecs = make_params([(12,)], seed=2)
    opt = orthopt.Muon([{"params": mats}, {"params": vecs, "algorithm": "adamw", "lr": 1e-3}], lr=0.02)
    assert opt.param_groups[1]["algorithm"] == "adamw"
    before = mats[1].detach().clone()
    mats[0].grad = torch.randn(8, 12, dtype=torch.float64)
    vecs[0].grad = torch.randn(12, dtype=torch.float64)
    opt.step()
    assert torch.equal(mats[1].detach(), before)  # no grad: skipped
    assert set(opt.state[mats[0]]) == {"momentum"}
    assert set(opt.state[vecs[0]]) == {"exp_avg", "exp_avg_sq", "step"}
    assert mats[1] not in opt.state


def _run(opt_factory, params, steps, start=0, opt=None):
    opt = opt or opt_factory(params)
    for t in range(start, start + steps):
        for p, G in zip(params, grads_for(params, t)):
            p.grad = G
        opt.step()
    return opt


def _expect_round_trip_continues(factory, a, opt_a, steps):
    """opt_a (over params a, `steps` steps taken) saved through torch.save and loaded into a
    fresh optimizer over copies of a: `steps` more steps on both give the same params and state."""
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_b = factory(b)
    buf.seek(0)
    opt_b.load_state_dict(torch.load(buf))
    _run(factory, a, steps, start=steps, opt=opt_a)
    _run(factory, b, steps, start=steps, opt=opt_b)
    for p, q in zip(a, b):
        assert torch.equal(p, q)
        for k in opt_a.state[p]:
            assert torch.equal(opt_a.state[p][k], opt_b.state[q][k]), k


@pytest.mark.parametrize("cls", [orthopt.Muon, orthopt.NorMuon, orthopt.Dion3, orthopt.Dion])
def test_state_dict_round_trip_continues_bit_identically(cls):
    def factory(ps):
        return cls([{"params": ps[:2]}, {"params": ps[2:], "algorithm": "adamw"}], lr=0.02)

    shapes = [(12, 20), (20, 12), (20,)]
    a = make_params(shapes, seed=3, dtype=torch.float32)
    _expect_round_trip_continues(factory, a, _run(factory, a, 3), 3)


@pytest.mark.parametrize("name,keys", [("Dion3", ["momentum"]), ("Dion", ["momentum", "Q"])])
def test_banked_state_is_live_and_round_trips(name, keys):
    """Dion3 and Dion per bank (the GPU default; execution banks=on here) move a bank's momenta
    (and Dion's Q) into one buffer on their first step: opt.state must follow (the live tensors,
    not the pre-move ones), and a state_dict round trip must continue bit-identically."""
    def factory(ps):
        return getattr(orthopt, name)(ps, lr=0.02, execution={"banks": "on"})

    a = make_params([(12, 20), (12, 20), (12, 20)], seed=6, dtype=torch.float32)
    opt_a = _run(factory, a, 2)
    for key in keys:
        for g, p in enumerate(a):
            live = opt_a._cpp.param_state(0, g)[key]
            assert opt_a.state[p][key].data_ptr() == live.data_ptr()
        m0, m2 = opt_a.state[a[0]][key], opt_a.state[a[2]][key]
        assert m2.data_ptr() - m0.data_ptr() == 2 * m0.numel() * m0.element_size()  # one buffer
    before = {key: opt_a.state[a[1]][key].clone() for key in keys}
    _expect_round_trip_continues(factory, a, opt_a, 2)
    for key in keys:
        assert not torch.equal(opt_a.state[a[1]][key], before[key])  # opt.state shows the steps


def test_load_state_dict_mismatch_raises_and_changes_nothing():
    a = make_params([(12, 20)], seed=4, dtype=torch.float32)
    opt_a = _run(lambda ps: orthopt.Muon(ps), a, 1)
    sd = copy.deepcopy(opt_a.state_dict())
    b = make_params([(12, 21)], seed=5, dtype=torch.float32)
    opt_b = _run(lambda ps: orthopt.Muon(ps, lr=0.05), b, 1)
    before = {k: v.clone() for k, v in opt_b.state[b[0]].items()}
    with pytest.raises(ValueError, match="shape"):
        opt_b.load_state_dict(sd)
    assert opt_b.param_groups[0]["lr"] == 0.05
    for k, v in opt_b.state[b[0]].items():
        assert torch.equal(v, before[k])
    c = make_params([(12, 20)], seed=4, dtype=torch.float32)
    with pytest.raises(ValueError, match="algorithm"):
        orthopt.NorMuon(c).load_state_dict(sd)


def test_add_param_group_keeps_state_and_step_count():
    p = make_params([(8, 12)], seed=9)
    opt = orthopt.Muon(p)
    _run(None, p, 2, opt=opt)
    momentum = opt.state[p[0]]["momentum"].clone()
    q = make_params([(5,)], seed=10)
    opt.add_param_group({"params": q, "algorithm": "adamw"})
    assert torch.equal(opt.state[p[0]]["momentum"], momentum)
    live = opt.state[p[0]]["momentum"]
    _run(None, p + q, 1, start=2, opt=opt)
    assert opt.step_count == 3
    assert live is opt.state[p[0]]["momentum"] and not torch.equal(live, momentum)
    assert set(opt.state[q[0]]) == {"exp_avg", "exp_avg_sq", "step"}


def test_lr_scheduler_drives_the_cpp_step():
    a = make_params([(10, 14)], seed=6)
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_a = orthopt.Muon(a, lr=0.02)
    sched = torch.optim.lr_scheduler.LambdaLR(opt_a, lambda step: 0.5 ** (step + 1))
    opt_b = orthopt.Muon(b, lr=0.01)
    for t in range(4):
        for p, q, G in zip(a, b, grads_for(a, t)):
            p.grad, q.grad = G, G.clone()
        opt_b.param_groups[0]["lr"] = 0.02 * 0.5 ** (t + 1)
        opt_a.step()
        opt_b.step()
        sched.step()
        assert rel(a[0].detach(), b[0].detach()) < 1e-14
    assert opt_a.param_groups[0]["lr"] == pytest.approx(0.02 * 0.5 ** 5)


def test_param_groups_routing():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(8, 24)
            self.ln = torch.nn.LayerNorm(8)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb = torch.nn.Embedding(50, 8)
            self.block = Block()
            self.experts = torch.nn.Parameter(torch.randn(4, 16, 8))
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.lm_head = torch.nn.Linear(8, 50, bias=False)

    net = Net()
    groups = orthopt.param_groups(net, algorithm="normuon", matrix={"lr": 0.02})
    # Groups carry only the options routing sets; the rest are the optimizer's defaults.
    by_name = {n: (g["algorithm"], g.get("weight_decay", "default"), g.get("flatten", False)) for g in groups
               for n in g["param_names"]}
    assert by_name["block.qkv.weight"][0] == "normuon"
    assert by_name["experts"][0] == "normuon"
    assert by_name["conv.weight"] == ("normuon", "default", True)
    assert groups[0]["lr"] == 0.02
    assert by_name["block.qkv.bias"] == ("adamw", 0.01, False)
    assert by_name["block.ln.weight"] == ("adamw", 0.01, False)
    assert by_name["tok_emb.weight"] == ("adamw", 0.0, False)
    assert by_name["lm_head.weight"] == ("adamw", 0.0, False)
    opt = orthopt.Muon(groups)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert opt.step_count == 1


def test_param_groups_route_embeddings_and_heads_by_module_type():
    """nn.Embedding weights (any name: GPT-2's position table `transformer.wpe`, here `pos`) and the
    output head (tied to the embedding, or the last nn.Linear with the vocabulary size as
    out_features, any name) go to the no-decay scalar group."""
    class Net(torch.nn.Module):
        def __init__(self, tie):
            super().__init__()
            self.tokens = torch.nn.Embedding(50, 8)
            self.pos = torch.nn.Embedding(16, 8)
            self.proj = torch.nn.Linear(8, 8, bias=False)
            self.readout = torch.nn.Linear(8, 50, bias=False)
            if tie:
                self.readout.weight = self.tokens.weight

    for tie in (False, True):
        groups = orthopt.param_groups(Net(tie))
        by_name = {n: (g["algorithm"], g.get("weight_decay")) for g in groups for n in g["param_names"]}
        assert by_name["tokens.weight"] == ("adamw", 0.0)
        assert by_name["pos.weight"] == ("adamw", 0.0)
        assert by_name["proj.weight"][0] == "muon"
        if not tie:
            assert by_name["readout.weight"] == ("adamw", 0.0)
        else:
            assert "readout.weight" not in by_name  # the same tensor as tokens.weight


def test_param_groups_refuse_undeclared_3d_weights():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stack = torch.nn.Parameter(torch.randn(4, 16, 8))

    with pytest.raises(ValueError, match="'stack' is 3-D .*batch_patterns.*flatten"):
        orthopt.param_groups(Net())
    groups = orthopt.param_groups(Net(), batch_patterns=("stack",))
    assert groups[0]["param_names"] == ["stack"] and not groups[0].get("flatten")
    groups = orthopt.param_groups(Net(), matrix={"flatten": True})
    assert groups[0]["flatten"] is True
    groups = orthopt.param_groups(Net(), overrides=[(r"stack", {"flatten": True})])
    assert groups[0]["flatten"] is True
    opt = orthopt.Muon(groups)
    for q in opt.param_groups[0]["params"]:
        q.grad = torch.randn_like(q)
    opt.step()


def test_gram_aspect_threshold_is_a_group_option():
    """auto takes Gram NS when cols >= threshold·rows: a 64×88 matrix (aspect 1.375) runs standard NS
    under the default 1.5 and Gram NS under 1.3, so a step with 1.3 equals one with method='gram'
    exactly (same code path, same data) and differs from the default's (Gram and standard NS agree
    only to the iteration's rounding and its error, far above fp64 rounding)."""
    def one_step(**opts):
        p = make_params([(64, 88)])
        opt = orthopt.Muon(p, lr=0.02, compute_dtype=torch.float64, **opts)
        for q, g in zip(p, grads_for(p, 0)):
            q.grad = g
        opt.step()
        return p[0].detach().clone()

    default, low, gram = one_step(), one_step(gram_aspect_threshold=1.3), one_step(method="gram")
    assert torch.equal(low, gram)
    assert not torch.equal(low, default)
    assert torch.equal(one_step(gram_aspect_threshold=1.4), default)  # 88 < 1.4·64 = 89.6
    with pytest.raises(ValueError, match="'gram_aspect_threshold'"):
        orthopt.Muon(make_params([(8, 8)]), gram_aspect_threshold=0.5)


def test_dion_cholesky_qr_option():
    """dion_qr="cholesky" gives Householder's updates to fp32 precision (the Q differ only in
    column signs, which P·Qᵀ does not see); an unknown method is refused by name."""
    shapes = [(40, 24), (24, 40), (3, 12, 20)]
    a = make_params(shapes, seed=5, dtype=torch.float32)
    b = [p.detach().clone().requires_grad_() for p in a]
    _run(lambda ps: orthopt.Dion(ps, lr=0.02), a, 5)
    opt = _run(lambda ps: orthopt.Dion(ps, lr=0.02, dion_qr="cholesky"), b, 5)
    assert opt.param_groups[0]["dion_qr"] == "cholesky"
    w0 = make_params(shapes, seed=5, dtype=torch.float32)
    for p, q, w in zip(a, b, w0):
        assert not torch.equal(p, q)
        assert rel(q - w, p - w) < 1e-5
    with pytest.raises(ValueError, match="'dion_qr'"):
        orthopt.Dion(make_params([(8, 8)]), dion_qr="givens")


def test_bad_input_errors():
    """Bad values are ValueError, bad types TypeError (as torch.optim), each naming the option."""
    with pytest.raises(ValueError, match="'algorithm'"):
        orthopt.Muon(make_params([(8,)]))
    with pytest.raises(ValueError, match="'lr'"):
        orthopt.Muon(make_params([(8, 8)]), lr=-1.0)
    with pytest.raises(ValueError, match="'momentum'"):
        orthopt.Muon(make_params([(8, 8)]), momentum=1.0)
    with pytest.raises(ValueError, match="'fraction'"):
        orthopt.Dion3(make_params([(8, 8)]), fraction=0.0)
    with pytest.raises(ValueError, match="unknown algorithm"):
        orthopt.Muon(make_params([(8, 8)]), algorithm="sgd")
    with pytest.raises(TypeError, match="unknown option"):
        orthopt.Muon(make_params([(8, 8)]), momentun=0.9)
    with pytest.raises(ValueError, match="unknown option"):
        orthopt.Muon([{"params": make_params([(8, 8)]), "nesterv": True}])
    with pytest.raises(ValueError, match="split_sizes"):
        orthopt.Muon(make_params([(8, 8)]), split_sizes=[3, 3])
    with pytest.raises(TypeError, match="option 'lr': expected a float, cannot convert <class 'str'>"):
        orthopt.Muon(make_params([(8, 8)]), lr="fast")
    with pytest.raises(TypeError, match="option 'lr': expected a value, got None"):
        orthopt.Muon(make_params([(8, 8)]), lr=None)
    p = make_params([(8, 8)])
    with pytest.raises(ValueError):  # torch itself refuses duplicates across groups
        orthopt.Muon([{"params": p}, {"params": p, "algorithm": "adamw"}])
    # A bad value set by hand (or a scheduler) is refused at the next step.
    opt = orthopt.Muon(p)
    opt.param_groups[0]["lr"] = float("nan")
    p[0].grad = torch.randn(8, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="'lr'"):
        opt.step()
    # A refused group added later leaves the optimizer as it was.
    opt.param_groups[0]["lr"] = 0.01
    with pytest.raises(ValueError, match="'algorithm'"):
        opt.add_param_group({"params": make_params([(5,)])})
    assert len(opt.param_groups) == 1
    opt.step()
    assert opt.step_count == 1


def test_skip_factor_zero_is_bit_identical():
    p = make_params([(12, 16), (16,)], seed=7, dtype=torch.float32)
    opt = orthopt.Muon([{"params": p[:1]}, {"params": p[1:], "algorithm": "adamw"}])
    _run(None, p, 2, opt=opt)
    snap = [x.detach().clone() for x in p] + [t.clone() for x in p for t in opt.state[x].values()]
    opt.set_skip_factor(0.0)
    _run(None, p, 1, start=2, opt=opt)
    after = [x.detach().clone() for x in p] + [t.clone() for x in p for t in opt.state[x].values()]
    assert all(torch.equal(a, b) for a, b in zip(snap, after))
    assert opt.step_count == 2


@pytest.mark.skipif(not (torch.cuda.is_available() and hasattr(torch.optim, "Muon")),
                    reason="needs CUDA and torch.optim.Muon (torch >= 2.9)")
def test_parity_with_torch_optim_muon(capsys):
    """orthopt.Muon.torch_like vs torch.optim.Muon on the GPU (both bf16 NS): 1 and 10 steps."""
    shapes = [(256, 256), (512, 256), (256, 768)]
    a = [p.cuda().detach().requires_grad_() for p in make_params(shapes, seed=8, dtype=torch.float32)]
    b = [p.detach().clone().requires_grad_() for p in a]
    ours = orthopt.Muon.torch_like(a, lr=0.02)
    theirs = torch.optim.Muon(b, lr=0.02)
    W0 = [p.detach().clone() for p in a]
    errs = {}
    for t in range(10):
        for p, q, G in zip(a, b, grads_for(a, t)):
            p.grad, q.grad = G.cuda(), G.cuda()
        ours.step()
        theirs.step()
        if t in (0, 9):
            errs[t + 1] = max(rel(p.detach() - w, q.detach() - w) for p, q, w in zip(a, b, W0))
    with capsys.disabled():
        print(f"\northopt.Muon.torch_like vs torch.optim.Muon ({torch.__version__}, "
              f"{torch.cuda.get_device_name()}): rel diff of displacement 1 step {errs[1]:.3e}, "
              f"10 steps {errs[10]:.3e}")
    # Both iterate in bf16 (unit roundoff 4e-3); differences are rounding noise, ~1e-2.
    assert errs[1] < 5e-2 and errs[10] < 5e-2

"""orthopt.dion: dion's class names, arguments and checkpoints; Dion2 against a plain float64
reference of dion's Dion2 update."""
import inspect
import math

import pytest
import torch

import orthopt
import orthopt.dion as od


def make_params(shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in shapes]


def set_grads(params, step):
    g = torch.Generator().manual_seed(500 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def clone(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


# ---------------------------------------------------------------- Dion2 against a float64 reference

def ref_newton_schulz(X, steps=5):
    """Standard Newton-Schulz with the polar_express coefficients, float64, one matrix."""
    s = next(x for x in orthopt.schedules() if x["name"] == "polar_express")
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / (X.norm() * s["safety"] + s["eps"])
    for t in range(steps):
        a, b, c = s["triples"][t] if t < len(s["triples"]) else s["tail"]
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def ref_dion2_step(W, M, G, lr, wd, mu, fraction):
    """dion's Dion2 on one [rows, cols] matrix: M += G; the k = ceil(f*n) rows (rows <= cols) or
    columns (rows > cols) of largest L1 norm are orthogonalized, decayed by mu in M, and stepped
    with lr*sqrt(rows/cols); the decay lr*wd acts on all of W."""
    M = M + G
    rows, cols = M.shape
    by_cols = rows > cols
    X = M.T.clone() if by_cols else M.clone()
    k = max(1, math.ceil(fraction * X.shape[0]))
    S = X.abs().sum(dim=1).topk(k).indices
    U = ref_newton_schulz(X[S])
    X[S] = mu * X[S]
    D = torch.zeros_like(X)
    D[S] = U
    if by_cols:
        X, D = X.T, D.T
    return W * (1 - lr * wd) - lr * math.sqrt(rows / cols) * D, X


@pytest.mark.parametrize("fraction", [0.25, 0.6])
def test_dion2_matches_float64_reference(fraction):
    shapes = [(16, 40), (40, 16), (24, 24), (3, 12, 20)]
    params = make_params(shapes, seed=1, dtype=torch.float64)
    W = [p.detach().clone() for p in params]
    M = [torch.zeros_like(w) for w in W]
    lr, wd, mu = 0.02, 0.1, 0.9
    opt = orthopt.Dion2(params, lr=lr, weight_decay=wd, momentum=mu, fraction=fraction, method="standard",
                        compute_dtype=torch.float64)
    for t in range(6):
        set_grads(params, t)
        for k, p in enumerate(params):
            G = p.grad
            if G.dim() == 3:
                outs = [ref_dion2_step(W[k][b], M[k][b], G[b], lr, wd, mu, fraction) for b in range(G.shape[0])]
                W[k] = torch.stack([o[0] for o in outs])
                M[k] = torch.stack([o[1] for o in outs])
            else:
                W[k], M[k] = ref_dion2_step(W[k], M[k], G, lr, wd, mu, fraction)
        opt.step()
    for k, p in enumerate(params):
        # float64 on both sides, the same operations up to order: rounding noise ~1e-14, amplified
        # by the 5-step polynomial at most a few hundred times.
        assert torch.allclose(p.detach(), W[k], rtol=0, atol=1e-10), shapes[k]
        assert torch.allclose(opt.state[p]["momentum"], M[k], rtol=0, atol=1e-10), shapes[k]
    assert set(opt.state[params[0]]) == {"momentum"}


def test_dion2_is_not_dion3():
    """Dion3 normalizes the selected rows (NorMuon); Dion2 does not: different steps."""
    a = make_params([(16, 40)], seed=2)
    b = clone(a)
    o2, o3 = orthopt.Dion2(a), orthopt.Dion3(b)
    set_grads(a, 0)
    set_grads(b, 0)
    o2.step()
    o3.step()
    assert not torch.equal(a[0], b[0])


def test_dion2_state_dict_round_trip_and_skip():
    a = make_params([(12, 20), (20, 12)], seed=3)
    opt = orthopt.Dion2(a, lr=0.02)
    for t in range(2):
        set_grads(a, t)
        opt.step()
    b = clone(a)
    opt_b = orthopt.Dion2(b)
    opt_b.load_state_dict(opt.state_dict())
    for t in range(2, 4):
        set_grads(a, t)
        set_grads(b, t)
        opt.step()
        opt_b.step()
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    snap = [p.detach().clone() for p in a] + [opt.state[p]["momentum"].clone() for p in a]
    opt.set_skip_factor(0.0)
    set_grads(a, 9)
    opt.step()
    after = [p.detach().clone() for p in a] + [opt.state[p]["momentum"].clone() for p in a]
    assert all(torch.equal(x, y) for x, y in zip(snap, after))


# ---------------------------------------------------------------- dion's names and signatures

# dion's constructors (microsoft/dion: dion/muon.py, normuon.py, dion2.py, nordion2.py, dion.py).
DION_SIGNATURES = {
    "Muon": ["params", "distributed_mesh", "lr", "mu", "betas", "weight_decay", "cautious_wd", "epsilon", "nesterov",
             "adjust_lr", "flatten", "use_gram_newton_schulz", "use_triton", "use_polar_express", "newton_schulz_func"],
    "NorMuon": ["params", "distributed_mesh", "lr", "mu", "muon_beta2", "betas", "weight_decay", "cautious_wd",
                "epsilon", "nesterov", "adjust_lr", "flatten", "use_gram_newton_schulz", "use_triton",
                "use_polar_express", "newton_schulz_func"],
    "Dion2": ["params", "distributed_mesh", "lr", "fraction", "ef_decay", "betas", "weight_decay", "epsilon",
              "adjust_lr", "flatten", "use_triton", "use_polar_express", "use_gram_newton_schulz",
              "newton_schulz_func", "verbose", "triton_post_ortho", "selection_scope"],
    "NorDion2": ["params", "distributed_mesh", "lr", "fraction", "mu", "muon_beta2", "betas", "weight_decay",
                 "epsilon", "adjust_lr", "flatten", "use_triton", "use_polar_express", "use_gram_newton_schulz",
                 "newton_schulz_func", "triton_post_ortho", "selection_scope"],
    "Dion": ["params", "replicate_mesh", "outer_shard_mesh", "inner_shard_mesh", "replicate_mesh_grad_sync",
             "rank_fraction", "rank_multiple_of", "lr", "mu", "betas", "weight_decay", "epsilon", "power_iters",
             "qr_method", "cqr_warmup_steps", "rcqr_oversample", "mixed_precision_config"],
}


@pytest.mark.parametrize("name", sorted(DION_SIGNATURES))
def test_dion_signatures(name):
    assert list(inspect.signature(getattr(od, name)).parameters) == DION_SIGNATURES[name]
    assert od.Dion3 is od.NorDion2


@pytest.mark.parametrize("name", sorted(DION_SIGNATURES))
def test_dion_classes_step_mixed_groups(name):
    mats, vecs = make_params([(8, 12), (12, 8)], seed=4), make_params([(12,)], seed=5)
    opt = getattr(od, name)([{"params": mats}, {"params": vecs, "algorithm": "adamw"}], lr=0.01)
    set_grads(mats + vecs, 0)
    before = [p.detach().clone() for p in mats + vecs]
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(mats + vecs, before))
    assert opt.param_groups[1]["betas"] == (0.9, 0.95) and opt.param_groups[1]["eps"] == 1e-8
    assert "betas" not in opt.defaults  # so torch's schedulers cycle the momentum


def _same_run(a_factory, b_factory, shapes, steps=3):
    a = make_params(shapes, seed=6)
    b = clone(a)
    oa, ob = a_factory(a), b_factory(b)
    for t in range(steps):
        set_grads(a, t)
        set_grads(b, t)
        oa.step()
        ob.step()
    return all(torch.equal(p, q) for p, q in zip(a, b))


def test_dion_arguments_map_to_orthopt_options():
    shapes = [(10, 14), (14, 10)]
    assert _same_run(lambda ps: od.Muon(ps, lr=0.02, mu=0.9, cautious_wd=True, adjust_lr="rms_norm", nesterov=True),
                     lambda ps: orthopt.Muon(ps, lr=0.02, momentum=0.9, cautious_weight_decay=True,
                                             lr_adjust="rms_norm", nesterov=True, method="standard"), shapes)
    assert _same_run(lambda ps: od.NorMuon(ps, muon_beta2=0.9, epsilon=1e-6, adjust_lr=None),
                     lambda ps: orthopt.NorMuon(ps, normuon_beta2=0.9, normuon_eps=1e-6, lr_adjust="none",
                                                method="standard"), shapes)
    assert _same_run(lambda ps: od.Dion2(ps, fraction=0.5, ef_decay=0.8, use_gram_newton_schulz=True),
                     lambda ps: orthopt.Dion2(ps, fraction=0.5, momentum=0.8, method="gram"), shapes)
    assert _same_run(lambda ps: od.NorDion2(ps, fraction=0.5, mu=0.8, use_polar_express=False),
                     lambda ps: orthopt.Dion3(ps, fraction=0.5, momentum=0.8, method="standard",
                                              schedule=[(3.4445, -4.775, 2.0315)]), shapes)
    assert _same_run(lambda ps: od.Dion(ps, rank_fraction=0.5, mu=0.9, epsilon=1e-6),
                     lambda ps: orthopt.Dion(ps, rank_fraction=0.5, momentum=0.9, eps=1e-6), shapes)
    assert not _same_run(lambda ps: od.Muon(ps, mu=0.9), lambda ps: od.Muon(ps, mu=0.8), shapes)


def test_dion_argument_errors():
    p = make_params([(6, 8)])
    with pytest.raises(ValueError, match="Invalid learning rate"):
        od.Muon(p, lr=-1.0)
    with pytest.raises(ValueError, match="Invalid adjust_lr"):
        od.Muon(p, adjust_lr="jordan")
    with pytest.raises(ValueError, match="newton_schulz_func"):
        od.Muon(p, newton_schulz_func=lambda x, epsilon=None: x)
    with pytest.raises(ValueError, match="fraction must be in"):
        od.Dion2(p, fraction=0.0)
    with pytest.raises(ValueError, match="selection_scope"):
        od.Dion2(p, selection_scope="world")
    with pytest.raises(ValueError, match="outer_shard_mesh"):
        od.Dion(p, outer_shard_mesh=object())
    with pytest.raises(ValueError, match="rank_multiple_of"):
        od.Dion(p, rank_multiple_of=8)
    od.Dion(p, mixed_precision_config=od.DionMixedPrecisionConfig(Q_dtype=torch.float32))
    with pytest.raises(ValueError, match="momentum_dtype=torch.bfloat16"):
        od.Dion(p, mixed_precision_config=od.DionMixedPrecisionConfig(momentum_dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="'distributed_mesh'"):
        od.Muon(p, distributed_mesh="world")

    class Mesh2D:
        ndim = 2

        def get_group(self):
            raise AssertionError("not called")

    with pytest.raises(ValueError, match="2-D DeviceMesh"):
        od.Muon(p, distributed_mesh=Mesh2D())


def test_one_dimensional_mesh_becomes_the_process_group():
    marker = object()

    class Mesh1D:
        ndim = 1

        def get_group(self):
            return marker

    assert od._process_group(Mesh1D(), "distributed_mesh") is marker
    assert od._process_group(None, "distributed_mesh") is None


# ---------------------------------------------------------------- dion checkpoints

def _as_dion_state_dict(opt, dion_algorithm, matrix_keys):
    """opt's state dict rewritten in dion's format (dion's group keys and state names)."""
    sd = opt.state_dict()
    groups = []
    for g in sd["param_groups"]:
        if g["algorithm"] == "adamw":
            groups.append(dict(params=g["params"], algorithm="adamw", lr=g["lr"], beta1=g["betas"][0],
                               beta2=g["betas"][1], weight_decay=g["weight_decay"], epsilon=g["eps"], step=3))
        else:
            d = dict(params=g["params"], algorithm=dion_algorithm, lr=g["lr"], weight_decay=g["weight_decay"],
                     beta1=0.9, beta2=0.95, epsilon=g.get("normuon_eps", 1e-8), flatten=g["flatten"],
                     adjust_lr=None if g["lr_adjust"] == "none" else g["lr_adjust"], step=3)
            d.update({dk: g[ok] for dk, ok in matrix_keys.items()})
            groups.append(d)
    state = {}
    for pid, st in sd["state"].items():
        if "exp_avg" in st:
            state[pid] = {"momentum": st["exp_avg"], "variance": st["exp_avg_sq"], "step_dev": st["step"]}
        else:
            state[pid] = {("variance_neuron" if k == "variance" else k): v for k, v in st.items()}
    return {"state": state, "param_groups": groups}


@pytest.mark.parametrize("name,dion_algorithm,matrix_keys", [
    ("Muon", "muon", {"mu": "momentum", "nesterov": "nesterov", "cautious_wd": "cautious_weight_decay"}),
    ("NorMuon", "normuon", {"mu": "momentum", "muon_beta2": "normuon_beta2", "nesterov": "nesterov",
                            "cautious_wd": "cautious_weight_decay"}),
    ("Dion2", "dion2", {"ef_decay": "momentum", "fraction": "fraction"}),
    ("NorDion2", "nordion2", {"mu": "momentum", "fraction": "fraction", "muon_beta2": "normuon_beta2"}),
])
def test_dion_checkpoint_loads_and_continues_bit_identically(name, dion_algorithm, matrix_keys):
    cls = getattr(od, name)
    a = make_params([(10, 14), (14, 10), (14,)], seed=7)
    opt_a = cls([{"params": a[:2]}, {"params": a[2:], "algorithm": "adamw"}], lr=0.02)
    for t in range(3):
        set_grads(a, t)
        opt_a.step()
    dion_sd = _as_dion_state_dict(opt_a, dion_algorithm, matrix_keys)
    b = clone(a)
    opt_b = cls([{"params": b[:2]}, {"params": b[2:], "algorithm": "adamw"}], lr=0.5)
    opt_b.load_state_dict(dion_sd)
    assert opt_b.param_groups[0]["lr"] == 0.02
    for t in range(3, 6):
        set_grads(a, t)
        set_grads(b, t)
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        assert torch.equal(p, q)


def test_dion_checkpoint_of_another_algorithm_is_refused():
    a = make_params([(10, 14)], seed=8)
    opt = od.NorMuon(a)
    sd = _as_dion_state_dict(opt, "normuon", {"mu": "momentum"})
    with pytest.raises(ValueError, match="dion's 'normuon' group.*this group uses 'muon'"):
        od.Muon(clone(a)).load_state_dict(sd)

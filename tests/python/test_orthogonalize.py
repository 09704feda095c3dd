"""orthopt.orthogonalize / orthopt.schedules from Python (algorithms.md §1).

Numerical checks compare against `reference_ns`, a plain float64 Newton–Schulz written here from
algorithms.md (own normalization, own coefficient tables, own transposition of tall inputs); it
never calls orthopt.
"""
import math
import os
import subprocess
import sys

import pytest
import torch

import orthopt

# ----------------------------------------------------------------------------------------------
# The independent reference.

PAPER_RAW = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
]


def divided(t, d):
    a, b, c = t
    return (a / d, b / d**3, c / d**5)


# name -> (triples, tail, safety, eps); the tail is used for steps beyond the table.
REFERENCE_SCHEDULES = {
    "jordan": ([(3.4445, -4.7750, 2.0315)], (3.4445, -4.7750, 2.0315), 1.0, 1e-7),
    "you": (
        [
            (4.0848, -6.8946, 2.9270),
            (3.9505, -6.3029, 2.6377),
            (3.7418, -5.5913, 2.3037),
            (2.8769, -3.1427, 1.2046),
            (2.8366, -3.0525, 1.2012),
        ],
        (2.8366, -3.0525, 1.2012),
        1.0,
        1e-7,
    ),
    "polar_express": (
        [
            (8.156554524902461, -22.48329292557795, 15.878769915207462),
            (4.042929935166739, -2.808917465908714, 0.5000178451051316),
            (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
            (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
            (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
        ],
        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
        1.02,
        1e-6,
    ),
    "polar_express_paper": ([divided(t, 1.01) for t in PAPER_RAW], (1.875, -1.25, 0.375), 1.01, 1e-7),
    "gram": ([divided(t, 1.05) for t in PAPER_RAW[:5]], divided(PAPER_RAW[4], 1.05), 1.0, 1e-7),
}

# Custom triples: odd quintics with p(1) = 1; custom schedules default to safety 1, eps 1e-7.
CUSTOM = [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]
REFERENCE_SCHEDULES_WITH_CUSTOM = dict(REFERENCE_SCHEDULES, custom=(CUSTOM, CUSTOM[-1], 1.0, 1e-7))


def reference_matrix(G, schedule, steps):
    triples, tail, safety, eps = schedule
    X = G.to(torch.float64)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / (X.norm() * safety + eps)
    for t in range(steps):
        a, b, c = triples[t] if t < len(triples) else tail
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def reference_ns(G, name, steps=5):
    schedule = REFERENCE_SCHEDULES_WITH_CUSTOM[name]
    flat = G.reshape(-1, G.shape[-2], G.shape[-1])
    return torch.stack([reference_matrix(g, schedule, steps) for g in flat]).reshape(G.shape)


# ----------------------------------------------------------------------------------------------
# Inputs and measures.


def spread_matrix(m, n, lo=1e-3, hi=1.0, gen=None):
    """U·diag(s)·Vᵀ in float64 with s log-spaced in [lo, hi]."""
    k = min(m, n)
    U, _ = torch.linalg.qr(torch.randn(m, k, dtype=torch.float64, generator=gen))
    V, _ = torch.linalg.qr(torch.randn(n, k, dtype=torch.float64, generator=gen))
    s = torch.logspace(math.log10(lo), math.log10(hi), k, dtype=torch.float64)
    return (U * s) @ V.T


def spread(shape, lo=1e-3, hi=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    *batch, m, n = shape
    count = math.prod(batch)
    return torch.stack([spread_matrix(m, n, lo, hi, gen) for _ in range(count)]).reshape(shape)


def rel_err(a, b):
    a, b = a.to(torch.float64), b.to(torch.float64)
    return ((a - b).norm() / b.norm()).item()


# ----------------------------------------------------------------------------------------------
# schedules()


def test_schedules_contents_match_algorithms_table():
    got = orthopt.schedules()
    assert [s["name"] for s in got] == list(REFERENCE_SCHEDULES)
    for s in got:
        triples, tail, safety, eps = REFERENCE_SCHEDULES[s["name"]]
        assert set(s) >= {"name", "triples", "tail", "safety", "eps"}
        assert len(s["triples"]) == len(triples)
        for have, want in zip(list(s["triples"]) + [s["tail"]], triples + [tail]):
            assert have == pytest.approx(want, rel=1e-14, abs=0)
        assert s["safety"] == safety
        assert s["eps"] == eps


# ----------------------------------------------------------------------------------------------
# Values vs the float64 reference.


@pytest.mark.parametrize("name", list(REFERENCE_SCHEDULES_WITH_CUSTOM))
@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (48, 48), (3, 24, 40)])
def test_matches_float64_reference(name, shape):
    G = spread(shape).to(torch.float32)
    schedule = CUSTOM if name == "custom" else name
    out = orthopt.orthogonalize(G, schedule=schedule, method="standard", compute_dtype=torch.float32)
    assert out.shape == G.shape and out.dtype == G.dtype
    # fp32 compute: rounding ~6e-8 amplified by the iteration; measured <= 5e-6.
    assert rel_err(out, reference_ns(G, name)) < 1e-4
    # Gram NS in fp32 is less accurate (works on X·Xᵀ); the contract's bound is 1e-3.
    gram = orthopt.orthogonalize(G, schedule=schedule, method="gram", compute_dtype=torch.float32)
    assert rel_err(gram, reference_ns(G, name)) < 1e-3


def test_default_arguments_are_polar_express_five_steps():
    G = spread((32, 64)).to(torch.float32)
    # Default method auto picks Gram for cols >= 1.5·rows; fp32 on the CPU.
    assert rel_err(orthopt.orthogonalize(G), reference_ns(G, "polar_express", 5)) < 1e-3
    standard = orthopt.orthogonalize(G, method="standard")
    assert rel_err(standard, reference_ns(G, "polar_express", 5)) < 1e-4
    assert rel_err(standard, reference_ns(G, "jordan", 5)) > 1e-2  # the check can tell schedules apart


def test_steps_beyond_table_use_tail():
    G = spread((32, 96), lo=1e-5)
    out = orthopt.orthogonalize(G, schedule="polar_express_paper", steps=10, method="standard",
                                compute_dtype=torch.float64)
    assert rel_err(out, reference_ns(G, "polar_express_paper", 10)) < 1e-10  # float64 rounding only


def test_gram_equals_standard_float64_and_restarts_kwarg():
    G = spread((2, 32, 128))
    std = orthopt.orthogonalize(G, method="standard", compute_dtype=torch.float64)
    for restarts in [(2,), (), (1, 3), [2]]:
        gram = orthopt.orthogonalize(G, method="gram", compute_dtype=torch.float64, restarts=restarts)
        assert rel_err(gram, std) < 1e-10


def test_fp16_gram_restart_beats_no_restart():
    # Same bound and measurement as the C++ test (see docs/orthogonalization.md).
    G = spread((2, 64, 256)).to(torch.float32)
    ref = reference_ns(G, "gram")
    with_restart = rel_err(orthopt.orthogonalize(G, schedule="gram", method="gram", compute_dtype=torch.float16), ref)
    without = rel_err(orthopt.orthogonalize(G, schedule="gram", method="gram", compute_dtype=torch.float16,
                                            restarts=[]), ref)
    assert with_restart < 0.06
    assert with_restart < without


def test_fp16_gram_without_restart_warns_once_per_process():
    # A fresh interpreter: the warning is issued once per process, and another test here may
    # already have issued it. Two calls without a restart, one float32 and one with the default
    # restart: the text appears exactly once (torch's handler: a Python warning, or stderr).
    code = (
        "import warnings, torch, orthopt\n"
        "warnings.simplefilter('always')\n"
        "G = torch.randn(2, 32, 96)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    for kw in [dict(compute_dtype=torch.float16, restarts=[]),\n"
        "               dict(compute_dtype=torch.float16, restarts=[]),\n"
        "               dict(compute_dtype=torch.float32, restarts=[]),\n"
        "               dict(compute_dtype=torch.float16)]:\n"
        "        orthopt.orthogonalize(G, method='gram', **kw)\n"
        "for w in caught: print('PYWARNING', w.message)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    text = r.stdout + r.stderr
    assert text.count("without restarts ('gram_restarts' is empty") == 1, text


def test_split_sizes_and_flatten():
    G = spread((96, 128)).to(torch.float32)
    out = orthopt.orthogonalize(G, split_sizes=[64, 16, 16], method="standard")
    want = torch.cat([reference_ns(b, "polar_express") for b in G.split([64, 16, 16], dim=0)])
    assert rel_err(out, want) < 1e-4
    W = spread((16, 36)).to(torch.float32).reshape(16, 4, 3, 3)
    flat = orthopt.orthogonalize(W, flatten=True, method="standard")
    assert flat.shape == W.shape
    assert rel_err(flat.reshape(16, 36), reference_ns(W.reshape(16, 36), "polar_express")) < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_returns_input_dtype(dtype):
    G = spread((24, 48)).to(dtype)
    out = orthopt.orthogonalize(G)
    assert out.dtype == dtype and out.shape == G.shape
    # The reference sees the same rounded input; what remains is fp32 compute plus one rounding
    # of the output to bf16 (8 significant bits, 2^-9 ≈ 2e-3) or fp16 (2^-12 ≈ 2.4e-4).
    assert rel_err(out, reference_ns(G, "polar_express")) < (5e-3 if dtype == torch.bfloat16 else 1e-3)


def test_zero_matrix_gives_zeros():
    out = orthopt.orthogonalize(torch.zeros(16, 48))
    assert torch.equal(out, torch.zeros(16, 48))


def test_nonfinite_policy():
    G = spread((2, 16, 40)).to(torch.float32)
    G[1, 3, 5] = float("nan")
    with pytest.raises(RuntimeError, match="argument 'G'"):
        orthopt.orthogonalize(G)
    out = orthopt.orthogonalize(G, nonfinite="propagate")
    assert torch.isnan(out[1]).all()  # the bad matrix is all NaN
    assert torch.isfinite(out[0]).all()  # its neighbour is untouched


# ----------------------------------------------------------------------------------------------
# Errors name the argument.


@pytest.mark.parametrize(
    "G, kwargs, argument",
    [
        (torch.tensor(1.0), {}, "G"),
        (torch.randn(8), {}, "G"),
        (torch.randn(0, 8), {}, "G"),
        (torch.ones(8, 16, dtype=torch.int64), {}, "G"),
        (torch.ones(8, 16, dtype=torch.bool), {}, "G"),
        (torch.randn(8, 16), {"schedule": "nope"}, "schedule"),
        (torch.randn(8, 16), {"schedule": []}, "schedule"),
        (torch.randn(8, 16), {"schedule": [(1.0, 2.0)]}, "schedule"),
        (torch.randn(8, 16), {"steps": 0}, "steps"),
        (torch.randn(8, 16), {"steps": 101}, "steps"),
        (torch.randn(8, 16), {"restarts": [5]}, "restarts"),
        (torch.randn(8, 16), {"restarts": [-1]}, "restarts"),
        (torch.randn(8, 16), {"split_sizes": [4, 3]}, "split_sizes"),
        (torch.randn(8, 16), {"method": "fast"}, "method"),
        (torch.randn(8, 16), {"compute_dtype": torch.int32}, "compute_dtype"),
        (torch.randn(8, 16), {"compute_dtype": "float16"}, "compute_dtype"),
        (torch.randn(8, 16), {"nonfinite": "ignore"}, "nonfinite"),
        (torch.randn(8, 16), {"safety": -1.0}, "safety"),
        (torch.randn(8, 16), {"eps": -1.0}, "eps"),
    ],
)
def test_bad_input_names_the_argument(G, kwargs, argument):
    with pytest.raises((RuntimeError, ValueError), match=f"argument '{argument}'"):
        orthopt.orthogonalize(G, **kwargs)


# ----------------------------------------------------------------------------------------------
# Magnitudes: the polar factor does not depend on the scale of G, so finite inputs far outside
# the range where the fp32 sum of squares is finite (|x| beyond about 1.8e19) or normal must give
# the same result as the unscaled matrix. Compared with the float64 reference of the unscaled
# input (eps / ‖G‖ is below 1e-6 relative there, far inside the 1e-4 of fp32 compute).


def reference_scale_free(G):
    """reference_ns without eps: X/‖X‖ is what X/(‖X‖·safety + eps) tends to as ‖X‖ grows."""
    triples, tail, safety, _ = REFERENCE_SCHEDULES["polar_express"]
    return torch.stack([reference_matrix(g, (triples, tail, safety, 0.0), 5)
                        for g in G.reshape(-1, G.shape[-2], G.shape[-1])]).reshape(G.shape)


@pytest.mark.parametrize("scale", [1e20, 1e30, 2.0**120])
@pytest.mark.parametrize("shape", [(2, 3), (3, 2), (24, 40), (2, 16, 16)])
def test_huge_finite_input_gives_the_unscaled_result(shape, scale):
    gen = torch.Generator().manual_seed(7)
    G = torch.randn(*shape, generator=gen, dtype=torch.float64)
    big = (G * scale).to(torch.float32)
    assert torch.isfinite(big).all()
    want = reference_scale_free(G)
    out = orthopt.orthogonalize(big, method="standard", compute_dtype=torch.float32)
    assert torch.isfinite(out).all()
    assert rel_err(out, want) < 1e-4  # fp32 compute, as test_matches_float64_reference
    # The default method too: as for the unscaled input (which differs by the fp32 rounding of G).
    assert rel_err(orthopt.orthogonalize(big), orthopt.orthogonalize(G.to(torch.float32))) < 1e-4


def test_fp64_input_beyond_the_fp32_range():
    gen = torch.Generator().manual_seed(8)
    G = torch.randn(20, 12, generator=gen, dtype=torch.float64)
    for compute in (None, torch.float64):
        out = orthopt.orthogonalize(G * 1e300, compute_dtype=compute)
        assert torch.isfinite(out).all()
        # fp32 compute: as above; fp64 compute: float64 rounding only.
        assert rel_err(out, reference_scale_free(G)) < (1e-4 if compute is None else 1e-10)


def test_muon_step_on_a_huge_gradient_moves_the_weights():
    # A gradient of 1e20 used to orthogonalize to zeros: the step silently made no update.
    gen = torch.Generator().manual_seed(9)
    g = torch.randn(16, 24, generator=gen)
    updates = []
    for grad in (g, g * 1e20):
        p = torch.nn.Parameter(torch.zeros(16, 24))
        opt = orthopt.Muon([p], lr=0.1, weight_decay=0.0)
        p.grad = grad.clone()
        opt.step()
        updates.append(p.detach().clone())
    assert updates[0].abs().max() > 0
    # The same update up to fp32 NS rounding (the inputs differ only in eps's share, 1e-6/‖g‖).
    assert rel_err(updates[1], updates[0]) < 1e-4


def test_meta_tensor_is_refused_naming_the_argument():
    with pytest.raises((ValueError, TypeError), match="argument 'G': meta tensors are not supported"):
        orthopt.orthogonalize(torch.empty(8, 16, device="meta"))

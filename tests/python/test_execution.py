"""ExecutionOptions from Python: the `execution` argument of every optimizer and of
orthopt.orthogonalize, its errors, and opt.plan().

On the CPU every execution choice but `banks` concerns CUDA paths only, and `banks` is documented
to give the same bits on the CPU: a step with any choice must equal the default step bit for bit.
That is the matrix below (each algorithm x each field x on/off); the GPU suite
(tests/gpu/test_gpu_fused.cpp) runs the same comparison where the paths differ.
"""
import pytest
import torch

import orthopt
from orthopt import _C

FIELDS = ["kernels", "banks", "fused_ns_input", "fold_update", "gram_own_layout", "side_streams",
          "gram_transposed_result", "direct_result"]
CLASSES = [orthopt.Muon, orthopt.NorMuon, orthopt.Dion3, orthopt.Dion2, orthopt.Dion, orthopt.AdamW, orthopt.Lion]
# Matrices of several shapes (two of one shape make a bank of two, a 3-D stack one of three), and
# vectors for the scalar optimizers.
MATRIX_SHAPES = [(16, 24), (16, 24), (40, 12), (3, 8, 8)]
VECTOR_SHAPES = [(24,), (7,)]


def _params(cls, seed):
    g = torch.Generator().manual_seed(seed)
    shapes = VECTOR_SHAPES if cls in (orthopt.AdamW, orthopt.Lion) else MATRIX_SHAPES
    return [torch.randn(s, generator=g).requires_grad_(True) for s in shapes]


def _steps(cls, execution, steps=3):
    ps = _params(cls, 1)
    opt = cls(ps, lr=0.01, weight_decay=0.1, execution=execution)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    state = [t.clone() for p in ps for _, t in sorted(opt.state[p].items())]
    return [p.detach().clone() for p in ps], state


def _bits(t):
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int64)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", ["on", "off"])
def test_every_choice_gives_the_default_bits_on_cpu(cls, field, value):
    want_p, want_s = _steps(cls, None)
    got_p, got_s = _steps(cls, {field: value})
    for a, b in zip(want_p + want_s, got_p + got_s):
        assert torch.equal(_bits(a), _bits(b))


def test_string_form_equals_dict_form():
    a = _steps(orthopt.Dion3, {"banks": "on", "kernels": "off"})
    b = _steps(orthopt.Dion3, "banks=on,kernels=off")
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        assert torch.equal(x, y)


@pytest.mark.parametrize("bad,error,match", [
    ({"bankz": "on"}, ValueError, "unknown field 'bankz'"),
    ({"bankz": "yes"}, ValueError, "unknown field 'bankz'"),
    ({"banks": "yes"}, ValueError, "field 'banks' must be auto, on or off"),
    ({"banks": True}, TypeError, "execution"),
    ("banks", ValueError, "expected field=value"),
    (3, TypeError, "expected None, a str or a dict"),
])
def test_bad_execution_is_refused_naming_it(bad, error, match):
    p = [torch.randn(4, 6, requires_grad=True)]
    with pytest.raises(error, match=match):
        orthopt.Muon(p, execution=bad)
    with pytest.raises(error, match=match):
        orthopt.orthogonalize(torch.randn(4, 6), execution=bad)


def test_orthogonalize_execution_same_bits_on_cpu():
    G = torch.randn(3, 20, 12, generator=torch.Generator().manual_seed(5))
    want = orthopt.orthogonalize(G)
    for field in FIELDS:
        for value in ("on", "off"):
            assert torch.equal(orthopt.orthogonalize(G, execution={field: value}), want)


def test_execution_is_a_group_option_with_a_none_default():
    assert _C.optimizer_option_defaults()["execution"] is None
    p = [torch.randn(4, 6, requires_grad=True)]
    opt = orthopt.Muon(p, execution={"banks": "on"})
    assert opt.param_groups[0]["execution"] == {"banks": "on"}
    assert "execution" in orthopt.Muon.__doc__ and "execution" in orthopt.AdamW.__doc__


def test_plan_lists_every_bank_with_its_path():
    ps = [torch.randn(16, 24, requires_grad=True), torch.randn(16, 24, requires_grad=True),
          torch.randn(40, 12, requires_grad=True), torch.randn(24, requires_grad=True)]
    def groups():  # fresh dicts: torch.optim fills the defaults into the dicts it is given
        return [{"params": ps[:3]}, {"params": ps[3:], "algorithm": "adamw"}]

    plan = orthopt.NorMuon(groups()).plan()
    assert plan.device == "cpu" and plan.execution == "auto"
    by_shape = {(b["group"], b["rows"], b["cols"]): b for b in plan.banks}
    assert set(by_shape) == {(0, 16, 24), (0, 40, 12), (1, 0, 0)}
    assert by_shape[(0, 16, 24)]["matrices"] == 2 and by_shape[(0, 16, 24)]["params"] == [0, 1]
    assert by_shape[(0, 40, 12)]["layout"] == "transposed (tall)"
    assert by_shape[(1, 0, 0)]["numel"] == 24 and by_shape[(1, 0, 0)]["algorithm"] == "adamw"
    # The CPU default: NorMuon per matrix, AdamW's fp32 vector in the CPU loop; with banks on,
    # NorMuon per bank.
    assert [b["path"] for b in plan.banks if b["group"] == 0] == ["reference", "reference"]
    assert by_shape[(1, 0, 0)]["path"] == "fused" and by_shape[(1, 0, 0)]["kernels"] == ["adamw"]
    banked = orthopt.NorMuon(groups(), execution="banks=on").plan()
    assert [b["path"] for b in banked.banks if b["group"] == 0] == ["banked", "banked"]
    assert banked.execution == "banks=on"
    # 24/16 = 1.5 reaches the default gram_aspect_threshold: Gram NS; 40x12 (tall, 3.3) too.
    assert by_shape[(0, 16, 24)]["ns_method"] == "gram" and by_shape[(0, 40, 12)]["ns_method"] == "gram"
    # The estimate covers at least the first Gram product X·Xᵀ of each matrix (2·m²·n FLOPs).
    assert by_shape[(0, 16, 24)]["flops"] >= 2 * (2 * 16 * 16 * 24)
    assert plan.flops == pytest.approx(sum(b["flops"] for b in plan.banks))
    text = str(plan)
    assert "normuon" in text and "adamw" in text and "total:" in text

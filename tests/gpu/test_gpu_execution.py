"""ExecutionOptions on a GPU: every algorithm x every field x on/off against the default plan, the
way PyTorch's optimizer tests run fused against foreach against the for-loop (the CPU matrix,
where every choice gives the default's bits, is tests/python/test_execution.py).

On CUDA the paths differ in rounding only. Two fields are documented to give the same bits
(docs/execution.md: `fused_ns_input`, `side_streams`) and are compared bit for bit. The others are
compared by the parameters' displacement after three steps, relative to the default's: the matrix
optimizers' paths differ by the bf16/fp16 rounding of their Newton–Schulz products (2e-4..3e-3
between paths of one product chain, test_gpu_ortho.cpp; up to the NS error itself, several 1e-2,
between the kernels and ATen's products, whose roundings differ at every product), so 0.1 keeps a
margin while a missing, doubled or sign-flipped update differs by 1 or more; AdamW's paths are
fp32 elementwise (1e-5); Lion's sign can flip where its argument is within rounding of zero (1e-2).
Skipped without CUDA.
"""
import pytest
import torch

orthopt = pytest.importorskip("orthopt")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FIELDS = ["kernels", "banks", "fused_ns_input", "fold_update", "gram_own_layout", "side_streams",
          "gram_transposed_result", "direct_result"]
SAME_BITS = {"fused_ns_input", "side_streams"}
CLASSES = [orthopt.Muon, orthopt.NorMuon, orthopt.Dion3, orthopt.Dion2, orthopt.Dion, orthopt.AdamW, orthopt.Lion]
BOUND = {orthopt.AdamW: 1e-5, orthopt.Lion: 1e-2}
# Two matrices of one shape (a bank of two), a tall one (Gram NS in its own layout or transposed),
# a 3-D stack, and vectors for the scalar optimizers; sizes multiples of 64 so that the kernels take
# them.
MATRIX_SHAPES = [(256, 384), (256, 384), (512, 128), (3, 128, 128)]
VECTOR_SHAPES = [(4096,), (300,)]


def _steps(cls, execution, steps=3):
    g = torch.Generator().manual_seed(1)
    shapes = VECTOR_SHAPES if cls in (orthopt.AdamW, orthopt.Lion) else MATRIX_SHAPES
    ps = [torch.randn(s, generator=g).cuda().requires_grad_(True) for s in shapes]
    before = [p.detach().clone() for p in ps]
    opt = cls(ps, lr=0.01, weight_decay=0.1, execution=execution)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).cuda()
        opt.step()
    torch.cuda.synchronize()
    return [(p.detach() - b).double() for p, b in zip(ps, before)], [p.detach().clone() for p in ps]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", ["on", "off"])
def test_every_choice_matches_the_default_on_cuda(cls, field, value):
    want_moves, want = _steps(cls, None)
    got_moves, got = _steps(cls, {field: value})
    if field in SAME_BITS:
        for a, b in zip(want, got):
            assert torch.equal(a, b)
        return
    bound = BOUND.get(cls, 0.1)
    for a, b in zip(want_moves, got_moves):
        assert torch.isfinite(b).all()
        rel = ((a - b).norm() / a.norm()).item()
        assert rel <= bound, (field, value, rel)

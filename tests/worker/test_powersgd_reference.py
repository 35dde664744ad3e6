"""PowerSGD against a direct transcription of the paper's algorithm (one leader, several steps).

Vogels et al. 2019, Algorithm 1 (one power iteration, warm-started ``Q``) with error feedback
(Algorithm 2): ``M = G + E``, ``P = M Q``, orthonormalise ``P``, ``Q = M^T P``, output ``P Q^T``,
``E = M - P Q^T``.  The codec computes the same products in another order and keeps ``M`` in the
error buffer; this checks it still computes exactly that, step after step.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hetero_worker.speed.powersgd import PowerSGDCompression, compressible


@pytest.fixture()
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _reference(steps: list[list[torch.Tensor]], rank: int, seed: int) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [t.shape for t in steps[0]]
    qs = {}
    for i, shape in enumerate(shapes):  # the codec's initial Q: same generator, same order
        if compressible(shape, rank):
            n, m = shape[0], shape.numel() // shape[0]
            qs[i] = torch.linalg.qr(torch.randn(m, min(rank, n, m), generator=gen))[0]
    errors = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    outs = []
    for grads in steps:
        out = []
        for i, g in enumerate(grads):
            if i not in qs:
                out.append(g.clone())
                continue
            mat = (g.double() + errors[i]).reshape(g.shape[0], -1)
            p = torch.linalg.qr(mat @ qs[i].double())[0]
            q = mat.T @ p
            approx = p @ q.T
            errors[i] = (mat - approx).reshape(g.shape)
            qs[i] = q.float()
            out.append(approx.reshape(g.shape).float())
        outs.append(out)
    return outs


@pytest.mark.parametrize(("rank", "factored"), [
    (1, [True, False, True, True]),  # (4, 48) as factors only at rank 1: (4 + 48) * 1 < 192
    (4, [True, False, False, True]),
    (16, [True, False, False, False]),  # 16 x 27 kernel: (16 + 27) * 16 > 432, sent as is
])
def test_powersgd_equals_the_papers_algorithm_step_after_step(one_rank_group, rank, factored) -> None:
    gen = torch.Generator().manual_seed(7)
    shapes = [(64, 48), (48,), (4, 48), (16, 3, 3, 3)]  # matrix, bias, too thin, conv kernel
    steps = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(6)]
    codec = PowerSGDCompression(rank=rank, seed=3)
    got = []
    for grads in steps:
        tensors = [g.clone() for g in grads]
        codec.allreduce_(tensors, None)
        got.append(tensors)
    want = _reference(steps, rank, seed=3)
    for step, (g_step, w_step) in enumerate(zip(got, want, strict=True)):
        for i, (g, w) in enumerate(zip(g_step, w_step, strict=True)):
            assert torch.allclose(g, w, rtol=1e-4, atol=1e-4), (step, i, (g - w).abs().max())
    assert [q is not None for q in codec.qs] == factored
    # the compressed output is not the gradient itself (a test that cannot fail is a defect)
    assert not torch.allclose(got[0][0], steps[0][0], atol=1e-2)


def test_powersgd_leaves_the_exact_tail_and_plain_tensors_exact(one_rank_group) -> None:
    codec = PowerSGDCompression(rank=2, seed=0)
    bias = torch.arange(5, dtype=torch.float32)
    weight = torch.randn(32, 32, generator=torch.Generator().manual_seed(1))
    exact = torch.tensor([1.5, -2.0])
    codec.allreduce_([weight, bias.clone()], None, exact=exact)
    tensors = [weight.clone(), bias.clone()]
    codec.allreduce_(tensors, None, exact=exact)
    assert torch.equal(tensors[1], bias) and torch.equal(exact, torch.tensor([1.5, -2.0]))

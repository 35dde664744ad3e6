"""Work stealing on one process: autocast and loss scaler are applied, everything stays on the
parameters' device and dtype; the flatten -> reduce -> copy back helper."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import copy_back_, flat_reduce_, flatten
from hetero_worker.speed.stealing import MicroBatchDispenser, steal_step


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _data():
    g = torch.Generator().manual_seed(4)
    return (torch.randn(12, 3, generator=g, dtype=torch.float64),
            torch.randn(12, 1, generator=g, dtype=torch.float64))


def test_steal_step_runs_forward_under_the_ranks_autocast(one_rank):
    model = torch.nn.Linear(3, 1)  # float32 parameters, bf16 compute under autocast
    x, y = _data()
    out_dtypes = []

    def compute(lo, hi):
        out = model(x[lo:hi].float())
        out_dtypes.append(out.dtype)
        return ((out.float() - y[lo:hi].float()) ** 2).sum()

    disp = MicroBatchDispenser(store=dist.HashStore(), global_batch=12, micro_batch=5)
    res = steal_step(step=0, dispenser=disp, params=list(model.parameters()), compute=compute,
                     autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert out_dtypes == [torch.bfloat16] * 3 and res.total_samples == 12
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_steal_step_scales_each_loss_before_backward(one_rank):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1).double()
    x, y = _data()

    def compute(lo, hi):
        return ((model(x[lo:hi]) - y[lo:hi]) ** 2).sum()

    disp = MicroBatchDispenser(store=dist.HashStore(), global_batch=12, micro_batch=5)
    res = steal_step(step=0, dispenser=disp, params=list(model.parameters()), compute=compute,
                     scale=lambda loss: loss * 8.0)
    assert res.taken == (0, 1, 2) and res.total_samples == 12
    scaled = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss = ((model(x) - y) ** 2).sum()
    (loss / 12).backward()  # reference: mean gradient, unscaled
    for got, ref in zip(scaled, [p.grad for p in model.parameters()]):
        assert torch.allclose(got, 8.0 * ref, rtol=0, atol=1e-12)
    assert res.loss_sum == pytest.approx(loss.item(), rel=1e-12)  # the unscaled loss


def test_counts_ride_in_the_gradients_dtype_and_device(one_rank):
    model = torch.nn.Linear(3, 1)  # float32
    x, y = _data()
    seen = []

    def allreduce(tensors):
        seen.extend((t.dtype, t.device.type) for t in tensors)
        flat_reduce_(tensors, dist.all_reduce)

    disp = MicroBatchDispenser(store=dist.HashStore(), global_batch=12, micro_batch=12)
    res = steal_step(step=0, dispenser=disp, params=list(model.parameters()),
                     compute=lambda lo, hi: ((model(x[lo:hi].float()) - y[lo:hi].float()) ** 2).sum(),
                     allreduce=allreduce)
    assert seen == [(torch.float32, "cpu")] * 3 and res.total_samples == 12


def test_flat_reduce_copies_back_with_dtype_conversion():
    a = torch.arange(6, dtype=torch.float32).view(2, 3)
    b = torch.tensor([0.5, 1.5], dtype=torch.float64)
    flat = flat_reduce_([a, b], lambda t: t.mul_(2), dtype=torch.float64)
    assert flat.dtype == torch.float64 and flat.tolist() == [0, 2, 4, 6, 8, 10, 1, 3]
    assert a.tolist() == [[0, 2, 4], [6, 8, 10]] and a.dtype == torch.float32
    assert b.tolist() == [1.0, 3.0]


def test_copy_back_ignores_appended_bookkeeping():
    a, b = torch.zeros(2), torch.zeros(3)
    copy_back_(torch.arange(7.0), [a, b])  # two extra elements at the end (e.g. stats)
    assert a.tolist() == [0, 1] and b.tolist() == [2, 3, 4]
    assert flatten([a, b]).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="nothing to flatten"):
        flatten([])

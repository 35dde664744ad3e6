"""A rank that takes no micro-batch of a step under fp16 (the others drained it first) still steps
its loss scaler with everyone (issue 21, found by the feature matrix's fp16 x stealing row): a
GradScaler creates its scale on its first ``scale()``, and ``unscale_`` before that raised."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hetero_worker.precision import AgreeingGradScaler
from hetero_worker.speed.stealing import MicroBatchDispenser, steal_step


@pytest.fixture()
def one_rank():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield store
    dist.destroy_process_group()


def test_a_rank_that_took_nothing_can_unscale_and_step(one_rank) -> None:
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = AgreeingGradScaler("cpu")
    disp = MicroBatchDispenser(store=one_rank, global_batch=8, micro_batch=4, prefix="t")
    one_rank.add("t/0", disp.num_micro_batches)  # the other ranks took every micro-batch
    result = steal_step(step=0, dispenser=disp, params=list(model.parameters()),
                        compute=lambda lo, hi: model(torch.ones(hi - lo, 3)).sum(), scale=scaler.scale)
    assert result.taken == () and result.total_samples == 0
    scaler.unscale_(opt)  # raised "Attempted unscale_ but _scale is None" before
    scaler.step(opt)
    scaler.update()
    assert not scaler.last_found_inf

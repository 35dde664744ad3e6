"""Single-process checks of the step-overhead cuts of issue 11 (no process group needed).

* ``WeightedGradSync.watch_backward``: one final callback per backward marks "compute done"
  after every parameter's gradient was accumulated (it replaced a hook per parameter).
* ``trainer.BatchedTensors``: a ``TensorDataset`` fetched a batch at a time gives exactly what
  ``DataLoader``'s default per-sample fetch and ``default_collate`` give.
"""

from __future__ import annotations

import time

import torch

from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.sampler import BatchedTensors, as_fetched


def _bare_sync() -> WeightedGradSync:
    sync = WeightedGradSync.__new__(WeightedGradSync)  # no process groups: only the timing part
    sync.last_ready_s = 0.0
    return sync


def test_watch_backward_marks_after_the_last_gradient() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    accumulated: list[float] = []
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(lambda _p: accumulated.append(time.perf_counter()))
    sync = _bare_sync()
    loss = model(torch.randn(4, 5)).pow(2).mean() * 3.0
    sync.watch_backward(loss)
    before = time.perf_counter()
    loss.backward()
    after = time.perf_counter()
    assert len(accumulated) == 4  # every parameter's gradient, then the mark
    assert max(accumulated) <= sync.last_ready_s <= after
    assert sync.last_ready_s >= before


def test_watch_backward_fires_once_per_backward_and_skips_constants() -> None:
    sync = _bare_sync()
    w = torch.ones(3, requires_grad=True)
    marks = []
    for _ in range(3):
        loss = (w * 2).sum()
        sync.watch_backward(loss)
        loss.backward()
        marks.append(sync.last_ready_s)
    assert marks[0] < marks[1] < marks[2]
    sync.last_ready_s = 0.0
    sync.watch_backward(torch.ones(2).sum())  # no graph: nothing registered, no error
    assert sync.last_ready_s == 0.0


def test_batched_tensors_equal_the_default_fetch_and_collate() -> None:
    g = torch.Generator().manual_seed(3)
    dataset = torch.utils.data.TensorDataset(torch.randn(40, 6, generator=g),
                                             torch.randint(0, 10, (40,), generator=g),
                                             torch.arange(40, dtype=torch.float64))
    batches = [[7, 3, 39, 0], [5], [12, 11, 10, 9, 8, 30]]
    default = list(torch.utils.data.DataLoader(dataset, batch_sampler=batches))
    batched = list(torch.utils.data.DataLoader(BatchedTensors(dataset), batch_sampler=batches,
                                               collate_fn=as_fetched))
    assert len(default) == len(batched) == 3
    for ours, theirs in zip(batched, default, strict=True):
        assert type(ours) is type(theirs) is list
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous()
            assert torch.equal(a, b)
    assert len(BatchedTensors(dataset)) == 40
    assert torch.equal(BatchedTensors(dataset)[5][0], dataset[5][0])

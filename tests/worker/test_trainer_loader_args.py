"""``Trainer.loader``'s DataLoader arguments: ``pin_memory`` passes through; what cannot keep the
split and the checkpoint position exact is refused, naming why (issue 22, point 12)."""

from __future__ import annotations

import pytest
import torch

from hetero_worker.trainer import Trainer


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from range(3)


def test_num_workers_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"^Trainer.loader\(num_workers=2\): must be 0. Workers "
                                         r"fetch batches ahead of training"):
        Trainer.loader(object(), torch.utils.data.TensorDataset(torch.zeros(4, 1)), num_workers=2)


def test_an_iterable_dataset_is_refused_with_the_reason():
    with pytest.raises(TypeError, match=r"^Trainer.loader\(_Stream\): needs a map-style dataset"):
        Trainer.loader(object(), _Stream())


def test_pin_memory_reaches_the_data_loader():
    from types import SimpleNamespace
    totals: list[int] = []
    fake = SimpleNamespace(local_batches=[2, 2], rank=0, seed=0, max_steps=None,
                           metrics=SimpleNamespace(set_total_steps=totals.append))
    data = torch.utils.data.TensorDataset(torch.zeros(8, 1))
    loader = Trainer.loader(fake, data, pin_memory=True, epochs=3)
    assert (loader.pin_memory, loader.num_workers, totals) == (True, 0, [6])  # 3 x 8 // 4

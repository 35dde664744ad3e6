"""train_ddp.py ported to HeteroTrain: the lines marked ``# HT`` changed (docs/torchrun.md).

Each rank now takes the planned share of ``spec.training.globalBatchSize`` (its HTJ_TOPOLOGY entry),
the epoch is covered exactly once with those uneven batches, and the gradients are weighted by
``local_batch / global_batch`` so one step equals a step on the whole global batch.
"""

import os

import torch
import torch.nn.functional as F

from hetero_worker import trainer as ht  # HT


def dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return torch.utils.data.TensorDataset(x, x @ w + 0.1 * torch.randn(2048, 1, generator=g))


def main():
    t = ht.init(seed=0)  # HT: process group, groups per GPU type, metrics (was init_process_group)
    model = t.wrap(torch.nn.Linear(16, 1))  # HT: DDP with the weighted gradient hook (was DDP(...))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = t.loader(dataset())  # HT: this rank's planned batch (was DistributedSampler + batch_size=32)
    while t.epoch < int(os.environ.get("EPOCHS", "2")):  # HT: the loader advances t.epoch
        for x, y in loader:
            result = t.step(opt, lambda m: F.mse_loss(m(t.to_device(x)), t.to_device(y)))  # HT: one step
    if t.rank == 0:
        print(f"final loss {result.loss:.4f}")
    t.close()  # HT: flush statistics, leave the group (was destroy_process_group)


if __name__ == "__main__":
    main()

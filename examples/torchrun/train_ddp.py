"""A typical torchrun DDP script, unchanged: ``torchrun --nproc-per-node 4 train_ddp.py``.

Runs as a HeteroTrainingJob worker too (the job's env has torchrun's RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, LOCAL_RANK), but then every rank takes its own fixed batch of 32 and DDP
averages the ranks' gradients equally: no heterogeneous balancing happens, and ``heterotrain run``
says so. docs/torchrun.md shows the port (train_hetero.py beside this file).
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(2048, 1, generator=g))


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = dataset()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    for epoch in range(int(os.environ.get("EPOCHS", "2"))):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
    if dist.get_rank() == 0:
        print(f"final loss {loss.item():.4f}")
    # Leave together, and keep the barrier's Work object until the interpreter ends. With torch
    # 2.13's Gloo the barrier's worker thread otherwise may drop the last reference after the main
    # thread began finalising Python; its destructor needs the GIL then, and the process aborts
    # ("terminate called without an active exception", exit 134; 3 of 30 runs here).
    _LEFT.append(dist.barrier(async_op=True))
    _LEFT[-1].wait()
    dist.destroy_process_group()


_LEFT = []

if __name__ == "__main__":
    main()

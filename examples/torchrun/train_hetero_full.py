"""train_ddp_full.py ported to HeteroTrain: the lines marked ``# HT`` changed (docs/torchrun.md).

The Trainer does what the plain script did by hand: the device of the rank, AMP and the loss
scaler for the GPU's precision, the sampler, the DDP wrapper (with gradients weighted by each
rank's share of the global batch), and checkpoints that a restarted or resized job resumes from.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset  # HT: the sampler and DataLoader are the Trainer's

from hetero_worker import trainer as ht  # HT
from heterotrain_common.rundir import write_result  # HT


def dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, (x @ w).argmax(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    t = ht.init(seed=0)  # HT: process group, this rank's device (t.device), groups per GPU type
    model = t.wrap(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))  # HT: on t.device, weighted DDP
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = t.loader(dataset(4096, seed=1))  # HT: this rank's planned batch, each sample once per epoch
    t.resume(opt)  # HT: continue from the job's last checkpoint (none at the first start)
    while t.epoch < args.epochs:  # HT: the loader advances t.epoch
        for x, y in loader:
            result = t.step(opt, lambda m: F.cross_entropy(m(t.to_device(x)), t.to_device(y)))  # HT: autocast, scaler, step
            if t.rank == 0 and t.global_step % 20 == 0:  # HT: t.rank, t.global_step
                print(f"epoch {t.epoch} step {t.global_step} loss {result.loss:.4f}", flush=True)  # HT: result.loss
            t.maybe_checkpoint(opt)  # HT: model, optimizer, data position (was torch.save of model.module)
    if t.rank == 0:  # HT
        t.module.eval()  # HT: t.module is the unwrapped model (was model.module)
        xs, ys = dataset(1024, seed=2).tensors
        with torch.no_grad():
            acc = (t.module(t.to_device(xs)).argmax(1) == t.to_device(ys)).float().mean().item()  # HT
        print(f"held-out accuracy {acc:.3f}", flush=True)
        write_result({"accuracy": acc})  # HT: heterotrain run / status show it
    t.close()  # HT: flush statistics, leave the group (was barrier + destroy_process_group)


if __name__ == "__main__":
    main()

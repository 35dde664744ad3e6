"""Run inside each rank process by tests/worker/test_microbatch.py; writes ``<out>/rank<R>.json``.

``accumulate`` (also under ``HTJ_SHARDING=group``): two SGD steps (float64, a 6->5->3 MLP) through ``Trainer.step(batch=...)`` with the
rank's uneven local batch in micro-batches of ``HTJ_MICRO_BATCH_SIZE``; records the largest
difference to one process on the whole global batch, the rank's memory peak and cap.
"""

from __future__ import annotations

import argparse
import sys

import torch

from hetero_worker import trainer as ht
from rank_main import run_and_write

STEPS = 2


def make_mlp() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 3)).double()


def make_data(total: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return (torch.randn(total, 6, generator=g, dtype=torch.float64),
            torch.randn(total, 3, generator=g, dtype=torch.float64))


def reference(batches: list[int]) -> list[torch.Tensor]:
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    big = sum(batches)
    x, y = make_data(big * STEPS)
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[s * big:(s + 1) * big]), y[s * big:(s + 1) * big]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def accumulate(t: ht.Trainer) -> dict:
    batches = list(t.contract.local_batches)
    model = t.wrap(make_mlp(), block=torch.nn.Linear)  # under HTJ_SHARDING=group: one FSDP2 unit each
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    big, off = sum(batches), sum(batches[:t.rank])
    x, y = make_data(big * STEPS)
    losses = []
    for s in range(STEPS):
        lo = s * big + off
        xb, yb = x[lo:lo + batches[t.rank]], y[lo:lo + batches[t.rank]]
        r = t.step(opt, lambda m, xm, ym: torch.nn.functional.mse_loss(m(xm), ym), batch=(xb, yb))
        losses.append(r.loss)
    ref = reference(batches)
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in t.module.parameters()]
    diff = max((p.detach() - q).abs().max().item() for p, q in zip(full, ref, strict=True))
    held = [p.to_local() if hasattr(p, "to_local") else p for p in t.module.parameters()]
    return {"diff": diff, "losses": losses,
            "peak": t.memory.peak_bytes if t.memory else None,
            "activation_peak": t.memory.peak_activation_bytes if t.memory else None,
            "cap": t.contract.memory.cap_bytes, "micro": t.contract.memory.micro_batch_size,
            "held_numel": sum(p.numel() for p in held), "full_numel": sum(p.numel() for p in full),
            "inter_group_bytes": t.metrics.stats().get("inter_group_bytes")}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    return run_and_write(accumulate, args.out)


if __name__ == "__main__":
    sys.exit(main())

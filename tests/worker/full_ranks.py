"""Run inside each rank process by tests/worker/test_full_sharding.py; writes ``<out>/rank<R>.json``.

``HTJ_SHARDING=full``: two SGD-with-momentum steps (float64) of a small residual net (a root
``Linear`` in and out, two ``Block`` units) through ``Trainer.step(batch=...)`` with the rank's
uneven local batch in micro-batches of ``HTJ_MICRO_BATCH_SIZE``; records the largest difference
of the parameters (gathered) and of this rank's gradient slice to one process on the whole global
batch, what the rank holds, and its memory peak and cap.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from hetero_worker import trainer as ht
from rank_main import run_and_write

STEPS = 2


class Block(nn.Module):
    """A residual unit: 6 -> 6 Linear, LayerNorm, tanh (54 parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return x + scale * torch.tanh(self.norm(self.lin(x)))


class Net(nn.Module):
    """Root: ``inp`` 5 -> 6 and ``head`` 6 -> 3 (57 parameters); two blocks (108)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 6)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, scale=0.5)
        return self.head(h)


def make_net() -> nn.Module:
    torch.manual_seed(7)
    return Net().double()


def make_data(total: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return (torch.randn(total, 5, generator=g, dtype=torch.float64),
            torch.randn(total, 3, generator=g, dtype=torch.float64))


def make_opt(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)  # type: ignore[arg-type]


def reference(batches: list[int]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One process, the whole global batch per step: (parameters, last step's gradients)."""
    model = make_net()
    opt = make_opt(model.parameters())
    big = sum(batches)
    x, y = make_data(big * STEPS)
    for s in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(x[s * big:(s + 1) * big]), y[s * big:(s + 1) * big]).backward()
        opt.step()
    return ({n: p.detach().clone() for n, p in model.named_parameters()},
            {n: p.grad.clone() for n, p in model.named_parameters()})


def run_full(t: ht.Trainer) -> dict:
    batches = list(t.contract.local_batches)
    model = t.wrap(make_net(), block=Block)
    opt = make_opt(model.parameters())
    big, off = sum(batches), sum(batches[:t.rank])
    x, y = make_data(big * STEPS)
    for s in range(STEPS):
        lo = s * big + off
        xb, yb = x[lo:lo + batches[t.rank]], y[lo:lo + batches[t.rank]]
        t.step(opt, lambda m, xm, ym: nn.functional.mse_loss(m(xm), ym), batch=(xb, yb))
    ref_params, ref_grads = reference(batches)
    full = t.full_state_dict()
    param_diff = max((full[n] - ref_params[n]).abs().max().item() for n in ref_params)
    grad_diff = 0.0
    for unit in t.shard_sync.units:
        flat = torch.cat([ref_grads[n].reshape(-1) for n in unit.names])
        lo = unit.offsets[t.rank]
        want = flat[lo:lo + unit.sizes[t.rank]]
        grad_diff = max(grad_diff, (unit.shard.grad - want).abs().max().item() if want.numel() else 0.0)
    with torch.no_grad():  # every rank: the sharded forward gathers
        eval_diff = (model(x[:4]) - reference_model(ref_params)(x[:4])).abs().max().item()
    return {"param_diff": param_diff, "grad_diff": grad_diff, "eval_diff": eval_diff,
            "names": sorted(full), "unit_sizes": [u.sizes for u in t.shard_sync.units],
            "held_numel": sum(p.numel() for p in model.parameters()),
            "state_bytes": t.memory.state_bytes if t.memory else None,
            "peak": t.memory.peak_bytes if t.memory else None,
            "cap": t.contract.memory.cap_bytes,
            "inter_group_bytes": t.shard_sync.inter_group_bytes_total}


def reference_model(params: dict[str, torch.Tensor]) -> nn.Module:
    model = make_net()
    model.load_state_dict(params, strict=False)
    return model


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    return run_and_write(run_full, args.out)


if __name__ == "__main__":
    sys.exit(main())

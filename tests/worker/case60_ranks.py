"""Run inside each rank process by tests/worker/test_clipping.py (shared/cases/60).

``python case60_ranks.py API OUT``: the case's residual MLP (two ``Block`` units of 6 -> 10 -> 6 with
a residual, a 6 -> 2 head) in float64 under the real Trainer and the contract's ``HTJ_SHARDING``,
SGD lr 0.1, gradients clipped to the global norm 0.05, 3 steps of ``t.step(..., batch=(x, y))``;
step s's 12 samples come from seed 6000+s and rank r takes its slice of the split. ``API``:

* ``trainer``: ``ht.init(max_grad_norm=0.05)`` (the step clips after the sync and the unscale);
* ``hook``: an optimizer step pre-hook calls ``t.clip_grad_norm_(0.05)``, and first records the
  norm the stock ``torch.nn.utils.clip_grad_norm_`` would see on this rank (its own gradients).

Writes ``OUT/rank<R>.json``: the global norm each step clipped with, the rank's own ("local")
norms, the full parameters after the last step, the loss scale (None without a scaler).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from case_runs import finish

from hetero_worker import trainer as ht

STEPS = 3
GLOBAL_BATCH = 12
MAX_NORM = 0.05
LR = 0.1


class Block(nn.Module):
    """The case's residual unit: ``x + fc2(tanh(fc1(x)))``, width 6, hidden 10."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 10)
        self.fc2 = nn.Linear(10, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Net(nn.Module):
    """Two blocks and a 6 -> 2 head (the head is the root unit under Full sharding)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_net() -> nn.Module:
    """The case's model, seeded 60, float64."""
    torch.manual_seed(60)
    return Net().double()


def step_data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of step ``step`` (0-based)."""
    g = torch.Generator().manual_seed(6000 + step)
    return (torch.randn(GLOBAL_BATCH, 6, generator=g, dtype=torch.float64),
            torch.randn(GLOBAL_BATCH, 2, generator=g, dtype=torch.float64))


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


def own_norm(params: Any) -> float:
    """What the stock ``clip_grad_norm_`` sees on this rank: the norm of the gradients it holds."""
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
             for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads])))


def full_params(t: ht.Trainer) -> dict[str, list]:
    """The full parameters by their original names (collective under Group and Full)."""
    out = {}
    for name, value in t.full_state_dict().items():
        if hasattr(value, "full_tensor"):  # Group sharding: DTensor shards
            value = value.full_tensor()
        out[name.removeprefix("module.")] = value.detach().cpu().tolist()
    return out


def main() -> None:
    api, out = sys.argv[1], Path(sys.argv[2])
    t = ht.init(seed=60, max_grad_norm=MAX_NORM if api == "trainer" else None)
    model = t.wrap(make_net(), block=Block)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    result: dict = {"norms": [], "own_norms": [], "sharding": t.contract.memory.sharding}
    if api == "hook":
        def clip(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:  # noqa: ARG001
            result["own_norms"].append(own_norm(t.module.parameters()))
            result["norms"].append(t.clip_grad_norm_(MAX_NORM))
        opt.register_step_pre_hook(clip)
    split, rank = t.local_batches, t.rank
    lo = sum(split[:rank])
    for s in range(STEPS):
        x, y = step_data(s)
        step = t.step(opt, loss_fn, batch=(x[lo:lo + split[rank]], y[lo:lo + split[rank]]))
        if api == "trainer":
            result["norms"].append(step.grad_norm)
        else:
            assert step.grad_norm == result["norms"][-1]  # the step reports the hook's clip
    result["params"] = full_params(t)
    result["loss_scale"] = t.scaler.get_scale() if t.scaler is not None else None
    finish(t.rank, out, result)


if __name__ == "__main__":
    main()

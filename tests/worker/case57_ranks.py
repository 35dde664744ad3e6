"""Run inside each rank process by tests/worker/test_case57_batchnorm.py (shared/cases/57).

``python case57_ranks.py NORM OUT``: the case's MLP (linear 8->16, NORM 16, tanh, linear 16->3) in
float64 under the real Trainer (``t.step(..., batch=(x, y))``, so the micro-batch path runs), SGD
lr 0.1, 3 steps; step s's 12 samples come from seed 5700+s and rank r takes its slice of the split.
Writes ``OUT/rank<R>.json``: steps done, the error if any, the final parameters and (BatchNorm)
the running statistics.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hetero_worker import trainer as ht

STEPS = 3
GLOBAL_BATCH = 12


def make_model(norm: str) -> torch.nn.Module:
    """The case's model, seeded 57, float64."""
    torch.manual_seed(57)
    layer = torch.nn.BatchNorm1d(16) if norm == "batchnorm" else torch.nn.LayerNorm(16)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), layer, torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).double()


def step_data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of step ``step`` (0-based)."""
    g = torch.Generator().manual_seed(5700 + step)
    return (torch.randn(GLOBAL_BATCH, 8, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (GLOBAL_BATCH,), generator=g))


def loss_fn(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(x), y)


def main() -> None:
    norm, out = sys.argv[1], Path(sys.argv[2])
    t = ht.init(seed=57)
    result: dict = {"steps": 0, "error": None}
    try:
        t.wrap(make_model(norm))
        opt = torch.optim.SGD(t.module.parameters(), lr=0.1)
        split, rank = t.local_batches, t.rank
        lo = sum(split[:rank])
        for s in range(STEPS):
            x, y = step_data(s)
            t.step(opt, loss_fn, batch=(x[lo:lo + split[rank]], y[lo:lo + split[rank]]))
            result["steps"] += 1
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        result["error"] = f"{type(exc).__name__}: {exc}"
    if t.module is not None:
        result["params"] = {k: v.tolist() for k, v in t.module.state_dict().items()
                            if v.dtype == torch.float64}
    (out / f"rank{t.rank}.json").write_text(json.dumps(result))
    if result["error"] is None:
        dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()

"""Run inside each rank process by tests/worker/test_token_weighting.py (shared/cases/59).

``python case59_ranks.py SCENARIO OUT``: the case's per-token MLP (linear 6->8, tanh, linear 8->4 on
each of a sequence's 8 positions) in float64 under the real Trainer (``t.step(..., batch=...)``, so
the contract's micro-batches and sharding run), SGD lr 0.5, 3 steps; step s (1..3) draws 12
sequences from seed 5900+s (features, labels, then each sequence's valid length 1..8; labels past
it are -100) and rank r takes its slice of the split. The loss is the rank's token mean,
``F.cross_entropy(..., ignore_index=-100)``. ``SCENARIO``:

* ``tokens``: ``t.step(..., num_tokens=<each sample's valid tokens>)``;
* ``control``: every sequence full length, the sample-weighted step (no ``num_tokens``).

Writes ``OUT/rank<R>.json``: the rank's valid tokens per step, its step losses, the full
parameters after the last step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from case_runs import finish

from hetero_worker import trainer as ht

STEPS = 3
GLOBAL_BATCH = 12
SEQ_LEN = 8
CLASSES = 4
PAD = -100
LR = 0.5


def make_model() -> nn.Module:
    """The case's model, seeded 59, float64."""
    torch.manual_seed(59)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, CLASSES)).double()


def step_data(step: int, *, full_length: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of step ``step`` (1-based): features ``[12, 8, 6]``, labels ``[12, 8]``
    (-100 past each sequence's valid length; ``full_length``: none)."""
    g = torch.Generator().manual_seed(5900 + step)
    x = torch.randn(GLOBAL_BATCH, SEQ_LEN, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, CLASSES, (GLOBAL_BATCH, SEQ_LEN), generator=g)
    lengths = torch.randint(1, SEQ_LEN + 1, (GLOBAL_BATCH,), generator=g)
    if not full_length:
        labels[torch.arange(SEQ_LEN)[None, :] >= lengths[:, None]] = PAD
    return x, labels


def loss_fn(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The token mean of the batch's valid tokens."""
    return nn.functional.cross_entropy(model(x).reshape(-1, CLASSES), labels.reshape(-1),
                                       ignore_index=PAD)


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    t = ht.init(seed=59)
    model = t.wrap(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    split, rank = t.local_batches, t.rank
    lo = sum(split[:rank])
    result: dict = {"tokens": [], "losses": []}
    for s in range(1, STEPS + 1):
        x, labels = step_data(s, full_length=scenario == "control")
        xb, yb = x[lo:lo + split[rank]], labels[lo:lo + split[rank]]
        counts = (yb != PAD).sum(dim=1)
        result["tokens"].append(int(counts.sum()))
        weights = {"num_tokens": counts} if scenario == "tokens" else {}
        result["losses"].append(t.step(opt, loss_fn, batch=(xb, yb), **weights).loss)
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v  # Group: DTensor shards
            for k, v in t.full_state_dict().items()}
    result["params"] = {k.removeprefix("module."): v.detach().cpu().tolist() for k, v in full.items()}
    finish(t.rank, out, result)


if __name__ == "__main__":
    main()

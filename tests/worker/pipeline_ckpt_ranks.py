"""One rank of the pipelined kill-and-resume test (issue 30): ``ht.init()`` from the planner's
contract (``HTJ_PIPELINE_*``, ``HTJ_CHECKPOINT_DIR``, ``HTJ_MAX_STEPS``), ``t.wrap`` of a float64
``nn.Sequential``, SGD with momentum (optimizer state that a resume must restore), a shuffled
loader (a data position it must restore),
``t.resume(opt)``, then ``t.step`` and ``t.maybe_checkpoint`` every step. ``--die-after N``
ends the process abruptly (``os._exit``, no close) after step N, like a kill; ``--sigterm-after N``
makes rank 1 send itself SIGTERM after step N (a preempted pod; ``--step-s`` seconds of sleep per
step let the stop agreement come every step or two). At the end it
saves its stage's parameters to ``stage{r}.pt`` under ``--out`` with the steps it took.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from hetero_worker import trainer as ht

WIDTH, LR, SAMPLES = 5, 0.1, 144


def make_model(blocks: int) -> nn.Sequential:
    """Equal blocks (Linear + Tanh + Dropout), float64, the same on every rank: dropout draws
    from the global RNG, which a resume restores and the loader must not move."""
    torch.manual_seed(7)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Dropout(0.1))
                           for _ in range(blocks)]).double()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--sigterm-after", type=int, default=0)
    parser.add_argument("--step-s", type=float, default=0.0)
    args = parser.parse_args()
    t = ht.init(seed=0)
    stage = t.wrap(make_model(sum(t.contract.pipeline.stage_blocks)))
    opt = torch.optim.SGD(stage.parameters(), lr=LR, momentum=0.9)
    g = torch.Generator().manual_seed(5)
    data = torch.utils.data.TensorDataset(
        torch.randn(SAMPLES, WIDTH, generator=g, dtype=torch.float64),
        torch.randn(SAMPLES, WIDTH, generator=g, dtype=torch.float64))
    loader = t.loader(data, shuffle=True)
    resumed_at = t.global_step if t.resume(opt) else None
    losses = []
    for x, y in loader:
        time.sleep(args.step_s)  # the step's simulated compute (0: none)
        losses.append(t.step(opt, F.mse_loss, batch=(x, y)).loss)
        t.maybe_checkpoint(opt)
        if args.die_after and t.global_step == args.die_after:
            os._exit(9)  # killed: no close, no checkpoint of this step
        if args.sigterm_after and t.global_step == args.sigterm_after and t.rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the stop agreement ends every rank with exit 75
    torch.save({"params": [p.detach().clone() for p in stage.parameters()],
                "global_step": t.global_step, "resumed_at": resumed_at, "losses": losses},
               Path(args.out, f"stage{t.rank}.pt"))
    t.close()


if __name__ == "__main__":
    main()

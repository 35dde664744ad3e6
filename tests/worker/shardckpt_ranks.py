"""Run inside each rank process by tests/worker/test_sharded_checkpoint.py (issue 12).

One job phase under ``HTJ_SHARDING=group`` (FSDP2 inside each GPU-type group; or without sharding
when the env says so): the real Trainer,
a float64 model of two residual blocks and a head, AdamW, the job's loader; sharded checkpoints
(``torch.distributed.checkpoint``) every ``--checkpoint-every`` steps; optionally one rank
SIGKILLs itself after step ``--kill-after``, or rank 0 SIGKILLs itself while publishing the
checkpoint of step ``--kill-at-publish`` (its data written, the manifest not yet replaced).

Writes ``<out>/steps-rank<R>.jsonl`` (one line per step: ``{"step", "idx"}``, flushed at once) and
at the end ``<out>/rank<R>.json``: the full parameters (``DTensor.full_tensor``) as float64
lists, the parameter elements this rank holds, resumed step, final step and epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch

from hetero_worker import trainer as ht


class Block(torch.nn.Module):
    """A residual MLP block; FSDP2 shards each instance as its own unit."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(Block(6, 10), Block(6, 10), torch.nn.Linear(6, 2)).double()


def make_data(n: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    y = torch.randn(n, 2, generator=g, dtype=torch.float64)
    return torch.utils.data.TensorDataset(torch.arange(n), x, y)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--kill-after", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-at-publish", type=int, default=0)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()

    t = ht.init(seed=args.seed)
    if args.kill_at_publish:
        def die_at(step: int) -> None:
            if step == args.kill_at_publish:
                os.kill(os.getpid(), signal.SIGKILL)  # data written, manifest not replaced
        t.before_checkpoint_publish = die_at
    model = t.wrap(make_model(args.seed), block=Block)
    loader = t.loader(make_data(args.samples))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    resumed = t.resume(opt)
    report: dict = {"resumed_step": t.global_step if resumed else None,
                    "split": list(t.local_batches)}
    args.out.mkdir(parents=True, exist_ok=True)
    steps_log = (args.out / f"steps-rank{t.rank}.jsonl").open("a")
    while t.epoch < 1:
        for idx, x, y in loader:
            t.step(opt, lambda m, xm, ym: torch.nn.functional.mse_loss(m(xm), ym),
                   batch=(t.to_device(x), t.to_device(y)))
            steps_log.write(json.dumps({"step": t.global_step, "idx": idx.tolist()}) + "\n")
            steps_log.flush()
            if args.checkpoint_every:
                t.maybe_checkpoint(opt, args.checkpoint_every)
            if t.global_step == args.kill_after and t.rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)  # killed mid-run: no clean shutdown
    params = list(t.module.parameters())
    report.update({
        "step": t.global_step, "epoch": t.epoch,
        "params": [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                   .tolist() for p in params],
        "held_numel": sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params),
        "sharded": hasattr(params[0], "to_local"),
        "optim_steps": sorted({float(s["step"]) for s in opt.state.values()}),
    })
    (args.out / f"rank{t.rank}.json").write_text(json.dumps(report))
    t.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(ht.exit_on_setup_error(main))

"""Run inside each rank process by tests/worker/test_tracked_state.py (issue 22).

One job phase with the real Trainer on the model and data of ``shardckpt_ranks.py`` (so it also
runs under ``HTJ_SHARDING=group`` when the env says so): SGD with a ``StepLR`` schedule and a
counter of samples trained, both registered with ``t.track`` (``--no-track``: not registered, the
negative control); a checkpoint every ``--checkpoint-every`` steps; optionally one rank SIGKILLs
itself after step ``--kill-after``.

Writes ``<out>/steps-rank<R>.jsonl`` (per step: ``step``, the learning rate the step used,
the scheduler's ``last_epoch`` and the counter after it) and at the end ``<out>/rank<R>.json``:
resumed step, final learning rate, ``last_epoch``, counter and full parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from shardckpt_ranks import Block, make_data, make_model

from hetero_worker import trainer as ht


class SamplesSeen:
    """A user's counter with ``state_dict``/``load_state_dict`` (the Stateful protocol)."""

    def __init__(self) -> None:
        self.samples, self.per_step = 0, []

    def add(self, samples: int) -> None:
        self.samples += samples
        self.per_step.append(samples)

    def state_dict(self) -> dict:
        return {"samples": self.samples, "per_step": list(self.per_step)}

    def load_state_dict(self, state: dict) -> None:
        self.samples, self.per_step = int(state["samples"]), list(state["per_step"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--kill-after", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--no-track", action="store_true")
    args = parser.parse_args()

    t = ht.init(seed=5)
    model = t.wrap(make_model(5), block=Block)
    loader = t.loader(make_data(args.samples))
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    seen = SamplesSeen()
    if not args.no_track:
        t.track("lr_schedule", sched)
        t.track("samples_seen", seen)
    resumed = t.resume(opt)
    report: dict = {"resumed_step": t.global_step if resumed else None,
                    "lr_after_resume": opt.param_groups[0]["lr"],
                    "last_epoch_after_resume": sched.last_epoch,
                    "samples_after_resume": seen.samples}
    args.out.mkdir(parents=True, exist_ok=True)
    steps_log = (args.out / f"steps-rank{t.rank}.jsonl").open("a")
    while t.epoch < 1:
        for _idx, x, y in loader:
            lr = opt.param_groups[0]["lr"]
            t.step(opt, lambda m, xm, ym: torch.nn.functional.mse_loss(m(xm), ym),
                   batch=(t.to_device(x), t.to_device(y)))
            sched.step()
            seen.add(sum(t.local_batches))
            steps_log.write(json.dumps({"step": t.global_step, "lr": lr,
                                        "last_epoch": sched.last_epoch,
                                        "samples": seen.samples}) + "\n")
            steps_log.flush()
            if args.checkpoint_every:
                t.maybe_checkpoint(opt, args.checkpoint_every)
            if t.global_step == args.kill_after and t.rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)  # killed mid-run: no clean shutdown
    params = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1).tolist()
              for p in t.module.parameters()]
    report.update({"step": t.global_step, "lr": opt.param_groups[0]["lr"],
                   "last_epoch": sched.last_epoch, "samples": seen.samples,
                   "per_step": seen.per_step, "params": params})
    (args.out / f"rank{t.rank}.json").write_text(json.dumps(report))
    t.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(ht.exit_on_setup_error(main))

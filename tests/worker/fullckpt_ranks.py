"""Run inside each rank process by tests/worker/test_checkpoint_layouts.py (issue 29, item 2; case 62).

One job phase under the env's ``HTJ_SHARDING`` (none, group or full; Full's shares from
``HTJ_SHARD_PPM``): the real Trainer, the case-62 model (two residual blocks width 6 hidden 10, a
``Linear 6->2`` head, float64), AdamW (lr 0.05, weight decay 0.01), mse, the job's loader;
checkpoints every ``--checkpoint-every`` steps; the phase ends after step ``--until-step`` (or at
the end of the epoch); optionally one rank SIGKILLs itself after step ``--kill-after``.

Writes ``<out>/steps-rank<R>.jsonl`` (``{"step", "idx"}`` per step, flushed at once) and at the end
``<out>/rank<R>.json``: ``resumed_step``, the full parameters by name right after the resume
(``at_resume``) and at the end (``params``, float64 lists, gathered: ``t.full_state_dict()``), the
optimizer's ``exp_avg`` elements this rank holds and its step counts, final step and epoch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from shardckpt_ranks import Block, make_data, make_model  # the case-62 model and data, defined once

from hetero_worker import trainer as ht


def full_params(t: ht.Trainer) -> dict[str, list[float]]:
    """Every parameter, whole, by name (collective under sharding)."""
    out = {}
    for name, p in t.full_state_dict().items():
        whole = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = whole.detach().reshape(-1).tolist()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--until-step", type=int, default=0)
    parser.add_argument("--kill-after", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=62)
    args = parser.parse_args()

    t = ht.init(seed=args.seed)
    model = t.wrap(make_model(args.seed), block=Block)
    loader = t.loader(make_data(args.samples))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    resumed = t.resume(opt)
    report: dict = {"resumed_step": t.global_step if resumed else None,
                    "split": list(t.local_batches), "at_resume": full_params(t)}
    args.out.mkdir(parents=True, exist_ok=True)
    steps_log = (args.out / f"steps-rank{t.rank}.jsonl").open("a")
    done = False
    while not done and t.epoch < 1:
        for idx, x, y in loader:
            t.step(opt, lambda m, xm, ym: torch.nn.functional.mse_loss(m(xm), ym),
                   batch=(t.to_device(x), t.to_device(y)))
            steps_log.write(json.dumps({"step": t.global_step, "idx": idx.tolist()}) + "\n")
            steps_log.flush()
            if args.checkpoint_every:
                t.maybe_checkpoint(opt, args.checkpoint_every)
            if t.global_step == args.kill_after and t.rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)  # killed mid-run: no clean shutdown
            if t.global_step == args.until_step:
                done = True
                break
    report.update({
        "step": t.global_step, "epoch": t.epoch, "params": full_params(t),
        "held_numel": sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                          for p in t.module.parameters()),
        "optim_steps": sorted({float(s["step"]) for s in opt.state.values()}),
    })
    (args.out / f"rank{t.rank}.json").write_text(json.dumps(report))
    t.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(ht.exit_on_setup_error(main))

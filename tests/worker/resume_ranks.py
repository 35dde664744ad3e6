"""Run inside each rank process by tests/worker/test_checkpoint_replan.py and test_case37.

One job phase: train with the real Trainer (init from the contract env, DDP hook, the job's
loader), checkpoint every ``--checkpoint-every`` steps, optionally kill one rank hard
(``SIGKILL`` itself) after step ``--kill-after``, and record what happened:

* ``<out>/steps-rank<R>.jsonl``: one line per step, ``{"step": s, "idx": [dataset indices]}``,
  flushed before the next step (what a killed rank saw survives it);
* ``<out>/rank<R>.json`` at the end: parameters, final step and epoch, and for scenario ``case37``
  the PowerSGD state (iteration right after resume and at the end, leaders' group members) and
  the negative control (torch's ``PowerSGDState`` pickled without re-binding its group).

Scenarios: ``coverage`` (linear 4 -> 1, float64, optional ``--compression``), ``case37`` (MLP
32 -> 64 -> 8 in float64, PowerSGD rank 1 with ``start_powerSGD_iter`` 2, case 37's fixture).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import signal
from pathlib import Path

import torch
import torch.distributed as dist

from hetero_worker import trainer as ht
from hetero_worker.speed import controller as speed
from hetero_worker.speed.codecs import CompressionConfig


def make_model(scenario: str, layers: list[int], seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if scenario == "coverage":
        return torch.nn.Linear(4, 1).double()
    mods: list[torch.nn.Module] = []
    for a, b in zip(layers, layers[1:]):
        mods += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*mods[:-1]).double()


def make_data(n: int, width: int, out: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, width, generator=g, dtype=torch.float64)
    y = torch.randn(n, out, generator=g, dtype=torch.float64)
    return torch.utils.data.TensorDataset(torch.arange(n), x, y)


def powersgd_codec(t: ht.Trainer):  # type: ignore[no-untyped-def]
    reducer = getattr(t.sync, "reducer", None)
    codecs = getattr(reducer, "codecs", {}) if reducer is not None else {}
    return codecs.get(0)


def negative_control(t: ht.Trainer) -> dict:
    """torch's PowerSGDState through pickle: the group is dropped and the default one used."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    state = powerSGD_hook.PowerSGDState(process_group=t.groups.leaders,
                                        matrix_approximation_rank=1, start_powerSGD_iter=2)
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Keep(level=logging.WARNING)
    powerSGD_hook.logger.addHandler(handler)
    try:
        restored = pickle.loads(pickle.dumps(state))
    finally:
        powerSGD_hook.logger.removeHandler(handler)
    return {"warnings": messages, "group_size": dist.get_world_size(restored.process_group),
            "bound_group_size": dist.get_world_size(state.process_group)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", choices=["coverage", "case37"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--steps", type=int, default=0, help="stop after this step (0: epochs)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--kill-after", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--layers", default="32,64,8", help="case37: MLP widths")
    parser.add_argument("--seed", type=int, default=5, help="sampler and init seed")
    args = parser.parse_args()

    t = ht.init(seed=args.seed)
    layers = [int(w) for w in args.layers.split(",")]
    if args.scenario == "case37":
        speed.attach(t, speed.SpeedConfig(compression=CompressionConfig(
            mode="powersgd", powersgd_rank=1, powersgd_start_iter=2)))
    elif args.compression != "none":
        speed.attach(t, speed.SpeedConfig(compression=CompressionConfig(mode=args.compression)))
    model = t.wrap(make_model(args.scenario, layers, args.seed))
    width, out = (4, 1) if args.scenario == "coverage" else (layers[0], layers[-1])
    loader = t.loader(make_data(args.samples, width, out))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    resumed = t.resume(opt)
    codec = powersgd_codec(t)
    report: dict = {"resumed": resumed, "resumed_step": t.global_step if resumed else None,
                    "split": list(t.local_batches),
                    "iteration_after_resume": getattr(codec, "iteration", None)}
    args.out.mkdir(parents=True, exist_ok=True)
    steps_log = (args.out / f"steps-rank{t.rank}.jsonl").open("a")
    while t.epoch < args.epochs and not (args.steps and t.global_step >= args.steps):
        for idx, x, y in loader:
            t.step(opt, lambda m, x=x, y=y: torch.nn.functional.mse_loss(
                m(t.to_device(x)), t.to_device(y)))
            steps_log.write(json.dumps({"step": t.global_step, "idx": idx.tolist()}) + "\n")
            steps_log.flush()
            if args.checkpoint_every:
                t.maybe_checkpoint(opt, args.checkpoint_every)
            if t.global_step == args.kill_after and t.rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)  # killed mid-run: no clean shutdown
            if args.steps and t.global_step >= args.steps:
                break
    codec = powersgd_codec(t)
    report.update({"step": t.global_step, "epoch": t.epoch,
                   "params": [p.detach().reshape(-1).tolist() for p in t.module.parameters()],
                   "iteration_end": getattr(codec, "iteration", None)})
    if args.scenario == "case37":
        report["leaders_members"] = (dist.get_process_group_ranks(t.groups.leaders)
                                     if t.groups.leaders is not None else None)
        if t.rank == 0:
            report["negative_control"] = negative_control(t)
    (args.out / f"rank{t.rank}.json").write_text(json.dumps(report))
    t.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(ht.exit_on_setup_error(main))

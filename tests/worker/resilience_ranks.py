"""Run inside each rank process by tests/worker/test_resilience.py (issue 20).

Trains a linear model with the real Trainer over a dataset whose samples carry their index, and
records per step (before the step, so the step a SIGTERM stops at is recorded too)
``<out>/steps-rank<R>.jsonl`` lines ``{"step": s, "idx": [...]}``; ``<out>/rank<R>.json`` at the
end (resumed step, final step and epoch, parameters, the last resume's fallback note).

``--slow-save-s`` makes rank 0's checkpoint writes that slow (slow storage); ``--ready`` writes a
file once the given step is reached (the test then sends SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hetero_worker import trainer as ht
from hetero_worker.ckpt import checkpoint, files


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=360)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--stop-after", type=int, default=0, help="end after this step (0: the epoch)")
    parser.add_argument("--slow-save-s", type=float, default=0.0)
    parser.add_argument("--step-s", type=float, default=0.0, help="extra seconds per step")
    args = parser.parse_args()

    if args.slow_save_s:
        real = files.save_atomic

        def slow(obj, path):  # type: ignore[no-untyped-def]
            time.sleep(args.slow_save_s)  # storage that takes its time
            real(obj, path)

        checkpoint.save_atomic = slow  # type: ignore[assignment]

    t = ht.init(seed=3)
    torch.manual_seed(3)
    model = t.wrap(torch.nn.Linear(4, 1).double())
    g = torch.Generator().manual_seed(11)
    data = torch.utils.data.TensorDataset(
        torch.arange(args.samples), torch.randn(args.samples, 4, generator=g, dtype=torch.float64),
        torch.randn(args.samples, 1, generator=g, dtype=torch.float64))
    loader = t.loader(data)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    resumed = t.resume(opt)
    report = {"resumed_step": t.global_step if resumed else None,
              "fallback": checkpoint.LAST_RESUME.get("fallback", "")}
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / f"steps-rank{t.rank}.jsonl").open("a")
    while t.epoch < 1 and not (args.stop_after and t.global_step >= args.stop_after):
        for idx, x, y in loader:
            log.write(json.dumps({"step": t.global_step + 1, "idx": idx.tolist()}) + "\n")
            log.flush()
            time.sleep(args.step_s)  # a step of some length: a SIGTERM lands inside one
            t.step(opt, lambda m, x=x, y=y: torch.nn.functional.mse_loss(m(x), y))
            if args.checkpoint_every:
                t.maybe_checkpoint(opt, args.checkpoint_every)
            if args.stop_after and t.global_step >= args.stop_after:
                break
    report.update(step=t.global_step, epoch=t.epoch, stop_agreements=t.stop_agreements,
                  params=[p.detach().reshape(-1).tolist() for p in t.module.parameters()])
    (args.out / f"rank{t.rank}.json").write_text(json.dumps(report))
    t.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(ht.exit_on_setup_error(main))

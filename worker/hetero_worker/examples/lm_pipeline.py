"""The byte-level LM of :mod:`hetero_worker.examples.lm` as pipeline stages (issue 30).

The same transformer, written as an ``nn.Sequential`` of blocks (embedding, ``--layers``
transformer layers, the LM head) so that the planner can cut it into stages, one per GPU type
(``spec.training.pipeline``). Its model state (470 528 parameters x 16 B with AdamW = 7.5 MB) does
not fit the smallest device of ``examples/clusters/scaled-memory.yaml`` (a simulated T4 labelled
6 MiB); the pipeline keeps the first blocks on the A100 and gives the T4 what fits and balances
the stage times. The script is the data-parallel one with two differences::

    stage = t.wrap(make_pipeline_model(...))                  # this rank's blocks
    t.step(optimizer, next_byte_loss, batch=(inputs, targets))  # loss(output, target) per micro-batch

    heterotrain run examples/lm-pipeline.yaml --nodes examples/clusters/scaled-memory.yaml

Every rank reports the job's training loss (the last stage's, sent along the pipeline); the
result is the mean of the last 5 steps' losses (no held-out pass: no rank holds the whole model).

Where ``spec.training.sharding Auto`` predicts that data parallelism without a pipeline is faster
(``status.plan.layout``, docs/pipeline.md), the plan has no stages and the script trains the whole
model data-parallel (``block`` = the transformer layer, the unit ``Full`` sharding gathers).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

LAST_STEPS = 5
"""Steps whose mean training loss is the result."""


def make_pipeline_model(context: int, width: int, layers: int, heads: int) -> Any:
    """``nn.Sequential(embedding, layers x transformer layer, head)``: ``[B, T]`` byte ids ->
    ``[B, T, 256]`` logits, the model of :func:`hetero_worker.examples.lm.make_model` in blocks."""
    import torch
    from torch import nn

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(256, width)
            self.position = nn.Embedding(context, width)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.embed(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))

    class CausalLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                    batch_first=True, norm_first=True)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            mask = nn.Transformer.generate_square_subsequent_mask(h.shape[1], device=h.device)
            return self.layer(h, src_mask=mask, is_causal=True)

    return nn.Sequential(Embed(), *[CausalLayer() for _ in range(layers)], nn.Linear(width, 256))


def next_byte_loss(logits: Any, targets: Any) -> Any:
    """Mean next-byte cross-entropy (nats) of ``logits [B, T, 256]`` against ``targets [B, T]``."""
    import torch.nn.functional as F
    return F.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))


def _whole_model_loss(model: Any, inputs: Any, targets: Any) -> Any:
    """The data-parallel step's loss: the whole model on one micro-batch (no pipeline)."""
    return next_byte_loss(model(inputs), targets)


def train(args: argparse.Namespace) -> int:
    """Train, report; returns the exit code."""
    import torch

    from hetero_worker import trainer as ht
    from hetero_worker.examples import apply_run_limits, write_result
    from hetero_worker.examples.lm import make_windows, stdlib_text
    from heterotrain_common import rundir

    t = ht.init(seed=args.seed)
    apply_run_limits(args, t)
    start = time.perf_counter()
    windows = make_windows(stdlib_text(args.text_bytes), args.context)
    model = make_pipeline_model(args.context, args.width, args.layers, args.heads)
    if t.pipeline is not None:  # this rank's blocks; loss(output, target) per micro-batch
        stage = t.wrap(model)
        loss_fn = next_byte_loss
    else:  # spec.training.sharding Auto chose no pipeline (docs/pipeline.md): the whole model
        stage = t.wrap(model, block=torch.nn.TransformerEncoderLayer)
        loss_fn = _whole_model_loss
    optimizer = torch.optim.AdamW(stage.parameters(), lr=args.lr)
    loader = t.loader(torch.utils.data.TensorDataset(windows[:, :-1], windows[:, 1:]))
    steps_per_epoch = len(windows) // t.contract.global_batch
    t.metrics.set_total_steps(min(args.max_steps, args.epochs * steps_per_epoch))
    t.resume(optimizer)  # per stage, when spec.training.checkpoint.path holds this job's
    losses: list[float] = []
    while t.epoch < args.epochs and t.global_step < args.max_steps:
        for inputs, targets in loader:
            batch = (inputs, targets) if t.pipeline else (t.to_device(inputs), t.to_device(targets))
            losses.append(t.step(optimizer, loss_fn, batch=batch).loss)
            t.maybe_checkpoint(optimizer)  # every HTJ_CHECKPOINT_INTERVAL_STEPS; none without a path
            if t.rank == 0 and t.global_step % 10 == 0:
                print(f"step {t.global_step} loss {losses[-1]:.3f}", flush=True)
            if t.global_step >= args.max_steps:
                break
    if not losses:  # resumed at its last step: nothing left to train
        t.close()
        return 0
    final = sum(losses[-LAST_STEPS:]) / len(losses[-LAST_STEPS:])
    part = t.pipeline
    stages = ", ".join(f"stage {i}: ranks {list(r)}, {b} blocks" for i, (r, b) in enumerate(
        zip(part.layout.stage_ranks, t.contract.pipeline.stage_blocks))) if part else ""
    if t.rank == 0:
        elapsed_s = time.perf_counter() - start
        print(f"pipeline: {stages}; {t.contract.pipeline.micro_batches} micro-batches, "
              f"{t.contract.pipeline.schedule}" if part else
              f"no pipeline: data parallel over {t.contract.dist.world_size} ranks, sharding "
              f"{t.contract.memory.sharding}", flush=True)
        print(f"train loss {final:.3f} nats/byte (mean of the last {LAST_STEPS} steps; perplexity "
              f"{math.exp(final):.2f}), first {losses[0]:.3f}, {t.global_step} steps "
              f"({elapsed_s:.1f} s)", flush=True)
        write_result(args.result_json, {"example": "lm-pipeline", "first_loss": losses[0],
                                        "train_loss": final, "steps": t.global_step,
                                        "elapsed_s": elapsed_s, "stages": stages})
        rundir.write_result({"train_loss": final, "perplexity": math.exp(final),
                             "steps": t.global_step})
    t.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; a bad contract or a rendezvous timeout exits non-zero with a message."""
    from hetero_worker.examples.lm import run_lm_main
    return run_lm_main(argv, prog="python -m hetero_worker.examples.lm_pipeline", doc=__doc__,
                       train=train)


if __name__ == "__main__":
    sys.exit(main())

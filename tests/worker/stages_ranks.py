"""One rank of the pipeline-stage test (issue 30): 3 stages with the planner's uneven split
[8, 3, 1] of a 12-block float64 model, 4 micro-batches, 2 SGD steps under GPipe and under 1F1B,
each compared after every step with one process training the whole model on the whole batch.
With ``--replicas 2`` every stage has 2 replicas (6 ranks; stage i = ranks i and i + 3), each
pipeline takes half of the batch and a stage's replicas average their gradients.
Writes ``rank{r}.json`` under ``--out``.

Env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (Gloo).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hetero_worker.stages.layout import (StageLayout, build_stage_groups,
                                         reduce_stage_gradients_)
from hetero_worker.stages.runner import StageRunner
from hetero_worker.stages.split import stage_bounds

BLOCK_COUNTS = [8, 3, 1]
"""The planner's split for speeds 1.0 / 0.4 / 0.2 and 12 equal blocks (test_stages_plan.py)."""
WIDTH, BATCH, MICRO_BATCHES, STEPS, LR = 5, 8, 4, 2, 0.1


def make_model() -> nn.Sequential:
    torch.manual_seed(7)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                           for _ in range(sum(BLOCK_COUNTS))])


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def run(schedule: str, stage: int, group: dist.ProcessGroup, *, replica: int = 0,
        replicas: int = 1, stage_group: dist.ProcessGroup | None = None) -> dict:
    model = make_model()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    runner = StageRunner(model, BLOCK_COUNTS, stage_index=stage, group=group,
                         micro_batches=MICRO_BATCHES, loss_fn=nn.functional.mse_loss,
                         schedule=schedule)
    opt = torch.optim.SGD(runner.module.parameters(), lr=LR, momentum=0.9)
    first, end = stage_bounds(BLOCK_COUNTS, len(model))[stage]
    shard = BATCH // replicas
    start = [p.detach().clone() for p in runner.module.parameters()]
    facts: dict = {"diffs": [], "loss_diffs": [], "blocks": end - first}
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        mine_x, mine_y = (t[replica * shard:(replica + 1) * shard] for t in (x, y))
        losses = runner.step(mine_x if runner.is_first else None,
                             mine_y if runner.is_last else None)
        if stage_group is not None:
            reduce_stage_gradients_(runner.module, stage_group)
        opt.step()
        ref_opt.zero_grad()
        ref_loss = nn.functional.mse_loss(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        mine = list(runner.module.parameters())
        theirs = [p for block in list(reference)[first:end] for p in block.parameters()]
        assert len(mine) == len(theirs)
        facts["diffs"].append(max((a - b).abs().max().item() for a, b in zip(mine, theirs)))
        if losses is not None and replicas == 1:
            facts["loss_diffs"].append(abs(torch.stack(losses).mean().item() - ref_loss.item()))
    facts["moved"] = max((p.detach() - s).abs().max().item()
                         for p, s in zip(runner.module.parameters(), start))
    facts["dtype"] = str(next(runner.module.parameters()).dtype)
    return facts


def refusals(rank: int, group: dist.ProcessGroup) -> list[str]:
    """The messages of runners built wrong (no communication happens before the checks)."""
    wrong = [{"block_counts": BLOCK_COUNTS, "stage_index": rank, "schedule": "Interleaved"},
             {"block_counts": [6, 6], "stage_index": rank, "schedule": "GPipe"},
             {"block_counts": BLOCK_COUNTS, "stage_index": (rank + 1) % 3, "schedule": "GPipe"}]
    messages = []
    for kwargs in wrong:
        try:
            StageRunner(make_model(), kwargs["block_counts"], stage_index=kwargs["stage_index"],
                        group=group, micro_batches=MICRO_BATCHES, loss_fn=nn.functional.mse_loss,
                        schedule=kwargs["schedule"])
        except ValueError as err:
            messages.append(str(err))
        else:
            messages.append("built")
    return messages


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.replicas == 1:
        group = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
        facts = {schedule: run(schedule, rank, group) for schedule in ("GPipe", "1F1B")}
        facts["refusals"] = refusals(rank, group)
    else:
        stages = len(BLOCK_COUNTS)
        layout = StageLayout(stage_ranks=tuple(tuple(i + stages * r for r in range(args.replicas))
                                               for i in range(stages)))
        groups = build_stage_groups(layout, rank)
        stage, replica = layout.place(rank)
        facts = {schedule: run(schedule, stage, groups.pipeline, replica=replica,
                               replicas=args.replicas, stage_group=groups.stage)
                 for schedule in ("GPipe", "1F1B")}
        facts["place"] = [stage, replica]
    (args.out / f"rank{rank}.json").write_text(json.dumps(facts))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    assert os.environ.get("RANK") is not None, "run by test_pipeline_stages.py"
    main()

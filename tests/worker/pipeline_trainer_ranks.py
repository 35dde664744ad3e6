"""One rank of the pipelined Trainer's acceptance test (issue 30): ``ht.init()`` from the contract
the planner rendered (``HTJ_PIPELINE_*``), ``t.wrap`` of a float64 ``nn.Sequential`` of equal
blocks, ``t.loader`` and ``t.step(opt, mse_loss, batch=(x, y))`` for ``--steps`` SGD steps with
momentum. After every step the rank compares its stage's parameters with one process training the
whole model on the whole global batch with the same micro-batching (each pipeline's batch cut into
the same micro-batches, the loss weighted by the pipeline's share), and the step's loss with that
process's. Writes ``rank{r}.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from hetero_worker import trainer as ht
from hetero_worker.stages.split import stage_bounds

WIDTH, LR = 5, 0.1


def make_model(blocks: int) -> nn.Sequential:
    """Equal blocks (Linear + Tanh), float64, the same on every rank."""
    torch.manual_seed(7)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                           for _ in range(blocks)]).double()


def reference_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                   pipeline_batches: list[int], micro_batches: int, skip: bool = False) -> float:
    """One process: every pipeline's slice of the global batch in the same micro-batches (``skip``:
    no optimizer step, as every rank skips a step whose gradients had inf/NaN somewhere)."""
    opt.zero_grad()
    total, start, loss_sum = sum(pipeline_batches), 0, 0.0
    for b in pipeline_batches:
        xs, ys = x[start:start + b].tensor_split(micro_batches), y[start:start + b].tensor_split(micro_batches)
        for mx, my in zip(xs, ys):
            loss = F.mse_loss(model(mx), my) * b / total / micro_batches
            loss.backward()
            loss_sum += float(loss)
        start += b
    if not skip:
        opt.step()
    return loss_sum


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--inf-step", type=int, default=-1,
                        help="at this step, stage --inf-stage's first gradient turns inf")
    parser.add_argument("--inf-stage", type=int, default=0)
    args = parser.parse_args()
    t = ht.init(seed=0)
    settings = t.contract.pipeline
    blocks = sum(settings.stage_blocks)
    model = make_model(blocks)
    reference = copy.deepcopy(model)
    stage = t.wrap(model)
    opt = torch.optim.SGD(stage.parameters(), lr=LR, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    g = torch.Generator().manual_seed(5)
    global_batch = t.contract.global_batch
    n = global_batch * args.steps
    data = torch.utils.data.TensorDataset(torch.randn(n, WIDTH, generator=g, dtype=torch.float64),
                                          torch.randn(n, WIDTH, generator=g, dtype=torch.float64))
    first, end = stage_bounds(settings.stage_blocks, blocks)[settings.stage]
    part = t.pipeline
    facts: dict = {"stage": settings.stage, "replica": part.replica, "blocks": end - first,
                   "pipeline_batches": part.pipeline_batches, "diffs": [], "loss_diffs": [],
                   "batch_sizes": [], "dtype": str(next(stage.parameters()).dtype),
                   "speed": t.contract.device.relative_speed,
                   "delay_per_sample_s": t.contract.run.sim_delay_per_sample_s, "times": []}
    start = [p.detach().clone() for p in stage.parameters()]
    facts.update(skipped=[], scales=[])
    poison = {"now": False}
    if settings.stage == args.inf_stage:
        next(stage.parameters()).register_hook(
            lambda g: torch.full_like(g, float("inf")) if poison["now"] else g)
    step = 0
    for x, y in t.loader(data, shuffle=False):
        poison["now"] = step == args.inf_step
        result = t.step(opt, F.mse_loss, batch=(x, y))
        facts["skipped"].append(result.skipped)
        facts["scales"].append(t.scaler.get_scale() if t.scaler is not None else None)
        facts["times"].append([result.step_s, result.compute_s, result.comm_wait_s])
        facts["batch_sizes"].append(len(x))
        gx, gy = data.tensors[0][step * global_batch:(step + 1) * global_batch], \
            data.tensors[1][step * global_batch:(step + 1) * global_batch]
        offset = sum(part.pipeline_batches[:part.replica])
        assert torch.equal(x, gx[offset:offset + len(x)]), "the loader's batch is the pipeline's slice"
        ref_loss = reference_step(reference, ref_opt, gx, gy, part.pipeline_batches,
                                  settings.micro_batches, skip=step == args.inf_step)
        mine = list(stage.parameters())
        theirs = list(reference[first:end].parameters())
        facts["diffs"].append(max(float((a - b).abs().max()) for a, b in zip(mine, theirs)))
        facts["loss_diffs"].append(abs(result.loss - ref_loss))
        step += 1
    facts["steps"] = step
    facts["global_step"] = t.global_step
    facts["moved"] = max(float((a - b).abs().max()) for a, b in zip(stage.parameters(), start))
    facts["gauges"] = {name: t.metrics.registry.get_sample_value(f"htj_pipeline_{name}",
                                                                 t.metrics.labels)
                       for name in ("stage", "planned_bubble_ratio", "wait_ratio")}
    Path(args.out, f"rank{t.rank}.json").write_text(json.dumps(facts))
    t.close()


if __name__ == "__main__":
    main()

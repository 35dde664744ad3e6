"""Learned pipeline-stage times: what a pipelined run measured per stage, as the planner's block
times (pure; issue 30).

A pipelined rank reports its stage's forward and backward seconds over the steps after the
first, its optimizer's (zeroing the gradients and the optimizer step), and the samples that went
through the stage (``rank-<R>.json``'s ``stage_forward_seconds``, ``stage_backward_seconds``,
``stage_optimizer_seconds``, ``stage_samples``;
``hetero_worker.metrics.WorkerMetrics.observe_stage_compute``). :func:`observations` turns them
into learned entries, one per stage and part, under the stage's GPU type and the precision
``"<precision> blocks <a>-<b> forward"`` (or ``backward``): samples / seconds, at the band of the
replica's micro-batch. The optimizer's seconds count as backward: they run once a step on the
stage, after its last backward and before its next forward, so spread over the micro-batches'
backwards they lengthen the stage's share of the step as they lengthen the step (the stage
planner has no per-step term). They sit in the job's learned-speeds profile beside the device speeds
(:mod:`hetero_operator.planning.profiles`: outliers held as candidates, aged out).

:func:`block_times` turns the entries back into each block's seconds per sample per GPU type, for
:func:`hetero_operator.planning.stages.plan_stages` (``measured``):

* a block inside a learned range of its type gets the range's seconds split by the blocks'
  modelled compute (``BlockCost.compute_s_per_sample``: ``blockCosts`` or equal blocks);
* a block no run of this type measured, but one of another type did, gets that figure scaled by
  the two types' speeds (``other speed / this speed``);
* else the model: ``compute_s_per_sample / speed``, split
  :data:`~heterotrain_common.pipelineschedules.FORWARD_SHARE` forward.

So a run of the same cut predicts from its own measurements, and a different cut from the
nearest measured figures. Figures are absolute seconds: they are used only where the plan is
absolute (``referenceSamplesPerSecond`` given, or learned speeds).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.planning.profiles import LearnedSpeed, Observation, for_batch
from hetero_operator.planning.stages import BlockCost, BlockTime, StageDevice
from heterotrain_common.pipelineschedules import FORWARD_SHARE

PARTS = ("forward", "backward")
"""The two parts of a stage's compute that are learned apart."""
MIN_STAGE_STEPS = 3
"""A rank that timed fewer steps of its stage (after the first) is not learned from."""


def stage_precision(precision: str, first_block: int, end_block: int, part: str) -> str:
    """The learned entry's precision field, e.g. ``"fp32 blocks 0-3 forward"`` (blocks
    ``first_block <= j < end_block``)."""
    return f"{precision} blocks {first_block}-{end_block} {part}"


def parse_stage_precision(value: str) -> tuple[str, int, int, str] | None:
    """``(precision, first, end, part)`` of a :func:`stage_precision` value; None for any other
    entry (a device speed, a layout ratio)."""
    words = value.split(" ")
    if len(words) != 4 or words[1] != "blocks" or words[3] not in PARTS:
        return None
    first, _, end = words[2].partition("-")
    if not (first.isdigit() and end.isdigit()) or int(first) >= int(end):
        return None
    return words[0], int(first), int(end), words[3]


def observations(stages: Sequence[Any], stats: Sequence[Mapping[str, Any]], *,
                 micro_batches: int, unix_s: float | None = None, job: str = "",
                 namespace: str = "") -> list[Observation]:
    """The learned entries of one pipelined run (see the module docstring).

    Args:
        stages: the plan's stages (``PipelinePlan.stages``: ``gpu_type``, ``first_block``,
            ``blocks``, ``ranks``).
        stats: every rank's statistics, rank order (``rank-<R>.json``; missing ones: ``{}``).
        micro_batches: the plan's micro-batches per step.
        unix_s: when measured (now if None).
        job / namespace: the job that measured them.

    Returns:
        Per stage and part, the median over the stage's ranks of samples / seconds, at the
        ranks' mean micro-batch; stages whose ranks timed fewer than :data:`MIN_STAGE_STEPS`
        steps are left out.
    """
    when = time.time() if unix_s is None else unix_s
    out: list[Observation] = []
    for stage in stages:
        figures: dict[str, list[float]] = {part: [] for part in PARTS}
        batches: list[float] = []
        precision = ""
        for rank in stage.ranks:
            s = stats[rank] if rank < len(stats) else {}
            steps = int(s.get("stage_steps") or 0)
            samples = float(s.get("stage_samples") or 0)
            seconds = {p: float(s.get(f"stage_{p}_seconds") or 0.0) for p in PARTS}
            seconds["backward"] += float(s.get("stage_optimizer_seconds") or 0.0)
            if steps < MIN_STAGE_STEPS or samples <= 0 or min(seconds.values()) <= 0:
                continue
            precision = str(s.get("precision") or "fp32")
            for part in PARTS:
                figures[part].append(samples / seconds[part])
            batches.append(samples / steps / micro_batches)
        if not batches:
            continue
        end = stage.first_block + stage.blocks
        for part in PARTS:
            values = sorted(figures[part])
            out.append(Observation(
                gpu_type=stage.gpu_type, samples_per_s=values[len(values) // 2],
                precision=stage_precision(precision, stage.first_block, end, part),
                unix_s=when, local_batch=sum(batches) / len(batches), job=job,
                namespace=namespace))
    return out


def block_times(learned: Mapping[tuple[str, str], Any], blocks: Sequence[BlockCost],
                devices: Sequence[StageDevice], *, precision: str, micro_batch: float,
                ) -> dict[str, list[BlockTime]]:
    """Per GPU type with a learned stage figure, every block's seconds per sample (see the module
    docstring); types no pipelined run measured are left out (the planner models them).

    Args:
        learned: the job's learned table (``PlanInputs.learned``).
        blocks: the model's blocks (their compute shares split a learned range).
        devices: the placed GPU types (speeds scale a figure from one type to another).
        precision: the stages' precision (``fp32``, ``bf16``, ``fp16``).
        micro_batch: samples of one replica's micro-batch (picks the batch band).
    """
    speed = {d.gpu_type: d.speed for d in devices}
    measured: dict[str, dict[int, dict[str, float]]] = {}   # type -> block -> part -> s/sample
    for (gpu_type, field), found in learned.items():
        parsed = parse_stage_precision(field)
        if gpu_type not in speed or parsed is None or parsed[0] != precision:
            continue
        _, first, end, part = parsed
        entry = for_batch(found, micro_batch)
        if end > len(blocks) or not isinstance(entry, LearnedSpeed) or entry.samples_per_s <= 0:
            continue
        shares = [b.compute_s_per_sample for b in blocks[first:end]]
        total = sum(shares) or float(end - first)
        for j, share in zip(range(first, end), shares):
            weight = (share if sum(shares) else 1.0) / total
            measured.setdefault(gpu_type, {}).setdefault(j, {})[part] = (
                weight / entry.samples_per_s)
    out: dict[str, list[BlockTime]] = {}
    for gpu_type in measured:
        times = []
        for j, block in enumerate(blocks):
            times.append(BlockTime(**{f"{part}_s": _block_s(measured, speed, gpu_type, j, part,
                                                             block) for part in PARTS}))
        out[gpu_type] = times
    return out


def _block_s(measured: Mapping[str, Mapping[int, Mapping[str, float]]],
             speed: Mapping[str, float], gpu_type: str, j: int, part: str,
             block: BlockCost) -> float:
    """Block ``j``'s ``part`` seconds per sample on ``gpu_type``: measured there, else measured on
    another type and scaled by speed (the fastest such type), else modelled."""
    mine = measured.get(gpu_type, {}).get(j, {})
    if part in mine:
        return mine[part]
    others = [(speed[t], by[j][part]) for t, by in measured.items()
              if t != gpu_type and part in by.get(j, {})]
    if others:
        other_speed, seconds = max(others)
        return seconds * other_speed / speed[gpu_type]
    share = FORWARD_SHARE if part == "forward" else 1 - FORWARD_SHARE
    return share * block.compute_s_per_sample / speed[gpu_type]
